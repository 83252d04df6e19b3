"""The factories' compiled weight initialiser: flax's values, bit for bit, one program per shape."""

import logging

import jax
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks import factories
from nnx_ppo.networks._initializers import variance_scaling_uniform


@pytest.mark.parametrize("shape", [(5, 64), (64, 2), (3, 4, 6)])
@pytest.mark.parametrize("scale", [1.0, 0.7])
def test_compiled_variance_scaling_draws_flax_values_bit_for_bit(shape, scale):
    key = jax.random.key(11)
    reference = nnx.initializers.variance_scaling(scale, "fan_in", "uniform")
    drawn = variance_scaling_uniform(scale)(key, shape)
    np.testing.assert_array_equal(drawn, reference(key, shape))


def test_a_factory_builds_the_network_flax_initialisers_would():
    def params(network):
        return jax.tree.leaves(nnx.state(network, nnx.Param))

    built = factories.make_mlp(
        [5, 16, 3],
        nnx.Rngs(2),
        kernel_init=nnx.initializers.variance_scaling(1.0, "fan_in", "uniform"),
    )
    made = factories.make_mlp_actor_critic(5, 3, [16], [16], nnx.Rngs(2), normalize_obs=False)
    # The actor's first layer is the first draw of the same stream in both.
    np.testing.assert_array_equal(params(made.action.layers[0])[1], params(built.layers[0])[1])


def test_a_second_network_of_the_same_shapes_compiles_no_initialiser(caplog):
    factories.make_mlp_actor_critic(7, 2, [13], [13], nnx.Rngs(0))
    with caplog.at_level(logging.DEBUG, logger="jax._src.dispatch"):
        factories.make_mlp_actor_critic(7, 2, [13], [13], nnx.Rngs(1))
    compiled = [r.getMessage() for r in caplog.records if "XLA compilation" in r.getMessage()]
    assert not any("init" in message for message in compiled), compiled
