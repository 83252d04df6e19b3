"""The ``nnx-ppo`` command: ``train``, ``eval``, ``envs``, ``preset`` and ``check``.

``nnx-ppo train`` trains the built-in cart-pole with its preset (``nnx-ppo preset
NAME`` prints an env's preset file) and writes a run
directory (see :mod:`nnx_ppo.cli.run_dir`); ``--env``, ``--config`` and ``--set``
choose another env or change the preset, ``--resume RUN_DIR`` continues a run
from its latest checkpoint. Ctrl-C or SIGTERM finishes the current PPO step,
writes a checkpoint and exits cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import jax
from flax import nnx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nnx_ppo.cli import check
from nnx_ppo.cli.run_dir import resume_command
from nnx_ppo.contract.arguments import as_whole
from nnx_ppo.contract.env_checks import require_env
from nnx_ppo.contract.errors import ContractError, _user_code_frame

if TYPE_CHECKING:  # the command imports the library lazily, to start fast
    from nnx_ppo.algorithms.config import TrainConfig, VideoData
    from nnx_ppo.algorithms.types import RLEnv
    from nnx_ppo.cli.run_dir import RunLogger
    from nnx_ppo.networks.types import StatefulModule

__all__ = ["main"]


def _seed(text: str) -> int:
    """An argparse type: a seed in the int64 range ``jax.random.key`` takes."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is beyond the int64 range a seed may take")
    return value


def _positive_int(text: str) -> int:
    """An argparse type: a positive integer (``1e6`` too), or a one-line usage error."""
    try:
        value = as_whole(float(text)) if "e" in text.lower() else int(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not isinstance(value, int) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nnx-ppo", description="PPO for JAX and Flax NNX with checked contracts."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a policy and write a run directory")
    train.add_argument(
        "--env",
        help="environment name (default: cartpole; see `nnx-ppo envs`), or MODULE:FACTORY for "
        "your own: what it names is called with env_kwargs and returns the env",
    )
    train.add_argument(
        "--steps",
        type=_positive_int,
        help="total environment steps (rounded up to whole PPO steps of n_envs * rollout_length)",
    )
    train.add_argument("--seed", type=_seed, help="seed of the run")
    train.add_argument(
        "--config", type=Path, action=_Once, help="a JSON or TOML file of config overrides"
    )
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set ppo.n_envs=64 (repeatable)",
    )
    # A resumed run writes into its own directory: --run-dir would go unused.
    where = train.add_mutually_exclusive_group()
    where.add_argument("--run-dir", type=Path, help="where to write the run (default: runs/...)")
    where.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue this run")
    train.add_argument("--quiet", action="store_true", help="skip the network summary at start")
    train.add_argument(
        "--devices",
        type=_positive_int,
        help="split the envs over this many devices (default: all, when there are several)",
    )
    distributed = train.add_argument_group(
        "several processes (hosts)",
        "call jax.distributed.initialize before training; with no address, JAX detects a "
        "Slurm job or a TPU pod slice itself",
    )
    distributed.add_argument(
        "--distributed", action="store_true", help="run as one of several processes"
    )
    distributed.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address")
    distributed.add_argument("--num-processes", type=_positive_int, help="how many processes")
    distributed.add_argument("--process-id", type=int, help="this process's index, from 0")

    evaluate = commands.add_parser("eval", help="evaluate a run's latest checkpoint")
    evaluate.add_argument("run_dir", type=Path)
    evaluate.add_argument(
        "--episodes", type=_positive_int, default=64, help="evaluation episodes (default: 64)"
    )
    evaluate.add_argument("--seed", type=_seed, default=0, help="seed of the episodes (default: 0)")

    commands.add_parser("envs", help="list environments with their observation/action specs")
    show_preset = commands.add_parser(
        "preset", help="print an env's preset file (TOML), to copy, edit and pass to --config"
    )
    show_preset.add_argument("name", help="an env name, or 'playground' for the generic one")
    check.add_parser(commands)
    return parser


# ----------------------------------------------------------------------------- pieces


def _make_env(run_config: dict[str, Any]) -> Any:
    from nnx_ppo import envs
    from nnx_ppo.cli.presets import is_factory_name
    from nnx_ppo.wrappers import EpisodeWrapper

    options = run_config.get("env_kwargs", {})
    if is_factory_name(run_config["env"]):
        env = _load_factory(run_config["env"])(**options)
        require_env(
            f"--env {run_config['env']}", env, name=f"what {run_config['env']}(...) returned"
        )
    else:
        backend = _chosen_impl(options) or envs.playground_backend(run_config["env"])
        if backend == "warp" or options.get("vision"):  # vision renders with Warp
            _quiet_warp()
        env = envs.make(run_config["env"], **options)
    if run_config.get("episode_length"):
        env = EpisodeWrapper(env, int(run_config["episode_length"]))
    return env


def _load_factory(name: str) -> Any:
    """The env factory ``MODULE:FACTORY`` names. An error its module raised as it was
    imported is the user's code failing, shown with its traceback (status 1), as an error
    in the factory would be; a module that is not there, or not Python, is bad input."""
    try:
        return check.load_named(name)
    except ValueError as error:
        cause = error.__cause__
        if isinstance(cause, Exception) and _user_code_frame(cause) is not None:
            raise cause from None
        raise


