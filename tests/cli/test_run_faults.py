"""Run directories under faults: refused resumes, early failures, divergence, full disks, locks.

Each test names what it protects. Runs are tiny (8 envs x 16 steps per PPO step) and
one finished run is shared, copied by the tests that change it.
"""

import itertools
import json
import logging
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_runs import STEP, TINY, parameters, train
from flax import nnx

from nnx_ppo.algorithms import _train
from nnx_ppo.algorithms.checkpointing import (
    CheckpointError,
    find_checkpoint,
    step_directory,
)
from nnx_ppo.cli import run_dir as run_dir_module
from nnx_ppo.cli.main import main
from nnx_ppo.cli.presets import (
    cadences_set_by_hand,
    follow_run_length,
    parse_run_config,
    preset,
)
from nnx_ppo.cli.run_dir import hold_run_lock, read_metrics, write_atomically
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network


def resume(run_dir: Path, *extra: str) -> int:
    return main(["train", "--resume", str(run_dir), *extra])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained to 512 steps: checkpoints at 0 and 512, evaluations at 0 and 512."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert train(run_dir, 4 * STEP) == 0
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    return copy


def steps_logged(run_dir: Path) -> list[int]:
    return [record["step"] for record in read_metrics(run_dir / "metrics.jsonl")]


# ---------------------------------------------------------------------- resume, refused


