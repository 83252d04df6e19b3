"""The nnx-ppo command end to end: run directory, resume, interruption, broken checkpoints."""

import asyncio
import dataclasses
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from cli_runs import STEP, TINY, parameters, train
from flax import nnx

from nnx_ppo.algorithms.checkpointing import (
    CheckpointError,
    find_checkpoint,
    load_checkpoint,
    make_checkpoint_fn,
    step_directory,
)
from nnx_ppo.cli import main as cli_main
from nnx_ppo.cli.main import main
from nnx_ppo.cli.run_dir import read_metrics
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network


def test_train_writes_a_complete_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert train(run_dir, 1024) == 0

    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "cartpole"
    assert config["train"]["ppo"]["n_envs"] == 8
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and steps[-1] == 1024
    assert any("eval/episode_reward/mean" in r for r in records)
    assert any("losses/total/mean" in r for r in records)
    assert list(run_dir.glob("events.out.tfevents.*"))
    png = (run_dir / "learning_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert find_checkpoint(run_dir) == (run_dir / "checkpoints", 1024)


class _DrawnCartPole:
    """Cart-pole that renders: one pixel per frame, its brightness from the step's state."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.dt = np.float32(0.04)  # 25 frames per second, as a NumPy scalar

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def render(self, trajectory: list[Any], height: int, width: int) -> list[np.ndarray]:
        print("rendering: a progress bar, as Playground draws", file=sys.stderr)
        frames = [np.zeros((height, width, 3), np.uint8) for _ in trajectory]
        for frame, state in zip(frames, trajectory, strict=True):
            frame[0, 0] = int(1000 * abs(float(np.sum(state.obs)))) % 256
        return frames


class _NoDisplay(_DrawnCartPole):
    def render(self, trajectory: list[Any], height: int, width: int) -> list[np.ndarray]:
        raise RuntimeError("no OpenGL context")


def test_video_enabled_writes_a_gif_per_recording_into_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image, ImageSequence

    video = ["--set", "video.enabled=true", "--set", "video.every_steps=256",
             "--set", "video.episode_length=9",
             "--set", 'video.render_kwargs={"height": 4, "width": 5}']  # fmt: skip
    run_dir = tmp_path / "run"
    assert train(run_dir, 256, *video) == 2  # the built-in cart-pole cannot render
    assert "video.enabled is true, but cartpole cannot render" in capsys.readouterr().err
    assert not run_dir.exists()

    make_env = cli_main._make_env
    monkeypatch.setattr(cli_main, "_make_env", lambda config: _NoDisplay(make_env(config)))
    assert train(run_dir, 256, *video) == 2  # found before the run directory exists
    refused = " ".join(capsys.readouterr().err.split())
    assert "rendering cartpole failed: RuntimeError: no OpenGL context" in refused
    assert "MUJOCO_GL=egl" in refused and not run_dir.exists()

    monkeypatch.setattr(cli_main, "_make_env", lambda config: _DrawnCartPole(make_env(config)))
    assert train(run_dir, 512, *video) == 0
    shown = capsys.readouterr()
    assert "rendering" not in shown.out + shown.err  # the run's progress display stays whole
    summary = shown.out.split("run directory")[-1]
    assert "videos" in summary  # the summary's row naming the folder
    written = sorted(p.name for p in (run_dir / "videos").iterdir())
    assert written == ["step_0000000000.gif", "step_0000000256.gif", "step_0000000512.gif"]
    with Image.open(run_dir / "videos" / written[-1]) as gif:
        # Ten frames of 40 ms (1 / dt) play in 400 ms; Pillow joins equal neighbours.
        durations = [frame.info["duration"] for frame in ImageSequence.Iterator(gif)]
        assert gif.size == (5, 4) and len(durations) > 1 and sum(durations) == 400


def test_resuming_gives_the_parameters_of_an_uninterrupted_run(tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train(straight, 1024) == 0
    assert train(resumed, 512) == 0
    assert main(["train", "--resume", str(resumed), "--steps", "1024"]) == 0

    assert find_checkpoint(resumed)[1] == 1024
    # Same machine, same compiled step: bit for bit is what resuming promises.
    for a, b in zip(parameters(straight), parameters(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    resumed_steps = [r["step"] for r in read_metrics(resumed / "metrics.jsonl")]
    assert resumed_steps[-1] == 1024 and 640 in resumed_steps


def test_sigint_writes_a_checkpoint_and_the_run_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "nnx_ppo", "train", "--steps", "100000000"]
    process = subprocess.Popen(
        [*command, "--run-dir", str(run_dir), *TINY],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=os.environ | {"JAX_PLATFORMS": "cpu"},
    )
    try:
        deadline = time.monotonic() + 120
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert process.poll() is None, process.communicate()[0].decode()
            assert time.monotonic() < deadline, "training did not start within 2 minutes"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=120)[0].decode()
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert "stopped by" in output and "SIGINT" in output

    _, step = find_checkpoint(run_dir)
    last_logged = read_metrics(run_dir / "metrics.jsonl")[-1]["step"]
    assert step == last_logged and 0 < step < 100_000_000
    assert main(["train", "--resume", str(run_dir), "--steps", str(step + 256)]) == 0
    assert find_checkpoint(run_dir)[1] == step + 256


def test_a_different_architecture_is_refused_with_the_paths_that_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert train(run_dir, 256) == 0
    env = make("cartpole")
    wider = make_default_network(env, nnx.Rngs(0), hidden_sizes=[32])
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(run_dir, wider)
    message = str(error.value)
    assert "does not fit this network" in message
    assert "['linear']['bias'].value is shape (16,) float32 in the checkpoint" in message
    assert "but shape (32,) float32 here" in message

    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--set", "network.hidden_sizes=[16,16]"]) == 2
    shown = capsys.readouterr().err
    assert "network.hidden_sizes is [16] in the run, [16, 16] here" in shown
    assert "may not change on resume: env, env_kwargs, episode_length, network.kind" in shown

    # The checkpoint holds the run's keys: a new seed would reseed only the evaluations.
    assert main(["train", "--resume", str(run_dir), "--seed", "5"]) == 2
    assert "seed is 0 in the run, 5 here" in capsys.readouterr().err
    # A resumed run writes into its own directory.
    with pytest.raises(SystemExit) as exited:
        main(["train", "--resume", str(run_dir), "--run-dir", str(tmp_path / "elsewhere")])
    assert exited.value.code == 2
    assert "--run-dir: not allowed with argument --resume" in capsys.readouterr().err


def test_a_second_interrupt_stops_with_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stop = cli_main._StopFlag(Path("runs/cartpole-1"))

    def interrupted(*_: Any) -> int:
        stop(signal.SIGINT, None)
        stop(signal.SIGINT, None)  # the second Ctrl-C raises
        return 0

    monkeypatch.setattr(cli_main, "_train", interrupted)
    assert main(["train"]) == 130
    shown = capsys.readouterr()
    said = " ".join(shown.err.split())
    assert "interrupted again: stopped at once, without waiting for a final checkpoint" in said
    # What is kept, as for any run that stopped: here, nothing yet.
    assert "No checkpoint was written in runs/cartpole-1 yet: start the run again" in said
    assert "Traceback" not in shown.out + shown.err


def test_broken_checkpoints_are_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert train(run_dir, 512) == 0
    network = make_default_network(make("cartpole"), nnx.Rngs(0), hidden_sizes=[16])
    checkpoints, latest = find_checkpoint(run_dir)

    # A crash mid-write leaves Orbax's temporary directory: the previous checkpoint stays latest.
    (
        checkpoints / f"{step_directory(checkpoints, latest + 128).name}.orbax-checkpoint-tmp-1"
    ).mkdir()
    assert find_checkpoint(run_dir) == (checkpoints, latest)
    # Of a step the resumed run will not save again: Orbax alone would leave it for good.
    left = checkpoints / f"{step_directory(checkpoints, 10**6).name}.orbax-checkpoint-tmp-2"
    left.mkdir()
    load_checkpoint(run_dir, network)  # a reader (eval beside a live run) removes nothing
    assert left.is_dir()
    assert main(["train", "--resume", str(run_dir), "--steps", str(latest + 128)]) == 0
    assert not any("orbax-checkpoint-tmp" in path.name for path in checkpoints.iterdir())
    checkpoints, latest = find_checkpoint(run_dir)

    manifest = next((step_directory(checkpoints, latest) / "manifest").iterdir())
    manifest.write_text("{ truncated")
    with pytest.raises(CheckpointError, match="corrupted: its manifest is not valid JSON"):
        load_checkpoint(run_dir, network)

    previous = sorted(p for p in checkpoints.iterdir() if re.fullmatch(r"step_\d{10}", p.name))[-2]
    for item in (previous / "arrays").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="could not be read"):
        load_checkpoint(previous, network)

    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere", network)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        load_checkpoint(tmp_path, network)


def test_a_new_run_refuses_a_directory_that_holds_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert train(run_dir, 128) == 0
    capsys.readouterr()
    assert train(run_dir, 128) == 2
    shown = capsys.readouterr().err
    assert f"{run_dir} already holds a run; continue it with nnx-ppo train --resume" in shown


def test_a_checkpoint_directory_of_another_run_is_refused_not_mixed(tmp_path: Path) -> None:
    from nnx_ppo.algorithms.checkpointing import make_checkpoint_fn
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.ppo import new_training_state, train_ppo

    env = make("cartpole")
    config = TrainConfig(
        ppo=PPOConfig(n_envs=4, rollout_length=16, total_steps=128, n_minibatches=2),
        eval=EvalConfig(enabled=False),
        checkpoint_every_steps=64,
    )

    def network(seed: int) -> nnx.Module:
        return make_default_network(env, nnx.Rngs(seed), hidden_sizes=[8])

    directory = tmp_path / "checkpoints"
    first = train_ppo(env, network(0), config, checkpoint_fn=make_checkpoint_fn(directory))
    with pytest.raises(CheckpointError, match=r"holds checkpoints up to step 128, and this run.s"):
        train_ppo(env, network(1), config, checkpoint_fn=make_checkpoint_fn(directory))
    assert find_checkpoint(directory)[1] == 128
    restored = network(2)
    load_checkpoint(directory, restored)
    for kept, trained in zip(
        jax.tree.leaves(nnx.state(restored, nnx.Param)),
        jax.tree.leaves(nnx.state(first.training_state.networks, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(kept), np.asarray(trained))

    # The run's own directory, resumed from its latest step, takes its later checkpoints.
    ppo = config.ppo
    longer = dataclasses.replace(config, ppo=dataclasses.replace(ppo, total_steps=192))

    def resume(seed: int) -> tuple[Any, Any]:
        """The latest checkpoint's state, and the run resumed from it to step 192."""
        template = new_training_state(
            env, network(seed), ppo.n_envs, config.seed, ppo.learning_rate
        )
        state = load_checkpoint(directory, template)["training_state"]
        checkpoint_fn = make_checkpoint_fn(directory)
        return state, train_ppo(
            env, template.networks, longer, checkpoint_fn=checkpoint_fn, initial_state=state
        )

    state, resumed = resume(3)
    assert find_checkpoint(directory)[1] == 192
    # Passing the latest step again is a no-op for the same state, refused for another.
    make_checkpoint_fn(directory)(resumed.training_state, 192)
    with pytest.raises(CheckpointError, match="checkpoint of step 192 holds other arrays"):
        make_checkpoint_fn(directory)(state, 192)

    # A crash left step 192 incomplete, under Orbax's temporary name (a renamed step
    # directory is complete, and one that lost an item since is an error): the run
    # resumes from 128 and writes 192 anew.
    latest = step_directory(directory, 192)
    shutil.rmtree(latest / "manifest")
    latest.rename(latest.with_name(f"{latest.name}.orbax-checkpoint-tmp-1"))
    assert find_checkpoint(directory)[1] == 128
    _, again = resume(4)
    assert find_checkpoint(directory)[1] == 192
    make_checkpoint_fn(directory)(again.training_state, 192)  # the same arrays: a no-op


def test_a_resume_that_would_lose_the_runs_history_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert train(run_dir, 256) == 0
    metrics = (run_dir / "metrics.jsonl").read_text()
    config = (run_dir / "config.json").read_text()

    # A broken line before the last: refused, and neither file changes.
    lines = metrics.splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text("".join([lines[0], "{ broken\n", *lines[1:]]))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "512"]) == 2
    assert (run_dir / "config.json").read_text() == config

    # No checkpoint left: resuming would start over and drop the logged steps.
    (run_dir / "metrics.jsonl").write_text(metrics)
    shutil.rmtree(run_dir / "checkpoints")
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert "has no usable checkpoint, but its metrics.jsonl holds records up to step 256" in (
        capsys.readouterr().err
    )
    assert (run_dir / "metrics.jsonl").read_text() == metrics


