"""Checkpoints of a training run, written with Orbax (no pickle), and resuming from them.

A checkpoint holds everything a run needs to continue exactly where it stopped:
the network's NNX state (parameters, normaliser statistics, the samplers' seed
streams), the optimizer state, every env's carry (recurrent state, per-env keys),
the batched env states, the training key, the episodes in progress, the step
counter and the run's config. Typed PRNG keys are stored as their raw key data
and re-wrapped on load.

Layout: ``make_checkpoint_fn(directory)`` writes one Orbax step directory per
checkpoint under ``directory``, named as nnx-ppo 0.3.0 named them,
``directory/step_0000500000/`` (see :func:`step_directory`), each with four items:

- ``arrays``: every array of the state, as a list (Orbax ``StandardSave``);
- ``manifest``: JSON naming each array's path in the state, shape, dtype and key
  implementation, plus the step counter; loading compares it with the network
  it is loaded into, so a different architecture fails with the paths that
  differ;
- ``config``: the :class:`~nnx_ppo.algorithms.config.TrainConfig` as JSON;
- ``metadata``: whatever JSON the caller gave :func:`make_checkpoint_fn` (``{}``
  if nothing), e.g. how the network was built.

Orbax writes each step into a temporary directory and renames it when complete,
so a crash mid-write leaves the previous checkpoint as the latest usable one.
Only the newest ``keep_last`` checkpoints are kept.
"""

import contextlib
import dataclasses
import enum
import json
import logging
import re
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar, get_args, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.config import (
    _STEP_COUNTS,
    AdvantageNormalization,
    LearningRateSchedule,
    TrainConfig,
)
from nnx_ppo.algorithms.metrics import _episode_sum_dtype
from nnx_ppo.algorithms.types import LoggingLevel, TrainingState
from nnx_ppo.contract.arguments import as_whole, require_int
from nnx_ppo.contract.checking import is_key, key_data_or_leaf
from nnx_ppo.contract.errors import DOCS_URL

__all__ = [
    "CHECKPOINT_SUBDIR",
    "CheckpointCallback",
    "CheckpointError",
    "NoCheckpointError",
    "config_from_dict",
    "config_to_dict",
    "find_checkpoint",
    "load_checkpoint",
    "make_checkpoint_fn",
    "read_metadata",
    "step_directory",
]

CHECKPOINT_SUBDIR = "checkpoints"
"""Where a run directory keeps its checkpoints."""

_FORMAT = 1

# Step directories are named ``step_`` and the step in at least ten digits, as in 0.3.0.
_STEP_PREFIX = "step"
_STEP_DIGITS = 10
_STEP_NAME = re.compile(rf"{_STEP_PREFIX}_(\d{{{_STEP_DIGITS},}})")

# What a step directory of this version holds: Orbax's files and our items, each of
# them also under the temporary name Orbax writes it to, which a killed write leaves.
_OWN_ENTRIES = frozenset(
    {"_CHECKPOINT_METADATA", "commit_success.txt", "arrays", "manifest", "config", "metadata"}
)
_ORBAX_TMP = ".orbax-checkpoint-tmp"
# 0.3.0's step directory, under the same name as ours: two Orbax checkpoints and a pickle.
_LEGACY_ENTRIES = ("metadata.pkl", "networks", "optimizer")
_MIGRATION = f"{DOCS_URL}migration.html#checkpoints"


@runtime_checkable
class CheckpointCallback(Protocol):
    """A ``checkpoint_fn``: called as ``fn(training_state, step)``; 0.3.0's name for the type."""

    def __call__(self, training_state: TrainingState, step: int) -> None: ...


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupted, or does not fit the network."""


class NoCheckpointError(CheckpointError):
    """Nothing to load where a checkpoint was looked for (no damaged one either)."""


# ----------------------------------------------------------------------------- config


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """A JSON-ready dict of ``config``; ``LoggingLevel`` flags become lists of names.

    Raises:
      TypeError: a field holds something JSON cannot store (e.g. a learning-rate
        schedule function); the message names the field.
    """

    def encode(value: Any, name: str) -> Any:
        if isinstance(value, LoggingLevel):
            return {"flags": [member.name for member in value]}
        if isinstance(value, enum.Enum):
            return value.name
        if isinstance(value, dict):
            return {str(k): encode(v, f"{name}.{k}") for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [encode(v, f"{name}[{i}]") for i, v in enumerate(value)]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(
            f"config field {name} holds a {type(value).__name__}, which a JSON config cannot "
            "store; use a number (or keep the schedule in code and pass the config yourself)"
        )

    return {
        section.name: {
            f.name: encode(
                getattr(getattr(config, section.name), f.name), f"{section.name}.{f.name}"
            )
            for f in dataclasses.fields(getattr(config, section.name))
        }
        if dataclasses.is_dataclass(getattr(config, section.name))
        else encode(getattr(config, section.name), section.name)
        for section in dataclasses.fields(config)
    }


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Rebuild a validated :class:`~nnx_ppo.algorithms.config.TrainConfig` from
    :func:`config_to_dict`'s output.

    Every field is parsed by its type, so a config file or a ``--set`` value of
    the wrong form is named with the form expected. ``logging_level`` takes a
    flag name (``"ALL"``), names joined by ``|`` (``"LOSSES|GRAD_NORM"``), a list
    of names, or ``{"flags": [...]}`` as :func:`config_to_dict` writes it.

    Raises:
      ValueError: an unknown section or field, or a value of the wrong form;
        the message names the field (e.g. ``ppo.n_envs``).
    """
    if not isinstance(data, dict):
        raise ValueError(f"a train config must be a JSON object, got {type(data).__name__}")
    defaults = TrainConfig()
    kwargs: dict[str, Any] = {}
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for name, value in data.items():
        if name not in known:
            raise ValueError(f"unknown config section or field {name!r}; known: {sorted(known)}")
        current: Any = getattr(defaults, name)
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            if not isinstance(value, dict):
                raise ValueError(
                    f"config section {name} must be an object of fields, got {value!r}"
                )
            fields = {f.name: f for f in dataclasses.fields(current)}
            unknown = sorted(set(value) - set(fields))
            if unknown:
                named = ", ".join(f"{name}.{field}" for field in unknown)
                raise ValueError(f"unknown config fields {named}; known: {sorted(fields)}")
            parsed = {
                k: _parse_field(f"{name}.{k}", str(fields[k].type), v) for k, v in value.items()
            }
            kwargs[name] = dataclasses.replace(current, **parsed)
        else:
            kwargs[name] = _parse_field(name, str(known[name].type), value)
    return TrainConfig(**kwargs)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _one_of(choices: Any) -> tuple[str, Callable[[Any], bool]]:
    """The form and the test of a field typed by a ``Literal`` of strings."""
    allowed = get_args(choices)
    return " or ".join(map(json.dumps, allowed)), lambda value: value in allowed


