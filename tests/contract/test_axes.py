"""align_leading: a per-env (or per-step-and-env) array lined up with a leaf's leading axes."""

import jax.numpy as jnp
import numpy as np

from nnx_ppo.contract.axes import align_leading


def test_a_mask_gets_one_size_1_axis_per_feature_axis_of_the_leaf():
    mask = np.array([True, False])
    leaf = np.arange(12.0).reshape(2, 3, 2)
    assert align_leading(mask, leaf).shape == (2, 1, 1)
    np.testing.assert_array_equal(
        np.where(align_leading(mask, leaf), leaf, 0.0), [leaf[0], np.zeros((3, 2))]
    )
    assert align_leading(mask, leaf[:, 0, 0]).shape == (2,)


def test_time_and_env_axes_line_up_and_jax_arrays_stay_jax_arrays():
    steps = jnp.ones((4, 2), bool)
    aligned = align_leading(steps, jnp.zeros((4, 2, 3)))
    assert aligned.shape == (4, 2, 1) and isinstance(aligned, type(steps))