def test_checkpoints_store_a_train_config_only(tmp_path: Path) -> None:
    from nnx_ppo.algorithms.checkpointing import make_checkpoint_fn
    from nnx_ppo.algorithms.config import PPOConfig

    with pytest.raises(TypeError, match="config must be a TrainConfig, got a PPOConfig"):
        make_checkpoint_fn(tmp_path, PPOConfig())  # type: ignore[arg-type]


def test_envs_lists_the_built_ins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs"]) == 0
    listed = capsys.readouterr().out
    for name in ("cartpole", "pendulum", "memory", "two_agent"):
        assert name in listed


def test_envs_keeps_what_envs_print_while_built_out_of_the_listing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Offline, Playground's robot envs print a failed download each; the listing shows
    such an env as unavailable with the first line of its error, and nothing it printed."""
    from nnx_ppo import envs

    built_in = envs.make

    def make(name: str) -> object:
        print(f"{name}: fetching assets...")
        if name == "offline":
            print("Error downloading assets: no network", file=sys.stderr)
            raise OSError("offline needs its assets (git clone exited with 128).\nClone them.")
        return built_in("cartpole")

    monkeypatch.setattr(envs, "names", lambda: ["chatty", "offline"])
    monkeypatch.setattr(envs, "make", make)
    monkeypatch.setenv("COLUMNS", "200")  # one table row per env
    assert main(["envs"]) == 0
    listed = " ".join(capsys.readouterr().out.split())
    assert "fetching assets" not in listed
    assert "Error downloading" not in listed
    assert "unavailable: offline needs its assets (git clone exited with 128)." in listed
    assert "Clone them" not in listed
    assert re.search(r"chatty │ 4 │ 2 │ discrete", listed)


def test_envs_shows_whole_names_beside_long_reasons_at_80_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nnx_ppo import envs

    long_name = "Go1JoystickFlatTerrainWithALongName"

    def make(name: str) -> object:
        raise OSError("its assets could not be downloaded: " + "a long reason " * 8)

    monkeypatch.setattr(envs, "names", lambda: [long_name])
    monkeypatch.setattr(envs, "make", make)
    monkeypatch.setenv("COLUMNS", "80")  # a pipe's width: the name column was cut with "…"
    assert main(["envs"]) == 0
    assert long_name in capsys.readouterr().out


def test_eval_reports_returns_of_the_latest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert train(run_dir, 256) == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "4"]) == 0
    shown = capsys.readouterr().out
    assert "checkpoint at step 256" in shown and "eval/episode_reward/mean" in shown


def test_a_users_env_trains_resumes_and_evaluates_by_module_and_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my_envs.py").write_text(
        "from nnx_ppo.envs import make\n\n"
        "def short_cartpole(max_steps=500):\n"
        "    return make('cartpole', max_steps=max_steps)\n"
    )
    monkeypatch.chdir(tmp_path)  # importable from the current directory, as with python -m
    monkeypatch.syspath_prepend(tmp_path)
    run_dir = tmp_path / "run"
    env = ["--env", "my_envs:short_cartpole", "--set", "env_kwargs.max_steps=3"]
    assert train(run_dir, 256, *env) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["env"], config["env_kwargs"]) == ("my_envs:short_cartpole", {"max_steps": 3})
    assert main(["train", "--resume", str(run_dir), "--steps", "512"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "4"]) == 0
    shown = capsys.readouterr().out
    # Every episode lasts the factory's max_steps (too few for the pole to fall).
    assert re.search(r"eval/lifespan/mean\s*│\s*3\.000", shown), shown
    assert main(["train", "--env", "my_envs:missing", "--steps", "256"]) == 2
    assert "my_envs has no attribute 'missing'" in capsys.readouterr().err


def test_an_error_in_a_users_factory_shows_its_traceback_and_line_with_status_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken_envs.py").write_text(
        "def misread_option():\n    return int('not-a-number')\n"
    )
    monkeypatch.syspath_prepend(tmp_path)
    run_dir = tmp_path / "run"
    args = ["train", "--env", "broken_envs:misread_option", "--run-dir", str(run_dir)]
    assert main(args) == 1
    shown = capsys.readouterr().err
    assert "Traceback (most recent call last)" in shown
    assert (
        f"error: ValueError raised in your code at {tmp_path / 'broken_envs.py'}:2 in "
        "misread_option: invalid literal for int() with base 10: 'not-a-number'"
    ) in " ".join(shown.split()), shown


def test_a_users_module_that_raises_as_it_is_imported_shows_its_traceback_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "exploding_envs.py").write_text("import math\nraise RuntimeError('no GPU')\n")
    monkeypatch.syspath_prepend(tmp_path)
    args = ["train", "--env", "exploding_envs:make", "--run-dir", str(tmp_path / "run")]
    assert main(args) == 1
    shown = capsys.readouterr().err
    assert "Traceback (most recent call last)" in shown
    assert (
        f"error: RuntimeError raised in your code at {tmp_path / 'exploding_envs.py'}:2 in "
        "<module>: no GPU"
    ) in " ".join(shown.split()), shown
    assert not (tmp_path / "run").exists()


def test_a_factory_that_returns_no_env_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "forgetful_envs.py").write_text(
        "from nnx_ppo.envs import make\ndef cartpole():\n    make('cartpole')\n"
    )
    monkeypatch.syspath_prepend(tmp_path)
    args = ["train", "--env", "forgetful_envs:cartpole", "--run-dir", str(tmp_path / "run")]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --env forgetful_envs:cartpole: what forgetful_envs:cartpole(...) returned must "
        "be an environment with reset(key) and step(state, action); a NoneType has no reset "
        "and no step method"
    )


def test_a_run_directory_with_brackets_and_a_second_config_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Orbax globs a checkpoint's path as it merges its arrays: under brackets it found
    # nothing, and the run ended with status 0 and checkpoints that could not be read.
    run_dir = tmp_path / "lr[1e-3]"
    assert main(["train", "--run-dir", str(run_dir)]) == 2
    shown = " ".join(capsys.readouterr().err.split())
    assert f"the checkpoint directory {run_dir / 'checkpoints'} has '[' or ']' in its path" in shown
    assert not run_dir.exists()
    with pytest.raises(ValueError, match=r"make_checkpoint_fn: the checkpoint directory .*\["):
        make_checkpoint_fn(run_dir)

    for name in ("a.toml", "b.toml"):
        (tmp_path / name).write_text("seed = 1\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(tmp_path / "a.toml"), "--config", str(tmp_path / "b.toml")])
    assert "--config given twice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "source", "expected"),
    [
        (  # in the factory, before the run directory exists
            "read_options",
            "def read_options():\n"
            "    options = {}\n"
            "    return make('cartpole', max_steps=options['max_steps'])\n",
            "KeyError raised in your code at {path}:5 in read_options: 'max_steps'",
        ),
        (  # in env.step, as training first traces it
            "Miswired",
            "class Miswired(CartPole):\n"
            "    def step(self, state, action):\n"
            "        return super().step(state, action).replace(obs=state.obs.velocity)\n",
            "AttributeError raised in your code at {path}:5 in step:",
        ),
    ],
    ids=["KeyError in the factory", "AttributeError in step"],
)
def test_an_error_of_any_type_in_a_users_code_shows_its_traceback_and_line_with_status_1(
    name: str,
    source: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = f"buggy_{name.lower()}"  # one per case: Python keeps a module once imported
    path = tmp_path / f"{module}.py"
    path.write_text(f"from nnx_ppo.envs import CartPole, make\n\n{source}")
    monkeypatch.syspath_prepend(tmp_path)
    assert train(tmp_path / "run", 256, "--env", f"{module}:{name}") == 1
    shown = capsys.readouterr().err
    assert "Traceback (most recent call last)" in shown
    assert f"error: {expected.format(path=path)}" in " ".join(shown.split()), shown


def test_a_library_error_of_another_type_keeps_pythons_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No frame outside nnx-ppo raised it: a bug to report, not an error line.
    monkeypatch.setattr(cli_main, "_print_preset", {}.__getitem__)
    with pytest.raises(KeyError, match="pendulum"):
        main(["preset", "pendulum"])


def test_a_callback_that_raises_in_a_compiled_call_exits_1_naming_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # JAX's runtime error was raised past main: a traceback and no error line.
    (tmp_path / "callback_envs.py").write_text(
        "import jax\n"
        "from nnx_ppo.envs import make\n"
        "from nnx_ppo.wrappers import Wrapper\n\n"
        "def _lost(reward):\n"
        "    raise RuntimeError('sensor driver lost')\n\n"
        "class Sensor(Wrapper):\n"
        "    def __init__(self):\n"
        "        super().__init__(make('cartpole'))\n\n"
        "    def step(self, state, action):\n"
        "        state = self.env.step(state, action)\n"
        "        shape = jax.ShapeDtypeStruct(state.reward.shape, state.reward.dtype)\n"
        "        return state.replace(reward=jax.experimental.io_callback(_lost, shape, "
        "state.reward))\n"
    )
    monkeypatch.syspath_prepend(tmp_path)
    run_dir = tmp_path / "run"
    assert train(run_dir, 256, "--env", "callback_envs:Sensor") == 1
    shown = " ".join(capsys.readouterr().err.split())
    assert "error: a compiled training call failed as it ran" in shown
    assert "JAX said: RuntimeError: sensor driver lost." in shown
    assert f"No checkpoint was written in {run_dir} yet: start the run again" in shown


def test_a_users_env_that_breaks_the_contract_exits_1_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "drifting_envs.py").write_text(
        "import jax.numpy as jnp\n"
        "from nnx_ppo.envs import make\n\n"
        "class Drifting:\n"
        "    def __init__(self):\n"
        "        self.inner = make('cartpole')\n"
        "        self.observation_size, self.action_size = 4, 2\n"
        "        self.discrete_actions = True\n"
        "    def reset(self, key):\n"
        "        return self.inner.reset(key)\n"
        "    def step(self, state, action):\n"
        "        stepped = self.inner.step(state, action)\n"
        "        return stepped.replace(obs=stepped.obs.astype(jnp.bfloat16))\n"
    )
    monkeypatch.syspath_prepend(tmp_path)
    args = ["train", "--env", "drifting_envs:Drifting", "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--steps", "256", *TINY]) == 1
    shown = " ".join(capsys.readouterr().err.split())
    assert "error: your env or network broke the nnx-ppo contract: Drifting.step:" in shown
    assert "leaf: state.obs" in shown


@pytest.mark.parametrize("content", ["[]", "{}", '{"env": "cartpole", "train": 3}'])
def test_a_config_json_that_is_no_run_configuration_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(content)
    for command in (["train", "--resume", str(run_dir), "--steps", "512"], ["eval", str(run_dir)]):
        capsys.readouterr()
        assert main(command) == 2
        assert "config.json is not a run configuration: it holds no 'train' table" in (
            capsys.readouterr().err
        )


def test_more_devices_than_there_are_is_refused_before_the_run_directory_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", "--devices", "64", "--run-dir", str(run_dir), *TINY]) == 2
    assert "64 devices asked for" in capsys.readouterr().err
    assert not run_dir.exists()


_OBJECTIVES_ENV = """from nnx_ppo.envs import CartPole


