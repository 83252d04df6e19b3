"""Checkpoints of a training run, written with Orbax (no pickle), and resuming from them.

A checkpoint holds everything a run needs to continue exactly where it stopped:
the network's NNX state (parameters, normaliser statistics, the samplers' seed
streams), the optimizer state, every env's carry (recurrent state, per-env keys),
the batched env states, the training key, the episodes in progress, the step
counter and the run's config. Typed PRNG keys are stored as their raw key data
and re-wrapped on load.

Layout: ``make_checkpoint_fn(directory)`` writes one Orbax step directory per
checkpoint under ``directory`` (``directory/<step>/``), each with three items:

- ``arrays``: every array of the state, as a list (Orbax ``StandardSave``);
- ``manifest``: JSON naming each array's path in the state, shape, dtype and key
  implementation, plus the step counter; loading compares it with the network
  it is loaded into, so a different architecture fails with the paths that
  differ;
- ``config``: the :class:`~nnx_ppo.algorithms.config.TrainConfig` as JSON.

Orbax writes each step into a temporary directory and renames it when complete,
so a crash mid-write leaves the previous checkpoint as the latest usable one.
Only the newest ``keep_last`` checkpoints are kept.
"""

import dataclasses
import enum
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.config import TrainConfig
from nnx_ppo.algorithms.types import LoggingLevel, TrainingState

__all__ = [
    "CHECKPOINT_SUBDIR",
    "CheckpointError",
    "config_from_dict",
    "config_to_dict",
    "find_checkpoint",
    "load_checkpoint",
    "make_checkpoint_fn",
]

CHECKPOINT_SUBDIR = "checkpoints"
"""Where a run directory keeps its checkpoints."""

