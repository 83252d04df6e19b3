"""The environment side of the contract: one unbatched env, checked while JAX traces.

An environment follows the MuJoCo Playground convention (see the environments page of the docs):
``reset(key) -> State`` and ``step(state, action) -> State`` for **one**
environment; the library vmaps both over ``n_envs``. These checks look only at
shapes, dtypes and tree structures, so they run in Python while JAX traces and a
compiled step pays nothing for them. Like the module checks, they do nothing
when the checks are off (``nnx_ppo.checks(False)`` or ``NNX_PPO_CHECKS=0``).

What a state must look like:

- ``done``: a scalar, or a pytree of scalars with the tree of ``reward`` (one
  ``done`` per reward leaf, for per-agent ends);
- ``reward``: a scalar, or a pytree of scalars (multi-agent, multi-objective);
- ``obs``: a pytree of arrays;
- ``metrics`` and ``info``: dicts; ``info["truncated"]``, when present, is
  shaped like ``done``;
- from ``step``: exactly the tree structure, shapes and dtypes that ``reset``
  returned, field by field (the state is a scan carry, and is swapped with a
  fresh reset state where an episode ends).

Actions (:func:`check_action_tree`) follow the env's ``action_size``: an
``int`` ``n`` means one array of shape ``(n,)``, a tuple (or list) of ints means
one array of that shape, and a dict of those means a dict of actions with the same
keys. An env whose ``discrete_actions`` attribute is ``True`` takes one integer
scalar per leaf instead, a choice among ``action_size`` options; a tree of bools
with ``action_size``'s structure says it per leaf (:func:`discrete_action_flags`).
"""

from __future__ import annotations

import contextlib
import inspect
import types
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import PyTree

from nnx_ppo.contract.arguments import is_int, one_key_ndim
from nnx_ppo.contract.checking import (
    _equal_static,
    checks_enabled,
    describe_leaf,
    format_shape,
    held_dtype,
    named_leaves,
    structure_difference,
)
from nnx_ppo.contract.errors import ContractError, rule_text

__all__ = [
    "check_action_tree",
    "check_env_keeps_no_tracer",
    "check_env_reset_key",
    "check_env_state",
    "check_env_unbatched",
    "check_given_env_state",
    "discrete_action_flags",
    "is_size",
    "plain_values",
    "require_env",
    "single_state_shapes",
    "size_shape",
    "traced_attribute",
]


def require_env(
    owner: str, env: Any, needs: tuple[str, ...] = ("reset", "step"), name: str = "env"
) -> None:
    """Raise ``TypeError`` unless ``env`` (the argument ``name``) is an environment object
    with the methods ``needs`` (a name instead of one is pointed to :func:`nnx_ppo.envs.make`)."""
    __tracebackhide__ = True
    if isinstance(env, str):
        raise TypeError(
            f"{owner}: {name} is the name {env!r}, not an environment; build it with "
            f"nnx_ppo.envs.make({env!r})"
        )
    # A class is refused when its reset is an instance method (a class of static
    # methods is an env too).
    if isinstance(env, type) and inspect.isfunction(inspect.getattr_static(env, "reset", None)):
        raise TypeError(
            f"{owner}: {name} is the class {env.__name__}, not an environment; pass an "
            f"instance, e.g. {env.__name__}()"
        )
    missing = [method for method in needs if not callable(getattr(env, method, None))]
    if missing:
        raise TypeError(
            f"{owner}: {name} must be an environment with reset(key) and step(state, action); "
            f"a {type(env).__name__} has no {' and no '.join(missing)} method"
        )


_STATE_FIELDS = ("obs", "reward", "done", "metrics", "info")
"""The fields every env state has (MuJoCo Playground's ``State`` has them too)."""

