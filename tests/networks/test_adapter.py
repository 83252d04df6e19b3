"""PPOAdapter: building PPONetworkOutput, value squeezing, routing, and its contract errors."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_ppo
from nnx_ppo.networks.adapter import PPOAdapter, is_sampled_action
from nnx_ppo.networks.containers import Parallel, Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import Filter, Map, Scale
from nnx_ppo.networks.variational import VariationalBottleneck


@nnx.jit
def _call(module: StatefulModule, state: Any, x: Any, rollout_extras: Any = None) -> Any:
    return module(state, x, rollout_extras)


def _adapter(rngs: nnx.Rngs, obs: int = 3, actions: int = 2) -> PPOAdapter:
    return PPOAdapter(
        action=Sequential([Dense(obs, 2 * actions, rngs), NormalTanhSampler(rngs, 0.5)]),
        value=Dense(obs, 1, rngs),
    )


@pytest.mark.parametrize("batch", [1, 3])
def test_single_head_output_shapes_keep_the_batch_axis(batch: int):
    net = _adapter(nnx.Rngs(0))
    out = _call(net, net.initialize_state(batch), jnp.ones((batch, 3)))
    assert isinstance(out, StatefulModuleOutput)
    assert isinstance(out.output, PPONetworkOutput)
    assert out.output.actions.shape == (batch, 2)
    assert out.output.loglikelihoods.shape == (batch,)
    assert out.output.value_estimates.shape == (batch,)  # (B, 1) -> (B,), B == 1 included


def test_output_fields_come_from_the_sampler_and_the_value_port():
    rngs = nnx.Rngs(0)
    sampler = NormalTanhSampler(rngs, entropy_weight=0.5)
    critic = Dense(3, 1, rngs)
    net = PPOAdapter(action=Sequential([Dense(3, 4, rngs), sampler]), value=critic)
    assert net.action[1] is sampler and net.value is critic
    state = net.initialize_state(2)
    x = jnp.arange(6.0).reshape(2, 3)
    out = _call(net, state, x)

    sampled = _call(net.action, state["action"], x)
    np.testing.assert_array_equal(out.output.actions, sampled.output["action"])
    np.testing.assert_array_equal(out.output.loglikelihoods, sampled.output["log_likelihood"])
    np.testing.assert_array_equal(out.output.value_estimates, _call(critic, (), x).output[:, 0])
    np.testing.assert_array_equal(out.regularization_loss, sampled.regularization_loss)
    assert set(out.metrics) == {"action", "value"}
    assert set(out.metrics["action"][1]) == {"mu", "sigma", "entropy"}
    assert set(out.next_state) == {"action", "value"}
    assert set(out.rollout_extras) == {"action", "value"}


def test_assigning_a_port_replaces_it_as_in_0_3_0():
    rngs = nnx.Rngs(0)
    net = _adapter(rngs)
    wider = Sequential([Dense(3, 16, rngs), Dense(16, 1, rngs)])
    net.value = wider
    assert net.value is wider and net.components["value"] is wider
    out = _call(net, net.initialize_state(2), jnp.ones((2, 3)))
    np.testing.assert_array_equal(
        out.output.value_estimates,
        _call(wider, wider.initialize_state(2), jnp.ones((2, 3))).output[:, 0],
    )
    with pytest.raises(TypeError, match="PPOAdapter's action port is a Linear, not a Stateful"):
        net.action = nnx.Linear(3, 4, rngs=rngs)


def test_values_already_one_per_sample_are_kept():
    rngs = nnx.Rngs(0)
    net = PPOAdapter(
        action=CategoricalSampler(rngs, entropy_weight=0.0),
        value=Filter({"v": lambda x: x[:, 0]}),
    )
    x = jnp.array([[1.0, 2.0, 3.0]])
    out = _call(net, net.initialize_state(1), x)
    assert out.output.value_estimates["v"].shape == (1,)
    assert out.output.actions.shape == (1,)


def test_regularization_of_both_ports_is_summed_and_extras_route_back():
    rngs = nnx.Rngs(1)
    bottleneck = VariationalBottleneck(1, rngs, kl_weight=2.0)
    net = PPOAdapter(
        action=NormalTanhSampler(rngs, entropy_weight=0.1),
        value=Sequential([bottleneck, Scale(1.0)]),
    )
    state = net.initialize_state(2)
    x = jnp.array([[0.3, -0.2], [1.0, 0.5]])
    out = _call(net, state, x)
    sampler_only = _call(net.action, state["action"], x)
    value_only = _call(net.value, state["value"], x)
    np.testing.assert_allclose(
        out.regularization_loss,
        sampler_only.regularization_loss + value_only.regularization_loss,
        rtol=1e-6,
    )
    replay = _call(net, state, x, out.rollout_extras)
    jax.tree.map(np.testing.assert_array_equal, out.output, replay.output)


def test_multi_head_dict_actions_and_values():
    rngs = nnx.Rngs(0)
    heads = Parallel(
        {
            "action_a": Dense(4, 4, rngs),
            "action_b": Dense(4, 3, rngs),
            "value_a": Dense(4, 1, rngs),
            "value_b": Dense(4, 1, rngs),
        }
    )
    action_port = Sequential(
        [
            Filter({"a": "action_a", "b": "action_b"}),
            Map(a=NormalTanhSampler(rngs, 0.0), b=CategoricalSampler(rngs, 0.0)),
        ]
    )
    net = Sequential(
        [heads, PPOAdapter(action=action_port, value=Filter({"a": "value_a", "b": "value_b"}))]
    )
    out = _call(net, net.initialize_state(3), jnp.ones((3, 4)))
    assert nnx_ppo.checks_enabled()
    assert out.output.actions["a"].shape == (3, 2)
    assert out.output.actions["b"].shape == (3,)
    assert out.output.loglikelihoods["a"].shape == (3,)
    assert out.output.loglikelihoods["b"].shape == (3,)
    assert out.output.value_estimates["a"].shape == (3,)
    assert set(out.output.value_estimates) == {"a", "b"}


def test_update_statistics_reaches_both_ports():
    rngs = nnx.Rngs(0)
    action_norm, value_norm = Normalizer(2), Normalizer(2)
    net = PPOAdapter(
        action=Sequential([action_norm, Dense(2, 4, rngs), NormalTanhSampler(rngs, 0.0)]),
        value=Sequential([value_norm, Dense(2, 1, rngs)]),
    )
    state = net.initialize_state(2)
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    extras = _call(net, state, x).rollout_extras
    nnx.jit(type(net).update_statistics)(net, jax.tree.map(lambda e: e[None], extras))
    for normalizer in (action_norm, value_norm):
        assert float(normalizer.counter[...]) == 2.0
        np.testing.assert_allclose(normalizer.mean[...], [2.0, 3.0])


# ----------------------------------------------------------------------- errors


class _RawActions(StatefulModule):
    """An action port that forgot its sampler: plain arrays."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput((), {"a": x}, jnp.zeros(()), {}, None)


