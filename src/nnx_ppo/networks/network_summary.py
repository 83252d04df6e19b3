"""A table of a network's contract modules: shapes, carry, extras, parameters, statistics.

:func:`~nnx_ppo.summary` runs one step of a network abstractly, with :func:`flax.nnx.eval_shape`:
no floating-point work is done and no activation is allocated, so it costs the same
for any network size. It builds a batch from one unbatched example input,
initialises the carry, calls the network, and folds the emitted ``rollout_extras``,
stacked over time, into ``update_statistics``. Every checked contract-method call
is watched with :func:`nnx_ppo.contract.checking.observe_calls`, so the table shows
what each module really received and returned in that call, with the batch axis
written ``B`` and the time axis of a history written ``T``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, PyTree, Shaped
from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from nnx_ppo.contract.axes import BatchedTree
from nnx_ppo.contract.checking import (
    CallRecord,
    batched_example_hint,
    checks,
    format_graph_path,
    format_shape,
    is_stats_bearing,
    observe_calls,
)
from nnx_ppo.contract.errors import ContractError
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, require_stateful_module

__all__ = ["LeafShape", "ModuleRow", "NetworkSummary", "print_summary", "summary"]

_BATCH = 37
"""The batch size of the abstract call: a prime no feature size is likely to equal."""

_TIME = 29
"""The length of the abstract rollout history given to ``update_statistics``."""

_OUTSIDE_THE_GRAPH = "(not in the network's graph)"
"""The path of a module called in the step that ``nnx.iter_graph(network)`` does not reach."""


_PLAIN_WIDTH = 160
"""The columns a summary takes off a terminal (``str``, a log file, CI)."""

_FOLDED = 8 + 2
"""The width of a folded column: room for a shape such as ``(B, 16)``, padded by two."""

_ROOMY = 12 + 2
"""The width of a column that holds a shape and its dtype, ``(B, 16) int32``, padded."""

_TABLE_WIDTH = 7 * _FOLDED
"""The narrowest console a summary is a table on, its seven columns folded; on a
narrower one each row is a block of lines."""


@dataclass(frozen=True)
class LeafShape:
    """The shape and dtype of one array leaf, its contract axes named.

    Attributes:
      key: the leaf's path in its pytree, as :func:`jax.tree_util.keystr` writes it
        (``"['agent_0']"``, ``".actions"``); ``""`` when the tree is one array.
      shape: the shape, its leading contract axes written ``"B"`` (and ``"T"`` in a
        history) in place of their sizes, e.g. ``("B", 4)`` or ``("T", "B", 4)``.
      dtype: the dtype's name, e.g. ``"float32"``.
    """

    key: str
    shape: tuple[int | str, ...]
    dtype: str

    def __str__(self) -> str:
        text = format_shape(self.shape)
        if self.dtype != "float32":
            text += f" {self.dtype}"
        return f"{self.key} {text}" if self.key else text


def _leaf_shapes(tree: Any, axes: tuple[tuple[str, int], ...]) -> tuple[LeafShape, ...]:
    """The :class:`LeafShape` of every leaf of ``tree``, by key.

    Args:
      tree: a pytree of arrays (concrete, traced or ``jax.ShapeDtypeStruct``).
      axes: the leading axes to name, as (name, size) pairs: ``(("B", 8),)`` for a
        call's leaves, ``(("T", 5), ("B", 8))`` for a history. A leading dimension
        is named only where its size is the bound one, so a leaf that breaks the
        contract shows its sizes as found.
    """
    shapes = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape: list[int | str] = [int(d) for d in getattr(leaf, "shape", ())]
        for position, (name, size) in enumerate(axes):
            if position < len(shape) and shape[position] == size:
                shape[position] = name
        dtype = getattr(leaf, "dtype", None)
        dtype_name = str(dtype) if dtype is not None else type(leaf).__name__
        shapes.append(LeafShape(jax.tree_util.keystr(path), tuple(shape), dtype_name))
    return tuple(shapes)


@dataclass(frozen=True)
class ModuleRow:
    """One contract module of a :class:`NetworkSummary`, as its call in the abstract step saw it.

    Attributes:
      path: where the module sits in the network, as Python would write it
        (``".layers[1].components['action']"``); ``""`` for the network itself, and
        ``"(not in the network's graph)"`` for a module the network does not hold in
        an NNX-tracked attribute. A module held at several paths is named in each of
        its rows by its first path below the enclosing row's that no earlier row took
        (``Sequential([dense, dense])`` shows ``.layers[0]`` and ``.layers[1]``).
      depth: how many contract modules' calls enclose this one (0 for the network).
      module_class: the module's class name.
      input: the leaves of the ``x`` its ``__call__`` was given; ``None`` when the
        step failed in ``initialize_state``, before any ``__call__``: the rows are then
        the modules asked for a carry.
      output: the leaves of the ``output`` it returned; ``None`` when the call did
        not return.
      carry: the leaves of its carry ``state`` (what its ``initialize_state`` returned,
        when the step failed there); empty for a module that carries nothing.
      extras: the leaves of the ``rollout_extras`` it emitted; empty when it emitted
        ``None``, ``None`` when the call did not return.
      parameters: the number of ``nnx.Param`` elements in the module, its children's
        included.
      shared: whether an earlier row is the same module object (one module placed at
        two paths, e.g. ``Sequential([dense, dense])``, or called twice in the step).
        Its parameters are those of the earlier row: the table shows ``shared`` in
        place of the count, and :attr:`NetworkSummary.parameters` counts them once.
      keeps_statistics: whether the module keeps running statistics (it defines
        ``update_statistics`` and holds no contract module), see
        :func:`nnx_ppo.contract.checking.is_stats_bearing`.
      history: the leaves of the ``(T, B, *feat)`` history its ``update_statistics``
        received; ``None`` when it was not called with one.
      error: the :class:`~nnx_ppo.ContractError` this module's own checks raised, in
        any of its contract methods; ``None`` otherwise (also for a container whose
        child raised).
    """

    path: str
    depth: int
    module_class: str
    input: tuple[LeafShape, ...] | None
    output: tuple[LeafShape, ...] | None
    carry: tuple[LeafShape, ...]
    extras: tuple[LeafShape, ...] | None
    parameters: int
    shared: bool
    keeps_statistics: bool
    history: tuple[LeafShape, ...] | None
    error: ContractError | None


@dataclass(frozen=True)
class NetworkSummary:
    """What :func:`~nnx_ppo.summary` returns: one row per contract-module call, outermost first.

    Print it (``print(s)``, or ``rich.print(s)`` for colour) to see the table: one
    line per module, indented under the container that called it and named by its
    path below that container's; leaves of pytrees by key, one per line. A
    contract violation found in the abstract step is not raised: the table stops at
    the module that broke the contract, that row's name is marked ``✗``, and the error's
    message follows the table.

    Attributes:
      network_class: the class name of the summarised network.
      rows: the modules in call order, each after the container that called it.
      parameters: the number of ``nnx.Param`` elements in the whole network.
      error: the :class:`~nnx_ppo.ContractError` the abstract step raised, or ``None``.
        ``raise summary.error`` turns the summary back into the failure.
    """

    network_class: str
    rows: tuple[ModuleRow, ...]
    parameters: int
    error: ContractError | None

    def table(self, width: int | None = None) -> Table:
        """The rows as a :class:`rich.table.Table`, for a console ``width`` columns wide
        (``None``: wide enough for every module name).

        Its columns: the module (its name, see above, and class), ``input``,
        ``output``, ``carry``, ``extras``, ``params``, and ``statistics``: for a module
        that keeps running statistics, the history its ``update_statistics`` received
        (``yes`` when the step ended before it, ``frozen`` when the step gave it none,
        as under :class:`~nnx_ppo.networks.containers.FrozenStatistics`), blank for the
        others. ``-`` marks what
        a call did not return.
        """
        table = Table(
            title=f"{self.network_class}: {self.parameters:,} parameters",
            box=box.SIMPLE_HEAD,
            show_edge=False,
        )
        # On a narrow console every cell folds, the widest columns first: nothing is cut
        # off. The module names stay whole where that leaves the other six columns room
        # for a shape and its dtype; else they fold too (kept whole, deep paths left the
        # other columns a letter a line, or no room at all). A console narrower than
        # _TABLE_WIDTH is shown blocks instead, by __rich_console__.
        whole = width is None or width >= self._module_width() + 6 * _ROOMY
        table.add_column("module", overflow="fold", no_wrap=whole)
        for column in ("input", "output", "carry", "extras"):
            table.add_column(column, overflow="fold")
        table.add_column("params", justify="right", overflow="fold")
        table.add_column("statistics", overflow="fold")
        for module, cells in self._cells():
            table.add_row(module, *cells.values())
        return table

    def _module_width(self) -> int:
        """The module column's width, names whole and padded."""
        return max(module.cell_len for module, _ in self._cells()) + 2

    def _cells(self) -> Iterator[tuple[Text, dict[str, str]]]:
        """Each row's module cell, and its other cells by column."""
        for row, label in zip(self.rows, self._labels(), strict=True):
            statistics = ""
            if row.keeps_statistics and row.history is not None:
                statistics = _cell(row.history)
            elif row.keeps_statistics:  # FrozenStatistics passes no history on
                statistics = "yes" if self.error is not None else "frozen"
            module = Text(f"{label} ({row.module_class})").append(
                " ✗" if row.error is not None else "", style="bold red"
            )
            yield (
                module,
                {
                    "input": _cell(row.input),
                    "output": _cell(row.output),
                    "carry": _cell(row.carry),
                    "extras": _cell(row.extras),
                    "params": "shared" if row.shared else f"{row.parameters:,}",
                    "statistics": statistics,
                },
            )

    def _blocks(self) -> Iterator[Text]:
        """The rows as blocks of ``column: cell`` lines, for a console too narrow for the
        table's columns."""
        yield Text(f"{self.network_class}: {self.parameters:,} parameters", style="italic")
        for module, cells in self._cells():
            block = Text("\n").append(module.copy())
            for column, cell in cells.items():
                if cell:
                    indent = "\n" + " " * (len(column) + 6)
                    block.append(f"\n    {column}: {cell.replace(chr(10), indent)}")
            yield block

    def _labels(self) -> list[str]:
        """Each row's name: its path below the enclosing row's, indented by its depth.

        The network itself is ``(network)``."""
        labels, enclosing = [], []  # enclosing: the paths of the rows around this one
        for row in self.rows:
            del enclosing[row.depth :]
            parent = enclosing[-1] if enclosing else ""
            enclosing.append(row.path)
            name = row.path.removeprefix(parent) if row.path.startswith(parent) else row.path
            labels.append("  " * row.depth + (name or "(network)"))
        return labels

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        del console
        if options.max_width < _TABLE_WIDTH:
            yield from self._blocks()
        else:
            yield self.table(options.max_width)
        if self.error is not None:
            # One Text: the message's first line, printed after another Text's end="",
            # was cut at the console's width instead of wrapped.
            yield Text.assemble((_VIOLATION, "bold red"), _error_text(self.error))

    def __str__(self) -> str:
        """The table as plain text, 160 columns wide at most, and the error's message unwrapped."""
        buffer = io.StringIO()
        Console(file=buffer, width=_PLAIN_WIDTH, color_system=None).print(self.table(_PLAIN_WIDTH))
        lines = [line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines()]
        if self.error is not None:
            lines.append(_VIOLATION + _error_text(self.error))
        return "\n".join(lines)


