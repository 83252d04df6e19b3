"""The step's split of (network, optimizer) reuses a structure's graphdef, and never a stale one."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from nnx_ppo.algorithms._step import _GraphArgument, _split, _write_back
from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network


class Holder(nnx.Module):
    def __init__(self, shared: bool = False) -> None:
        self.layer = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
        self.other = self.layer if shared else nnx.Linear(2, 3, rngs=nnx.Rngs(1))
        self.flag = False


ADAM = optax.adam(1e-3)  # one object: the transformation is part of the structure


def pair(module: nnx.Module) -> tuple[nnx.Module, nnx.Optimizer]:
    return module, nnx.Optimizer(module, ADAM, wrt=nnx.Param)


def same_as_nnx_split(got, pair) -> None:
    graphdef, state = nnx.split(pair)
    assert got.graph.graphdef == graphdef
    assert jax.tree.structure(got.state) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(got.state), jax.tree.leaves(state), strict=True):
        assert a is b


def test_a_structure_seen_before_reuses_its_graphdef_and_matches_nnx_split() -> None:
    first, second = pair(Holder()), pair(Holder())
    split_first = _split(first)
    split_second = _split(second)
    assert split_second.graph is split_first.graph  # no graph walk the second time
    same_as_nnx_split(split_second, second)


def test_a_changed_static_value_or_variable_type_gives_a_new_graphdef() -> None:
    module = Holder()
    both = pair(module)
    _split(both)
    module.flag = True
    same_as_nnx_split(_split(both), both)
    module.layer.bias = nnx.BatchStat(module.layer.bias.get_value())
    same_as_nnx_split(_split(both), both)


def test_shared_variables_are_split_in_full_and_written_back_through_nnx() -> None:
    module = Holder(shared=True)
    both = pair(module)
    split = _split(both)
    assert split.variables == []
    same_as_nnx_split(split, both)
    new_state = jax.tree.map(lambda x: x + 1, split.state)
    _write_back(split, both, new_state)
    np.testing.assert_array_equal(module.other.bias[...], jnp.ones(3))


def test_write_back_reaches_a_variable_replaced_between_steps() -> None:
    env = make("cartpole")
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=[8])
    config = PPOConfig(n_envs=4, rollout_length=4, n_epochs=1, n_minibatches=2)
    state = new_training_state(env, network, 4, 0, 1e-2)
    state, _ = ppo_step(env, state, config)
    # Same structure, new Variable objects: the step must train the ones the network now holds.
    linear = next(node for _, node in nnx.iter_graph(network) if isinstance(node, nnx.Linear))
    replaced = nnx.Param(jnp.zeros_like(linear.bias[...]))
    linear.bias = replaced
    state, _ = ppo_step(env, state, config)
    assert linear.bias is replaced
    assert np.any(np.asarray(replaced[...]) != 0.0)


def test_the_graph_argument_hashes_its_graphdef_once(monkeypatch) -> None:
    graphdef, _ = nnx.split(pair(Holder()))
    other, _ = nnx.split(pair(Holder(shared=True)))
    hash_graphdef = type(graphdef).__hash__
    calls = []

    def counted(self) -> int:
        calls.append(self)
        return hash_graphdef(self)

    monkeypatch.setattr(type(graphdef), "__hash__", counted)
    argument = _GraphArgument(graphdef)
    assert hash(argument) == hash(argument) == hash_graphdef(graphdef)
    assert len(calls) == 1
    assert argument == _GraphArgument(graphdef)
    assert argument != _GraphArgument(other)