_RULE_ONE_ENV = rule_text(
    "env.reset(key) and env.step(state, action) handle one environment: done and every "
    "reward leaf are scalars, and the library vmaps reset and step over n_envs",
    "the-contract",
    "environments",
)
_RULE_OBSERVATION_SIZE = rule_text(
    "env.observation_size, where an env has one, is the shape of one environment's "
    "observation: an int n for (n,), a shape, or a dict of those for a dict observation",
    "the-contract",
    "environments",
)
_RULE_PURE = rule_text(
    "env.reset and env.step are pure functions of their arguments: what an env remembers "
    "between steps lives in the State it returns",
    "the-contract",
    "environments",
)
_RULE_FIELDS = rule_text(
    "an env state has obs (a pytree of arrays), reward (a scalar or pytree of scalars), "
    "done (a scalar), metrics (a dict) and info (a dict)",
    "the-contract",
    "environments",
)
_RULE_CARRY = rule_text(
    "env.step returns the tree structure, shapes and dtypes env.reset returned: the env "
    "state is a scan carry, swapped with a fresh reset state where an episode ends",
    "the-contract",
    "environments",
)
_RULE_GIVEN_STATE = rule_text(
    "env.step is given the states this env's reset and step make: env states or a "
    "training state made with another env, or with the same env under other wrappers, "
    "do not fit it",
    "the-contract",
    "environments",
)
_RULE_KEY = rule_text(
    "env.reset takes one PRNG key: a typed key of shape () or a raw uint32 key of shape "
    "(2,); the library splits the keys and vmaps reset over n_envs",
    "the-contract",
    "environments",
)
_RULE_ACTION = rule_text(
    "env.step takes one environment's action: per leaf of env.action_size, an array of "
    "shape (action_size,) (or action_size itself, a shape), or an integer scalar where "
    "discrete_actions is True (for the env, or for that leaf)",
    "the-contract",
    "environments",
)


def _violation(where: str, problem: str, **details: str | None) -> ContractError:
    return ContractError.violation(where, problem, **details)


def _is_array(leaf: Any) -> bool:
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


# ------------------------------------------------------------------------- reset keys


def check_env_reset_key(key: Any, *, where: str = "env.reset") -> None:
    """Check that ``key`` is one PRNG key, the argument of an unbatched ``reset``.

    Args:
      key: what is about to be passed to ``env.reset``.
      where: the call site, for the message (e.g. ``"CartPole.reset"``).

    Raises:
      ContractError: ``key`` is a batch of keys, or not a key at all.
    """
    if not checks_enabled():
        return
    if not _is_array(key):
        raise _violation(
            where,
            "the reset key is not a JAX PRNG key.",
            leaf="key",
            expected="a typed key of shape () or a raw uint32 key of shape (2,)",
            found=describe_leaf(key),
            rule=_RULE_KEY,
        )
    shape, key_ndim = tuple(key.shape), one_key_ndim(key)
    if key_ndim is None:
        raise _violation(
            where,
            f"the reset key has dtype {key.dtype}, not a PRNG key's.",
            leaf="key",
            expected="a typed key of shape () or a raw uint32 key of shape (2,)",
            found=describe_leaf(key),
            rule=_RULE_KEY,
        )
    if len(shape) == key_ndim:
        return
    one_key = (
        "shape ()" if key_ndim == 0 else "shape (k,) with k the key's words, (2,) for threefry"
    )
    if len(shape) > key_ndim:
        batch_shape = shape[: len(shape) - key_ndim]
        problem = (
            f"reset was given a batch of keys {format_shape(batch_shape)}; it takes one key "
            "and handles one environment."
        )
    else:
        problem = "the reset key has the wrong shape."
    raise _violation(
        where,
        problem,
        leaf="key",
        expected=f"one {key.dtype} key: {one_key}",
        found=describe_leaf(key),
        rule=_RULE_KEY,
    )


# ----------------------------------------------------------------------------- states


def _field(state: Any, name: str, where: str) -> Any:
    if not hasattr(state, name):
        problem = f"the env state has no field {name!r}."
        if isinstance(state, Mapping):
            problem = (
                "the env state is a dict, whose entries are not fields: the library reads "
                f"state.{name}; return an nnx_ppo.envs.State (or a dataclass of your own, "
                "registered as a pytree)."
            )
        raise _violation(
            where,
            problem,
            leaf=f"state.{name}",
            expected=f"a state with the fields {', '.join(_STATE_FIELDS)}",
            found=f"a {type(state).__name__}",
            rule=_RULE_FIELDS,
        )
    return getattr(state, name)


