"""EpisodeWrapper and RewardScalingWrapper."""

import copy
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from nnx_ppo import ContractError, envs
from nnx_ppo.contract.env_checks import check_env_state, check_env_unbatched
from nnx_ppo.envs.state import episode_flags
from nnx_ppo.wrappers import EpisodeWrapper, RewardScalingWrapper, Wrapper
from nnx_ppo.wrappers.episode_wrapper import EpisodeWrapper as EpisodeWrapperByPath
from nnx_ppo.wrappers.reward_scaling_wrapper import RewardScalingWrapper as ScalingByPath


def rollout(env: Any, key: jax.Array, actions: Any) -> tuple[Any, Any]:
    """The reset state and the stacked states of stepping ``actions`` without resets."""

    def one_step(state: Any, action: Any) -> tuple[Any, Any]:
        state = env.step(state, action)
        return state, state

    start = env.reset(key)
    return start, jax.lax.scan(one_step, start, actions)[1]


def test_module_paths_of_0_3_0_are_kept() -> None:
    assert EpisodeWrapperByPath is EpisodeWrapper
    assert ScalingByPath is RewardScalingWrapper


def test_episode_wrapper_reset_is_the_wrapped_reset_with_a_zero_counter() -> None:
    env = envs.CartPole()
    wrapped = EpisodeWrapper(env, max_len=10)
    key = jax.random.key(4)
    state, raw = wrapped.reset(key), env.reset(key)
    np.testing.assert_array_equal(state.obs, raw.obs)
    assert state.info["step_counter"] == 0 and state.info["step_counter"].dtype == jnp.int32
    assert state.info["truncated"].dtype == jnp.bool_ and not state.info["truncated"]


def test_episode_wrapper_truncates_at_max_len_and_keeps_counting_steps() -> None:
    wrapped = EpisodeWrapper(envs.Pendulum(), max_len=5)
    _, states = jax.jit(rollout, static_argnums=0)(wrapped, jax.random.key(0), jnp.zeros((7, 1)))
    assert np.asarray(states.info["step_counter"]).tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert np.asarray(states.done)[:5].tolist() == [0, 0, 0, 0, 1]
    assert np.asarray(states.info["truncated"])[:5].tolist() == [False] * 4 + [True]
    assert states.done.dtype == jnp.float32  # the wrapped env's dtype


def test_episode_wrapper_termination_on_the_last_step_is_not_truncation() -> None:
    wrapped = EpisodeWrapper(envs.CartPole(), max_len=3)
    state = wrapped.reset(jax.random.key(0))
    state = state.replace(
        obs=jnp.asarray([0.0, 0.0, 0.2, 2.0]),  # past 12 degrees after one step
        info={**state.info, "step_counter": jnp.asarray(2, jnp.int32)},
    )
    last = wrapped.step(state, jnp.asarray(1))
    assert last.done == 1.0 and not last.info["truncated"]


def test_episode_wrapper_keeps_the_wrapped_envs_own_truncation() -> None:
    wrapped = EpisodeWrapper(envs.Pendulum(max_steps=2), max_len=10)
    _, states = rollout(wrapped, jax.random.key(0), jnp.zeros((2, 1)))
    assert np.asarray(states.info["truncated"]).tolist() == [False, True]
    assert np.asarray(states.done).tolist() == [0.0, 1.0]


class PerAgentEnds:
    """Two agents with a ``done`` each and one ``info["truncated"]`` flag for both."""

    def reset(self, key: jax.Array) -> envs.State:
        del key
        zero = jnp.zeros(())
        return envs.State(
            jnp.zeros(1), {"a": zero, "b": zero}, {"a": zero, "b": zero}, {},
            {"truncated": jnp.zeros((), bool)}, {"t": jnp.zeros((), jnp.int32)},
        )  # fmt: skip

    def step(self, state: envs.State, action: jax.Array) -> envs.State:
        t = state.data["t"] + 1
        done = {"a": (t >= 2).astype(jnp.float32), "b": jnp.zeros(())}
        return state.replace(done=done, data={"t": t})


