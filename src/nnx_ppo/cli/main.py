"""The ``nnx-ppo`` command: ``train``, ``eval``, ``envs`` and ``check``.

``nnx-ppo train`` trains the built-in cart-pole with its preset and writes a run
directory (see :mod:`nnx_ppo.cli.run_dir`); ``--env``, ``--config`` and ``--set``
choose another env or change the preset, ``--resume RUN_DIR`` continues a run
from its latest checkpoint. Ctrl-C or SIGTERM finishes the current PPO step,
writes a checkpoint and exits cleanly.
"""

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import jax
from flax import nnx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nnx_ppo.cli import check

__all__ = ["main"]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nnx-ppo", description="PPO for JAX and Flax NNX with checked contracts."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a policy and write a run directory")
    train.add_argument("--env", help="environment name (default: cartpole; see `nnx-ppo envs`)")
    train.add_argument("--steps", type=int, help="total environment steps")
    train.add_argument("--seed", type=int, help="seed of the run")
    train.add_argument("--config", type=Path, help="a JSON or TOML file of config overrides")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set ppo.n_envs=64 (repeatable)",
    )
    train.add_argument("--run-dir", type=Path, help="where to write the run (default: runs/...)")
    train.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue this run")
    train.add_argument("--quiet", action="store_true", help="skip the network summary at start")

    evaluate = commands.add_parser("eval", help="evaluate a run's latest checkpoint")
    evaluate.add_argument("run_dir", type=Path)
    evaluate.add_argument("--episodes", type=int, default=64, help="evaluation episodes")
    evaluate.add_argument("--seed", type=int, default=0)

    commands.add_parser("envs", help="list environments with their observation/action specs")
    check.add_parser(commands)
    return parser


# ----------------------------------------------------------------------------- pieces


def _make_env(run_config: dict[str, Any]) -> Any:
    from nnx_ppo import envs
    from nnx_ppo.wrappers import EpisodeWrapper

    env = envs.make(run_config["env"])
    if run_config.get("episode_length"):
        env = EpisodeWrapper(env, int(run_config["episode_length"]))
    return env


def _make_network(env: Any, run_config: dict[str, Any]) -> Any:
    from nnx_ppo.networks.factories import make_default_network

    network = run_config["network"]
    seed = int(run_config["train"]["seed"])
    return make_default_network(
        env,
        nnx.Rngs(seed),
        kind=network.get("kind", "auto"),
        hidden_sizes=network.get("hidden_sizes", (64, 64)),
        activation=network.get("activation", "tanh"),
    )


def _resolve_config(args: argparse.Namespace) -> dict[str, Any]:
    from nnx_ppo.cli.presets import apply_override, merge, preset, read_config_file

    if args.resume is not None:
        config = json.loads((args.resume / "config.json").read_text())
    else:
        file_config = read_config_file(args.config) if args.config else {}
        env_name = args.env or file_config.get("env") or "cartpole"
        config = merge(preset(env_name), file_config)
        config["env"] = env_name
    for assignment in args.overrides:
        config = apply_override(config, assignment)
    if args.steps is not None:
        config["train"]["ppo"]["total_steps"] = args.steps
    if args.seed is not None:
        config["train"]["seed"] = args.seed
    return config


