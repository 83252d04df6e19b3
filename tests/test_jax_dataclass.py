"""JaxDataclass: a frozen dataclass pytree rebuilt without __init__."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.jax_dataclass import JaxDataclass

INITS = []


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Pair(JaxDataclass):
    x: jax.Array
    y: jax.Array

    def __post_init__(self):
        INITS.append(self)
        if not isinstance(self.x, jax.Array):  # what a type check of __init__ would refuse
            raise TypeError(f"x must be an array, got {type(self.x).__name__}")


def test_pytree_round_trips_without_init():
    pair = Pair(jnp.arange(3.0), jnp.ones(3))
    children, names = pair.tree_flatten()
    assert names == ("x", "y")
    assert children[0] is pair.x and children[1] is pair.y
    INITS.clear()
    # JAX rebuilds nodes with placeholders (object() sentinels, tracers): no __init__ runs.
    rebuilt = jax.tree.map(lambda _: object(), pair)
    assert isinstance(rebuilt, Pair) and INITS == []
    doubled = jax.jit(jax.vmap(lambda p: Pair.tree_unflatten(("x", "y"), (p.x * 2, p.y))))(pair)
    np.testing.assert_array_equal(doubled.x, [0.0, 2.0, 4.0])
    assert INITS == []


def test_replace_runs_init_and_the_instance_is_frozen():
    pair = Pair(jnp.zeros(2), jnp.zeros(2))
    INITS.clear()
    replaced = pair.replace(y=jnp.ones(2))
    np.testing.assert_array_equal(replaced.y, [1.0, 1.0])
    assert replaced.x is pair.x and [replaced] == INITS
    with pytest.raises(TypeError, match="x must be an array, got int"):
        pair.replace(x=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.x = jnp.ones(2)  # type: ignore[misc]