def _tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """The ``(step, value)`` points TensorBoard shows for ``tag``: the event files are read
    in name (start time) order, and a ``SessionLog`` START at step ``s`` discards what the
    files read before it logged at step ``s`` or later (TensorBoard's purge)."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    shown: list[tuple[int, float]] = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):  # records: length (8 bytes), its CRC (4), event, CRC (4)
            (length,) = struct.unpack_from("<Q", data, offset)
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            if event.session_log.status == SessionLog.START:
                shown = [(step, value) for step, value in shown if step < event.step]
            shown += [(event.step, v.simple_value) for v in event.summary.value if v.tag == tag]
    return shown


def test_a_refused_resume_leaves_the_run_resumable_and_logs_every_step_once(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    config = (run_dir / "config.json").read_bytes()
    capsys.readouterr()

    assert resume(run_dir, "--set", "network.hidden_sizes=[128]") == 2
    assert resume(run_dir, "--set", "ppo.n_envs=16", "--steps", "1024") == 2
    shown = capsys.readouterr().err
    assert "ppo.n_envs is 8 in the run, 16 here" in shown
    assert "may not change on resume" in shown and "[" not in shown.split("here")[-1]
    assert (run_dir / "config.json").read_bytes() == config

    # Steps logged after the last checkpoint by a killed session, the last line cut short.
    (first,) = run_dir.glob("events.out.tfevents.*")
    killed = run_dir_module.RunLogger(run_dir)
    killed({"losses/total/mean": 1e6}, 5 * STEP)
    killed.close()
    with (run_dir / "metrics.jsonl").open("a") as stream:
        stream.write('{"step": 768, "losses/tot')
    # Its TensorBoard file, named as if opened between the first session and the next
    # (tensorboardX names a file by the second it was opened in).
    (written,) = set(run_dir.glob("events.out.tfevents.*")) - {first}
    written.rename(first.with_name(f"{first.name}.killed"))
    assert resume(run_dir, "--steps", str(6 * STEP)) == 0
    shown = capsys.readouterr().out
    assert steps_logged(run_dir) == [k * STEP for k in range(7)]
    # TensorBoard too shows each step once, as metrics.jsonl holds it: the resumed
    # session's file discards what the killed one logged after the checkpoint.
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 3
    tag = "losses/total/mean"
    logged = [(r["step"], r[tag]) for r in read_metrics(run_dir / "metrics.jsonl") if tag in r]
    on_tensorboard = _tensorboard_scalars(run_dir, tag)
    assert [step for step, _ in on_tensorboard] == [step for step, _ in logged]
    np.testing.assert_allclose([v for _, v in on_tensorboard], [v for _, v in logged], rtol=1e-6)
    evaluations = [
        r["step"]
        for r in read_metrics(run_dir / "metrics.jsonl")
        if "eval/episode_reward/mean" in r
    ]
    assert evaluations == [0, 4 * STEP]  # none added at the step resumed from
    assert "(step 512)" in shown  # the last evaluation's return is shown with its step
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert f"checkpoint at step {6 * STEP}" in capsys.readouterr().out


def test_a_resume_that_cannot_load_its_checkpoint_leaves_config_json_as_it_was(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    config = (run_dir / "config.json").read_bytes()
    checkpoints, latest = find_checkpoint(run_dir)
    for item in (step_directory(checkpoints, latest) / "arrays").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")
    assert resume(run_dir, "--set", "ppo.learning_rate=0.01", "--steps", "1024") == 2
    assert "could not be read" in capsys.readouterr().err
    assert (run_dir / "config.json").read_bytes() == config


def _edit_config(run_dir: Path, section: str, key: str, value: Any) -> None:
    config = json.loads((run_dir / "config.json").read_text())
    (config[section] if section else config)[key] = value
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))


def test_a_config_json_edited_since_the_checkpoint_is_refused_by_resume_and_eval(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    original = (run_dir / "config.json").read_bytes()
    capsys.readouterr()
    # The seed: the checkpoint holds the run's keys, so config.json would name a seed the
    # run never trained with. Eval does not use it, and still evaluates.
    _edit_config(run_dir, "train", "seed", 7)
    edited = (run_dir / "config.json").read_bytes()
    assert resume(run_dir, "--steps", str(6 * STEP)) == 2
    shown = capsys.readouterr().err
    assert "seed is 0 in the run, 7 here" in shown
    assert "config.json was changed after the newest checkpoint was written" in shown
    assert (run_dir / "config.json").read_bytes() == edited
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    # The activation keeps every shape: the checkpoint would load into another network.
    (run_dir / "config.json").write_bytes(original)
    _edit_config(run_dir, "network", "activation", "relu")
    for command in (["train", "--resume", str(run_dir)], ["eval", str(run_dir)]):
        assert main(command) == 2
        assert 'network.activation is "tanh" in the run, "relu" here' in capsys.readouterr().err
    # An edit that changes the network's shapes is named as such by eval too.
    _edit_config(run_dir, "network", "activation", "tanh")
    _edit_config(run_dir, "network", "hidden_sizes", [32])
    assert main(["eval", str(run_dir)]) == 2
    shown = capsys.readouterr().err
    assert "config.json was changed after the newest checkpoint was written" in shown
    assert "network.hidden_sizes is [16] in the run, [32] here" in shown
    _edit_config(run_dir, "network", "hidden_sizes", [16])
    _edit_config(run_dir, "network", "activation", "relu")
    # The checkpoint's own value, given again, is the run's: the resume goes on.
    assert resume(run_dir, "--set", "network.activation=tanh", "--steps", str(5 * STEP)) == 0
    assert json.loads((run_dir / "config.json").read_text())["network"]["activation"] == "tanh"
    # An edit that changes nothing (a size written as a number) is no change.
    _edit_config(run_dir, "network", "hidden_sizes", 16)
    assert resume(run_dir, "--steps", str(5 * STEP)) == 0  # complete: nothing refused
    assert "is complete" in capsys.readouterr().out
    # A checkpoint of an earlier version holds the train config alone: the seed is
    # still compared with it.
    _edit_config(run_dir, "train", "seed", 7)
    for step_dir in (run_dir / "checkpoints").iterdir():
        shutil.rmtree(step_dir / "metadata")
    assert resume(run_dir, "--steps", str(6 * STEP)) == 2
    shown = capsys.readouterr().err
    assert "config.json was changed after the checkpoint at step 640 was written" in shown
    assert "seed is 0 in the run, 7 here" in shown


def test_records_cut_from_metrics_jsonl_before_the_checkpoint_are_named_on_resume(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= STEP]
    metrics.write_text("\n".join(kept) + "\n")
    capsys.readouterr()
    assert resume(run_dir, "--steps", str(5 * STEP)) == 0
    shown = capsys.readouterr().err
    assert f"ends at step {STEP}, but the checkpoint resumed from is at step 512" in shown
    assert steps_logged(run_dir) == [0, STEP, 5 * STEP]
    # The run's own records reach its checkpoint: nothing to say.
    assert resume(run_dir, "--steps", str(6 * STEP)) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_changed_byte_in_a_checkpoint_is_found_and_the_earlier_one_named(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    checkpoints, latest = find_checkpoint(run_dir)
    latest_dir = step_directory(checkpoints, latest)
    manifest_file = next((latest_dir / "manifest").glob("*.json"), latest_dir / "manifest/metadata")
    manifest = json.loads(manifest_file.read_text())
    # The manifest's own entries are checked too: a step count changed by one.
    changed = manifest | {"steps_taken": manifest["steps_taken"] - 1}
    manifest_file.write_text(json.dumps(changed))
    assert resume(run_dir, "--steps", str(6 * STEP)) == 2
    shown = " ".join(capsys.readouterr().err.split())
    assert f"checkpoint {latest_dir} is corrupted: its manifest does not match" in shown
    # As if a byte of the fourth array had changed (a manifest written before it had a
    # checksum of its own).
    del manifest["manifest_checksum"]
    manifest["checksums"][3] ^= 1
    manifest_file.write_text(json.dumps(manifest))
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    assert resume(run_dir, "--steps", str(6 * STEP)) == 2
    shown = " ".join(capsys.readouterr().err.split())
    assert f"checkpoint {latest_dir} is corrupted: its array" in shown
    assert "does not match the checksum written with it" in shown
    assert f"The checkpoint of step 0 is complete: remove {latest_dir} to resume from it" in shown
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    # A checkpoint written before the manifest kept checksums still loads.
    del manifest["checksums"]
    manifest_file.write_text(json.dumps(manifest))
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    # Bytes changed inside an array file are found too (no checksum in Orbax's files).
    copy = copy_of(finished_run, tmp_path / "bytes")
    array_file = max(
        (f for f in (step_directory(checkpoints, latest) / "arrays").rglob("*") if f.is_file()),
        key=lambda f: f.stat().st_size,
    )
    changed = copy / array_file.relative_to(run_dir)
    data = bytearray(changed.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = bytes(16)
    changed.write_bytes(bytes(data))
    capsys.readouterr()
    assert resume(copy, "--steps", str(6 * STEP)) == 2
    shown = capsys.readouterr().err
    assert "is corrupted: its array" in shown or "could not be read" in shown


@pytest.mark.parametrize(
    ("removed", "named"),
    [
        (["_CHECKPOINT_METADATA"], "_CHECKPOINT_METADATA (Orbax's)"),
        (["manifest"], "manifest/ (make_checkpoint_fn's)"),
        (["manifest", "_CHECKPOINT_METADATA"], "manifest/ (make_checkpoint_fn's)"),
    ],
)
def test_a_newest_checkpoint_missing_an_item_is_named_not_skipped(
    finished_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    removed: list[str],
    named: str,
) -> None:
    # Taken as a crash's leftover, it was skipped: eval read the earlier checkpoint, and
    # resume dropped the steps after it and their metrics records. A crash leaves no
    # such directory: Orbax writes both under a temporary name and renames it when done.
    run_dir = copy_of(finished_run, tmp_path)
    checkpoints, latest = find_checkpoint(run_dir)
    latest_dir = step_directory(checkpoints, latest)
    for item in removed:
        path = latest_dir / item
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    expected = (
        f"checkpoint {latest_dir} is incomplete or corrupted: its {named} is missing. The "
        f"checkpoint of step 0 is complete: remove {latest_dir} to resume from it"
    )
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 2
    assert expected in " ".join(capsys.readouterr().err.split())
    assert resume(run_dir, "--steps", str(6 * STEP)) == 2
    assert expected in " ".join(capsys.readouterr().err.split())
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics


def test_a_new_run_never_takes_over_the_metrics_of_a_run_without_checkpoints(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    shutil.rmtree(run_dir / "checkpoints")
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    config = (run_dir / "config.json").read_bytes()
    capsys.readouterr()
    assert train(run_dir, STEP) == 2
    shown = " ".join(capsys.readouterr().err.split())
    assert "holds records up to step 512: a new run there would start the run over" in shown
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert (run_dir / "config.json").read_bytes() == config


def test_a_resume_on_fewer_devices_than_the_run_had_names_where_the_count_came_from(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    config["train"]["devices"] = 2  # trained on two devices, resumed where there is one
    (run_dir / "config.json").write_text(json.dumps(config))
    assert resume(run_dir, "--steps", str(6 * STEP)) == 2
    shown = " ".join(capsys.readouterr().err.split())
    assert "2 devices asked for, but JAX sees 1" in shown
    assert f"(devices = 2 is the run's, from {run_dir / 'config.json'}; resume on" in shown
    assert "with --devices N)" in shown


def test_resuming_a_complete_run_says_it_is_complete_and_writes_nothing(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_of(finished_run, tmp_path)
    before = sorted(p.name for p in run_dir.iterdir())
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert resume(run_dir) == 0
    shown = capsys.readouterr().out
    assert f"{run_dir} is complete: trained for 512 of 512 steps" in shown
    assert "steps/s" not in shown and "training cartpole" not in shown
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert sorted(p.name for p in run_dir.iterdir()) == before


# ------------------------------------------------------------------ failures in training


def test_a_run_that_failed_before_its_first_checkpoint_is_reused_or_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"

    def failing_evaluation(*args: Any, **kwargs: Any) -> dict[str, float]:
        raise RuntimeError("the evaluation failed")

    def unreadable_metrics(*args: Any, **kwargs: Any) -> None:
        raise ValueError("metrics.jsonl line 1 is not valid JSON")

    with monkeypatch.context() as patch:
        patch.setattr(_train, "_evaluate", failing_evaluation)
        patch.setattr(run_dir_module, "plot_learning_curve", unreadable_metrics)
        # The plot's own failure is reported, never raised over the error that stopped
        # training (raised in this file, so named as a user's code's).
        assert train(run_dir, 2 * STEP) == 1
        shown = capsys.readouterr().err
        assert "no learning curve drawn" in shown
        assert "RuntimeError raised in your code" in shown and "the evaluation failed" in shown
        assert not (run_dir / "checkpoints").exists()
        # A new run may take the directory: it is not refused as "already holds a run".
        assert train(run_dir, 2 * STEP) == 1
        assert "the evaluation failed" in capsys.readouterr().err
    assert resume(run_dir, "--steps", str(STEP)) == 0
    assert "has no checkpoint yet: starting it from step 0" in capsys.readouterr().out
    assert find_checkpoint(run_dir)[1] == STEP
    assert steps_logged(run_dir) == [0, STEP]


def test_divergence_is_one_message_naming_the_intact_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    real_finish = _train.finish

    def diverging(in_flight: Any) -> Any:
        if in_flight.start.steps_taken >= STEP:
            raise FloatingPointError(f"PPO step ending at env step {2 * STEP}: the loss is NaN.")
        return real_finish(in_flight)

    monkeypatch.setattr(_train, "finish", diverging)
    capsys.readouterr()
    assert train(run_dir, 4 * STEP - 10, "--set", f"checkpoint_every_steps={STEP}") == 1
    shown = capsys.readouterr()
    assert "training cartpole to 512 steps (502 rounded up to whole PPO steps of 128)" in shown.out
    assert "Traceback" not in shown.out + shown.err
    shown = shown.err
    assert "training diverged: PPO step ending at env step 256: the loss is NaN." in shown
    # The step it resumes from is named (cli.rst said so; it was not).
    assert f"resume from step {STEP} with nnx-ppo train --resume {run_dir}" in " ".join(
        shown.split()
    )
    assert find_checkpoint(run_dir)[1] == STEP


# ------------------------------------------------------------------- disks, files, locks


def test_a_checkpoint_that_cannot_be_written_is_named_and_never_taken_as_latest(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A run that never checkpointed, its checkpoint directory taken by a file.
    shutil.copy(finished_run / "config.json", run_dir / "config.json")
    (run_dir / "checkpoints").write_text("a file where the checkpoint directory should be")
    capsys.readouterr()
    assert train(run_dir, STEP) == 1  # the run stopped: not bad input
    shown = capsys.readouterr().err
    assert f"could not write the checkpoint of step 0 under {run_dir / 'checkpoints'}" in shown
    # Where the run goes on from is named, as for a log that cannot be written.
    assert f"No checkpoint was written in {run_dir} yet: start the run again" in " ".join(
        shown.split()
    )
    assert "Traceback" not in shown

    # A step directory a crash (or a full disk) left without Orbax's metadata is skipped.
    copy = copy_of(finished_run, tmp_path)
    checkpoints, latest = find_checkpoint(copy)
    partial = step_directory(checkpoints, latest + STEP)
    shutil.copytree(step_directory(checkpoints, latest) / "arrays", partial / "arrays")
    assert find_checkpoint(copy) == (checkpoints, latest)


def test_a_log_that_cannot_be_closed_never_replaces_the_runs_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def diverging(in_flight: Any) -> Any:
        raise FloatingPointError("PPO step ending at env step 128: the loss is NaN.")

    def disk_full(self: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_train, "finish", diverging)
    monkeypatch.setattr(run_dir_module.RunLogger, "close", disk_full)
    assert train(tmp_path / "run", STEP) == 1
    shown = " ".join(capsys.readouterr().err.split())
    assert "training diverged: PPO step ending at env step 128" in shown
    assert "warning: the run's logs were not closed cleanly: [Errno 28]" in shown


def test_an_interrupt_outside_training_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("nnx_ppo.cli.main._list_envs", interrupted)
    assert main(["envs"]) == 130
    assert capsys.readouterr().err.strip() == "error: interrupted: nnx-ppo envs stopped at once"


def test_a_full_disk_during_a_checkpoint_write_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import orbax.checkpoint as ocp

    from nnx_ppo.algorithms.checkpointing import make_checkpoint_fn
    from nnx_ppo.algorithms.ppo import new_training_state

    env = make("cartpole")
    state = new_training_state(env, make_default_network(env, nnx.Rngs(0), hidden_sizes=[4]), 2, 0)
    save = make_checkpoint_fn(tmp_path / "checkpoints")
    save(state, 0)

    def disk_full(self: Any, step: int, *args: Any, **kwargs: Any) -> bool:
        (self.directory / f"{step}.orbax-checkpoint-tmp-7").mkdir()
        raise OSError(28, "No space left on device", str(self.directory / f"{step}"))

    monkeypatch.setattr(ocp.CheckpointManager, "save", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device") as error:
        save(state.replace(steps_taken=10), 10)
    assert str(tmp_path / "checkpoints") in str(error.value)
    assert find_checkpoint(tmp_path / "checkpoints")[1] == 0

    def tensorstore_full(self: Any, step: int, *args: Any, **kwargs: Any) -> bool:
        # Orbax's writer threads log the failure, with a traceback, before it is raised.
        logging.getLogger("absl").error("_SignalingThread.run() raised an exception")
        raise ValueError(  # how Orbax's array store reports it
            'RESOURCE_EXHAUSTED: Error writing "11/0" in OCDBT database: No space left on '
            "device [os_error_code='28'] [tensorstore_spec='{\"context\": {}}']\nmore detail"
        )

    monkeypatch.setattr(ocp.CheckpointManager, "save", tensorstore_full)
    with caplog.at_level(logging.INFO), pytest.raises(CheckpointError) as error:
        save(state.replace(steps_taken=20), 20)
    assert str(error.value) == (
        f"could not write the checkpoint of step 20 under {tmp_path / 'checkpoints'}: "
        'RESOURCE_EXHAUSTED: Error writing "11/0" in OCDBT database: No space left on '
        f"device [os_error_code='28'] ({tmp_path / 'checkpoints'}); the checkpoints already "
        "there are intact"
    )
    assert not [record for record in caplog.records if record.name == "absl"]


def test_config_json_and_the_plot_are_replaced_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.json"
    write_atomically(path, '{"old": true}\n')

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, '{"new": true, "long": "' + "x" * 10_000 + '"}\n')
    assert path.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary left


class _FullDiskStream:
    """A file opened on a full disk: what is written to it raises ENOSPC."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        raise OSError(28, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __enter__(self) -> "_FullDiskStream":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stream.close()