_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupted, or does not fit the network."""


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
    """Rebuild a validated :class:`TrainConfig` from :func:`config_to_dict`'s output.

    Raises:
      ValueError: an unknown section or field, named in the message.
    """
    defaults = TrainConfig()
    kwargs: dict[str, Any] = {}
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for name, value in data.items():
        if name not in known:
            raise ValueError(f"unknown config section or field {name!r}; known: {sorted(known)}")
        current: Any = getattr(defaults, name)
        if (
            isinstance(value, dict)
            and dataclasses.is_dataclass(current)
            and not isinstance(current, type)
        ):
            fields = {f.name for f in dataclasses.fields(current)}
            unknown = sorted(set(value) - fields)
            if unknown:
                raise ValueError(f"unknown config fields {name}.{unknown}; known: {sorted(fields)}")
            kwargs[name] = dataclasses.replace(
                current, **{k: _decode(v, getattr(current, k)) for k, v in value.items()}
            )
        else:
            kwargs[name] = value
    return TrainConfig(**kwargs)


def _decode(value: Any, default: Any) -> Any:
    if isinstance(default, LoggingLevel) or (isinstance(value, dict) and "flags" in value):
        flags = LoggingLevel(0)
        for name in value["flags"]:
            flags |= LoggingLevel[name]
        return flags
    if isinstance(value, list) and (default is None or isinstance(default, tuple)):
        return tuple(value)
    return value


# ------------------------------------------------------------------------ flattening


def _snapshot(state: TrainingState) -> dict[str, Any]:
    """The arrays of a training state, as one pytree (the network in NNX state form)."""
    return {
        "networks": nnx.state(state.networks),
        "optimizer": nnx.state(state.optimizer),
        "network_states": state.network_states,
        "env_states": state.env_states,
        "rng_key": state.rng_key,
        "running_episodes": state.running_episodes,
    }


def _is_key(leaf: Any) -> bool:
    return jnp.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key)


def _flatten(tree: Any) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """The arrays Orbax stores, and a manifest entry for every leaf.

    Orbax cannot store zero-size arrays (simulator states hold some); they are
    described in the manifest only and rebuilt empty on load.
    """
    arrays: list[np.ndarray] = []
    entries: list[dict[str, Any]] = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key_impl = str(jax.random.key_impl(leaf)) if _is_key(leaf) else None
        array = np.asarray(jax.random.key_data(leaf) if key_impl else leaf)
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
            }
        )
    return arrays, entries


def _describe(entry: dict[str, Any]) -> str:
    return f"shape {tuple(entry['shape'])} {entry['dtype']}"


# ------------------------------------------------------------------------------ save


def _manager(directory: Path, keep_last: int | None, create: bool) -> Any:
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep_last, create=create, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(directory.absolute(), options=options)


def make_checkpoint_fn(
    directory: str | Path, config: TrainConfig | None = None, *, keep_last: int = 3
) -> Callable[[TrainingState, int], None]:
    """A ``checkpoint_fn`` for :func:`~nnx_ppo.algorithms.ppo.train_ppo` writing Orbax checkpoints.

    Args:
      directory: where the step directories go (created if missing).
      config: stored with every checkpoint, so a run can be resumed from it alone.
      keep_last: how many of the newest checkpoints to keep.

    A step already on disk is not written again (a resumed run passes its
    starting step first).

    Example::

        train_ppo(env, networks, config, checkpoint_fn=make_checkpoint_fn("runs/a", config))
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"make_checkpoint_fn: keep_last must be a positive int, got {keep_last!r}")
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(
            f"make_checkpoint_fn: config must be a TrainConfig, got a {type(config).__name__}; "
            "wrap a PPOConfig as TrainConfig(ppo=...)"
        )
    root = Path(directory)
    config_json = config_to_dict(config) if config is not None else {}
    manager = _manager(root, keep_last, create=True)

    def checkpoint_fn(training_state: TrainingState, step: int) -> None:
        import orbax.checkpoint as ocp

        if int(step) in manager.all_steps():
            return  # resuming from it, or a final save right after a periodic one
        arrays, entries = _flatten(_snapshot(training_state))
        manifest = {
            "format": _FORMAT,
            "steps_taken": int(training_state.steps_taken),
            "leaves": entries,
        }
        manager.save(
            int(step),
            args=ocp.args.Composite(
                arrays=ocp.args.StandardSave(arrays),
                manifest=ocp.args.JsonSave(manifest),
                config=ocp.args.JsonSave(config_json),
            ),
            force=True,
        )
        manager.wait_until_finished()

    return checkpoint_fn


# ------------------------------------------------------------------------------ load


