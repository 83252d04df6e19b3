"""Data-parallel training over devices and hosts, with JAX's own SPMD machinery.

A run spreads over a one-axis :class:`jax.sharding.Mesh` whose axis is
:data:`DATA_AXIS`. Every per-env array (env states, the network's carries, the
episodes in progress) is split along its env axis over that mesh; parameters,
optimizer state and the training key are replicated. A mesh of more axes, one of
them :data:`DATA_AXIS`, splits the envs along that one and replicates everything
over the others. The compiled PPO step is
the same program as on one device: ``jax.jit`` partitions it (GSPMD), so every
mean over the batch (the loss and so the gradient, ``Normalizer`` statistics,
advantage standardisation, metrics, evaluation) is over the **global** batch,
and a module's contract checks see the global ``B``.

Which leaves are per-env is read from their shape: a leaf whose leading axis
(the env axis) has ``n_envs`` entries is split; any other leaf (a model-wide
simulator field) is replicated, and so is every leaf of a ``Shared`` node, whatever
its shape (a table of ``n_envs`` rows too).

Several hosts: call :func:`jax.distributed.initialize` in each process before
anything else; :func:`data_mesh` then spans every process's devices, and each
process holds the envs of its own devices.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from nnx_ppo.algorithms import rollout
from nnx_ppo.algorithms.types import TrainingState
from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.checking import is_key, key_data_or_leaf
from nnx_ppo.envs.state import _is_shared

if TYPE_CHECKING:  # rollout imports this module: its names are not all bound yet
    from nnx_ppo.algorithms.rollout import Tree

__all__ = [
    "DATA_AXIS",
    "RUNS_AXIS",
    "constrain_envs",
    "constrain_replicated",
    "data_mesh",
    "mesh_of",
    "require_divisible",
    "resolve_mesh",
    "runs_mesh",
    "shard_training_state",
    "training_mesh",
]

DATA_AXIS = "data"
"""The name of the mesh axis that envs are split over."""

RUNS_AXIS = "runs"
"""The name of the mesh axis :func:`~nnx_ppo.algorithms.ppo.train_ppo_runs` splits runs over."""


def data_mesh(devices: int | Sequence[Any] | None = None) -> Mesh:
    """A one-axis mesh (axis :data:`DATA_AXIS`) over ``devices``.

    Args:
      devices: ``None`` for every device of every process (``jax.devices()``),
        an int ``N`` for the first ``N`` of them, or a sequence of ``jax.Device``.

    Raises:
      ValueError: more devices are asked for than there are, none, or one device
        more than once.
      TypeError: the sequence holds something other than ``jax.Device``.
    """
    available = jax.devices()
    if devices is None:
        chosen = list(available)
    elif isinstance(devices, int | np.integer):  # a bool too, which require_int refuses
        count = require_int("data_mesh", "devices", devices)
        if count > len(available):
            raise ValueError(
                f"data_mesh: {count} devices asked for, but JAX sees {len(available)} "
                f"({jax.default_backend()}); on CPU, XLA_FLAGS="
                f"--xla_force_host_platform_device_count={count} makes that many"
            )
        chosen = list(available[:count])
    else:
        chosen = list(devices)
        if not chosen:
            raise ValueError("data_mesh: devices is an empty sequence")
        strangers = [device for device in chosen if not isinstance(device, jax.Device)]
        if strangers:
            raise TypeError(
                f"data_mesh: devices must be an int or a sequence of jax.Device, but it holds "
                f"{strangers[0]!r} ({type(strangers[0]).__name__}); for the first N devices, "
                "pass the int N"
            )
        repeated = sorted({str(device) for device in chosen if chosen.count(device) > 1})
        if repeated:
            raise ValueError(
                f"data_mesh: devices names {', '.join(repeated)} more than once: each device "
                "of the mesh holds its own slice of the envs"
            )
    owners = {device.process_index for device in chosen}
    if len(owners) < jax.process_count():
        raise ValueError(
            f"data_mesh: the {len(chosen)} devices chosen belong to process(es) "
            f"{sorted(owners)} only, but {jax.process_count()} processes train together and "
            "each must own a device of the mesh: use every device (devices=None; on the "
            "command line, leave out --devices)"
        )
    return Mesh(np.array(chosen), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def resolve_mesh(devices: int | None) -> Mesh | None:
    """The mesh of ``TrainConfig.devices``: ``None`` (one device, no mesh) or a data mesh.

    ``devices=None`` takes every device when there is more than one.
    """
    if devices is None:
        return data_mesh() if jax.device_count() > 1 else None
    return data_mesh(devices)


def runs_mesh(devices: int | None, n_runs: int) -> Mesh | None:
    """The mesh ``train_ppo_runs`` splits ``n_runs`` stacked runs over, or ``None`` (one device).

    Each device trains ``n_runs / devices`` whole runs, so no run's data crosses
    devices. ``devices=None`` takes as many of this process's devices as divide
    the runs evenly: every device when they do. On a CPU host,
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before JAX starts
    makes ``N`` devices, each run by a thread of its own, so the runs' programs
    use ``N`` cores.

    Raises:
      ValueError: more devices are asked for than this process has, or the runs
        do not split evenly over the devices asked for.
    """
    require_int("runs_mesh", "n_runs", n_runs)
    local = jax.local_devices()
    if devices is None:
        count = max(d for d in range(1, len(local) + 1) if n_runs % d == 0)
    else:
        count = require_int("runs_mesh", "devices", devices)
    if count > len(local):
        raise ValueError(
            f"train_ppo_runs: {count} devices asked for, but this process sees {len(local)} "
            f"({jax.default_backend()}); on CPU, XLA_FLAGS="
            f"--xla_force_host_platform_device_count={count} makes that many"
        )
    if count == 1:
        return None
    if n_runs % count:
        raise ValueError(
            f"train_ppo_runs: {n_runs} run{'s do' if n_runs > 1 else ' does'} not split "
            f"evenly over {count} devices; give a "
            f"multiple of {count} runs, or set config.devices to a number of devices that "
            f"divides {n_runs} (1 trains every run on one device)"
        )
    return Mesh(np.array(local[:count]), (RUNS_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def require_divisible(
    owner: str, mesh: Mesh | None, n_envs: int, n_minibatches: int, eval_n_envs: int | None
) -> None:
    """Refuse, before anything compiles, a batch the mesh cannot split evenly.

    Each minibatch takes ``n_envs / n_minibatches`` whole envs, the same number
    from every device, so no rollout moves between devices: ``n_envs`` must be a
    multiple of ``devices * n_minibatches``, and an evaluation's ``n_envs`` a
    multiple of ``devices``.
    """
    if mesh is None:
        return
    devices = _env_splits(mesh)
    if n_envs % (devices * n_minibatches):
        raise ValueError(
            f"{owner}: ppo.n_envs={n_envs} is not divisible by devices x n_minibatches = "
            f"{devices} x {n_minibatches}{_other_axes(mesh)}; each minibatch takes the same "
            f"number of whole envs from every device. Use a multiple of "
            f"{devices * n_minibatches}, or fewer devices"
        )
    if eval_n_envs is not None and eval_n_envs % devices:
        raise ValueError(
            f"{owner}: eval.n_envs={eval_n_envs} is not divisible by the {devices} devices"
            f"{_other_axes(mesh)}; use a multiple of {devices}"
        )


def _env_splits(mesh: Mesh) -> int:
    """Into how many parts the envs split over ``mesh``: the size of its :data:`DATA_AXIS`."""
    return mesh.shape[DATA_AXIS]


def _other_axes(mesh: Mesh) -> str:
    """For a mesh of several axes, which devices a message's count is of; else nothing."""
    others = [f"{name}={size}" for name, size in mesh.shape.items() if name != DATA_AXIS]
    if not others:
        return ""
    return (
        f" (the devices along the mesh's {DATA_AXIS!r} axis; along {', '.join(others)} "
        "each holds a copy)"
    )


