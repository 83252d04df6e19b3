"""Small routing modules, and the per-env random keys that stochastic modules carry.

Modules:

* :class:`Flattener`: a pytree of ``(B, ...)`` leaves into one ``(B, n)`` array,
  optionally keeping the top levels of dict/list/tuple structure.
* :class:`Filter`: pick, rename and compute entries of a pytree input.
* :class:`Scale`: multiply every leaf by a fixed factor.
* :class:`Merge`: run children on the same input and merge their dict outputs into one.
* :class:`Map`: run each child on the same-named entry of a dict input.

:class:`Merge` and :class:`Map` are containers and follow the container rules
(the docs' "Writing a custom container" page): carry and extras are dicts by child
key, regularization is summed, metrics are nested under the child's key, and ``update_statistics``,
``initialize_state`` and ``reset_state`` are routed like ``__call__``.

Functions:

* :func:`new_env_keys`: seed a ``(B,)`` array of per-env keys from a :data:`KeySource`.
* :func:`require_key_source`: check a module's ``rng`` argument.
* :func:`split_env_keys`: advance per-env keys by one step.
"""

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Key

from nnx_ppo.contract.arguments import require_int, require_number
from nnx_ppo.contract.axes import BatchedTree, Carry, Extras, PerEnvKeys
from nnx_ppo.contract.checking import describe_leaf
from nnx_ppo.networks.containers import Parallel, _KeyedContainer
from nnx_ppo.networks.types import (
    EntryTypeError,
    MissingEntryError,
    StatefulModule,
    StatefulModuleOutput,
)

__all__ = [
    "Filter",
    "FilterSpec",
    "Flattener",
    "KeySource",
    "Map",
    "Merge",
    "Scale",
    "new_env_keys",
    "require_key_source",
    "split_env_keys",
]


KeySource: TypeAlias = nnx.Rngs | nnx.RngStream | Callable[[], Key[Array, ""]]
"""What seeds a stochastic module's per-env keys, anything that returns a fresh key when called.

An ``nnx.Rngs`` (its default stream), one of its streams (``rngs.params``), or a
function; nnx-ppo 0.3.0's modules called their ``rng`` the same way, so all three
keep working.
"""


def require_key_source(owner: str, name: str, value: object) -> None:
    """Raise ``TypeError`` unless ``value`` can seed keys (see :data:`KeySource`)."""
    if not callable(value):
        raise TypeError(
            f"{owner}: {name} must be an nnx.Rngs, one of its streams or a function returning "
            f"a key, got a {type(value).__name__}"
        )


def new_env_keys(rngs: KeySource, batch_size: int) -> PerEnvKeys:
    """``batch_size`` independent typed keys, one per environment, from one key drawn from ``rngs``.

    For ``initialize_state`` of modules that draw random numbers in their forward
    pass: the keys then live in the carry, so the randomness of env ``i`` depends
    only on its own carry row (the forward path is per-sample pure). A legacy
    ``uint32`` key (``jax.random.PRNGKey``) is wrapped, so the carry always holds
    typed keys.
    """
    key = rngs()
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return jax.random.split(key, batch_size)


def split_env_keys(
    keys: Key[Array, "*envs"],
) -> tuple[Key[Array, "*envs"], Key[Array, "*envs"]]:
    """Advance per-env keys one step: ``(next_keys, step_keys)``, each shaped as ``keys``.

    ``next_keys`` go into the next carry; ``step_keys`` are consumed this step.
    Each key is split on its own, so a minibatch of envs sliced from the carry
    draws exactly the numbers those envs drew in the full batch, and a
    ``reset_state`` run on one env's slice under ``vmap`` (where its key has shape
    ``()``) draws what it draws on the batched carry.
    """
    pairs = jax.vmap(jax.random.split)(keys.reshape(-1))
    return pairs[:, 0].reshape(keys.shape), pairs[:, 1].reshape(keys.shape)


def _no_regularization() -> Float[Array, ""]:
    return jnp.zeros(())


# ---------------------------------------------------------------------------- Flattener