_FIELD_FORMS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer, e.g. 64", _is_int),
    "float": ("a number, e.g. 0.99", _is_number),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "float | None": ("a number, or null for none", lambda v: v is None or _is_number(v)),
    "int | None": ("an integer, or null for the default", lambda v: v is None or _is_int(v)),
    "float | bool | None": (
        "a number, true for optax's default, or null for none",
        lambda v: v is None or isinstance(v, int | float),
    ),
    "float | Callable[[Any], Any]": ("a number (keep a schedule in code)", _is_number),
    "tuple[int, ...] | None": (
        "a list of integers, e.g. [5, 50, 95], or null",
        lambda v: v is None or (isinstance(v, list | tuple) and all(_is_int(i) for i in v)),
    ),
    "dict[str, Any]": ('an object, e.g. {"height": 480}', lambda v: isinstance(v, dict)),
    "AdvantageNormalization": _one_of(AdvantageNormalization),
    "LearningRateSchedule": _one_of(LearningRateSchedule),
    "LoggingLevel": (
        'flag names: "ALL", "LOSSES|GRAD_NORM" or ["LOSSES", "GRAD_NORM"]',
        lambda v: _logging_level(v) is not None,
    ),
}
"""Each config field type: the form its values take (for messages) and who has it."""


def _parse_field(name: str, kind: str, value: Any) -> Any:
    """``value`` as the field of type ``kind`` (its annotation) holds it; else a named error."""
    if name.rpartition(".")[2] in _STEP_COUNTS:
        value = as_whole(value)  # total_steps = 1e6, as a config may write it
    form, accepts = _FIELD_FORMS[kind]
    if not accepts(value):
        unknown = [
            flag
            for flag in (_flag_names(value) or [] if kind == "LoggingLevel" else [])
            if flag not in LoggingLevel.__members__
        ]
        named = (
            f" ({', '.join(map(repr, unknown))}: no such flag; the flags are "
            f"{', '.join(LoggingLevel.__members__)})"
            if unknown
            else ""
        )
        raise ValueError(f"config field {name} must be {form}; got {json.dumps(value)}{named}")
    if kind == "LoggingLevel":
        return _logging_level(value)
    if isinstance(value, list):
        return tuple(value)
    return value


def _logging_level(value: Any) -> LoggingLevel | None:
    """A ``LoggingLevel`` from one of its JSON forms; ``None`` if it is none of them."""
    if isinstance(value, LoggingLevel):
        return value
    names = _flag_names(value)
    if names is None or any(name not in LoggingLevel.__members__ for name in names):
        return None
    flags = LoggingLevel(0)
    for name in names:
        flags |= LoggingLevel[name]
    return flags


def _flag_names(value: Any) -> list[str] | None:
    """The flag names a ``LoggingLevel``'s JSON form lists; ``None`` if it lists none."""
    if isinstance(value, dict) and set(value) == {"flags"}:
        value = value["flags"]
    if isinstance(value, str):
        value = [part.strip() for part in value.split("|")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


# ------------------------------------------------------------------------ flattening


def _snapshot(state: TrainingState) -> dict[str, Any]:
    """The arrays of a training state, as one pytree (the network in NNX state form, but
    what an eager call sowed: no training state)."""
    return {
        "networks": nnx.state(state.networks, nnx.Not(nnx.Intermediate)),
        "optimizer": nnx.state(state.optimizer),
        "network_states": state.network_states,
        "env_states": state.env_states,
        "rng_key": state.rng_key,
        "running_episodes": state.running_episodes,
    }


def _flatten(tree: Any) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """The arrays Orbax stores, and a manifest entry for every leaf.

    Orbax cannot store zero-size arrays (simulator states hold some); they are
    described in the manifest only and rebuilt empty on load.
    """
    arrays: list[np.ndarray] = []
    entries: list[dict[str, Any]] = []
    holders = _variable_classes(tree)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key_impl = str(jax.random.key_impl(leaf)) if is_key(leaf) else None
        array = _on_host(key_data_or_leaf(leaf))
        # As JAX holds it: a Python scalar in a Variable is int64 or float64 to NumPy,
        # int32 or float32 to JAX (without x64) once a step has run.
        array = array.astype(jax.dtypes.canonicalize_dtype(array.dtype), copy=False)
        if array.size:
            arrays.append(array)
        entries.append(
            {
                "path": jax.tree_util.keystr(path),
                "shape": list(np.shape(leaf)),
                "dtype": f"key<{key_impl}>" if key_impl else str(array.dtype),
                "key_impl": key_impl,
                "stored_shape": list(array.shape),
                "stored_dtype": str(array.dtype),
                "variable": holders.get(jax.tree_util.keystr(path)),
            }
        )
    return arrays, entries


def _variable_classes(tree: Any) -> dict[str, str]:
    """The class of the ``nnx.Variable`` holding each leaf, by the leaf's path: a statistic
    loaded where a network now has an ``nnx.Param`` would be trained."""
    classes: dict[str, str] = {}
    variables = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda node: isinstance(node, nnx.Variable)
    )[0]
    for path, node in variables:
        if isinstance(node, nnx.Variable):
            for inner, _ in jax.tree_util.tree_flatten_with_path(node)[0]:
                classes[jax.tree_util.keystr((*path, *inner))] = type(node).__name__
    return classes


