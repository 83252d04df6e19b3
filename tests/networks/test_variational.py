"""Variational bottlenecks: KL against SciPy, reparameterised samples, AR(1) penalty, resets.

Replay of the noise over a rollout (whole and sliced) is in test_replay.py.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck

LATENT = 3
BATCH = 4


@nnx.jit
def _call(module: StatefulModule, state: Any, x: Any) -> Any:
    return module(state, x)


def _inputs(rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """mu, sigma and the module input, for min_std=0."""
    mu = rng.uniform(-2, 2, (batch, LATENT))
    sigma = np.exp(rng.uniform(np.log(0.05), np.log(3.0), (batch, LATENT)))
    x = np.concatenate([mu, np.log(np.expm1(sigma))], axis=-1).astype(np.float32)
    return mu, sigma, x


def _kl_to_standard_normal(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """KL(q || p) = cross-entropy(q, p) - H(q), with p = N(0, 1); summed over the latent."""
    cross_entropy = 0.5 * np.log(2 * np.pi) + 0.5 * (mu**2 + sigma**2)
    return np.sum(cross_entropy - stats.norm(mu, sigma).entropy(), axis=-1)


@given(seed=st.integers(0, 2**16))
def test_kl_and_regularization_match_scipy(seed: int):
    rng = np.random.default_rng(seed)
    mu, sigma, x = _inputs(rng, BATCH)
    module = VariationalBottleneck(LATENT, nnx.Rngs(0), kl_weight=0.25, min_std=0.0)
    out = _call(module, module.initialize_state(BATCH), x)
    expected = _kl_to_standard_normal(mu, sigma)
    np.testing.assert_allclose(out.metrics["kl_divergence"], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.regularization_loss, 0.25 * expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.metrics["mu"], mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.metrics["sigma"], sigma, rtol=1e-4)
    assert out.output.shape == (BATCH, LATENT)
    assert out.rollout_extras is None


def test_samples_follow_the_latent_distribution_and_are_reparameterised():
    batch = 4000
    module = VariationalBottleneck(1, nnx.Rngs(1), min_std=0.0)
    x = jnp.broadcast_to(jnp.array([0.7, float(np.log(np.expm1(0.4)))]), (batch, 2))
    state = module.initialize_state(batch)
    z = np.asarray(_call(module, state, x).output[:, 0])
    assert abs(z.mean() - 0.7) < 5 * 0.4 / np.sqrt(batch)
    assert abs(z.std() - 0.4) < 5 * 0.4 / np.sqrt(2 * batch)

    # z = mu + sigma * eps: dz/dmu = 1 and dz/dsigma = eps = (z - mu) / sigma.
    small = state[:3]
    x_small = x[:3]
    jacobian = jax.jacobian(lambda x: module(small, x).output[:, 0])(x_small)
    eps = (z[:3] - 0.7) / 0.4
    np.testing.assert_allclose(np.diagonal(jacobian[:, :, 0]), 1.0, rtol=1e-6)
    d_sigma_d_raw = 1 - np.exp(-0.4)
    np.testing.assert_allclose(np.diagonal(jacobian[:, :, 1]), eps * d_sigma_d_raw, rtol=1e-3)


def test_keys_advance_and_reset_keeps_them():
    module = VariationalBottleneck(LATENT, nnx.Rngs(0))
    state = module.initialize_state(2)
    x = jnp.zeros((2, 2 * LATENT))
    first = _call(module, state, x)
    second = _call(module, first.next_state, x)
    assert not np.allclose(first.output, second.output)
    data = jax.random.key_data
    np.testing.assert_array_equal(data(module.reset_state(state)), data(state))
    np.testing.assert_array_equal(data(jax.vmap(module.reset_state)(state)), data(state))


# ------------------------------------------------------------------------------ AR(1)


def test_ar1_penalty_is_zero_first_then_the_mean_squared_jump():
    module = AR1VariationalBottleneck(
        LATENT, nnx.Rngs(0), kl_weight=0.5, ar1_weight=2.0, min_std=0.0
    )
    rng = np.random.default_rng(0)
    _, _, x = _inputs(rng, BATCH)
    state = module.initialize_state(BATCH)
    first = _call(module, state, x)
    np.testing.assert_array_equal(first.metrics["l2_diff"], np.zeros(BATCH))
    second = _call(module, first.next_state, x)
    jump = np.mean((np.asarray(second.output) - np.asarray(first.output)) ** 2, axis=-1)
    np.testing.assert_allclose(second.metrics["l2_diff"], jump, rtol=1e-5)
    np.testing.assert_allclose(
        second.regularization_loss,
        0.5 * np.asarray(second.metrics["kl_divergence"]) + 2.0 * jump,
        rtol=1e-5,
    )
    np.testing.assert_array_equal(second.next_state["last_z"], second.output)


def test_ar1_reset_forgets_the_last_latent_per_env_and_keeps_keys():
    module = AR1VariationalBottleneck(LATENT, nnx.Rngs(0))
    x = jnp.ones((BATCH, 2 * LATENT))
    stepped = _call(module, module.initialize_state(BATCH), x).next_state

    one_env = module.reset_state(jax.tree.map(lambda leaf: leaf[1], stepped))
    np.testing.assert_array_equal(one_env["last_z"], np.zeros(LATENT))
    assert not one_env["has_last_z"]

    done = jnp.array([False, True, False, False])
    reset = jax.vmap(module.reset_state)(stepped)
    partial = jax.tree.map(
        lambda r, s: jnp.where(done.reshape(-1, *[1] * (s.ndim - 1)), r, s), reset, stepped
    )
    out = _call(module, partial, x)
    assert out.metrics["l2_diff"][1] == 0.0
    assert np.all(np.asarray(out.metrics["l2_diff"])[[0, 2, 3]] > 0)
    data = jax.random.key_data
    np.testing.assert_array_equal(data(reset["keys"]), data(stepped["keys"]))


def _dtypes(tree: Any) -> Any:
    return jax.tree.map(lambda leaf: leaf.dtype, tree)


@pytest.mark.parametrize(
    ("dtype", "x64"), [(jnp.bfloat16, False), (jnp.float16, False), (jnp.float64, True)]
)
@pytest.mark.parametrize("module_type", [VariationalBottleneck, AR1VariationalBottleneck])
def test_the_carry_keeps_its_dtype_whatever_the_input_s(module_type: type, dtype: Any, x64: bool):
    """last_z took the input's dtype (bfloat16 from a bfloat16 layer), and the contract
    check blamed the AR(1) bottleneck for changing its own carry."""
    module = module_type(LATENT, nnx.Rngs(0))
    state = module.initialize_state(BATCH)
    with jax.enable_x64(x64):
        # Traced, not run: the contract check on next_state is what failed.
        out = nnx.eval_shape(_call, module, state, jnp.ones((BATCH, 2 * LATENT), dtype))
    assert _dtypes(out.next_state) == _dtypes(state)
    assert out.output.dtype == dtype


@pytest.mark.parametrize("through_time", [True, False])
def test_ar1_backprop_through_time_controls_the_gradient_to_the_last_latent(through_time: bool):
    module = AR1VariationalBottleneck(
        LATENT, nnx.Rngs(0), kl_weight=0.0, backprop_through_time=through_time
    )
    x = jnp.ones((2, 2 * LATENT))
    state = _call(module, module.initialize_state(2), x).next_state

    def penalty(last_z: jax.Array) -> jax.Array:
        return jnp.sum(module({**state, "last_z": last_z}, x).regularization_loss)

    gradient = jax.grad(penalty)(state["last_z"] + 0.5)
    assert np.any(gradient != 0) == through_time


# ---------------------------------------------------------------------- bad input


def test_wrong_input_width_and_bad_arguments_are_named():
    module = VariationalBottleneck(LATENT, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"latent_size=3\) expects"):
        module(module.initialize_state(2), jnp.zeros((2, LATENT)))
    with pytest.raises(ValueError, match="latent_size must be a positive int"):
        VariationalBottleneck(0, nnx.Rngs(0))
    with pytest.raises(ValueError, match="kl_weight must be >= 0"):
        VariationalBottleneck(2, nnx.Rngs(0), kl_weight=-1.0)
    with pytest.raises(ValueError, match="ar1_weight must be >= 0"):
        AR1VariationalBottleneck(2, nnx.Rngs(0), ar1_weight=-0.1)
    with pytest.raises(TypeError, match=r"VariationalBottleneck: rng must be an nnx\.Rngs"):
        VariationalBottleneck(2, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("module_type", [VariationalBottleneck, AR1VariationalBottleneck])
@pytest.mark.parametrize(
    "rng",
    [
        nnx.Rngs(0),
        nnx.Rngs(params=0).params,  # a stream, as 0.3.0 also accepted
        lambda: jax.random.key(0),  # any function returning a key, as 0.3.0 called rng()
        lambda: jax.random.PRNGKey(0),  # a legacy uint32 key is wrapped
    ],
    ids=["rngs", "stream", "function", "legacy_key_function"],
)
def test_rng_takes_every_form_0_3_0_accepted(module_type: type, rng: object):
    module = module_type(LATENT, rng)
    state = module.initialize_state(BATCH)
    keys = state if module_type is VariationalBottleneck else state["keys"]
    assert keys.shape == (BATCH,)
    assert jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    out = module(state, jnp.zeros((BATCH, 2 * LATENT)))
    assert out.output.shape == (BATCH, LATENT)
