"""unroll_env, eval_rollout and tree_where against step-by-step NumPy simulations."""

import enum
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from nnx_ppo import ContractError
from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step
from nnx_ppo.algorithms.rollout import (
    _BatchedEnv,
    episode_ended,
    episode_flags,
    eval_rollout,
    record_episode,
    reset_envs,
    tree_where,
    unmapped_state_paths,
    unroll_env,
)
from nnx_ppo.algorithms.types import LoggingLevel, Shared
from nnx_ppo.envs import State, time_limit
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_default_network, make_mlp
from nnx_ppo.networks.sampling_layers import NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import Map

W, V = 0.3, 0.5


def horizons_of(states) -> np.ndarray:
    return np.asarray(states.data["horizon"])


def simulate(start_horizons, fresh_horizons, steps):
    """CountingEnv and ScriptedNetwork, one env at a time, in plain Python."""
    envs = len(start_horizons)
    record = {k: np.zeros((steps, envs)) for k in ("t", "loglik", "value", "reward", "next_value")}
    record |= {k: np.zeros((steps, envs), bool) for k in ("done", "truncated")}
    final = []
    for env in range(envs):
        t, horizon, carry = 0, start_horizons[env], 0.0
        for step in range(steps):
            record["t"][step, env] = t
            record["loglik"][step, env] = W * (carry + t)
            record["value"][step, env] = V * t + carry
            t, carry = t + 1, carry + 1
            done = t >= horizon
            record["reward"][step, env] = t
            record["done"][step, env] = done
            record["truncated"][step, env] = done and horizon % 2 == 0
            # GAE bootstraps from it only where no episode terminated.
            terminated = done and not record["truncated"][step, env]
            record["next_value"][step, env] = 0.0 if terminated else V * t + carry
            if done:
                t, horizon, carry = 0, fresh_horizons[env], 0.0
        final.append((t, horizon, carry))
    return record, np.asarray(final)


@pytest.fixture(scope="module")
def compiled_unroll():
    return jax.jit(unroll_env, static_argnums=(0, 4))


@given(envs=st.sampled_from([1, 3, 5]), seed=st.integers(0, 2**31 - 1))
def test_unroll_matches_simulation(envs, seed, counting_env, scripted_network, compiled_unroll):
    steps = 7
    network = scripted_network(W, V)
    start_key, reset_key = jax.random.split(jax.random.key(seed))
    env_state = reset_envs(counting_env, jax.random.split(start_key, envs))
    fresh_horizons = horizons_of(reset_envs(counting_env, jax.random.split(reset_key, envs)))
    carry, final_state, transitions = compiled_unroll(
        counting_env, env_state, network, network.initialize_state(envs), steps, reset_key
    )
    record, final = simulate(horizons_of(env_state), fresh_horizons, steps)
    output = transitions.network_output
    np.testing.assert_allclose(transitions.obs[..., 0], record["t"])
    np.testing.assert_allclose(output.loglikelihoods, record["loglik"], rtol=1e-6)
    np.testing.assert_allclose(output.value_estimates, record["value"], rtol=1e-6)
    np.testing.assert_allclose(transitions.rewards, record["reward"])
    np.testing.assert_array_equal(transitions.done, record["done"])
    np.testing.assert_array_equal(transitions.truncated, record["truncated"])
    # next_obs is the true final observation, before the reset.
    np.testing.assert_allclose(transitions.next_obs[..., 0], record["t"] + 1)
    np.testing.assert_allclose(transitions.next_value_estimates, record["next_value"], rtol=1e-6)
    np.testing.assert_allclose(final_state.data["t"], final[:, 0])
    np.testing.assert_allclose(final_state.data["horizon"], final[:, 1])
    np.testing.assert_allclose(carry, final[:, 2])


def test_unroll_stacks_time_then_envs(counting_env, scripted_network, compiled_unroll):
    network = scripted_network()
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 3))
    _, _, transitions = compiled_unroll(
        counting_env, env_state, network, network.initialize_state(3), 7, jax.random.key(1)
    )
    assert transitions.obs.shape == (7, 3, 2)
    assert transitions.network_output.actions.shape == (7, 3, 1)
    assert transitions.metrics["env"]["t"].shape == (7, 3)
    assert transitions.done.dtype == jnp.bool_


