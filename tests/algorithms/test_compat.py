"""nnx-ppo 0.3.0's README quick example runs unchanged, on built-in envs and a tiny budget.

The example loaded Playground's ``CartpoleBalance`` (continuous actions). Here the
env comes from :func:`nnx_ppo.envs.make`: ``pendulum`` keeps the example's
continuous ``make_mlp_actor_critic``; our ``cartpole`` has discrete actions and
so takes ``make_discrete_mlp_actor_critic``. Only the env line, the factory for
the discrete env, and the budget numbers differ from the README; ``log_fn`` and
the ``THROUGHPUT`` flag are added, as a 0.3.0 training script would use them.
"""

import pytest
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms import ppo
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.networks.factories import make_discrete_mlp_actor_critic, make_mlp_actor_critic
from nnx_ppo.wrappers import episode_wrapper


@pytest.mark.parametrize(
    ("name", "factory"),
    [("pendulum", make_mlp_actor_critic), ("cartpole", make_discrete_mlp_actor_critic)],
)
def test_readme_quick_example(name, factory, capsys):
    env = envs.make(name)
    train_env = episode_wrapper.EpisodeWrapper(env, 1000)

    rngs = nnx.Rngs(0)
    nets = factory(
        env.observation_size,
        env.action_size,
        actor_hidden_sizes=[64] * 4,
        critic_hidden_sizes=[256] * 2,
        rngs=rngs,
        normalize_obs=True,
    )

    logged = []
    result = ppo.train_ppo(
        train_env,
        nets,
        TrainConfig(
            ppo=PPOConfig(
                n_envs=8,
                rollout_length=30,
                total_steps=480,
                logging_level=LoggingLevel.BASIC | LoggingLevel.THROUGHPUT,
            ),
            eval=EvalConfig(enabled=True, every_steps=240, n_envs=4, max_episode_length=20),
        ),
        eval_env=env,
        log_fn=lambda metrics, step: logged.append((step, metrics)),
    )
    print(f"Final eval reward: {result.eval_history[-1]['episode_reward_mean']}")

    assert capsys.readouterr().out.startswith("Final eval reward: ")
    assert [entry["step"] for entry in result.eval_history] == [0, 240, 480]
    assert [step for step, _ in logged] == [0, 240, 480]
    assert {"losses/actor/mean", "losses/critic/mean", "throughput/train_sps"} <= set(logged[-1][1])
    assert {"eval/episode_reward/mean", "throughput/eval_sps"} <= set(logged[-1][1])


def test_ppo_step_with_the_030_arguments_names_the_config_they_make(counting_env, scripted_network):
    state = ppo.new_training_state(counting_env, scripted_network(), 2, seed=0)
    with pytest.raises(TypeError) as caught:
        ppo.ppo_step(counting_env, state, 2, 8, 0.95, 0.99, 0.2, True, False, 4, 2)
    assert "PPOConfig(n_envs=2, rollout_length=8, gae_lambda=0.95, discounting_factor=0.99" in str(
        caught.value
    )
    assert "n_minibatches=2)" in str(caught.value)
    with pytest.raises(TypeError, match=r"PPOConfig\(n_envs=2, clip_range=0.2\)"):
        ppo.ppo_step(counting_env, state, 2, clip_range=0.2)
    # Half migrated: a config, and a field of it beside it.
    config = PPOConfig(n_envs=2, rollout_length=8, n_minibatches=2)
    with pytest.raises(
        TypeError, match=r"no more arguments: set logging_level=... on the PPOConfig"
    ):
        ppo.ppo_step(counting_env, state, config, logging_level=LoggingLevel.LOSSES)
    with pytest.raises(TypeError, match=r"no more arguments: 1 more argument\(s\) were given"):
        ppo.ppo_step(counting_env, state, config, 5)


def test_a_step_called_inside_a_jax_transform_says_it_compiles_itself(
    counting_env, scripted_network
):
    # 0.3.0's steps were wrapped in nnx.jit; these hand floats to the host, and a traced
    # call failed deep inside with a TracerBoolConversionError.
    state = ppo.new_training_state(counting_env, scripted_network(), 2, seed=0)
    config = PPOConfig(n_envs=2, rollout_length=4, n_minibatches=1, n_epochs=1)
    called_inside = r"^ppo_step was called inside jax.jit, nnx.jit or another JAX transform"
    with pytest.raises(TypeError, match=called_inside):
        nnx.jit(lambda state: ppo.ppo_step(counting_env, state, config))(state)
    with pytest.raises(TypeError, match=called_inside):  # the state closed over
        nnx.jit(lambda: ppo.ppo_step(counting_env, state, config))()
    state, _ = ppo.ppo_step(counting_env, state, config)  # called as it is, it runs
    assert state.steps_taken == 8