def mesh_of(training_state: TrainingState) -> Mesh | None:
    """The data mesh a training state's envs are placed on, or ``None`` (one device)."""
    placement = getattr(jax.tree.leaves(training_state.env_states.done)[0], "sharding", None)
    if isinstance(placement, NamedSharding) and DATA_AXIS in placement.mesh.axis_names:
        mesh = placement.mesh
        return mesh if isinstance(mesh, Mesh) else None
    return None


def _programs_may_overlap(mesh: Mesh | None) -> bool:
    """Whether a program over ``mesh`` may be dispatched while another still runs.

    Not over several CPU devices, out of caution: XLA:CPU's all-reduces meet in a
    rendezvous of host threads, and a run over four forced CPU devices on two cores
    was seen to hang there for good ("waiting for all reduce RendezvousKey ... may
    be stuck"), with and without its next call dispatched ahead. Spare host threads
    (``NPROC``, see the scale-out docs) are the remedy found for that.
    """
    if mesh is None or mesh.devices.size == 1:
        return True
    return not any(device.platform == "cpu" for device in mesh.devices.flat)


@contextlib.contextmanager
def training_mesh(mesh: Mesh | None) -> Iterator[None]:
    """Trace and run the compiled step under ``mesh`` (part of jit's cache key)."""
    if mesh is None:
        yield
        return
    with jax.set_mesh(mesh):
        yield