def test_tree_where_selects_per_env_and_passes_shared_through():
    mask = jnp.array([True, False, True])
    on_true = {"a": jnp.ones((3, 2)), "s": Shared(jnp.full((5,), 7.0)), "b": jnp.ones(3, int)}
    on_false = {"a": jnp.zeros((3, 2)), "s": Shared(jnp.full((5,), 9.0)), "b": jnp.zeros(3, int)}
    picked = tree_where(mask, on_true, on_false)
    np.testing.assert_array_equal(picked["a"], [[1, 1], [0, 0], [1, 1]])
    np.testing.assert_array_equal(picked["b"], [1, 0, 1])
    np.testing.assert_array_equal(picked["s"].value, np.full(5, 9.0))


def test_tree_where_rejects_a_leaf_without_the_env_axis():
    mask = jnp.array([True, False, True])
    with pytest.raises(ContractError, match=r"state\['handle'\]"):
        tree_where(mask, {"handle": jnp.ones(5)}, {"handle": jnp.zeros(5)})


@pytest.mark.parametrize("on_false", [jnp.zeros(2), jnp.zeros(()), jnp.zeros((4, 2))])
def test_tree_where_rejects_an_on_false_leaf_without_the_env_axis(on_false):
    # jnp.where would broadcast the first two over the envs and fail on the third
    # without naming the leaf.
    mask = jnp.array([True, False, True])
    with pytest.raises(ContractError, match=r"on_false(.|\n)*state\['x'\]"):
        tree_where(mask, {"x": jnp.ones((3, 2))}, {"x": on_false})


def test_tree_where_passes_leaves_vmap_left_unmapped_through_by_path():
    mask = jnp.array([True, False, True])
    on_true = {"a": jnp.ones((3, 2)), "model": jnp.full((5,), 7.0)}
    on_false = {"a": jnp.zeros((3, 2)), "model": jnp.full((5,), 9.0)}
    picked = tree_where(mask, on_true, on_false, unmapped={"['model']"})
    np.testing.assert_array_equal(picked["a"], [[1, 1], [0, 0], [1, 1]])
    np.testing.assert_array_equal(picked["model"], np.full(5, 9.0))


def test_unmapped_state_paths_is_empty_when_vmap_batches_every_leaf(counting_env):
    # MJX's Data keeps model-wide fields out of vmap with its own batching rule; the
    # Playground CLI test (tests/cli) covers that case where Playground is installed.
    assert unmapped_state_paths(counting_env) == frozenset()


def test_an_envs_one_env_reset_is_traced_once_across_programs(counting_env):
    # Tracing a simulator's reset takes seconds: each program that steps the env
    # traces its vmapped reset, and the one-env shapes are kept per env.
    traces = []

    class TracedEnv(type(counting_env)):
        def reset(self, key):
            traces.append(key.shape)
            return super().reset(key)

    env = TracedEnv()
    keys = jax.random.split(jax.random.key(0), 3)
    first = jax.jit(lambda k: reset_envs(env, k))(keys)
    assert len(traces) == 2  # the one-env shapes, then the vmapped reset
    second = jax.jit(lambda k: reset_envs(env, k))(keys)
    assert len(traces) == 3  # a new program: its vmapped reset only
    np.testing.assert_array_equal(horizons_of(first), horizons_of(second))


def test_unmapped_state_paths_of_a_traced_reset_match_unmapped_state_paths(counting_env):
    batched = _BatchedEnv(counting_env)
    with pytest.raises(RuntimeError, match="once reset has been traced"):
        _ = batched.unmapped
    jax.eval_shape(batched.reset, jax.random.split(jax.random.key(0), 3))
    assert batched.unmapped == unmapped_state_paths(counting_env)


@pytest.mark.parametrize("key", ["truncated", "truncation"])
def test_episode_flags_read_both_truncation_conventions(key):
    state = State(
        obs=jnp.zeros((3, 1)),
        reward=jnp.zeros(3),
        done=jnp.array([1.0, 0.0, 1.0]),
        metrics={},
        info={key: jnp.array([1.0, 1.0, 0.0])},
    )
    done, truncated = episode_flags(state)
    np.testing.assert_array_equal(done, [True, False, True])
    # Truncation counts only where the episode ended.
    np.testing.assert_array_equal(truncated, [True, False, False])