class _MatrixLogLikelihood(StatefulModule):
    """A sampler that forgot to sum its log-likelihood over action dimensions."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        output = {"action": x, "log_likelihood": x}
        return StatefulModuleOutput((), output, jnp.zeros(()), {}, None)


class _SamplerWithEntropy(StatefulModule):
    """A sampler that returns its entropy beside the action and its log-likelihood."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        output = {"action": x, "log_likelihood": x[:, 0], "entropy": x[:, 0]}
        return StatefulModuleOutput((), output, jnp.zeros(()), {}, None)


def test_a_sampled_action_is_exactly_its_two_keys():
    action, log_likelihood = jnp.zeros((2, 3)), jnp.zeros(2)
    sampled = {"action": action, "log_likelihood": log_likelihood}
    assert is_sampled_action(sampled)
    assert not is_sampled_action({"action": action})
    assert not is_sampled_action(sampled | {"entropy": log_likelihood})
    # An action port whose output carries more than a SampledAction is refused, not
    # silently cut down to its action and log-likelihood.
    net = PPOAdapter(action=_SamplerWithEntropy(), value=Filter({"v": lambda x: x[:, 0]}))
    with pytest.raises(nnx_ppo.ContractError, match="is not part of a sampled action"):
        net(net.initialize_state(2), jnp.ones((2, 3)))


def test_an_action_port_without_sampler_is_a_contract_error():
    net = PPOAdapter(action=_RawActions(), value=Filter({"v": lambda x: x[:, 0]}))
    with pytest.raises(nnx_ppo.ContractError, match=r"output\['action'\]\['a'\]") as info:
        net(net.initialize_state(2), jnp.ones((2, 3)))
    assert "ActionSampler" in str(info.value)


def test_a_per_dimension_log_likelihood_is_a_contract_error():
    net = PPOAdapter(action=_MatrixLogLikelihood(), value=Filter({"v": lambda x: x[:, 0]}))
    with pytest.raises(nnx_ppo.ContractError, match="log_likelihood"):
        net(net.initialize_state(2), jnp.ones((2, 3)))


def test_a_value_of_several_columns_is_a_contract_error():
    rngs = nnx.Rngs(0)
    net = PPOAdapter(action=CategoricalSampler(rngs, 0.0), value=Dense(3, 2, rngs))
    with pytest.raises(nnx_ppo.ContractError, match=r"output\['value'\]") as info:
        net(net.initialize_state(4), jnp.ones((4, 3)))
    assert "(4, 2)" in str(info.value)
