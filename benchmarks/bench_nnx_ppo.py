"""Time one nnx-ppo training run; the same script runs against this repo and nnx-ppo 0.3.0.

It uses only 0.3.0's public API (``train_ppo``, the config dataclasses,
``make_mlp_actor_critic``, the episode and reward-scaling wrappers), which this
repo keeps, so both venvs run it unchanged. Workloads 0.3.0 cannot run (the
built-in envs and the discrete and LSTM networks are new) are refused there
with a reason rather than approximated.

Per-iteration times come from the ``log_fn`` callback, called once after every
PPO iteration (with ``--iterations-per-call N``, the calls of one compiled call
arrive together, so only whole-run figures mean anything). ``--runs N`` trains
N seeds in one program (``train_ppo_runs``) and counts the steps of all of them. Evaluation is
off, as it is in the Brax and rejax runs, so every library does the same work.

    python benchmarks/bench_nnx_ppo.py --workload A --total-steps 20000
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from bench_common import WORKLOADS, IterationClock, Workload, emit


def _make_env(workload: Workload) -> Any:
    """The training env: Playground's (MJX backend) with a time limit, or a built-in."""
    if workload.env in ("cartpole", "memory"):
        from nnx_ppo.envs import make  # new in 0.4: 0.3.0 has no built-in envs

        return make(workload.env)
    from mujoco_playground import registry

    from nnx_ppo.wrappers.episode_wrapper import EpisodeWrapper

    env: Any = registry.load(workload.env, config_overrides={"impl": "jax"})
    env = EpisodeWrapper(env, workload.episode_length)
    if workload.reward_scaling != 1.0:
        from nnx_ppo.wrappers.reward_scaling_wrapper import RewardScalingWrapper

        env = RewardScalingWrapper(env, workload.reward_scaling)
    return env


def _make_network(workload: Workload, env: Any, network: str, seed: int = 0) -> Any:
    from flax import nnx

    from nnx_ppo.networks import factories

    rngs = nnx.Rngs(seed)
    sizes = (list(workload.actor_sizes), list(workload.critic_sizes))
    if network == "lstm":
        return factories.make_lstm_actor_critic(
            env.observation_size,
            env.action_size,
            workload.actor_sizes[0],
            rngs,
            discrete=True,
            activation=workload.activation,
            normalize_obs=workload.normalize_obs,
        )
    if getattr(env, "discrete_actions", False):
        return factories.make_discrete_mlp_actor_critic(
            env.observation_size,
            env.action_size,
            *sizes,
            rngs,
            activation=workload.activation,
            normalize_obs=workload.normalize_obs,
            entropy_weight=workload.entropy_cost,
        )
    return factories.make_mlp_actor_critic(
        env.observation_size,
        env.action_size,
        *sizes,
        rngs,
        activation=workload.activation,
        normalize_obs=workload.normalize_obs,
        entropy_weight=workload.entropy_cost,
    )


def _config(workload: Workload, iterations_per_call: int) -> Any:
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig

    small = workload.env == "cartpole"
    fused = {} if iterations_per_call == 1 else {"iterations_per_call": iterations_per_call}
    ppo = PPOConfig(
        **fused,
        n_envs=workload.n_envs,
        rollout_length=workload.rollout_length,
        total_steps=workload.total_steps,
        gae_lambda=workload.gae_lambda,
        discounting_factor=workload.discount,
        clip_range=workload.clip,
        learning_rate=workload.learning_rate,
        n_epochs=workload.n_epochs,
        n_minibatches=workload.n_minibatches,
        # CleanRL's value-loss weight and gradient clipping for its CartPole config.
        critic_loss_weight=0.5 if small else 1.0,
        gradient_clipping=0.5 if small else None,
    )
    return TrainConfig(ppo=ppo, eval=EvalConfig(enabled=False), seed=0)


def prepared_state(workload: Workload, owner: str, seed: int = 0) -> tuple[Any, Any, Any]:
    """``(env, PPOConfig, training state)`` of one run of ``workload``, ready for the step
    programs (this repo only: the scripts that time its programs one by one)."""
    from nnx_ppo.algorithms import _step
    from nnx_ppo.algorithms.ppo import new_training_state

    env = _make_env(workload)
    config = _config(workload, 1).ppo
    network = _make_network(workload, env, "mlp", seed)
    state = new_training_state(
        env,
        network,
        config.n_envs,
        seed,
        config.optimizer_learning_rate(),  # the optimizer train_ppo builds from config
        config.gradient_clipping,
        config.weight_decay,
    )
    return env, config, _step._prepared(owner, state, config)


def step_arguments(workload: Workload, owner: str) -> tuple[Any, Any, Any, tuple[Any, ...]]:
    """:func:`prepared_state` and the leading arguments of its step programs
    (``env, config, graph, module state, carry``, as the library passes them)."""
    from nnx_ppo.algorithms import _step

    env, config, state = prepared_state(workload, owner)
    split = _step._split((state.networks, state.optimizer))
    return env, config, state, _step._program_arguments(env, config, split, state)


def main() -> None:
    parser = argparse.ArgumentParser(description="time one nnx-ppo training run")
    parser.add_argument("--workload", choices=list(WORKLOADS), required=True)
    parser.add_argument("--network", choices=["mlp", "lstm"], default="mlp")
    parser.add_argument("--total-steps", type=int)
    parser.add_argument(
        "--iterations-per-call", type=int, default=1, help="PPO steps per compiled call"
    )
    parser.add_argument("--runs", type=int, default=1, help="seeds trained in one program")
    args = parser.parse_args()
    clock = IterationClock()

    import nnx_ppo
    from nnx_ppo.algorithms.ppo import train_ppo

    workload = WORKLOADS[args.workload]
    if args.total_steps:
        workload = dataclasses.replace(workload, total_steps=args.total_steps)
    result: dict[str, Any] = {"library": "nnx-ppo", "version": nnx_ppo.__version__}
    result |= {"workload": args.workload, "network": args.network}
    result |= {"iterations_per_call": args.iterations_per_call, "runs": args.runs}
    new_api = not nnx_ppo.__version__.startswith("0.3.")
    if workload.env in ("cartpole", "memory") and not new_api:
        # 0.3.0 has neither nnx_ppo.envs nor the discrete and LSTM factories.
        emit({**result, "unavailable": "nnx-ppo 0.3.0 has no built-in envs or discrete networks"})
        return
    if not new_api and (args.runs > 1 or args.iterations_per_call > 1):
        emit({**result, "unavailable": "nnx-ppo 0.3.0 trains one run, one step per call"})
        return
    env = _make_env(workload)
    config = _config(workload, args.iterations_per_call)
    if args.runs == 1:
        network = _make_network(workload, env, args.network)
        train_ppo(env, network, config, log_fn=lambda _metrics, step: clock.tick(step))
    else:
        from nnx_ppo.algorithms.ppo import train_ppo_runs

        def log_fn(run: int, _metrics: Any, step: int) -> None:
            if run == 0:  # every run logs each step; the clock counts all runs' steps
                clock.tick(step * args.runs)

        train_ppo_runs(
            env,
            lambda seed: _make_network(workload, env, args.network, seed),
            config,
            seeds=list(range(args.runs)),
            log_fn=log_fn,
        )
    per_iteration = workload.steps_per_iteration * args.runs
    emit({**result, **clock.summary(), "steps_per_iteration": per_iteration})


if __name__ == "__main__":
    main()
