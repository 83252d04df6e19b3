"""Training over devices: placement, equivalence with one device, resharded resumes, hosts,
and many runs split over devices.

The runs over several devices happen in fresh processes (``sharded_runs.py``):
the forced CPU device count is fixed when JAX starts, and the rest of the suite
runs on one device.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from nnx_ppo.algorithms import sharding
from nnx_ppo.algorithms.checkpointing import config_from_dict, step_directory
from nnx_ppo.algorithms.config import TrainConfig

SCRIPT = Path(__file__).with_name("sharded_runs.py")


def run_script(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{args[0]}.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), args[0], str(out), *args[1:]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # A hung run reports its Python stacks and exits (faulthandler, in the script).
    assert completed.returncode == 0, completed.stderr[-6000:]
    return json.loads(out.read_text())


def test_four_devices_train_like_one_and_resume_on_another_count(tmp_path):
    found = run_script(tmp_path, "equivalence", str(tmp_path))
    one, four = found["devices_1"], found["devices_4"]
    assert one["env_state_devices"] == 1
    # Env states and carries are split along the env axis; parameters are replicated.
    assert four["env_state_devices"] == 4
    assert "P('data',)" in four["env_state_specs"]
    assert four["carry_specs"] == ["P('data',)"]
    assert four["parameter_specs"] == ["P()"]
    # One device dispatches the next call ahead; four CPU devices never have two
    # programs in flight (their all-reduces can deadlock).
    assert one["dispatched_ahead"] > 0
    assert four["dispatched_ahead"] == 0
    # No rollout moves between devices: the step's only collectives are all-reduces.
    assert found["moving_collectives"] == []
    # Same seed and global batch: the same parameters, up to float reassociation.
    assert found["parameter_difference"] < 1e-5
    assert one["eval_return"] == pytest.approx(four["eval_return"])
    # A checkpoint written on 4 devices resumes on 1, and one written on 1 on 4.
    assert found["resumed_4_on_1"] == {"steps": 3 * 128, "env_state_devices": 1}
    assert found["resumed_1_on_4"] == {"steps": 3 * 128, "env_state_devices": 4}
    assert found["resumed_difference"] < 1e-5


def test_layouts_that_do_not_split_are_refused_before_training(tmp_path):
    found = run_script(tmp_path, "errors")
    assert "ppo.n_envs=16 is not divisible by devices x n_minibatches = 4 x 8" in found["n_envs"]
    assert "eval.n_envs=6 is not divisible by the 4 devices" in found["eval_n_envs"]
    assert "8 devices asked for, but JAX sees 4" in found["too_many_devices"]
    assert "the training state holds 6 envs, but config.n_envs is 16" in found["other_env_count"]
    # A contract error raised while tracing over the mesh says its B is the global one.
    assert "traced over a mesh (data=4): B and every shape above are global" in found["contract"]


def test_a_mesh_of_two_axes_splits_the_envs_along_data_and_copies_them_along_the_other(
    tmp_path,
):
    found = run_script(tmp_path, "two_axes")
    grid, two = found["grid"], found["data_2"]
    # Split in two along "data", a copy of each half along "model": on all 4 devices.
    assert grid["env_state_devices"] == 4
    assert "P('data',)" in grid["env_state_specs"]
    assert grid["parameter_specs"] == two["parameter_specs"] == ["P()"]
    assert grid["stays_on_its_mesh"] and two["stays_on_its_mesh"]
    # The same envs on each "data" device as over a data mesh of 2: the same step.
    assert found["parameter_difference"] < 1e-5
    assert (
        "5 envs do not split evenly over the mesh's 2 devices (the devices along the "
        "mesh's 'data' axis; along model=2 each holds a copy); use a multiple of 2 envs"
    ) in found["uneven"]


def test_many_runs_split_over_devices_train_as_on_one(tmp_path):
    found = run_script(tmp_path, "runs")
    # Four runs, two per device: each equals its run on one device, up to float rounding.
    assert found["parameter_difference"] < 1e-5
    assert found["runs_differ"] > 1e-2
    returns = found["eval_returns"]
    assert [len(history) for history in returns] == [2] * 8  # at the start and the end
    np.testing.assert_allclose(returns[:4], returns[4:], rtol=1e-5)
    assert found["logged_steps_equal"]
    assert found["result_devices"] == [1]
    # Each device trains its own runs: a manual program with no collective in it.
    assert found["manual"]
    assert found["collectives"] == []
    assert "3 runs do not split evenly over 2 devices; give a multiple of 2" in found["uneven"]
    assert "8 devices asked for, but this process sees 4" in found["too_many"]
    assert found["default_devices"] == [1, 3, 4, 3, 4]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_processes_train_as_one_and_only_process_0_writes(tmp_path):
    port = str(_free_port())
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                "distributed",
                str(tmp_path / f"process_{i}.json"),
                str(tmp_path),
                port,
                str(i),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    reports = [json.loads((tmp_path / f"process_{i}.json").read_text()) for i in range(2)]
    for report in reports:
        too_few, unlike = report.pop("too_few"), report.pop("unlike")
        assert report == {"status": 0, "devices": 4, "local_devices": 2, "steps": 1024}
        assert "the 2 devices chosen belong to process(es) [0] only, but 2 processes" in too_few
        assert "the processes start from different training states" in unlike
    first, second = (np.load(tmp_path / f"parameters_{i}.npz") for i in range(2))
    for name in first.files:
        np.testing.assert_array_equal(first[name], second[name])
    written = tmp_path / "run_of_process_0"
    assert (written / "metrics.jsonl").is_file()
    assert step_directory(written / "checkpoints", 1024).is_dir()
    assert not (tmp_path / "run_of_process_1").exists()


def test_a_lost_process_stops_the_others_with_one_error_line_at_once(tmp_path):
    port = str(_free_port())
    arguments = [[str(tmp_path / f"p{i}.json"), str(tmp_path), port, str(i)] for i in range(2)]
    processes = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), "lost", *arguments[i]],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert processes[1].returncode == 3, outputs[1][-3000:]
    # JAX's own exit handlers would wait for the lost process's heartbeat to time out
    # and then abort with a C++ stack trace; process 0 exits at once instead.
    assert processes[0].returncode == 1, outputs[0][-3000:]
    run_dir = tmp_path / "run_of_process_0"
    assert (
        "error: process 0 of 2: a collective with the run's other processes failed, most "
        "likely because one of them stopped" in " ".join(outputs[0].split())
    )
    assert f"resume with nnx-ppo train --resume {run_dir}" in " ".join(outputs[0].split())
    assert "Traceback" not in outputs[0] and "Terminating process" not in outputs[0]
    assert not (tmp_path / "p0.json").exists()  # main did not return


def test_cli_trains_over_four_devices(tmp_path):
    run_dir = tmp_path / "run"
    # As in sharded_runs.py: patient collectives and 4 threads a device, for forced devices
    # on busy cores.
    flags = (
        "--xla_force_host_platform_device_count=4 --xla_cpu_collective_timeout_seconds=900 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=900"
    )
    environment = os.environ | {"XLA_FLAGS": flags, "NPROC": "16"}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "nnx_ppo.cli.main",
            "train",
            "--devices",
            "4",
            "--quiet",
            "--steps",
            "512",
            "--set",
            "ppo.n_envs=32",
            "--set",
            "ppo.rollout_length=16",
            "--set",
            "eval.n_envs=8",
            "--set",
            "eval.max_episode_length=20",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["train"]["devices"] == 4
    assert step_directory(run_dir / "checkpoints", 512).is_dir()


# ------------------------------------------------------------------ in this process


def test_one_device_runs_without_a_mesh():
    assert jax.device_count() == 1
    assert sharding.resolve_mesh(None) is None
    assert sharding.resolve_mesh(1).size == 1


def test_runs_stay_on_one_device_and_bad_device_counts_are_named():
    assert sharding.runs_mesh(None, 3) is None
    assert sharding.runs_mesh(1, 3) is None
    with pytest.raises(ValueError, match="2 devices asked for, but this process sees 1"):
        sharding.runs_mesh(2, 4)
    with pytest.raises(ValueError, match="devices"):
        sharding.runs_mesh(0, 4)
    with pytest.raises(ValueError, match="n_runs"):
        sharding.runs_mesh(None, 0)


def test_one_device_splits_any_batch_and_missing_devices_are_named():
    mesh = sharding.data_mesh(1)
    sharding.require_divisible("here", mesh, 6, 3, 5)  # one device splits anything
    with pytest.raises(ValueError, match="data_mesh: 2 devices asked for, but JAX sees 1"):
        sharding.data_mesh(2)


def test_a_device_list_names_what_is_wrong_with_it_and_a_numpy_count_counts():
    (device,) = jax.devices()
    assert sharding.data_mesh(np.int64(1)).devices.tolist() == [device]  # not iterable before
    with pytest.raises(ValueError, match=r"devices names .* more than once"):
        sharding.data_mesh([device, device])  # an AssertionError inside JAX, later
    with pytest.raises(TypeError, match=r"holds 0 \(int\); for the first N devices"):
        sharding.data_mesh([0])  # AttributeError: 'int' object has no attribute 'process_index'


def test_devices_is_a_config_field():
    with pytest.raises(ValueError, match="devices"):
        TrainConfig(devices=0)
    assert config_from_dict({"devices": 4}).devices == 4
    assert config_from_dict({"devices": None}).devices is None
    with pytest.raises(ValueError, match="config field devices must be an integer"):
        config_from_dict({"devices": "all"})


def test_only_leaves_with_an_env_axis_are_split_over_the_mesh(counting_env, scripted_network):
    from nnx_ppo.algorithms.ppo import new_training_state

    n_envs = 4
    state = new_training_state(counting_env, scripted_network(), n_envs, 0)
    # A table every env reads alike (its leading axis is not the env axis), and a
    # model-wide scalar, beside the per-env fields.
    env_states = state.env_states.replace(
        data=state.env_states.data | {"table": np.arange(3.0), "gravity": np.float32(9.8)}
    )
    placed = sharding.shard_training_state(
        state.replace(env_states=env_states), sharding.data_mesh(1)
    )
    split, whole = jax.sharding.PartitionSpec("data"), jax.sharding.PartitionSpec()
    data = placed.env_states.data
    assert data["table"].sharding.spec == whole
    assert data["gravity"].sharding.spec == whole
    assert data["t"].sharding.spec == split
    assert placed.env_states.done.sharding.spec == split
    assert placed.network_states.sharding.spec == split
    np.testing.assert_array_equal(data["table"], np.arange(3.0))


def test_an_unbatched_env_state_is_named_before_placing(counting_env, scripted_network):
    from nnx_ppo.algorithms.ppo import new_training_state
    from nnx_ppo.contract import ContractError

    state = new_training_state(counting_env, scripted_network(), 4, 0)
    one_env = jax.tree.map(lambda leaf: leaf[0], state.env_states)
    with pytest.raises(ContractError, match=r"shard_training_state: env_state must be batched"):
        sharding.shard_training_state(state.replace(env_states=one_env), sharding.data_mesh(1))


def test_envs_that_do_not_split_over_the_mesh_are_named(counting_env, scripted_network):
    from nnx_ppo.algorithms.ppo import new_training_state

    state = new_training_state(counting_env, scripted_network(), 3, 0)
    # A two-device mesh on this one-device machine: refused before anything is placed.
    (device,) = jax.devices()
    two = jax.sharding.Mesh(np.array([device, device]), (sharding.DATA_AXIS,))
    with pytest.raises(ValueError, match=r"3 envs do not split evenly over the mesh's 2 devices"):
        sharding.shard_training_state(state, two)  # JAX's IndivisibleError before


def test_a_mesh_without_the_data_axis_is_named(counting_env, scripted_network):
    from nnx_ppo.algorithms.ppo import new_training_state

    state = new_training_state(counting_env, scripted_network(), 2, 0)
    (device,) = jax.devices()
    batch = jax.sharding.Mesh(np.array([device]), ("batch",))  # jax.make_mesh's own names
    with pytest.raises(
        ValueError, match=r"the mesh's axes are \('batch',\), but the envs are split .*data_mesh"
    ):
        sharding.shard_training_state(state, batch)  # JAX's "not found in mesh" before


def test_a_mesh_of_explicit_axes_is_named(counting_env, scripted_network):
    from nnx_ppo.algorithms.ppo import new_training_state

    state = new_training_state(counting_env, scripted_network(), 2, 0)
    explicit = jax.make_mesh((1,), (sharding.DATA_AXIS,))  # Explicit axes by default
    with pytest.raises(
        ValueError, match=r"the mesh's axes \('data',\) are not of type Auto .*AxisType.Auto"
    ):
        sharding.shard_training_state(state, explicit)  # JAX's assertion in the trace before


def test_a_shared_table_is_replicated_whatever_its_first_axis():
    # A Shared table of n_envs rows read as per-env by its shape was split over the
    # devices, and gathered back in every step.
    from nnx_ppo.envs.state import Shared

    tree = {"count": np.zeros(5), "obs": np.zeros((8, 3)), "table": Shared(np.zeros((8, 2)))}
    data, whole = jax.sharding.PartitionSpec("data"), jax.sharding.PartitionSpec()
    assert sharding._env_specs(tree, 8) == [whole, data, whole]
