"""Factories: MLP layers, MLP actor-critics (continuous, discrete, dict observations)."""

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_ppo
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.envs import State, make, time_limit
from nnx_ppo.networks import factories
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule
from nnx_ppo.networks.utils import Flattener

OBS, ACTIONS, B = 5, 3, 4


@nnx.jit
def _call(net: StatefulModule, state: Any, x: Any) -> Any:
    return net(state, x)


def _adapter(net: StatefulModule) -> PPOAdapter:
    adapter = net[-1] if isinstance(net, Sequential) else net
    assert isinstance(adapter, PPOAdapter)
    return adapter


def test_mlp_layers_have_the_sizes_and_activations_asked_for():
    layers = factories.make_mlp_layers([4, 8, 6, 2], nnx.Rngs(0), activation=nnx.tanh)
    assert [(d.in_features, d.out_features) for d in layers] == [(4, 8), (8, 6), (6, 2)]
    assert [d.activation for d in layers] == [nnx.tanh, nnx.tanh, nnx.tanh]
    last_linear = factories.make_mlp_layers([4, 2], nnx.Rngs(0), activation_last_layer=False)
    assert last_linear[0].activation is None
    mlp = factories.make_mlp([4, 8, 2], nnx.Rngs(0), use_bias=False)
    assert isinstance(mlp, Sequential) and len(mlp) == 2
    assert all(isinstance(d, Dense) and d.linear.bias is None for d in mlp)
    with pytest.raises(ValueError, match="an input and an output size"):
        factories.make_mlp([4], nnx.Rngs(0))


def test_mlp_layers_take_an_activation_by_name_or_none():
    by_name = factories.make_mlp([4, 8, 2], nnx.Rngs(0), activation="tanh")
    assert [d.activation for d in by_name] == [nnx.tanh, nnx.tanh]
    assert [d.activation for d in factories.make_mlp_layers([4, 2], nnx.Rngs(0), None)] == [None]
    with pytest.raises(ValueError, match=r"make_mlp_layers: unknown activation 'tahn'"):
        factories.make_mlp([4, 2], nnx.Rngs(0), activation="tahn")
    with pytest.raises(TypeError, match=r"make_mlp_layers: activation must be a name or a"):
        factories.make_mlp_layers([4, 2], nnx.Rngs(0), activation=3)


def test_actor_critic_structure_matches_0_3_0():
    net = factories.make_mlp_actor_critic(OBS, ACTIONS, [8, 8], [16], nnx.Rngs(0))
    assert isinstance(net, Sequential) and len(net) == 2
    assert isinstance(net[0], Normalizer)
    adapter = _adapter(net)
    actor = adapter.action
    assert isinstance(actor, Sequential)
    denses = [layer for layer in actor if isinstance(layer, Dense)]
    assert [(d.in_features, d.out_features) for d in denses] == [(5, 8), (8, 8), (8, 6)]
    assert denses[-1].activation is None
    sampler = actor[-1]
    assert isinstance(sampler, NormalTanhSampler)
    assert (sampler.entropy_weight, sampler.min_std, sampler.std_scale) == (1e-2, 1e-1, 1.0)
    critic = adapter.value
    assert isinstance(critic, Sequential)
    assert [(d.in_features, d.out_features) for d in critic] == [(5, 16), (16, 1)]
    # The actor and the critic are initialised independently.
    assert not np.allclose(denses[0].linear.kernel[...][:, :8], critic[0].linear.kernel[...][:, :8])

    bare = factories.make_mlp_actor_critic(OBS, ACTIONS, [8], [8], nnx.Rngs(0), normalize_obs=False)
    assert isinstance(bare, PPOAdapter)


def test_initializer_scale_sets_the_kernel_range():
    for scale in (0.1, 2.0):
        net = factories.make_mlp_actor_critic(
            OBS, ACTIONS, [64], [64], nnx.Rngs(0), initializer_scale=scale
        )
        kernel = np.asarray(_adapter(net).value[0].linear.kernel[...])
        limit = np.sqrt(3 * scale / OBS)  # variance scaling, fan_in, uniform
        assert np.abs(kernel).max() <= limit
        assert np.abs(kernel).max() > 0.9 * limit


