"""``PopulationGraph``: a network declared as named populations joined by delayed connections.

Each step every population sums what reaches it (an observation entry, for an input
population, and the output of each incoming connection's transform), then applies its
activation once. A connection with delay 0 reads its source's output of the same step,
so zero-delay connections must form no cycle; a connection with delay ``k >= 1`` reads
the source's output from ``k`` steps earlier out of a ring buffer in the carry.
Recurrence is therefore a delayed connection, e.g. ``connect("h", "h", delay=1)``.
"""

import heapq
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypedDict

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

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
from nnx_ppo.networks.containers import _per_child_violation
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.graph.connection import Connection
from nnx_ppo.networks.graph.population import Population
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["GraphCarry", "GraphExtras", "GraphHistory", "PopulationGraph", "RingBuffer"]


class RingBuffer(TypedDict):
    """The past outputs of one population, kept for the delayed connections that read it.

    Leaves lead with ``B`` in a batched carry and lack it in one env's slice (which
    ``reset_state`` is also given, under ``vmap``); the annotations say ``*B``.

    Attributes:
      buffer: the last ``k`` outputs, ``(B, k, size)``, where ``k`` is the population's
        longest outgoing delay; zeros where the episode has not run that long.
      buffer_idx: ``(B,)`` int32, the slot the next output is written to. The output
        from ``d`` steps earlier is in slot ``(buffer_idx - d) % k``.
    """

    buffer: Float[AnyArray, "*B _k _size"]
    buffer_idx: Int[AnyArray, "*B"]


class GraphCarry(TypedDict):
    """The carry of a :class:`PopulationGraph`.

    Attributes:
      populations: a :class:`RingBuffer` for each population that a delayed
        connection reads, by population name; other populations carry nothing.
      connections: each connection transform's carry, in the order of ``connect``:
        leaves ``(B, ...)``, or one env's slice of them in ``reset_state`` under ``vmap``.
    """

    populations: dict[str, RingBuffer]
    connections: list[CarrySlice]


class GraphExtras(TypedDict):
    """The ``rollout_extras`` of a :class:`PopulationGraph` call.

    Attributes:
      connections: what each connection's transform emitted (or is given back in
        replay), in the order of ``connect``; ``None`` where it emits nothing.
    """

    connections: list[Extras]


class GraphHistory(TypedDict):
    """What :meth:`PopulationGraph.update_statistics` receives: :class:`GraphExtras`
    stacked over a rollout, each transform's entry with leaves ``(T, B, *feat)``."""

    connections: list[HistoryTree]