class Flattener(StatefulModule):
    """Flattens a pytree of ``(B, ...)`` leaves into ``(B, n)`` arrays.

    With ``preserve_levels=0`` (the default) every leaf is reshaped to
    ``(B, -1)`` and the results are concatenated along the last axis, in JAX's
    leaf order (dict keys sorted). With ``preserve_levels=k`` the top ``k``
    levels of dict/list/tuple structure are kept and each subtree below them is
    flattened on its own::

        Flattener(preserve_levels=1)({"a": {"p": (B, 4), "t": (B, 2, 3)}, "b": (B, 6)})
        == {"a": (B, 10), "b": (B, 6)}

    Stateless; emits no extras.
    """

    def __init__(self, preserve_levels: int = 0) -> None:
        self.preserve_levels = require_int("Flattener", "preserve_levels", preserve_levels, 0)

    def __call__(
        self, state: tuple[()], x: BatchedTree, rollout_extras: None = None
    ) -> StatefulModuleOutput:
        output = _flatten_below(x, self.preserve_levels, "x")
        return StatefulModuleOutput((), output, _no_regularization(), {}, None)


def _flatten_below(x: BatchedTree, levels: int, where: str) -> Any:
    if levels == 0:
        leaves = jax.tree.leaves(x)
        if not leaves:
            raise ValueError(f"Flattener: {where} holds no arrays to flatten")
        return jnp.concatenate([leaf.reshape(leaf.shape[0], -1) for leaf in leaves], axis=-1)
    if isinstance(x, Mapping):
        return {
            key: _flatten_below(value, levels - 1, f"{where}[{key!r}]") for key, value in x.items()
        }
    if isinstance(x, list | tuple):
        flattened = [
            _flatten_below(value, levels - 1, f"{where}[{i}]") for i, value in enumerate(x)
        ]
        # A namedtuple takes its fields as arguments, where list and tuple take one iterable.
        return type(x)(*flattened) if hasattr(x, "_fields") else type(x)(flattened)
    raise TypeError(
        f"Flattener: {where} is a {type(x).__name__}, but {levels} more level(s) of dict, list "
        "or tuple structure were to be kept above the flattened arrays"
    )


# ------------------------------------------------------------------------------- Filter

FilterSpec: TypeAlias = str | int | tuple[str | int, ...] | Callable[[Any], Any]
"""How :class:`Filter` computes one output entry: a key, a path of keys, or a function."""


class Filter(StatefulModule):
    """Builds a dict from named pieces of its input.

    ``spec`` maps each output key to how its value is found:

    * a string or int ``k``: ``x[k]``;
    * a tuple ``(k1, k2, ...)``: the nested entry ``x[k1][k2]...``;
    * a callable ``fn``: ``fn(x)`` (it must keep the leading batch axis and act per sample).

    Everything the spec does not name is dropped. Stateless; emits no extras.

    Example::

        Filter({"policy": "action_params", "speed": ("proprio", "velocity")})
    """

    def __init__(self, spec: Mapping[str, FilterSpec]) -> None:
        if not isinstance(spec, Mapping):
            raise TypeError(f"Filter spec must be a dict, got {type(spec).__name__}")
        if not spec:
            raise ValueError("Filter spec must name at least one output")
        for out_key, how in spec.items():
            valid_path = isinstance(how, tuple) and all(isinstance(p, str | int) for p in how)
            if not (isinstance(how, str | int) or valid_path or callable(how)):
                raise TypeError(
                    f"Filter spec for {out_key!r} must be a key, a tuple of keys or a callable, "
                    f"got {how!r}"
                )
        # Pairs rather than a dict: a hashable static attribute keeps the graphdef a
        # valid jit cache key.
        self.spec: tuple[tuple[str, FilterSpec], ...] = tuple(spec.items())

    def __call__(
        self, state: tuple[()], x: BatchedTree, rollout_extras: None = None
    ) -> StatefulModuleOutput:
        output = {out_key: _extract(x, how, out_key) for out_key, how in self.spec}
        return StatefulModuleOutput((), output, _no_regularization(), {}, None)


