"""GAE against hand-computed cases and an independent NumPy reference."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nnx_ppo import ContractError
from nnx_ppo.algorithms.ppo import compute_advantages, gae
from nnx_ppo.algorithms.types import Transition
from nnx_ppo.networks.types import PPONetworkOutput

GAMMA, LAMBDA = 0.9, 0.8


def reference_gae(rewards, values, next_values, done, truncated, lam, gamma):
    """Forward sums over each episode segment: A_t = sum_k (gamma lam)^k delta_{t+k}.

    Written as the definition, not the backward recursion the library uses: the
    sum runs from t to the end of t's episode (its first done step) or of the
    rollout, whichever comes first.
    """
    steps, envs = rewards.shape
    terminated = done & ~truncated
    deltas = rewards + gamma * np.where(terminated, 0.0, next_values) - values
    advantages = np.zeros_like(rewards)
    for env in range(envs):
        for t in range(steps):
            total, weight = 0.0, 1.0
            for k in range(t, steps):
                total += weight * deltas[k, env]
                if done[k, env]:
                    break
                weight *= gamma * lam
            advantages[t, env] = total
    return advantages


def run_gae(rewards, values, next_values, done, truncated, lam=LAMBDA, gamma=GAMMA):
    return np.asarray(
        gae(
            jnp.asarray(rewards, jnp.float32),
            jnp.asarray(values, jnp.float32),
            jnp.asarray(next_values, jnp.float32),
            jnp.asarray(done),
            jnp.asarray(truncated),
            lam,
            gamma,
        )
    )


def column(*values):
    return np.asarray(values, np.float64)[:, None]


def test_hand_computed_episode_without_ends():
    # r = (1, 2, 3), V = (0.5, 1, 1.5), V(next) = (1, 1.5, 2): the last step bootstraps.
    # delta = (1 + .9*1 - .5, 2 + .9*1.5 - 1, 3 + .9*2 - 1.5) = (1.4, 2.35, 3.3)
    # A2 = 3.3; A1 = 2.35 + .72*3.3 = 4.726; A0 = 1.4 + .72*4.726 = 4.80272
    no = np.zeros((3, 1), bool)
    advantages = run_gae(column(1, 2, 3), column(0.5, 1, 1.5), column(1, 1.5, 2), no, no)
    np.testing.assert_allclose(advantages[:, 0], [4.80272, 4.726, 3.3], rtol=1e-6)


def test_compute_advantages_targets_are_advantages_plus_the_rollouts_values():
    # The hand-computed case above through a Transition: targets = A + V, not A + V(next).
    obs = jnp.zeros((3, 1, 1))
    rollout_data = Transition(
        obs=obs,
        network_output=PPONetworkOutput(
            jnp.zeros((3, 1, 1)), jnp.zeros((3, 1)), jnp.asarray(column(0.5, 1, 1.5), jnp.float32)
        ),
        rewards=jnp.asarray(column(1, 2, 3), jnp.float32),
        done=jnp.zeros((3, 1), bool),
        truncated=jnp.zeros((3, 1), bool),
        next_obs=obs,
        metrics={},
        next_value_estimates=jnp.asarray(column(1, 1.5, 2), jnp.float32),
    )
    advantages, targets = compute_advantages(rollout_data, LAMBDA, GAMMA)
    np.testing.assert_allclose(advantages[:, 0], [4.80272, 4.726, 3.3], rtol=1e-6)
    np.testing.assert_allclose(targets[:, 0], [5.30272, 5.726, 4.8], rtol=1e-6)


def test_termination_cuts_bootstrap_and_trace():
    # Step 1 terminates: delta1 = 2 - 1 = 1 (no V(next)), and A0 does not see A2.
    # delta0 = 1 + .9*1 - .5 = 1.4, A1 = 1, A0 = 1.4 + .72*1 = 2.12; A2 = 3 + .9*2 - 1.5 = 3.3
    done = column(0, 1, 0).astype(bool)
    no = np.zeros((3, 1), bool)
    advantages = run_gae(column(1, 2, 3), column(0.5, 1, 1.5), column(1, 7, 2), done, no)
    np.testing.assert_allclose(advantages[:, 0], [2.12, 1.0, 3.3], rtol=1e-6)


def test_truncation_bootstraps_from_the_final_observation():
    # Step 1 is truncated: delta1 = 2 + .9*7 - 1 = 7.3 (V of the true final obs is 7),
    # the trace still stops: A0 = 1.4 + .72*7.3 = 6.656.
    done = column(0, 1, 0).astype(bool)
    advantages = run_gae(column(1, 2, 3), column(0.5, 1, 1.5), column(1, 7, 2), done, done)
    np.testing.assert_allclose(advantages[:, 0], [6.656, 7.3, 3.3], rtol=1e-6)


def test_truncated_and_terminated_envs_side_by_side():
    # Two envs with the same data: env 0 terminates at the last step, env 1 is truncated.
    rewards = np.tile(column(1.0, 1.0), (1, 2))
    values = np.tile(column(2.0, 2.0), (1, 2))
    next_values = np.tile(column(2.0, 5.0), (1, 2))
    done = np.array([[False, False], [True, True]])
    truncated = np.array([[False, False], [False, True]])
    advantages = run_gae(rewards, values, next_values, done, truncated)
    last = [1.0 - 2.0, 1.0 + GAMMA * 5.0 - 2.0]
    first = [1.0 + GAMMA * 2.0 - 2.0 + GAMMA * LAMBDA * a for a in last]
    np.testing.assert_allclose(advantages, [first, last], rtol=1e-6)


@given(
    steps=st.sampled_from([1, 3, 8]),
    envs=st.sampled_from([1, 2, 5]),
    seed=st.integers(0, 2**31 - 1),
    lam=st.sampled_from([0.0, 0.8, 1.0]),
)
def test_matches_reference_on_random_episodes(steps, envs, seed, lam):
    rng = np.random.default_rng(seed)
    rewards, values, next_values = rng.normal(size=(3, steps, envs))
    done = rng.random((steps, envs)) < 0.3
    truncated = done & (rng.random((steps, envs)) < 0.5)
    expected = reference_gae(rewards, values, next_values, done, truncated, lam, GAMMA)
    advantages = run_gae(rewards, values, next_values, done, truncated, lam=lam)
    np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_lambda_limits(lam):
    # lambda = 0 gives the one-step TD error; lambda = 1 the discounted return minus V.
    rewards, values, next_values = column(1, 2, 3), column(0, 0, 0), column(0, 0, 4)
    no = np.zeros((3, 1), bool)
    advantages = run_gae(rewards, values, next_values, no, no, lam=lam)[:, 0]
    if lam == 0.0:
        np.testing.assert_allclose(advantages, [1, 2, 3 + GAMMA * 4], rtol=1e-6)
    else:
        tail = 3 + GAMMA * 4
        np.testing.assert_allclose(
            advantages, [1 + GAMMA * 2 + GAMMA**2 * tail, 2 + GAMMA * tail, tail], rtol=1e-6
        )


@pytest.mark.parametrize("argument", ["values_excl_last", "next_values", "done", "truncation"])
def test_an_input_shaped_unlike_the_rewards_is_named(argument):
    inputs = {  # by keyword, with the names of 0.3.0 where the meaning is unchanged
        "rewards": jnp.zeros((4, 3)),
        "values_excl_last": jnp.zeros((4, 3)),
        "next_values": jnp.zeros((4, 3)),
        "done": jnp.zeros((4, 3), bool),
        "truncation": jnp.zeros((4, 3), bool),
    }
    inputs[argument] = inputs[argument][:, :2]
    with pytest.raises(ContractError) as caught:
        gae(**inputs, lambda_=LAMBDA, gamma=GAMMA)
    assert caught.value.where == "gae"
    assert caught.value.leaf == argument
    assert caught.value.expected.endswith("[Array, 'T B'] with T=4, B=3")
    assert "[4,2]" in caught.value.found


def test_the_030_last_value_keyword_names_what_replaced_it() -> None:
    # Python said only "missing a required argument: 'next_values'".
    zeros = jnp.zeros((3, 2))
    with pytest.raises(TypeError, match=r"^gae: last_value, .* is next_values now: .*\(T, B\)"):
        gae(zeros, zeros, last_value=jnp.zeros(2), done=zeros > 0, truncation=zeros > 0,
            lambda_=0.95, gamma=0.99)  # fmt: skip
