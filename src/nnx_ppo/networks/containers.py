"""Containers: modules made of modules, routing state, extras and statistics.

Every container follows the four container rules (the docs' "Writing a custom
container" page): children
live in NNX-tracked attributes; ``state`` and ``rollout_extras`` are sliced per
child the same way and reassembled into mirroring trees; children's
``regularization_loss`` is summed and their ``metrics`` nested under the child's
key (its position, for :class:`Sequential`); and ``update_statistics``,
``initialize_state`` and ``reset_state`` are routed exactly like ``__call__``.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Shaped

from nnx_ppo.contract import ContractError, describe_module
from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.axes import (
    AnyArray,
    BatchedTree,
    Carry,
    CarrySlice,
    Extras,
    HistoryTree,
    RegularizationLoss,
)
from nnx_ppo.contract.checking import FROZEN_STATISTICS_MARK, describe_leaf
from nnx_ppo.contract.errors import rule_text
from nnx_ppo.networks.types import (
    EntryTypeError,
    MissingEntryError,
    StatefulModule,
    StatefulModuleOutput,
    require_stateful_module,
)

__all__ = ["Concat", "FrozenStatistics", "Parallel", "Sequential", "Splitter"]


_RULE_PER_CHILD = rule_text(
    "a container's carry and rollout_extras hold one entry per child, in the structure "
    "its initialize_state and __call__ build them",
    "the-four-rules",
    page="custom_containers",
)


_RULE_CONCAT = rule_text(
    "Concat joins its children's (B, n_k) outputs along the feature axis into (B, sum n_k)",
    "writing-a-custom-container",
    page="custom_containers",
)


def _child_extras(rollout_extras: Any, key: Any) -> Extras:
    return None if rollout_extras is None else rollout_extras[key]


def _describe_entries(value: Any) -> str:
    """What a carry or extras tree holds at its top: its keys, its length, or the leaf."""
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {list(value)}"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of length {len(value)}"
    return describe_leaf(value)


def _per_child_violation(
    container: StatefulModule,
    method: str,
    name: str,
    expected: str,
    value: Any,
    entries: str = "one entry per child",
) -> ContractError:
    return ContractError.violation(
        f"{describe_module(container)}.{method}",
        f"{name} does not hold {entries}.",
        leaf=name,
        expected=expected,
        found=_describe_entries(value),
        rule=_RULE_PER_CHILD,
    )


class Sequential(StatefulModule):
    """Runs ``layers`` in order, each on the previous one's output.

    Carry: a list with one entry per layer. Emits a list with each layer's
    ``rollout_extras``. Metrics are nested under the layer's position.

    ``layers`` may be any iterable, a generator included: it is read once.

    Example::

        Sequential([Dense(4, 32, rngs, activation=nnx.relu), Dense(32, 2, rngs)])
    """

    def __init__(self, layers: Iterable[StatefulModule]) -> None:
        # Read once: a generator is truthy however many layers it yields, and the
        # checks below would exhaust it before nnx.List saw a layer.
        layers = tuple(layers)
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        for i, layer in enumerate(layers):
            require_stateful_module(f"Sequential layer {i}", layer)
        self.layers = nnx.List(layers)

    def __call__(
        self, state: list[Carry], x: BatchedTree, rollout_extras: list[Extras] | None = None
    ) -> StatefulModuleOutput:
        self._require_per_layer("__call__", "state", state)
        if rollout_extras is not None:
            self._require_per_layer("__call__", "rollout_extras", rollout_extras)
        next_state: list[Carry] = []
        emitted: list[Any] = []
        metrics: dict[int, Any] = {}
        regularization: RegularizationLoss = jnp.zeros(())
        for i, layer in enumerate(self.layers):
            out = layer(state[i], x, _child_extras(rollout_extras, i))
            next_state.append(out.next_state)
            emitted.append(out.rollout_extras)
            metrics[i] = out.metrics
            regularization = regularization + out.regularization_loss
            x = out.output
        return StatefulModuleOutput(next_state, x, regularization, metrics, emitted)

    def initialize_state(self, batch_size: int) -> list[Carry]:
        return [layer.initialize_state(batch_size) for layer in self.layers]

    def reset_state(self, prev_state: list[CarrySlice]) -> list[CarrySlice]:
        self._require_per_layer("reset_state", "prev_state", prev_state)
        return [layer.reset_state(s) for layer, s in zip(self.layers, prev_state, strict=True)]

    def update_statistics(self, rollout_extras: list[HistoryTree]) -> None:
        self._require_per_layer("update_statistics", "rollout_extras", rollout_extras)
        for layer, extras in zip(self.layers, rollout_extras, strict=True):
            layer.update_statistics(extras)

    def _require_per_layer(self, method: str, name: str, value: Any) -> None:
        """``value`` (a carry or extras) is a list with one entry per layer.

        Its length is static structure, read while JAX traces: the check costs
        nothing in the compiled program.
        """
        if not (isinstance(value, list | tuple) and len(value) == len(self.layers)):
            expected = f"a list of length {len(self.layers)}, one entry per layer"
            raise _per_child_violation(self, method, name, expected, value)

    def __getitem__(self, index: int) -> StatefulModule:
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[StatefulModule]:
        return iter(self.layers)


class _KeyedContainer(StatefulModule):
    """Children under string keys; the carry and extras are dicts by the same keys."""

    def __init__(
        self, modules: Mapping[str, StatefulModule] | None, kwargs: dict[str, StatefulModule]
    ) -> None:
        name = type(self).__name__
        if modules is not None and kwargs:
            raise ValueError(f"{name}: pass either a dict or keyword arguments, not both")
        components = dict(modules) if modules is not None else kwargs
        if not components:
            raise ValueError(f"{name} needs at least one child module")
        for key, module in components.items():
            if not isinstance(key, str):
                raise TypeError(f"{name} keys must be strings, got {key!r}")
            require_stateful_module(f"{name}[{key!r}]", module)
        self.components = nnx.Dict(components)
        # NNX re-sorts a Dict's keys in split/merge (so under jit); the declared order is
        # static structure, kept here so eager and compiled calls visit children alike.
        self.order = nnx.static(tuple(components))

    def children(self) -> Iterator[tuple[str, StatefulModule]]:
        """The children as (key, module), in the order they were given."""
        for key in self.order:
            yield key, self.components[key]

    def _run_children(
        self,
        state: dict[str, Carry],
        inputs: Callable[[str], Any],
        rollout_extras: dict[str, Extras] | None,
    ) -> tuple[dict[str, Any], StatefulModuleOutput]:
        """Call each child on ``inputs(key)``; return the outputs and the merged rest."""
        self._require_per_key("__call__", "state", state)
        if rollout_extras is not None:
            self._require_per_key("__call__", "rollout_extras", rollout_extras)
        outputs: dict[str, Any] = {}
        next_state: dict[str, Carry] = {}
        emitted: dict[str, Any] = {}
        metrics: dict[str, Any] = {}
        regularization: RegularizationLoss = jnp.zeros(())
        for key, module in self.children():
            out = module(state[key], inputs(key), _child_extras(rollout_extras, key))
            outputs[key] = out.output
            next_state[key] = out.next_state
            emitted[key] = out.rollout_extras
            metrics[key] = out.metrics
            regularization = regularization + out.regularization_loss
        return outputs, StatefulModuleOutput(next_state, None, regularization, metrics, emitted)

    def initialize_state(self, batch_size: int) -> dict[str, Carry]:
        return {k: m.initialize_state(batch_size) for k, m in self.children()}

    def reset_state(self, prev_state: dict[str, CarrySlice]) -> dict[str, CarrySlice]:
        self._require_per_key("reset_state", "prev_state", prev_state)
        return {k: m.reset_state(prev_state[k]) for k, m in self.children()}

    def update_statistics(self, rollout_extras: dict[str, HistoryTree]) -> None:
        self._require_per_key("update_statistics", "rollout_extras", rollout_extras)
        for key, module in self.children():
            module.update_statistics(rollout_extras[key])

    def _require_per_key(self, method: str, name: str, value: Any) -> None:
        """``value`` (a carry or extras) is a dict with exactly the children's keys.

        Its keys are static structure, read while JAX traces: the check costs
        nothing in the compiled program.
        """
        if not (isinstance(value, Mapping) and set(value) == set(self.order)):
            expected = f"a dict with keys {list(self.order)}, one per child"
            raise _per_child_violation(self, method, name, expected, value)

    def __getitem__(self, key: str) -> StatefulModule:
        return self.components[key]


class Parallel(_KeyedContainer):
    """Runs every child on the **same** input; the output is a dict by child key.

    Build with keywords, ``Parallel(actor=..., critic=...)``, or with a dict when
    the keys are not identifiers. Carry and extras are dicts by the same keys.
    """

    def __init__(
        self, modules: Mapping[str, StatefulModule] | None = None, /, **kwargs: StatefulModule
    ) -> None:
        super().__init__(modules, kwargs)

    def __call__(
        self,
        state: dict[str, Carry],
        x: BatchedTree,
        rollout_extras: dict[str, Extras] | None = None,
    ) -> StatefulModuleOutput:
        outputs, rest = self._run_children(state, lambda _: x, rollout_extras)
        return rest.replace(output=outputs)


class Concat(_KeyedContainer):
    """Runs each child on the same-named entry of a dict input; concatenates outputs.

    The children's outputs must be arrays ``(B, n_k)``; the output is
    ``(B, sum n_k)`` in the order the children were given. The input dict must
    have exactly the children's keys.
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
        expected = sorted(self.components)
        if not isinstance(x, Mapping):
            raise EntryTypeError(
                f"Concat expects a dict input with keys {expected}, got a {type(x).__name__}"
            )
        if set(x) != set(self.components):
            # A missing key is the KeyError 0.3.0 raised; an extra one it silently dropped.
            kind = MissingEntryError if set(self.components) - set(x) else ValueError
            raise kind(f"Concat expects a dict input with keys {expected}, got {sorted(x)}")
        outputs, rest = self._run_children(state, lambda key: x[key], rollout_extras)
        for key, output in outputs.items():
            # Checked here, where the child can be named: a dict fails in jnp.concatenate
            # with no key, and a (B,) array concatenates along B, blamed on Concat's output.
            if getattr(output, "ndim", None) != 2:
                raise ContractError.violation(
                    f"{describe_module(self)}.__call__",
                    f"child {key!r} does not output a (B, n) array to concatenate.",
                    leaf=f"components[{key!r}] output",
                    expected="(B, n) array",
                    found=_describe_entries(output),
                    rule=_RULE_CONCAT,
                )
        return rest.replace(output=jnp.concatenate(list(outputs.values()), axis=-1))