def _extract(x: BatchedTree, how: FilterSpec, out_key: str) -> Any:
    if callable(how):
        return how(x)
    path = how if isinstance(how, tuple) else (how,)
    value = x
    for depth, key in enumerate(path):
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError) as error:
            if isinstance(value, Mapping):
                available = f"it holds {sorted(value)}"
            elif hasattr(value, "shape"):  # an array, or a tracer while JAX traces
                available = f"it is an array of {describe_leaf(value)}"
            else:
                available = f"it is a {type(value).__name__}"
            message = (
                f"Filter output {out_key!r} reads x{''.join(f'[{k!r}]' for k in path)}, but "
                f"x{''.join(f'[{k!r}]' for k in path[:depth])} has no entry {key!r} "
                f"({available})"
            )
            # The error types 0.3.0 let escape from the lookup, each also a ValueError.
            kind = EntryTypeError if isinstance(error, TypeError) else MissingEntryError
            raise kind(message) from error
    return value


# -------------------------------------------------------------------------------- Scale


class Scale(StatefulModule):
    """Multiplies every leaf of its input by a fixed ``factor``. Stateless; emits no extras."""

    def __init__(self, factor: float) -> None:
        require_number("Scale", "factor", factor)
        self.factor = float(factor)

    def __call__(
        self, state: tuple[()], x: BatchedTree, rollout_extras: None = None
    ) -> StatefulModuleOutput:
        output = jax.tree.map(lambda leaf: leaf * self.factor, x)
        return StatefulModuleOutput((), output, _no_regularization(), {}, None)


# ------------------------------------------------------------------------ Merge and Map


class Merge(Parallel):
    """Runs every child on the same input and merges their dict outputs into one dict.

    Like :class:`~nnx_ppo.networks.containers.Parallel` (same carry, extras and
    metrics by child key), but the output is flat: ``{**out_a, **out_b, ...}``.
    Each child must return a dict, and no output key may come from two children.
    The usual use is to gather named heads for a
    :class:`~nnx_ppo.networks.adapter.PPOAdapter`::

        Merge(policy=Parallel(left=..., right=...), value=Filter({"v": "value"}))
    """

    def __call__(
        self,
        state: dict[str, Carry],
        x: BatchedTree,
        rollout_extras: dict[str, Extras] | None = None,
    ) -> StatefulModuleOutput:
        outputs, rest = self._run_children(state, lambda _: x, rollout_extras)
        merged: dict[Any, Any] = {}
        owner: dict[Any, str] = {}
        for child_key, output in outputs.items():
            if not isinstance(output, Mapping):
                raise TypeError(
                    f"Merge child {child_key!r} must output a dict, got {type(output).__name__}"
                )
            for key, value in output.items():
                if key in merged:
                    raise ValueError(
                        f"Merge children {owner[key]!r} and {child_key!r} both output key {key!r}"
                    )
                merged[key], owner[key] = value, child_key
        return rest.replace(output=merged)


class Map(_KeyedContainer):
    """Runs each child on the same-named entry of a dict input; the output is a dict by key.

    ``Map(a=f, b=g)`` maps ``{"a": xa, "b": xb, ...}`` to ``{"a": f(xa), "b": g(xb)}``.
    Input entries no child is named for are dropped; a missing one is an error.
    Build with keywords, or with a dict when the keys are not identifiers. Carry
    and extras are dicts by child key.
    """

    def __init__(
        self, modules: Mapping[str, StatefulModule] | None = None, /, **kwargs: StatefulModule
    ) -> None:
        super().__init__(modules, kwargs)

    def __call__(
        self,
        state: dict[str, Carry],
        x: Mapping[str, BatchedTree],
        rollout_extras: dict[str, Extras] | None = None,
    ) -> StatefulModuleOutput:
        if not isinstance(x, Mapping):
            raise EntryTypeError(
                f"Map expects a dict input with keys {sorted(self.components)}, "
                f"got a {type(x).__name__}"
            )
        missing = sorted(set(self.components) - set(x))
        if missing:
            raise MissingEntryError(
                f"Map input lacks the entries {missing} for its children; it has {sorted(x)}"
            )
        outputs, rest = self._run_children(state, lambda key: x[key], rollout_extras)
        return rest.replace(output=outputs)