class PopulationGraph(StatefulModule):
    """A :class:`~nnx_ppo.networks.types.StatefulModule` declared as a graph of populations.

    Build it in two phases. First declare populations with :meth:`add_population`,
    :meth:`add_input` (reads an observation entry) and :meth:`add_output` (writes an
    output entry), and wire them with :meth:`connect`. Then :meth:`finalize` checks
    the graph and fixes its evaluation order; only then can the graph be called,
    and it can no longer be changed.

    Input: a dict of observations; input population ``p`` reads ``x[p.input_from]``,
    ``(B, p.size)``, and other entries (batched too, as every input) are ignored.
    Output: a dict with one ``(B, p.size)`` entry per output population, under its
    ``output_to`` key.

    Carry: :class:`GraphCarry`; ``reset_state`` zeroes the ring buffers and resets
    every transform. ``rollout_extras`` and ``update_statistics``: :class:`GraphExtras`
    and :class:`GraphHistory`, each transform's entry routed to it. Regularization:
    the sum of the transforms', per sample. Metrics: each transform's under
    ``metrics["connections"][i]``, ``i`` its position in :attr:`connections`.

    Args:
      rngs: initialises the default :class:`~nnx_ppo.networks.feedforward.Dense`
        transform of each connection made without one; the graph lets go of it in
        :meth:`finalize`.

    Attributes:
      populations: the :class:`~nnx_ppo.networks.graph.Population` nodes, by name.
      connections: the :class:`~nnx_ppo.networks.graph.Connection` edges, in the
        order of ``connect``.
      declared: the population names in declaration order.
      evaluation_order: the population names in the order a call computes them,
        set by :meth:`finalize`; static structure.
      incoming: for each population of ``evaluation_order``, the positions in
        ``connections`` of the connections into it, set by :meth:`finalize`.
      finalized: whether :meth:`finalize` has run.

    Example::

        graph = PopulationGraph(nnx.Rngs(0))
        graph.add_input("sensory", 4, input_from="obs")
        graph.add_population("memory", 16, activation=jnp.tanh)
        graph.add_output("motor", 2)
        graph.connect("sensory", "memory")
        graph.connect("memory", "memory", delay=1)
        graph.connect("memory", "motor")
        graph.finalize()
        out = graph(graph.initialize_state(8), {"obs": jnp.zeros((8, 4))})
        out.output["motor"].shape  # (8, 2)
    """

    def __init__(self, rngs: nnx.Rngs) -> None:
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"PopulationGraph rngs must be an nnx.Rngs, got {type(rngs).__name__}")
        self.rngs = rngs
        self.populations: nnx.Dict = nnx.Dict()
        self.connections: nnx.List = nnx.List()
        # NNX re-sorts a Dict's keys in split/merge (so under jit): every order the graph
        # uses is static structure of its own.
        self.declared: tuple[str, ...] = nnx.static(())
        self.evaluation_order: tuple[str, ...] = nnx.static(())
        self.incoming: tuple[tuple[int, ...], ...] = nnx.static(())
        self.finalized: bool = nnx.static(False)

    # ------------------------------------------------------------------ building

    def add_population(
        self, name: str, size: int, *, activation: Callable[[Array], Array] | None = None
    ) -> None:
        """Declare a hidden population of ``size`` units.

        Args:
          name: unique among the graph's populations.
          size: the width of the population's output.
          activation: applied once to the sum of its inputs; ``None`` leaves it linear.

        Raises:
          ValueError: ``name`` is taken, or ``size`` is not positive.
          RuntimeError: the graph is already finalized.
        """
        self._add(name, size, activation, input_from=None, output_to=None)

    def add_input(
        self,
        name: str,
        size: int,
        *,
        input_from: str,
        activation: Callable[[Array], Array] | None = None,
    ) -> None:
        """Declare a population that adds the observation entry ``x[input_from]`` to its input.

        The entry must be ``(B, size)``. Connections into the population are summed
        with it, before the activation.

        Raises:
          ValueError: ``name`` is taken, or ``size`` is not positive.
          RuntimeError: the graph is already finalized.
        """
        self._add(name, size, activation, input_from=input_from, output_to=None)

    def add_output(
        self,
        name: str,
        size: int,
        *,
        output_to: str | None = None,
        activation: Callable[[Array], Array] | None = None,
    ) -> None:
        """Declare a population whose output appears in the graph's output as ``output_to``.

        Args:
          name: unique among the graph's populations.
          size: the width of the population's output.
          output_to: the output key; ``None`` uses ``name``.
          activation: applied once to the sum of its inputs; ``None`` leaves it linear.

        Raises:
          ValueError: ``name`` is taken, another output population already writes
            ``output_to``, ``output_to`` is empty, or ``size`` is not positive.
          RuntimeError: the graph is already finalized.
        """
        if output_to == "":
            raise ValueError(
                f"PopulationGraph: output_to of population {name!r} is empty; give an output "
                "key, or None for the population's name"
            )
        self._add(
            name,
            size,
            activation,
            input_from=None,
            output_to=name if output_to is None else output_to,
        )

    def _add(
        self,
        name: str,
        size: int,
        activation: Callable[[Array], Array] | None,
        input_from: str | None,
        output_to: str | None,
    ) -> None:
        self._require_building(f"add population {name!r}")
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"PopulationGraph: a population name must be a non-empty str, got {name!r}"
            )
        if name in self.declared:
            raise ValueError(
                f"PopulationGraph: duplicate population {name!r}; names must be unique"
            )
        require_int("PopulationGraph", f"size of population {name!r}", size)
        if activation is not None and not callable(activation):
            raise TypeError(
                f"PopulationGraph: activation of population {name!r} must be callable or None, "
                f"got {activation!r}"
            )
        if input_from is not None and not isinstance(input_from, str):
            raise TypeError(
                f"PopulationGraph: input_from of population {name!r} must be a str, "
                f"got {input_from!r}"
            )
        if output_to is not None:
            if not isinstance(output_to, str):
                raise TypeError(
                    f"PopulationGraph: output_to of population {name!r} must be a str, "
                    f"got {output_to!r}"
                )
            for other in self._declared_populations():
                if other.output_to == output_to:
                    raise ValueError(
                        f"PopulationGraph: duplicate output key {output_to!r}: populations "
                        f"{other.name!r} and {name!r} would both write it"
                    )
        self.populations[name] = Population(name, size, activation, input_from, output_to)
        self.declared = nnx.static((*self.declared, name))

    def connect(
        self,
        src: str,
        dst: str,
        *,
        transform: StatefulModule | None = None,
        delay: int = 0,
        reciprocal: bool = False,
    ) -> None:
        """Add a connection from population ``src`` to population ``dst``.

        Args:
          src: the source population, already declared.
          dst: the destination population, already declared (may be ``src``, with a
            delay of at least 1).
          transform: maps ``(B, src.size)`` to ``(B, dst.size)``; by default a new
            :class:`~nnx_ppo.networks.feedforward.Dense` ``(src.size, dst.size)``.
          delay: 0 reads the source's output of the same step; ``k >= 1`` the one
            from ``k`` steps earlier (zeros until the episode has run ``k`` steps).
          reciprocal: also connect ``dst`` to ``src`` with the same delay and a
            default transform of its own; ``transform`` must then be ``None``.

        Raises:
          ValueError: a population is unknown, ``delay`` is negative, or
            ``reciprocal`` is combined with a ``transform``.
          RuntimeError: the graph is already finalized.
        """
        where = f"PopulationGraph.connect({src!r}, {dst!r})"
        self._require_building(f"connect {src!r} -> {dst!r}")
        for role, name in (("source", src), ("destination", dst)):
            if name not in self.declared:
                raise ValueError(
                    f"{where}: unknown {role} population {name!r}; declared populations: "
                    f"{list(self.declared)}"
                )
        if reciprocal and transform is not None:
            raise ValueError(
                f"{where}: reciprocal=True makes a default transform each way; for a custom "
                "transform make two connect() calls"
            )
        edges = [self._connection(src, dst, transform, delay)]
        if reciprocal:
            edges.append(self._connection(dst, src, None, delay))
        for edge in edges:
            self.connections.append(edge)

    def _connection(
        self, src: str, dst: str, transform: StatefulModule | None, delay: int
    ) -> Connection:
        if transform is None:
            size_in, size_out = self.populations[src].size, self.populations[dst].size
            transform = Dense(size_in, size_out, self.rngs)
        return Connection(src, dst, transform, delay)

    def finalize(self) -> None:
        """Check the graph and fix its evaluation order; the graph can be called after.

        Sizes each population's ring buffer by its longest outgoing delay, and orders
        the populations so that each comes after the sources of its zero-delay
        connections (a topological order, ties in declaration order). The order is
        static structure: eager and compiled calls visit the populations alike.

        Raises:
          ValueError: the graph has no population or no output population, a
            population that receives nothing and reads no input, or one that feeds
            nothing and is no output, or its zero-delay connections form a cycle
            (named, e.g. ``a -> b -> a``).
          RuntimeError: the graph is already finalized.
        """
        self._require_building("finalize")
        if not self.declared:
            raise ValueError(
                "PopulationGraph.finalize: the graph has no populations; declare them with "
                "add_input, add_population and add_output"
            )
        if not any(pop.output_to is not None for pop in self._declared_populations()):
            raise ValueError(
                f"PopulationGraph.finalize: no output population among {list(self.declared)}; "
                "declare one with add_output"
            )
        edges: list[Connection] = list(self.connections)
        order = _evaluation_order(
            self.declared, [(edge.src, edge.dst) for edge in edges if edge.delay == 0]
        )
        for population in self._declared_populations():
            name = population.name
            if population.input_from is None and not any(e.dst == name for e in edges):
                raise ValueError(
                    f"PopulationGraph.finalize: population {name!r} receives no connection "
                    "and reads no input, so it never changes; connect a source to it or "
                    "remove it"
                )
            if population.output_to is None and not any(e.src == name for e in edges):
                raise ValueError(
                    f"PopulationGraph.finalize: population {name!r} feeds nothing and is no "
                    "output, so nothing reads it; connect it to a population or remove it"
                )
        read = _reaching_an_output(
            [pop.name for pop in self._declared_populations() if pop.output_to is not None],
            edges,
        )
        for name in self.declared:
            if name not in read:
                # Fed back to itself, or to others that reach no output: no loss reaches
                # its parameters.
                feeds = sorted({e.dst for e in edges if e.src == name})
                raise ValueError(
                    f"PopulationGraph.finalize: population {name!r} feeds only {feeds}, on no "
                    "path to an output, and is no output, so nothing reads it; connect it to "
                    "a population on a path to an output, or remove it"
                )
        for edge in edges:
            source = self.populations[edge.src]
            source.max_outgoing_delay = max(source.max_outgoing_delay, edge.delay)
        self.evaluation_order = nnx.static(order)
        self.incoming = nnx.static(
            tuple(tuple(i for i, edge in enumerate(edges) if edge.dst == name) for name in order)
        )
        # Every default transform exists now; the graph's state is its transforms' alone.
        del self.rngs
        self.finalized = nnx.static(True)

    def _require_building(self, action: str) -> None:
        if self.finalized:
            raise RuntimeError(f"PopulationGraph is finalized: cannot {action}")

    def _require_finalized(self, method: str) -> None:
        if not self.finalized:
            raise RuntimeError(
                f"PopulationGraph.{method}: the graph is not finalized; call finalize() "
                "after declaring its populations and connections"
            )

    def _declared_populations(self) -> Iterator[Population]:
        for name in self.declared:
            yield self.populations[name]

    def _delayed_sources(self) -> Iterator[Population]:
        """The populations a delayed connection reads, in evaluation order."""
        for name in self.evaluation_order:
            population = self.populations[name]
            if population.max_outgoing_delay > 0:
                yield population

    # ------------------------------------------------------------------ the contract

    def __call__(
        self,
        state: GraphCarry,
        x: Mapping[str, BatchedTree],
        rollout_extras: GraphExtras | None = None,
    ) -> StatefulModuleOutput:
        self._require_finalized("__call__")
        if not isinstance(x, Mapping):
            raise TypeError(
                f"PopulationGraph input must be a dict of observations, got a {type(x).__name__}"
            )
        self._require_carry("__call__", "state", state)
        if rollout_extras is not None:
            self._require_per_connection("__call__", "rollout_extras", rollout_extras)
        batch_size = _batch_size(x, state)
        outputs: dict[str, Array] = {}
        next_transforms: list[Carry] = list(state["connections"])
        emitted: list[Extras] = [None] * len(self.connections)
        metrics: dict[int, Any] = {}
        regularization: RegularizationLoss = jnp.zeros(())
        for name, incoming in zip(self.evaluation_order, self.incoming, strict=True):
            population = self.populations[name]
            total = jnp.zeros((batch_size, population.size))
            if population.input_from is not None:
                total = total + _observation(x, population.input_from, population, batch_size)
            for i in incoming:
                edge = self.connections[i]
                if edge.delay == 0:
                    source = outputs[edge.src]
                else:
                    source = _read(state["populations"][edge.src], edge.delay)
                extras = None if rollout_extras is None else rollout_extras["connections"][i]
                out = edge.transform(state["connections"][i], source, extras)
                _require_shape(
                    out.output,
                    (batch_size, population.size),
                    f"the transform of connection {edge.label} ({type(edge.transform).__name__})",
                    "return the destination's size,",
                )
                total = total + out.output
                next_transforms[i] = out.next_state
                emitted[i] = out.rollout_extras
                metrics[i] = out.metrics
                regularization = regularization + out.regularization_loss
            activation = population.activation
            outputs[name] = total if activation is None else activation(total)
            activation_name = getattr(activation, "__name__", type(activation).__name__)
            _require_shape(
                outputs[name],
                (batch_size, population.size),
                f"the activation of population {name!r} ({activation_name})",
                "keep the population's shape",
            )
        next_state = GraphCarry(
            populations={
                pop.name: _write(state["populations"][pop.name], outputs[pop.name])
                for pop in self._delayed_sources()
            },
            connections=next_transforms,
        )
        graph_output = {
            pop.output_to: outputs[pop.name]
            for pop in self._declared_populations()
            if pop.output_to is not None
        }
        return StatefulModuleOutput(
            next_state,
            graph_output,
            regularization,
            {"connections": metrics},
            GraphExtras(connections=emitted),
        )

    def initialize_state(self, batch_size: int) -> GraphCarry:
        self._require_finalized("initialize_state")
        return GraphCarry(
            populations={
                pop.name: RingBuffer(
                    buffer=jnp.zeros((batch_size, pop.max_outgoing_delay, pop.size)),
                    buffer_idx=jnp.zeros((batch_size,), jnp.int32),
                )
                for pop in self._delayed_sources()
            },
            connections=[edge.transform.initialize_state(batch_size) for edge in self.connections],
        )

    def reset_state(self, prev_state: GraphCarry) -> GraphCarry:
        self._require_finalized("reset_state")
        self._require_carry("reset_state", "prev_state", prev_state)
        return GraphCarry(
            populations={
                name: RingBuffer(
                    buffer=jnp.zeros_like(ring["buffer"]),
                    buffer_idx=jnp.zeros_like(ring["buffer_idx"]),
                )
                for name, ring in prev_state["populations"].items()
            },
            connections=[
                edge.transform.reset_state(carry)
                for edge, carry in zip(self.connections, prev_state["connections"], strict=True)
            ],
        )

    def update_statistics(self, rollout_extras: GraphHistory) -> None:
        self._require_per_connection("update_statistics", "rollout_extras", rollout_extras)
        for edge, history in zip(self.connections, rollout_extras["connections"], strict=True):
            edge.transform.update_statistics(history)

    def _require_carry(self, method: str, name: str, carry: Any) -> None:
        """``carry`` holds one entry per connection and a ring buffer for each population
        a delayed connection reads, no more: a carry of another graph failed in a
        ``KeyError`` or came back from ``reset_state`` with the other graph's buffers."""
        self._require_per_connection(method, name, carry)
        rings = [pop.name for pop in self._delayed_sources()]
        held = carry.get("populations")
        if not (isinstance(held, Mapping) and set(held) == set(rings)):
            raise _per_child_violation(
                self,
                method,
                f"{name}['populations']",
                f"a dict with a RingBuffer for each population a delayed connection reads: {rings}",
                held,
                entries="one ring buffer per population a delayed connection reads",
            )

    def _require_per_connection(self, method: str, name: str, value: Any) -> None:
        """``value`` (a carry, extras or history) holds a ``connections`` list with one
        entry per connection.

        Its length is static structure, read while JAX traces: the check costs nothing
        in the compiled program.
        """
        count = len(self.connections)
        if not (isinstance(value, Mapping) and "connections" in value):
            expected = f"a dict whose 'connections' list holds one entry per connection ({count})"
            raise _per_child_violation(self, method, name, expected, value)
        entries = value["connections"]
        if not (isinstance(entries, list | tuple) and len(entries) == count):
            expected = f"a list with one entry per connection ({count})"
            raise _per_child_violation(self, method, f"{name}['connections']", expected, entries)


