"""The built-in environments: the env contract, determinism, and Gymnasium's dynamics."""

import importlib.machinery
import importlib.util
import math
import sys
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nnx_ppo import envs
from nnx_ppo.contract.env_checks import check_action_tree, check_env_state, check_env_unbatched

BUILT_IN = ("cartpole", "pendulum", "memory", "two_agent")
N_ENVS = 3


def random_action(env: Any, key: jax.Array) -> Any:
    """One env's uniformly random action, from ``action_size`` and ``discrete_actions``."""
    sizes, treedef = jax.tree.flatten(env.action_size)
    keys = jax.random.split(key, len(sizes))
    if env.discrete_actions:
        leaves = [jax.random.randint(k, (), 0, n) for k, n in zip(keys, sizes, strict=True)]
    else:
        leaves = [
            jax.random.uniform(k, (n,), minval=-1, maxval=1)
            for k, n in zip(keys, sizes, strict=True)
        ]
    return jax.tree.unflatten(treedef, leaves)


def leading_axes(tree: Any) -> set[int]:
    return {leaf.shape[0] for leaf in jax.tree.leaves(tree)}


@pytest.fixture(scope="module", params=BUILT_IN)
def rollout(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """An env, and a jitted, vmapped function of a key: (reset states, next states)."""
    env = envs.make(request.param)

    @jax.jit
    def reset_and_step(key: jax.Array) -> tuple[Any, Any]:
        reset_keys = jax.random.split(key, N_ENVS)
        action_keys = jax.random.split(jax.random.fold_in(key, 1), N_ENVS)
        states = jax.vmap(env.reset)(reset_keys)
        actions = jax.vmap(lambda k: random_action(env, k))(action_keys)
        return states, jax.vmap(env.step)(states, actions)

    return env, reset_and_step


def test_state_is_unbatched_and_stable_between_reset_and_step(rollout: tuple[Any, Any]) -> None:
    env, _ = rollout
    reference = check_env_unbatched(env)
    action = random_action(env, jax.random.key(1))
    check_action_tree(action, env)
    stepped = jax.eval_shape(env.step, env.reset(jax.random.key(0)), action)
    check_env_state(stepped, where="step", reference=reference)
    assert reference.done.shape == ()
    assert all(leaf.shape == () for leaf in jax.tree.leaves(reference.reward))
    assert jax.tree.map(lambda x: x.shape, reference.obs) == jax.tree.map(
        lambda n: (n,) if isinstance(n, int) else n,
        env.observation_size,
        is_leaf=lambda n: isinstance(n, tuple),
    )


def test_jit_vmap_adds_one_env_axis_everywhere(rollout: tuple[Any, Any]) -> None:
    _, reset_and_step = rollout
    states, next_states = reset_and_step(jax.random.key(0))
    assert leading_axes(states) == {N_ENVS}
    assert leading_axes(next_states) == {N_ENVS}
    assert jax.tree.structure(states) == jax.tree.structure(next_states)


def test_deterministic_given_the_key(rollout: tuple[Any, Any]) -> None:
    _, reset_and_step = rollout
    first = reset_and_step(jax.random.key(7))
    again = reset_and_step(jax.random.key(7))
    other = reset_and_step(jax.random.key(8))
    jax.tree.map(np.testing.assert_array_equal, first, again)
    differs = jax.tree.map(lambda a, b: not np.array_equal(a, b), first, other)
    assert any(jax.tree.leaves(differs))


def test_registry_names_and_unknown_name() -> None:
    assert envs.names()[: len(BUILT_IN)] == BUILT_IN
    assert isinstance(envs.make("cartpole"), envs.CartPole)
    short = envs.make("cartpole", max_steps=7)
    assert isinstance(short, envs.CartPole) and short.max_steps == 7
    with pytest.raises(ValueError, match=r"Unknown environment 'cart_pole'.*cartpole, pendulum"):
        envs.make("cart_pole")


def test_registry_reports_the_playground_extra_when_playground_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"playground extra"):
        envs.make("CartpoleBalance")
    assert envs.names() == BUILT_IN