def _chosen_impl(env_kwargs: dict[str, Any]) -> Any:
    """The simulator backend ``env_kwargs`` choose, directly or in ``config_overrides``
    (``envs.make`` merges the two); ``None`` where they leave it to the default."""
    return env_kwargs.get("impl", (env_kwargs.get("config_overrides") or {}).get("impl"))


def _quiet_warp() -> None:
    """Keep MuJoCo Warp's compiler off the display: it prints a line per kernel module it
    loads (dozens at a run's start) unless its log level is raised; warnings still show."""
    warp: Any = importlib.import_module("warp")  # installed with Playground
    if hasattr(warp.config, "log_level"):
        warp.config.log_level = warp.LOG_WARNING
    else:  # warp before log_level
        warp.config.quiet = True


def _simulator_backend(run_config: dict[str, Any]) -> str | None:
    """The line saying which simulator backend a Playground env runs on, and why."""
    from nnx_ppo import envs

    default = envs.playground_backend(run_config["env"])
    if default is None:
        return None
    chosen = _chosen_impl(run_config.get("env_kwargs", {}))
    if chosen is not None:
        return f"simulator backend impl={chosen} (set by env_kwargs)"
    return (
        f"simulator backend impl={default} (the fastest on {jax.default_backend()}; "
        "choose another with --set env_kwargs.impl=...)"
    )


def _make_env_and_network(run_config: dict[str, Any]) -> tuple[Any, Any]:
    """The run's env and its network, built from the run config.

    The network's sizes come from tracing the env's ``reset``. An env whose options this
    backend cannot run raises ``NotImplementedError`` there (Playground's ``vision=True``
    renders with MuJoCo Warp alone): that is the options' refusal, not a bug to report.
    """
    from nnx_ppo.networks.factories import make_default_network

    network = run_config["network"]
    seed = int(run_config["train"]["seed"])
    try:
        env = _make_env(run_config)
        return env, make_default_network(
            env,
            nnx.Rngs(seed),
            kind=network["kind"],
            hidden_sizes=network["hidden_sizes"],
            activation=network["activation"],
            entropy_weight=network.get("entropy_weight"),
        )
    except NotImplementedError as error:
        if _user_code_frame(error) is not None:
            raise
        options = run_config.get("env_kwargs") or {}
        given = f" with env_kwargs {options}" if options else ""
        raise ValueError(
            f"env {run_config['env']}{given} cannot run on this machine's "
            f"{jax.default_backend()} backend: {error}"
        ) from error