def _error_text(error: ContractError) -> str:
    """The error's message and its notes (the example-input hint), as a traceback shows them."""
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


_VIOLATION = "contract violation: "


def _cell(shapes: tuple[LeafShape, ...] | None) -> str:
    if shapes is None:
        return "-"
    return "\n".join(str(shape) for shape in shapes)


def summary(
    network: StatefulModule, example_input: PyTree[Shaped[Array, "..."] | jax.ShapeDtypeStruct]
) -> NetworkSummary:
    """Summarise ``network``: each contract module's shapes, parameters and statistics.

    One step is evaluated abstractly (see the module docstring): ``network`` is
    neither run nor changed. The contract checks are turned on for the step, so a
    violation is found as training would find it.

    Args:
      network: any contract module, e.g. from
        :func:`~nnx_ppo.networks.factories.make_default_network`.
      example_input: ONE sample, unbatched: an array or a pytree of arrays, e.g.
        ``jnp.zeros(4)``, an env's ``reset(key).obs``, or the same as
        ``jax.ShapeDtypeStruct`` leaves. The summary adds the batch axis itself.

    Returns:
      A :class:`~nnx_ppo.networks.network_summary.NetworkSummary`. A
      :class:`~nnx_ppo.ContractError` raised in the step is not raised here: it is
      the summary's ``error``, and its rows stop there.

    Raises:
      Exception: any other exception the step raises, unchanged (e.g. a matrix-size
        mismatch in a module without annotations; ``Dense`` reports an input of the
        wrong width as a ``ContractError``), with a note where ``example_input``
        looks like a batch.

    Example::

        print(nnx_ppo.summary(network, jnp.zeros(4)))
    """
    require_stateful_module("summary: the network", network)
    batch = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct((_BATCH, *jnp.shape(leaf)), jnp.result_type(leaf)),
        example_input,
    )
    traced: list[_Traced] = []
    hint = batched_example_hint(example_input, "summary")
    try:
        nnx.eval_shape(lambda net, x: traced.append(_trace_step(net, x)), network, batch)
    except Exception as error:
        if hint is not None:
            error.add_note(hint)
        raise
    (step,) = traced
    if step.error is not None and hint is not None:
        step.error.add_note(hint)
    return NetworkSummary(type(network).__name__, step.rows, _parameter_count(network), step.error)