def test_registry_loads_playground_names_through_its_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[tuple[str, dict[str, Any]]] = []
    registry = types.SimpleNamespace(
        ALL_ENVS=("CartpoleBalance",),
        load=lambda name, **kwargs: loaded.append((name, kwargs)) or "playground env",
        get_default_config=lambda name: {"episode_length": 1000, "impl": "warp"},
    )
    fake = types.ModuleType("mujoco_playground")
    fake.__spec__ = importlib.machinery.ModuleSpec("mujoco_playground", None)
    fake.registry = registry  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mujoco_playground", fake)
    with pytest.warns(UserWarning, match="episode_length"):
        made = envs.make("CartpoleBalance", config_overrides={"episode_length": 9})
    assert made == "playground env"
    # On CPU the backend defaults to MJX's ("jax"); keywords join the overrides.
    assert envs.make("CartpoleBalance", impl="warp") == "playground env"
    assert loaded[:2] == [
        (
            "CartpoleBalance",
            {"config": None, "config_overrides": {"episode_length": 9, "impl": "jax"}},
        ),
        ("CartpoleBalance", {"config": None, "config_overrides": {"impl": "warp"}}),
    ]
    assert envs.playground_backend("CartpoleBalance") == "jax"
    with pytest.raises(ValueError, match="flavour is not a field of its Playground config"):
        envs.make("CartpoleBalance", flavour=1)
    # Applied by Playground's training wrapper alone: the env would run on uncut.
    with pytest.warns(UserWarning, match="episode_length set in its Playground config, which"):
        envs.make("CartpoleBalance", episode_length=5)
    assert envs.names() == (*BUILT_IN, "CartpoleBalance")
    with pytest.raises(ValueError, match=r"1 MuJoCo Playground envs"):
        envs.make("Nope")


def test_a_playground_import_failing_for_its_gl_library_names_mujoco_gl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def import_module(name: str) -> Any:
        raise AttributeError("'NoneType' object has no attribute 'glGetError'")

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(importlib, "import_module", import_module)
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    with pytest.raises(ImportError, match="MUJOCO_GL=osmesa: is that GL library installed"):
        envs.names()
    monkeypatch.delenv("MUJOCO_GL")
    with pytest.raises(AttributeError, match="glGetError"):  # not ours to explain
        envs.names()


@pytest.mark.parametrize(
    ("name", "kwargs", "error"),
    [
        ("cartpole", {"max_steps": 0}, ValueError),
        ("pendulum", {"max_steps": 2.5}, TypeError),
        ("memory", {"n_cues": 1}, ValueError),
        ("memory", {"delay": True}, TypeError),
        ("two_agent", {"max_steps": -1}, ValueError),
    ],
)
def test_bad_constructor_arguments_are_named(
    name: str, kwargs: dict[str, Any], error: type
) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        envs.make(name, **kwargs)


# ------------------------------------------------------------------------- cart-pole

THETA_LIMIT = 12 * 2 * math.pi / 360


def numpy_cartpole_step(s: np.ndarray, action: int) -> tuple[np.ndarray, bool]:
    """Gymnasium's CartPole-v1 step (Euler), written out in float64."""
    x, x_dot, theta, theta_dot = s
    force = 10.0 if action == 1 else -10.0
    cos, sin = math.cos(theta), math.sin(theta)
    temp = (force + 0.1 * 0.5 * theta_dot**2 * sin) / 1.1
    theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
    x_acc = temp - 0.1 * 0.5 * theta_acc * cos / 1.1
    s = np.array(
        [
            x + 0.02 * x_dot,
            x_dot + 0.02 * x_acc,
            theta + 0.02 * theta_dot,
            theta_dot + 0.02 * theta_acc,
        ]
    )
    return s, bool(abs(s[0]) > 2.4 or abs(s[2]) > THETA_LIMIT)


CARTPOLE = envs.CartPole()
N_STEPS = 8


@jax.jit
def cartpole_trajectory(obs: jax.Array, actions: jax.Array) -> Any:
    state = CARTPOLE.reset(jax.random.key(0)).replace(obs=obs)

    def one_step(state: Any, action: jax.Array) -> tuple[Any, Any]:
        state = CARTPOLE.step(state, action)
        return state, state

    return jax.lax.scan(one_step, state, actions)[1]