class Objectives(CartPole):
    def reset(self, key):
        return self._per_objective(super().reset(key))

    def step(self, state, action):
        return self._per_objective(super().step(state, action))

    def _per_objective(self, state):
        return state.replace(reward={"upright": state.reward, "alive": 0.5 * state.reward})
"""


def test_one_action_with_a_reward_per_objective_is_refused_before_the_run_directory_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The preset gives one action a value per objective, and training needs
    combine_advantages for it: without, the run directory was made, then training
    failed at its first step."""
    (tmp_path / "objective_envs.py").write_text(_OBJECTIVES_ENV)
    monkeypatch.syspath_prepend(tmp_path)
    run_dir = tmp_path / "run"
    assert train(run_dir, STEP, "--env", "objective_envs:Objectives") == 2
    refused = " ".join(capsys.readouterr().err.split())
    assert "nnx-ppo train: the network returns one joint log-likelihood" in refused
    assert "Set PPOConfig.combine_advantages=True" in refused and not run_dir.exists()
    assert refused.endswith("On the command line: --set ppo.combine_advantages=true")
    combined = ("--set", "ppo.combine_advantages=true")
    assert train(run_dir, STEP, "--env", "objective_envs:Objectives", *combined) == 0
    assert find_checkpoint(run_dir)


