"""Activation recording: every contract module's ``output``, keyed by its path in the network.

Recording is for evaluation and analysis. The trained network is never changed:
:func:`with_recording` returns a :class:`Recorder`, a thin contract module that
holds the network (sharing its parameters) and, in its ``__call__``, watches the
network's checked calls with :func:`nnx_ppo.contract.checking.observe_calls`. Each
contract module's ``output`` of that call is collected under the module's path in
the network, as Python would write it (``""`` for the network itself,
``".layers[0]"``, ``".components['action']"``), and the collection is returned in
the call's ``metrics`` under :data:`~nnx_ppo.networks.types.ACTIVATION_KEY` (the
network's own metrics under ``"network"``), where :func:`extract_activations`
finds it.

The activations are the call's own traced values, so a recorder works under
``jit`` and ``scan``: returned from a scan body they stack to ``(T, B, *feat)``
(:func:`~nnx_ppo.algorithms.recording.record_activations_rollout` does this over an
evaluation episode).

Example::

    recorder = with_recording(network)
    out = recorder(network.initialize_state(8), obs)
    activations = extract_activations(out.metrics)  # {"": ..., ".layers[0]": ...}
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from flax import nnx

from nnx_ppo.contract.axes import BatchedTree, Carry, CarrySlice, Extras, HistoryTree
from nnx_ppo.contract.checking import CallRecord, checks, format_graph_path, observe_calls
from nnx_ppo.networks.types import (
    ACTIVATION_KEY,
    StatefulModule,
    StatefulModuleOutput,
    require_stateful_module,
)

__all__ = ["ACTIVATION_KEY", "Recorder", "extract_activations", "with_recording"]


class Recorder(StatefulModule):
    """A network, run unchanged, whose every contract module's ``output`` is recorded.

    ``initialize_state``, ``reset_state`` and ``update_statistics`` are the
    network's own; ``__call__`` returns the network's ``StatefulModuleOutput`` with
    its ``metrics`` nested under ``"network"`` and, beside them under
    :data:`~nnx_ppo.networks.types.ACTIVATION_KEY`, a dict from each contract module's
    path in the network (see the module docstring) to the ``output`` of its ``__call__``, leaves
    ``(B, *feat)``. (Nesting keeps the keys of one dict all strings: a
    ``Sequential``'s metrics are keyed by layer index.) The contract checks are
    turned on inside the call, since the recording reads them; they cost nothing
    once traced.

    Attributes:
      wrapped: the recorded network (0.3.0's name); its parameters are shared, not copied.

    Raises:
      ValueError: from ``__call__``, when a module is called more than once in one
        step (a module shared between two places), or was not reached from the
        network's NNX graph: its activation has no path of its own to be keyed by.
    """

    def __init__(self, wrapped: StatefulModule) -> None:
        require_stateful_module("the network a Recorder records", wrapped)
        self.wrapped = wrapped

    def __call__(
        self, state: Carry, x: BatchedTree, rollout_extras: Extras = None
    ) -> StatefulModuleOutput:
        records: list[CallRecord] = []
        with checks(True), observe_calls(records.append):
            out: StatefulModuleOutput = self.wrapped(state, x, rollout_extras)
        activations = _activations_by_path(self.wrapped, records)
        return out.replace(metrics={"network": out.metrics, ACTIVATION_KEY: activations})

    def initialize_state(self, batch_size: int) -> Carry:
        return self.wrapped.initialize_state(batch_size)

    def reset_state(self, prev_state: CarrySlice) -> CarrySlice:
        return self.wrapped.reset_state(prev_state)

    def update_statistics(self, rollout_extras: HistoryTree) -> None:
        self.wrapped.update_statistics(rollout_extras)


def _activations_by_path(network: StatefulModule, records: list[CallRecord]) -> dict[str, Any]:
    """The ``output`` of every ``__call__`` in ``records``, by its module's path in ``network``."""
    paths = {id(node): tuple(path) for path, node in nnx.iter_graph(network)}
    activations: dict[str, Any] = {}
    for record in records:
        # Inside a transform of its container (a scan, nnx.vmap) a module's output is
        # the transform's tracer, which cannot leave it: the container's is recorded.
        if record.method != "__call__" or record.in_transform:
            continue
        path = paths.get(id(record.module))
        if path is None:
            raise ValueError(
                f"Recorder: a {type(record.module).__name__} was called in the step of "
                f"{type(network).__name__} but is not in its NNX graph (held in an attribute "
                "NNX does not track?), so its activation has no path to be recorded under"
            )
        name = format_graph_path(network, path)
        if name in activations:
            raise ValueError(
                f"Recorder: the module at {name or '(network)'} "
                f"({type(record.module).__name__}) was called more than once in one step; "
                "activations are recorded one per module path"
            )
        activations[name] = record.result.output
    return activations


def with_recording(net: StatefulModule) -> Recorder:
    """A :class:`Recorder` of ``net`` (0.3.0's parameter name); ``net`` itself is left as it is.

    A network that already is a :class:`Recorder` is returned unchanged, with a
    warning (recording it twice would nest the activations).
    """
    if isinstance(net, Recorder):
        warnings.warn(
            "with_recording: the network already is a Recorder; it is returned unchanged",
            stacklevel=2,
        )
        return net
    return Recorder(net)


def extract_activations(metrics: Mapping[Any, Any]) -> Any:
    """The activations a :class:`Recorder` put in ``metrics``; ``None`` when there are none.

    For a recorder's own ``metrics`` this is its dict by module path. A recorder
    nested inside a container has its metrics nested under the container's keys;
    the result then keeps those keys down to each recorder's activations, dropping
    every branch that holds none.
    """
    if ACTIVATION_KEY in metrics:
        return metrics[ACTIVATION_KEY]
    found = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            inner = extract_activations(value)
            if inner is not None:
                found[key] = inner
    return found or None