def _reaching_an_output(outputs: list[str], edges: list[Connection]) -> set[str]:
    """The populations with a path of connections (any delay) to one of ``outputs``,
    the outputs included: those whose state some output reads."""
    reached, frontier = set(outputs), list(outputs)
    while frontier:
        name = frontier.pop()
        for edge in edges:
            if edge.dst == name and edge.src not in reached:
                reached.add(edge.src)
                frontier.append(edge.src)
    return reached


def _evaluation_order(names: tuple[str, ...], edges: list[tuple[str, str]]) -> tuple[str, ...]:
    """A topological order of ``names`` under zero-delay ``edges``: of the populations
    ready at each step (all their sources placed), the earliest declared comes next.

    Raises:
      ValueError: the edges form a cycle; the message spells one out.
    """
    successors: dict[str, list[str]] = {name: [] for name in names}
    waiting_on = dict.fromkeys(names, 0)
    for src, dst in edges:
        successors[src].append(dst)
        waiting_on[dst] += 1
    position = {name: i for i, name in enumerate(names)}
    # A heap by declaration index, not a FIFO queue: a population made ready late still
    # comes before a ready one declared after it.
    ready = [position[name] for name in names if waiting_on[name] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = names[heapq.heappop(ready)]
        order.append(name)
        for successor in successors[name]:
            waiting_on[successor] -= 1
            if waiting_on[successor] == 0:
                heapq.heappush(ready, position[successor])
    if len(order) < len(names):
        cycle = _find_cycle([name for name in names if name not in order], edges)
        raise ValueError(
            f"PopulationGraph.finalize: zero-delay cycle: {' -> '.join(cycle)}; every cycle "
            "needs a connection with delay >= 1"
        )
    return tuple(order)


def _find_cycle(unordered: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """A cycle through the populations a topological sort left over, as ``[a, b, ..., a]``.

    Each of them has a zero-delay predecessor among them, so walking predecessors from
    any of them must come back to one already visited.
    """
    remaining = set(unordered)
    walk = [unordered[0]]
    while True:
        predecessor = next(src for src, dst in edges if dst == walk[-1] and src in remaining)
        if predecessor in walk:
            start = walk.index(predecessor)
            return [predecessor, *reversed(walk[start + 1 :]), predecessor]
        walk.append(predecessor)


def _batch_size(x: Mapping[str, BatchedTree], state: GraphCarry) -> int:
    leaves = jax.tree.leaves((x, state))
    if not leaves:
        raise ValueError(
            "PopulationGraph: neither the input nor the carry holds an array, so the batch "
            "size is unknown; give the graph an input population"
        )
    return int(leaves[0].shape[0])


def _observation(
    x: Mapping[str, BatchedTree], key: str, population: Population, batch_size: int
) -> Float[Array, "B size"]:
    if key not in x:
        raise ValueError(
            f"PopulationGraph: input population {population.name!r} reads x[{key!r}], but "
            f"the input has keys {sorted(x)}"
        )
    entry = x[key]
    shape = getattr(entry, "shape", None)
    if shape is None or tuple(shape) != (batch_size, population.size):
        found = f"shape {tuple(shape)}" if shape is not None else f"a {type(entry).__name__}"
        raise ValueError(
            f"PopulationGraph: input population {population.name!r} reads x[{key!r}] as "
            f"(B={batch_size}, {population.size}), found {found}"
        )
    return entry


def _require_shape(value: Any, expected: tuple[int, int], what: str, must: str) -> None:
    """Refuse ``value`` (a transform's or an activation's result, named by ``what``)
    unless it is ``(B, size)``: ``must`` says what it must be, in words."""
    shape = getattr(value, "shape", None)
    if shape is None or tuple(shape) != expected:
        found = f"shape {tuple(shape)}" if shape is not None else f"a {type(value).__name__}"
        raise ValueError(
            f"PopulationGraph: {what} must {must} (B={expected[0]}, {expected[1]}); found {found}"
        )


def _read(ring: RingBuffer, delay: int) -> Float[Array, "B size"]:
    """Each env's output from ``delay`` steps earlier."""
    slots = (ring["buffer_idx"] - delay) % ring["buffer"].shape[1]
    return ring["buffer"][jnp.arange(slots.shape[0]), slots]


def _write(ring: RingBuffer, output: Float[Array, "B size"]) -> RingBuffer:
    """``ring`` with ``output`` stored as the newest entry."""
    rows = jnp.arange(output.shape[0])
    buffer = jnp.asarray(ring["buffer"])  # a carry may come back from the host as NumPy's
    return RingBuffer(
        buffer=buffer.at[rows, ring["buffer_idx"]].set(output.astype(buffer.dtype)),
        buffer_idx=(ring["buffer_idx"] + 1) % buffer.shape[1],
    )