def test_unknown_env_and_bad_overrides_are_explained(capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("mujoco_playground") is None:
        assert main(["train", "--env", "CartpoleBalance"]) == 2
        assert "nnx-ppo[playground]" in capsys.readouterr().err
    assert main(["train", "--set", "ppo.n_envz=3"]) == 2
    assert "unknown config key 'train.ppo.n_envz'" in capsys.readouterr().err
    assert main(["train", "--set", "ppo.n_envs=10", "--set", "ppo.n_minibatches=4"]) == 2
    assert "n_minibatches" in capsys.readouterr().err
    assert main(["train", "--set", "ppo=5"]) == 2
    assert "config key 'train.ppo' is a table, not a value: set its keys, e.g. train.ppo." in (
        capsys.readouterr().err
    )
    assert main(["train", "--coordinator", "localhost"]) == 2
    assert "--coordinator takes HOST:PORT, got 'localhost'" in capsys.readouterr().err


def test_a_metrics_record_without_a_step_is_named(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"loss": 1.0}\n{"step": 128}\n')
    with pytest.raises(ValueError, match="line 2 is not a metrics record: it has no int 'step'"):
        read_metrics(path)


@pytest.mark.skipif(
    importlib.util.find_spec("mujoco_playground") is None,
    reason="MuJoCo Playground is not installed (pip install 'nnx-ppo[playground]')",
)
def test_playground_cartpole_balance_trains_through_the_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", "--env", "CartpoleBalance", "--steps", "512", "--run-dir", str(run_dir),
                 *TINY]) == 0  # fmt: skip
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["step"] >= 512


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    from nnx_ppo.algorithms.checkpointing import make_checkpoint_fn
    from nnx_ppo.algorithms.ppo import new_training_state

    env = make("cartpole")
    state = new_training_state(env, make_default_network(env, nnx.Rngs(0), hidden_sizes=[8]), 2, 0)
    save = make_checkpoint_fn(tmp_path, keep_last=2, metadata={"network": ("mlp", 8)})
    for step in (10, 20, 30):
        save(state.replace(steps_taken=step), step)
    # Step directories are named as 0.3.0 named them: step_ and ten digits.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000000020", "step_0000000030"]
    assert step_directory(tmp_path, 30) == tmp_path / "step_0000000030"
    assert find_checkpoint(tmp_path) == (tmp_path, 30)
    loaded = load_checkpoint(tmp_path, state)
    assert loaded["training_state"].steps_taken == 30
    assert loaded["metadata"] == {"network": ["mlp", 8]}  # as JSON holds it
    with pytest.raises(ValueError, match="keep_last must be a positive int"):
        make_checkpoint_fn(tmp_path, keep_last=0)
    with pytest.raises(TypeError, match=r"metadata must be JSON-ready.*not JSON serializable"):
        make_checkpoint_fn(tmp_path, metadata={"activation": jax.nn.relu})
    with pytest.raises(TypeError, match="metadata must be a dict, got a list"):
        make_checkpoint_fn(tmp_path, metadata=[1])  # type: ignore[arg-type]