@pytest.mark.parametrize("max_length", [3, 10])
def test_eval_rollout_returns_and_lifespans(counting_env, scripted_network, max_length):
    key = jax.random.key(4)
    metrics = jax.jit(eval_rollout, static_argnums=(0, 2, 3, 5))(
        counting_env, scripted_network(), 16, max_length, key, (0, 50, 100)
    )
    horizons = horizons_of(reset_envs(counting_env, jax.random.split(key, 16)))
    lifespans = np.minimum(horizons, max_length)
    returns = lifespans * (lifespans + 1) / 2
    for name, values in (("episode_reward", returns), ("lifespan", lifespans)):
        np.testing.assert_allclose(metrics[f"eval/{name}/mean"], values.mean(), rtol=1e-6)
        np.testing.assert_allclose(metrics[f"eval/{name}/std"], values.std(), rtol=1e-5)
        for level in (0, 50, 100):
            expected = np.percentile(values, level)
            np.testing.assert_allclose(metrics[f"eval/{name}/p{level}"], expected, rtol=1e-6)


def test_eval_rollout_averages_env_metrics_over_each_episode(counting_env, scripted_network):
    key = jax.random.key(5)
    metrics = eval_rollout(
        counting_env, scripted_network(), 8, 10, key, logging_level=LoggingLevel.ENV_METRICS
    )
    horizons = horizons_of(reset_envs(counting_env, jax.random.split(key, 8)))
    # metric t after each step is 1..h: its episode average is (h + 1) / 2.
    np.testing.assert_allclose(metrics["eval/env/t/mean"], np.mean((horizons + 1) / 2), rtol=1e-6)


def test_evaluating_and_recording_leave_the_network_alone_and_repeat_with_a_key() -> None:
    """A stochastic policy's carry keys come from ``key``, not the network's own nnx.Rngs."""
    from nnx_ppo import envs
    from nnx_ppo.algorithms.recording import record_activations_rollout
    from nnx_ppo.networks.factories import make_default_network

    env = envs.make("cartpole")
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=[8])  # train mode: sampling

    def snapshot() -> list[np.ndarray]:
        keys_as_data = jax.tree.map(
            lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x,
            nnx.state(network),
        )
        return [np.asarray(leaf) for leaf in jax.tree.leaves(keys_as_data)]

    before = snapshot()
    key = jax.random.key(3)
    returns = [
        float(eval_rollout(env, network, 4, 30, key)["eval/episode_reward/mean"]) for _ in "ab"
    ]
    actions = [record_activations_rollout(env, network, 4, 30, key)[0][""].actions for _ in "ab"]
    assert returns[0] == returns[1]
    np.testing.assert_array_equal(actions[0], actions[1])
    for kept, now in zip(before, snapshot(), strict=True):
        np.testing.assert_array_equal(kept, now)


class DtypeChangingEnv:
    """Resets with a float ``done`` but steps with a bool one: breaks the scan carry."""

    def reset(self, key):
        del key
        return State(jnp.zeros(2), jnp.zeros(()), jnp.zeros(()), {}, {})

    def step(self, state, action):
        del action
        return state.replace(done=jnp.ones((), bool))


def test_env_breaking_the_contract_fails_at_trace_time(scripted_network):
    env = DtypeChangingEnv()
    network = scripted_network()
    env_state = reset_envs(env, jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ContractError, match=r"state\.done"):
        unroll_env(env, env_state, network, network.initialize_state(2), 3, jax.random.key(1))


class Rewired(StatefulModule):
    """The wrapped network with its output passed through ``rewire``."""

    def __init__(self, inner: StatefulModule, rewire) -> None:
        self.inner = inner
        self.rewire = nnx.static(rewire)

    def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
        out = self.inner(state, x, rollout_extras)
        return out.replace(output=self.rewire(out.output))

    def initialize_state(self, batch_size: int):
        return self.inner.initialize_state(batch_size)

    def reset_state(self, state):
        return self.inner.reset_state(state)


def test_network_without_ppo_output_is_named(counting_env, scripted_network):
    network = Rewired(scripted_network(), lambda output: output.actions)
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ContractError, match="not a PPONetworkOutput"):
        unroll_env(counting_env, env_state, network, jnp.zeros(2), 3, jax.random.key(1))


