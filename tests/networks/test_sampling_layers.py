"""Action samplers: log-likelihoods and entropies against SciPy, sampling, modes, bad input.

Replay (scoring stored actions over a rollout, minibatch slices) is in test_replay.py.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate, stats

import nnx_ppo
from nnx_ppo.algorithms.metrics import summarize
from nnx_ppo.networks.sampling_layers import (
    ActionSampler,
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
    _log1p,
    _remainder_and_derivatives,
)
from nnx_ppo.networks.types import StatefulModuleOutput

# One batch size for the numerics keeps JIT compiles to one per test; batch-size properties
# are the contract tests' business.
BATCH = 4
ACTION_SIZE = 2
# float32 module against float64 references.
RTOL, ATOL = 1e-4, 1e-4


@nnx.jit
def _call(sampler: ActionSampler, state: Any, x: Any, rollout_extras: Any = None) -> Any:
    return sampler(state, x, rollout_extras)


def _softplus_inverse(y: np.ndarray) -> np.ndarray:
    return np.log(np.expm1(y))


def _log_one_minus_tanh_squared(u: np.ndarray) -> np.ndarray:
    """log(1 - tanh(u)^2) = -2 log cosh(u), in float64 without overflow."""
    return -2.0 * (np.logaddexp(u, -u) - np.log(2.0))


def _normal_tanh_inputs(
    rng: np.random.Generator, batch: int, sigma_range: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """mu, sigma and the sampler input (mu and the pre-softplus std, min_std=0, scale 1)."""
    mu = rng.uniform(-3, 3, (batch, ACTION_SIZE))
    sigma = np.exp(rng.uniform(*np.log(sigma_range), (batch, ACTION_SIZE)))
    x = np.concatenate([mu, _softplus_inverse(sigma)], axis=-1).astype(np.float32)
    return mu, sigma, x


def _tanh_normal_entropy_reference(mu: float, sigma: float) -> float:
    """H[tanh U], U ~ N(mu, sigma), by change of variables: -E[log N(U) - log(1 - tanh^2 U)]."""

    def integrand(u: float) -> float:
        log_density = stats.norm.logpdf(u, mu, sigma)
        return -np.exp(log_density) * (log_density - _log_one_minus_tanh_squared(u))

    lo, hi = mu - 12 * sigma, mu + 12 * sigma
    points = [0.0] if lo < 0 < hi else None
    value, _ = integrate.quad(integrand, lo, hi, points=points, limit=200, epsabs=1e-10)
    return value


# ------------------------------------------------------------------ NormalTanhSampler


@given(seed=st.integers(0, 2**16))
def test_tanh_log_likelihood_is_the_change_of_variables_density(seed: int):
    batch = BATCH
    assert nnx_ppo.checks_enabled()
    rng = np.random.default_rng(seed)
    mu, sigma, x = _normal_tanh_inputs(rng, batch, (0.05, 3.0))
    raw = (mu + sigma * rng.normal(size=mu.shape)).astype(np.float32)
    sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=0.0, min_std=0.0)
    out = _call(sampler, sampler.initialize_state(batch), x, raw)

    expected = np.sum(
        stats.norm.logpdf(raw, mu, sigma) - _log_one_minus_tanh_squared(raw.astype(np.float64)),
        axis=-1,
    )
    np.testing.assert_allclose(out.output["log_likelihood"], expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.output["action"], np.tanh(raw), rtol=1e-6, atol=1e-6)


@given(seed=st.integers(0, 2**16))
def test_tanh_entropy_matches_quadrature_of_the_squashed_density(seed: int):
    batch = BATCH
    rng = np.random.default_rng(seed)
    mu, sigma, x = _normal_tanh_inputs(rng, batch, (1e-3, 10.0))
    weight = 0.3
    sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=weight, min_std=0.0)
    out = _call(sampler, sampler.initialize_state(batch), x)

    expected = np.array(
        [
            sum(
                _tanh_normal_entropy_reference(m, s) for m, s in zip(mu_row, sigma_row, strict=True)
            )
            for mu_row, sigma_row in zip(mu, sigma, strict=True)
        ]
    )
    # Entropies reach ~-20 nats for tiny sigma; float32 relative rounding dominates there.
    np.testing.assert_allclose(out.metrics["entropy"], expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out.regularization_loss, -weight * expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out.metrics["mu"], mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.metrics["sigma"], sigma, rtol=1e-4)


def test_the_vectorised_log1p_is_float32_accurate():
    x = np.concatenate([np.geomspace(1e-30, 1.0, 4001), np.linspace(0.0, 1.0, 4001)])
    x = x.astype(np.float32)
    # A few float32 ulps (eps 1.2e-7): log's own error plus a multiply and a divide.
    # log(1 + x) would miss by up to 100% where 1 + x rounds to 1.
    np.testing.assert_allclose(_log1p(jnp.asarray(x)), np.log1p(x.astype(np.float64)), rtol=1e-6)


def _remainder_reference(mu: float, sigma: float, kind: str) -> float:
    """E[r(U)], E[r'(U)] or E[r'(U) Z] in float64, r(u) = log1p(exp(-2|u|)),
    U ~ N(mu, sigma), Z = (U - mu) / sigma (``kind`` "value", "d_mu" or "d_sigma")."""

    def integrand(z: float) -> float:
        u = mu + sigma * z
        slope = -2.0 * np.sign(u) / (1.0 + np.exp(2.0 * abs(u)))
        weight = {"value": np.log1p(np.exp(-2 * abs(u))), "d_mu": slope, "d_sigma": slope * z}
        return weight[kind] * stats.norm.pdf(z)

    # Over Z, with the kink at U = 0 as a break point: fine for any sigma.
    kink = -mu / sigma
    points = [kink] if -12 < kink < 12 else None
    value, _ = integrate.quad(integrand, -12, 12, points=points, limit=400, epsabs=1e-13)
    return value


def test_tanh_entropy_remainder_and_its_derivatives_are_float32_accurate():
    # Narrow and wide Gaussians, across the kink at 0 and out to where the remainder
    # vanishes, down to a std of 1e-9 (min_std=0); the entropy's derivatives are these.
    mu = np.array([-9.0, -4.0, -1.0, -0.3, -0.01, 0.0, 0.02, 0.5, 1.5, 3.0, 7.0])
    sigma = np.array([1e-9, 1e-6, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0])
    mu, sigma = (a.ravel() for a in np.meshgrid(mu, sigma))
    computed = jax.jit(_remainder_and_derivatives)(
        jnp.asarray(mu, jnp.float32), jnp.asarray(sigma, jnp.float32)
    )
    # Each is at most about 2 (log 2, |r'| <= 1 times E|Z|), float32 ulps 6e-8 to 2.4e-7:
    # within a few (8e-8, 1.5e-7 and 4e-7 measured here). d_sigma sums middle * S0 +
    # half_width * S1 with both factors up to 6, terms up to 6 times the result, so its
    # bound allows that cancellation in another summation order (another CPU's product
    # kernel), as the moments' test before it did.
    tolerances = (5e-7, 1e-6, 4e-6)
    for kind, moment, atol in zip(("value", "d_mu", "d_sigma"), computed, tolerances, strict=True):
        expected = [_remainder_reference(m, s, kind) for m, s in zip(mu, sigma, strict=True)]
        np.testing.assert_allclose(moment, expected, rtol=0, atol=atol, err_msg=kind)


def test_a_tanh_entropy_of_a_tiny_std_and_its_gradient_stay_exact():
    # With min_std=0 a std can reach 1e-9 and below: the quadrature's interval rounded
    # to a point and its score-function derivatives divided by sigma (an entropy 0.63
    # too high, a gradient of 4e4 where it is 0, NaN below 1e-20).
    sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=1.0, min_std=0.0)
    state = sampler.initialize_state(1)

    @jax.jit
    def entropy_and_gradient(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.value_and_grad(lambda x: sampler(state, x).metrics["entropy"][0])(x)

    for mu, raw_std in [(0.5, -20.0), (0.0, -30.0), (-2.0, -20.0), (0.3, -60.0)]:
        sigma = float(np.log1p(np.exp(np.float64(raw_std))))  # softplus in float64
        x = jnp.array([[mu, raw_std]], jnp.float32)
        entropy, gradient = entropy_and_gradient(x)
        # For sigma -> 0: H = log(sigma sqrt(2 pi e)) + log(1 - tanh(mu)^2) + O(sigma^2).
        expected = np.log(sigma * np.sqrt(2 * np.pi * np.e)) - 2 * (
            np.logaddexp(mu, -mu) - np.log(2.0)
        )
        np.testing.assert_allclose(entropy, expected, rtol=1e-6)
        # dH/dmu -> -2 tanh(mu); dH/d raw = (1/sigma + O(sigma)) * sigmoid(raw) -> 1 - ...
        np.testing.assert_allclose(gradient[0, 0], -2 * np.tanh(mu), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gradient[0, 1], 1.0, rtol=1e-4)
    # A std under float32's floor, at a saturated mean of either sign: the quadrature's
    # bound overflowed to inf at a negative mean (an entropy and gradient of NaN).
    tiny = np.finfo(np.float32).tiny
    for mu in (-50.0, 50.0):
        entropy, gradient = entropy_and_gradient(jnp.array([[mu, -100.0]], jnp.float32))
        expected = np.log(tiny * np.sqrt(2 * np.pi * np.e)) - 2 * (abs(mu) - np.log(2.0))
        np.testing.assert_allclose(entropy, expected, rtol=1e-6)
        np.testing.assert_allclose(gradient[0], [-2 * np.sign(mu), 0.0], atol=1e-5)


def test_tanh_entropy_gradient_matches_finite_differences_of_the_reference():
    sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=1.0, min_std=0.0)
    state = sampler.initialize_state(1)

    @jax.jit
    @jax.grad
    def entropy_gradient(x: jax.Array) -> jax.Array:
        return sampler(state, x).metrics["entropy"][0]

    # The remainder's derivatives are the Gaussian score's expectations (a custom JVP):
    # points on both sides of the kink, wide and narrow, at the support's edge.
    for mu, sigma in [(0.3, 0.7), (-1.5, 2.0), (2.0, 0.1), (0.0, 5.0), (-0.2, 0.05), (9.0, 1.0)]:
        x = jnp.array([[mu, 0.0, float(_softplus_inverse(np.array(sigma))), 1.0]], jnp.float32)
        grad = entropy_gradient(x)
        step = 1e-4 * min(1.0, sigma)
        d_mu = (
            _tanh_normal_entropy_reference(mu + step, sigma)
            - _tanh_normal_entropy_reference(mu - step, sigma)
        ) / (2 * step)
        d_sigma = (
            _tanh_normal_entropy_reference(mu, sigma + step)
            - _tanh_normal_entropy_reference(mu, sigma - step)
        ) / (2 * step)
        d_raw_std = d_sigma * (1 - np.exp(-sigma))  # d softplus / d raw at softplus = sigma
        np.testing.assert_allclose(grad[0, 0], d_mu, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(grad[0, 2], d_raw_std, rtol=1e-3, atol=1e-4)


def test_tanh_std_uses_min_std_and_std_scale():
    sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=0.0, min_std=0.2, std_scale=3.0)
    x = jnp.array([[0.0, 1.0, -1.0, 0.5]])
    out = _call(sampler, sampler.initialize_state(1), x)
    expected = (np.log1p(np.exp([-1.0, 0.5])) + 0.2) * 3.0
    np.testing.assert_allclose(out.metrics["sigma"][0], expected, rtol=1e-6)


# ---------------------------------------------------------------------- NormalSampler


def test_normal_std_uses_min_std_and_std_scale_with_a_raw_or_a_learned_std():
    raw_std = NormalSampler(nnx.Rngs(0), entropy_weight=0.0, min_std=0.2, std_scale=3.0)
    sigma = raw_std.distribution_parameters(jnp.array([[0.0, 1.0, -1.0, 0.5]]))["sigma"]
    np.testing.assert_allclose(sigma[0], (np.log1p(np.exp([-1.0, 0.5])) + 0.2) * 3.0, rtol=1e-6)
    learned = NormalSampler(
        nnx.Rngs(0), entropy_weight=0.0, min_std=0.2, std_scale=3.0, action_size=2,
        initial_log_std=-0.5,
    )  # fmt: skip
    sigma = learned.distribution_parameters(jnp.zeros((1, 2)))["sigma"]
    np.testing.assert_allclose(sigma[0], np.full(2, (np.exp(-0.5) + 0.2) * 3.0), rtol=1e-6)


@given(seed=st.integers(0, 2**16))
def test_normal_log_likelihood_and_entropy_match_scipy(seed: int):
    batch = BATCH
    rng = np.random.default_rng(seed)
    mu, sigma, x = _normal_tanh_inputs(rng, batch, (0.05, 5.0))
    raw = (mu + 2 * sigma * rng.normal(size=mu.shape)).astype(np.float32)
    sampler = NormalSampler(nnx.Rngs(0), entropy_weight=0.5, min_std=0.0)
    out = _call(sampler, sampler.initialize_state(batch), x, raw)

    expected_ll = stats.norm.logpdf(raw, mu, sigma).sum(axis=-1)
    expected_entropy = stats.norm(mu, sigma).entropy().sum(axis=-1)
    np.testing.assert_allclose(out.output["log_likelihood"], expected_ll, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.output["action"], raw)
    np.testing.assert_allclose(out.metrics["entropy"], expected_entropy, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.regularization_loss, -0.5 * expected_entropy, rtol=RTOL)


@pytest.mark.parametrize("sampler_type", [NormalSampler, NormalTanhSampler])
def test_a_std_that_underflows_without_a_floor_keeps_the_density_finite(sampler_type: type):
    sampler = sampler_type(nnx.Rngs(0), entropy_weight=0.0, min_std=0.0)
    # softplus(-100) is 0 in float32: the std stops at the smallest normal float.
    parameters = sampler.distribution_parameters(jnp.array([[0.3, -100.0], [0.3, 1.0]]))
    assert float(parameters["sigma"][0, 0]) == float(jnp.finfo(jnp.float32).tiny)
    assert float(parameters["sigma"][1, 0]) == pytest.approx(np.log1p(np.e), rel=1e-6)
    log_likelihood = sampler.log_likelihood(jnp.array([[0.3], [0.3]]), parameters)
    assert np.all(np.isfinite(np.asarray(log_likelihood)))
    assert np.all(np.isfinite(np.asarray(sampler.entropy(parameters))))


def test_normal_with_a_learned_log_std_takes_the_mean_alone():
    sampler = NormalSampler(
        nnx.Rngs(0), entropy_weight=0.0, min_std=0.0, action_size=3, initial_log_std=-0.5
    )
    assert sampler.log_std is not None
    assert isinstance(sampler.log_std, nnx.Param)
    mean = jnp.array([[0.1, -0.2, 0.3], [1.0, 2.0, 3.0]])
    raw = jnp.array([[0.0, 0.0, 0.0], [1.5, 2.5, 2.0]])
    out = _call(sampler, sampler.initialize_state(2), mean, raw)
    sigma = np.exp(-0.5)
    np.testing.assert_allclose(out.metrics["sigma"], np.full((2, 3), sigma), rtol=1e-6)
    expected = stats.norm.logpdf(np.asarray(raw), np.asarray(mean), sigma).sum(axis=-1)
    np.testing.assert_allclose(out.output["log_likelihood"], expected, rtol=RTOL)

    def loss(module: NormalSampler) -> jax.Array:
        return jnp.sum(module(module.initialize_state(2), mean, raw).output["log_likelihood"])

    grads = nnx.jit(nnx.grad(loss))(sampler)
    assert grads["log_std"][...].shape == (3,)
    assert np.all(np.abs(grads["log_std"][...]) > 0)

    with pytest.raises(ValueError, match=r"expects the mean\s+alone"):
        sampler(sampler.initialize_state(2), jnp.zeros((2, 6)))


# ---------------------------------------------------------------- CategoricalSampler


@given(seed=st.integers(0, 2**16))
def test_categorical_log_likelihood_and_entropy_match_scipy(seed: int):
    batch = BATCH
    rng = np.random.default_rng(seed)
    n = 4
    logits = rng.normal(scale=2.0, size=(batch, n)).astype(np.float32)
    logits[0, 1] = -np.inf  # an impossible class contributes nothing to the entropy
    actions = rng.choice([0, 2, 3], size=batch).astype(np.int32)
    sampler = CategoricalSampler(nnx.Rngs(0), entropy_weight=0.1)
    out = _call(sampler, sampler.initialize_state(batch), logits, actions)

    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    expected_ll = np.log(probs[np.arange(batch), actions])
    expected_entropy = stats.entropy(probs, axis=-1)
    np.testing.assert_allclose(out.output["log_likelihood"], expected_ll, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.metrics["entropy"], expected_entropy, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.regularization_loss, -0.1 * expected_entropy, rtol=RTOL)
    assert out.output["action"].dtype == jnp.int32
    np.testing.assert_array_equal(out.output["action"], actions)


def test_categorical_entropy_gradient_is_finite_with_impossible_classes():
    sampler = CategoricalSampler(nnx.Rngs(0), entropy_weight=1.0)
    state = sampler.initialize_state(1)
    logits = jnp.array([[0.5, -jnp.inf, 1.0]])
    grad = jax.jit(jax.grad(lambda x: sampler(state, x).regularization_loss.sum()))(logits)
    assert np.all(np.isfinite(grad[0, [0, 2]]))


# -------------------------------------------------------------------------- sampling


def test_normal_samples_follow_the_distribution_and_differ_per_env():
    batch = 4000
    sampler = NormalSampler(nnx.Rngs(3), entropy_weight=0.0, min_std=0.0)
    mu = np.array([0.5, -2.0])
    sigma = np.array([0.3, 1.5])
    x = jnp.asarray(np.broadcast_to(np.concatenate([mu, _softplus_inverse(sigma)]), (batch, 4)))
    out = _call(sampler, sampler.initialize_state(batch), x)
    samples = np.asarray(out.rollout_extras)
    # 5 standard errors.
    np.testing.assert_allclose(samples.mean(axis=0), mu, atol=5 * sigma.max() / np.sqrt(batch))
    np.testing.assert_allclose(samples.std(axis=0), sigma, rtol=5 / np.sqrt(2 * batch))
    np.testing.assert_array_equal(out.output["action"], out.rollout_extras)


def test_categorical_samples_follow_the_probabilities():
    batch = 4000
    probs = np.array([0.1, 0.6, 0.3])
    sampler = CategoricalSampler(nnx.Rngs(5), entropy_weight=0.0)
    x = jnp.asarray(np.broadcast_to(np.log(probs), (batch, 3)), jnp.float32)
    out = _call(sampler, sampler.initialize_state(batch), x)
    counts = np.bincount(np.asarray(out.output["action"]), minlength=3)
    chi2 = stats.chisquare(counts, probs * batch)
    assert chi2.pvalue > 1e-4, (counts, chi2)


def test_tanh_sample_is_emitted_raw_and_squashed_in_the_output():
    sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=0.0)
    x = jnp.array([[0.0, 3.0, 2.0, 2.0]] * 3)
    out = _call(sampler, sampler.initialize_state(3), x)
    np.testing.assert_allclose(out.output["action"], np.tanh(out.rollout_extras), rtol=1e-6)
    assert np.any(np.abs(out.rollout_extras) > 1.0)  # std ~2: raw values leave (-1, 1)


def test_keys_advance_per_env_and_a_batch_row_matches_a_batch_of_one():
    sampler = NormalSampler(nnx.Rngs(0), entropy_weight=0.0)
    state = sampler.initialize_state(3)
    x = jnp.zeros((3, 4))
    first = _call(sampler, state, x)
    second = _call(sampler, first.next_state, x)
    assert not np.allclose(first.rollout_extras, second.rollout_extras)
    assert len({tuple(row) for row in np.asarray(first.rollout_extras)}) == 3
    single = _call(sampler, state[1:2], x[1:2])
    np.testing.assert_array_equal(single.rollout_extras[0], first.rollout_extras[1])
    assert first.next_state.shape == state.shape
    assert jnp.issubdtype(first.next_state.dtype, jax.dtypes.prng_key)


@pytest.mark.parametrize("make", [NormalTanhSampler, NormalSampler, CategoricalSampler])
def test_reset_keeps_the_key_stream_batched_and_for_one_env(make: Any):
    sampler = make(nnx.Rngs(0), entropy_weight=0.0)
    state = sampler.initialize_state(3)
    data = jax.random.key_data
    np.testing.assert_array_equal(data(sampler.reset_state(state)), data(state))
    np.testing.assert_array_equal(data(jax.vmap(sampler.reset_state)(state)), data(state))
    np.testing.assert_array_equal(data(sampler.reset_state(state[0])), data(state[0]))


def test_initialize_state_draws_fresh_keys_from_the_rngs():
    sampler = NormalSampler(nnx.Rngs(0), entropy_weight=0.0)
    first, second = sampler.initialize_state(2), sampler.initialize_state(2)
    assert not np.array_equal(jax.random.key_data(first), jax.random.key_data(second))


# ------------------------------------------------------------------ deterministic mode


@pytest.mark.parametrize(
    ("sampler", "x", "expected"),
    [
        (
            NormalTanhSampler(nnx.Rngs(0), entropy_weight=0.0),
            jnp.array([[0.5, -1.0, 0.0, 0.0], [2.0, 0.1, 1.0, 1.0]]),
            np.tanh([[0.5, -1.0], [2.0, 0.1]]),
        ),
        (
            NormalSampler(nnx.Rngs(0), entropy_weight=0.0),
            jnp.array([[0.5, -1.0, 0.0, 0.0], [2.0, 0.1, 1.0, 1.0]]),
            np.array([[0.5, -1.0], [2.0, 0.1]]),
        ),
        (
            CategoricalSampler(nnx.Rngs(0), entropy_weight=0.0),
            jnp.array([[0.1, 3.0, -1.0], [2.0, 0.0, 1.9]]),
            np.array([1, 0]),
        ),
    ],
)
def test_eval_gives_the_mode_and_train_samples_again(sampler: ActionSampler, x: Any, expected: Any):
    state = sampler.initialize_state(2)
    assert not sampler.deterministic
    sampler.eval()
    assert sampler.deterministic
    out = _call(sampler, state, x)
    np.testing.assert_allclose(out.output["action"], expected, rtol=1e-6)
    # The key stream advances in either mode, so switching modes never desynchronises replay.
    sampler.train()
    assert not sampler.deterministic
    sampled = _call(sampler, state, x)
    assert not np.allclose(sampled.output["action"], expected)
    np.testing.assert_array_equal(
        jax.random.key_data(out.next_state), jax.random.key_data(sampled.next_state)
    )


def test_eval_reaches_samplers_nested_in_containers():
    from nnx_ppo.networks.containers import Parallel, Sequential

    inner = CategoricalSampler(nnx.Rngs(0), entropy_weight=0.0)
    net = Sequential([Parallel(a=inner)])
    net.eval()
    assert inner.deterministic
    net.train()
    assert not inner.deterministic


# ------------------------------------------------------------------------- bad input


def test_odd_width_for_mean_and_std_is_a_clear_error():
    sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=0.0)
    with pytest.raises(ValueError, match="odd width"):
        sampler(sampler.initialize_state(2), jnp.zeros((2, 3)))


@pytest.mark.parametrize(
    ("sampler", "x", "stored"),
    [
        (
            NormalTanhSampler(nnx.Rngs(0), entropy_weight=0.0),
            jnp.zeros((2, 4)),
            jnp.zeros((2, 3)),
        ),
        (
            CategoricalSampler(nnx.Rngs(0), entropy_weight=0.0),
            jnp.zeros((2, 3)),
            jnp.zeros((2,), jnp.float32),
        ),
        (
            CategoricalSampler(nnx.Rngs(0), entropy_weight=0.0),
            jnp.zeros((2, 3)),
            jnp.zeros((2, 1), jnp.int32),
        ),
    ],
)
def test_a_stored_action_that_does_not_fit_is_a_contract_error(
    sampler: ActionSampler, x: Any, stored: Any
):
    with pytest.raises(nnx_ppo.ContractError, match="stored raw action") as info:
        sampler(sampler.initialize_state(2), x, stored)
    assert "rollout_extras" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"entropy_weight": -1.0}, ValueError, "entropy_weight must be >= 0"),
        ({"entropy_weight": "big"}, TypeError, "entropy_weight must be a finite number"),
        ({"entropy_weight": 0.1, "min_std": -0.1}, ValueError, "min_std"),
        ({"entropy_weight": 0.1, "std_scale": 0.0}, ValueError, "std_scale must be > 0"),
    ],
)
def test_bad_constructor_arguments_are_named(kwargs: dict[str, Any], error: type, match: str):
    with pytest.raises(error, match=match):
        NormalTanhSampler(nnx.Rngs(0), **kwargs)


def test_rng_may_be_a_stream_or_a_key_function_as_in_0_3_0():
    for rng in (nnx.Rngs(params=0).params, lambda: jax.random.key(0)):
        keys = CategoricalSampler(rng, entropy_weight=0.0).initialize_state(3)
        assert keys.shape == (3,)
        assert jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)


def test_rng_must_be_an_rngs_and_action_size_positive():
    with pytest.raises(TypeError, match=r"rng must be an nnx\.Rngs"):
        CategoricalSampler(jax.random.key(0), entropy_weight=0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="action_size must be a positive int"):
        NormalSampler(nnx.Rngs(0), entropy_weight=0.0, action_size=0)
    with pytest.raises(ValueError, match=r"initial_log_std=-1\.0 sets the learned log_std"):
        NormalSampler(nnx.Rngs(0), entropy_weight=0.0, initial_log_std=-1.0)  # no action_size


def test_output_is_a_sampled_action_dict():
    sampler = CategoricalSampler(nnx.Rngs(0), entropy_weight=0.0)
    out = _call(sampler, sampler.initialize_state(2), jnp.zeros((2, 3)))
    assert isinstance(out, StatefulModuleOutput)
    assert set(out.output) == {"action", "log_likelihood"}
    assert out.output["log_likelihood"].shape == (2,)
    assert set(out.metrics) == {"probs", "entropy"}


def test_a_masked_class_is_reported_with_probability_zero_and_finite_metrics():
    sampler = CategoricalSampler(nnx.Rngs(0), entropy_weight=0.0)
    logits = jnp.array([[0.0, -jnp.inf, jnp.log(3.0)], [-jnp.inf, 1.0, 1.0]])
    out = _call(sampler, sampler.initialize_state(2), logits)
    # float32 softmax: a few ulps either way, whatever the CPU's vector width.
    expected = [[0.25, 0.0, 0.75], [0.0, 0.5, 0.5]]
    np.testing.assert_allclose(jnp.stack(out.metrics["probs"], -1), expected, rtol=1e-6, atol=0)
    assert all(bool(jnp.all(jnp.isfinite(m))) for m in jax.tree.leaves(out.metrics))
    assert bool(jnp.all(out.output["action"] != jnp.array([1, 0])))  # never a masked class


def test_probabilities_are_logged_per_class_not_pooled():
    sampler = CategoricalSampler(nnx.Rngs(0), entropy_weight=0.0)
    logits = jnp.log(jnp.array([[0.1, 0.9], [0.3, 0.7]]))
    out = _call(sampler, sampler.initialize_state(2), logits)
    logged = summarize("net", out.metrics)
    # Pooled over classes, every policy's mean would be 1/2.
    np.testing.assert_allclose(logged["net/probs/0/mean"], 0.2, rtol=1e-5)
    np.testing.assert_allclose(logged["net/probs/1/mean"], 0.8, rtol=1e-5)


def test_a_nan_logit_gives_a_nan_entropy_not_zero():
    sampler = CategoricalSampler(nnx.Rngs(0), 0.01)
    for logits in ([jnp.nan, 0.0, 1.0], [jnp.inf, 0.0, 1.0]):
        out = sampler(sampler.initialize_state(1), jnp.array([logits]))
        assert np.isnan(out.metrics["entropy"][0]), logits
    masked = sampler(sampler.initialize_state(1), jnp.array([[-jnp.inf, 0.0, 0.0]]))
    np.testing.assert_allclose(masked.metrics["entropy"][0], np.log(2.0), rtol=1e-6)