def test_actor_critic_runs_under_jit_with_checks_and_eval_is_deterministic():
    assert nnx_ppo.checks_enabled()
    net = factories.make_mlp_actor_critic(
        OBS, ACTIONS, [8], [8], nnx.Rngs(0), activation="swish", entropy_weight=0.5
    )
    state = net.initialize_state(B)
    obs = jax.random.normal(jax.random.key(1), (B, OBS))
    out = _call(net, state, obs)
    assert isinstance(out.output, PPONetworkOutput)
    assert out.output.actions.shape == (B, ACTIONS)
    assert out.output.loglikelihoods.shape == (B,)
    assert out.output.value_estimates.shape == (B,)
    assert out.regularization_loss.shape == (B,)
    assert np.all(np.abs(out.output.actions) < 1)

    sampler = _adapter(net).action[-1]
    net.eval()
    assert sampler.deterministic
    first, second = _call(net, state, obs), _call(net, out.next_state, obs)
    np.testing.assert_allclose(first.output.actions, second.output.actions)
    net.train()
    assert not sampler.deterministic


def test_dict_observations_are_normalised_per_entry_then_flattened():
    sizes = {"pos": 3, "vel": 2}
    net = factories.make_mlp_actor_critic(sizes, ACTIONS, [8], [8], nnx.Rngs(0))
    assert isinstance(net, Sequential)
    assert isinstance(net[0], Normalizer) and isinstance(net[1], Flattener)
    assert set(net[0].mean.get_value()) == {"pos", "vel"}
    assert _adapter(net).value[0].in_features == 5
    obs = {"pos": jnp.ones((B, 3)), "vel": jnp.zeros((B, 2))}
    state = net.initialize_state(B)
    out = _call(net, state, obs)
    assert out.output.actions.shape == (B, ACTIONS)

    unnormalised = factories.make_mlp_actor_critic(
        sizes, ACTIONS, [8], [8], nnx.Rngs(0), normalize_obs=False
    )
    assert isinstance(unnormalised, Sequential) and isinstance(unnormalised[0], Flattener)


class AsymmetricEnv:
    """Playground's asymmetric observation: ``state`` for the policy, ``privileged_state``."""

    observation_size: ClassVar[dict[str, tuple[int, ...]]] = {
        "state": (3,),
        "privileged_state": (5,),
    }
    action_size = ACTIONS


def test_the_preset_actor_reads_state_and_the_critic_privileged_state_alone():
    net = factories.make_default_network(AsymmetricEnv(), nnx.Rngs(0), hidden_sizes=[8])
    net.eval()
    assert _adapter(net).action[2].in_features == 3 and _adapter(net).value[2].in_features == 5
    state = jax.random.normal(jax.random.key(1), (B, 3))
    privileged = jax.random.normal(jax.random.key(2), (B, 5))

    def output(state: jax.Array, privileged: jax.Array) -> PPONetworkOutput:
        obs = {"state": state, "privileged_state": privileged}
        return _call(net, net.initialize_state(B), obs).output

    base = output(state, privileged)
    other_privileged, other_state = output(state, 2 * privileged), output(2 * state, privileged)
    np.testing.assert_array_equal(base.actions, other_privileged.actions)
    np.testing.assert_array_equal(base.value_estimates, other_state.value_estimates)
    assert not np.array_equal(base.actions, other_state.actions)
    assert not np.array_equal(base.value_estimates, other_privileged.value_estimates)


@pytest.mark.parametrize(
    "factory", [factories.make_mlp_actor_critic, factories.make_discrete_mlp_actor_critic]
)
@pytest.mark.parametrize(("given", "other"), [("actor", "critic"), ("critic", "actor")])
def test_the_side_given_no_obs_keys_reads_every_entry_flattened(
    factory: Callable[..., StatefulModule], given: str, other: str
):
    keys = {f"{given}_obs_keys": ("pos",)}
    net = factory({"pos": 3, "vel": 2}, ACTIONS, [8], [8], nnx.Rngs(0), **keys)
    sides = {"actor": _adapter(net).action, "critic": _adapter(net).value}
    assert sides[given][2].in_features == 3  # after its Filter and Flattener
    assert isinstance(sides[other][0], Flattener) and sides[other][1].in_features == 5
    obs = {"pos": jnp.ones((B, 3)), "vel": jnp.zeros((B, 2))}
    out = _call(net, net.initialize_state(B), obs)
    assert out.output.value_estimates.shape == (B,)


@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        ({"actor_obs_keys": ("pos", "acc")}, ValueError, r"actor_obs_keys names \['acc'\]"),
        ({"critic_obs_keys": "pos"}, TypeError, "critic_obs_keys must be a non-empty sequence"),
    ],
)
def test_bad_obs_keys_are_named(keys: dict[str, Any], error: type, match: str):
    with pytest.raises(error, match=match):
        factories.make_mlp_actor_critic(
            {"pos": 3, "vel": 2}, ACTIONS, [8], [8], nnx.Rngs(0), **keys
        )
    with pytest.raises(ValueError, match="needs a dict obs_size"):
        factories.make_mlp_actor_critic(OBS, ACTIONS, [8], [8], nnx.Rngs(0), actor_obs_keys=("a",))