def test_episode_wrapper_spreads_one_truncation_flag_over_per_agent_ends() -> None:
    wrapped = EpisodeWrapper(PerAgentEnds(), max_len=3)
    _, states = rollout(wrapped, jax.random.key(0), jnp.zeros((3, 1)))
    assert np.asarray(states.done["a"]).tolist() == [0.0, 1.0, 1.0]  # terminated at 2
    assert np.asarray(states.done["b"]).tolist() == [0.0, 0.0, 1.0]  # truncated at 3
    assert np.asarray(states.info["truncated"]["a"]).tolist() == [False, False, False]
    assert np.asarray(states.info["truncated"]["b"]).tolist() == [False, False, True]


class OwnTimeLimit(PerAgentEnds):
    """Cuts the episode after 3 steps with one flag of its own; ``a`` terminated at 2."""

    def step(self, state: envs.State, action: jax.Array) -> envs.State:
        stepped = super().step(state, action)
        cut = stepped.data["t"] >= 3
        done = {"a": stepped.done["a"], "b": cut.astype(jnp.float32)}
        return stepped.replace(done=done, info={"truncated": cut})


def test_episode_wrapper_reads_one_flag_as_cutting_short_only_the_agents_still_running() -> None:
    wrapped = EpisodeWrapper(OwnTimeLimit(), max_len=10)
    _, states = rollout(wrapped, jax.random.key(0), jnp.zeros((3, 1)))
    assert np.asarray(states.done["a"]).tolist() == [0.0, 1.0, 1.0]
    assert np.asarray(states.info["truncated"]["a"]).tolist() == [False, False, False]
    assert np.asarray(states.info["truncated"]["b"]).tolist() == [False, False, True]


class FlagsWithoutEnding(PerAgentEnds):
    """Sets its truncation flag on every step but never ends an episode (a flag that,
    by the contract, only counts where ``done`` holds); Playground names it ``truncation``."""

    def reset(self, key: jax.Array) -> envs.State:
        state = super().reset(key)
        return state.replace(info={**state.info, "truncation": jnp.zeros(())})

    def step(self, state: envs.State, action: jax.Array) -> envs.State:
        never = {"a": jnp.zeros(()), "b": jnp.zeros(())}
        info = {"truncated": jnp.ones((), bool), "truncation": jnp.ones(())}
        return super().step(state, action).replace(done=never, info=info)


def test_episode_wrapper_reads_the_wrapped_flags_only_where_done_holds() -> None:
    wrapped = EpisodeWrapper(FlagsWithoutEnding(), max_len=3)
    _, states = rollout(wrapped, jax.random.key(0), jnp.zeros((3, 1)))
    for agent in ("a", "b"):
        assert np.asarray(states.done[agent]).tolist() == [0.0, 0.0, 1.0]  # the limit alone
        assert np.asarray(states.info["truncated"][agent]).tolist() == [False, False, True]


def test_a_truncation_tree_unlike_done_is_named() -> None:
    env = envs.Pendulum(max_steps=2)
    state = env.reset(jax.random.key(0))
    per_agent = {"a": jnp.zeros((), bool), "b": jnp.zeros((), bool)}
    with pytest.raises(ContractError) as error:  # a scalar done beside per-agent flags
        episode_flags(state.replace(info={"truncated": per_agent}))
    assert 'info["truncated"] is neither one flag nor a tree shaped like done' in str(error.value)


def test_episode_wrapper_randomises_the_counter_only_when_asked() -> None:
    env = envs.CartPole()
    keys = jax.random.split(jax.random.key(0), 64)
    plain = jax.vmap(EpisodeWrapper(env, max_len=20).reset)(keys)
    assert (np.asarray(plain.info["step_counter"]) == 0).all()
    random = jax.vmap(EpisodeWrapper(env, max_len=20, random_initial_step=True).reset)(keys)
    counters = np.asarray(random.info["step_counter"])
    assert counters.min() >= 0 and counters.max() < 10 and len(set(counters.tolist())) > 1


