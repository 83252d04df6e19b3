"""ppo_loss and its gradient against a NumPy computation of the same tiny case."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import ppo_loss
from nnx_ppo.algorithms.types import Transition
from nnx_ppo.networks.types import PPONetworkOutput

T, B = 5, 3
W, V = 0.3, 0.5


def make_case(seed: int, agents: tuple[str, ...]):
    """Random rollout data for ScriptedNetwork; old log-likelihoods near the current ones."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0, 3, (T, B))
    done = rng.random((T, B)) < 0.3
    start = rng.uniform(0, 2, B)
    scales = {a: i + 1.0 for i, a in enumerate(agents)} or {None: 1.0}
    loglik, value = replay(W, V, base, done, start)
    noisy = {a: s * loglik + rng.normal(0, 0.3, (T, B)) for a, s in scales.items()}
    old_values = {a: s * value + rng.normal(0, 0.5, (T, B)) for a, s in scales.items()}
    advantages = {a: rng.normal(1, 2, (T, B)) for a in scales}
    targets = {a: rng.normal(0, 2, (T, B)) for a in scales}
    return base, done, start, noisy, old_values, advantages, targets


def replay(w, v, base, done, start):
    """The network's outputs over the rollout, the carry reset after each done step."""
    carry = start.copy()
    loglik, value = np.zeros((T, B)), np.zeros((T, B))
    for t in range(T):
        loglik[t] = w * (carry + base[t])
        value[t] = v * base[t] + carry
        carry = np.where(done[t], 0.0, carry + 1)
    return loglik, value


def reference_loss(w, v, case, config: PPOConfig):
    base, done, start, old_loglik, old_values, advantages, targets = case
    loglik, value = replay(w, v, base, done, start)
    scales = {a: i + 1.0 for i, a in enumerate(old_loglik)}
    policy_adv = dict(advantages)
    if config.combine_advantages:
        team = sum(advantages.values())
        policy_adv = {a: team for a in advantages}
    if config.normalize_advantages:
        if config.advantage_normalization == "global":
            pooled = np.concatenate([a.ravel() for a in policy_adv.values()])
            policy_adv = {
                k: (a - pooled.mean()) / (pooled.std() + 1e-8) for k, a in policy_adv.items()
            }
        else:
            policy_adv = {k: (a - a.mean()) / (a.std() + 1e-8) for k, a in policy_adv.items()}
    eps = config.clip_range
    actor = 0.0
    for a, s in scales.items():
        ratio = np.exp(s * loglik - old_loglik[a])
        adv = policy_adv[a]
        actor += -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
    critic = 0.0
    for a, s in scales.items():
        error = (s * value - targets[a]) ** 2
        if config.value_clip_range is not None:
            c = config.value_clip_range
            clipped = old_values[a] + np.clip(s * value - old_values[a], -c, c)
            error = np.maximum(error, (clipped - targets[a]) ** 2)
        critic += 0.5 * np.mean(error)
    return actor + config.critic_loss_weight * critic + 0.5 * w**2


def as_inputs(case, agents):
    base, done, start, old_loglik, old_values, advantages, targets = case
    pick = (
        (lambda d: {a: jnp.asarray(d[a], jnp.float32) for a in agents})
        if agents
        else (lambda d: jnp.asarray(d[None], jnp.float32))
    )
    obs = jnp.asarray(np.stack([base, np.zeros_like(base)], -1), jnp.float32)
    actions = jnp.zeros((T, B, 1))
    transitions = Transition(
        obs=obs,
        network_output=PPONetworkOutput(
            {a: actions for a in agents} if agents else actions, pick(old_loglik), pick(old_values)
        ),
        rewards=pick(targets),
        done=jnp.asarray(done),
        truncated=jnp.zeros((T, B), bool),
        next_obs=obs,
        metrics={},
    )
    return jnp.asarray(start, jnp.float32), transitions, pick(advantages), pick(targets)


