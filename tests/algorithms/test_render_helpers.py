"""The 0.3.0 rendering helpers: record_episode's states, slimmed, and unstacked for render."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.rollout import (
    SlimData,
    SlimState,
    eval_rollout_for_render_scan,
    record_episode,
    unstack_trajectory,
)
from nnx_ppo.envs import CartPole
from nnx_ppo.networks import make_discrete_mlp_actor_critic

STEPS = 5


@pytest.fixture(scope="module")
def network():
    net = make_discrete_mlp_actor_critic(4, 2, [4], [4], nnx.Rngs(0), normalize_obs=False)
    net.eval()  # the same actions in both rollouts below
    return net


def test_slim_states_are_record_episodes_states(network):
    env, key = CartPole(max_steps=3), jax.random.key(1)
    (states, final_state, episode_return), (trajectory, expected_return) = nnx.jit(
        lambda network, key: (
            eval_rollout_for_render_scan(env, network, STEPS, key),
            record_episode(env, network, STEPS, key),
        )
    )(network, key)
    assert isinstance(states, SlimState)
    # The built-in envs' data has no MJX fields: it is kept as it is.
    np.testing.assert_array_equal(states.data["steps"], trajectory.data["steps"][:-1])
    np.testing.assert_array_equal(states.done, trajectory.done[:-1])
    np.testing.assert_array_equal(final_state.done, trajectory.done[-1])
    np.testing.assert_array_equal(final_state.data["steps"], trajectory.data["steps"][-1])
    # The observations too, which a renderer may draw from (the docs' pendulum does).
    np.testing.assert_array_equal(states.obs, trajectory.obs[:-1])
    np.testing.assert_array_equal(final_state.obs, trajectory.obs[-1])
    assert float(episode_return) == float(expected_return) == 3.0
    frames = unstack_trajectory(states, final_state, STEPS)
    assert len(frames) == STEPS + 1
    assert frames[1].obs.shape == (4,)
    assert [int(f.data["steps"]) for f in frames] == [0, 1, 2, 0, 1, 2]  # restarted after 3
    with pytest.raises(ValueError, match="max_episode_length=6, but the stacked states hold 5"):
        unstack_trajectory(states, final_state, STEPS + 1)
    # Fewer frames than recorded: the last is the state that followed, not final_state.
    shorter = unstack_trajectory(states, final_state, 3)
    assert [int(f.data["steps"]) for f in shorter] == [0, 1, 2, 0]  # final_state is at 2
    with pytest.raises(ValueError, match="max_episode_length must be a positive int, got -1"):
        eval_rollout_for_render_scan(env, network, -1, key)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MjxLikeData:
    """The fields of an MJX Data that rendering reads, and a contact buffer it does not."""

    qpos: jax.Array
    qvel: jax.Array
    time: jax.Array
    mocap_pos: jax.Array
    mocap_quat: jax.Array
    xfrc_applied: jax.Array
    contact: jax.Array


class MjxLikeCartPole(CartPole):
    """CartPole with its data in an MJX-like dataclass."""

    def reset(self, rng):
        return self._with_data(super().reset(rng))

    def step(self, state, action):
        return self._with_data(super().step(state.replace(data={"steps": state.data.time}), action))

    def _with_data(self, state):
        steps = state.data["steps"]
        data = MjxLikeData(
            state.obs[:2],
            state.obs[2:],
            steps,
            jnp.zeros(3),
            jnp.zeros(4),
            jnp.zeros(6),
            jnp.ones(50),
        )
        return state.replace(data=data)


def test_an_mjx_data_is_cut_to_slim_data(network):
    # Traced only (shapes): no compilation.
    states, final_state, _ = nnx.eval_shape(
        lambda network, key: eval_rollout_for_render_scan(MjxLikeCartPole(), network, 2, key),
        network,
        jax.random.key(0),
    )
    assert isinstance(states.data, SlimData)  # the contact buffer is left out
    assert states.data.qpos.shape == (2, 2)
    assert states.data.mocap_quat.shape == (2, 4)
    assert final_state.data.time.shape == ()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PositionsOnlyData:
    """An env's own data that shares only ``qpos`` with an MJX Data."""

    qpos: jax.Array
    steps: jax.Array


class PositionsOnlyCartPole(CartPole):
    """CartPole with its data in a dataclass that has a ``qpos`` but no other MJX field."""

    def reset(self, rng):
        return self._with_data(super().reset(rng))

    def step(self, state, action):
        return self._with_data(
            super().step(state.replace(data={"steps": state.data.steps}), action)
        )

    def _with_data(self, state):
        return state.replace(data=PositionsOnlyData(state.obs[:2], state.data["steps"]))


def test_a_data_with_only_some_mjx_fields_is_kept_whole(network):
    states, final_state, _ = nnx.eval_shape(
        lambda network, key: eval_rollout_for_render_scan(PositionsOnlyCartPole(), network, 2, key),
        network,
        jax.random.key(0),
    )
    # Not an MJX Data: nothing of it is left out, and its own fields stay readable.
    assert isinstance(states.data, PositionsOnlyData)
    assert states.data.qpos.shape == (2, 2)
    assert states.data.steps.shape == (2,)
    assert isinstance(final_state.data, PositionsOnlyData)
