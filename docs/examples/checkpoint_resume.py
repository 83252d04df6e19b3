"""Checkpoints from Python: write them, stop a run early, resume it, restore a network."""

import tempfile
from pathlib import Path

import jax
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.checkpointing import load_checkpoint, make_checkpoint_fn
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state, train_ppo
from nnx_ppo.algorithms.rollout import eval_rollout
from nnx_ppo.networks.factories import make_default_network

env = envs.make("cartpole")
config = TrainConfig(
    ppo=PPOConfig(n_envs=4, rollout_length=16, total_steps=320, n_minibatches=2),
    eval=EvalConfig(enabled=False),
    checkpoint_every_steps=128,
)


def fresh_network():
    return make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))


with tempfile.TemporaryDirectory() as root:
    directory = Path(root) / "checkpoints"
    checkpoint_fn = make_checkpoint_fn(directory, config, keep_last=3)
    reached = {"step": 0}

    def log_fn(metrics, step):
        reached["step"] = step

    # should_stop is polled after every compiled call, here every PPO step (the CLI sets
    # it from Ctrl-C); a final checkpoint of the state reached is written before
    # train_ppo returns.
    stopped = train_ppo(
        env,
        fresh_network(),
        config,
        log_fn=log_fn,
        checkpoint_fn=checkpoint_fn,
        should_stop=lambda: reached["step"] >= 192,
    )
    print("stopped early at", stopped.total_steps, "of", config.ppo.total_steps)
    print("steps on disk:", sorted(p.name for p in directory.iterdir()))

    # Resume: a template of the same architecture, n_envs and optimizer (built from the
    # config as train_ppo builds it), filled in from the latest step.
    ppo = config.ppo
    template = new_training_state(
        env,
        fresh_network(),
        ppo.n_envs,
        config.seed,
        ppo.optimizer_learning_rate(),
        ppo.gradient_clipping,
        ppo.weight_decay,
    )
    loaded = load_checkpoint(directory, template)
    print("loaded step", loaded["step"], "and its config:", loaded["config"] == config)
    result = train_ppo(env, template.networks, config, initial_state=loaded["training_state"])
    print("resumed run ended at", result.total_steps, "after", result.total_iterations, "steps")

    # Parameters and statistics only, for evaluation.
    network = fresh_network()
    load_checkpoint(directory, network, step=128)
    network.eval()
    metrics = eval_rollout(env, network, 4, 100, jax.random.key(0))
    print(f"evaluated the step-128 policy: lifespan {float(metrics['eval/lifespan/mean']):.1f}")