def test_a_warp_simulator_is_asked_for_warnings_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """MuJoCo Warp prints a line per kernel module it loads; the command keeps them off."""
    from types import ModuleType, SimpleNamespace

    current, older = ModuleType("warp"), ModuleType("warp")
    current.config, current.LOG_WARNING = SimpleNamespace(log_level=20), 30  # type: ignore[attr-defined]
    older.config = SimpleNamespace(quiet=False)  # type: ignore[attr-defined]
    config = {"env": "cartpole", "env_kwargs": {"impl": "warp"}}
    for warp in (current, older):
        monkeypatch.setitem(sys.modules, "warp", warp)
        with pytest.raises(ValueError, match="impl is not an option"):  # not a Playground env
            cli_main._make_env(config)
    assert current.config.log_level == 30  # type: ignore[attr-defined]
    assert older.config.quiet is True  # type: ignore[attr-defined]
    current.config.log_level = 20  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "warp", current)
    with pytest.raises(ValueError, match="vision is not an option"):  # Playground's renders
        cli_main._make_env({"env": "cartpole", "env_kwargs": {"vision": True}})  # with Warp
    assert current.config.log_level == 30  # type: ignore[attr-defined]


class _UnsupportedOnThisBackend:
    """An env whose sizes, traced from its reset, raise ``NotImplementedError`` inside a
    package, as Playground's ``vision=True`` does on the CPU. The property is a C-level
    partial of the standard library's method, so no frame of this test is in the error's
    traceback: to the command, it is a package's refusal, not the user's bug."""

    observation_size = property(functools.partial(asyncio.AbstractEventLoop.run_forever))


