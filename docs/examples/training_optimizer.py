"""An optax optimizer with a schedule via new_training_state; the newer PPO options."""

import optax
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step, train_ppo
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.networks.factories import make_default_network

env = envs.make("pendulum", max_steps=50)
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(16,))
ppo = PPOConfig(
    n_envs=8,
    rollout_length=25,
    total_steps=1000,
    n_epochs=4,
    n_minibatches=2,
    value_clip_range=0.5,  # PPO2-style clipping of the value prediction
    advantage_normalization="global",
    target_kl=0.02,  # stop a step's remaining epochs past this approximate KL
    logging_level=LoggingLevel.LOSSES | LoggingLevel.ACTOR_EXTRA,
)
config = TrainConfig(ppo=ppo, eval=EvalConfig(enabled=False))

# The schedule counts optimizer updates: n_epochs * n_minibatches per PPO step.
updates = ppo.total_steps // ppo.steps_per_iteration * ppo.n_epochs * ppo.n_minibatches
schedule = optax.linear_schedule(3e-3, 3e-4, transition_steps=updates)
optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(schedule, weight_decay=1e-4))
state = new_training_state(env, network, ppo.n_envs, seed=0, optimizer=optimizer)

state, metrics = ppo_step(env, state, ppo)  # one step by hand...
print(f"{state.steps_taken} env steps, {metrics['losses/epochs_completed']:.0f} epochs ran")
result = train_ppo(env, network, config, initial_state=state)  # ...then the rest
print("trained to", result.total_steps, "env steps in", result.total_iterations, "more steps")