def find_checkpoint(path: str | Path, step: int | None = None) -> tuple[Path, int]:
    """Resolve a run directory, a checkpoint directory or one step directory.

    Returns the checkpoint root and the step: ``step`` if given, else the step of
    a step directory, else the latest complete checkpoint.

    Raises:
      CheckpointError: nothing usable there; the message says what was looked for.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint: {path} does not exist")
    if (path / CHECKPOINT_SUBDIR).is_dir():
        path = path / CHECKPOINT_SUBDIR
    if step is None and path.name.isdigit() and (path / "manifest").exists():
        return path.parent, int(path.name)
    steps = sorted(int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit())
    if not steps:
        raise CheckpointError(
            f"no checkpoint in {path}: expected step directories (e.g. {path / '100000'}) "
            f"written by make_checkpoint_fn"
        )
    if step is None:
        return path, steps[-1]
    if step not in steps:
        raise CheckpointError(f"no checkpoint for step {step} in {path}; it has steps {steps}")
    return path, step


def _read_json(step_dir: Path, item: str) -> Any:
    candidates = [step_dir / item / "metadata", *sorted((step_dir / item).glob("*.json"))]
    for candidate in candidates:
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except json.JSONDecodeError as error:
                raise CheckpointError(
                    f"checkpoint {step_dir} is corrupted: its {item} is not valid JSON ({error})"
                ) from error
    raise CheckpointError(
        f"checkpoint {step_dir} is incomplete or corrupted: its {item} is missing"
    )


def _compare(saved: dict[str, dict[str, Any]], wanted: dict[str, dict[str, Any]]) -> None:
    missing = [p for p in wanted if p not in saved]
    unexpected = [p for p in saved if p not in wanted]
    problems = []
    if missing:
        problems.append("missing from the checkpoint: " + ", ".join(missing[:5]))
    if unexpected:
        problems.append("in the checkpoint but not in the network: " + ", ".join(unexpected[:5]))
    for path, entry in wanted.items():
        if path in saved and (
            saved[path]["shape"] != entry["shape"] or saved[path]["dtype"] != entry["dtype"]
        ):
            problems.append(
                f"{path} is {_describe(saved[path])} in the checkpoint but {_describe(entry)} here"
            )
            break
    if problems:
        raise CheckpointError(
            "the checkpoint does not fit this network (a different architecture or env?):\n  "
            + "\n  ".join(problems)
        )


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
      template: a :class:`TrainingState` of the same architecture and ``n_envs``
        (e.g. from :func:`~nnx_ppo.algorithms.ppo.new_training_state`), to resume
        training; or just the network (with ``optimizer`` optionally), to restore
        its parameters and statistics for evaluation. Modules are updated in place.
      optimizer: with a network ``template``, an optimizer to restore as well.
      step: a specific step instead of the latest.

    Returns:
      ``{"training_state": TrainingState | None, "step": int, "config": TrainConfig | None}``;
      ``training_state`` is ``None`` when only a network was given.

    Raises:
      CheckpointError: the checkpoint is missing, incomplete or corrupted, or its
        arrays do not fit the template (the message names the paths that differ).
    """
    root, step = find_checkpoint(path, step)
    step_dir = root / str(step)
    manifest = _read_json(step_dir, "manifest")
    if manifest.get("format") != _FORMAT or "leaves" not in manifest:
        raise CheckpointError(f"checkpoint {step_dir} has an unknown manifest format")
    saved = {entry["path"]: entry for entry in manifest["leaves"]}

    if isinstance(template, TrainingState):
        target: dict[str, Any] = _snapshot(template)
    else:
        target = {"networks": nnx.state(template)}
        if optimizer is not None:
            target["optimizer"] = nnx.state(optimizer)
    _, entries = _flatten(target)
    wanted = {entry["path"]: entry for entry in entries}
    prefixes = tuple(f"[{name!r}]" for name in target)
    _compare({p: e for p, e in saved.items() if p.startswith(prefixes)}, wanted)

    specs = {
        path: jax.ShapeDtypeStruct(tuple(e["stored_shape"]), np.dtype(e["stored_dtype"]))
        for path, e in saved.items()
    }
    stored = [path for path, spec in specs.items() if spec.size]
    try:
        restored = _restore_arrays(root, step, [specs[path] for path in stored])
    except Exception as error:
        raise CheckpointError(f"checkpoint {step_dir} could not be read: {error}") from error
    by_path = {path: np.zeros(spec.shape, spec.dtype) for path, spec in specs.items()}
    by_path |= dict(zip(stored, restored, strict=True))

    def rebuilt(path: str) -> Any:
        array = jnp.asarray(by_path[path])
        impl = saved[path]["key_impl"]
        return jax.random.wrap_key_data(array, impl=impl) if impl else array

    leaves = [rebuilt(path) for path in wanted]
    values = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target), leaves)

    config_json = _read_json(step_dir, "config")
    config = config_from_dict(config_json) if config_json else None
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
        return {"training_state": state, "step": step, "config": config}
    nnx.update(template, values["networks"])
    if optimizer is not None:
        nnx.update(optimizer, values["optimizer"])
    return {"training_state": None, "step": step, "config": config}


def _restore_arrays(root: Path, step: int, abstract: list[jax.ShapeDtypeStruct]) -> list[Any]:
    import orbax.checkpoint as ocp

    manager = _manager(root, None, create=False)
    restored = manager.restore(
        step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract))
    )
    return list(restored["arrays"])