@pytest.mark.parametrize("full_at", [".lock", "config.json", "metrics.jsonl"])
def test_a_full_disk_when_a_run_starts_is_a_failed_write_naming_the_file(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    full_at: str,
) -> None:
    # It was taken for bad input: status 2 and "error: [Errno 28] No space left on
    # device", naming no file; a failed lock write left an empty .lock behind.
    resumed = full_at == "metrics.jsonl"  # trimmed on resume, to the checkpoint's step
    run_dir = (
        copy_of(request.getfixturevalue("finished_run"), tmp_path) if resumed else tmp_path / "run"
    )
    metrics = (run_dir / "metrics.jsonl").read_bytes() if resumed else None
    if full_at == ".lock":
        open_file = Path.open

        def opened_on_a_full_disk(path: Path, *args: Any, **kwargs: Any) -> Any:
            stream = open_file(path, *args, **kwargs)
            return _FullDiskStream(stream) if path.name == ".lock" else stream

        monkeypatch.setattr(Path, "open", opened_on_a_full_disk)
    else:  # config.json and metrics.jsonl are replaced through a synced temporary file

        def failing_fsync(fd: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fsync", failing_fsync)
    status = resume(run_dir, "--steps", str(6 * STEP)) if resumed else train(run_dir, STEP)
    shown = " ".join(capsys.readouterr().err.split())
    assert status == 1, shown
    kept = (
        f"The checkpoints in {run_dir} are intact: resume from step "
        f"{find_checkpoint(run_dir)[1]:,} with nnx-ppo train --resume {run_dir}"
        if resumed
        else f"No checkpoint was written in {run_dir} yet: start the run again"
    )
    assert f"error: could not write {run_dir / full_at}: No space left on device. {kept}" in shown
    if resumed:
        assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    else:  # no empty .lock left behind, nor a temporary file
        left = [".lock"] if full_at == "config.json" else []
        assert sorted(p.name for p in run_dir.iterdir()) == left


def test_a_second_trainer_of_the_same_run_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with hold_run_lock(run_dir):  # the lock is the OS's: a second holder, even here, is refused
        capsys.readouterr()
        assert train(run_dir, STEP) == 2
    shown = capsys.readouterr().err
    assert f"{run_dir} is being trained by process {os.getpid()}" in shown
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "config.json").exists()