def _weakly_typed(leaf: Any) -> bool:
    return isinstance(leaf, int | float | complex) or bool(getattr(leaf, "weak_type", False))


def _require_globless_directory(owner: str, directory: Path) -> None:
    """Refuse a checkpoint directory whose path holds ``[`` or ``]``: Orbax reads the path
    as a glob pattern where it merges a checkpoint's array files, finds nothing, and
    leaves the arrays unreadable (with a log warning only)."""
    path = str(directory.absolute())
    if "[" in path or "]" in path:
        raise ValueError(
            f"{owner}: the checkpoint directory {path} has '[' or ']' in its path; Orbax "
            "reads them as a glob pattern as it writes a checkpoint's arrays, which then "
            "cannot be read back. Choose a path without brackets"
        )


def _on_host(leaf: Any) -> np.ndarray:
    """The whole array on this host; an array split over several processes is gathered
    (a collective: every process of a multi-process run must call it)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(leaf)


_WIDENED_ON_LOAD = "['running_episodes'].returns"
"""The returns of episodes in progress: kept in the reward's dtype before they were summed
in float32 or wider, so a narrower one saved then is widened as it loads."""


def _fits(path: str, saved: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether a saved leaf fits the template's: shape, dtype and the class of the
    Variable holding it (a manifest written before classes were recorded fits any)."""
    same_class = saved.get("variable") in (None, wanted.get("variable"))
    same_dtype = saved["dtype"] == wanted["dtype"] or (
        path.startswith(_WIDENED_ON_LOAD)
        and str(_episode_sum_dtype(saved["dtype"])) == wanted["dtype"]
    )
    return saved["shape"] == wanted["shape"] and same_dtype and same_class


def _difference(path: str, saved: dict[str, Any], wanted: dict[str, Any]) -> str:
    if (saved["shape"], saved["dtype"]) == (wanted["shape"], wanted["dtype"]):
        return (
            f"{path} is held by an nnx {saved['variable']} in the checkpoint but by an nnx "
            f"{wanted['variable']} here"
        )
    return f"{path} is {_describe(saved)} in the checkpoint but {_describe(wanted)} here"


def _describe(entry: dict[str, Any]) -> str:
    return f"shape {tuple(entry['shape'])} {entry['dtype']}"


# ------------------------------------------------------------------------------ save


def _manager(directory: Path, keep_last: int | None, create: bool) -> Any:
    import orbax.checkpoint as ocp

    # The writer removes what a killed write left; a reader (`nnx-ppo eval` beside a live
    # run, another process) must not remove a write in progress.
    writer = create and jax.process_index() == 0
    solo: dict[str, Any] = {}
    if jax.process_count() > 1:
        # Each process works alone: process 0 writes, and every process reads for itself.
        solo["multiprocessing_options"] = ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()}
        )
        if create:  # Orbax leaves the directory to us when only some processes take part
            directory.mkdir(parents=True, exist_ok=True)
            create = False
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep_last,
        create=create,
        enable_async_checkpointing=False,
        step_prefix=_STEP_PREFIX,
        step_format_fixed_length=_STEP_DIGITS,
        cleanup_tmp_directories=writer,
        **solo,
    )
    return ocp.CheckpointManager(directory.absolute(), options=options)


_MADE_BY = {
    "TrainingState": "nnx_ppo.algorithms.checkpointing.make_checkpoint_fn",
    "DistillationState": "nnx_ppo.algorithms.distillation.make_distillation_checkpoint_fn",
}
"""The state a library-made ``checkpoint_fn`` saves, and the function that makes it."""

_F = TypeVar("_F", bound=Callable[..., None])


def _marked_as_checkpointing(checkpoint_fn: _F, state: str) -> _F:
    """``checkpoint_fn``, marked as saving a ``state`` (a key of ``_MADE_BY``), so a
    training function handed one that saves another state names it before compiling."""
    checkpoint_fn.__dict__["_nnx_ppo_checkpoints"] = state
    return checkpoint_fn


def _require_checkpointing(owner: str, checkpoint_fn: Any, state: str) -> None:
    """Refuse a library-made ``checkpoint_fn`` that saves another state than ``state``."""
    saves = getattr(checkpoint_fn, "_nnx_ppo_checkpoints", state)
    if saves != state:
        raise TypeError(
            f"{owner}: checkpoint_fn was made by {_MADE_BY[saves]}, which saves a {saves}, "
            f"but {owner} checkpoints a {state}: make it with {_MADE_BY[state]}"
        )