CONFIGS = {
    "plain": PPOConfig(n_envs=B, n_minibatches=1, clip_range=0.1, normalize_advantages=False),
    "normalized": PPOConfig(n_envs=B, n_minibatches=1, clip_range=0.1, critic_loss_weight=0.5),
    "value_clip": PPOConfig(n_envs=B, n_minibatches=1, clip_range=0.15, value_clip_range=0.2),
}
AGENT_CONFIGS = {
    "per_agent": PPOConfig(n_envs=B, n_minibatches=1, clip_range=0.1),
    "global": PPOConfig(
        n_envs=B, n_minibatches=1, clip_range=0.1, advantage_normalization="global"
    ),
    "team": PPOConfig(n_envs=B, n_minibatches=1, clip_range=0.1, combine_advantages=True),
}
CASES = [(name, config, ()) for name, config in CONFIGS.items()] + [
    (name, config, ("a", "b")) for name, config in AGENT_CONFIGS.items()
]


@pytest.mark.parametrize(("name", "config", "agents"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_match_numpy(name, config, agents, seed, scripted_network):
    case = make_case(seed, agents)
    network = scripted_network(W, V, agents=agents)
    inputs = as_inputs(case, agents)

    loss, grads = nnx.value_and_grad(lambda n: ppo_loss(n, *inputs, config)[0])(network)
    grad_w, grad_v = grads["w"][...], grads["v"][...]
    expected = reference_loss(W, V, case, config)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    step = 1e-5
    numeric_w = (
        reference_loss(W + step, V, case, config) - reference_loss(W - step, V, case, config)
    ) / (2 * step)
    numeric_v = (
        reference_loss(W, V + step, case, config) - reference_loss(W, V - step, case, config)
    ) / (2 * step)
    np.testing.assert_allclose([grad_w, grad_v], [numeric_w, numeric_v], rtol=2e-3, atol=1e-4)


def test_diagnostics_at_unchanged_parameters(scripted_network):
    # With the rollout's own log-likelihoods every ratio is 1: no clipping, zero KL.
    case = list(make_case(3, ()))
    base, done, start = case[:3]
    case[3] = {None: replay(W, V, base, done, start)[0]}
    _, diagnostics = ppo_loss(scripted_network(W, V), *as_inputs(case, ()), CONFIGS["plain"])
    np.testing.assert_allclose(diagnostics["losses/approx_kl"], 0.0, atol=1e-7)
    assert float(diagnostics["losses/clipping_fraction"]) == 0.0


@pytest.mark.parametrize(
    ("config", "agents"),
    [(CONFIGS["plain"], ()), (AGENT_CONFIGS["per_agent"], ("a", "b"))],
    ids=["single", "agents"],
)
def test_diagnostics_match_numpy_with_ratios_on_both_sides_of_the_clip_range(
    config, agents, scripted_network
):
    # Old log-likelihoods 0.3-noisy around the current ones: with clip range 0.1 some
    # ratios lie above 1 + eps, some below 1 - eps and some inside; the targets'
    # variance (about 4) differs from the value estimates', so R^2's denominator matters.
    case = make_case(4, agents)
    base, done, start, old_loglik, _, _, targets = case
    loglik, value = replay(W, V, base, done, start)
    _, diagnostics = ppo_loss(
        scripted_network(W, V, agents=agents), *as_inputs(case, agents), config
    )
    eps = config.clip_range
    for i, agent in enumerate(old_loglik):
        s = i + 1.0
        ratio = np.exp(s * loglik - old_loglik[agent])
        assert np.any(ratio > 1 + eps) and np.any(ratio < 1 - eps), "the case must clip both ways"
        assert np.any(np.abs(ratio - 1) < eps), "and keep some ratios inside"
        v, t = s * value, targets[agent]
        assert abs(np.var(t) - np.var(v)) > 0.5 * np.var(t)
        expected = {
            "losses/clipping_fraction": np.mean(np.abs(ratio - 1) > eps),
            "losses/approx_kl": np.mean(ratio - 1 - np.log(ratio)),
            "losses/critic_R^2": 1 - np.mean((v - t) ** 2) / np.var(t),
        }
        for metric, reference in expected.items():
            got = diagnostics[metric][agent] if agents else diagnostics[metric]
            np.testing.assert_allclose(got, reference, rtol=1e-4, err_msg=f"{metric} {agent}")


@pytest.mark.parametrize(
    ("config", "agents"),
    [(CONFIGS["normalized"], ()), (AGENT_CONFIGS["global"], ("a", "b"))],
    ids=["per_leaf", "global"],
)
def test_equal_advantages_standardise_to_zero_not_nan(config, agents, scripted_network):
    # A minibatch whose advantages are all equal (a sparse reward not yet found) has
    # standard deviation 0: the epsilon keeps the standardised advantages 0, so the
    # actor term and its gradient vanish and only the critic and regularisation remain.
    case = list(make_case(5, agents))
    case[5] = {a: np.full((T, B), 2.5) for a in case[5]}
    network = scripted_network(W, V, agents=agents)
    inputs = as_inputs(tuple(case), agents)
    loss, grads = nnx.value_and_grad(lambda n: ppo_loss(n, *inputs, config)[0])(network)
    assert np.isfinite(loss) and np.isfinite(grads["w"][...])
    np.testing.assert_allclose(loss, reference_loss(W, V, case, config), rtol=1e-5)
    # The actor term is 0, so d(loss)/dw is the regularisation's w alone.
    np.testing.assert_allclose(grads["w"][...], W, rtol=1e-5)


def test_critic_r2_is_nan_for_targets_that_do_not_vary(scripted_network):
    # No variance to explain: NaN, where a floored denominator gave -1e8 times the error.
    case = list(make_case(6, ()))
    case[6] = {None: np.full((T, B), 1e4)}
    _, diagnostics = ppo_loss(scripted_network(W, V), *as_inputs(tuple(case), ()), CONFIGS["plain"])
    assert np.isnan(diagnostics["losses/critic_R^2"])


def test_mismatched_reward_and_action_trees_are_explained(scripted_network):
    case = make_case(0, ("a", "b"))
    start, transitions, advantages, targets = as_inputs(case, ("a", "b"))
    three = {**advantages, "c": advantages["a"]}
    with pytest.raises(ValueError, match="combine_advantages=True"):
        ppo_loss(
            scripted_network(agents=("a", "b")),
            start,
            transitions,
            three,
            {**targets, "c": targets["a"]},
            AGENT_CONFIGS["per_agent"],
        )


def test_a_joint_log_likelihood_beside_per_agent_rewards_is_explained():
    from nnx_ppo.algorithms._loss import _policy_advantages

    per_agent = {"a": jnp.ones((3, 2)), "b": jnp.ones((3, 2))}
    with pytest.raises(ValueError, match=r"one joint log-likelihood.*combine_advantages=True"):
        _policy_advantages(per_agent, jnp.zeros((3, 2)), combine=False)
    np.testing.assert_array_equal(
        _policy_advantages(per_agent, jnp.zeros((3, 2)), combine=True), 2 * jnp.ones((3, 2))
    )


def test_a_reward_tree_of_one_leaf_is_shared_by_every_action_leaf():
    from nnx_ppo.algorithms._loss import _policy_advantages

    team = jnp.arange(6.0).reshape(3, 2)
    likelihoods = {"mover": jnp.zeros((3, 2)), "picker": jnp.zeros((3, 2))}
    for reward_tree in (team, {"team": team}, [team]):
        shared = _policy_advantages(reward_tree, likelihoods, combine=False)
        assert set(shared) == {"mover", "picker"}
        for leaf in shared.values():
            np.testing.assert_array_equal(leaf, team)


def test_whole_and_numpy_numbers_in_the_config_reach_the_loss_as_floats(scripted_network):
    # 0.3.0 took clip_range=1; the loss's annotations take a float.
    config = PPOConfig(
        n_envs=B, n_minibatches=1, clip_range=1, value_clip_range=np.float32(0.5), gae_lambda=1
    )
    assert [type(config.clip_range), type(config.value_clip_range)] == [float, float]
    as_floats = PPOConfig(n_envs=B, n_minibatches=1, clip_range=1.0, value_clip_range=0.5)
    case = make_case(3, ())
    network = scripted_network(W, V)
    np.testing.assert_array_equal(
        ppo_loss(network, *as_inputs(case, ()), config)[0],
        ppo_loss(network, *as_inputs(case, ()), as_floats)[0],
    )