def test_discrete_actor_critic_samples_class_indices():
    net = factories.make_discrete_mlp_actor_critic(OBS, 4, [8], [8], nnx.Rngs(0))
    sampler = _adapter(net).action[-1]
    assert isinstance(sampler, CategoricalSampler)
    assert _adapter(net).action[-2].out_features == 4
    state = net.initialize_state(B)
    out = _call(net, state, jnp.ones((B, OBS)))
    assert out.output.actions.shape == (B,)
    assert out.output.actions.dtype == jnp.int32
    assert np.all((np.asarray(out.output.actions) >= 0) & (np.asarray(out.output.actions) < 4))
    assert out.output.loglikelihoods.shape == (B,)
    assert np.all(np.asarray(out.output.loglikelihoods) <= 0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"activation": "softmax"}, ValueError, "unknown activation 'softmax'"),
        ({"obs_size": 0}, ValueError, "obs_size must be a positive int"),
        ({"obs_size": {"a": 2, "b": -1}}, ValueError, r"obs_size\['b'\]"),
        ({"action_size": 0}, ValueError, "action_size must be a positive int"),
        ({"actor_hidden_sizes": [8, 0]}, ValueError, "actor_hidden_sizes entry"),
        ({"initializer_scale": 0.0}, ValueError, "initializer_scale must be > 0"),
        ({"entropy_weight": -1.0}, ValueError, "entropy_weight must be >= 0"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, match: str):
    arguments: dict[str, Any] = {
        "obs_size": OBS,
        "action_size": ACTIONS,
        "actor_hidden_sizes": [8],
        "critic_hidden_sizes": [8],
        "rngs": nnx.Rngs(0),
        **kwargs,
    }
    with pytest.raises(error, match=match):
        factories.make_mlp_actor_critic(**arguments)


def test_discrete_needs_two_actions():
    with pytest.raises(ValueError, match="n_actions must be >= 2"):
        factories.make_discrete_mlp_actor_critic(OBS, 1, [8], [8], nnx.Rngs(0))
    with pytest.raises(ValueError, match="make_lstm_actor_critic action_size must be >= 2"):
        factories.make_lstm_actor_critic(OBS, 1, 8, nnx.Rngs(0), discrete=True)


def test_flags_are_bools_not_truths():
    # bool("False") is True: a flag read by its truth built the other network.
    builds = {
        "discrete": lambda flag: factories.make_lstm_actor_critic(
            OBS, 2, 8, nnx.Rngs(0), discrete=flag
        ),
        "normalize_obs": lambda flag: factories.make_mlp_actor_critic(
            OBS, ACTIONS, [8], [8], nnx.Rngs(0), normalize_obs=flag
        ),
        "activation_last_layer": lambda flag: factories.make_mlp_layers(
            [OBS, 8], nnx.Rngs(0), activation_last_layer=flag
        ),
    }
    for name, build in builds.items():
        with pytest.raises(TypeError, match=f"{name} must be True or False, got str"):
            build("False")
        build(np.bool_(False))  # a NumPy bool is one


def test_the_lstm_preset_names_why_it_was_chosen_for_a_dict_observation():
    class DictMemory:
        observation_size: ClassVar[dict[str, int]] = {"cue": 2, "flags": 2}
        action_size = 2
        discrete_actions = True
        requires_memory = True

    with pytest.raises(TypeError, match=r"chosen because env.requires_memory\) reads one flat"):
        factories.make_default_network(DictMemory(), nnx.Rngs(0))