def make_checkpoint_fn(
    directory: str | Path,
    config: TrainConfig | None = None,
    *,
    keep_last: int = 3,
    metadata: dict[str, Any] | None = None,
) -> CheckpointCallback:
    """A ``checkpoint_fn`` for :func:`~nnx_ppo.algorithms.ppo.train_ppo` writing Orbax checkpoints.

    Args:
      directory: where the step directories go (created at the first save).
      config: stored with every checkpoint, so a run can be resumed from it alone.
      keep_last: how many of the newest checkpoints to keep.
      metadata: JSON-ready data stored with every checkpoint and returned by
        :func:`load_checkpoint`, e.g. how the network was built (the ``nnx-ppo`` CLI
        stores its run configuration, to tell a ``config.json`` changed since).

    A step already on disk is not written again (a resumed run passes its
    starting step first, and the final save may follow a periodic one of the same
    step); a ``checkpoint_fn`` serves one run, and a step at or before one it wrote,
    with other arrays, raises :class:`CheckpointError`. A directory that held
    checkpoints before the first save must be the run's own: a first save before
    its latest step, or at that step with other arrays, raises
    :class:`CheckpointError` instead of mixing two runs' checkpoints, and so does a step
    directory there that this version did not write (nnx-ppo 0.3.0's, which the first
    save would overwrite or remove), before anything is written. In a run of
    several processes every process calls it (arrays split over processes are
    gathered) and process 0 alone writes. A
    write that fails (disk full, read-only directory) raises
    :class:`CheckpointError` naming the directory; Orbax writes into a temporary
    directory, so the failed step is never taken as the latest. A ``directory`` whose
    path holds ``[`` or ``]`` raises ``ValueError`` at once: Orbax reads it as a glob
    pattern as it writes the arrays, which could then not be read back.

    Example::

        train_ppo(env, networks, config, checkpoint_fn=make_checkpoint_fn("runs/a", config))
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"make_checkpoint_fn: keep_last must be a positive int, got {keep_last!r}")
    if config is not None and not isinstance(config, TrainConfig):
        fix = (
            "distillation runs are checkpointed by "
            "nnx_ppo.algorithms.distillation.make_distillation_checkpoint_fn"
            if type(config).__name__ == "DistillationTrainConfig"
            else "wrap a PPOConfig as TrainConfig(ppo=...)"
        )
        raise TypeError(
            f"make_checkpoint_fn: config must be a TrainConfig, got a {type(config).__name__}; "
            f"{fix}"
        )
    try:
        metadata_json = json.loads(json.dumps(metadata if metadata is not None else {}))
    except (TypeError, ValueError) as error:
        raise TypeError(f"make_checkpoint_fn: metadata must be JSON-ready: {error}") from None
    if not isinstance(metadata_json, dict):
        raise TypeError(
            f"make_checkpoint_fn: metadata must be a dict, got a {type(metadata).__name__}"
        )
    root = Path(directory)
    _require_globless_directory("make_checkpoint_fn", root)
    # As JSON reads it back (tuples as lists), so the checksum is of what a load reads.
    config_json = json.loads(json.dumps(config_to_dict(config))) if config is not None else {}
    managers: list[Any] = []  # made at the first save: a run that fails before it leaves no dir
    # The newest step written by this function, or found to be the run's own, with the
    # checksums of its arrays.
    latest: list[tuple[int, list[int]]] = []

    def checkpoint_fn(training_state: TrainingState, step: int) -> None:
        import orbax.checkpoint as ocp

        if not isinstance(training_state, TrainingState):
            raise TypeError(
                "a checkpoint_fn of make_checkpoint_fn takes a PPO TrainingState, got a "
                f"{type(training_state).__name__}"
                + (
                    ": checkpoint distillation with "
                    "nnx_ppo.algorithms.distillation.make_distillation_checkpoint_fn"
                    if type(training_state).__name__ == "DistillationState"
                    else ""
                )
            )
        arrays, entries = _flatten(_snapshot(training_state))  # every process takes part
        if jax.process_index() != 0:
            return
        step = int(step)
        checksums = [_checksum(array) for array in arrays]
        if latest and (step, checksums) == latest[0]:
            return  # a final save right after a periodic one
        if latest and step <= latest[0][0]:
            relation = "again, with other arrays" if step == latest[0][0] else "before it"
            raise CheckpointError(
                f"this checkpoint_fn wrote step {latest[0][0]} into {root}, and is now given "
                f"step {step} {relation}: it serves one run, and a second run's checkpoints "
                "would mix with the first's. Make a checkpoint_fn, with a directory of its "
                "own, for each run."
            )
        if not managers:
            # Orbax takes every step directory here for one of its own, to overwrite or
            # remove: what another writer left must stop the run before that.
            _refuse_foreign_steps(root)
            try:
                managers.append(_manager(root, keep_last, create=True))
            except OSError as error:
                raise CheckpointError(_write_failure(root, step, error)) from error
            # A step directory a crash left incomplete is no checkpoint (find_checkpoint
            # skips it too): the run resumed from an earlier one, and may write it anew.
            found = [s for s in managers[0].all_steps() if _complete(step_directory(root, s))]
            if found:
                _require_own_directory(root, max(found), step, arrays, entries)
                if step == max(found):
                    latest[:] = [(step, checksums)]
                    return  # the step this run resumed from
        manager = managers[0]
        if step in manager.all_steps():  # an incomplete directory of this step
            manager.delete(step)
            manager.reload()
        manifest = {
            "format": _FORMAT,
            "step": step,
            "steps_taken": int(training_state.steps_taken),
            "leaves": entries,
            "checksums": checksums,
            "item_checksums": {
                "config": _json_checksum(config_json),
                "metadata": _json_checksum(metadata_json),
            },
        }
        manifest["manifest_checksum"] = _manifest_checksum(manifest)
        try:
            with _orbax_errors_held():
                manager.save(
                    step,
                    args=ocp.args.Composite(
                        arrays=ocp.args.StandardSave(arrays),
                        manifest=ocp.args.JsonSave(manifest),
                        config=ocp.args.JsonSave(config_json),
                        metadata=ocp.args.JsonSave(metadata_json),
                    ),
                    force=True,
                )
                manager.wait_until_finished()
        except (OSError, ValueError) as error:  # a full disk reaches Orbax as a ValueError
            raise CheckpointError(_write_failure(root, step, error)) from error
        latest[:] = [(step, checksums)]

    return _marked_as_checkpointing(checkpoint_fn, "TrainingState")


def _refuse_foreign_steps(root: Path) -> None:
    """Raise for a step directory under ``root`` that is not this version's: neither a
    complete checkpoint nor what Orbax leaves of one when a write is killed."""
    if not root.is_dir():
        return
    for found in sorted(root.iterdir()):
        if _step_of(found) is None or not found.is_dir() or _complete(found):
            continue
        if _is_legacy(found):
            raise CheckpointError(
                f"{found} looks like a checkpoint of nnx-ppo 0.3.0 (it holds "
                f"{_legacy_items(found)}), which this version cannot read or extend, and "
                f"writing checkpoints into {root} would overwrite or remove it: choose a new "
                f"directory for this run's checkpoints (see {_MIGRATION})"
            )
        foreign = [
            entry.name
            for entry in sorted(found.iterdir())
            if entry.name.split(_ORBAX_TMP)[0] not in _OWN_ENTRIES
        ]
        if foreign:
            raise CheckpointError(
                f"{found} is not a checkpoint of make_checkpoint_fn (it holds "
                f"{', '.join(foreign)}), and writing checkpoints into {root} would overwrite "
                "or remove it: choose a new directory for this run's checkpoints, or move "
                "it out"
            )


def _require_own_directory(
    root: Path, latest: int, step: int, arrays: list[np.ndarray], entries: list[dict[str, Any]]
) -> None:
    """Raise unless the checkpoints up to ``latest`` under ``root`` can be this run's own:
    its first save ``step`` comes after them, or is ``latest`` with the same arrays (the
    step a resumed run starts from)."""
    if step > latest:
        return
    if step == latest and _holds(root, latest, arrays, entries):
        return
    if step == latest:
        raise CheckpointError(
            f"{root} already holds checkpoints up to step {latest} of another run, and this "
            f"run's checkpoint of step {step} holds other arrays: the two runs' checkpoints "
            "would mix. Write into a new directory, or load the checkpoint there "
            "(load_checkpoint) to continue that run."
        )
    raise CheckpointError(
        f"{root} already holds checkpoints up to step {latest}, and this run's checkpoint "
        f"of step {step} comes before it: this is another run, or one resumed from an "
        f"earlier checkpoint of that directory. Their checkpoints would mix: write into a "
        f"new directory, or remove the checkpoints after the step resumed from to go on "
        "from there."
    )


def _holds(root: Path, step: int, arrays: list[np.ndarray], entries: list[dict[str, Any]]) -> bool:
    """Whether the checkpoint of ``step`` under ``root`` stores exactly ``arrays``."""
    if _read_json(step_directory(root, step), "manifest").get("leaves") != entries:
        return False
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    stored = _restore_arrays(root, step, abstract)
    return all(np.array_equal(np.asarray(a), b) for a, b in zip(stored, arrays, strict=True))


@contextlib.contextmanager
def _orbax_errors_held() -> Iterator[None]:
    """Hold the errors Orbax's writer threads log while a save runs.

    Each thread that fails a write (a full disk) logs it with its traceback before
    the save raises it: dozens of lines around the one error the caller reports.
    Where the save fails they are dropped; where it succeeds they are passed on.
    """
    orbax_logger = logging.getLogger("absl")
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        held.append(record)
        return False

    orbax_logger.addFilter(hold)
    try:
        yield
    except BaseException:
        orbax_logger.removeFilter(hold)
        raise
    orbax_logger.removeFilter(hold)
    for record in held:
        orbax_logger.handle(record)


def _write_failure(root: Path, step: int, error: OSError | ValueError) -> str:
    if isinstance(error, OSError):
        reason, where = error.strerror or str(error), error.filename or root
    else:  # Orbax's, whose message names the file, then spells out its store (a page of JSON)
        first_line = next(iter(str(error).splitlines()), type(error).__name__)
        reason, where = first_line.split(" [tensorstore_spec=")[0], root
    return (
        f"could not write the checkpoint of step {step} under {root}: {reason} ({where}); "
        "the checkpoints already there are intact"
    )


def _manifest_checksum(manifest: dict[str, Any]) -> int:
    """CRC-32 of the manifest's own entries (but this one), in a canonical JSON form: a
    changed step count or leaf entry would otherwise load as a valid checkpoint."""
    return _json_checksum(
        {key: value for key, value in manifest.items() if key != "manifest_checksum"}
    )


def _json_checksum(value: Any) -> int:
    """CRC-32 of a JSON-ready value in a canonical form."""
    return zlib.crc32(json.dumps(value, sort_keys=True).encode())


def _checksum(array: Any) -> int:
    """CRC-32 of an array's bytes: the manifest keeps one per stored array, since Orbax's
    array files hold none and a changed byte would otherwise load as a valid value."""
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


# ------------------------------------------------------------------------------ load


def step_directory(root: str | Path, step: int) -> Path:
    """The directory of the checkpoint of ``step`` under ``root``: ``root/step_0000500000``.

    The name is 0.3.0's, so scripts that build or parse step paths keep working.
    """
    return Path(root) / f"{_STEP_PREFIX}_{int(step):0{_STEP_DIGITS}d}"


def _step_of(step_dir: Path) -> int | None:
    """The step a step directory's name holds, or ``None`` for any other name."""
    match = _STEP_NAME.fullmatch(step_dir.name)
    return int(match.group(1)) if match else None