def _check_scalar_leaves(where: str, name: str, tree: Any, what: str) -> None:
    """Every leaf of ``tree`` is a scalar array; ``what`` says what one leaf means."""
    leaves = named_leaves(name, tree)
    if not leaves:
        raise _violation(
            where,
            f"{name} has no array leaves.",
            leaf=name,
            expected=f"{what}: a scalar array or a pytree of scalar arrays",
            found=repr(tree),
            rule=_RULE_ONE_ENV,
        )
    for leaf_name, leaf in leaves:
        if _is_array(leaf) and tuple(leaf.shape) == ():
            continue
        shape = tuple(getattr(leaf, "shape", ()))
        if name == "state.done" and len(shape) == 1 and shape[0] > 1:
            problem = (
                f"{leaf_name} has shape {format_shape(shape)}, as if the env held {shape[0]} "
                "environments; pass an unbatched env (not one wrapped in vmap): the library "
                "vmaps reset and step itself."
            )
        elif _is_array(leaf):
            problem = f"{leaf_name} has shape {format_shape(shape)}, not a scalar ({what})."
        else:
            problem = f"{leaf_name} is not an array ({what})."
        raise _violation(
            where,
            problem,
            leaf=leaf_name,
            expected="shape () (one environment; the library adds the n_envs axis)",
            found=describe_leaf(leaf),
            rule=_RULE_ONE_ENV,
        )


def _check_scalar_or_like(
    where: str, name: str, tree: Any, reference_name: str, reference: Any, what: str
) -> None:
    """``tree`` is one scalar, or has the tree of ``reference`` with scalar leaves."""
    if _is_array(tree) or jax.tree_util.tree_structure(tree) == (
        jax.tree_util.tree_structure(reference)
    ):
        _check_scalar_leaves(where, name, tree, what)
        return
    raise _violation(
        where,
        f"{name} is neither a scalar nor a pytree with the tree of {reference_name}.",
        leaf=name,
        expected=f"a scalar, or one scalar per leaf of {reference_name} "
        f"({jax.tree_util.tree_structure(reference)})",
        found=structure_difference(reference_name, reference, name, tree),
        rule=_RULE_ONE_ENV,
    )