def test_values_must_match_the_reward_tree(counting_env, scripted_network):
    network = Rewired(
        scripted_network(),
        lambda out: out.replace(value_estimates={"a": out.value_estimates}),
    )
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ContractError, match="misshaped value_estimates") as error:
        unroll_env(counting_env, env_state, network, jnp.zeros(2), 3, jax.random.key(1))
    # The leaf is named, as a mismatched done tree names its leaf.
    assert "found:    missing value_estimates; unexpected value_estimates['a']" in str(error.value)


def test_a_joint_loglikelihood_of_a_tree_of_actions_is_taken(counting_env, scripted_network):
    # nnx-ppo 0.3.0 took one (B,) log-likelihood for a dict of actions (dependent leaves).
    class TwoActions(type(counting_env)):
        action_size: ClassVar[dict[str, int]] = {"a": 1, "b": 1}

        def step(self, state, action):
            return super().step(state, action["a"] + action["b"])

    counting_env = TwoActions()
    joint = Rewired(
        scripted_network(), lambda out: out.replace(actions={"a": out.actions, "b": out.actions})
    )
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 2))
    _, _, rollout = unroll_env(
        counting_env, env_state, joint, joint.initialize_state(2), 3, jax.random.key(1)
    )
    assert rollout.network_output.loglikelihoods.shape == (3, 2)
    other_tree = Rewired(
        scripted_network(),
        lambda out: out.replace(
            actions={"a": out.actions, "b": out.actions}, loglikelihoods={"a": out.loglikelihoods}
        ),
    )
    with pytest.raises(ContractError, match=r"or one joint \(B,\) array"):
        unroll_env(
            counting_env, env_state, other_tree, joint.initialize_state(2), 3, jax.random.key(1)
        )


def test_unbatched_env_state_is_named(counting_env, scripted_network):
    network = scripted_network()
    one_state = counting_env.reset(jax.random.key(0))
    with pytest.raises(ContractError, match=r"unroll_env: env_state must be batched") as error:
        unroll_env(
            counting_env, one_state, network, network.initialize_state(2), 3, jax.random.key(1)
        )
    assert error.value.leaf == "env_state.done"


def test_env_states_another_env_made_are_named_before_its_step_runs(counting_env, scripted_network):
    # A training state built with the bare env, then stepped with the env wrapped: the
    # wrapped step read its info key (a KeyError), or the scan named the network's carry.
    network = scripted_network()
    wrapped = ClockEnv(counting_env)
    bare_states = reset_envs(counting_env, jax.random.split(jax.random.key(0), 2))
    with pytest.raises(
        ContractError, match=r"ClockEnv.step \(the env states given to it\)"
    ) as error:
        unroll_env(wrapped, bare_states, network, network.initialize_state(2), 3, jax.random.key(1))
    assert "missing state.info['clock']" in str(error.value)


@pytest.mark.parametrize("length", [0, -1])
def test_rollout_lengths_must_be_positive(counting_env, scripted_network, length):
    network = scripted_network()
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 2))
    carry, key = network.initialize_state(2), jax.random.key(1)
    with pytest.raises(
        ValueError, match=f"unroll_env: unroll_length must be a positive int, got {length}"
    ):
        unroll_env(counting_env, env_state, network, carry, length, key)
    with pytest.raises(
        ValueError, match=f"max_episode_length must be a positive int, got {length}"
    ):
        eval_rollout(counting_env, network, 2, length, key)