def _complete(step_dir: Path) -> bool:
    """Whether Orbax finished a step directory: it holds Orbax's metadata and our manifest.

    A directory Orbax is still writing has a temporary name, which :func:`_step_of`
    does not read as a step.
    """
    return (step_dir / "_CHECKPOINT_METADATA").is_file() and (step_dir / "manifest").is_dir()


def _is_legacy(step_dir: Path) -> bool:
    """Whether a step directory is one of nnx-ppo 0.3.0's, written in 0.3.0's layout."""
    return not (step_dir / "manifest").exists() and any(
        (step_dir / item).exists() for item in _LEGACY_ENTRIES
    )


def _legacy_items(step_dir: Path) -> str:
    return ", ".join(
        f"{item}/" if (step_dir / item).is_dir() else item
        for item in _LEGACY_ENTRIES
        if (step_dir / item).exists()
    )


def _refuse_legacy(path: Path) -> None:
    """Raise for a 0.3.0 checkpoint at ``path`` (one step directory) or under it: read as
    this version's, it would be no checkpoint at all, or an older one taken as the latest."""
    candidates = [path] if _step_of(path) is not None else []
    candidates += [found for found in sorted(path.iterdir()) if _step_of(found) is not None]
    for found in candidates:
        if found.is_dir() and _is_legacy(found):
            raise CheckpointError(
                f"{found} is a checkpoint of nnx-ppo 0.3.0 (it holds {_legacy_items(found)}), "
                "which this version cannot read: 0.3.0 pickled part of the state. Train the "
                f"run again with this version (see {_MIGRATION})"
            )