@given(
    start=st.tuples(st.floats(-2.3, 2.3), st.floats(-2, 2), st.floats(-0.2, 0.2), st.floats(-2, 2)),
    actions=st.lists(st.integers(0, 1), min_size=N_STEPS, max_size=N_STEPS),
)
def test_cartpole_matches_gymnasium_cartpole_v1(
    start: tuple[float, ...], actions: list[int]
) -> None:
    states = cartpole_trajectory(jnp.asarray(start, jnp.float32), jnp.asarray(actions))
    s = np.asarray(start, np.float32).astype(np.float64)
    for t, action in enumerate(actions):
        s, terminated = numpy_cartpole_step(s, action)
        np.testing.assert_allclose(states.obs[t], s, rtol=1e-4, atol=1e-4)
        margin = min(abs(abs(s[0]) - 2.4), abs(abs(s[2]) - THETA_LIMIT))
        if margin > 1e-4:  # float32 may round the other way right at the boundary
            assert bool(states.done[t]) == terminated
        assert not states.info["truncated"][t]
        np.testing.assert_array_equal(states.reward[t], 1.0)


def run_cartpole(policy_gains: tuple[float, ...], n_steps: int) -> Any:
    """Run a linear bang-bang policy for ``n_steps`` from a fixed reset."""
    gains = jnp.asarray(policy_gains)

    def one_step(state: Any, _: None) -> tuple[Any, Any]:
        state = CARTPOLE.step(state, (state.obs @ gains > 0).astype(jnp.int32))
        return state, state

    start = CARTPOLE.reset(jax.random.key(3))
    return jax.jit(lambda s: jax.lax.scan(one_step, s, None, length=n_steps)[1])(start)


def test_cartpole_truncates_at_500_steps() -> None:
    states = run_cartpole((0.1, 0.3, 5.0, 1.0), 500)
    done = np.asarray(states.done)
    assert done[:499].sum() == 0 and done[499] == 1.0
    assert bool(states.info["truncated"][499])
    assert not np.asarray(states.info["truncated"][:499]).any()


def test_cartpole_termination_is_not_truncation() -> None:
    states = run_cartpole((0.0, 0.0, 0.0, 0.0), 100)  # always pushes left
    first_done = int(np.argmax(np.asarray(states.done)))
    assert 0 < first_done < 100
    assert not np.asarray(states.info["truncated"]).any()
    assert (
        abs(float(states.obs[first_done, 2])) > THETA_LIMIT
        or abs(float(states.obs[first_done, 0])) > 2.4
    )


def test_cartpole_terminating_on_the_last_step_is_not_truncated() -> None:
    state = CARTPOLE.reset(jax.random.key(0))
    state = state.replace(
        obs=jnp.asarray([0.0, 0.0, 0.2, 2.0]), data={"steps": jnp.asarray(499, jnp.int32)}
    )
    last = CARTPOLE.step(state, jnp.asarray(1))
    assert last.done == 1.0 and not last.info["truncated"]


# -------------------------------------------------------------------------- pendulum


def numpy_pendulum_step(
    theta: float, theta_dot: float, action: float
) -> tuple[float, float, float]:
    """Gymnasium's Pendulum-v1 step (g = 10) with the action scaled from [-1, 1] to torque."""
    u = float(np.clip(action, -1, 1)) * 2.0
    normalized = ((theta + math.pi) % (2 * math.pi)) - math.pi
    cost = normalized**2 + 0.1 * theta_dot**2 + 0.001 * u**2
    theta_dot = float(np.clip(theta_dot + (3 * 10.0 / 2 * math.sin(theta) + 3.0 * u) * 0.05, -8, 8))
    return theta + theta_dot * 0.05, theta_dot, -cost


PENDULUM = envs.Pendulum()


@jax.jit
def pendulum_trajectory(key: jax.Array, actions: jax.Array) -> Any:
    def one_step(state: Any, action: jax.Array) -> tuple[Any, Any]:
        state = PENDULUM.step(state, action)
        return state, state

    start = PENDULUM.reset(key)
    return start, jax.lax.scan(one_step, start, actions)[1]


@given(
    seed=st.integers(0, 2**16),
    actions=st.lists(st.floats(-1.5, 1.5), min_size=N_STEPS, max_size=N_STEPS),
)
def test_pendulum_matches_gymnasium_pendulum_v1(seed: int, actions: list[float]) -> None:
    start, states = pendulum_trajectory(
        jax.random.key(seed), jnp.asarray(actions, jnp.float32)[:, None]
    )
    cos, sin, theta_dot = np.asarray(start.obs, np.float64)
    theta = math.atan2(sin, cos)
    assert -math.pi <= theta <= math.pi and -1 <= theta_dot <= 1
    for t, action in enumerate(actions):
        theta, theta_dot, reward = numpy_pendulum_step(theta, theta_dot, action)
        np.testing.assert_allclose(
            states.obs[t], [math.cos(theta), math.sin(theta), theta_dot], atol=1e-4
        )
        np.testing.assert_allclose(states.reward[t], reward, rtol=1e-4, atol=1e-4)
    assert not np.asarray(states.done).any()