def _check_mapping(where: str, name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise _violation(
            where,
            f"{name} is a {type(value).__name__}, not a dict.",
            leaf=name,
            expected="a dict",
            found=f"a {type(value).__name__}",
            rule=_RULE_FIELDS,
        )


def _check_same_as_reference(
    where: str, name: str, value: Any, reference: Any, rule: str = _RULE_CARRY
) -> None:
    ref_name = name.replace("state", "reference", 1)
    ref_def = jax.tree_util.tree_structure(reference)
    if jax.tree_util.tree_structure(value) != ref_def:
        raise _violation(
            where,
            f"{name} does not have the tree structure env.reset returned.",
            leaf=name,
            expected=f"the structure of the reset state's {name.removeprefix('state.')}: {ref_def}",
            found=structure_difference(ref_name, reference, name, value),
            rule=rule,
        )
    for (_, ref_leaf), (leaf_name, leaf) in zip(
        named_leaves(ref_name, reference), named_leaves(name, value), strict=True
    ):
        if not (_is_array(ref_leaf) and _is_array(leaf)):
            continue
        # As JAX will hold it: a NumPy float64 leaf becomes float32 without JAX_ENABLE_X64.
        dtype, ref_dtype = held_dtype(leaf.dtype), held_dtype(ref_leaf.dtype)
        if tuple(ref_leaf.shape) != tuple(leaf.shape) or ref_dtype != dtype:
            raise _violation(
                where,
                f"{leaf_name} changed shape or dtype from what env.reset returned.",
                leaf=leaf_name,
                expected=f"shape {format_shape(tuple(ref_leaf.shape))} {ref_dtype} "
                "(as returned by env.reset)",
                found=describe_leaf(leaf),
                rule=rule,
            )


def _require_each(
    where: str,
    leaves: list[tuple[str, Any]],
    holds: Callable[[Any], Any],
    problem: str,
    expected: str,
    rule: str,
) -> None:
    """Raise for the first of the named ``leaves`` that ``holds`` rejects."""
    for leaf_name, leaf in leaves:
        if not holds(leaf):
            raise _violation(
                where,
                f"{leaf_name} {problem}.",
                leaf=leaf_name,
                expected=expected,
                found=describe_leaf(leaf),
                rule=rule,
            )


def check_env_state(state: Any, *, where: str, reference: Any = None) -> None:
    """Check one unbatched env state: what ``reset`` or ``step`` returned for one env.

    Call it on the state one environment sees (inside the function the library
    vmaps, or on ``jax.eval_shape`` of ``reset``); it reads only shapes, dtypes
    and trees.

    Args:
      state: the env state, with the fields ``obs``, ``reward``, ``done``,
        ``metrics`` and ``info``.
      where: the call site, for the message (e.g. ``"CartPole.step"``).
      reference: a state ``reset`` returned for the same env. When given, every
        field of ``state`` (and every other pytree field, like Playground's
        ``data``) must have the reference's tree structure, shapes and dtypes.

    Raises:
      ContractError: naming the field (e.g. ``state.reward['agent_0']``), what
        was expected and what was found.
    """
    if not checks_enabled():
        return
    obs, reward, done, metrics, info = (_field(state, name, where) for name in _STATE_FIELDS)
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(state)):
        raise _violation(
            where,
            f"the env state, a {type(state).__name__}, is not a pytree: JAX cannot carry it "
            "through jit, vmap and scan. Register its class as one "
            "(jax.tree_util.register_dataclass, or flax.struct.dataclass), or return an "
            "nnx_ppo.envs.State.",
            leaf="state",
            expected="a pytree with the fields " + ", ".join(_STATE_FIELDS),
            found=f"a {type(state).__name__} JAX takes for one leaf",
            rule=_RULE_FIELDS,
        )
    _check_scalar_or_like(
        where, "state.done", done, "state.reward", reward, "one end-of-episode flag"
    )
    _check_scalar_leaves(where, "state.reward", reward, "one environment's reward")
    _require_each(  # GAE and the loss take floats
        where,
        named_leaves("state.reward", reward),
        lambda leaf: jnp.issubdtype(leaf.dtype, jnp.floating),
        "is not a float",
        "a floating-point scalar (e.g. float32)",
        _RULE_ONE_ENV,
    )
    obs_leaves = named_leaves("state.obs", obs)
    if not obs_leaves:
        raise _violation(
            where,
            "state.obs has no array leaves.",
            leaf="state.obs",
            expected="a pytree of arrays",
            found=repr(obs),
            rule=_RULE_FIELDS,
        )
    _require_each(where, obs_leaves, _is_array, "is not an array", "an array", _RULE_FIELDS)
    _check_mapping(where, "state.metrics", metrics)
    _check_mapping(where, "state.info", info)
    for name in ("truncated", "truncation"):  # ours and MuJoCo Playground's
        if name in info:
            flag = "one time-limit flag"
            leaf = f"state.info[{name!r}]"
            _check_scalar_or_like(where, leaf, info[name], "state.done", done, flag)
    if reference is None:
        return
    for name in _STATE_FIELDS:
        _check_same_as_reference(
            where, f"state.{name}", getattr(state, name), getattr(reference, name)
        )
    _check_same_as_reference(where, "state", state, reference)


def check_given_env_state(state: Any, *, where: str, reference: Any) -> None:
    """Check one env's state as ``step`` is given it against its reset state ``reference``.

    Env states made by another env (a training state built with the bare env, then
    stepped with it wrapped) are named here, rather than as a ``KeyError`` inside
    ``step`` or a scan's carry mismatch.
    """
    if checks_enabled():
        _check_same_as_reference(where, "state", state, reference, rule=_RULE_GIVEN_STATE)


_NOT_WALKED = (
    Tracer,
    jax.Array,
    np.ndarray,
    type,
    types.ModuleType,  # an env holding numpy (self.np = np) would walk all of it
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
)
"""What an env holds that is read as one value: arrays, and code."""