def find_checkpoint(path: str | Path, step: int | None = None) -> tuple[Path, int]:
    """Resolve a run directory, a checkpoint directory or one step directory.

    Returns the checkpoint root and the step: ``step`` if given, else the step of
    a step directory, else the latest complete checkpoint. A directory Orbax is
    still writing (or a killed write left) has a temporary name and is never taken.

    Raises:
      CheckpointError: nothing usable there, a step directory given with another
        ``step``, a checkpoint of nnx-ppo 0.3.0 there, or a step directory (given, or
        after the latest complete one) that holds Orbax's metadata or the manifest but
        not both (it lost the other since Orbax renamed it); the message says what was
        looked for or what is missing.
    """
    if step is not None:  # a whole float too: metrics log total_steps as one
        step = require_int("find_checkpoint", "step", as_whole(step), minimum=0)
    path = Path(path)
    if not path.exists():
        raise NoCheckpointError(f"no checkpoint: {path} does not exist")
    if not path.is_dir():
        raise NoCheckpointError(
            f"no checkpoint: {path} is a file; pass a run directory, its checkpoints "
            "directory or one step directory"
        )
    if (path / CHECKPOINT_SUBDIR).is_dir():
        path = path / CHECKPOINT_SUBDIR
    if path.is_dir():
        _refuse_legacy(path)
    own_step = _step_of(path)
    if own_step is not None and (path / "manifest").exists():
        if step is not None and step != own_step:
            raise CheckpointError(
                f"{path} is the checkpoint of step {own_step}, not {step}: pass its "
                f"checkpoints directory {path.parent} to choose another step"
            )
        return path.parent, own_step
    if own_step is not None and (missing := _missing_item(path)) is not None:
        raise CheckpointError(
            f"checkpoint {path} is incomplete or corrupted: its {missing} is missing"
            f"{_earlier(path)}"
        )
    steps = _complete_steps(path)
    if step is None:
        _refuse_damaged_after(path, steps[-1] if steps else None)
    if not steps and own_step is not None:
        raise NoCheckpointError(
            f"no checkpoint in {path}: this step directory holds no manifest of "
            f"make_checkpoint_fn; pass its checkpoints directory {path.parent} to load the "
            "latest complete checkpoint"
        )
    if not steps:
        # A run directory keeps its checkpoints in a subdirectory, absent until the first.
        where = path / CHECKPOINT_SUBDIR if (path / "config.json").is_file() else path
        raise NoCheckpointError(
            f"no checkpoint in {path}: expected step directories (e.g. "
            f"{step_directory(where, 100000)}) written by make_checkpoint_fn"
        )
    if step is None:
        return path, steps[-1]
    if step not in steps:
        raise NoCheckpointError(f"no checkpoint for step {step} in {path}; it has steps {steps}")
    return path, step


def _refuse_damaged_after(root: Path, latest: int | None) -> None:
    """Raise for a step directory after ``latest`` that holds our manifest or Orbax's
    metadata but not both: Orbax writes both under the directory's temporary name and
    renames it when complete, so the missing one was removed since, and taking the
    earlier checkpoint would drop the steps after it."""
    for found in sorted(root.iterdir()):
        step = _step_of(found)
        if step is None or (latest is not None and step <= latest) or not found.is_dir():
            continue
        missing = _missing_item(found)
        if missing is not None:
            raise CheckpointError(
                f"checkpoint {found} is incomplete or corrupted: its {missing} is "
                f"missing{_earlier(found)}"
            )


def _missing_item(step_dir: Path) -> str | None:
    """The item a renamed (so finished) step directory lost, if it holds the other's."""
    has_manifest = (step_dir / "manifest").is_dir()
    has_metadata = (step_dir / "_CHECKPOINT_METADATA").is_file()
    if has_manifest and not has_metadata:
        return "_CHECKPOINT_METADATA (Orbax's)"
    if not has_manifest and (has_metadata or (step_dir / "commit_success.txt").is_file()):
        return "manifest/ (make_checkpoint_fn's)"
    return None


def _earlier(step_dir: Path) -> str:
    """Where a damaged checkpoint leaves its run: the complete one before it, if any."""
    step = _step_of(step_dir)
    earlier = [s for s in _complete_steps(step_dir.parent) if step is not None and s < step]
    if not earlier:
        return ""
    return (
        f". The checkpoint of step {earlier[-1]} is complete: remove {step_dir} to resume from it"
    )


def _complete_steps(root: Path) -> list[int]:
    """The steps of the complete checkpoints under ``root``, in order."""
    named = ((_step_of(p), p) for p in root.iterdir() if p.is_dir())
    return sorted(found for found, p in named if found is not None and _complete(p))


def read_metadata(path: str | Path, *, step: int | None = None) -> dict[str, Any] | None:
    """The ``metadata`` :func:`make_checkpoint_fn` stored with the newest checkpoint under
    ``path`` (a run directory, its checkpoints directory or one step directory), or with
    ``step``'s, without reading its arrays; ``None`` for a checkpoint of a version before
    it.

    Raises:
      NoCheckpointError: there is no checkpoint under ``path``.
      CheckpointError: the checkpoint is damaged.
    """
    root, found = find_checkpoint(path, step)
    step_dir = step_directory(root, found)
    return _metadata_of(step_dir, _read_json(step_dir, "manifest"))


