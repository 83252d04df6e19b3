"""check_env: its arguments, its random actions, and the properties beyond the shape checks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nnx_ppo
from nnx_ppo import envs
from nnx_ppo.envs import State
from nnx_ppo.testing import ContractPropertyError, EnvProperty, check_env, random_action
from nnx_ppo.testing.env_properties import ENV_PROPERTIES
from nnx_ppo.wrappers import EpisodeWrapper, RewardScalingWrapper


class Walker:
    """A Playground-style env: dict observations, no ``action_size``, and Playground's
    float ``info["truncation"]`` (1.0 at the time limit)."""

    def __init__(self, max_steps: int = 2) -> None:
        self.max_steps = max_steps

    def reset(self, rng: jax.Array) -> State:
        position = jax.random.uniform(rng, (2,))
        return State(
            obs={"position": position, "velocity": jnp.zeros(2)},
            reward=jnp.zeros(()),
            done=jnp.zeros(()),
            metrics={},
            info={"truncation": jnp.zeros(()), "steps": jnp.zeros((), jnp.int32)},
        )

    def step(self, state: State, action: jax.Array) -> State:
        steps = state.info["steps"] + 1
        velocity = jnp.clip(action, -1.0, 1.0)
        position = state.obs["position"] + 0.1 * velocity
        limit = (steps >= self.max_steps).astype(jnp.float32)
        return State(
            obs={"position": position, "velocity": velocity},
            reward=-jnp.sum(position**2),
            done=limit,
            metrics={},
            info={"truncation": limit, "steps": steps},
        )


def walker_action(key: jax.Array) -> jax.Array:
    return jax.random.normal(key, (2,))


def test_an_env_without_action_size_is_checked_with_an_action_function() -> None:
    check_env(Walker(), n_envs=3, steps=4, key=jax.random.key(5), action_fn=walker_action)


def test_an_env_without_action_size_needs_an_action_function() -> None:
    with pytest.raises(TypeError, match=r"Walker has no action_size.*pass action_fn"):
        check_env(Walker())


class DoneTooEarly(Walker):
    """Per-agent ends (a done per reward leaf) and one truncation flag for the episode,
    set at the time limit whether or not every agent is done."""

    def reset(self, rng: jax.Array) -> State:
        state = super().reset(rng)
        flags = {"a": jnp.zeros(()), "b": jnp.zeros(())}
        return state.replace(reward=flags, done=flags)

    def step(self, state: State, action: jax.Array) -> State:
        stepped = super().step(state.replace(reward=jnp.zeros(()), done=jnp.zeros(())), action)
        return stepped.replace(
            reward={"a": stepped.reward, "b": stepped.reward},
            done={"a": stepped.done, "b": jnp.zeros(())},
        )


def test_one_truncation_flag_for_a_tree_of_done_needs_every_leaf_done() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_env(DoneTooEarly(), n_envs=2, steps=3, action_fn=walker_action)
    assert caught.value.property == EnvProperty.TRUNCATION
    assert "state.done['b'] is not set" in str(caught.value)
    assert caught.value.leaf == "state.info['truncation'] at step 1, env 0"


class TruncationPerCoordinate(Walker):
    """Reports Playground's truncation once per coordinate instead of once per env."""

    def reset(self, rng: jax.Array) -> State:
        state = super().reset(rng)
        return state.replace(info={**state.info, "truncation": jnp.zeros(2)})

    def step(self, state: State, action: jax.Array) -> State:
        stepped = super().step(state, action)
        flags = jnp.broadcast_to(stepped.info["truncation"], (2,))
        return stepped.replace(info={**stepped.info, "truncation": flags})


def test_a_truncation_flag_with_a_stray_axis_is_named() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_env(TruncationPerCoordinate(), n_envs=2, steps=2, action_fn=walker_action)
    # The contract's own check at the single env's reset, as for info['truncated'].
    assert caught.value.property == EnvProperty.RESET
    assert "state.info['truncation'] has shape (2,), not a scalar" in str(caught.value)


