"""Training runs over several forced CPU devices, for tests/algorithms/test_sharding.py.

Run as a script in a fresh process (the device count is fixed when JAX starts):
``python sharded_runs.py MODE OUT_JSON [ARGS]``. It prints nothing the test reads;
it writes its findings as JSON to ``OUT_JSON``.

Modes:
  ``equivalence DIR``  train on 1 device and on 4 (same seed and global batch);
                      checkpoint the 4-device run, resume it on 1 and the 1-device
                      run on 4, and report every difference and placement.
  ``errors``           what train_ppo raises for layouts that do not split.
  ``two_axes``         PPO steps over a (2, 2) mesh ("data", "model") and over a data
                      mesh of 2 devices: the differences, placements and a refusal.
  ``runs``             ``train_ppo_runs`` with its runs on 1 device and split over 2:
                      the differences, placements, collectives and refusals.
  ``distributed DIR PORT PROCESS_ID``  one of two processes (2 devices each) running
                      ``nnx-ppo train`` over all 4; saves its final parameters.
  ``lost DIR PORT PROCESS_ID``  the same with one device each, but process 1 dies
                      (``os._exit``) after its second PPO step; process 0's ``main``
                      exits without returning.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

THREADS_PER_DEVICE = 4
HANG_REPORT_SECONDS = 250
DEVICES = {"distributed": 2, "lost": 1}.get(sys.argv[1], 4)
# Forced devices are threads: on 2 busy cores one can reach an all-reduce more than
# XLA's default 40 s after the others, which aborts the process. Wait longer.
os.environ["XLA_FLAGS"] = (
    f"--xla_force_host_platform_device_count={DEVICES} "
    "--xla_cpu_collective_timeout_seconds=900 "
    "--xla_cpu_collective_call_terminate_timeout_seconds=900"
)
# XLA:CPU sizes its thread pools at max(cores, devices) (NPROC overrides the cores):
# on 2 cores, one thread per device. A program's thunks run concurrently on those
# threads, and a thread that reaches an all-reduce blocks there until every device
# arrives: with no thread to spare, a device's work can wait for a thread that never
# frees. Runs here hung that way now and then under a busy test suite.
os.environ["NPROC"] = str(THREADS_PER_DEVICE * DEVICES)
# A run that hangs anyway prints where and exits before the test's own time limit.
faulthandler.dump_traceback_later(HANG_REPORT_SECONDS, exit=True)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from nnx_ppo.algorithms import _train  # noqa: E402
from nnx_ppo.algorithms.checkpointing import load_checkpoint, make_checkpoint_fn  # noqa: E402
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig  # noqa: E402
from nnx_ppo.algorithms.ppo import new_training_state, train_ppo, train_ppo_runs  # noqa: E402
from nnx_ppo.envs import make  # noqa: E402
from nnx_ppo.networks.factories import make_default_network  # noqa: E402

N_ENVS, ROLLOUT = 16, 8
STEP = N_ENVS * ROLLOUT


def config(devices: int, total_steps: int, **eval_options: Any) -> TrainConfig:
    eval_config = EvalConfig(n_envs=8, max_episode_length=20, every_steps=10**9)
    for name, value in eval_options.items():
        setattr(eval_config, name, value)
    return TrainConfig(
        ppo=PPOConfig(
            n_envs=N_ENVS,
            rollout_length=ROLLOUT,
            n_minibatches=2,
            n_epochs=2,
            total_steps=total_steps,
        ),
        eval=eval_config,
        devices=devices,
        checkpoint_every_steps=10**9,
    )


def parameters(networks: nnx.Module) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(networks, nnx.Param))]


def largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def specs(tree: Any) -> list[str]:
    return sorted({str(leaf.sharding.spec) for leaf in jax.tree.leaves(tree)})


def equivalence(directory: Path) -> dict[str, Any]:
    # The memory task with an LSTM: carries and per-env keys to place as well.
    env = make("memory")

    def network() -> nnx.Module:
        return make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))

    found: dict[str, Any] = {}
    runs = {}
    dispatched_ahead = {"calls": 0}
    dispatch_next = _train.dispatch_next

    def counted(*args: Any, **kwargs: Any) -> Any:
        dispatched_ahead["calls"] += 1
        return dispatch_next(*args, **kwargs)

    _train.dispatch_next = counted
    for devices in (1, 4):
        networks = network()
        checkpoint_fn = make_checkpoint_fn(directory / f"on{devices}")
        dispatched_ahead["calls"] = 0
        result = train_ppo(env, networks, config(devices, 2 * STEP), checkpoint_fn=checkpoint_fn)
        checkpoint_fn(result.training_state, result.total_steps)
        state = result.training_state
        runs[devices] = parameters(networks)
        found[f"devices_{devices}"] = {
            "env_state_devices": len(jax.tree.leaves(state.env_states)[0].sharding.device_set),
            "env_state_specs": specs(state.env_states),
            "carry_specs": specs(state.network_states),
            "parameter_specs": specs(nnx.state(networks, nnx.Param)),
            "eval_return": result.eval_history[-1]["episode_reward_mean"],
            "dispatched_ahead": dispatched_ahead["calls"],
        }
    _train.dispatch_next = dispatch_next
    found["parameter_difference"] = largest_difference(runs[1], runs[4])
    found["moving_collectives"] = moving_collectives(env, state, config(4, STEP).ppo)

    # Both continue for one more step: straight on, and from the other's checkpoint.
    resumed = {}
    for saved_on, resume_on in ((4, 1), (1, 4)):
        networks = network()
        template = new_training_state(env, networks, N_ENVS, 17)
        state = load_checkpoint(directory / f"on{saved_on}", template)["training_state"]
        result = train_ppo(env, networks, config(resume_on, 3 * STEP), initial_state=state)
        resumed[saved_on] = parameters(networks)
        found[f"resumed_{saved_on}_on_{resume_on}"] = {
            "steps": result.total_steps,
            "env_state_devices": len(
                jax.tree.leaves(result.training_state.env_states)[0].sharding.device_set
            ),
        }
    found["resumed_difference"] = largest_difference(resumed[4], resumed[1])
    return found


def moving_collectives(env: Any, state: Any, ppo_config: PPOConfig) -> list[str]:
    """The collectives in the compiled 4-device PPO step that move data between devices.

    All-reduces (the gradient, statistics, metrics) sum in place; an all-gather,
    all-to-all, collective-permute or reduce-scatter would move rollout data.
    """
    from nnx_ppo.algorithms import _step, sharding

    mesh = sharding.mesh_of(state)
    graphdef, arrays = nnx.split((state.networks, state.optimizer))
    carry = _step.StepCarry(
        state.network_states, state.env_states, state.running_episodes, state.rng_key
    )
    with sharding.training_mesh(mesh):
        lowered = _step._compiled_steps.lower(
            _step._EnvArgument(env),
            _step._ConfigArgument(ppo_config),
            _step._GraphArgument(graphdef),
            arrays,
            carry,
            1,
        )
    text = lowered.compile().as_text()
    pattern = r"\b(all-gather|all-to-all|collective-permute|reduce-scatter)[-a-z]*\("
    return sorted(set(re.findall(pattern, text)))


def errors() -> dict[str, str]:
    env = make("cartpole")
    eight_minibatches = config(4, STEP)
    eight_minibatches.ppo.n_minibatches = 8
    attempts = {
        "n_envs": eight_minibatches,
        "eval_n_envs": config(4, STEP, n_envs=6),
        "too_many_devices": config(8, STEP),
    }
    found = {}
    for name, train_config in attempts.items():
        networks = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
        try:
            train_ppo(env, networks, train_config)
        except ValueError as error:
            found[name] = str(error)
        else:
            found[name] = "no error"
    # A state of another env count is named as on one device, not as a layout that
    # does not split over the 4 devices.
    networks = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
    six_envs = new_training_state(env, networks, 6, 0)
    try:
        train_ppo(env, networks, config(4, STEP), initial_state=six_envs)
    except ValueError as error:
        found["other_env_count"] = str(error)
    found["contract"] = contract_message_under_a_mesh()
    return found


def contract_message_under_a_mesh() -> str:
    """A module breaking its contract inside a step traced over 4 devices."""
    from nnx_ppo import ContractError
    from nnx_ppo.algorithms import sharding
    from nnx_ppo.networks.feedforward import Dense

    layer = Dense(3, 2, nnx.Rngs(0))
    mesh = sharding.data_mesh(4)

    @jax.jit
    def call(x: jax.Array) -> Any:
        return layer(layer.initialize_state(8), x[0])  # drops the batch axis

    try:
        with sharding.training_mesh(mesh):
            call(jax.numpy.ones((8, 3)))
    except ContractError as error:
        return str(error)
    return "no error"


def two_axes() -> dict[str, Any]:
    """PPO steps over a (2, 2) mesh ("data", "model") and over a data mesh of 2 devices:
    the envs split in two along "data" both times, copied along "model"."""
    from nnx_ppo.algorithms import sharding
    from nnx_ppo.algorithms.ppo import ppo_steps

    env = make("cartpole")
    # 12 envs: a multiple of the 2 "data" devices x 2 minibatches, not of all 4 devices x 2.
    ppo = PPOConfig(n_envs=12, rollout_length=ROLLOUT, n_minibatches=2, n_epochs=1)
    grid = jax.sharding.Mesh(
        np.array(jax.devices()).reshape(2, 2),
        (sharding.DATA_AXIS, "model"),
        axis_types=(jax.sharding.AxisType.Auto,) * 2,
    )
    found: dict[str, Any] = {}
    trained = {}
    for name, mesh in (("data_2", sharding.data_mesh(2)), ("grid", grid)):
        networks = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
        state = sharding.shard_training_state(new_training_state(env, networks, 12, 0), mesh)
        state, _ = ppo_steps(env, state, ppo, 2)
        trained[name] = parameters(networks)
        placed = jax.tree.leaves(state.env_states)[0].sharding
        found[name] = {
            "env_state_devices": len(placed.device_set),
            "env_state_specs": specs(state.env_states),
            "parameter_specs": specs(nnx.state(networks, nnx.Param)),
            "stays_on_its_mesh": sharding.mesh_of(state) == mesh,
        }
    found["parameter_difference"] = largest_difference(trained["data_2"], trained["grid"])
    networks = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
    try:
        sharding.shard_training_state(new_training_state(env, networks, 5, 0), grid)
    except ValueError as error:
        found["uneven"] = str(error)
    return found


def runs() -> dict[str, Any]:
    """Four runs of one config in one program: on one device, then two runs per device."""
    from nnx_ppo.algorithms import _step

    env = make("cartpole")

    def network(seed: int) -> nnx.Module:
        return make_default_network(env, nnx.Rngs(seed), hidden_sizes=(8,))

    def train(devices: int, seeds: list[int]) -> Any:
        logged: list[list[int]] = [[] for _ in seeds]
        results = train_ppo_runs(
            env,
            network,
            config(devices, 2 * STEP, every_steps=2 * STEP),
            seeds=seeds,
            learning_rates=[1e-3 * (1 + seed % 2) for seed in seeds],
            log_fn=lambda run, metrics, step: logged[run].append(step),
        )
        return results, logged

    found: dict[str, Any] = {}
    trained = {devices: train(devices, [0, 1, 2, 3]) for devices in (1, 2)}
    (one, logged_one), (two, logged_two) = trained[1], trained[2]
    found["parameter_difference"] = max(
        largest_difference(
            parameters(a.training_state.networks), parameters(b.training_state.networks)
        )
        for a, b in zip(one, two, strict=True)
    )
    found["runs_differ"] = largest_difference(
        parameters(two[0].training_state.networks), parameters(two[1].training_state.networks)
    )
    found["eval_returns"] = [
        [h["episode_reward_mean"] for h in result.eval_history] for result in (*one, *two)
    ]
    found["logged_steps_equal"] = logged_one == logged_two
    # Each run comes back whole, on one device, as a single run's state would.
    found["result_devices"] = sorted(
        {
            len(leaf.sharding.device_set)
            for result in two
            for leaf in jax.tree.leaves(
                (nnx.state(result.training_state.networks), result.training_state.env_states)
            )
        }
    )
    # No collective in the two-device program: every run trains on its own device, and
    # its inputs come split as the program takes them, so nothing is moved at its edges.
    from nnx_ppo.algorithms import sharding
    from nnx_ppo.algorithms._runs import _stack

    mesh = sharding.runs_mesh(2, 4)
    where = NamedSharding(mesh, PartitionSpec(sharding.RUNS_AXIS))
    state = two[0].training_state
    graphdef, arrays = nnx.split((state.networks, state.optimizer))
    lowered = _step._compiled_run_steps.lower(
        _step._EnvArgument(env),
        _step._ConfigArgument(config(2, STEP).ppo),
        _step._GraphArgument(graphdef),
        _stack([arrays] * 4, where),
        _stack([_step._carry_of(state)] * 4, where),
        1,
        mesh,
    )
    pattern = r"\b(all_reduce|all_gather|all_to_all|collective_permute|reduce_scatter)\b"
    found["collectives"] = sorted(set(re.findall(pattern, lowered.as_text())))
    found["manual"] = "manual_computation" in lowered.as_text()
    # Left to choose, a sweep takes as many of the 4 devices as divide its runs.
    found["default_devices"] = [
        1 if (chosen := sharding.runs_mesh(None, runs)) is None else chosen.devices.size
        for runs in (1, 3, 4, 6, 8)
    ]
    for name, devices, seeds in (("uneven", 2, [0, 1, 2]), ("too_many", 8, [0] * 8)):
        try:
            train(devices, seeds)
        except ValueError as error:
            found[name] = str(error)
        else:
            found[name] = "no error"
    return found


def train_command(directory: Path, port: int, process_id: int, steps: int) -> list[str]:
    """``nnx-ppo train`` as one of two processes, 64 envs over all their devices."""
    return [
        "train",
        "--quiet",
        "--steps",
        str(steps),
        "--set",
        "ppo.n_envs=64",
        "--set",
        "ppo.rollout_length=8",
        "--set",
        "eval.n_envs=8",
        "--set",
        "eval.max_episode_length=20",
        "--run-dir",
        str(directory / f"run_of_process_{process_id}"),
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
        "--process-id",
        str(process_id),
    ]


def distributed(directory: Path, port: int, process_id: int) -> dict[str, Any]:
    import nnx_ppo.algorithms.ppo as ppo
    from nnx_ppo.algorithms import sharding
    from nnx_ppo.cli.main import main

    results = []
    trained = ppo.train_ppo

    def remembered(*args: Any, **kwargs: Any) -> Any:
        results.append(trained(*args, **kwargs))
        return results[-1]

    ppo.train_ppo = remembered
    status = main(train_command(directory, port, process_id, steps=2 * 64 * 8))
    networks = results[-1].training_state.networks
    np.savez(directory / f"parameters_{process_id}.npz", *parameters(networks))
    # Two devices of four are process 0's alone; process 1 would have no share of the envs.
    try:
        sharding.data_mesh(2)
        too_few = "no error"
    except ValueError as error:
        too_few = str(error)
    # Each process seeds its own state: the replicated copies would differ.
    env = make("cartpole")
    network = make_default_network(env, nnx.Rngs(process_id), hidden_sizes=[8])
    try:
        sharding.shard_training_state(
            ppo.new_training_state(env, network, 8, process_id), sharding.data_mesh()
        )
        unlike = "no error"
    except ValueError as error:
        unlike = str(error)
    return {
        "status": status,
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "steps": results[-1].total_steps,
        "too_few": too_few,
        "unlike": unlike,
    }


def lost(directory: Path, port: int, process_id: int) -> dict[str, Any]:
    import nnx_ppo.algorithms.ppo as ppo
    from nnx_ppo.cli.main import main

    trained = ppo.train_ppo

    def dies_after_two_steps(*args: Any, log_fn: Any, **kwargs: Any) -> Any:
        def log_then_die(metrics: dict[str, float], step: int) -> None:
            log_fn(metrics, step)
            if step >= 2 * 64 * 8:
                os._exit(3)

        return trained(*args, log_fn=log_then_die, **kwargs)

    if process_id == 1:
        ppo.train_ppo = dies_after_two_steps
    return {"status": main(train_command(directory, port, process_id, steps=100 * 64 * 8))}


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "equivalence":
        report = equivalence(Path(sys.argv[3]))
    elif mode == "errors":
        report = errors()
    elif mode == "runs":
        report = runs()
    elif mode == "two_axes":
        report = two_axes()
    else:
        run = distributed if mode == "distributed" else lost
        report = run(Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    out.write_text(json.dumps(report))
