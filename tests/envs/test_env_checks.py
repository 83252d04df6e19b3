"""The environment contract check: each violation raises ContractError naming the field."""

from types import SimpleNamespace
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import nnx_ppo
from nnx_ppo import ContractError, envs
from nnx_ppo.contract.env_checks import (
    check_action_tree,
    check_env_reset_key,
    check_env_state,
    check_env_unbatched,
    discrete_action_flags,
    is_size,
    size_shape,
)
from nnx_ppo.envs import CartPole, State
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.testing.env_properties import random_action


def scalar() -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((), jnp.float32)


def make_state(**changes: Any) -> State:
    """A valid one-env state of abstract leaves, with ``changes`` applied."""
    fields: dict[str, Any] = {
        "obs": {"position": jax.ShapeDtypeStruct((3,), jnp.float32)},
        "reward": scalar(),
        "done": scalar(),
        "metrics": {},
        "info": {"truncated": jax.ShapeDtypeStruct((), jnp.bool_)},
    }
    return State(**{**fields, **changes})


class BatchedCartPole:
    """A batched env passed by mistake: reset vmaps over keys split from the one it gets."""

    def reset(self, key: jax.Array) -> State:
        return jax.vmap(envs.CartPole().reset)(jax.random.split(key, 8))


class VmappedCartPole:
    """A batched env that expects a batch of keys, like Brax's VmapWrapper."""

    def reset(self, keys: jax.Array) -> State:
        return jax.vmap(envs.CartPole().reset)(keys)


def test_valid_states_pass() -> None:
    check_env_state(make_state(), where="Env.reset")
    check_env_state(make_state(), where="Env.step", reference=make_state())
    per_agent = {"agent_0": scalar(), "agent_1": scalar()}
    check_env_state(make_state(reward=per_agent, done=per_agent), where="Env.step")


def test_an_integer_reward_is_named() -> None:
    counts = {"agent_0": scalar(), "agent_1": jax.ShapeDtypeStruct((), jnp.int32)}
    with pytest.raises(ContractError) as error:
        check_env_state(make_state(reward=counts, done=scalar()), where="Env.reset")
    assert "Env.reset: state.reward['agent_1'] is not a float." in str(error.value)


def test_a_batched_env_is_caught_at_reset() -> None:
    with pytest.raises(ContractError) as error:
        check_env_unbatched(BatchedCartPole())
    message = str(error.value)
    assert "BatchedCartPole.reset: state.done has shape (8,)" in message
    assert "pass an unbatched env" in message
    assert "found:    shape (8,) float32" in message


def test_an_env_that_wants_a_batch_of_keys_is_caught_at_reset() -> None:
    with pytest.raises(ContractError, match=r"VmappedCartPole.reset: env.reset failed when given"):
        check_env_unbatched(VmappedCartPole())


def test_a_reward_with_a_stray_axis_is_named() -> None:
    with pytest.raises(ContractError) as error:
        check_env_state(make_state(reward=jax.ShapeDtypeStruct((1,), jnp.float32)), where="E.step")
    message = str(error.value)
    assert "E.step: state.reward has shape (1,), not a scalar" in message
    assert "expected: shape ()" in message


def test_a_per_agent_reward_leaf_with_a_stray_axis_is_named() -> None:
    reward = {"agent_0": scalar(), "agent_1": jax.ShapeDtypeStruct((1,), jnp.float32)}
    with pytest.raises(ContractError, match=r"state.reward\['agent_1'\] has shape \(1,\)"):
        check_env_state(make_state(reward=reward), where="E.step")


def test_done_must_be_a_scalar_or_follow_the_reward_tree() -> None:
    with pytest.raises(ContractError, match=r"state.done has shape \(1,\)"):
        check_env_state(make_state(done=jax.ShapeDtypeStruct((1,), jnp.float32)), where="E")
    reward = {"agent_0": scalar(), "agent_1": scalar()}
    with pytest.raises(ContractError, match=r"state.done is neither a scalar nor") as error:
        check_env_state(make_state(reward=reward, done={"agent_0": scalar()}), where="E")
    assert "missing state.done['agent_1']" in str(error.value)


def test_a_truncation_flag_must_follow_done_not_the_reward() -> None:
    reward = {"agent_0": scalar(), "agent_1": scalar()}
    flags = {"agent_0": jax.ShapeDtypeStruct((), bool), "agent_1": jax.ShapeDtypeStruct((), bool)}
    check_env_state(make_state(reward=reward, done=reward, info={"truncated": flags}), where="E")
    with pytest.raises(ContractError) as error:  # per-agent flags beside one done
        check_env_state(make_state(reward=reward, info={"truncated": flags}), where="E.step")
    assert error.value.leaf == "state.info['truncated']"
    assert "is neither a scalar nor a pytree with the tree of state.done" in str(error.value)
    # MuJoCo Playground's name for the flag, checked the same way (a stray axis broadcast
    # the rollout's flags to (T, B, B)).
    stray_axis = {"truncation": jax.ShapeDtypeStruct((1,), jnp.float32)}
    with pytest.raises(ContractError, match=r"E.step: state.info\['truncation'\] has shape \(1,\)"):
        check_env_state(make_state(info=stray_axis), where="E.step")