def test_the_checks_run_even_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    class BatchedDone(envs.Pendulum):
        def reset(self, rng: Any) -> State:
            return super().reset(rng).replace(done=jnp.zeros((3,)))

    monkeypatch.setenv(nnx_ppo.CHECKS_ENV_VAR, "0")
    with pytest.raises(ContractPropertyError) as caught:
        check_env(BatchedDone())
    assert isinstance(caught.value.cause, nnx_ppo.ContractError)
    assert "as if the env held 3 environments" in str(caught.value)


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"n_envs": 0}, ValueError, "n_envs must be a positive int"),
        ({"steps": True}, TypeError, "steps must be an int, got bool"),
        ({"key": 0}, TypeError, r"key must be one PRNG key, got int 0; .* jax.random.key\(0\)"),
        (
            {"key": jax.random.split(jax.random.key(0))},
            ValueError,
            r"got keys of shape \(2,\); pass one of them, e.g. key\[0\]",
        ),
        ({"action_fn": 2}, TypeError, "action_fn must be a function or None, got int 2"),
        ({"random_reset": "no"}, TypeError, "random_reset must be True or False, got str 'no'"),
    ],
)
def test_bad_arguments_are_named(keywords: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        check_env(envs.make("cartpole"), **keywords)


def test_an_error_in_the_action_function_is_raised_as_its_own() -> None:
    def broken_action(key: jax.Array) -> jax.Array:
        raise RuntimeError("a bug in the caller's action function")

    # Not a property failure of the env: the caller's own error, with its traceback.
    with pytest.raises(RuntimeError, match="a bug in the caller's action function") as caught:
        check_env(Walker(), n_envs=2, steps=2, action_fn=broken_action)
    assert "check_env: raised by action_fn" in "\n".join(caught.value.__notes__)


def test_an_object_without_reset_and_step_is_refused() -> None:
    with pytest.raises(TypeError, match=r"check_env: .* object has no reset and no step method"):
        check_env(object())


def test_an_env_class_instead_of_an_instance_is_refused() -> None:
    with pytest.raises(TypeError, match=r"the class CartPole, not an environment.*CartPole\(\)"):
        check_env(envs.CartPole)


def test_random_actions_follow_action_size_and_discrete_actions() -> None:
    keys = jax.random.split(jax.random.key(0), 64)
    cartpole = jax.vmap(lambda k: random_action(envs.make("cartpole"), k))(keys)
    assert cartpole.shape == (64,) and cartpole.dtype == jnp.int32
    assert set(np.unique(cartpole)) == {0, 1}
    pendulum = jax.vmap(lambda k: random_action(envs.make("pendulum"), k))(keys)
    assert pendulum.shape == (64, 1) and jnp.issubdtype(pendulum.dtype, jnp.floating)
    assert float(pendulum.min()) >= -1.0 and float(pendulum.max()) <= 1.0
    assert float(pendulum.std()) > 0.3
    two_agent = random_action(envs.make("two_agent"), keys[0])
    assert jax.tree.map(jnp.shape, two_agent) == {"agent_0": (2,), "agent_1": (2,)}


class TracesCounted(envs.CartPole):
    """Adds the number of traces so far to one entry of a wide observation: each trace
    freezes a different count."""

    traces = 0
    observation_size = 4 + 64

    def reset(self, rng: Any) -> State:
        TracesCounted.traces += 1
        state = super().reset(rng)
        wide = jnp.zeros((64,)).at[5].set(TracesCounted.traces)
        return state.replace(obs=jnp.concatenate([state.obs, wide]))

    def step(self, state: State, action: Any) -> State:
        stepped = super().step(state.replace(obs=state.obs[:4]), action)
        return stepped.replace(obs=jnp.concatenate([stepped.obs, state.obs[4:]]))


def test_a_determinism_failure_summarises_the_arrays_instead_of_printing_them() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_env(TracesCounted(), n_envs=2, steps=3)
    message = str(caught.value)
    assert caught.value.property == EnvProperty.DETERMINISM
    assert "leaf:     state.obs, indexed (env, ...)" in message
    assert (
        "found:    first run vs second run: shape (2, 68) float32, 2 of 136 entries differ; "
        # Each rollout traces reset twice (its n_envs and the starts compared for
        # "reset draws from its key"), so the second run's count is two higher.
        "first at index (0, 9): 2.0 vs 4.0; largest difference 2" in message
    ), message
    assert len(message.splitlines()) == 5, message


def test_the_table_orders_every_property_once_and_the_docstring_lists_it() -> None:
    assert [row.property for row in ENV_PROPERTIES] == list(EnvProperty)
    doc = check_env.__doc__ or ""
    listed = [doc.index(f"{number}. ``{prop}``:") for number, prop in enumerate(EnvProperty, 1)]
    assert listed == sorted(listed)


class FixedStartWalker(Walker):
    """Starts at the origin, but keeps its reset key to draw each step's drift from:
    it does not ignore its key."""

    def reset(self, rng: jax.Array) -> State:
        state = super().reset(rng)
        position = jnp.zeros(2)
        return state.replace(obs={"position": position, "velocity": jnp.zeros(2)}, data=rng)

    def step(self, state: State, action: jax.Array) -> State:
        key, drift_key = jax.random.split(state.data)
        drift = 0.01 * jax.random.normal(drift_key, (2,))
        stepped = super().step(state, action + drift)
        return stepped.replace(data=key)


def test_an_env_that_keeps_its_reset_key_draws_from_it() -> None:
    check_env(FixedStartWalker(), n_envs=2, steps=3, action_fn=walker_action)


class CalledBackNoise(Walker):
    """Draws NumPy noise through a host callback: one program text, other numbers at
    every run."""

    generator = np.random.default_rng(0)

    def step(self, state: State, action: jax.Array) -> State:
        noise = jax.pure_callback(
            lambda: self.generator.normal(size=(2,)).astype(np.float32),
            jax.ShapeDtypeStruct((2,), jnp.float32),
        )
        return super().step(state, action + noise)


def test_numpy_noise_through_a_callback_is_not_deterministic() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_env(CalledBackNoise(), n_envs=2, steps=3, action_fn=walker_action)
    assert caught.value.property == EnvProperty.DETERMINISM, str(caught.value)


class CalledBackNudge(Walker):
    """Scales each position by ``1 + relative * u``, u uniform in [-1, 1) drawn by NumPy
    on the host: two runs differ by about ``relative`` of the values."""

    def __init__(self, relative: float) -> None:
        super().__init__()
        self.relative = relative
        self.generator = np.random.default_rng(0)

    def step(self, state: State, action: jax.Array) -> State:
        stepped = super().step(state, action)
        factor = jax.pure_callback(
            lambda: (1 + self.relative * self.generator.uniform(-1, 1, (2,))).astype(np.float32),
            jax.ShapeDtypeStruct((2,), jnp.float32),
        )
        return stepped.replace(obs={**stepped.obs, "position": stepped.obs["position"] * factor})


def test_determinism_allows_float32_rounding_and_nothing_coarser() -> None:
    # A few ulps (XLA fusing two traces differently) pass; a relative 1e-4, a frozen
    # NumPy draw's size or far less, does not.
    check_env(CalledBackNudge(3e-7), n_envs=2, steps=3, action_fn=walker_action)
    with pytest.raises(ContractPropertyError) as caught:
        check_env(CalledBackNudge(1e-4), n_envs=2, steps=3, action_fn=walker_action)
    assert caught.value.property == EnvProperty.DETERMINISM, str(caught.value)


class SeededNumpyNoise(Walker):
    """Adds NumPy noise from a generator seeded inside step: drawn once, at trace time, the
    same in every trace, so every step of every env gets the same noise."""

    def step(self, state: State, action: jax.Array) -> State:
        noise = np.random.default_rng(123).normal(0, 0.01, 2).astype(np.float32)
        return super().step(state, action + noise)


def test_noise_fixed_at_trace_time_passes_as_the_determinism_rule_says() -> None:
    # Two fresh traces agree, which is what the property compares; the rule names the gap.
    check_env(SeededNumpyNoise(), n_envs=2, steps=3, action_fn=walker_action)
    (rule,) = [row.rule for row in ENV_PROPERTIES if row.property == EnvProperty.DETERMINISM]
    assert "two runs from the same key, each traced anew" in rule
    assert "a NumPy generator seeded inside step" in rule and "not caught" in rule


class PythonFloatReward(Walker):
    def reset(self, rng: jax.Array) -> State:
        return super().reset(rng).replace(reward=0.0)


def test_a_python_float_in_the_reset_state_is_a_single_env_reset_failure() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_env(PythonFloatReward(), n_envs=2, steps=3, action_fn=walker_action)
    assert caught.value.property == EnvProperty.RESET, str(caught.value)
    assert caught.value.leaf == "state.reward", str(caught.value)


class KeyOnTheObject(Walker):
    """Draws its noise from a key kept on the Python object, outside its State."""

    def __init__(self) -> None:
        super().__init__()
        self._key = jax.random.key(0)

    def step(self, state: State, action: jax.Array) -> State:
        self._key, draw = jax.random.split(self._key)
        return super().step(state, action + jax.random.normal(draw, (2,)))


def test_an_env_keeping_its_key_on_the_object_is_named() -> None:
    # JAX later failed with "Computation compiled for 2 inputs but called with 1".
    with pytest.raises(ContractPropertyError) as caught:
        check_env(KeyOnTheObject(), action_fn=walker_action)
    message = str(caught.value)
    assert "property 'single-env step'" in message
    assert "env.step stored a traced value on the env object, at env._key" in message


class ObservationsKeptInADict(Walker):
    """Keeps every observation it steps from in a list in a dict of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.memo: dict[str, list[jax.Array]] = {"seen": []}

    def step(self, state: State, action: jax.Array) -> State:
        self.memo["seen"].append(state.obs)
        return super().step(state, action)


def test_a_traced_value_kept_by_an_env_wrapped_twice_is_named() -> None:
    # Five levels down from the outer wrapper; the walk stopped at four.
    wrapped = RewardScalingWrapper(EpisodeWrapper(ObservationsKeptInADict(), 5), 1.0)
    with pytest.raises(ContractPropertyError, match=r"at env\.env\.env\.memo\['seen'\]\[0\]"):
        check_env(wrapped, action_fn=walker_action)