def print_summary(
    network: StatefulModule,
    example_input: PyTree[Shaped[Array, "..."] | jax.ShapeDtypeStruct],
    console: Console | None = None,
) -> NetworkSummary:
    """:func:`~nnx_ppo.summary` of ``network``, printed to ``console`` (default: a new one),
    returned."""
    result = summary(network, example_input)
    console = console or Console()
    if console.is_terminal:
        console.print(result)
        return result
    # Off a terminal (a log file, CI) nothing limits the width: do not fold the paths.
    # (print(width=...) cannot widen: rich caps it at the console's own width.)
    width = console.width
    console.width = max(width, _PLAIN_WIDTH)
    try:
        console.print(result)
    finally:
        console.width = width
    return result


@dataclass(frozen=True)
class _Traced:
    """What the abstract step found: its rows, and the contract violation it ended on."""

    rows: tuple[ModuleRow, ...]
    error: ContractError | None


@dataclass
class _Call:
    """A call record and the records of the checked calls it made, in order."""

    record: CallRecord
    children: list[_Call]

    def preorder(self, depth: int) -> Iterator[tuple[CallRecord, int, list[CallRecord]]]:
        """This call at ``depth`` with the records merged into it, then the calls below it
        one level deeper."""
        merged: list[CallRecord] = []
        below = self._calls_below(merged)
        yield self.record, depth, merged
        for child in below:
            yield from child.preorder(depth + 1)

    def _calls_below(self, merged: list[CallRecord]) -> list[_Call]:
        """The children, a subclass's call of its parent's method (``super()``) merged into
        this call (its record added to ``merged``): one call of the module, one row."""
        below = []
        for child in self.children:
            if (
                child.record.module is self.record.module
                and child.record.method == self.record.method
            ):
                merged.append(child.record)
                below += child._calls_below(merged)
            else:
                below.append(child)
        return below