class ClockEnv:
    """The counting env with a clock shared by every env: ``info["clock"]`` is ``Shared``.

    ``reset`` starts the clock at 0 and every ``step`` advances it by one: one
    value for all envs, whatever their episodes do.
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.discrete_actions = inner.discrete_actions
        self.observation_size = inner.observation_size
        self.action_size = inner.action_size

    def reset(self, key):
        state = self.inner.reset(key)
        return state.replace(info=state.info | {"clock": Shared(jnp.zeros((), jnp.int32))})

    def step(self, state, action):
        stepped = self.inner.step(state, action)
        clock = Shared(state.info["clock"].value + 1)
        return stepped.replace(info=stepped.info | {"clock": clock})


def test_shared_state_passes_unbatched_through_reset_step_and_unroll(
    counting_env, scripted_network
):
    env, network, envs, steps = ClockEnv(counting_env), scripted_network(W, V), 3, 7
    start_key, reset_key = jax.random.split(jax.random.key(2))
    env_state = reset_envs(env, jax.random.split(start_key, envs))
    assert env_state.info["clock"].value.shape == ()
    carry, final_state, transitions = unroll_env(
        env, env_state, network, network.initialize_state(envs), steps, reset_key
    )
    # One clock for all envs, stepped T times: resets of finished envs keep it.
    assert final_state.info["clock"].value.shape == ()
    assert int(final_state.info["clock"].value) == steps
    # The per-env part is untouched by the shared one.
    fresh_horizons = horizons_of(reset_envs(counting_env, jax.random.split(reset_key, envs)))
    record, final = simulate(horizons_of(env_state), fresh_horizons, steps)
    np.testing.assert_allclose(transitions.rewards, record["reward"])
    np.testing.assert_allclose(final_state.data["t"], final[:, 0])
    np.testing.assert_allclose(carry, final[:, 2])
    # Recording (one env, states stacked over time) keeps the clock's own time axis.
    trajectory, _ = record_episode(env, network, 4, jax.random.key(3))
    np.testing.assert_array_equal(trajectory.info["clock"].value, np.arange(5))
    assert trajectory.data["t"].shape == (5,)


class RemembersItsLastObservation(ClockEnv):
    """Keeps each step's observation on itself: state outside the State."""

    def step(self, state, action):
        stepped = super().step(state, action)
        self.last = stepped.obs
        return stepped


class CountsItsSteps(ClockEnv):
    """Counts its steps in a Python int, starting from a class attribute: once per trace."""

    steps = 0
    size: int | None = None
    ready = False

    def reset(self, key):
        self.size = 3  # set for the first time while traced: a cache, not state
        return super().reset(key)

    def step(self, state, action):
        self.ready = True  # an env readying itself on its first step: not state either
        self.steps += 1
        return super().step(state, action)


@pytest.mark.parametrize(
    ("env_class", "leaf", "said"),
    [
        (RemembersItsLastObservation, "env.last", "stored a traced value on the env object"),
        (CountsItsSteps, "env.steps", "changed env.steps from 0 to 1 on the env object"),
    ],
)
def test_an_env_that_keeps_state_on_itself_is_named(
    env_class, leaf, said, counting_env, scripted_network
):
    env, network = env_class(counting_env), scripted_network(W, V)
    env_state = reset_envs(env, jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ContractError) as caught:
        unroll_env(env, env_state, network, network.initialize_state(2), 2, jax.random.key(1))
    assert caught.value.leaf == leaf
    assert f"{env_class.__name__}.step: {said}" in str(caught.value)


def test_the_values_an_env_holds_are_read_without_walking_into_them(counting_env):
    """An IntFlag member is a plain value with attributes of its own, and its class holds
    every other member: MJX's options hold one, and walking into it read 890,000 values."""
    from nnx_ppo.contract.env_checks import plain_values

    flags = enum.IntFlag("Flags", [f"F{i}" for i in range(16)])
    env = CountsItsSteps(counting_env)
    env.options = {"disabled": flags.F3, "scale": np.float32(2.0), "table": [1, 2.5]}
    env.np, env.helper = np, np.mean  # code is read as one value, never walked
    held = plain_values(env)
    assert held["env.options['disabled']"] is flags.F3
    assert held["env.options['table'][1]"] == 2.5 and held["env.steps"] == 0
    assert len(held) < 30, sorted(held)


class KeyedClockEnv(ClockEnv):
    """Starts its shared clock at a value drawn from each env's reset key: not shared."""

    def reset(self, key):
        state = self.inner.reset(key)
        start = jax.random.randint(key, (), 0, 10)
        return state.replace(info=state.info | {"clock": Shared(start)})


def test_a_shared_value_that_depends_on_the_env_is_named(counting_env):
    with pytest.raises(ContractError) as caught:
        reset_envs(KeyedClockEnv(counting_env), jax.random.split(jax.random.key(0), 3))
    assert caught.value.leaf == "state.info['clock']"
    assert "a Shared value of the state env.reset returns differs between envs" in str(caught.value)


def test_an_episode_with_per_agent_ends_ends_when_the_last_agent_is_done():
    done = {
        "agent_0": jnp.array([True, True, False, False]),
        "agent_1": jnp.array([True, False, True, False]),
    }
    np.testing.assert_array_equal(episode_ended(done), [True, False, False, False])
    np.testing.assert_array_equal(episode_ended(done["agent_1"]), done["agent_1"])


