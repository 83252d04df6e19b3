"""Built-in pure-JAX environments and the registry that makes them by name.

Every environment here handles **one** environment (``reset(key)``,
``step(state, action)``; the library vmaps both) and follows the conventions
of :mod:`nnx_ppo.envs.state`. :func:`make` also builds MuJoCo Playground
environments when ``mujoco_playground`` is installed (the ``playground``
extra).

Example::

    env = nnx_ppo.envs.make("cartpole")
    state = env.reset(jax.random.key(0))
    state = env.step(state, jnp.asarray(1))
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax

from nnx_ppo.envs.cartpole import CartPole
from nnx_ppo.envs.memory import MemoryTask
from nnx_ppo.envs.pendulum import Pendulum
from nnx_ppo.envs.state import RLEnv, State, time_limit
from nnx_ppo.envs.two_agent import TwoAgentReach

__all__ = [
    "CartPole",
    "MemoryTask",
    "Pendulum",
    "RLEnv",
    "State",
    "TwoAgentReach",
    "make",
    "names",
    "playground_backend",
    "time_limit",
]

_log = logging.getLogger(__name__)

_BUILT_IN: dict[str, Callable[..., RLEnv]] = {
    "cartpole": CartPole,
    "pendulum": Pendulum,
    "memory": MemoryTask,
    "two_agent": TwoAgentReach,
}


def _playground_registry() -> Any:
    """Playground's registry module, or ``None`` where Playground is not installed.

    Raises:
      ImportError: importing Playground failed for want of the GL library that
        ``MUJOCO_GL`` names (MuJoCo loads it at import).
    """
    if importlib.util.find_spec("mujoco_playground") is None:
        return None
    try:
        # ``registry`` is an attribute of the package, not an importable submodule.
        return importlib.import_module("mujoco_playground").registry
    except (AttributeError, ImportError) as error:
        gl = os.environ.get("MUJOCO_GL")
        if gl is None:
            raise
        raise ImportError(
            f"importing MuJoCo Playground failed with MUJOCO_GL={gl}: is that GL library "
            f"installed? Unset MUJOCO_GL, or set it to one that is (egl, osmesa, glfw). "
            f"Python said: {type(error).__name__}: {error}"
        ) from error


_PLAYGROUND_WRAPPER_FIELDS = ("action_repeat", "episode_length")
"""Fields of a Playground config that Playground's own training wrapper applies, not the
env: set through :func:`make`, they would cut no episode and repeat no action."""


_PLAYGROUND_IMPLS = ("jax", "warp")
"""The simulator backends a Playground env runs on: MJX's ``jax`` and MuJoCo Warp (MJX's
``cpp``, MuJoCo's C library, steps no JAX program)."""


def _require_known_impl(name: str, impl: str) -> None:
    """``impl`` is a simulator backend a Playground env runs on, or a ValueError naming
    the option and the backends (MuJoCo's own message names neither)."""
    if impl not in _PLAYGROUND_IMPLS:
        known = ", ".join(repr(value) for value in _PLAYGROUND_IMPLS)
        raise ValueError(
            f"make({name!r}): impl={impl!r} is not a simulator backend a Playground env runs "
            f"on; they are {known}"
        )