def _held(value: Any, path: str, seen: set[int], depth: int) -> Iterator[tuple[str, Any]]:
    """Each value among ``value``'s attributes and containers, by path from ``path``
    (``"env"``: ``"env._key"``), with the plain class attributes of the objects walked
    (``calls = 0`` on the class is ``env.calls`` until an instance attribute hides it).
    Each object is walked once, where first reached (``seen``, shared by the walk).
    ``depth`` bounds the walk: each wrapper nests the env one level deeper (a dict on an
    env wrapped twice is at depth 4)."""
    leaf = _is_plain(value) or isinstance(value, _NOT_WALKED)
    if leaf or depth == 0 or id(value) in seen:
        yield path, value
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = [(f"{path}[{key!r}]", item) for key, item in value.items()]
    elif isinstance(value, list | tuple):
        items = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
    elif hasattr(value, "__dict__"):
        own = vars(value)
        of_class = {
            name: item
            for klass in reversed(inspect.getmro(type(value)))
            for name, item in vars(klass).items()
            if not name.startswith("__") and _is_plain(item)
        }
        items = [(f"{path}.{name}", item) for name, item in (of_class | own).items()]
    else:
        yield path, value
        return
    for item_path, item in items:
        yield from _held(item, item_path, seen, depth - 1)


def _set_once(before: Any, after: Any) -> bool:
    """What a first call sets up, not state: a value worked out lazily in place of
    ``None``, or a flag from ``False`` to ``True`` (an env that readied itself)."""
    return before is None or (before is False and after is True)


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | complex | str | np.generic)


def traced_attribute(value: Any, path: str) -> str | None:
    """The path of the first JAX tracer among ``value``'s attributes and containers, from
    ``path``, or ``None``: state an env kept on itself while JAX traced it, instead of in
    its ``State``."""
    return next(
        (where for where, held in _held(value, path, set(), 8) if isinstance(held, Tracer)),
        None,
    )


def plain_values(env: Any) -> dict[str, Any]:
    """The plain Python values (numbers, strings, ``None``) an env object holds, by path:
    constants to JAX, read once per trace, so one a traced ``reset`` or ``step`` changes
    (a call counter) changes in no compiled call."""
    return {where: held for where, held in _held(env, "env", set(), 8) if _is_plain(held)}


def check_env_keeps_no_tracer(
    env: Any, *, where: str, values_before: Mapping[str, Any] | None = None
) -> None:
    """Check, after JAX traced ``where`` (an env's ``reset`` or ``step``), that the env
    object holds no traced value, and, given its :func:`plain_values` from before the
    trace, that it changed none of them: what it remembers between steps belongs in
    the state.

    Raises:
      ContractError: naming the attribute, e.g. ``env._key`` or ``env.calls``.
    """
    if not checks_enabled():
        return
    kept = traced_attribute(env, "env")
    if kept is not None:
        raise _violation(
            where,
            f"stored a traced value on the env object, at {kept}: an env is a pure "
            "function of its state. Keep what it remembers between steps (a key, a "
            "counter) in the State's data.",
            leaf=kept,
            expected="no traced value kept on the env",
            found="a JAX tracer, which fails later with a message that names nothing",
            rule=_RULE_PURE,
        )
    if values_before is None:
        return
    now = plain_values(env)
    for path, before in values_before.items():
        if (
            path in now
            and not _equal_static(before, now[path])
            and not _set_once(before, now[path])
        ):
            raise _violation(
                where,
                f"changed {path} from {before!r} to {now[path]!r} on the env object: JAX "
                "runs the Python code of reset and step once, when it traces them, so a "
                "compiled call never changes it again (a counter counts traces, not "
                "steps). Keep what an env remembers between steps in the State's data (a "
                "value worked out on the first call may start as None).",
                leaf=path,
                expected="the env object's values unchanged by reset and step",
                found=f"{path}: {before!r} before the trace, {now[path]!r} after",
                rule=_RULE_PURE,
            )


_PROBE_BATCH = 3
"""Keys given to a ``reset`` that failed on one, to tell a batched env from a broken one."""