def test_env_options_this_backend_cannot_run_are_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_main, "_make_env", lambda config: _UnsupportedOnThisBackend())
    run_dir = tmp_path / "run"
    assert train(run_dir, 256, "--set", "env_kwargs.max_steps=9") == 2
    said = capsys.readouterr()
    assert "Traceback" not in said.err and not run_dir.exists()
    assert said.err.count("error:") == 1
    backend = jax.default_backend()
    refused = " ".join(said.err.split())
    assert f"env_kwargs {{'max_steps': 9}} cannot run on this machine's {backend}" in refused


def test_a_network_and_its_optimizer_load_as_a_training_state_does(tmp_path: Path) -> None:
    from nnx_ppo.algorithms.ppo import new_training_state

    run_dir = tmp_path / "run"
    assert train(run_dir, 256) == 0
    env = make("cartpole")

    ppo = load_checkpoint(run_dir, make_default_network(env, nnx.Rngs(7), hidden_sizes=[16]))[
        "config"
    ].ppo

    def fresh() -> Any:  # with the run's optimizer settings, as train_ppo builds it
        network = make_default_network(env, nnx.Rngs(7), hidden_sizes=[16])
        return new_training_state(
            env, network, ppo.n_envs, 7, ppo.optimizer_learning_rate(), ppo.gradient_clipping,
            ppo.weight_decay,
        )  # fmt: skip

    whole = load_checkpoint(run_dir, fresh())["training_state"]
    parts = fresh()
    untouched = [np.asarray(x) for x in jax.tree.leaves(nnx.state(parts.optimizer))]
    with pytest.warns(UserWarning, match=r"training_state is None, and train_ppo\(\.\.\., ini"):
        assert load_checkpoint(run_dir, parts.networks, parts.optimizer)["training_state"] is None
    loaded = [np.asarray(x) for x in jax.tree.leaves(nnx.state(parts.optimizer))]
    restored = [np.asarray(x) for x in jax.tree.leaves(nnx.state(whole.optimizer))]
    assert any(not np.array_equal(a, b) for a, b in zip(untouched, restored, strict=True))
    for got, want in zip(loaded, restored, strict=True):
        np.testing.assert_array_equal(got, want)

    unclipped = new_training_state(env, make_default_network(env, nnx.Rngs(7), hidden_sizes=[16]),
                                   ppo.n_envs, 7, ppo.optimizer_learning_rate())  # fmt: skip
    with pytest.raises(CheckpointError, match="optimizer state does not fit this template's"):
        load_checkpoint(run_dir, unclipped)
    for clipping in (ppo.gradient_clipping, None):  # a wider network, the optimizer alike or not
        network = make_default_network(env, nnx.Rngs(7), hidden_sizes=[32])
        wider = new_training_state(
            env, network, ppo.n_envs, 7, ppo.optimizer_learning_rate(), clipping
        )
        with pytest.raises(CheckpointError, match="does not fit this network"):
            load_checkpoint(run_dir, wider)

    checkpoints, latest = find_checkpoint(run_dir)
    step_dir = step_directory(checkpoints, latest)
    assert find_checkpoint(step_dir) == find_checkpoint(step_dir, latest) == (checkpoints, latest)
    with pytest.raises(CheckpointError, match=f"is the checkpoint of step {latest}, not 0"):
        find_checkpoint(step_dir, 0)  # never the directory's own step in place of step 0