def test_metrics_cut_short_by_a_kill_are_read_and_a_broken_middle_line_is_named(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "a": 1.0}\n{"step": 128, "a": 2.0}\n{"step": 256, "a"')
    assert [r["step"] for r in read_metrics(path)] == [0, 128]
    path.write_text('{"step": 0, "a": 1.0}\n{"step": 1\n{"step": 256, "a": 2.0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not valid JSON"):
        read_metrics(path)


# --------------------------------------------------------------------------- bad input


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BAD_INPUT = [
    (["--set", "network.hidden_sizes=abc"], "network.hidden_sizes must be a list of positive"),
    (["--set", "network.hidden_sizes=[0]"], "network.hidden_sizes must be a list of positive"),
    (["--set", "network.activation=sigmoidish"], "network.activation must be one of elu"),
    (["--set", "network.kind=cnn"], 'network.kind must be "auto", "mlp" or "lstm"'),
    (["--set", "ppo.logging_level=EVERYTHING"], "ppo.logging_level must be flag names"),
    (["--set", "ppo.logging_level=LOSES"], "('LOSES': no such flag; the flags are LOSSES, CRITIC"),
    (["--set", "env_kwargs=3"], "config field env_kwargs must be an object"),
    (["--config", "{tmp}"], "is a directory; give a .toml or .json file"),
    (["--set", "ppo.n_envs=many"], "config field ppo.n_envs must be an integer"),
    (["--set", "ppo.n_envs=0"], "n_envs must be a positive int"),
    (["--set", "ppo.clip_range=[1]"], "config field ppo.clip_range must be a number"),
    (["--set", "eval.enabled=yes"], "config field eval.enabled must be true or false"),
    (["--set", "eval.logging_percentiles=5"], "eval.logging_percentiles must be a list of"),
    (["--set", "ppo.advantage_normalization=none"], 'must be "per_leaf" or "global"'),
    (["--set", "episode_length=-3"], "episode_length must be a positive integer or null"),
    (["--set", "ppo.n_envs"], "--set expects key=value"),
    (["--set", "ppo.n_envz=3"], "unknown config key 'train.ppo.n_envz'"),
    (["--env", "cartpol"], "Unknown environment 'cartpol'"),
    (["--config", "{tmp}/missing.toml"], "missing.toml does not exist"),
    (["--config", "{tmp}/unknown.json"], "unknown config key 'train.ppo.speed'"),
    (["--config", "{tmp}/mistyped.json"], "config field ppo.gae_lambda must be a number"),
    (["--config", "{tmp}/broken.toml"], "broken.toml is not valid TOML"),
    (["--config", "{tmp}/list.json"], "list.json must hold an object of config keys"),
    (["--config", "{tmp}/top.json"], "unknown config key 'seed' (did you mean train.seed?)"),
    (["--config", "{tmp}/run.yaml"], "run.yaml must be a .toml or .json file"),
    (["--config", "{tmp}/latin1.toml"], "latin1.toml is not UTF-8 text: byte 0xe9 at position"),
    (["--resume", "{tmp}/latin1"], "latin1/config.json is not UTF-8 text: byte 0xff at"),
    (["--resume", "{tmp}/nowhere"], "nowhere is not a run directory: it has no config.json"),
    (["--seed", "3", "--set", "seed=5"], "--seed 3 and --set train.seed=5 disagree"),
    (["--steps", "100", "--set", "ppo.total_steps=4096"], "--steps 100 and --set train.ppo"),
    (["--env", "cartpole", "--set", "env=pendulum"], '--env cartpole and --set env="pendulum"'),
    (["--steps", "6000", "--set", 'ppo={"total_steps": 5000}'], "total_steps=5000 disagree"),
    (["--seed", "4", "--set", 'train={"seed": 3}'], "--seed 4 and --set train.seed=3 disagree"),
    (["--set", "network.entropy_weight=NaN"], "network.entropy_weight must be a finite number"),
    (["--run-dir", "{tmp}/notes"], "notes holds files of something else (" + "{tmp}/notes is "),
    (["--run-dir", "{tmp}/other"], "other/config.json is not a run configuration"),
    (["--run-dir", "{tmp}/run.yaml"], "run.yaml is a file: choose a directory"),
    (["--resume", "{tmp}/edited"], "edited/config.json: unknown config key 'train.ppo.n_envz'"),
]


def test_a_resume_from_step_0_keeps_step_0s_record_and_nan_is_written_as_null(
    tmp_path: Path,
) -> None:
    from nnx_ppo.cli.run_dir import RunLogger, trim_metrics

    logger = RunLogger(tmp_path)
    for step in (0, 128):
        logger({"loss": float("nan") if step else 1.0}, step)
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["loss"] is None and "NaN" not in lines[1]  # valid JSON
    trim_metrics(tmp_path / "metrics.jsonl", 0)  # the checkpoint at step 0 resumed
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0]


def test_a_log_write_that_fails_names_the_file_and_the_writer_is_given_up_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorboardX.event_file_writer import EventFileWriter

    from nnx_ppo.cli.run_dir import RunLogger

    logger = RunLogger(tmp_path)
    logger({"loss": 1.0}, 0)
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").mkdir()  # the append fails, as on a full disk
    with pytest.raises(OSError, match=r"could not log step 128 in .*metrics\.jsonl: .*; the "):
        logger({"loss": 2.0}, 128)

    def disk_full(self: EventFileWriter) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EventFileWriter, "flush", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        logger.close()
    # The events' own thread stopped by a failed write (a file size limit): the next
    # step says so instead of waiting on the thread's queue for good, and so does close.
    logger = RunLogger(tmp_path / "limited")
    logger({"loss": 1.0}, 0)
    for file_writer in logger._writer.all_writers.values():
        worker = file_writer.event_writer._worker
        file_writer.event_writer._worker = threading.Thread(target=lambda: None)
        file_writer.event_writer._worker.start()
        file_writer.event_writer._worker.join()
        worker.stop()
    with pytest.raises(OSError, match=r"could not log step 128 to TensorBoard in .*limited"):
        logger({"loss": 2.0}, 128)
    with pytest.raises(OSError, match=r"TensorBoard events in .*limited were not all written"):
        logger.close()
    # What tensorboardX's exit handler runs: given up, it retries nothing.
    for file_writer in logger._writer.all_writers.values():
        file_writer.event_writer.close()
        assert (
            file_writer.event_writer._worker is None
            or not file_writer.event_writer._worker.is_alive()
        )


def test_sessions_that_open_the_run_in_one_second_keep_both_event_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nnx_ppo.cli.run_dir import RunLogger

    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)  # tensorboardX names by it
    # The two sessions on either side of a second's turn: the nanoseconds within the
    # second alone put the second session's file first (a flaky failure before).
    clock = itertools.chain([1_700_000_000_999_999_000], itertools.count(1_700_000_001_000_001_000))
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    for step, value in ((0, 1.0), (128, 2.0)):
        logger = RunLogger(tmp_path)
        logger({"loss": value}, step)
        logger.close()
    assert _tensorboard_scalars(tmp_path, "loss") == [(0, 1.0), (128, 2.0)]