def test_obs_structure_changing_between_reset_and_step_is_named() -> None:
    stepped = make_state(obs={"pos": jax.ShapeDtypeStruct((3,), jnp.float32)})
    with pytest.raises(ContractError) as error:
        check_env_state(stepped, where="E.step", reference=make_state())
    message = str(error.value)
    assert "state.obs does not have the tree structure env.reset returned" in message
    assert "missing state.obs['position']; unexpected state.obs['pos']" in message


def test_obs_leaf_shape_changing_between_reset_and_step_is_named() -> None:
    stepped = make_state(obs={"position": jax.ShapeDtypeStruct((4,), jnp.float32)})
    with pytest.raises(ContractError) as error:
        check_env_state(stepped, where="E.step", reference=make_state())
    message = str(error.value)
    assert "state.obs['position'] changed shape or dtype" in message
    assert "expected: shape (3,) float32" in message and "found:    shape (4,) float32" in message


def test_a_numpy_float64_leaf_counts_as_the_dtype_jax_will_hold_it_in() -> None:
    import numpy as np

    class NumpyReward(envs.CartPole):
        """Its reset returns a NumPy float64 reward, which JAX holds as float32 (no x64)."""

        def reset(self, key: jax.Array) -> State:
            return super().reset(key).replace(reward=np.float64(0.0))

    nnx_ppo.testing.check_env(NumpyReward())  # reset was reported as differing from itself
    with jax.enable_x64(True):
        check_env_state(
            make_state(reward=np.float64(0.0)),
            where="E.reset",
            reference=make_state(reward=jax.ShapeDtypeStruct((), jnp.float64)),
        )
        with pytest.raises(ContractError, match=r"expected: shape \(\) float32"):
            check_env_state(
                make_state(reward=np.float64(0.0)), where="E.step", reference=make_state()
            )


def test_info_and_other_fields_changing_between_reset_and_step_are_named() -> None:
    stepped = make_state(info={"truncated": jax.ShapeDtypeStruct((), jnp.float32)})
    with pytest.raises(ContractError, match=r"state.info\['truncated'\] changed shape or dtype"):
        check_env_state(stepped, where="E.step", reference=make_state())
    reference = make_state().replace(data={"steps": scalar()})
    with pytest.raises(ContractError, match=r"missing state.data\['steps'\]"):
        check_env_state(make_state(), where="E.step", reference=reference)


def test_non_array_obs_and_missing_fields_are_named() -> None:
    with pytest.raises(ContractError, match=r"state.obs\['name'\] is not an array"):
        check_env_state(make_state(obs={"name": "cartpole"}), where="E")
    with pytest.raises(ContractError, match=r"the env state has no field 'metrics'"):
        check_env_state(SimpleNamespace(obs=jnp.zeros(3), reward=jnp.zeros(()), done=()), where="E")
    with pytest.raises(ContractError, match=r"state.info is a list, not a dict"):
        check_env_state(make_state(info=[]), where="E")
    as_dict = {"obs": jnp.zeros(3), "reward": jnp.zeros(()), "done": jnp.zeros(())}
    with pytest.raises(ContractError, match=r"the env state is a dict, whose entries are not"):
        check_env_state(as_dict, where="E")
    # A dataclass of the user's own, as the dict's message suggests, must be a pytree: JAX
    # named only the library's traced function.
    unregistered = SimpleNamespace(**as_dict, metrics={}, info={})
    with pytest.raises(
        ContractError, match=r"a SimpleNamespace, is not a pytree.*register_dataclass"
    ):
        check_env_state(unregistered, where="E")


def test_reset_envs_wants_one_key_per_env() -> None:
    from nnx_ppo.algorithms.rollout import reset_envs

    env = CartPole()
    one, raw = jax.random.key(0), jax.random.PRNGKey(0)
    for keys in (one, raw, jax.random.split(one, (2, 3))):
        with pytest.raises(ContractError, match=r"reset_envs: keys must hold one PRNG key per env"):
            reset_envs(env, keys)
    for keys in (jax.random.split(one, 3), jax.random.split(raw, 3)):  # typed or raw
        assert reset_envs(env, keys).done.shape == (3,)