# ---------------------------------------------------------------------------- placing


def _put(leaf: Any, where: NamedSharding) -> jax.Array:
    """``leaf`` on ``where``; from each process's own copy when there are several."""
    if isinstance(leaf, jax.Array) and leaf.sharding == where:
        return leaf
    if is_key(leaf):
        data = _put(jax.random.key_data(leaf), where)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    if jax.process_count() == 1 or (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable):
        return jax.device_put(leaf, where)
    host = np.asarray(leaf)  # every process built the same value from the same seed
    return jax.make_array_from_callback(host.shape, where, lambda index: host[index])


def _env_spec(leaf: Any, n_envs: int) -> PartitionSpec:
    """Split along the env axis a leaf that leads with ``n_envs``; replicate any other."""
    per_env = np.ndim(leaf) >= 1 and np.shape(leaf)[0] == n_envs
    return PartitionSpec(DATA_AXIS) if per_env else PartitionSpec()


def _env_specs(tree: Any, n_envs: int) -> list[PartitionSpec]:
    """Each leaf's placement, in ``jax.tree.leaves(tree)``'s order: a ``Shared`` node's
    leaves replicated (its first axis may have ``n_envs`` entries by chance, and split it
    would be gathered back in every step), any other as :func:`_env_spec` says."""
    specs: list[PartitionSpec] = []
    for node in jax.tree.leaves(tree, is_leaf=_is_shared):
        if _is_shared(node):
            specs.extend(PartitionSpec() for _ in jax.tree.leaves(node))
        else:
            specs.append(_env_spec(node, n_envs))
    return specs


def _shard_envs(tree: Tree, mesh: Mesh, n_envs: int, what: str) -> Tree:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    placed = []
    for (path, leaf), spec in zip(leaves, _env_specs(tree, n_envs), strict=True):
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float | bool):
            raise ValueError(
                f"{what}{jax.tree_util.keystr(path)} is a {type(leaf).__name__}, which cannot be "
                "placed on devices: a state's leaves must be arrays"
            )
        placed.append(_put(leaf, NamedSharding(mesh, spec)))
    return jax.tree.unflatten(treedef, placed)


def _replicate(tree: Tree, mesh: Mesh) -> Tree:
    return jax.tree.map(lambda leaf: _put(leaf, NamedSharding(mesh, PartitionSpec())), tree)