@pytest.mark.parametrize("name", ["cartpole", "two_agent"])
def test_wrapped_envs_keep_the_env_contract(name: str) -> None:
    env = RewardScalingWrapper(EpisodeWrapper(envs.make(name), max_len=4), 0.5)
    reference = check_env_unbatched(env)
    action = jax.tree.map(
        lambda n: jnp.zeros((), jnp.int32) if env.discrete_actions else jnp.zeros(n),
        env.action_size,
    )
    stepped = jax.eval_shape(env.step, env.reset(jax.random.key(0)), action)
    check_env_state(stepped, where="step", reference=reference)


def test_wrappers_forward_the_wrapped_envs_attributes() -> None:
    env = envs.MemoryTask(n_cues=3)
    wrapped = RewardScalingWrapper(EpisodeWrapper(env, max_len=9), 2.0)
    assert wrapped.observation_size == 5 and wrapped.action_size == 3
    assert wrapped.discrete_actions and wrapped.delay == 4 and wrapped.max_len == 9
    assert EpisodeWrapper(envs.CartPole(), 5).dt == 0.02
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = wrapped.no_such_attribute
    assert copy.deepcopy(wrapped).max_len == 9


NOT_AN_ENV: Any = object()
A_FLOAT: Any = 2.5
A_STRING: Any = "2"


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: EpisodeWrapper(envs.CartPole(), max_len=0), ValueError, "max_len"),
        (lambda: EpisodeWrapper(envs.CartPole(), max_len=A_FLOAT), TypeError, "max_len"),
        (lambda: EpisodeWrapper(NOT_AN_ENV, max_len=2), TypeError, "no reset"),
        (
            lambda: EpisodeWrapper(envs.CartPole, max_len=2),
            TypeError,
            r"EpisodeWrapper: env is the class CartPole, not an environment; pass an instance",
        ),
        (lambda: RewardScalingWrapper(envs.CartPole(), A_STRING), TypeError, "reward_scale"),
        (lambda: RewardScalingWrapper(envs.CartPole(), float("nan")), TypeError, "finite"),
        (
            lambda: EpisodeWrapper(envs.CartPole(), 5, random_initial_step=A_STRING),
            TypeError,
            "random_initial_step must be True or False, got str",
        ),
        (
            lambda: EpisodeWrapper(EpisodeWrapper(envs.CartPole(), 8), 100),
            ValueError,
            r"already has a time limit \(an EpisodeWrapper with max_len=8 inside\)",
        ),
        (
            lambda: EpisodeWrapper(
                RewardScalingWrapper(EpisodeWrapper(envs.CartPole(), 8), 2.0), max_len=9
            ),
            ValueError,
            "already has a time limit",
        ),
    ],
)
def test_bad_wrapper_arguments_are_named(make: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_wrapper_arguments_in_0_3_0_s_forms_are_taken() -> None:
    assert EpisodeWrapper(envs.CartPole(), 1000.0).max_len == 1000  # type: ignore[arg-type]
    assert EpisodeWrapper(envs.CartPole(), jnp.int32(7)).max_len == 7  # type: ignore[arg-type]
    assert RewardScalingWrapper(envs.CartPole(), jnp.asarray(0.5)).reward_scale == 0.5
    assert RewardScalingWrapper(envs.CartPole(), np.array(0.5)).reward_scale == 0.5


@given(scale=st.floats(-10, 10, allow_nan=False))
def test_reward_scaling_scales_every_reward_leaf(scale: float) -> None:
    env = envs.TwoAgentReach()
    wrapped = RewardScalingWrapper(env, scale)
    key = jax.random.key(2)
    action = {"agent_0": jnp.ones(2), "agent_1": -jnp.ones(2)}
    raw = env.step(env.reset(key), action)
    scaled = wrapped.step(wrapped.reset(key), action)
    assert set(scaled.reward) == {"agent_0", "agent_1"}
    for agent, reward in raw.reward.items():
        expected = np.float32(scale) * np.float32(reward)  # float32, as the env computes
        np.testing.assert_allclose(scaled.reward[agent], expected, rtol=1e-6, atol=1e-37)
    np.testing.assert_array_equal(scaled.obs["agent_0"], raw.obs["agent_0"])


def test_reward_scaling_of_a_scalar_reward() -> None:
    wrapped = RewardScalingWrapper(envs.CartPole(), 0.25)
    state = wrapped.step(wrapped.reset(jax.random.key(0)), jnp.asarray(0))
    assert state.reward == 0.25 and state.reward.shape == ()


def test_a_random_initial_step_draws_from_a_key_split_off_the_envs():
    env = envs.CartPole()
    key = jax.random.key(3)
    wrapped = EpisodeWrapper(env, 100, random_initial_step=True).reset(key)
    env_key, counter_key = jax.random.split(key)
    np.testing.assert_array_equal(wrapped.obs, env.reset(env_key).obs)
    assert int(wrapped.info["step_counter"]) == int(jax.random.randint(counter_key, (), 0, 50))


def test_reward_scaling_scales_the_reward_reset_returns_too():
    class RewardOnReset(envs.CartPole):
        def reset(self, key: jax.Array) -> Any:
            state = super().reset(key)
            return state.replace(reward=jnp.ones((), jnp.float32))

    state = RewardScalingWrapper(RewardOnReset(), 2.5).reset(jax.random.key(0))
    assert float(state.reward) == 2.5


class _TruncationOfTwo(envs.CartPole):
    """A wrapped env whose own truncation flag is not shaped like its done."""

    def step(self, state: Any, action: Any) -> Any:
        stepped = super().step(state, action)
        return stepped.replace(info={**stepped.info, "truncated": jnp.zeros((2,), bool)})


def test_a_wrapped_envs_malformed_truncation_is_named_as_its_own() -> None:
    env = EpisodeWrapper(_TruncationOfTwo(), 4)
    state = env.reset(jax.random.key(0))
    with pytest.raises(ContractError, match=r"_TruncationOfTwo\.step in EpisodeWrapper: "):
        jax.eval_shape(env.step, state, jnp.asarray(0))


def test_a_missing_attribute_names_the_wrapper_and_the_env_it_wraps() -> None:
    env = RewardScalingWrapper(EpisodeWrapper(envs.make("cartpole"), 3), 0.5)
    assert env.max_steps == 500  # forwarded through both
    with pytest.raises(
        AttributeError,
        match=r"RewardScalingWrapper \(wrapping EpisodeWrapper\) has no attribute 'nope'",
    ):
        _ = env.nope
    assert not hasattr(env, "render")


class _ModuleEnv(nnx.Module, envs.CartPole):
    """An env that is an nnx.Module: its class defines __deepcopy__."""


class _Gripper(Wrapper):
    @property
    def action_size(self) -> Any:
        return {"move": self.env.action_size, "grip": self.grip_size}  # never set


class _Misspelt(envs.CartPole):
    @property
    def observation_size(self) -> int:
        return self.n_observations  # never set


def test_a_wrapper_is_copied_whole_and_its_own_attribute_errors_are_not_masked() -> None:
    # copy.deepcopy found the env's __deepcopy__ through the wrapper and copied the
    # env alone: the time limit and the reward scale were gone.
    for env in (envs.CartPole(), _ModuleEnv()):
        copied = copy.deepcopy(RewardScalingWrapper(EpisodeWrapper(env, 10), 2.0))
        assert isinstance(copied, RewardScalingWrapper) and copied.reward_scale == 2.0
        assert isinstance(copied.env, EpisodeWrapper) and copied.env.max_len == 10
    # A wrapper's property that raised AttributeError gave the env's action_size (1).
    with pytest.raises(AttributeError, match="has no attribute 'grip_size'"):
        _ = _Gripper(envs.Pendulum()).action_size
    # The env's own error is the cause of the wrapper's, not dropped.
    with pytest.raises(AttributeError, match="has no attribute 'observation_size'") as caught:
        _ = EpisodeWrapper(_Misspelt(), 5).observation_size
    assert "n_observations" in str(caught.value.__cause__)


def test_random_initial_step_takes_a_numpy_bool() -> None:
    assert EpisodeWrapper(envs.CartPole(), 5, random_initial_step=np.True_).random_initial_step