def test_sizes_and_envs_of_the_wrong_kind_are_named():
    pendulum = make("pendulum")
    with pytest.raises(TypeError, match="hidden_sizes must be a sequence of ints"):
        factories.make_default_network(pendulum, nnx.Rngs(0), hidden_sizes=64)  # type: ignore
    with pytest.raises(TypeError, match="actor_hidden_sizes must be a sequence of ints"):
        factories.make_mlp_actor_critic(3, 1, 8, [8], nnx.Rngs(0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"env is the name 'pendulum', .*make\('pendulum'\)"):
        factories.make_default_network("pendulum", nnx.Rngs(0))


def test_the_lstm_preset_takes_one_hidden_size_and_refuses_more():
    memory = make("memory")
    default = factories.make_default_network(memory, nnx.Rngs(0))
    assert default.layers[2].hidden_features == 64  # Normalizer, encoder, LSTM, adapter
    narrow = factories.make_default_network(memory, nnx.Rngs(0), hidden_sizes=[32])
    assert narrow.layers[2].hidden_features == 32
    # [32, 128] built the same network as [32]: the second size was dropped unseen.
    with pytest.raises(ValueError, match=r"has one hidden size, .* hidden_sizes is \[32, 128\]"):
        factories.make_default_network(memory, nnx.Rngs(0), hidden_sizes=[32, 128])
    mlp = factories.make_default_network(make("pendulum"), nnx.Rngs(0))
    assert [layer.out_features for layer in mlp.layers[1].value.layers[:2]] == [64, 64]


class Spaces:
    """An env's declared spaces, and nothing else: what the preset reads."""

    def __init__(self, observation_size: Any, action_size: Any, discrete: Any = False) -> None:
        self.observation_size, self.action_size = observation_size, action_size
        self.discrete_actions = discrete


@pytest.mark.parametrize(
    ("spaces", "obs", "actions"),
    [
        (Spaces((2, 3), 2), jnp.ones((B, 2, 3)), (B, 2)),  # an image-like observation
        (Spaces((), (2,)), jnp.ones((B,)), (B, 2)),  # a scalar; a one-axis action shape
        (
            Spaces({"img": (2, 3), "v": (1,)}, 3, True),
            {"img": jnp.ones((B, 2, 3)), "v": jnp.ones((B, 1))},
            (B,),
        ),
        (
            Spaces({"a": (2, 2), "b": 3}, {"a": (2,), "b": 4}, {"a": False, "b": True}),
            {"a": jnp.ones((B, 2, 2)), "b": jnp.ones((B, 3))},
            {"a": (B, 2), "b": (B,)},
        ),
    ],
)
def test_the_preset_flattens_shaped_observations_and_reads_one_axis_action_shapes(
    spaces: Spaces, obs: Any, actions: Any
):
    net = factories.make_default_network(spaces, nnx.Rngs(0), hidden_sizes=[8])
    out = _call(net, net.initialize_state(B), obs)
    assert jax.tree.map(jnp.shape, out.output.actions) == actions


@pytest.mark.parametrize(
    ("action_size", "match"),
    [
        ((3, (2,)), r"action_size is \(3, \(2,\)\), a tuple of actions"),
        ((3, 2), r"action_size is the shape \(3, 2\); the preset networks sample actions of one"),
    ],
)
def test_the_preset_names_an_action_it_cannot_sample(action_size: Any, match: str):
    with pytest.raises(TypeError, match=match):
        factories.make_default_network(Spaces(OBS, action_size), nnx.Rngs(0))
    with pytest.raises(TypeError, match=match.replace("action_size", r"action_size\['a'\]")):
        factories.make_default_network(Spaces({"a": OBS}, {"a": action_size}), nnx.Rngs(0))


def test_an_agent_whose_action_is_a_dict_of_actions_is_named():
    """The per-agent preset samples one action leaf per agent; a nested dict failed in a
    bare zip over the agents' keys and the action leaves."""
    nested = {"arm": 2, "grip": 2}
    spaces = Spaces({"a0": OBS, "a1": OBS}, {"a0": nested, "a1": dict(nested)})
    with pytest.raises(
        TypeError,
        match=r"action_size\['a0'\] is \{'arm': 2, 'grip': 2\}, a dict of actions; .*each "
        r"agent's action must be one leaf \(an int or \(n,\)\)\. Build the network yourself",
    ):
        factories.make_default_network(spaces, nnx.Rngs(0))


def test_dict_actions_of_one_agent_with_one_reward_are_named_when_the_network_is_built():
    """Per-agent critics need a reward per agent: a single reward failed only in training,
    blaming the network's values."""
    two_agent = make("two_agent")

    class OneReward(type(two_agent)):  # type: ignore[misc]
        def reset(self, key):
            state = super().reset(key)
            return state.replace(reward=sum(state.reward.values()))

    factories.make_default_network(two_agent, nnx.Rngs(0), hidden_sizes=[8])
    with pytest.raises(
        ValueError, match=r"this env returns one reward of shape \(\)\. For one agent"
    ):
        factories.make_default_network(OneReward(), nnx.Rngs(0), hidden_sizes=[8])


class Objectives:
    """One agent, one action, a reward per objective: a dict by ``reward_keys``."""

    observation_size = 2
    action_size = 1

    def __init__(self, discrete: bool = False, requires_memory: bool = False, reward: Any = None):
        self.discrete_actions, self.requires_memory = discrete, requires_memory
        self.reward = {"speed": 0.0, "energy": 0.0} if reward is None else reward

    def _state(self, obs: Any, steps: Any) -> State:
        done, truncated = time_limit(jnp.zeros((), bool), steps, 3)
        reward = jax.tree.map(lambda r: jnp.sum(obs) + r, self.reward)
        return State(obs, reward, done, {}, {"truncated": truncated}, {"steps": steps})

    def reset(self, key: Any) -> State:
        return self._state(jax.random.uniform(key, (2,)), jnp.zeros((), jnp.int32))

    def step(self, state: State, action: Any) -> State:
        push = jnp.reshape(action, (-1,))[:1].astype(jnp.float32)
        return self._state(state.obs + 0.1 * push, state.data["steps"] + 1)


@pytest.mark.parametrize(
    "env",
    [Objectives(), Objectives(discrete=True), Objectives(requires_memory=True)],
    ids=["continuous", "discrete", "lstm"],
)
def test_one_action_and_a_reward_per_objective_get_a_value_per_objective(env: Objectives):
    """The preset's one critic returned one value for a dict reward: training broke the
    contract at its first step, blaming the network's values."""
    if env.discrete_actions:
        env.action_size = 3
    net = factories.make_default_network(env, nnx.Rngs(0), hidden_sizes=[8])
    out = _call(net, net.initialize_state(B), jnp.ones((B, 2)))
    assert jax.tree.map(jnp.shape, out.output.value_estimates) == {
        "energy": (B,),
        "speed": (B,),
    }


def test_the_preset_trains_on_a_reward_per_objective():
    env = Objectives()
    net = factories.make_default_network(env, nnx.Rngs(0), hidden_sizes=[4])
    ppo = PPOConfig(
        n_envs=2,
        rollout_length=3,
        total_steps=12,
        n_minibatches=1,
        n_epochs=1,
        combine_advantages=True,
    )
    config = TrainConfig(ppo=ppo, eval=EvalConfig(n_envs=2, max_episode_length=4))
    result = train_ppo(env, net, config)
    assert {"eval/episode_reward/energy/mean", "eval/episode_reward/speed/mean"} <= set(
        result.eval_history[-1]
    )


@pytest.mark.parametrize(
    "reward",
    # An empty reward breaks the env contract, which training names.
    [{"a": {"x": 0.0}, "b": 0.0}, (0.0, 0.0), {0: 0.0, 1: 0.0}],
    ids=["nested", "tuple", "int-keys"],
)
def test_a_reward_tree_the_preset_critic_cannot_mirror_is_named(reward: Any):
    with pytest.raises(
        ValueError,
        match=r"returns one value per reward leaf for one reward, or for a flat dict of "
        r"rewards by str keys .*this env's reward is the tree PyTreeDef.*Build the network "
        "yourself",
    ):
        factories.make_default_network(Objectives(reward=reward), nnx.Rngs(0))


@pytest.mark.parametrize("keys", ["speed", [], ["a", "a"], [0]])
def test_bad_reward_keys_are_named(keys: Any):
    with pytest.raises(TypeError, match="reward_keys must be a non-empty sequence of distinct"):
        factories.make_mlp_actor_critic(OBS, ACTIONS, [8], [8], nnx.Rngs(0), reward_keys=keys)


@pytest.mark.parametrize(
    "spaces",
    [
        Spaces({"a": {"x": (2,), "y": 3}, "b": (1,)}, 2),
        Spaces({"a": {"x": 2}, "b": 1}, {"a": 1, "b": 1}),
    ],
    ids=["one-action", "per-agent"],
)
def test_a_nested_dict_observation_is_named_by_its_entry(spaces: Spaces):
    """It was "observation_size must be an int, got dict", naming no entry."""
    with pytest.raises(
        TypeError,
        match=r"observation_size\['a'\] is the dict \{'x': .*one observation leaf .* per dict "
        r"entry.*Build the network yourself for nested dict observations",
    ):
        factories.make_default_network(spaces, nnx.Rngs(0))


def test_agents_keyed_by_ints_are_named():
    """Int agent keys failed deep in a container: "Map keys must be strings, got 0"."""
    spaces = Spaces({0: (2,), 1: (2,)}, {0: 1, 1: 1})
    with pytest.raises(
        TypeError,
        match=r"make_default_network: action_size's keys \[0, 1\] are not str; .*Key the env's "
        "observations, actions and rewards by str",
    ):
        factories.make_default_network(spaces, nnx.Rngs(0))