def _trace_step(network: StatefulModule, x: BatchedTree) -> _Traced:
    """Inside the abstract evaluation: one step of ``network`` on ``x``, its calls tabulated."""
    records: list[CallRecord] = []
    error: ContractError | None = None
    with checks(True), observe_calls(records.append):
        try:
            state = network.initialize_state(_BATCH)
            result: StatefulModuleOutput = network(state, x)
            network.update_statistics(
                jax.tree.map(
                    lambda leaf: jnp.broadcast_to(leaf, (_TIME, *leaf.shape)),
                    result.rollout_extras,
                )
            )
        except ContractError as raised:
            error = raised
    # A module called inside a transform of its container's method (nnx.vmap, a scan)
    # is the transform's copy, on a slice: its container's row holds it.
    records = [r for r in records if not r.in_transform]
    paths = _paths_by_module(network)
    calls = [r for r in records if r.method == "__call__"] or [
        r for r in records if r.method == "initialize_state"
    ]
    histories = {
        id(r.module): r.arguments[0][1] for r in records if r.method == "update_statistics"
    }
    # The checks that raised: the innermost record holding the error; its enclosing
    # calls hold the same error object, passed through.
    failed = None if error is None else next(r for r in records if r.error is error)
    batch = (("B", _BATCH),)
    rows = []
    taken: set[tuple[Any, ...]] = set()
    row_modules: list[StatefulModule] = []
    enclosing: list[tuple[Any, ...]] = []
    for record, depth, merged in _preorder(calls):
        module = record.module
        del enclosing[depth:]
        path = _row_path(paths.get(id(module), []), enclosing[-1] if enclosing else (), taken)
        enclosing.append(() if path is None else path)
        shared = any(row_module is module for row_module in row_modules)
        row_modules.append(module)
        returned = record.result if isinstance(record.result, StatefulModuleOutput) else None
        called = record.method == "__call__"
        carry = record.arguments[0][1] if called else record.result
        history = histories.get(id(module))
        rows.append(
            ModuleRow(
                path=_OUTSIDE_THE_GRAPH if path is None else format_graph_path(network, path),
                depth=depth,
                module_class=type(module).__name__,
                input=_leaf_shapes(record.arguments[1][1], batch) if called else None,
                output=_leaf_shapes(returned.output, batch) if returned else None,
                carry=_leaf_shapes(carry, batch),
                extras=_leaf_shapes(returned.rollout_extras, batch) if returned else None,
                parameters=_parameter_count(module),
                shared=shared,
                keeps_statistics=is_stats_bearing(module),
                history=None if history is None else _leaf_shapes(history, (("T", _TIME), *batch)),
                error=error
                if failed is not None and any(_raised_in(failed, r) for r in (record, *merged))
                else None,
            )
        )
    return _Traced(tuple(rows), error)