class Splitter(StatefulModule):
    """Splits a ``(B, n)`` input into a dict of named slices of the last axis.

    ``Splitter(action_params=4, value=1)`` turns ``(B, 5)`` into
    ``{"action_params": (B, 4), "value": (B, 1)}``. The declared sizes must add
    up to the input width exactly: a mismatch is an error, never a silent slice.
    Stateless; emits no extras.
    """

    def __init__(self, **sizes: int) -> None:
        if not sizes:
            raise ValueError("Splitter needs at least one named slice")
        for key, size in sizes.items():
            require_int("Splitter", f"slice {key!r}", size)
        # A tuple of pairs, not a dict: static module fields must hash (jit cache keys).
        self.sizes = nnx.static(tuple(sizes.items()))

    def __call__(
        self, state: tuple[()], x: Shaped[AnyArray, "B n"], rollout_extras: None = None
    ) -> StatefulModuleOutput:
        total = sum(size for _, size in self.sizes)
        if x.shape[-1] != total:
            raise ValueError(
                f"Splitter declares slices {dict(self.sizes)} adding up to {total} features, "
                f"but its input has {x.shape[-1]} (shape {tuple(x.shape)})"
            )
        outputs: dict[str, Array] = {}
        offset = 0
        for key, size in self.sizes:
            outputs[key] = jnp.asarray(x[..., offset : offset + size])
            offset += size
        return StatefulModuleOutput((), outputs, jnp.zeros(()), {}, None)