def shard_training_state(training_state: TrainingState, mesh: Mesh) -> TrainingState:
    """The training state placed on ``mesh``: envs split, everything else replicated.

    The envs are split along the mesh's :data:`DATA_AXIS`; a mesh of more axes
    (``("data", "model")``) replicates over the others, so each row of devices
    along them holds the same envs and computes the same step (nothing is split
    along a model axis).

    The network and optimizer are updated in place (NNX semantics) unless every
    leaf is already replicated, and arrays already placed are kept, so this is
    cheap to call before every step. It also moves a state restored from a
    checkpoint written on another device count.

    Raises:
      ContractError: the env state is not batched (its ``done`` has no env axis).
      ValueError: the mesh has no axis named ``"data"`` or an axis not of type
        ``Auto`` (``jax.make_mesh``'s are ``Explicit`` unless told otherwise), an
        env-state leaf is not an array (so cannot be placed), or the envs do not
        split evenly over the devices along the ``"data"`` axis.
    """
    if DATA_AXIS not in mesh.axis_names:
        raise ValueError(
            f"shard_training_state: the mesh's axes are {tuple(mesh.axis_names)}, but the "
            f"envs are split along an axis named {DATA_AXIS!r} (any other axis holds "
            "copies): build the mesh with nnx_ppo.algorithms.sharding.data_mesh(devices), "
            f"or name the axis to split the envs along {DATA_AXIS!r}"
        )
    fixed = [
        name
        for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
        if kind != jax.sharding.AxisType.Auto
    ]
    if fixed:
        # The step constrains its arrays' placement as it goes, which an Explicit axis
        # takes as an assertion that fails deep in the trace.
        raise ValueError(
            f"shard_training_state: the mesh's axes {tuple(fixed)} are not of type Auto "
            "(jax.make_mesh makes Explicit axes by default), but the training step places "
            "its arrays itself: build the mesh with axis_types=(jax.sharding.AxisType.Auto,"
            ") * len(axis_names), or with nnx_ppo.algorithms.sharding.data_mesh(devices)"
        )
    n_envs = rollout.n_envs_of(training_state.env_states, "shard_training_state")
    devices = _env_splits(mesh)
    if n_envs % devices:
        raise ValueError(
            f"shard_training_state: {n_envs} envs do not split evenly over the mesh's "
            f"{devices} devices{_other_axes(mesh)}; use a multiple of {devices} envs, or "
            "fewer devices"
        )
    _require_alike_on_every_process(training_state)
    replicated = NamedSharding(mesh, PartitionSpec())
    for module in (training_state.networks, training_state.optimizer):
        state = nnx.state(module)
        if any(getattr(leaf, "sharding", None) != replicated for leaf in jax.tree.leaves(state)):
            nnx.update(module, _replicate(state, mesh))
    return training_state.replace(
        env_states=_shard_envs(training_state.env_states, mesh, n_envs, "env_states"),
        network_states=_shard_envs(training_state.network_states, mesh, n_envs, "network_states"),
        running_episodes=_shard_envs(
            training_state.running_episodes, mesh, n_envs, "running_episodes"
        ),
        rng_key=_replicate(training_state.rng_key, mesh),
    )


def _require_alike_on_every_process(training_state: TrainingState) -> None:
    """Raise unless every process holds the same values where the state is not placed yet.

    Each process places its own copy of a value (:func:`_put`), so the copies must be
    equal: processes given different seeds or settings would otherwise train replicated
    parameters that differ from process to process. Once placed, nothing is compared
    again (no collective runs per step).
    """
    if jax.process_count() == 1:
        return
    tree = (
        nnx.state(training_state.networks),
        nnx.state(training_state.optimizer),
        training_state.env_states,
        training_state.network_states,
        training_state.running_episodes,
        training_state.rng_key,
    )
    local = [
        key_data_or_leaf(leaf)
        for leaf in jax.tree.leaves(tree)
        if not (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable)
    ]
    if not local:
        return
    checksum = 0
    for leaf in local:
        checksum = zlib.crc32(np.ascontiguousarray(np.asarray(leaf)).tobytes(), checksum)
    gathered = multihost_utils.process_allgather(np.array([checksum], np.uint32))
    checksums = [int(c) for c in np.ravel(gathered)]
    if len(set(checksums)) > 1:
        raise ValueError(
            "the processes start from different training states (CRC-32 per process: "
            f"{checksums}): every process must build it alike, from the same settings, seed "
            "and checkpoint, since each places its own copy of the replicated parameters"
        )


# ------------------------------------------------------------------- inside the trace


def _active() -> bool:
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and DATA_AXIS in mesh.axis_names


def constrain_envs(tree: Tree, n_envs: int) -> Tree:
    """While tracing under a data mesh: split each per-env leaf over it along its env axis.

    A leaf is per-env when its leading axis has ``n_envs`` entries and it lies outside
    every ``Shared`` node; the others are replicated. Without a mesh, ``tree`` is
    returned as it is.
    """
    if not _active():
        return tree
    leaves, treedef = jax.tree.flatten(tree)
    specs = _env_specs(tree, n_envs)
    return jax.tree.unflatten(
        treedef,
        [
            jax.lax.with_sharding_constraint(leaf, spec)
            for leaf, spec in zip(leaves, specs, strict=True)
        ],
    )


def constrain_replicated(tree: Tree) -> Tree:
    """While tracing under a data mesh: every leaf whole on every device (e.g. metrics)."""
    if not _active():
        return tree
    return jax.tree.map(lambda leaf: jax.lax.with_sharding_constraint(leaf, PartitionSpec()), tree)