def _dotted_overrides(name: str, defaults: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with each table for a sub-config written as dotted keys
    (``{"reward_config": {"scales": {"x": 2}}}`` as ``"reward_config.scales.x"``), each
    checked against the config ``defaults``.

    Playground sets a nested dict as a sub-config's whole value, which dropped the
    sub-config's other defaults and took a misspelt key inside it without a word.
    """
    dotted: dict[str, Any] = {}

    def is_table(node: Any) -> bool:  # a sub-config, which Playground updates key by key
        return hasattr(node, "update_from_flattened_dict")

    def add(path: tuple[str, ...], value: Any) -> None:
        node = defaults
        for depth, part in enumerate(path):
            if depth and not is_table(node):
                raise ValueError(
                    f"make({name!r}): {'.'.join(path[:depth])} of its Playground config is "
                    f"a value, not a table: {'.'.join(path)} names no field"
                )
            if part not in node:
                within = ".".join(path[:depth])
                raise ValueError(
                    f"make({name!r}): {'.'.join(path)} is not a field of its Playground "
                    f"config; {f'the fields of {within}' if within else 'its fields'}: "
                    f"{', '.join(sorted(node))}"
                )
            node = node[part]
        if isinstance(value, dict) and is_table(node):
            for key, item in value.items():
                add((*path, *str(key).split(".")), item)
        else:
            dotted[".".join(path)] = value

    for key, value in overrides.items():
        add(tuple(key.split(".")), value)
    return dotted


def names() -> tuple[str, ...]:
    """The names :func:`make` accepts: the built-ins, then Playground's if installed."""
    registry = _playground_registry()
    playground = () if registry is None else tuple(registry.ALL_ENVS)
    return (*_BUILT_IN, *playground)


def make(name: str, **kwargs: Any) -> RLEnv:
    """Build an environment by name.

    Args:
      name: a built-in name (``cartpole``, ``pendulum``, ``memory``,
        ``two_agent``) or, with the ``playground`` extra installed, a MuJoCo
        Playground name (e.g. ``"CartpoleBalance"``).
      **kwargs: the built-in env's constructor arguments. For Playground,
        ``config`` (a whole ``ConfigDict``) and ``config_overrides`` (a dict),
        as ``mujoco_playground.registry.load`` takes them, and any other keyword
        is one more entry of ``config_overrides`` (e.g. ``impl="warp"``,
        ``sim_dt=0.005``). Playground's ``episode_length`` and ``action_repeat``
        are applied by its training wrapper, not the env: set here, they warn
        (cut episodes with :class:`~nnx_ppo.wrappers.EpisodeWrapper`).

    A Playground env whose config has an ``impl`` (its simulator backend) gets
    the fastest one for the platform JAX runs on unless ``impl`` is given (as a
    keyword, or in a whole ``config``):
    ``"jax"`` (MJX) on CPU, where MuJoCo Warp is several times slower per step,
    Playground's own default elsewhere. The choice is logged to the
    ``nnx_ppo.envs`` logger, and :func:`playground_backend` reports it. So
    are, at ``INFO``, MuJoCo's warnings while the env's model is built (such as
    a deprecated attribute in its XML), which MuJoCo would otherwise print and
    append to ``MUJOCO_LOG.TXT`` in the working directory.

    Raises:
      ValueError: ``name`` is none of the above (the message lists the names), a
        built-in env is given an option it does not have, or a Playground
        override names a field its config lacks (the message lists the options);
        or a built-in env's count option (``max_steps``, ``n_cues``, ``delay``) is
        out of range.
      TypeError: a built-in env's count option is not a whole number (``3`` and
        ``3.0`` are taken, as nnx-ppo 0.3.0 took counts).
      OSError: a Playground robot env's models (MuJoCo Menagerie, which
        Playground downloads the first time) could not be downloaded; the message
        says where to put them.
      ImportError: the installed Playground asked MuJoCo for something the
        installed ``mujoco`` lacks (the message names both versions), or
        importing Playground failed for want of the GL library ``MUJOCO_GL`` names.
    """
    if name in _BUILT_IN:
        options = inspect.signature(_BUILT_IN[name]).parameters
        unknown = sorted(key for key in kwargs if key not in options)
        if unknown:
            verb = "is not an option" if len(unknown) == 1 else "are not options"
            raise ValueError(
                f"make({name!r}): {', '.join(unknown)} {verb} of this env; its "
                f"options: {', '.join(options) or 'none'}"
            )
        return _BUILT_IN[name](**kwargs)
    registry = _playground_registry()
    if registry is not None and name in registry.ALL_ENVS:
        config = kwargs.pop("config", None)
        if isinstance(config, dict):
            raise ValueError(
                f"make({name!r}): config must be a whole Playground ConfigDict (from "
                "mujoco_playground.registry.get_default_config), not a dict; give the fields "
                "to change as keywords or config_overrides instead (on the command line, "
                "--set env_kwargs.FIELD=...)"
            )
        overrides = dict(kwargs.pop("config_overrides", None) or {}) | kwargs
        defaults = registry.get_default_config(name) if config is None else config
        overrides = _dotted_overrides(name, defaults, overrides)
        wrapper_only = sorted(key for key in _PLAYGROUND_WRAPPER_FIELDS if key in overrides)
        if wrapper_only:
            warnings.warn(
                f"make({name!r}): {' and '.join(wrapper_only)} set in its Playground config, "
                "which only Playground's training wrapper applies, not the env (some envs "
                "read episode_length for their own use): episodes are not cut by it. Cut "
                "them with nnx_ppo.wrappers.EpisodeWrapper(env, n) (the command line: "
                "--set episode_length=n).",
                stacklevel=2,
            )
        if "impl" in overrides and isinstance(overrides["impl"], str):
            _require_known_impl(name, overrides["impl"])
        if "impl" in defaults and "impl" not in overrides and config is None:
            overrides["impl"] = playground_backend(name, defaults)
        if "impl" in overrides:
            _log.info("%s: simulator backend impl=%s", name, overrides["impl"])
        try:
            with _mujoco_warnings_logged(name):
                return registry.load(name, config=config, config_overrides=overrides or None)
        except subprocess.CalledProcessError as error:
            raise OSError(_menagerie_missing(name, error)) from error
        except AttributeError as error:
            if not type(error.obj).__module__.startswith("mujoco."):
                raise
            raise ImportError(_mujoco_mismatch(name, error)) from error
    built_in = ", ".join(_BUILT_IN)
    if registry is None:
        hint = (
            "MuJoCo Playground names need the playground extra: pip install 'nnx-ppo[playground]'"
        )
    else:
        hint = f"or one of the {len(registry.ALL_ENVS)} MuJoCo Playground envs in names()"
    raise ValueError(f"Unknown environment {name!r}. Built-in: {built_in}; {hint}.")


@contextlib.contextmanager
def _mujoco_warnings_logged(name: str) -> Iterator[None]:
    """Log MuJoCo's warnings while ``name`` is built to this module's logger, at INFO.

    MuJoCo's own handler prints each to the terminal from C and appends it to
    ``MUJOCO_LOG.TXT`` in the working directory; the ones a Playground model's
    compilation raises (a deprecated attribute of its XML) concern the model's
    authors, not a user who builds it.
    """
    mujoco = sys.modules.get("mujoco")
    if mujoco is None:  # imported by Playground; absent, nothing can warn
        yield
        return
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: _log.info("%s: MuJoCo warned: %s", name, message))
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def _menagerie_missing(name: str, error: subprocess.CalledProcessError) -> str:
    """What to do when Playground's download of MuJoCo Menagerie failed.

    Playground's robot envs take their models from Menagerie, which Playground clones
    with ``git`` the first time one is loaded; its path and commit are private names
    of Playground, so they are read where present.
    """
    playground_env = sys.modules.get("mujoco_playground._src.mjx_env")
    path = getattr(
        playground_env,
        "MENAGERIE_PATH",
        "mujoco_playground/external_deps/mujoco_menagerie in the installed package",
    )
    commit = getattr(playground_env, "MENAGERIE_COMMIT_SHA", None)
    at_commit = f" and check out commit {commit}" if commit else ""
    command = error.cmd if isinstance(error.cmd, str) else " ".join(map(str, error.cmd))
    return (
        f"{name} needs MuJoCo Menagerie, which MuJoCo Playground could not download "
        f"({command} exited with {error.returncode}).\n"
        "Load the env once on a machine with internet access, or clone "
        f"https://github.com/google-deepmind/mujoco_menagerie into {path}{at_commit}."
    )


def _mujoco_mismatch(name: str, error: AttributeError) -> str:
    """What to do when Playground asked MuJoCo's Python API for a name it lacks."""
    versions = ", ".join(
        f"{package} {_installed_version(package)}"
        for package in ("playground", "mujoco", "mujoco-mjx")
    )
    return (
        f"MuJoCo Playground cannot build {name} with the MuJoCo installed ({versions}): "
        f"{error}. The two disagree on MuJoCo's API; another mujoco version may build it "
        "(see the MuJoCo Playground page of the docs)."
    )


def _installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def playground_backend(name: str, config: Any = None) -> str | None:
    """The simulator backend :func:`make` gives the Playground env ``name`` by default.

    ``"jax"`` (MJX) when JAX runs on CPU, else the env's own default; ``None``
    for a name that is not a Playground env or whose config has no ``impl``.
    """
    if config is None:
        registry = _playground_registry()
        if registry is None or name not in registry.ALL_ENVS:
            return None
        config = registry.get_default_config(name)
    if "impl" not in config:
        return None
    return "jax" if jax.default_backend() == "cpu" else str(config["impl"])