class FrozenStatistics(StatefulModule):
    """Runs ``module`` unchanged, but never updates its running statistics.

    The way to declare a module whose statistics are held fixed on purpose: a
    normaliser reused from a trained network, a target copy kept as an attribute.
    ``update_statistics`` stops here, and the routing check (which otherwise fails
    a top-level ``update_statistics`` that never reaches a stats-bearing module)
    does not expect it to reach anything inside. Parameters are not frozen by this
    wrapper: leave them out of the optimizer for that.

    Carry, output and ``rollout_extras`` are ``module``'s own.

    Example::

        Sequential([FrozenStatistics(trained_normalizer), policy_layers])
    """

    def __init__(self, module: StatefulModule) -> None:
        require_stateful_module("the module FrozenStatistics wraps", module)
        self.module = module

    def __call__(
        self, state: Carry, x: BatchedTree, rollout_extras: Extras = None
    ) -> StatefulModuleOutput:
        return self.module(state, x, rollout_extras)

    def initialize_state(self, batch_size: int) -> Carry:
        return self.module.initialize_state(batch_size)

    def reset_state(self, prev_state: CarrySlice) -> CarrySlice:
        return self.module.reset_state(prev_state)

    def update_statistics(self, rollout_extras: HistoryTree) -> None:
        del rollout_extras  # held fixed, by declaration


setattr(FrozenStatistics, FROZEN_STATISTICS_MARK, True)
