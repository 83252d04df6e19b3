"""Activation recording: a Recorder's activations are the modules' own outputs, by path."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from transformed_modules import DenseEnsemble

from nnx_ppo.algorithms.rollout import record_activations_rollout, reset_envs
from nnx_ppo.contract.axes import BatchedTree, Carry, Extras
from nnx_ppo.envs import CartPole, Pendulum
from nnx_ppo.networks import (
    Dense,
    Normalizer,
    Scale,
    Sequential,
    make_discrete_mlp_actor_critic,
    make_mlp_actor_critic,
)
from nnx_ppo.networks.recording import (
    ACTIVATION_KEY,
    Recorder,
    extract_activations,
    with_recording,
)
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import check_module

ACTION = ".components['action']"
VALUE = ".components['value']"
STEPS, ENVS, MAX_STEPS = 5, 3, 3


@pytest.fixture(scope="module")
def network():
    net = make_discrete_mlp_actor_critic(4, 2, [8], [6], nnx.Rngs(0), normalize_obs=False)
    net.eval()
    return net


def by_hand(network, obs, sampler_state):
    """Each module of the actor-critic called by hand on ``obs``, as its containers call them."""
    action, value = network.action, network.value
    out = {}
    out[ACTION + ".layers[0]"] = action.layers[0]((), obs).output
    out[ACTION + ".layers[1]"] = action.layers[1]((), out[ACTION + ".layers[0]"]).output
    out[ACTION + ".layers[2]"] = action.layers[2](sampler_state, out[ACTION + ".layers[1]"]).output
    out[VALUE + ".layers[0]"] = value.layers[0]((), obs).output
    out[VALUE + ".layers[1]"] = value.layers[1]((), out[VALUE + ".layers[0]"]).output
    return out


def test_rollout_activations_are_the_modules_outputs_called_by_hand(network):
    env, key = CartPole(max_steps=MAX_STEPS), jax.random.key(7)
    before = jax.tree.map(np.asarray, nnx.state(network, nnx.Param))
    activations, finished = jax.jit(record_activations_rollout, static_argnums=(0, 2, 3))(
        env, network, ENVS, STEPS, key
    )
    # Every contract module once, by its path; leaves (T, B, *feat).
    assert sorted(activations) == sorted(
        ["", ACTION, VALUE]
        + [f"{ACTION}.layers[{i}]" for i in range(3)]
        + [f"{VALUE}.layers[{i}]" for i in range(2)]
    )
    assert activations[f"{ACTION}.layers[0]"].shape == (STEPS, ENVS, 8)
    # The same episodes replayed with the recorded actions (no env is reset), and every
    # module called by hand on all their observations at once (the policy is
    # deterministic, each row's output its own), in one compiled function.
    actions = activations[""].actions

    def replay_by_hand(actions, sampler_state):
        def step(state, action):
            return jax.vmap(env.step)(state, action), state.obs

        _, observations = jax.lax.scan(step, reset_envs(env, jax.random.split(key, ENVS)), actions)
        return by_hand(network, observations.reshape(STEPS * ENVS, -1), sampler_state)

    sampler_state = network.action.layers[2].initialize_state(STEPS * ENVS)
    expected = jax.jit(replay_by_hand)(actions, sampler_state)
    for path, output in expected.items():
        jax.tree.map(
            lambda got, want: np.testing.assert_allclose(
                got, want.reshape(got.shape), rtol=1e-5, atol=1e-6
            ),
            activations[path],
            output,
        )
    np.testing.assert_array_equal(actions, activations[ACTION + ".layers[2]"]["action"])
    np.testing.assert_allclose(
        activations[""].value_estimates, activations[VALUE + ".layers[1]"][..., 0]
    )
    # A container's output is what its last child returned.
    jax.tree.map(
        np.testing.assert_array_equal, activations[ACTION], activations[ACTION + ".layers[2]"]
    )
    # Truncated after MAX_STEPS steps: the later steps are marked.
    np.testing.assert_array_equal(
        finished, np.broadcast_to((np.arange(STEPS) >= MAX_STEPS)[:, None], (STEPS, ENVS))
    )
    # The network is not changed.
    after = jax.tree.map(np.asarray, nnx.state(network, nnx.Param))
    jax.tree.map(np.testing.assert_array_equal, before, after)


def test_a_continuous_action_network_is_recorded():
    """Its outputs hold leaves of different feature shapes: actions ``(T, B, 1)`` beside
    log-likelihoods ``(T, B)``."""
    env = Pendulum()
    network = make_mlp_actor_critic(3, 1, [8], [6], nnx.Rngs(0), normalize_obs=False)
    activations, _ = record_activations_rollout(env, network, ENVS, STEPS, jax.random.key(1))
    assert activations[""].actions.shape == (STEPS, ENVS, 1)
    assert activations[""].loglikelihoods.shape == (STEPS, ENVS)


def test_recorder_runs_the_network_unchanged(network):
    recorder = with_recording(network)
    assert recorder.wrapped is network  # 0.3.0's attribute name
    state, obs = network.initialize_state(2), jnp.ones((2, 4))
    plain, recorded = jax.jit(lambda s, x: (network(s, x), recorder(s, x)))(state, obs)
    jax.tree.map(np.testing.assert_array_equal, plain.output, recorded.output)
    assert_keys_equal(plain.next_state, recorded.next_state)
    assert set(recorded.metrics) == {"network", ACTIVATION_KEY}
    assert jax.tree.structure(recorded.metrics["network"]) == jax.tree.structure(plain.metrics)
    activations = extract_activations(recorded.metrics)
    jax.tree.map(np.testing.assert_array_equal, activations[""], plain.output)
    assert extract_activations(plain.metrics) is None
    with pytest.warns(UserWarning, match="already is a Recorder"):
        assert with_recording(recorder) is recorder


def test_a_network_already_recorded_is_recorded_once(network):
    env, key = CartPole(max_steps=MAX_STEPS), jax.random.key(7)
    plain, _ = record_activations_rollout(env, network, ENVS, 2, key)
    wrapped, _ = record_activations_rollout(env, with_recording(network), ENVS, 2, key)
    assert sorted(wrapped) == sorted(plain)  # not nested under another recorder's keys
    jax.tree.map(np.testing.assert_array_equal, wrapped, plain)


def test_a_plain_flax_module_is_refused_when_recorded_not_when_called():
    with pytest.raises(TypeError, match=r"a Recorder records is a Linear, .*Stateless"):
        with_recording(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))  # type: ignore[arg-type]


def test_a_recorder_replays_what_it_recorded():
    stochastic = make_discrete_mlp_actor_critic(4, 3, [8], [6], nnx.Rngs(1), normalize_obs=False)
    recorder = with_recording(stochastic)
    state, obs = stochastic.initialize_state(64), jnp.ones((64, 4))
    first = recorder(state, obs)
    again = recorder(first.next_state, obs)  # other keys: other actions
    assert not np.array_equal(first.output.actions, again.output.actions)
    replayed = recorder(first.next_state, obs, first.rollout_extras)  # other keys, same actions
    np.testing.assert_array_equal(replayed.output.actions, first.output.actions)
    np.testing.assert_array_equal(replayed.output.loglikelihoods, first.output.loglikelihoods)


def test_a_nested_recorder_keeps_the_container_keys():
    inner = Sequential([Dense(3, 2, nnx.Rngs(0))])
    outer = Sequential([with_recording(inner), Dense(2, 1, nnx.Rngs(1))])
    out = jax.jit(outer)(outer.initialize_state(4), jnp.ones((4, 3)))
    found = extract_activations(out.metrics)
    assert set(found) == {0}
    (activations,) = found.values()
    assert sorted(activations) == ["", ".layers[0]"]
    assert activations[".layers[0]"].shape == (4, 2)


def assert_keys_equal(a, b):
    jax.tree.map(
        lambda x, y: np.testing.assert_array_equal(jax.random.key_data(x), jax.random.key_data(y)),
        a,
        b,
    )


class CalledTwice(StatefulModule):
    """A module that applies its child twice in one step."""

    def __init__(self) -> None:
        self.child = Dense(2, 2, nnx.Rngs(0))

    def __call__(self, state: Carry, x: BatchedTree, rollout_extras: Extras = None):
        once = self.child((), x)
        twice = self.child((), once.output)
        return StatefulModuleOutput(state, twice.output, jnp.zeros(()), {})


def test_a_module_called_twice_in_a_step_is_named():
    recorder = Recorder(CalledTwice())
    with pytest.raises(ValueError, match=r"\.child \(Dense\) was called more than once"):
        recorder((), jnp.ones((1, 2)))


def test_a_recorder_keeps_the_contract():
    def factory():
        rngs = nnx.Rngs(0)
        return with_recording(Sequential([Normalizer(3), Dense(3, 2, rngs)]))

    check_module(factory, jnp.zeros(3), batch_sizes=(2,), time_lengths=(2,), max_examples=1)


class MakesItsOwn(StatefulModule):
    """A module that builds a fresh child in every call: the child is in no NNX graph."""

    def __call__(self, state: Carry, x: BatchedTree, rollout_extras: Extras = None):
        return Scale(2.0)(state, x)


def test_a_module_outside_the_graph_is_named():
    with pytest.raises(ValueError, match="a Scale was called in the step of MakesItsOwn"):
        Recorder(MakesItsOwn())((), jnp.ones((1, 2)))


class Ponder(StatefulModule):
    """Runs its Dense three times in a scan: the calls are the scan's."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.cell = Dense(4, 4, rngs)

    def __call__(self, state: Carry, x: BatchedTree, rollout_extras: Extras = None) -> Any:
        def think(h: jax.Array, _: None) -> tuple[jax.Array, None]:
            return jnp.tanh(self.cell((), h).output), None

        h, _ = jax.lax.scan(think, x, None, length=3)
        return StatefulModuleOutput(state, h, jnp.zeros(()), {})


@pytest.mark.parametrize("inner", [DenseEnsemble, Ponder])
def test_modules_called_inside_a_transform_are_recorded_as_their_container(inner) -> None:
    # They were refused as "not in the NNX graph" (the transform's copy), or leaked the
    # scan's tracers into the activations.
    rngs = nnx.Rngs(0)
    recorder = with_recording(Sequential([inner(rngs), Dense(4, 2, rngs)]))
    x = jnp.ones((2, 4))
    eager = recorder(recorder.initialize_state(2), x)
    compiled = nnx.jit(lambda r, s, x: r(s, x))(recorder, recorder.initialize_state(2), x)
    for out in (eager, compiled):
        activations = extract_activations(out.metrics)
        assert set(activations) == {"", ".layers[0]", ".layers[1]"}
        assert all(isinstance(a, jax.Array) and a.shape[0] == 2 for a in activations.values())