@st.composite
def reward_trees(draw: st.DrawFn) -> tuple[dict[str, Any], str | None]:
    """A dict of reward leaves; at most one of them has a non-scalar shape."""
    names = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True))
    bad = draw(st.sampled_from([None, *names]))
    bad_shape = draw(st.sampled_from([(1,), (2,), (3, 1)]))
    tree = {n: jax.ShapeDtypeStruct(bad_shape if n == bad else (), jnp.float32) for n in names}
    return tree, bad


@given(reward_trees())
def test_every_reward_leaf_is_checked(case: tuple[dict[str, Any], str | None]) -> None:
    reward, bad = case
    state = make_state(reward=reward)
    if bad is None:
        check_env_state(state, where="E")
        return
    with pytest.raises(ContractError, match=rf"leaf:     state.reward\['{bad}'\]"):
        check_env_state(state, where="E")


def test_reset_keys() -> None:
    check_env_reset_key(jax.random.key(0))
    check_env_reset_key(jax.random.PRNGKey(0))
    with pytest.raises(ContractError, match=r"E.reset: reset was given a batch of keys \(4,\)"):
        check_env_reset_key(jax.random.split(jax.random.key(0), 4), where="E.reset")
    with pytest.raises(ContractError, match=r"batch of keys \(4,\)"):
        check_env_reset_key(jax.random.split(jax.random.PRNGKey(0), 4))
    with pytest.raises(ContractError, match=r"dtype int32, not a PRNG key"):
        check_env_reset_key(jnp.zeros(2, jnp.int32))
    with pytest.raises(ContractError, match=r"not a JAX PRNG key"):
        check_env_reset_key(0)


def test_wrong_action_trees_are_named() -> None:
    two_agent = envs.TwoAgentReach()
    good = {"agent_0": jnp.zeros(2), "agent_1": jnp.zeros(2)}
    check_action_tree(good, two_agent)
    with pytest.raises(ContractError) as error:
        check_action_tree({"agent_0": jnp.zeros(2)}, two_agent, where="TwoAgentReach.step")
    message = str(error.value)
    assert "TwoAgentReach.step: the action's tree does not match env.action_size" in message
    assert "missing action['agent_1']" in message
    with pytest.raises(ContractError, match=r"action\['agent_1'\] has shape \(3,\) float32"):
        check_action_tree({**good, "agent_1": jnp.zeros(3)}, two_agent)
    with pytest.raises(ContractError, match=r"missing action\['agent_0'\], action\['agent_1'\]"):
        check_action_tree(jnp.zeros(4), two_agent)
    # The right shape of integers: a continuous action would be quantised.
    with pytest.raises(ContractError, match=r"has shape \(2,\) int32, not one environment's"):
        check_action_tree({**good, "agent_1": jnp.zeros(2, jnp.int32)}, two_agent)


def test_discrete_and_batched_actions() -> None:
    cartpole = envs.CartPole()
    check_action_tree(jnp.asarray(1), cartpole)
    check_action_tree(jnp.zeros(5, jnp.int32), cartpole, batch_size=5)
    with pytest.raises(ContractError) as error:
        check_action_tree(jnp.zeros(2), cartpole)
    message = str(error.value)
    assert "action has shape (2,) float32, not one environment's action" in message
    assert "expected: shape () integer (discrete_actions=True)" in message
    with pytest.raises(ContractError, match=r"expected: shape \(B=5, 1\) floating"):
        check_action_tree(jnp.zeros((5, 2)), envs.Pendulum(), batch_size=5)
    with pytest.raises(ContractError, match=r"action is not an array leading with B=5"):
        check_action_tree(jnp.zeros((4, 1)), envs.Pendulum(), batch_size=5)


@pytest.mark.parametrize(
    ("node", "shape"),
    [
        (3, (3,)),
        (np.int64(3), (3,)),
        ((2, 3), (2, 3)),
        ([2, 3], (2, 3)),
        ((np.int32(2), 3), (2, 3)),
        ((), ()),
        ((2, -1), (2, -1)),  # a size still: its user names the negative dimension
    ],
)
def test_sizes_and_the_shapes_they_stand_for(node: Any, shape: tuple[int, ...]) -> None:
    assert is_size(node) and size_shape(node) == shape


@pytest.mark.parametrize("node", [True, np.bool_(True), (2, True), 2.0, (2, 3.0), "3", {"a": 2}])
def test_what_is_not_a_size(node: Any) -> None:
    assert not is_size(node)


class ListShapedAction:
    """An action of one (2, 3) array, its size written as a list."""

    action_size: ClassVar[Any] = [2, np.int64(3)]


def test_a_list_or_numpy_action_size_is_one_shape() -> None:
    env = ListShapedAction()
    assert discrete_action_flags(env) == [False]
    check_action_tree(jnp.zeros((2, 3)), env)
    with pytest.raises(ContractError, match=r"missing action; unexpected action\[0\]"):
        check_action_tree([jnp.zeros(2), jnp.zeros(3)], env)
    assert random_action(env, jax.random.key(0)).shape == (2, 3)