def test_a_session_writes_again_the_scalars_a_killed_one_held_in_memory(tmp_path: Path) -> None:
    from nnx_ppo.cli.run_dir import RunLogger

    # A session killed with its events still in tensorboardX's queue (flushed every two
    # minutes): metrics.jsonl alone holds its steps, the NaN as null.
    records = [{"step": 0, "time": 1.0, "loss": 1.0}, {"step": 128, "time": 2.0, "loss": None}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    logger = RunLogger(tmp_path)
    logger({"loss": 3.0}, 256)
    logger.close()
    assert _tensorboard_scalars(tmp_path, "loss") == [(0, 1.0), (256, 3.0)]


def test_a_long_runs_metrics_are_trimmed_and_plotted_without_holding_the_file(
    tmp_path: Path,
) -> None:
    import tracemalloc

    from nnx_ppo.cli.run_dir import EVAL_RETURN_KEY, plot_learning_curve, trim_metrics

    path = tmp_path / "metrics.jsonl"
    record = {f"metric/{i}": float(i) for i in range(40)}  # about a CLI record's size
    with path.open("w") as stream:
        for step in range(5000):
            stream.write(json.dumps({"step": step, EVAL_RETURN_KEY: 1.0, **record}) + "\n")
    written = path.read_bytes()
    plot_learning_curve(path, tmp_path / "curve.png")  # matplotlib's own allocations first
    tracemalloc.start()
    try:
        trim_metrics(path, 3999)
        plot_learning_curve(path, tmp_path / "curve.png")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The whole file is 3.9 MB, its parsed records several times that.
    assert len(written) > 3_900_000 and peak < 1_500_000, peak
    kept = written.splitlines(keepends=True)[:4000]
    assert path.read_bytes() == b"".join(kept)  # the kept lines, byte for byte


@pytest.mark.parametrize(("argv", "expected"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_to_train_is_one_line_naming_the_field(
    argv: list[str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _write(tmp_path / "unknown.json", '{"train": {"ppo": {"speed": 3}}}')
    _write(tmp_path / "mistyped.json", '{"train": {"ppo": {"gae_lambda": "high"}}}')
    _write(tmp_path / "broken.toml", "[train.ppo\nn_envs = 3")
    _write(tmp_path / "list.json", "[1, 2]")
    _write(tmp_path / "top.json", '{"seed": 3}')
    _write(tmp_path / "run.yaml", "seed: 3")
    (tmp_path / "latin1.toml").write_bytes("[train]\n# réglages\nseed = 3\n".encode("latin-1"))
    (tmp_path / "latin1").mkdir()
    (tmp_path / "edited").mkdir()
    edited = {"env": "cartpole", "train": {"ppo": {"n_envz": 3}}}
    _write(tmp_path / "edited" / "config.json", json.dumps(edited))
    (tmp_path / "latin1" / "config.json").write_bytes(b"\xff{}")
    for directory, name in (("notes", "notes.txt"), ("other", "config.json")):
        (tmp_path / directory).mkdir()
        _write(tmp_path / directory / name, '{"theirs": true}')
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["train", *(a.replace("{tmp}", str(tmp_path)) for a in argv)]) == 2
    shown = capsys.readouterr().err
    expected = expected.replace("{tmp}", str(tmp_path))
    assert shown.startswith("error: ") and expected in shown, shown
    # Nothing of another program's directory is written over.
    assert (tmp_path / "other" / "config.json").read_text() == '{"theirs": true}'
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["notes.txt"]
    assert len(shown.strip().splitlines()) == 1, shown
    assert not (tmp_path / "runs").exists()  # a config error leaves no run directory behind


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--steps", "-5"],
        ["train", "--steps", "many"],
        ["train", "--steps", "1.5"],
        ["train", "--steps", "1e400"],
        ["eval", "somewhere", "--episodes", "0"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


def test_steps_may_be_written_as_a_whole_float() -> None:
    from nnx_ppo.cli.main import _positive_int

    assert _positive_int("1e6") == _positive_int("1000000") == 1_000_000
    assert _positive_int("2.5E3") == 2500


def test_eval_of_a_missing_run_or_checkpoint_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a run directory" in capsys.readouterr().err
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(preset("cartpole")))
    assert main(["eval", str(run_dir)]) == 2
    shown = " ".join(capsys.readouterr().err.split())
    assert f"no checkpoint in {run_dir}: expected step directories (e.g. " in shown
    assert str(run_dir / "checkpoints" / "step_0000100000") in shown  # where a run keeps them


def test_a_run_directory_holding_030_checkpoints_is_refused_and_left_as_it_was(
    tmp_path: Path, checkpoints_030: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Taken for no checkpoint, a new run there would have written its own over them.
    run_dir = tmp_path / "run"
    shutil.copytree(checkpoints_030, run_dir / "checkpoints")
    (run_dir / "config.json").write_text(json.dumps(preset("cartpole")))

    def files() -> dict[Path, bytes | None]:
        """Everything under the run directory but the lock, which a trainer leaves."""
        return {
            p: p.read_bytes() if p.is_file() else None
            for p in run_dir.rglob("*")
            if p.name != run_dir_module.LOCK_FILE
        }

    before = files()
    for argv in (
        ["train", "--resume", str(run_dir), *TINY],
        ["train", "--run-dir", str(run_dir), *TINY],
        ["eval", str(run_dir)],
    ):
        assert main(argv) == 2
        shown = " ".join(capsys.readouterr().err.split())
        assert "step_0000000000 is a checkpoint of nnx-ppo 0.3.0" in shown
    assert files() == before


def test_logging_level_takes_flag_names_and_hidden_sizes_a_single_width() -> None:
    from nnx_ppo.algorithms.types import LoggingLevel

    config = preset("cartpole")
    for written, level in (
        ("ALL", LoggingLevel.ALL),
        ("LOSSES|GRAD_NORM", LoggingLevel.LOSSES | LoggingLevel.GRAD_NORM),
        ("LOSSES | WEIGHTS", LoggingLevel.LOSSES | LoggingLevel.WEIGHTS),
        (["LOSSES", "WEIGHTS"], LoggingLevel.LOSSES | LoggingLevel.WEIGHTS),
    ):
        config["train"]["ppo"]["logging_level"] = written
        assert parse_run_config(config)[1].ppo.logging_level == level
    config["network"]["hidden_sizes"] = 64
    assert parse_run_config(config)[0]["network"]["hidden_sizes"] == [64]


def test_evaluation_and_checkpoint_cadence_follow_the_run_length() -> None:
    config = preset("cartpole")  # 32 envs x 64 steps: 2,048 env steps per PPO step
    config["train"]["ppo"]["total_steps"] = 50_000
    scaled = follow_run_length(config, given=set())["train"]
    assert scaled["eval"]["every_steps"] == 3 * 2048  # 9 evaluations over 51,200 steps
    assert scaled["checkpoint_every_steps"] == 5 * 2048
    config["train"]["ppo"]["total_steps"] = 5e4  # written as a float, the same count
    assert follow_run_length(config, given=set())["train"] == scaled
    assert cadences_set_by_hand(follow_run_length(config, given=set())) == set()
    config["train"]["eval"]["every_steps"] = 10_000
    kept = follow_run_length(config, given={"train.eval.every_steps"})["train"]
    assert kept["eval"]["every_steps"] == 10_000


# ------------------------------------------------------------------------------ kill -9


def _wait_for(condition: Any, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert process.poll() is None, process.communicate()[0].decode()
        assert time.monotonic() < deadline, f"no {what} within 2 minutes"
        time.sleep(0.005)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _writing_a_checkpoint(run_dir: Path) -> bool:
    checkpoints = run_dir / "checkpoints"
    return checkpoints.is_dir() and any("tmp" in p.name for p in checkpoints.iterdir())


@pytest.mark.parametrize("seed", [0, 1])
def test_kill_9_then_resume_continues_from_the_newest_complete_checkpoint(
    seed: int, finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two kills: one while a checkpoint is written, one at a random point (often an
    evaluation or a step); then the run resumes to the end and equals an uninterrupted one."""
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    every_step = ["--set", f"eval.every_steps={STEP}", "--set", f"checkpoint_every_steps={STEP}"]
    command = [sys.executable, "-m", "nnx_ppo", "train"]
    sessions = [
        [*command, "--steps", str(4 * STEP), "--run-dir", str(run_dir), *TINY, *every_step],
        [*command, "--resume", str(run_dir)],
    ]
    metrics = run_dir / "metrics.jsonl"
    for session, argv in enumerate(sessions):
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=os.environ | {"JAX_PLATFORMS": "cpu"},
        )
        try:
            logged = _lines(metrics)
            _wait_for(lambda logged=logged: _lines(metrics) > logged, process, "metrics")
            if session == 0:
                # A second trainer of the same directory is refused while the first runs
                # (stopped meanwhile, so that it is still at its first checkpoints after).
                process.send_signal(signal.SIGSTOP)
                try:
                    capsys.readouterr()
                    assert train(run_dir, 4 * STEP) == 2
                    refusal = f"is being trained by process {process.pid}"
                    assert refusal in capsys.readouterr().err
                finally:
                    process.send_signal(signal.SIGCONT)
                _wait_for(lambda: _writing_a_checkpoint(run_dir), process, "checkpoint write")
            else:
                time.sleep(rng.uniform(0.0, 2.0))
        finally:
            process.kill()  # SIGKILL: no handler runs, no file is closed cleanly
            process.wait()

    assert resume(run_dir) == 0
    assert steps_logged(run_dir) == [k * STEP for k in range(5)]  # exactly one record per step
    assert find_checkpoint(run_dir)[1] == 4 * STEP
    # Every resume started from a checkpoint: the result is the uninterrupted run's, bit for
    # bit (same machine, same compiled step: what resuming promises).
    for a, b in zip(parameters(finished_run), parameters(run_dir), strict=True):
        np.testing.assert_array_equal(a, b)


def test_resume_refuses_only_the_settings_that_shape_the_saved_state() -> None:
    from nnx_ppo.cli.presets import changed_on_resume

    saved = preset("cartpole")
    wanted = json.loads(json.dumps(saved))
    wanted["train"]["ppo"]["learning_rate"] = 3e-4
    wanted["train"]["ppo"]["gradient_clipping"] = 1.0  # another value: the same optimizer state
    wanted["train"]["ppo"]["weight_decay"] = False  # off, as null is
    assert changed_on_resume(saved, wanted) == []
    wanted["train"]["ppo"]["gradient_clipping"] = None  # off: another optimizer state
    wanted["train"]["ppo"]["weight_decay"] = 0.0  # on: a stage more in the optimizer
    wanted["network"]["activation"] = "relu"
    wanted["train"]["ppo"]["learning_rate_schedule"] = "linear"  # another optimizer state
    assert changed_on_resume(saved, wanted) == [
        'network.activation is "tanh" in the run, "relu" here',
        "ppo.gradient_clipping is 0.5 in the run, null here",
        "ppo.weight_decay is null in the run, 0.0 here",
        'ppo.learning_rate_schedule is "constant" in the run, "linear" here',
    ]
    # The env's options build the env whose states the checkpoint holds.
    wanted = json.loads(json.dumps(saved))
    wanted["env_kwargs"] = {"max_steps": 3}
    assert changed_on_resume(saved, wanted) == [
        'env_kwargs is {} in the run, {"max_steps": 3} here'
    ]
    del saved["env_kwargs"]  # a config.json written before the field existed: no options
    assert changed_on_resume(saved, json.loads(json.dumps(preset("cartpole")))) == []


def test_env_kwargs_must_be_an_object_and_counts_may_be_whole_floats() -> None:
    config = preset("cartpole")
    config["env_kwargs"] = 3
    with pytest.raises(ValueError, match=r"config field env_kwargs must be an object .* got 3$"):
        parse_run_config(config)
    config["env_kwargs"], config["episode_length"] = {}, 1e3
    assert parse_run_config(config)[0]["episode_length"] == 1000


def test_a_resumed_run_rounds_its_length_from_the_step_it_resumes_at() -> None:
    from nnx_ppo.cli.main import _planned_steps

    assert _planned_steps(502, 0, 128) == (
        512,
        " (502 rounded up to whole PPO steps of 128)",
    )
    assert _planned_steps(1024, 0, 128) == (1024, "")
    # Resumed at 768 with steps of 160 (another rollout_length): 768 + 2 * 160.
    assert _planned_steps(1024, 768, 160) == (
        1088,
        " (1,024 rounded up to whole PPO steps of 160 from step 768)",
    )
    assert _planned_steps(1024, 1024, 160) == (1024, "")


def test_the_closed_loop_noise_of_a_failed_checkpoint_read_is_dropped_and_nothing_else() -> None:
    from types import SimpleNamespace

    from nnx_ppo.cli.main import _without_closed_loop_noise

    seen: list[BaseException] = []
    hook = _without_closed_loop_noise(lambda unraisable: seen.append(unraisable.exc_value))
    closed, other = RuntimeError("Event loop is closed"), RuntimeError("a real failure")
    for error in (closed, other, ValueError("Event loop is closed")):
        hook(SimpleNamespace(exc_value=error))
    assert [str(e) for e in seen] == ["a real failure", "Event loop is closed"]
    assert isinstance(seen[1], ValueError)