def test_pendulum_truncates_at_200_steps() -> None:
    _, states = pendulum_trajectory(jax.random.key(0), jnp.zeros((200, 1)))
    assert np.flatnonzero(np.asarray(states.done)).tolist() == [199]
    assert np.flatnonzero(np.asarray(states.info["truncated"])).tolist() == [199]


# ---------------------------------------------------------------------------- memory

MEMORY = envs.MemoryTask(n_cues=2, delay=4)
EPISODE = MEMORY.delay + 2


@jax.jit
def memory_episodes(key: jax.Array, oracle: bool) -> Any:
    """Many episodes, answering at random or with the hidden cue."""

    def episode(key: jax.Array) -> Any:
        reset_key, action_key = jax.random.split(key)
        guesses = jax.random.randint(action_key, (EPISODE,), 0, MEMORY.n_cues)

        def one_step(state: Any, guess: jax.Array) -> tuple[Any, Any]:
            state = MEMORY.step(state, jnp.where(oracle, state.data["cue"], guess))
            return state, state

        start = MEMORY.reset(reset_key)
        return start, jax.lax.scan(one_step, start, guesses)[1]

    return jax.vmap(episode)(jax.random.split(key, 2000))


def test_memory_random_policy_is_at_chance_and_remembering_solves_it() -> None:
    _, random_run = memory_episodes(jax.random.key(0), False)
    _, oracle_run = memory_episodes(jax.random.key(0), True)
    random_return = np.asarray(random_run.reward).sum(axis=1)
    oracle_return = np.asarray(oracle_run.reward).sum(axis=1)
    # Chance is 0 with 2 cues; 2000 episodes put the mean within about 0.07 of it.
    assert abs(random_return.mean()) < 0.07
    np.testing.assert_array_equal(oracle_return, 1.0)
    done = np.asarray(oracle_run.done)
    assert (done[:, : EPISODE - 1] == 0).all() and (done[:, EPISODE - 1] == 1).all()


def test_memory_observation_hides_the_cue_after_the_first_step() -> None:
    start, run = memory_episodes(jax.random.key(1), True)
    cues = np.asarray(start.data["cue"])
    assert set(cues.tolist()) == {0, 1}
    np.testing.assert_array_equal(np.asarray(start.obs)[:, :2], np.eye(2)[cues])
    later = np.asarray(run.obs)[:, : EPISODE - 1]
    # Every observation after the first is the same for every cue.
    np.testing.assert_array_equal(later, np.broadcast_to(later[:1], later.shape))
    query = later[0, :, 2]
    assert query.tolist() == [0.0] * (EPISODE - 2) + [1.0]
    # The elapsed time counts from 0 at the cue to 1 at the query.
    elapsed = later[0, :, 3]
    np.testing.assert_allclose(elapsed, np.arange(1, EPISODE) / (EPISODE - 1), rtol=1e-6)
    assert elapsed[-1] == 1.0


# ------------------------------------------------------------------------- two agents


def test_two_agent_heading_for_the_target_beats_standing_still() -> None:
    env = envs.TwoAgentReach()

    def episode_return(key: jax.Array, gain: float) -> Any:
        def one_step(state: Any, _: None) -> tuple[Any, Any]:
            action = {a: jnp.clip(gain * obs[2:], -1, 1) for a, obs in state.obs.items()}
            state = env.step(state, action)
            return state, state.reward

        return jax.lax.scan(one_step, env.reset(key), None, length=env.max_steps)[1]

    run = jax.jit(jax.vmap(episode_return, in_axes=(0, None)))
    keys = jax.random.split(jax.random.key(0), 64)
    greedy = jax.tree.map(lambda r: float(r.sum(axis=1).mean()), run(keys, 10.0))
    still = jax.tree.map(lambda r: float(r.sum(axis=1).mean()), run(keys, 0.0))
    assert set(greedy) == {"agent_0", "agent_1"}
    for agent in greedy:
        assert greedy[agent] > 0.5 * still[agent]  # returns are negative distances