class ArmAndGripper:
    """A dict action mixing a continuous arm (3 joints) and a discrete gripper (2 choices)."""

    observation_size: ClassVar[dict[str, int]] = {"arm": 4, "gripper": 2}
    action_size: ClassVar[dict[str, int]] = {"arm": 3, "gripper": 2}
    discrete_actions: ClassVar[Any] = {"arm": False, "gripper": True}


def test_discrete_actions_may_be_given_per_leaf() -> None:
    env = ArmAndGripper()
    assert discrete_action_flags(env) == [False, True]
    assert discrete_action_flags(envs.CartPole()) == [True]
    assert discrete_action_flags(envs.TwoAgentReach()) == [False, False]
    check_action_tree({"arm": jnp.zeros(3), "gripper": jnp.asarray(1)}, env)
    with pytest.raises(ContractError) as error:
        check_action_tree({"arm": jnp.zeros(3), "gripper": jnp.zeros(2)}, env)
    assert "expected: shape () integer (discrete_actions['gripper']=True)" in str(error.value)
    action = random_action(env, jax.random.key(0))
    assert action["arm"].shape == (3,) and action["arm"].dtype == jnp.float32
    assert action["gripper"].shape == () and action["gripper"].dtype == jnp.int32
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(4,))
    samplers = network.layers[1].action
    assert isinstance(samplers["arm"].layers[-1], NormalTanhSampler)
    assert isinstance(samplers["gripper"].layers[-1], CategoricalSampler)


@pytest.mark.parametrize(
    "flags", [{"arm": False}, ["no", "yes"], {"arm": 0, "gripper": 1}, "discrete"]
)
def test_discrete_actions_that_are_not_bools_of_the_action_tree_are_refused(flags: Any) -> None:
    env = ArmAndGripper()
    env.discrete_actions = flags
    with pytest.raises(TypeError, match=r"ArmAndGripper.discrete_actions must be one bool, or"):
        discrete_action_flags(env)


def test_a_tuple_of_ints_is_one_shape_and_the_message_says_so() -> None:
    env = ArmAndGripper()
    env.action_size, env.discrete_actions = (2, 1), (True, False)  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"a tuple of ints is one shape.*\(2, \(1,\)\)"):
        discrete_action_flags(env)
    env.action_size = (2, (1,))  # type: ignore[assignment]
    assert discrete_action_flags(env) == [True, False]
    action = random_action(env, jax.random.key(0))
    assert action[0].shape == () and action[1].shape == (1,)


def test_a_discrete_leaf_given_a_shape_is_refused_by_name() -> None:
    env = ArmAndGripper()
    env.action_size = {"arm": 3, "gripper": (2,)}  # type: ignore[assignment]
    message = r"ArmAndGripper.action_size\['gripper'\] is \(2,\), but that leaf is discrete"
    with pytest.raises(TypeError, match=message):
        random_action(env, jax.random.key(0))  # int() of a tuple before


def test_built_in_envs_check_their_actions() -> None:
    env = envs.CartPole()
    with pytest.raises(ContractError, match=r"CartPole.step: action has shape \(2,\)"):
        env.step(env.reset(jax.random.key(0)), jnp.asarray([0.3, 0.7]))


def test_checks_switch_off() -> None:
    with nnx_ppo.checks(False):
        check_env_state(make_state(reward=jax.ShapeDtypeStruct((1,), jnp.float32)), where="E")
        check_env_reset_key(jax.random.split(jax.random.key(0), 4))
        check_action_tree(jnp.zeros(3), envs.CartPole())


def test_checks_run_on_tracers_inside_the_vmapped_step() -> None:
    env = envs.CartPole()

    def checked_step(state: State, action: jax.Array) -> State:
        next_state = env.step(state, action)
        next_state = next_state.replace(reward=next_state.reward[None])  # a stray axis
        check_env_state(next_state, where="CartPole.step", reference=state)
        return next_state

    states = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 4))
    with pytest.raises(ContractError, match=r"CartPole.step: state.reward has shape \(1,\)"):
        jax.jit(jax.vmap(checked_step))(states, jnp.zeros(4, jnp.int32))


class _MisdeclaredCartPole(CartPole):
    """Declares one observation entry fewer than it returns."""

    @property
    def observation_size(self) -> int:
        return 3


def test_an_observation_size_that_does_not_fit_reset_is_named_before_training() -> None:
    with pytest.raises(ContractError) as caught:
        check_env_unbatched(_MisdeclaredCartPole())
    error = caught.value
    assert error.leaf == "state.obs" and error.found == "shape (4,)"
    assert "env.observation_size declares (3)" in str(error)
    assert "observation_size, where an env has one, is the shape" in str(error.rule)