def _resets_a_batch(env: Any, key: Any) -> bool:
    """Whether ``env.reset`` maps a batch of keys to a batch of states, as a batched env does."""
    keys = jax.random.split(key, _PROBE_BATCH)
    try:
        states = jax.eval_shape(env.reset, keys)
    except Exception:  # any failure here means "not a batched env"
        return False
    leaves = jax.tree.leaves(states)
    return bool(leaves) and all(
        getattr(leaf, "shape", ())[:1] == (_PROBE_BATCH,) for leaf in leaves
    )


def check_env_unbatched(env: Any, key: Any = None) -> Any:
    """Check that ``env`` is one unbatched environment, before the library vmaps it.

    Traces ``env.reset`` on one key with :func:`jax.eval_shape` (nothing is
    computed) and checks the state it returns. A batched env passed by mistake
    (one already wrapped in ``vmap``) fails here, with a message naming the field
    that carries the extra axis.

    Args:
      env: an environment with ``reset(key) -> State``.
      key: one PRNG key; a fixed one when not given.

    Returns:
      The reset state's shapes (``jax.ShapeDtypeStruct`` leaves), a reference for
      :func:`check_env_state` on the states ``step`` returns.

    Raises:
      ContractError: the key or the reset state breaks the contract, or ``reset``
        fails on one key but returns a batch of states for a batch of keys (a
        batched env).
      Exception: whatever else ``reset`` raises on one key, unchanged.
    """
    where = f"{type(env).__name__}.reset"
    key = jax.random.key(0) if key is None else key
    check_env_reset_key(key, where=where)

    def checked_reset(key: Any) -> Any:
        # Checked as reset returns it: a Python float reward is still one here.
        state = env.reset(key)
        check_env_state(state, where=where)
        return state

    try:
        reference = jax.eval_shape(checked_reset, key)
    except ContractError:
        raise
    except Exception as error:
        if not _resets_a_batch(env, key):
            raise  # an ordinary bug in reset: its own error says most
        raise _violation(
            where,
            "env.reset failed when given one key, and given a batch of "
            f"{_PROBE_BATCH} keys it returns {_PROBE_BATCH} states: the env is batched "
            "(wrapped in vmap). Pass the unbatched env: the library vmaps reset and step itself.",
            leaf="key",
            expected="reset(key) -> State for one environment",
            found=f"{type(error).__name__}: {str(error).strip().splitlines()[0]}",
            rule=_RULE_ONE_ENV,
        ) from error
    size = getattr(env, "observation_size", None)
    unreadable = None if size is None else _unreadable_size(size, "env.observation_size")
    if unreadable is not None:
        leaf, value = unreadable
        raise _violation(
            where,
            f"{leaf} is not a size: networks are built from observation_size, so "
            "make_default_network could not read it.",
            leaf=leaf,
            expected="an int, a shape (a tuple of ints), or a dict of those",
            found=f"{type(value).__name__} {value!r}"
            + (" (a method: is @property missing?)" if callable(value) else ""),
            rule=_RULE_OBSERVATION_SIZE,
        )
    mismatch = None if size is None else _observation_mismatch(reference.obs, size, "state.obs")
    if mismatch is not None:
        leaf, expected, found = mismatch
        raise _violation(
            where,
            f"env.reset's observation does not have the shape env.observation_size declares "
            f"({size!r}): networks are built from observation_size, so they would not fit it.",
            leaf=leaf,
            expected=expected,
            found=found,
            rule=_RULE_OBSERVATION_SIZE,
        )
    return reference


def _unreadable_size(size: Any, name: str) -> tuple[str, Any] | None:
    """``(name, value)`` of the first part of an ``observation_size`` that is neither a
    size (see :func:`is_size`) nor a dict of sizes; ``None`` where it all reads."""
    if isinstance(size, Mapping):
        for key, entry in size.items():
            unreadable = _unreadable_size(entry, f"{name}[{key!r}]")
            if unreadable is not None:
                return unreadable
        return None
    return None if is_size(size) else (name, size)


