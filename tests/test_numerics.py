"""Float32 moments that keep equal values equal: corrected_mean, variance, fraction_explained."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo._numerics import corrected_mean, fraction_explained, variance


@pytest.mark.parametrize("value", [2.5, 0.1, 1 / 3, 123.456, 12345.678, -98765.43])
@pytest.mark.parametrize("shape", [(5, 3), (7, 9, 2), (1000,)])
def test_equal_values_have_their_value_as_mean_and_no_variance(value, shape):
    x = jnp.full(shape, value, jnp.float32)
    assert corrected_mean(x) == np.float32(value)
    assert variance(x) == 0.0
    np.testing.assert_array_equal(
        corrected_mean(x, axis=(0,)), np.full(shape[1:], np.float32(value))
    )


def test_the_corrected_mean_is_the_mean_over_the_axes_asked_for():
    x = np.random.default_rng(0).normal(3.0, 2.0, (6, 5, 4)).astype(np.float32)
    for axis in (None, 0, (0, 1), (1, 2)):
        np.testing.assert_allclose(
            corrected_mean(jnp.asarray(x), axis), x.astype(np.float64).mean(axis), rtol=1e-6
        )
    np.testing.assert_allclose(variance(jnp.asarray(x)), x.astype(np.float64).var(), rtol=1e-5)


def test_fraction_explained_against_numpy_and_nan_for_targets_that_do_not_vary():
    rng = np.random.default_rng(1)
    targets = rng.normal(1.0, 2.0, 50).astype(np.float32)
    values = targets + rng.normal(0.0, 0.5, 50).astype(np.float32)
    unexplained = np.mean((values - targets) ** 2)
    np.testing.assert_allclose(
        fraction_explained(jnp.asarray(unexplained), jnp.asarray(targets)),
        1 - unexplained / targets.astype(np.float64).var(),
        rtol=1e-5,
    )
    constant = jnp.full(50, 1e4, jnp.float32)
    assert np.isnan(fraction_explained(jnp.asarray(1e-4), constant))
    assert np.isnan(jax.jit(fraction_explained)(jnp.asarray(1e-4), constant))