class OneTimeLimitForTwoAgents:
    """Agent ``a`` terminates after 2 steps; the env's one ``info["truncated"]`` flag
    cuts the episode, and ``b`` with it, after 4."""

    def reset(self, key):
        del key
        zero = jnp.zeros(())
        return State(
            {"a": jnp.zeros(1), "b": jnp.zeros(1)}, {"a": zero, "b": zero}, {"a": zero, "b": zero},
            {}, {"truncated": jnp.zeros((), bool)}, {"t": jnp.zeros((), jnp.int32)},
        )  # fmt: skip

    def step(self, state, action):
        del action
        t = state.data["t"] + 1
        done = {"a": (t >= 2).astype(jnp.float32), "b": (t >= 4).astype(jnp.float32)}
        reward = {"a": jnp.ones(()), "b": jnp.ones(())}
        return state.replace(reward=reward, done=done, info={"truncated": t >= 4}, data={"t": t})


def test_one_time_limit_flag_does_not_cut_short_an_agent_that_terminated_before():
    rngs = nnx.Rngs(0)

    def actor() -> Sequential:
        return Sequential(
            [
                make_mlp([1, 4, 2], rngs, nnx.tanh, False),
                NormalTanhSampler(rngs, entropy_weight=0.0),
            ]
        )

    network = PPOAdapter(
        action=Map({"a": actor(), "b": actor()}),
        value=Map({k: make_mlp([1, 4, 1], rngs, nnx.tanh, False) for k in ("a", "b")}),
    )
    env = OneTimeLimitForTwoAgents()
    env_state = reset_envs(env, jax.random.split(jax.random.key(0), 2))
    _, _, transitions = unroll_env(
        env, env_state, network, network.initialize_state(2), 4, jax.random.key(1)
    )
    # a's episode ended by termination at step 2 and its done stays set: the limit at
    # step 4 cuts b's short, not a's, so GAE bootstraps b there and not a.
    np.testing.assert_array_equal(transitions.done["a"][:, 0], [False, True, True, True])
    np.testing.assert_array_equal(transitions.truncated["a"][:, 0], [False] * 4)
    np.testing.assert_array_equal(transitions.truncated["b"][:, 0], [False, False, False, True])
    np.testing.assert_array_equal(transitions.next_value_estimates["a"][1:, 0], np.zeros(3))


class BFloat16Rewards:
    """Pays a bfloat16 reward of 1 a step, and counts the step in a uint8 metric; its
    episodes last 300 steps."""

    observation_size: ClassVar[int] = 1
    action_size: ClassVar[int] = 1
    discrete_actions: ClassVar[bool] = False

    def reset(self, rng: jax.Array) -> State:
        return self._state(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.bfloat16))

    def step(self, state: State, action: jax.Array) -> State:
        return self._state(state.data["steps"] + 1, jnp.ones((), jnp.bfloat16))

    def _state(self, steps: jax.Array, reward: jax.Array) -> State:
        done, truncated = time_limit(jnp.zeros((), bool), steps, 300)
        return State(
            obs=jnp.zeros(1),
            reward=reward,
            done=done,
            metrics={"hit": jnp.ones((), jnp.uint8)},
            info={"truncated": truncated},
            data={"steps": steps},
        )


def test_returns_of_bfloat16_rewards_and_sums_of_uint8_metrics_are_kept_in_float32():
    # In bfloat16, 256 + 1 rounds back to 256: the logged returns stopped there; the
    # uint8 metric's episode sum wrapped at 256 (its mean was 44 / 300).
    env = BFloat16Rewards()
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=[4])
    config = PPOConfig(
        n_envs=2,
        rollout_length=301,
        n_minibatches=1,
        n_epochs=1,
        logging_level=LoggingLevel.ROLLOUT_STATS,
    )
    _, metrics = ppo_step(env, new_training_state(env, network, 2, 0), config)
    assert metrics["rollout_batch/episodes_completed"] == 2
    assert metrics["rollout_batch/episode_reward/mean"] == 300
    evaluated = eval_rollout(
        env, network, 2, 300, jax.random.key(0), logging_level=LoggingLevel.ENV_METRICS
    )
    assert float(evaluated["eval/episode_reward/mean"]) == 300
    assert float(evaluated["eval/env/hit/mean"]) == 1