def _observation_mismatch(obs: Any, size: Any, name: str) -> tuple[str, str, str] | None:
    """``(leaf, expected, found)`` where ``obs`` (shapes) differs from ``observation_size``
    ``size``: an ``int`` width, a shape, or a dict of those for a dict observation."""
    if isinstance(size, Mapping):
        if not isinstance(obs, Mapping) or set(obs) != set(size):
            keys = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
            return name, f"a dict with the keys {sorted(size)}", f"{keys}"
        for key in size:
            mismatch = _observation_mismatch(obs[key], size[key], f"{name}[{key!r}]")
            if mismatch is not None:
                return mismatch
        return None
    if not hasattr(obs, "shape"):
        return name, "an array", type(obs).__name__
    expected = size_shape(size)
    if tuple(obs.shape) != expected:
        return name, f"shape {expected}", f"shape {tuple(obs.shape)}"
    return None


# ---------------------------------------------------------------------------- actions


def is_size(node: Any) -> bool:
    """Whether ``node`` is a size: an integer ``n`` (the shape ``(n,)``) or a shape.

    A shape is a tuple or list of integers. NumPy integers count, a ``bool`` does
    not. Sizes are the leaves of ``action_size``, ``observation_size`` and a
    ``Normalizer``'s declared shapes. A dimension's sign is not looked at: a negative
    one is still a size, for its user to name in its own error.
    """
    return is_int(node) or (isinstance(node, tuple | list) and all(map(is_int, node)))


def size_shape(size: int | Sequence[int]) -> tuple[int, ...]:
    """The shape a size (see :func:`is_size`) stands for: ``(n,)`` for an integer ``n``."""
    return tuple(int(d) for d in size) if isinstance(size, Sequence) else (int(size),)


def discrete_action_flags(env: Any) -> list[bool]:
    """Whether each leaf of ``env.action_size`` is discrete, in JAX's leaf order.

    ``env.discrete_actions`` is one ``bool`` for every action leaf (``False`` where
    the env has none) or, for a dict action that mixes the two kinds, a tree of
    bools with ``env.action_size``'s structure.

    Raises:
      TypeError: ``discrete_actions`` is neither (the message says what it is), or
        a discrete leaf's size is a shape, not the number of choices.
    """
    value = getattr(env, "discrete_actions", False)
    name = type(env).__name__
    sized, size_tree = jax.tree.flatten_with_path(env.action_size, is_leaf=is_size)
    if isinstance(value, bool | np.bool_):
        flags = [bool(value)] * len(sized)
    else:
        given, flag_tree = jax.tree.flatten(value)
        if flag_tree != size_tree or not all(isinstance(f, bool | np.bool_) for f in given):
            one_shape = isinstance(env.action_size, tuple | list) and is_size(env.action_size)
            hint = (
                " (a tuple of ints is one shape; write a tuple of actions with a shape "
                "among them, e.g. (2, (1,)), or use a dict)"
                if one_shape and len(given) == len(env.action_size)
                else ""
            )
            raise TypeError(
                f"{name}.discrete_actions must be one bool, or a tree of bools with the "
                f"structure of its action_size {env.action_size!r}{hint}; got {value!r}"
            )
        flags = [bool(f) for f in given]
    for (path, size), discrete in zip(sized, flags, strict=True):
        if discrete and not is_int(size):
            raise TypeError(
                f"{name}.action_size{jax.tree_util.keystr(path)} is {size!r}, but that leaf "
                "is discrete: a discrete leaf's size is one int, its number of choices"
            )
    return flags