class _StopFlag:
    """Set by SIGINT/SIGTERM; training polls it after every PPO step."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.signal_name is not None:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.signal_name = signal.Signals(signum).name

    def is_set(self) -> bool:
        return self.signal_name is not None


# ------------------------------------------------------------------------------ train


def _train(args: argparse.Namespace, console: Console) -> int:
    from nnx_ppo.algorithms.checkpointing import (
        CHECKPOINT_SUBDIR,
        config_from_dict,
        load_checkpoint,
        make_checkpoint_fn,
    )
    from nnx_ppo.algorithms.ppo import new_training_state, train_ppo
    from nnx_ppo.cli.progress import TrainingProgress
    from nnx_ppo.cli.run_dir import RunLogger, plot_learning_curve
    from nnx_ppo.networks.network_summary import print_summary

    run_config = _resolve_config(args)
    train_config = config_from_dict(run_config["train"])
    if args.resume is not None:
        run_dir = args.resume
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = args.run_dir or Path("runs") / f"{run_config['env']}-{stamp}"
    if args.resume is None and (run_dir / CHECKPOINT_SUBDIR).exists():
        raise ValueError(
            f"{run_dir} already holds a run; continue it with --resume {run_dir}, or choose "
            "another --run-dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(run_config, indent=2) + "\n")

    env = _make_env(run_config)
    network = _make_network(env, run_config)
    if not args.quiet:
        print_summary(network, jax.eval_shape(env.reset, jax.random.key(0)).obs, console)
    initial_state = None
    if args.resume is not None:
        template = new_training_state(
            env,
            network,
            train_config.ppo.n_envs,
            train_config.seed,
            train_config.ppo.learning_rate,
            train_config.ppo.gradient_clipping,
            train_config.ppo.weight_decay,
        )
        initial_state = load_checkpoint(run_dir, template)["training_state"]
        console.print(f"resuming {run_dir} from step {initial_state.steps_taken:,}")

    checkpoint_fn = make_checkpoint_fn(run_dir / CHECKPOINT_SUBDIR, train_config)
    stop = _StopFlag()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    logger = RunLogger(run_dir)
    console.print(
        f"training [bold]{run_config['env']}[/bold] for {train_config.ppo.total_steps:,} steps "
        f"({jax.default_backend()}), run directory {run_dir}"
    )
    try:
        start_step = initial_state.steps_taken if initial_state is not None else 0
        with TrainingProgress(train_config.ppo.total_steps, console, start_step) as progress:

            def log_fn(metrics: dict[str, float], step: int) -> None:
                logger(metrics, step)
                progress.update(metrics, step)

            result = train_ppo(
                env,
                network,
                train_config,
                log_fn=log_fn,
                checkpoint_fn=checkpoint_fn,
                initial_state=initial_state,
                should_stop=stop.is_set,
            )
            checkpoint_fn(result.training_state, result.total_steps)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logger.close()
        plot_learning_curve(
            run_dir / "metrics.jsonl", run_dir / "learning_curve.png", run_config["env"]
        )
    extra = {"run directory": str(run_dir), "checkpoint": f"step {result.total_steps:,}"}
    if stop.is_set():
        extra["stopped by"] = f"{stop.signal_name}; resume with nnx-ppo train --resume {run_dir}"
    console.print(progress.summary(extra))
    return 0


# ------------------------------------------------------------------------- eval, envs


def _evaluate(args: argparse.Namespace, console: Console) -> int:
    from nnx_ppo.algorithms.checkpointing import load_checkpoint
    from nnx_ppo.algorithms.rollout import eval_rollout

    config_path = args.run_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{args.run_dir} is not a run directory: no config.json")
    run_config = json.loads(config_path.read_text())
    env = _make_env(run_config)
    network = _make_network(env, run_config)
    loaded = load_checkpoint(args.run_dir, network)
    network.eval()
    max_length = int(run_config["train"]["eval"]["max_episode_length"])
    metrics = eval_rollout(env, network, args.episodes, max_length, jax.random.key(args.seed))
    table = Table(title=f"{run_config['env']}: checkpoint at step {loaded['step']:,}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in sorted(metrics.items()):
        table.add_row(name, f"{float(value):.3f}")
    console.print(table)
    return 0


def _list_envs(console: Console) -> int:
    from nnx_ppo import envs

    table = Table(title="environments")
    for column in ("name", "observation", "action", "kind"):
        table.add_column(column)
    for name in envs.names():
        try:
            env = envs.make(name)
        except Exception as error:  # a Playground env that fails to build is still listed
            table.add_row(name, "?", "?", f"unavailable: {error}")
            continue
        discrete = getattr(env, "discrete_actions", False)
        kind = "discrete" if discrete else "continuous"
        if getattr(env, "requires_memory", False):
            kind += ", needs memory"
        spec = [str(getattr(env, attr, "?")) for attr in ("observation_size", "action_size")]
        table.add_row(name, *spec, kind)
    console.print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nnx-ppo`` command; returns the exit status."""
    args = _build_parser().parse_args(argv)
    console = Console()
    try:
        if args.command == "train":
            return _train(args, console)
        if args.command == "eval":
            return _evaluate(args, console)
        if args.command == "check":
            return check.run(args, console)
        return _list_envs(console)
    except (ValueError, TypeError, FileNotFoundError) as error:
        console.print(
            f"[bold red]error:[/bold red] {escape(str(error))}", highlight=False, soft_wrap=True
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
