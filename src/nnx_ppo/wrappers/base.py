"""The base of the environment wrappers: forward everything to the wrapped env."""

from __future__ import annotations

import inspect
from typing import Any

from jaxtyping import PRNGKeyArray

from nnx_ppo.contract.axes import Unbatched
from nnx_ppo.contract.env_checks import require_env
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
        require_env(type(self).__name__, env)
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
        # Python's own hooks (``__deepcopy__``, ``__getstate__``) are the wrapper's:
        # the env's would copy or pickle the env alone, without the wrapper.
        if name == "env" or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        own = inspect.getattr_static(type(self), name, None)
        if own is not None and hasattr(own, "__get__"):
            # The wrapper's own property raised AttributeError (a bug in it): raise it
            # again rather than read the env's attribute of that name in its place.
            return own.__get__(self, type(self))
        try:
            return getattr(self.env, name)
        except AttributeError as error:
            raise AttributeError(
                f"{type(self).__name__} (wrapping {type(self.env).__name__}) has no "
                f"attribute {name!r}"
            ) from error