def check_action_tree(
    action: PyTree[Any],
    env: Any,
    *,
    where: str = "env.step",
    batch_size: int | None = None,
) -> None:
    """Check that ``action`` fits ``env.action_size`` (and ``env.discrete_actions``).

    Args:
      action: one environment's action; with ``batch_size``, a batch of them
        whose every leaf leads with ``batch_size``.
      env: the environment. Where it has no ``action_size``, only the leaves'
        being arrays (and their batch axis) is checked.
      where: the call site, for the message (e.g. ``"CartPole.step"``).
      batch_size: when given, the number of environments on the leading axis.

    Raises:
      ContractError: the action's tree differs from ``env.action_size``'s, or a
        leaf has the wrong shape or kind of dtype; the message names the leaf
        (e.g. ``action['agent_0']``).
    """
    if not checks_enabled():
        return
    action_size = getattr(env, "action_size", None)
    leaves = named_leaves("action", action)
    lead = () if batch_size is None else (batch_size,)
    for leaf_name, leaf in leaves:
        shape = tuple(getattr(leaf, "shape", ()))
        if not _is_array(leaf) or shape[: len(lead)] != lead:
            raise _violation(
                where,
                f"{leaf_name} is not an array leading with B={batch_size}."
                if lead
                else f"{leaf_name} is not an array.",
                leaf=leaf_name,
                expected="an array" + (f" of shape (B={batch_size}, ...)" if lead else ""),
                found=describe_leaf(leaf),
                rule=_RULE_ACTION,
            )
    if action_size is None:
        return
    sizes = jax.tree_util.tree_flatten_with_path(action_size, is_leaf=is_size)[0]
    expected_names = ["action" + jax.tree_util.keystr(path) for path, _ in sizes]
    found_names = [leaf_name for leaf_name, _ in leaves]
    if expected_names != found_names:
        missing = [n for n in expected_names if n not in found_names]
        extra = [n for n in found_names if n not in expected_names]
        found = "; ".join(
            part
            for part in (
                "missing " + ", ".join(missing) if missing else "",
                "unexpected " + ", ".join(extra) if extra else "",
            )
            if part
        )
        raise _violation(
            where,
            "the action's tree does not match env.action_size.",
            leaf="action",
            expected=f"the tree of env.action_size = {action_size!r}",
            found=found,
            rule=_RULE_ACTION,
        )
    one_kind = isinstance(getattr(env, "discrete_actions", False), bool | np.bool_)
    flags = discrete_action_flags(env)
    for (path, size), (leaf_name, leaf), discrete in zip(sizes, leaves, flags, strict=True):
        size_name = "env.action_size" + jax.tree_util.keystr(path)
        flag_name = "discrete_actions" + ("" if one_kind else jax.tree_util.keystr(path))
        shape = tuple(leaf.shape)[len(lead) :]
        if discrete:
            expected_shape: tuple[int, ...] = ()
            kind_ok = jnp.issubdtype(leaf.dtype, jnp.integer)
            kind = f"an integer index into {size_name} = {size!r} choices"
        else:
            expected_shape = size_shape(size)
            kind_ok = jnp.issubdtype(leaf.dtype, jnp.floating)
            kind = f"floats, {size_name} = {size!r}"
        if shape != expected_shape or not kind_ok:
            batch_dims: tuple[str, ...] = (f"B={batch_size}",) if lead else ()
            raise _violation(
                where,
                f"{leaf_name} has shape {format_shape(tuple(leaf.shape))} {leaf.dtype}, "
                f"not one environment's action ({kind}).",
                leaf=leaf_name,
                expected=f"shape {format_shape((*batch_dims, *expected_shape))} "
                + ("integer" if discrete else "floating")
                + (f" ({flag_name}=True)" if discrete else ""),
                found=describe_leaf(leaf),
                rule=_RULE_ACTION,
            )


_SINGLE_STATES: weakref.WeakKeyDictionary[Any, tuple[bool, Any]] = weakref.WeakKeyDictionary()
"""Per env: whether the contract checks ran on its reset, and its one-env reset state's shapes."""


def single_state_shapes(env: Any) -> Any:
    """The shapes of one env's reset state, checked when the checks are on.

    Tracing a simulator's ``reset`` takes seconds (MJX: about 1.5 s), and every
    compiled program that steps the env needs these shapes, so they are kept per
    env object (hashable, weakly referenced envs; JAX already takes an env passed
    as a static argument to be immutable). A state traced with the checks off is
    traced again, and checked, once they are on.
    """
    checked = checks_enabled()
    try:
        cached = _SINGLE_STATES.get(env)
    except TypeError:  # an unhashable or not weakly referenceable env: no cache
        cached = None
    if cached is not None and (cached[0] or not checked):
        return cached[1]
    shapes = check_env_unbatched(env) if checked else jax.eval_shape(env.reset, jax.random.key(0))
    with contextlib.suppress(TypeError):
        _SINGLE_STATES[env] = (checked, shapes)
    return shapes
