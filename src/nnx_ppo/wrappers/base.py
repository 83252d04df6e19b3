"""The base of the environment wrappers: forward everything to the wrapped env."""

from __future__ import annotations

from typing import Any

from jaxtyping import PRNGKeyArray

from nnx_ppo.contract.axes import Unbatched
from nnx_ppo.envs.state import EnvState, RLEnv

__all__ = ["Wrapper"]


class Wrapper:
    """Wraps one unbatched environment; forwards ``reset``, ``step`` and attributes.

    Subclasses override ``reset``/``step``. Every other attribute
    (``observation_size``, ``action_size``, ``discrete_actions``, ``dt``,
    ``render``, ...) is read from the wrapped env, so a wrapped env can stand
    wherever the env itself could.
    """

    def __init__(self, env: RLEnv) -> None:
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise TypeError(
                    f"{type(self).__name__} wraps an environment with reset(key) and "
                    f"step(state, action); {type(env).__name__} has no {method}"
                )
        self.env = env

    def reset(self, rng: PRNGKeyArray) -> EnvState:
        """The wrapped env's ``reset``."""
        return self.env.reset(rng)

    def step(self, state: EnvState, action: Unbatched) -> EnvState:
        """The wrapped env's ``step``."""
        return self.env.step(state, action)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper. ``env`` itself is
        # missing while copy/pickle rebuild the object; forwarding it would recurse.
        if name == "env":
            raise AttributeError(name)
        try:
            return getattr(self.env, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__} (wrapping {type(self.env).__name__}) has no "
                f"attribute {name!r}"
            ) from None