def _metadata_of(step_dir: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    # Checkpoints of versions before make_checkpoint_fn's metadata have none.
    if not (step_dir / "metadata").exists():
        return None
    return _checked_item(step_dir, "metadata", manifest)


def _checked_item(step_dir: Path, item: str, manifest: dict[str, Any]) -> Any:
    """The JSON item ``item`` of a checkpoint, checked against the checksum its manifest
    holds for it (checkpoints written before item checksums hold none)."""
    value = _read_json(step_dir, item)
    written = manifest.get("item_checksums", {}).get(item)
    if written is not None and _json_checksum(value) != written:
        raise CheckpointError(
            f"checkpoint {step_dir} is corrupted: its {item} does not match the checksum "
            f"written with it{_earlier(step_dir)}"
        )
    return value


def _read_json(step_dir: Path, item: str) -> Any:
    candidates = [step_dir / item / "metadata", *sorted((step_dir / item).glob("*.json"))]
    for candidate in candidates:
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except json.JSONDecodeError as error:
                raise CheckpointError(
                    f"checkpoint {step_dir} is corrupted: its {item} is not valid JSON "
                    f"({error}){_earlier(step_dir)}"
                ) from error
    raise CheckpointError(
        f"checkpoint {step_dir} is incomplete or corrupted: its {item} is missing"
        f"{_earlier(step_dir)}"
    )


_PPO_OPTIMIZER = (
    "as train_ppo does from its config: new_training_state(env, networks, ppo.n_envs, seed, "
    "ppo.optimizer_learning_rate(), ppo.gradient_clipping, ppo.weight_decay)"
)
"""How a PPO run's template gets the run's optimizer, for a checkpoint whose optimizer
state does not fit."""


def _compare(
    saved: dict[str, dict[str, Any]], wanted: dict[str, dict[str, Any]], optimizer_hint: str
) -> None:
    missing = [p for p in wanted if p not in saved]
    unexpected = [p for p in saved if p not in wanted]
    problems = []
    if missing:
        problems.append("missing from the checkpoint: " + ", ".join(missing[:5]))
    if unexpected:
        problems.append("in the checkpoint but not in the network: " + ", ".join(unexpected[:5]))
    changed = [p for p, e in wanted.items() if p in saved and not _fits(p, saved[p], e)]
    if changed:
        problems.append(_difference(changed[0], saved[changed[0]], wanted[changed[0]]))
    if not problems:
        return
    differing = [*missing, *unexpected, *changed]
    if all(path.startswith("['optimizer']") for path in differing):
        cause = (
            "its optimizer state does not fit this template's optimizer: build the template "
            f"with the run's optimizer settings, {optimizer_hint}"
        )
    else:
        cause = "the checkpoint does not fit this network (a different architecture or env?)"
    raise CheckpointError(cause + ":\n  " + "\n  ".join(problems))


def load_checkpoint(
    path: str | Path,
    template: TrainingState | nnx.Module,
    optimizer: nnx.Optimizer | None = None,
    *,
    step: int | None = None,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`make_checkpoint_fn`.

    Args:
      path: a run directory, its ``checkpoints`` directory (the latest checkpoint
        is taken), or one step directory.
      template: a :class:`~nnx_ppo.algorithms.types.TrainingState` of the same
        architecture and ``n_envs`` (e.g. from
        :func:`~nnx_ppo.algorithms.ppo.new_training_state`), to resume training; or
        just the network (with ``optimizer`` optionally), to restore its parameters
        and statistics for evaluation. Modules are updated in place.
      optimizer: with a network ``template``, an optimizer to restore as well.
      step: a specific step instead of the latest.

    Returns:
      A dict of ``training_state`` (a ``TrainingState``, or ``None`` when only a
      network was given, which with an ``optimizer`` too is warned of, since 0.3.0
      resumed from that call), ``step`` (an int), ``config`` (the ``TrainConfig``, or
      ``None``) and ``metadata`` (the dict given to :func:`make_checkpoint_fn`, or
      ``None`` for a checkpoint of a version before it).

    Raises:
      CheckpointError: the checkpoint is missing, incomplete or corrupted, or its
        arrays do not fit the template (the message names the paths that differ), or
        it is nnx-ppo 0.3.0's, which this version cannot read.
    """
    return _load_checkpoint(path, template, optimizer, step, _PPO_OPTIMIZER)


def _load_checkpoint(
    path: str | Path,
    template: TrainingState | nnx.Module,
    optimizer: nnx.Optimizer | None,
    step: int | None,
    optimizer_hint: str,
) -> dict[str, Any]:
    """:func:`load_checkpoint`; ``optimizer_hint`` says how the caller's template gets the
    run's optimizer settings, for a checkpoint whose optimizer state does not fit."""
    if step is not None:
        step = require_int("load_checkpoint", "step", as_whole(step), minimum=0)
    root, found = find_checkpoint(path, step)
    for read in range(1, _READS_OF_THE_LATEST + 1):
        try:
            return _load_step(root, found, template, optimizer, optimizer_hint)
        except CheckpointError:
            # A live run keeping its last few checkpoints may remove the newest one while
            # it is read (nnx-ppo eval beside training): then the new newest is read.
            if step is not None or step_directory(root, found).exists():
                raise
        if read < _READS_OF_THE_LATEST:
            root, found = find_checkpoint(path, step)
    raise CheckpointError(
        f"the newest checkpoint under {root} was removed while it was read, "
        f"{_READS_OF_THE_LATEST} times: a running training writes and removes checkpoints "
        "faster than they can be read. Load a step it keeps (step=...), or wait for it to end"
    )


_READS_OF_THE_LATEST = 3
"""How many newest checkpoints a load tries, each removed while it was read, before it
gives up."""


def _load_step(
    root: Path,
    step: int,
    template: TrainingState | nnx.Module,
    optimizer: nnx.Optimizer | None,
    optimizer_hint: str,
) -> dict[str, Any]:
    """Load the checkpoint of ``step`` under ``root`` (everything is read before the
    template is written)."""
    step_dir = step_directory(root, step)
    manifest = _read_json(step_dir, "manifest")
    if manifest.get("format") != _FORMAT or "leaves" not in manifest:
        raise CheckpointError(f"checkpoint {step_dir} has an unknown manifest format")
    # Checkpoints written before the manifest's own checksum have none to compare.
    if (
        manifest.get("manifest_checksum", _manifest_checksum(manifest))
        != _manifest_checksum(manifest)
        or manifest.get("step", step) != step
    ):
        raise CheckpointError(
            f"checkpoint {step_dir} is corrupted: its manifest does not match the checksum "
            f"written with it{_earlier(step_dir)}"
        )
    saved = {entry["path"]: entry for entry in manifest["leaves"]}

    if isinstance(template, TrainingState):
        target: dict[str, Any] = _snapshot(template)
    else:
        target = {"networks": nnx.state(template, nnx.Not(nnx.Intermediate))}
        if optimizer is not None:
            target["optimizer"] = nnx.state(optimizer)
    _, entries = _flatten(target)
    wanted = {entry["path"]: entry for entry in entries}
    leaves = jax.tree.leaves(target)
    weak = {e["path"]: leaf for e, leaf in zip(entries, leaves, strict=True) if _weakly_typed(leaf)}
    prefixes = tuple(f"[{name!r}]" for name in target)
    # Intermediates a network had sown were saved by earlier versions: no training state.
    compared = {
        path: entry
        for path, entry in saved.items()
        if path.startswith(prefixes) and entry.get("variable") != "Intermediate"
    }
    _compare(compared, wanted, optimizer_hint)

    specs = {
        path: jax.ShapeDtypeStruct(tuple(e["stored_shape"]), np.dtype(e["stored_dtype"]))
        for path, e in saved.items()
    }
    stored = [path for path, spec in specs.items() if spec.size]
    try:
        restored = _restore_arrays(root, step, [specs[path] for path in stored])
    except Exception as error:
        raise CheckpointError(
            f"checkpoint {step_dir} could not be read: {error}{_earlier(step_dir)}"
        ) from error
    restored = [np.asarray(array) for array in restored]
    checksums = manifest.get("checksums", [None] * len(stored))  # None: written before them
    if len(checksums) != len(stored):
        raise CheckpointError(
            f"checkpoint {step_dir} is corrupted: its manifest lists {len(checksums)} "
            f"checksums for {len(stored)} arrays{_earlier(step_dir)}"
        )
    for path, array, checksum in zip(stored, restored, checksums, strict=True):
        if checksum is not None and _checksum(array) != checksum:
            raise CheckpointError(
                f"checkpoint {step_dir} is corrupted: its array {path} does not match the "
                f"checksum written with it{_earlier(step_dir)}"
            )
    by_path = {path: np.zeros(spec.shape, spec.dtype) for path, spec in specs.items()}
    by_path |= dict(zip(stored, restored, strict=True))

    def rebuilt(path: str) -> Any:
        impl = saved[path]["key_impl"]
        if impl:
            return jax.random.wrap_key_data(jnp.asarray(by_path[path]), impl=impl)
        if path not in weak:  # in the template's dtype: a saved return may be narrower
            return jnp.asarray(by_path[path], wanted[path]["dtype"])
        # The template's leaf is weakly typed (a Python number, or made from one): so is
        # what it loads, or ops mixing it with other dtypes promote otherwise.
        if by_path[path].shape == ():
            return jnp.asarray(by_path[path].item())
        # JAX makes no weakly typed array from data; it keeps the type of an array
        # that an update writes into.
        return jnp.zeros_like(weak[path]).at[...].set(by_path[path])

    leaves = [rebuilt(path) for path in wanted]
    values = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target), leaves)

    config_json = _checked_item(step_dir, "config", manifest)
    try:
        config = config_from_dict(config_json) if config_json else None
    except ValueError as error:  # its checksum matched: another version's config
        raise CheckpointError(
            f"the config stored in checkpoint {step_dir} is not one this version of "
            f"nnx-ppo reads: {error}"
        ) from error
    metadata = _metadata_of(step_dir, manifest)
    if isinstance(template, TrainingState):
        nnx.update(template.networks, values["networks"])
        nnx.update(template.optimizer, values["optimizer"])
        state = template.replace(
            network_states=values["network_states"],
            env_states=values["env_states"],
            rng_key=values["rng_key"],
            running_episodes=values["running_episodes"],
            steps_taken=int(manifest["steps_taken"]),
        )
        return {"training_state": state, "step": step, "config": config, "metadata": metadata}
    nnx.update(template, values["networks"])
    if optimizer is not None:
        nnx.update(optimizer, values["optimizer"])
        # 0.3.0's resume call: it returned the training state; here, without env states,
        # initial_state=None would quietly start the run over.
        warnings.warn(
            "load_checkpoint restored the network and optimizer only: its training_state "
            "is None, and train_ppo(..., initial_state=None) starts over at step 0. To "
            "resume, pass a TrainingState as the template: "
            "load_checkpoint(path, new_training_state(env, networks, n_envs, seed)).",
            stacklevel=2,
        )
    return {"training_state": None, "step": step, "config": config, "metadata": metadata}


def _restore_arrays(root: Path, step: int, abstract: list[jax.ShapeDtypeStruct]) -> list[Any]:
    import orbax.checkpoint as ocp

    manager = _manager(root, None, create=False)
    restored = manager.restore(
        step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract))
    )
    return list(restored["arrays"])