def _paths_by_module(network: StatefulModule) -> dict[int, list[tuple[Any, ...]]]:
    """Every path of every graph node below ``network``, by the node's ``id``, in graph order.

    Unlike ``nnx.iter_graph``, which reaches a shared node once, this lists each
    place it is held (a cycle is not followed)."""
    paths: dict[int, list[tuple[Any, ...]]] = {}

    def visit(node: Any, path: tuple[Any, ...], ancestors: frozenset[int]) -> None:
        paths.setdefault(id(node), []).append(path)
        for key, child in nnx.iter_children(node):
            if not isinstance(child, nnx.Variable) and id(child) not in ancestors:
                visit(child, (*path, key), ancestors | {id(child)})

    visit(network, (), frozenset({id(network)}))
    return paths


def _row_path(
    candidates: list[tuple[Any, ...]], enclosing: tuple[Any, ...], taken: set[tuple[Any, ...]]
) -> tuple[Any, ...] | None:
    """The path a row names its module by: the first of ``candidates`` below ``enclosing`` (the
    enclosing row's path) that no earlier row took; else the first below it; else the first."""
    below = [path for path in candidates if path[: len(enclosing)] == enclosing] or candidates
    path = next((path for path in below if path not in taken), below[0] if below else None)
    if path is not None:
        taken.add(path)
    return path


def _parameter_count(module: StatefulModule) -> int:
    return sum(int(jnp.size(leaf)) for leaf in jax.tree.leaves(nnx.state(module, nnx.Param)))


def _raised_in(failed: CallRecord, record: CallRecord) -> bool:
    """Whether ``failed`` (the call that raised) belongs to the row of ``record``: the same call,
    or another method of the same module (``update_statistics`` after its ``__call__``)."""
    return failed is record or (failed.method != record.method and failed.module is record.module)


def _preorder(records: list[CallRecord]) -> list[tuple[CallRecord, int, list[CallRecord]]]:
    """``records`` (innermost first, as observed) reordered outermost first, in call order,
    each with its depth below the outermost call (which ends last)."""
    pending: dict[int, list[_Call]] = {}
    for record in records:
        children = pending.pop(record.depth + 1, [])
        pending.setdefault(record.depth, []).append(_Call(record, children))
    outermost = records[-1].depth
    return [
        row
        for depth in sorted(pending)
        for call in pending[depth]
        for row in call.preorder(depth - outermost)
    ]