def _read_run_config(run_dir: Path) -> dict[str, Any]:
    from nnx_ppo.cli.presets import merge, preset, read_utf8

    path = run_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory: it has no config.json")
    try:
        config = json.loads(read_utf8(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not (isinstance(config, dict) and isinstance(config.get("train"), dict)):
        raise ValueError(
            f"{path} is not a run configuration: it holds no 'train' table "
            f"(found {type(config).__name__} {str(config)[:60]})"
        )
    try:  # every key one the run's preset has: the file may have been edited by hand
        merge(preset(str(config.get("env") or "cartpole")), config)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return config


def _resolve_config(args: argparse.Namespace) -> dict[str, Any]:
    """The run configuration: a preset (or the resumed run's), then the file, then
    ``--set``, then the flags (``--env``, ``--steps``, ``--seed``, ``--devices``), each
    overriding what came before; a flag and a ``--set`` of the same key must agree.

    Cadences nobody set follow the run's length, a resumed run's new length too.
    """
    from nnx_ppo.cli.presets import (
        apply_override,
        cadences_set_by_hand,
        follow_run_length,
        leaf_keys,
        lookup,
        merge,
        parse_override,
        preset,
        read_config_file,
    )

    file_config = read_config_file(args.config) if args.config else {}
    given = set(leaf_keys(file_config))
    if args.resume is not None:
        resumed = _read_run_config(args.resume)
        given |= cadences_set_by_hand(resumed)
        config = merge(resumed, file_config)  # an --env not the run's is refused later
    else:
        # The env picks the preset, so a --set env=... is read before the preset is.
        set_env = [
            value
            for parts, value in (parse_override(preset("cartpole"), a) for a in args.overrides)
            if parts == ["env"]
        ]
        env_name = args.env or (set_env[-1] if set_env else None) or file_config.get("env")
        env_name = str(env_name or "cartpole")
        config = merge(preset(env_name), file_config)
        config["env"] = env_name
    set_on_command_line: set[str] = set()
    for assignment in args.overrides:
        parts, value = parse_override(config, assignment)
        config = apply_override(config, assignment)
        key = ".".join(parts)
        set_on_command_line.add(key)  # an object value sets every key inside it too
        set_on_command_line.update(
            f"{key}.{leaf}" for leaf in (leaf_keys(value) if isinstance(value, dict) else ())
        )
    given |= set_on_command_line
    for flag, key, value in (
        ("--env", "env", args.env),
        ("--steps", "train.ppo.total_steps", args.steps),
        ("--seed", "train.seed", args.seed),
        ("--devices", "train.devices", args.devices),
    ):
        if value is None:
            continue
        # The config holds the last --set of the key, alone or inside an object's.
        set_value = lookup(config, key)
        if key in set_on_command_line and set_value != value:
            raise ValueError(
                f"{flag} {value} and --set {key}={json.dumps(set_value)} "
                "disagree: give the value once"
            )
        config = apply_override(config, f"{key}={json.dumps(value)}")
    return follow_run_length(config, given)


class _Once(argparse.Action):
    """An option given at most once: a second value would silently replace the first."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        earlier = getattr(namespace, self.dest, None)
        if earlier is not None:
            parser.error(
                f"{option_string} given twice ({earlier} and {values}): give one file, and "
                "the rest of the settings with --set KEY=VALUE"
            )
        setattr(namespace, self.dest, values)


class _InterruptedAgain(KeyboardInterrupt):
    """A second Ctrl-C or SIGTERM: training stops at once, without a final checkpoint."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = run_dir


class _StopFlag:
    """Set by SIGINT/SIGTERM; training polls it after every compiled call."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.signal_name: str | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.signal_name is not None:
            raise _InterruptedAgain(self.run_dir)  # a second Ctrl-C stops at once
        self.signal_name = signal.Signals(signum).name

    def is_set(self) -> bool:
        return self.signal_name is not None


# ------------------------------------------------------------------------------ train


def _start_distributed(args: argparse.Namespace) -> None:
    """``jax.distributed.initialize`` with the command's options, before JAX starts."""
    given = (args.coordinator, args.num_processes, args.process_id)
    if not args.distributed and all(option is None for option in given):
        return
    if args.coordinator is not None:
        host, _, port = args.coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--coordinator takes HOST:PORT, got {args.coordinator!r}")
    try:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    except ValueError as error:
        raise ValueError(
            "the distributed runtime could not start: outside a cluster JAX detects (Slurm, "
            "a TPU pod) give --coordinator HOST:PORT, --num-processes N and --process-id I "
            f"({error})"
        ) from error


def _planned_steps(total_steps: int, start_step: int, per_step: int) -> tuple[int, str]:
    """The step a run from ``start_step`` ends at, and how the summary says it was rounded.

    Whole PPO steps of ``per_step`` from ``start_step``: a resumed run's steps may be of
    another size than those before it.
    """
    planned = start_step + -(-max(total_steps - start_step, 0) // per_step) * per_step
    if planned in (total_steps, start_step):
        return planned, ""
    since = f" from step {start_step:,}" if start_step else ""
    return planned, f" ({total_steps:,} rounded up to whole PPO steps of {per_step:,}{since})"


def _train(args: argparse.Namespace, console: Console) -> int:
    from nnx_ppo.algorithms import sharding
    from nnx_ppo.cli.presets import parse_run_config
    from nnx_ppo.cli.run_dir import LOCK_FILE, hold_run_lock

    _start_distributed(args)
    if jax.process_index() != 0:  # process 0 alone prints and writes the run directory
        console = Console(quiet=True, emoji=False)
    # Everything a config error can stop happens before the run directory exists.
    run_config, train_config = parse_run_config(_resolve_config(args))
    try:
        mesh = sharding.resolve_mesh(train_config.devices)  # more devices than there are
    except ValueError as error:
        if args.resume is None or args.devices is not None:
            raise
        raise ValueError(
            f"{error} (devices = {train_config.devices} is the run's, from "
            f"{Path(args.resume) / 'config.json'}; resume on another count with --devices N)"
        ) from error
    ppo = train_config.ppo
    eval_envs = train_config.eval.n_envs if train_config.eval.enabled else None
    sharding.require_divisible("train", mesh, ppo.n_envs, ppo.n_minibatches, eval_envs)
    env, network = _make_env_and_network(run_config)
    _require_advantage_per_action(env, network, ppo.combine_advantages)
    if train_config.video.enabled:
        _require_rendering(env, run_config["env"], train_config.video.render_kwargs)
    if args.resume is not None:
        run_dir = args.resume
        _refuse_changed_settings(run_dir, run_config)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = args.run_dir or Path("runs") / f"{run_config['env']}-{stamp}"
        _refuse_foreign_directory(run_dir)
    from nnx_ppo.algorithms.checkpointing import CHECKPOINT_SUBDIR, _require_globless_directory

    _require_globless_directory("nnx-ppo train", run_dir / CHECKPOINT_SUBDIR)
    if jax.process_index() != 0:
        return _train_locked(args, console, run_dir, run_config, train_config, env, network)
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as held:
        with _writing(run_dir / LOCK_FILE, run_dir):
            held.enter_context(hold_run_lock(run_dir))
        return _train_locked(args, console, run_dir, run_config, train_config, env, network)


def _require_advantage_per_action(env: RLEnv, network: StatefulModule, combine: bool) -> None:
    """A reward tree that leaves one of the network's actions without an advantage stops
    training at its first PPO step: found here, from shapes alone, before the run
    directory exists."""
    from flax import nnx

    from nnx_ppo.algorithms._loss import require_advantage_per_action
    from nnx_ppo.contract.env_checks import single_state_shapes

    state = single_state_shapes(env)
    obs = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((1, *leaf.shape), leaf.dtype), state.obs)
    output = nnx.eval_shape(lambda net, x: net(net.initialize_state(1), x).output, network, obs)
    try:
        require_advantage_per_action("nnx-ppo train", state.reward, output.loglikelihoods, combine)
    except ValueError as error:  # its advice names the Python API
        raise ValueError(
            f"{error} On the command line: --set ppo.combine_advantages=true"
        ) from None


def _refuse_foreign_directory(run_dir: Path) -> None:
    """A new run's directory is new, empty, or an earlier run's that never checkpointed."""
    from nnx_ppo.cli.run_dir import LOCK_FILE

    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--run-dir {run_dir} is a file: choose a directory (new or empty)")
    if not run_dir.is_dir() or all(entry.name == LOCK_FILE for entry in run_dir.iterdir()):
        return
    try:
        _read_run_config(run_dir)
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(
            f"--run-dir {run_dir} holds files of something else ({error}); a run writes "
            "config.json and more there, so choose a new or empty directory"
        ) from error


def _refuse_changed_settings(run_dir: Path, run_config: dict[str, Any]) -> None:
    """The settings fixed on resume are the run's: those its newest checkpoint was written
    with, where it stored them, else its ``config.json``'s."""
    from nnx_ppo.cli.presets import changed_on_resume, fixed_on_resume, parse_run_config

    in_file, _ = parse_run_config(_read_run_config(run_dir))
    checkpointed = _checkpointed_run_config(run_dir)
    changed = changed_on_resume(checkpointed or in_file, run_config)
    if changed:
        edited = checkpointed is not None and changed_on_resume(checkpointed, in_file)
        raise ValueError(
            f"cannot resume {run_dir} with other settings: {'; '.join(changed)}"
            + (
                f" ({run_dir / 'config.json'} was changed after the newest checkpoint was "
                "written; the run's values are the checkpoint's)"
                if edited
                else ""
            )
            + f". These shape the saved state and may not change on resume: "
            f"{fixed_on_resume()}; start a new run instead"
        )


def _checkpointed_run_config(run_dir: Path) -> dict[str, Any] | None:
    """The run configuration the newest checkpoint was written with, where it stored one."""
    from nnx_ppo.algorithms.checkpointing import NoCheckpointError, read_metadata

    try:
        return (read_metadata(run_dir) or {}).get("run_config")
    except NoCheckpointError:
        return None


def _refuse_changed_since_checkpoint(
    run_dir: Path,
    saved: dict[str, Any],
    run_config: dict[str, Any],
    keys: Sequence[str],
    checkpoint: str,
) -> None:
    """``config.json`` edited by hand since ``checkpoint`` was written with the ``saved``
    configuration: ``keys`` (of the settings fixed on resume) must be the same."""
    from nnx_ppo.cli.presets import changed_on_resume

    changed = changed_on_resume(saved, run_config, keys)
    if changed:
        raise ValueError(
            f"{run_dir / 'config.json'} was changed after {checkpoint} was written: "
            f"{'; '.join(changed)}. The checkpoint holds what the run's own settings made: "
            "put them back in config.json (or start a new run for new ones)"
        )


def _warn_of_lost_records(path: Path, checkpoint_step: int) -> None:
    """A run logs every step before it checkpoints it, so ``metrics.jsonl`` ends at or
    after the checkpoint resumed from; one ending before it was cut or replaced."""
    from nnx_ppo.cli.run_dir import iter_metrics

    last = max((record["step"] for _, record in iter_metrics(path)), default=None)
    if last is not None and last >= checkpoint_step:
        return
    held = "holds no records" if last is None else f"ends at step {last:,}"
    Console(stderr=True, emoji=False).print(
        f"[yellow]warning:[/yellow] {escape(str(path))} {held}, but the checkpoint resumed "
        f"from is at step {checkpoint_step:,}: the records up to it were lost (the file "
        "was cut or replaced by an older copy), and the learning curve has a gap there",
        soft_wrap=True,
    )


def _train_locked(
    args: argparse.Namespace,
    console: Console,
    run_dir: Path,
    run_config: dict[str, Any],
    train_config: TrainConfig,
    env: RLEnv,
    network: StatefulModule,
) -> int:
    from nnx_ppo.algorithms.callbacks import gif_video_fn
    from nnx_ppo.algorithms.checkpointing import (
        CHECKPOINT_SUBDIR,
        CheckpointError,
        NoCheckpointError,
        config_to_dict,
        find_checkpoint,
        load_checkpoint,
        make_checkpoint_fn,
    )
    from nnx_ppo.algorithms.ppo import new_training_state, train_ppo
    from nnx_ppo.cli.native_output import SimulatorWarnings
    from nnx_ppo.cli.presets import FIXED_ON_RESUME
    from nnx_ppo.cli.progress import TrainingProgress
    from nnx_ppo.cli.run_dir import RunLogger, iter_metrics, trim_metrics, write_atomically
    from nnx_ppo.networks.network_summary import print_summary

    try:
        find_checkpoint(run_dir)
        has_checkpoint = True
    except NoCheckpointError:
        has_checkpoint = False
    if args.resume is None and has_checkpoint:
        raise ValueError(
            f"{run_dir} already holds a run; continue it with {resume_command(run_dir)}, or "
            "choose another --run-dir"
        )
    ppo_config = train_config.ppo
    initial_state = None
    start_step = 0
    if has_checkpoint:
        template = new_training_state(
            env,
            network,
            ppo_config.n_envs,
            train_config.seed,
            ppo_config.optimizer_learning_rate(),
            ppo_config.gradient_clipping,
            ppo_config.weight_decay,
        )
        loaded = load_checkpoint(run_dir, template)
        # A checkpoint that stored no run configuration (written by an earlier version)
        # has its train config: config.json's is compared with that.
        if loaded["metadata"] is None and loaded["config"] is not None:
            saved = run_config | {"train": config_to_dict(loaded["config"])}
            step = f"the checkpoint at step {loaded['step']:,}"
            _refuse_changed_since_checkpoint(run_dir, saved, run_config, FIXED_ON_RESUME, step)
        initial_state = loaded["training_state"]
        start_step = initial_state.steps_taken
        if start_step >= ppo_config.total_steps:
            console.print(
                f"{escape(str(run_dir))} is complete: trained for {start_step:,} of "
                f"{ppo_config.total_steps:,} steps. Train it further with "
                f"{escape(resume_command(run_dir))} --steps N (N > {start_step:,})",
                soft_wrap=True,
            )
            return 0
        console.print(f"resuming {escape(str(run_dir))} from step {start_step:,}", soft_wrap=True)
    else:
        metrics = iter_metrics(run_dir / "metrics.jsonl")
        logged = max((record["step"] for _, record in metrics), default=0)
        if logged > 0:
            doing = "resuming" if args.resume is not None else "a new run there"
            raise ValueError(
                f"{run_dir} has no usable checkpoint, but its metrics.jsonl holds records up "
                f"to step {logged:,}: {doing} would start the run over and drop them. "
                "Restore its checkpoints, or start a new run with another --run-dir"
            )
        if args.resume is not None:
            console.print(
                f"{escape(str(run_dir))} has no checkpoint yet: starting it from step 0",
                soft_wrap=True,
            )

    primary = jax.process_index() == 0
    # train_ppo logs again from the step after a checkpoint past 0, and from step 0 itself
    # otherwise (a run without a checkpoint, or resumed from the one at step 0).
    logged_until = start_step if start_step > 0 else -1
    if primary:
        if start_step > 0:
            _warn_of_lost_records(run_dir / "metrics.jsonl", start_step)
        # Only now, with the checkpoint loaded and the metrics read, does the config change.
        with _writing(run_dir / "metrics.jsonl", run_dir):
            trim_metrics(run_dir / "metrics.jsonl", logged_until)
        with _writing(run_dir / "config.json", run_dir):
            write_atomically(run_dir / "config.json", json.dumps(run_config, indent=2) + "\n")
    checkpoint_fn = make_checkpoint_fn(
        run_dir / CHECKPOINT_SUBDIR, train_config, metadata={"run_config": run_config}
    )
    per_step = ppo_config.steps_per_iteration
    planned, rounded = _planned_steps(ppo_config.total_steps, start_step, per_step)
    if not args.quiet:
        print_summary(network, jax.eval_shape(env.reset, jax.random.key(0)).obs, console)
    console.print(
        f"training [bold]{escape(run_config['env'])}[/bold] to {planned:,} steps{rounded} on "
        f"{jax.default_backend()}, run directory {escape(str(run_dir))}",
        soft_wrap=True,
    )
    backend = _simulator_backend(run_config)
    if backend is not None:
        console.print(backend, soft_wrap=True, highlight=False)
    video_fn = None
    eval_env = env
    if train_config.video.enabled:
        eval_env = _quiet_render(env)
        # Every process records (the recording is one program over all of them); process 0
        # alone writes the files.
        video_fn = gif_video_fn(run_dir / VIDEO_SUBDIR, _frames_per_second(env))
        if not primary:
            video_fn = _discard_video
    stop = _StopFlag(run_dir)
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    logger = RunLogger(run_dir) if primary else None
    simulator_log = _log_simulator_warnings(run_dir) if primary else None
    trained = False
    try:
        with (
            SimulatorWarnings() as simulator,
            TrainingProgress(planned, console, start_step) as progress,
        ):
            if primary:
                progress.remember(r for _, r in iter_metrics(run_dir / "metrics.jsonl"))

            def log_fn(metrics: dict[str, float], step: int) -> None:
                if logger is not None:
                    logger(metrics, step)
                progress.update(metrics, step)

            try:
                result = train_ppo(
                    env,
                    network,
                    train_config,
                    log_fn=log_fn,
                    checkpoint_fn=checkpoint_fn,
                    video_fn=video_fn,
                    eval_env=eval_env,
                    initial_state=initial_state,
                    should_stop=stop.is_set,
                )
            except FloatingPointError as error:
                raise _Diverged(str(error), run_dir) from error
            except jax.errors.JaxRuntimeError as error:
                if jax.process_count() == 1:
                    raise _CallFailed(str(error), run_dir) from error
                raise _ProcessLost(str(error), run_dir) from error
            except (OSError, CheckpointError) as error:
                if _user_code_frame(error) is not None:
                    raise
                # The run's logs or checkpoints could not be written (a full disk, a
                # folder made read-only): the run stopped, its input was fine.
                message = str(error)
                if "--resume" not in message:  # the log writer's own names the command
                    message = f"{message}. {_what_is_kept(run_dir)}"
                raise _WriteFailed(message, run_dir) from error
        trained = True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if simulator_log is not None:
            _SIMULATOR_LOGGER.removeHandler(simulator_log)
            simulator_log.close()
        if logger is not None:
            _close_logger(logger, raise_errors=trained)
            _plot(run_dir, run_config["env"])
    checkpointed = train_config.checkpoint_every_steps > 0
    checkpoint = f"step {result.total_steps:,}" if checkpointed else "none (checkpoints are off)"
    extra = {"run directory": str(run_dir), "checkpoint": checkpoint}
    if video_fn is not None:
        extra["videos"] = str(run_dir / VIDEO_SUBDIR)
    if backend is not None or simulator.count:
        where = f" (logged in {run_dir / SIMULATOR_LOG})" if simulator.count else ""
        extra["simulator warnings"] = f"{simulator.count:,}{where}"
    if stop.is_set() and result.total_steps < planned:
        resume = f"; resume with {resume_command(run_dir)}" if checkpointed else ""
        extra["stopped by"] = f"{stop.signal_name}{resume}"
    console.print(progress.summary(extra))
    return 0


VIDEO_SUBDIR = "videos"
"""The run directory's folder of recorded episodes, ``step_0000000000.gif`` etc."""


def _frames_per_second(env: RLEnv) -> float:
    """The env's real-time rate, ``1 / env.dt`` (a NumPy or JAX scalar too); 30 for an
    env without a positive time step."""
    dt = getattr(env, "dt", None)
    seconds = math.nan
    if not isinstance(dt, bool):
        with contextlib.suppress(TypeError, ValueError):
            seconds = float(dt)  # pyright: ignore[reportArgumentType]
    return 1.0 / seconds if math.isfinite(seconds) and seconds > 0 else 30.0


def _discard_video(video: VideoData) -> None:
    del video


def _require_rendering(env: RLEnv, name: str, render_kwargs: dict[str, Any]) -> None:
    """Render a reset state once: a run whose videos cannot be drawn stops before its
    run directory exists, not at its first recording."""
    render = getattr(env, "render", None)
    if not callable(render):
        raise ValueError(
            f"video.enabled is true, but {name} cannot render (it has no render method): "
            "record videos of an env that can, such as MuJoCo Playground's"
        )
    state = jax.jit(env.reset)(jax.random.key(0))
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            render([state], **render_kwargs)
    except Exception as error:  # whatever the renderer raises, named in the message
        raise ValueError(
            f"video.enabled is true, but rendering {name} failed: {type(error).__name__}: "
            f"{error}. On a machine without a display MuJoCo renders with MUJOCO_GL=egl "
            "(or osmesa); or leave video off"
        ) from error


def _quiet_render(env: RLEnv) -> RLEnv:
    """``env`` whose ``render`` prints nothing (Playground's draws a progress bar)."""
    from nnx_ppo.wrappers import Wrapper

    class QuietRender(Wrapper):
        def render(self, trajectory: list[Any], **render_kwargs: Any) -> list[Any]:
            # The bar would break the run's progress display; the frames are all we use.
            rendering: Any = self.env  # RLEnv has no render: checked before the run started
            with contextlib.redirect_stderr(io.StringIO()):
                return rendering.render(trajectory, **render_kwargs)

    return QuietRender(env)


SIMULATOR_LOG = "simulator.log"
"""The run directory's log of the simulator warnings a run's native code printed."""

_SIMULATOR_LOGGER = logging.getLogger("nnx_ppo.simulator")


def _log_simulator_warnings(run_dir: Path) -> logging.Handler:
    """Send the ``nnx_ppo.simulator`` logger to the run's ``simulator.log``, not the terminal.

    The file is created at the first warning; the caller removes the handler.
    """
    handler = logging.FileHandler(run_dir / SIMULATOR_LOG, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    _SIMULATOR_LOGGER.setLevel(logging.DEBUG)
    _SIMULATOR_LOGGER.propagate = False
    _SIMULATOR_LOGGER.addHandler(handler)
    return handler


class _RunStopped(Exception):
    """Training stopped on an error; the run's checkpoints are intact."""

    def __init__(self, message: str, run_dir: Path) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class _Diverged(_RunStopped):
    """Training diverged."""


class _ProcessLost(_RunStopped):
    """A collective of a multi-process run failed: another process most likely stopped."""


class _WriteFailed(_RunStopped):
    """The run's logs or checkpoints could not be written; the message says what is kept."""


@contextlib.contextmanager
def _writing(path: Path, run_dir: Path) -> Iterator[None]:
    """Stop the run with :class:`_WriteFailed` naming ``path`` where writing it raises
    ``OSError``: a full disk or a folder made read-only is no bad input (status 1, not 2)."""
    try:
        yield
    except OSError as error:
        raise _WriteFailed(
            f"could not write {path}: {error.strerror or error}. {_what_is_kept(run_dir)}",
            run_dir,
        ) from error


class _CallFailed(_RunStopped):
    """A compiled call failed as it ran: a host callback of the env or network raised,
    or the device ran out of memory."""


def _what_is_kept(run_dir: Path) -> str:
    """Where a run that stopped on an error goes on from: its newest checkpoint, if any."""
    from nnx_ppo.algorithms.checkpointing import (
        CheckpointError,
        NoCheckpointError,
        find_checkpoint,
    )

    try:
        _, step = find_checkpoint(run_dir)
    except NoCheckpointError:
        return f"No checkpoint was written in {run_dir} yet: start the run again"
    except CheckpointError as error:  # the newest one left damaged (a write cut short)
        return f"The run's checkpoints are not all intact: {error}"
    return (
        f"The checkpoints in {run_dir} are intact: resume from step {step:,} with "
        f"{resume_command(run_dir)}"
    )


def _exit_at_once(status: int) -> NoReturn:
    """Exit now, without Python's exit handlers: JAX's would wait at the distributed
    runtime's shutdown barrier for the lost process until its heartbeat times out
    (over a minute), then abort with a C++ stack trace."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _close_logger(logger: RunLogger, *, raise_errors: bool) -> None:
    """Close the run's logs; after a failed run, a failure here (the disk that stopped the
    run is still full) is a warning, never an error in place of the run's own."""
    try:
        logger.close()
    except OSError as error:
        if raise_errors:
            raise _WriteFailed(str(error), logger.run_dir) from error
        Console(stderr=True, emoji=False).print(
            f"[yellow]warning:[/yellow] the run's logs were not closed cleanly: "
            f"{escape(str(error))}",
            soft_wrap=True,
        )


def _plot(run_dir: Path, title: str) -> None:
    """Draw the learning curve; a failure is reported, never raised over the run's own error."""
    from nnx_ppo.cli.run_dir import plot_learning_curve

    try:
        plot_learning_curve(run_dir / "metrics.jsonl", run_dir / "learning_curve.png", title)
    except (OSError, ValueError) as error:
        Console(stderr=True, emoji=False).print(
            f"[yellow]warning:[/yellow] no learning curve drawn: {escape(str(error))}",
            soft_wrap=True,
        )


# ------------------------------------------------------------------------- eval, envs


def _evaluate(args: argparse.Namespace, console: Console) -> int:
    from nnx_ppo.algorithms.checkpointing import load_checkpoint
    from nnx_ppo.algorithms.rollout import eval_rollout
    from nnx_ppo.cli.presets import FIXED_ON_RESUME, parse_run_config

    run_config, _ = parse_run_config(_read_run_config(args.run_dir))
    checkpointed = _checkpointed_run_config(args.run_dir)
    if checkpointed is not None:  # the network is built from config.json: as it was?
        shaping = [key for key in FIXED_ON_RESUME if not key.startswith("train.")]
        newest = "the newest checkpoint"
        _refuse_changed_since_checkpoint(args.run_dir, checkpointed, run_config, shaping, newest)
    env, network = _make_env_and_network(run_config)
    loaded = load_checkpoint(args.run_dir, network)
    network.eval()
    max_length = int(run_config["train"]["eval"]["max_episode_length"])
    metrics = eval_rollout(env, network, args.episodes, max_length, jax.random.key(args.seed))
    table = Table(title=f"{escape(run_config['env'])}: checkpoint at step {loaded['step']:,}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in sorted(metrics.items()):
        table.add_row(name, f"{float(value):.3f}")
    console.print(table)
    return 0


def _list_envs(console: Console) -> int:
    """Print every env name with its spaces.

    What an env prints while it is built stays out of the listing (offline, each of
    Playground's robot envs prints its failed download of MuJoCo Menagerie). An env
    that cannot be built is listed as unavailable with the first line of its error.
    """
    from nnx_ppo import envs
    from nnx_ppo.contract.env_checks import discrete_action_flags

    table = Table(title="environments")
    # Names whole, on any width (a pipe is 80 columns): the listing exists to give them.
    table.add_column("name", no_wrap=True, min_width=max(map(len, envs.names())))
    for column in ("observation", "action", "kind"):
        table.add_column(column)
    for name in envs.names():
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                env = envs.make(name)
        except Exception as error:  # a Playground env that fails to build is still listed
            reason = next(iter(str(error).splitlines()), type(error).__name__)
            table.add_row(name, "?", "?", f"unavailable: {reason}")
            continue
        flags = discrete_action_flags(env) if hasattr(env, "action_size") else [False]
        kind = "discrete" if all(flags) else "continuous" if not any(flags) else "mixed"
        if getattr(env, "requires_memory", False):
            kind += ", needs memory"
        spec = [str(getattr(env, attr, "?")) for attr in ("observation_size", "action_size")]
        table.add_row(name, *spec, kind)
    console.print(table)
    return 0


def _print_preset(name: str) -> int:
    """Print the preset file that ``nnx-ppo train --env name`` starts from."""
    from nnx_ppo import envs
    from nnx_ppo.cli.presets import preset_names, preset_path

    if name not in preset_names() and name not in envs.names():
        raise ValueError(
            f"no preset for {name!r}: it is neither an env (see nnx-ppo envs) nor one of the "
            f"preset files {', '.join(preset_names())}"
        )
    text = preset_path(name).read_text()
    if name not in preset_names():
        # The generic Playground preset names no env: the copy names the one asked for,
        # or `nnx-ppo train --config copy.toml` would train the default env.
        lines = text.splitlines(keepends=True)
        header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
        text = "".join([*lines[:header], f"env = {json.dumps(name)}\n", *lines[header:]])
    sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nnx-ppo`` command; returns the exit status."""
    from nnx_ppo.cli.run_dir import RunLockedError

    args = _build_parser().parse_args(argv)
    if not hasattr(sys.unraisablehook, _QUIET_MARK):  # once per process
        sys.unraisablehook = _without_closed_loop_noise(sys.unraisablehook)
    # Emoji codes off: an env or file name like "module:rocket" is printed as written.
    console = Console(emoji=False)
    # Errors are kept off stdout, which `nnx-ppo preset NAME > FILE` redirects.
    errors = Console(stderr=True, emoji=False)
    try:
        if args.command == "train":
            return _train(args, console)
        if args.command == "eval":
            return _evaluate(args, console)
        if args.command == "check":
            return check.run(args, console)
        if args.command == "preset":
            return _print_preset(args.name)
        return _list_envs(console)
    except _Diverged as error:
        _print_error(
            errors,
            f"training diverged: {error} {_what_is_kept(error.run_dir)} (e.g. with a lower "
            "--set ppo.learning_rate=...)",
        )
        return 1
    except _ProcessLost as error:
        first_line = next(iter(str(error).splitlines()), "")
        _print_error(
            errors,
            f"process {jax.process_index()} of {jax.process_count()}: a collective with the "
            "run's other processes failed, most likely because one of them stopped (see its "
            f"output). JAX said: {first_line}. The checkpoints in {error.run_dir} are intact: "
            f"resume with {resume_command(error.run_dir)} and the same distributed "
            "options, on every process",
        )
        _exit_at_once(1)
    except _WriteFailed as error:
        _print_error(errors, str(error))
        return 1
    except _CallFailed as error:
        # JAX's message holds the callback's own traceback, if one raised: its last line
        # is the callback's error.
        traceback.print_exception(error.__cause__ or error)
        said = [line for line in str(error).splitlines() if line.strip()]
        _print_error(
            errors,
            f"a compiled training call failed as it ran (a callback in your env or network "
            f"that raised, or the device out of memory: see above). JAX said: "
            f"{said[-1] if said else type(error.__cause__).__name__}. "
            f"{_what_is_kept(error.run_dir)}",
        )
        return 1
    except ContractError as error:
        # Raised by the checks after the env's or network's own code returned: it names
        # that code (the built-in envs and presets keep the contract), not bad input.
        _print_error(errors, f"your env or network broke the nnx-ppo contract: {error}")
        return 1
    except _InterruptedAgain as error:  # a second Ctrl-C: stop at once, without a traceback
        _print_error(
            errors,
            "interrupted again: stopped at once, without waiting for a final checkpoint. "
            f"{_what_is_kept(error.run_dir)}",
        )
        return 130
    except KeyboardInterrupt:  # before a run's first step, or in another command
        _print_error(errors, f"interrupted: nnx-ppo {args.command} stopped at once")
        return 130
    except Exception as error:
        where = _user_code_frame(error)
        if where is None:
            if isinstance(error, ValueError | TypeError | OSError | ImportError | RunLockedError):
                _print_error(errors, str(error))  # the library's own refusal of bad input
                return 2
            raise  # a bug in nnx-ppo: Python's own traceback, to report
        # A bug in the user's env or module, of any type: the whole traceback, as Python
        # would show it.
        traceback.print_exception(error)
        _print_error(errors, f"{type(error).__name__} raised in your code at {where}: {error}")
        return 1


def _without_closed_loop_noise(
    hook: Callable[[Any], object],
) -> Callable[[Any], object]:
    """``hook``, minus the "Event loop is closed" errors of Orbax's array store.

    When reading a damaged checkpoint fails, Orbax closes its event loop while the
    store's callbacks are still due; each then reports an unraisable ``RuntimeError``,
    a dozen tracebacks around the one ``error:`` line that says what happened.
    """

    def filtered(unraisable: Any) -> None:
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        hook(unraisable)

    setattr(filtered, _QUIET_MARK, True)
    return filtered


_QUIET_MARK = "_nnx_ppo_without_closed_loop_noise"


def _print_error(console: Console, message: str) -> None:
    console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
