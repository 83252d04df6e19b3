"""The compiled PPO step and its host-side callers, ``ppo_step`` and ``ppo_steps``.

The step reads top to bottom: **collect** a rollout (``unroll_env``), **score**
it (``compute_advantages``), **learn** from it (``_learn``), **fold** the rollout
into the network's running statistics, and **advance** the carry, env states and
key. It is compiled once per (env, network structure, optimizer,
:class:`PPOConfig`) and reused for every call.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeAlias, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from nnx_ppo._compile import TrainingProgram, training_jit
from nnx_ppo._numerics import fraction_explained, variance
from nnx_ppo._threefry import standard_keys, straight_line_keys
from nnx_ppo.algorithms import rollout, sharding
from nnx_ppo.algorithms._advantages import compute_advantages
from nnx_ppo.algorithms._learn import _learn, _LearnData
from nnx_ppo.algorithms.config import (
    PPOConfig,
)
from nnx_ppo.algorithms.metrics import (
    EpisodeTotals,
    _episode_sum_dtype,
    _logged_rollout_metrics,
    compute_metrics,
    episode_metrics,
    log_weight_stats,
    track_episodes,
)
from nnx_ppo.algorithms.rollout import Tree
from nnx_ppo.algorithms.types import (
    EnvState,
    LoggingLevel,
    RLEnv,
    RunningEpisodes,
    TrainingState,
    Transition,
)
from nnx_ppo.contract.arguments import require_called_eagerly, require_int
from nnx_ppo.contract.axes import FloatHistory, HistoryTree
from nnx_ppo.networks.types import (
    ModuleState,
    StatefulModule,
)


def _finite_leaves(tree: Any) -> dict[str, Bool[Array, ""]]:
    """Whether each floating-point leaf is finite, by its path: the step's own record of
    what diverged (integers and keys are always finite)."""
    return {
        jax.tree_util.keystr(path): jnp.all(jnp.isfinite(leaf))
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if jnp.issubdtype(leaf.dtype, jnp.inexact)
    }


_STATISTICS = nnx.Not(nnx.Any(nnx.Param, nnx.RngState, nnx.Intermediate))
"""The network's running statistics: what ``update_statistics`` writes, and the step's
health record checks besides the parameters."""


def _update_statistics_checked(
    networks: StatefulModule, rollout_extras: HistoryTree
) -> dict[str, Bool[Array, ""]]:
    """``networks.update_statistics(rollout_extras)``, and whether each running statistic
    is finite after it, by path.

    A huge but finite observation overflows a Normalizer's M2 to inf, which then zeroes
    that feature for good. A statistic that was not finite before (a running maximum
    from -inf, on purpose) counts as finite.
    """
    finite_before = _finite_leaves(nnx.state(networks, _STATISTICS))
    networks.update_statistics(rollout_extras)
    return {
        path: finite | ~finite_before[path]
        for path, finite in _finite_leaves(nnx.state(networks, _STATISTICS)).items()
    }


def _typed_as_given(given: nnx.State) -> Callable[[nnx.State], nnx.State]:
    """A function that types a state's leaves as ``given``'s are typed now: weakly where
    a leaf is (a Variable's Python number, as JAX holds it), strongly where it is not.

    The optimizer returns a parameter it updated strongly typed: the next call's
    program was another (compiled again), and so was its arithmetic (a float32 scalar
    then promoted a bfloat16 computation the first call had left in bfloat16). Take it
    before anything writes to ``given``'s Variables (``nnx.merge`` shares them). A
    state whose leaves are all typed as given comes back as it is.
    """
    leaves = jax.tree.leaves(given)

    def held_as_given(before: jax.Array, after: jax.Array) -> jax.Array:
        weak = jax.typeof(before).weak_type
        if jax.typeof(after).weak_type == weak:
            return after
        if not weak:
            return jax.lax.convert_element_type(after, before.dtype)
        # An update keeps the weak type of the array it writes into.
        return jax.lax.full_like(before, 0).at[...].set(after.astype(before.dtype))

    def typed(updated: nnx.State) -> nnx.State:
        written, treedef = jax.tree.flatten(updated)
        return jax.tree.unflatten(
            treedef, [held_as_given(*pair) for pair in zip(leaves, written, strict=True)]
        )

    return typed


_STATISTICS_OVERFLOW_HINT = (
    "finite inputs can overflow float32 there: a Normalizer's M2 squares them, infinite "
    "above about 1.8e19; check the env's observations"
)


class StepCarry(NamedTuple):
    """What one PPO step hands the next: the per-env parts (leaves ``(B, ...)``) and the key."""

    network_states: ModuleState
    env_states: EnvState | None
    """``None`` only while the carry crosses a program that does not take it."""
    running: RunningEpisodes
    key: PRNGKeyArray


class StepReport(NamedTuple):
    """What one PPO step reports to the host."""

    metrics: dict[str, Any]
    episodes: EpisodeTotals
    health: dict[str, Any]


class _StepKeys(NamedTuple):
    """The keys a PPO step draws from its carry's key, one per use."""

    reset: PRNGKeyArray  # the fresh env states ended episodes restart from
    learn: PRNGKeyArray  # the learning's minibatch deals
    following: PRNGKeyArray  # the next step's carry


def _step_keys(key: PRNGKeyArray) -> _StepKeys:
    return _StepKeys(*jax.random.split(key, 3))


@jax.jit
def _reset_key(key: PRNGKeyArray) -> PRNGKeyArray:
    """The key of the fresh env states of the PPO step whose carry holds ``key``.

    Compiled: a one-step call derives it on the host before dispatching the reset,
    where the split and the index, run op by op, took about 0.2 ms (compiled, 16 us).
    """
    return _step_keys(key).reset


def _reset_from(env: RLEnv, key: PRNGKeyArray, n_envs: int) -> EnvState:
    """``n_envs`` reset env states, one per key of ``jax.random.split(key, n_envs)``.

    Where the step draws with straight-line keys (several runs on CPU), so does the
    env, and its states still hold JAX's own keys (:func:`rollout._env_call`): an env
    that keeps its key in its state (Playground's ``info["rng"]``) must keep the key
    type its ``reset`` gave it outside the program.
    """
    return rollout.reset_envs(env, jax.random.split(key, n_envs))


class Collected(NamedTuple):
    """A PPO step's rollout: the carries and env states it ended with, and its transitions."""

    network_states: ModuleState
    env_states: EnvState
    transitions: Transition


def _train_step(
    env: RLEnv,
    config: PPOConfig,
    networks: StatefulModule,
    optimizer: nnx.Optimizer,
    carry: StepCarry,
    fresh_env_states: EnvState | None = None,
) -> tuple[StepCarry, StepReport]:
    """Collect, then score, learn, fold statistics, advance. Traced once per configuration."""
    collected = _collect(env, config, networks, carry, fresh_env_states)
    return _learn_from(config, networks, optimizer, carry, collected)


def _collect(
    env: RLEnv,
    config: PPOConfig,
    networks: StatefulModule,
    carry: StepCarry,
    fresh_env_states: EnvState | None,
) -> Collected:
    """The step's rollout. It writes no variable of ``networks`` (forward passes never do).

    Ended episodes restart from ``fresh_env_states`` (:func:`_reset_from` the
    :func:`_reset_key`), reset here when ``None``. The transitions keep only the
    metric groups ``config.logging_level`` logs.
    """
    if fresh_env_states is None:
        fresh_env_states = _reset_from(env, _reset_key(carry.key), config.n_envs)
    assert carry.env_states is not None, "only the learning program's carry lacks env states"
    network_states, env_states, transitions = rollout._unroll_from(
        env,
        carry.env_states,
        networks,
        carry.network_states,
        config.rollout_length,
        fresh_env_states,
    )
    logged = _logged_rollout_metrics(transitions.metrics, config.logging_level)
    return Collected(network_states, env_states, transitions.replace(metrics=logged))


def _learn_from(
    config: PPOConfig,
    networks: StatefulModule,
    optimizer: nnx.Optimizer,
    carry: StepCarry,
    collected: Collected,
) -> tuple[StepCarry, StepReport]:
    """Score the rollout, learn from it, fold statistics, advance the carry and key."""
    keys = _step_keys(carry.key)
    transitions = collected.transitions
    scored = transitions  # the critic learns returns of rewards * reward_scaling
    if config.reward_scaling != 1.0:
        scale = config.reward_scaling
        scored = transitions.replace(rewards=jax.tree.map(lambda r: r * scale, transitions.rewards))
    advantages, targets = compute_advantages(scored, config.gae_lambda, config.discounting_factor)
    data = _LearnData(carry.network_states, scored, advantages, targets)
    diagnostics, ran = _learn(networks, optimizer, data, keys.learn, config)
    statistics_finite = _update_statistics_checked(networks, transitions.rollout_extras)
    ended = rollout.episode_ended(transitions.done)
    running, episodes = track_episodes(carry.running, transitions.rewards, ended)
    metrics = _step_metrics(networks, transitions, advantages, targets, diagnostics, ran, config)
    health = {
        "loss_finite": jnp.isfinite(diagnostics["losses/total"]) | ~ran[:, None],
        "parameters_finite": _finite_leaves(nnx.state(networks, nnx.Param)),
        "statistics_finite": statistics_finite,
        "rewards_finite": _finite_leaves(transitions.rewards),
        "observations_finite": {
            field + path: finite
            for field in ("obs", "next_obs")
            for path, finite in _finite_leaves(getattr(transitions, field)).items()
        },
    }
    advanced = StepCarry(collected.network_states, collected.env_states, running, keys.following)
    return advanced, StepReport(metrics, episodes, health)


def _step_metrics(
    networks: StatefulModule,
    transitions: Transition,
    advantages: PyTree[FloatHistory],
    targets: PyTree[FloatHistory],
    diagnostics: dict[str, Any],
    ran: Bool[Array, " E"],
    config: PPOConfig,
) -> dict[str, Float[Array, ""]]:
    values = transitions.network_output.value_estimates
    loss_metrics = diagnostics | {
        "losses/epochs_completed": jnp.sum(ran),
        "losses/advantages": advantages,
        "losses/explained_variance": jax.tree.map(
            lambda v, t: fraction_explained(variance(t - v), t), values, targets
        ),
    }
    metrics = compute_metrics(
        loss_metrics, transitions, config.logging_level, config.logging_percentiles
    )
    if LoggingLevel.WEIGHTS in config.logging_level:
        log_weight_stats(metrics, networks, config.logging_percentiles)
    return metrics


class _EnvArgument:
    """A jit static argument that is an env, equal only to itself (envs need not hash)."""

    def __init__(self, env: RLEnv) -> None:
        self.env = env

    def __hash__(self) -> int:
        return id(self.env)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _EnvArgument) and other.env is self.env


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_OPTIMIZER_FIELDS = frozenset(
    {
        "total_steps",
        "learning_rate",
        "learning_rate_schedule",
        "gradient_clipping",
        "weight_decay",
        "iterations_per_call",
    }
)
"""Config fields no compiled step reads (they shape the run or the optimizer): PPOConfig's,
and DistillationConfig's of the same names."""

_Config = TypeVar("_Config", bound="DataclassInstance")


class _ConfigArgument(Generic[_Config]):
    """A jit static argument holding a snapshot of a (mutable) config dataclass.

    Equal to another when every field the step reads is equal, so a run with a
    different ``total_steps`` or learning rate reuses the compiled step.
    """

    def __init__(self, config: _Config) -> None:
        self.config = copy.deepcopy(config)
        self.key = tuple(
            getattr(self.config, f.name)
            for f in dataclasses.fields(self.config)
            if f.name not in _OPTIMIZER_FIELDS
        )

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ConfigArgument) and other.key == self.key


class _GraphArgument:
    """A jit static argument holding a graph definition; its hash is computed once.

    ``GraphDef`` hashes its whole node list on every call (0.14-0.18 ms for the
    benchmark networks), and a one-step call passes it to two programs. The step
    keeps one of these per network layout (:func:`_split`), so a call's cache
    lookup hashes nothing and compares by identity.
    """

    __slots__ = ("_hash", "graphdef")

    def __init__(self, graphdef: nnx.GraphDef[Any]) -> None:
        self.graphdef = graphdef
        self._hash: int | None = None

    def __hash__(self) -> int:
        if self._hash is None:  # lazily: an unhashable static value fails in jit's own words
            self._hash = hash(self.graphdef)
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _GraphArgument) and (
            other.graphdef is self.graphdef or other.graphdef == self.graphdef
        )


def _scan_steps(
    env: _EnvArgument,
    config: _ConfigArgument[PPOConfig],
    graph: _GraphArgument,
    state: nnx.State,
    carry: StepCarry,
    iterations: int,
) -> tuple[nnx.State, StepCarry, StepReport]:
    """``iterations`` PPO steps; the reports stacked on a leading axis."""
    n_envs = config.config.n_envs

    def one_step(
        scanned: tuple[nnx.State, StepCarry], _: None
    ) -> tuple[tuple[nnx.State, StepCarry], StepReport]:
        state, carry = scanned
        as_given = _typed_as_given(state)
        networks, optimizer = nnx.merge(graph.graphdef, state)
        carry, report = _train_step(env.env, config.config, networks, optimizer, carry)
        network_states, env_states, running = sharding.constrain_envs(
            (carry.network_states, carry.env_states, carry.running), n_envs
        )
        carry = StepCarry(network_states, env_states, running, carry.key)
        state = sharding.constrain_replicated(as_given(nnx.state((networks, optimizer))))
        return (state, carry), sharding.constrain_replicated(report)

    (state, carry), reports = jax.lax.scan(one_step, (state, carry), None, length=iterations)
    return state, carry, reports


_compiled_steps = TrainingProgram(_scan_steps, static_argnums=(0, 1, 2, 5))
"""One run's ``iterations`` PPO steps in one program."""


@training_jit(0, 2)
def _compiled_reset(env: _EnvArgument, key: PRNGKeyArray, n_envs: int) -> EnvState:
    """:func:`_reset_from` compiled: the initial reset and each one-step call's fresh env
    states, one program per env and ``n_envs``."""
    return _reset_from(env.env, key, n_envs)


@training_jit(0, 1, 2)
def _compiled_collect(
    env: _EnvArgument,
    config: _ConfigArgument[PPOConfig],
    graph: _GraphArgument,
    state: nnx.State,
    carry: StepCarry,
    fresh_env_states: EnvState,
) -> Collected:
    """One PPO step's rollout, a program of its own (see :func:`_run_steps`)."""
    networks, _ = nnx.merge(graph.graphdef, state)
    return _collect(env.env, config.config, networks, carry, fresh_env_states)


@training_jit(0, 1, 2)
def _compiled_learn(
    env: _EnvArgument,
    config: _ConfigArgument[PPOConfig],
    graph: _GraphArgument,
    state: nnx.State,
    carry: StepCarry,
    collected: Collected,
) -> tuple[nnx.State, StepCarry, StepReport]:
    """The rest of the PPO step that collected ``collected``; its report stacked as one step's.

    ``env`` is not used: the three programs of a step take the same leading arguments.
    Called through :func:`_learning_arguments`, which leaves the env states out.
    """
    del env
    as_given = _typed_as_given(state)
    networks, optimizer = nnx.merge(graph.graphdef, state)
    carry, report = _learn_from(config.config, networks, optimizer, carry, collected)
    learned = as_given(nnx.state((networks, optimizer)))
    return learned, carry, jax.tree.map(lambda leaf: leaf[None], report)


def _learning_arguments(arguments: tuple[Any, ...], collected: Collected) -> tuple[Any, ...]:
    """:func:`_compiled_learn`'s arguments: the step's, and ``collected``, without env states.

    The learning reads no env state; the next carry's are the rollout's, which the
    host passes on (:func:`_dispatch`). A MuJoCo Playground env's state is about
    100 arrays, each flattened and checked when a program is called: passed in
    twice and out once, they made the learning's call two to three times as slow
    to dispatch (config A of ``benchmarks/``: 2.3-4.7 ms against 1.3-1.6 ms).
    """
    *leading, carry = arguments
    return (*leading, carry._replace(env_states=None), collected._replace(env_states=None))


_RUN_AXIS = "stacked_runs"
"""The ``vmap`` axis of stacked runs in :func:`_compiled_run_steps`."""


@training_jit(0, 1, 2, 5, 6)
def _compiled_run_steps(
    env: _EnvArgument,
    config: _ConfigArgument[PPOConfig],
    graph: _GraphArgument,
    states: nnx.State,
    carries: StepCarry,
    iterations: int,
    mesh: Mesh | None = None,
) -> tuple[nnx.State, StepCarry, StepReport]:
    """Several runs' ``iterations`` PPO steps in one program: ``vmap`` over a leading run axis.

    With a ``mesh`` (:func:`~nnx_ppo.algorithms.sharding.runs_mesh`), each device trains its
    own share of the runs (``shard_map``): no run's data crosses devices, and the
    branches a step takes "in any run" are decided among the device's own runs.
    """

    def one_run(state: nnx.State, carry: StepCarry) -> tuple[nnx.State, StepCarry, StepReport]:
        return _scan_steps(env, config, graph, state, carry, iterations)

    def runs(states: nnx.State, carries: StepCarry) -> tuple[nnx.State, StepCarry, StepReport]:
        # On CPU, several runs' draws outgrow the loop JAX hashes its keys with
        # (nnx_ppo._threefry): they hash the same numbers without it.
        straight = jax.default_backend() == "cpu" and carries.key.shape[0] > 1
        if straight:
            states, carries = _with_straight_line_keys(states, carries)
        with rollout._across_runs(_RUN_AXIS), rollout._env_draws_straight_line(straight):
            trained = jax.vmap(one_run, axis_name=_RUN_AXIS)(states, carries)
        return standard_keys(trained) if straight else trained

    if mesh is None:
        return runs(states, carries)
    split = PartitionSpec(sharding.RUNS_AXIS)
    # Every value inside is per device; the only collective sums over the vmap axis.
    return jax.shard_map(
        runs, mesh=mesh, in_specs=(split, split), out_specs=split, check_vma=False
    )(states, carries)


def _with_straight_line_keys(state: nnx.State, carry: StepCarry) -> tuple[nnx.State, StepCarry]:
    """``state`` and ``carry`` with the library's keys as straight-line keys
    (``nnx_ppo._threefry``). The env states keep JAX's keys: they are the env's own
    (see :func:`_reset_from`)."""
    state, keyed = straight_line_keys((state, carry._replace(env_states=None)))
    return state, keyed._replace(env_states=carry.env_states)


def _on_device(tree: Tree) -> Tree:
    """Committed, strongly typed arrays: what the compiled step returns, so it never retraces."""

    def canonical(x: Any) -> Any:
        if isinstance(x, jax.Array) and not getattr(x, "weak_type", False):
            return x
        return jnp.asarray(x, dtype=jnp.asarray(x).dtype)

    return jax.tree.map(canonical, tree)


def _abstract(
    tree: PyTree[jax.ShapeDtypeStruct | jax.Array | np.ndarray | bool | int | float],
    placement: jax.sharding.Sharding | None,
    leading: tuple[int, ...] = (),
    *,
    weak_types: bool = False,
) -> PyTree[jax.ShapeDtypeStruct]:
    """``tree`` as strongly typed ``jax.ShapeDtypeStruct`` leaves placed on ``placement``,
    each with ``leading`` axes in front: what :func:`_on_device` (or a stack of
    ``leading`` such trees) would hand a compiled program, for compiling it ahead.

    A leaf may also be a Python number or a NumPy array (a network's Variable may hold
    one): it is abstracted as JAX would hold it, ``1.0`` as ``float32[]`` without x64,
    and with ``weak_types`` weakly typed, as a network's state is passed (not through
    :func:`_on_device`).
    """

    def like(leaf: Any) -> jax.ShapeDtypeStruct:
        held = jax.typeof(leaf)
        return jax.ShapeDtypeStruct(
            (*leading, *held.shape),
            held.dtype,
            sharding=placement,
            weak_type=weak_types and held.weak_type,
        )

    return jax.tree.map(like, tree)


def _no_running_episodes(env_states: EnvState) -> RunningEpisodes:
    # Zeros made by NumPy and transferred: jnp.zeros would compile a program per shape
    # and dtype at start-up (0.03-0.07 s apiece).
    n_envs = rollout.n_envs_of(env_states)
    return RunningEpisodes(
        returns=jax.tree.map(
            lambda r: jax.device_put(np.zeros(n_envs, _episode_sum_dtype(r.dtype))),
            env_states.reward,
        ),
        lengths=jax.device_put(np.zeros(n_envs, np.int32)),
    )


def _raise_if_diverged(health: dict[str, Any], steps: int) -> None:
    """Raise ``FloatingPointError`` naming the step and the first non-finite quantity."""
    rewards = [name for name, finite in health["rewards_finite"].items() if not finite]
    if rewards:  # the env's, which a loss of NaN would otherwise hide
        raise FloatingPointError(
            f"PPO step ending at env step {steps}: the env returned NaN or infinite rewards "
            f"(reward{rewards[0] if rewards[0] else ''}), so the loss is too; the network "
            "and optimizer are left as they were before the call."
        )
    observations = [name for name, finite in health["observations_finite"].items() if not finite]
    # What the network saw first (a reset's or a step's obs) before what a step reached.
    observations.sort(key=lambda name: not name.startswith("obs"))
    if observations:  # named only where the step diverged: an unread inf may be harmless
        raise FloatingPointError(
            f"PPO step ending at env step {steps}: the env returned NaN or infinite "
            f"observations ({observations[0]}; next_obs holds those a step reached, before "
            "any reset), and the step diverged; the network and optimizer are left as they "
            "were before the call."
        )
    bad_updates = np.argwhere(~np.asarray(health["loss_finite"]))
    if bad_updates.size:
        epoch, minibatch = bad_updates[0]
        raise FloatingPointError(
            f"PPO step ending at env step {steps}: the loss is NaN or infinite "
            f"(epoch {epoch}, minibatch {minibatch}); the network and optimizer are left as "
            "they were before the call."
        )
    names = [name for name, finite in health["parameters_finite"].items() if not finite]
    if names:
        raise FloatingPointError(
            f"PPO step ending at env step {steps}: parameters became NaN or infinite: "
            + ", ".join(names[:5])
            + "; the network and optimizer are left as they were before the call."
        )
    names = [name for name, finite in health["statistics_finite"].items() if not finite]
    if names:
        raise FloatingPointError(
            f"PPO step ending at env step {steps}: running statistics became NaN or infinite "
            "in update_statistics: "
            + ", ".join(names[:5])
            + f" ({_STATISTICS_OVERFLOW_HINT}); the network and optimizer are left as they "
            "were before the call."
        )


def _require_training_state(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, TrainingState):
        raise TypeError(
            f"{owner}: {name} must be a TrainingState (from new_training_state or a "
            f"checkpoint), got a {type(value).__name__}"
        )


_PPO_STEP_030_ARGUMENTS = (
    "n_envs",
    "rollout_length",
    "gae_lambda",
    "discounting_factor",
    "clip_range",
    "normalize_advantages",
    "combine_advantages",
    "n_epochs",
    "n_minibatches",
    "critic_loss_weight",
    "logging_level",
    "logging_percentiles",
)
"""nnx-ppo 0.3.0's ``ppo_step`` arguments after ``env`` and ``training_state``, in order."""


_Step: TypeAlias = Callable[
    [RLEnv, TrainingState, PPOConfig], tuple[TrainingState, dict[str, float]]
]


def _refuse_030_arguments(given: tuple[Any, ...], keywords: dict[str, Any]) -> None:
    """Name the :class:`PPOConfig` that 0.3.0's separate ``ppo_step`` arguments make, or,
    beside a config, the fields of it that the other arguments are."""
    config_given = keywords.get("config", given[0] if given else None)
    if isinstance(config_given, PPOConfig):
        extra = [*given[1:], *(value for name, value in keywords.items() if name != "config")]
        fields = ", ".join(f"{name}=..." for name in keywords if name != "config")
        where = (
            f"set {fields} on the PPOConfig instead, e.g. dataclasses.replace(config, {fields})"
            if fields
            else f"{len(extra)} more argument(s) were given after it"
        )
        raise TypeError(
            f"ppo_step takes (env, training_state, config) and no more arguments: {where}."
        )
    fields = dict(zip(_PPO_STEP_030_ARGUMENTS, given, strict=False)) | keywords
    config = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    raise TypeError(
        "ppo_step takes (env, training_state, config): nnx-ppo 0.3.0's separate arguments "
        f"are the fields of one PPOConfig. Call ppo_step(env, training_state, "
        f"PPOConfig({config})) (the docs' migration page lists every change)."
    )


def _explaining_030_calls(step: _Step) -> _Step:
    """``step``, which names the :class:`PPOConfig` a call with 0.3.0's separate
    arguments means, where Python would say only how many arguments it got."""

    @functools.wraps(step)
    def call(
        env: RLEnv, training_state: TrainingState, *rest: Any, **keywords: Any
    ) -> tuple[TrainingState, dict[str, float]]:
        if len(rest) > 1 or set(keywords) - {"config"}:
            _refuse_030_arguments(rest, keywords)
        return step(env, training_state, *rest, **keywords)

    return call


@_explaining_030_calls
def ppo_step(
    env: RLEnv, training_state: TrainingState, config: PPOConfig
) -> tuple[TrainingState, dict[str, float]]:
    """One PPO step: collect ``n_envs * rollout_length`` steps and learn from them.

    Compiled once per (env, network structure, config) and reused. Updates the
    network and optimizer in place (NNX semantics) and returns the advanced state.
    Learning uses the optimizer the state holds: ``config``'s optimizer fields
    (``learning_rate``, ``learning_rate_schedule``, ``gradient_clipping``,
    ``weight_decay``) are not read here; :func:`new_training_state` takes them.

    Returns:
      The new training state, and the step's metrics as a flat ``str -> float``
      dict (with ``total_steps``).

    Raises:
      TypeError: ``training_state`` is not a :class:`~nnx_ppo.algorithms.types.TrainingState` or
        ``config`` not a :class:`~nnx_ppo.algorithms.config.PPOConfig`.
      ValueError: the state holds a different number of envs than ``config.n_envs``,
        or a field of ``config`` is invalid (it is checked again here, in case it
        changed after the config was built).
      ContractError: the state's env states are not batched.
      FloatingPointError: the loss or a parameter became NaN or infinite; the
        network and optimizer are then left as they were before the call.
    """
    training_state, (metrics,) = _run_steps("ppo_step", env, training_state, config, 1)
    return training_state, metrics


def ppo_steps(
    env: RLEnv, training_state: TrainingState, config: PPOConfig, iterations: int
) -> tuple[TrainingState, list[dict[str, float]]]:
    """``iterations`` PPO steps in one compiled call: one round-trip to the host.

    The same steps, in the same order and with the same random keys, as calling
    :func:`ppo_step` ``iterations`` times; nothing reaches the host in between,
    so it saves the per-step synchronisation when no evaluation, checkpoint or
    log is needed until the last. Compiled once per ``iterations`` value.

    Returns:
      The new training state, and one metrics dict per step, in order.

    Raises:
      The errors of :func:`ppo_step`; a NaN or infinite loss names the step it
      happened in.
    """
    return _run_steps("ppo_steps", env, training_state, config, iterations)


def require_env_count(owner: str, training_state: TrainingState, config: PPOConfig) -> None:
    """Raise unless ``training_state`` holds ``config.n_envs`` envs."""
    n_envs = rollout.n_envs_of(training_state.env_states, owner)
    if n_envs != config.n_envs:
        raise ValueError(
            f"{owner}: the training state holds {n_envs} envs, but config.n_envs is {config.n_envs}"
        )


def _prepared(owner: str, training_state: TrainingState, config: PPOConfig) -> TrainingState:
    """The state checked against ``config``, its episodes tracked, its arrays on device."""
    _require_training_state(owner, "training_state", training_state)
    if not isinstance(config, PPOConfig):
        raise TypeError(f"{owner}: config must be a PPOConfig, got a {type(config).__name__}")
    require_env_count(owner, training_state, config)
    running = training_state.running_episodes
    if running is None:
        running = _no_running_episodes(training_state.env_states)
    network_states, env_states, running = _on_device(
        (training_state.network_states, training_state.env_states, running)
    )
    return training_state.replace(
        network_states=network_states, env_states=env_states, running_episodes=running
    )


def _carry_of(training_state: TrainingState) -> StepCarry:
    """The compiled step's carry from a state that went through :func:`_prepared`."""
    running = training_state.running_episodes
    assert running is not None, "_prepared fills running_episodes"
    return StepCarry(
        training_state.network_states, training_state.env_states, running, training_state.rng_key
    )


def _compile_ahead(
    env: RLEnv, training_state: TrainingState, config: PPOConfig, iterations: int
) -> None:
    """Compile the programs ``ppo_steps(env, training_state, config, iterations)`` runs.

    ``training_state`` is a fresh single-device state, as :func:`_prepared` leaves
    it, except that its env states may be abstract (``jax.ShapeDtypeStruct``
    leaves placed as the real ones will be). JAX keeps the traced, lowered and
    compiled programs, and the real call, with the same shapes and placement,
    runs them. One step's two programs compile in parallel.
    """
    split = _split((training_state.networks, training_state.optimizer))
    arguments = _program_arguments(env, config, split, training_state)
    if iterations != 1:
        _compiled_steps.lower(*arguments, iterations).compile()
        return
    # The fresh env states are shaped and placed as the env states: both come from the reset.
    fresh = training_state.env_states
    collect = _compiled_collect.lower(*arguments, fresh)
    placement = getattr(jax.tree.leaves(fresh)[0], "sharding", None)
    collected = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=placement, weak_type=leaf.weak_type
        ),
        collect.out_info,
    )
    learn = _compiled_learn.lower(*_learning_arguments(arguments, collected))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        learning = pool.submit(learn.compile)
        collect.compile()
        learning.result()


def _fresh_env_states(env: RLEnv, training_state: TrainingState, n_envs: int) -> EnvState:
    """The next step's fresh env states, from the reset program (the initial state's)."""
    return _compiled_reset(_EnvArgument(env), _reset_key(training_state.rng_key), n_envs)


def _program_arguments(
    env: RLEnv, config: PPOConfig, split: _Split, training_state: TrainingState
) -> tuple[Any, ...]:
    """The leading arguments of the step's programs, for the step from ``training_state``."""
    return (
        _EnvArgument(env),
        _ConfigArgument(config),
        split.graph,
        split.state,
        _carry_of(training_state),
    )


def _advanced(training_state: TrainingState, carry: StepCarry, steps_taken: int) -> TrainingState:
    """``training_state`` after the steps that ended with ``carry`` at ``steps_taken``."""
    return training_state.replace(
        network_states=carry.network_states,
        env_states=carry.env_states,
        rng_key=carry.key,
        steps_taken=steps_taken,
        running_episodes=carry.running,
    )


def _host_metrics(
    reports: StepReport, steps_taken: int, config: PPOConfig, iterations: int
) -> list[dict[str, float]]:
    """Each step's flat metrics, from reports fetched to the host; raises if one diverged.

    Each metric's column of ``iterations`` values is converted at once: a
    conversion per step and metric took about 25 us a step, 0.2 s after a
    whole-run call of 8 runs of the small config (977 steps each).
    """
    steps = [steps_taken + (i + 1) * config.steps_per_iteration for i in range(iterations)]
    diverged = _first_diverged(reports.health, iterations)
    if diverged is not None:
        _raise_if_diverged(_index(reports.health, diverged), steps[diverged])
    columns = {
        name: np.asarray(values, np.float64).tolist()
        for name, values in jax.device_get(dict(reports.metrics)).items()
    }
    per_step = [
        {name: column[i] for name, column in columns.items()} | {"total_steps": float(step)}
        for i, step in enumerate(steps)
    ]
    if LoggingLevel.ROLLOUT_STATS in config.logging_level:
        for i, host_metrics in enumerate(per_step):
            host_metrics |= episode_metrics(_index(reports.episodes, i))
    return per_step


def _first_diverged(health: dict[str, Any], iterations: int) -> int | None:
    """The first of ``iterations`` stacked steps whose loss, parameters or statistics are
    not finite."""
    finite = np.asarray(health["loss_finite"]).reshape(iterations, -1).all(axis=1)
    for group in ("parameters_finite", "statistics_finite"):
        for flags in health[group].values():
            finite &= np.asarray(flags).reshape(iterations)
    bad = np.flatnonzero(~finite)
    return int(bad[0]) if bad.size else None


class _Split(NamedTuple):
    """A module pair split for the compiled step, and the Variables its state came from."""

    graph: _GraphArgument
    state: nnx.State
    variables: list[nnx.Variable[Any]]


_LAYOUTS: dict[Any, tuple[_GraphArgument, Any]] = {}
"""Graph definition and state treedef by the pair's pytree structure (Variables as leaves)."""

_MAX_LAYOUTS = 16


def _split(pair: tuple[StatefulModule, nnx.Optimizer]) -> _Split:
    """``nnx.split(pair)``, without walking the graph again for a structure seen before.

    A call per PPO step walked the module graph twice (``nnx.split`` and
    ``nnx.update``), several milliseconds a call. The pair's pytree structure
    with its Variables as leaves is a cheap key: it changes with any attribute,
    static value or Variable type (not with a Variable's metadata, which nothing
    changes during training). A pair in which a Variable is reachable twice
    (shared), or whose static values cannot be hashed, is always split in full.
    The state holds the Variables' raw values, as ``nnx.split``'s does.
    """
    variables, treedef = jax.tree.flatten(pair, is_leaf=lambda x: isinstance(x, nnx.Variable))
    key = (treedef, tuple(type(v) for v in variables))
    try:
        layout = _LAYOUTS.get(key)
    except (TypeError, ValueError):  # a static value that cannot be hashed or compared
        graphdef, state = nnx.split(pair)
        return _Split(_GraphArgument(graphdef), state, variables=[])
    unshared = len({id(v) for v in variables}) == len(variables)
    if layout is not None and unshared:
        graph, state_treedef = layout
        return _Split(
            graph,
            jax.tree.unflatten(state_treedef, [v.get_raw_value() for v in variables]),
            variables,
        )
    graphdef, state = nnx.split(pair)
    graph = _GraphArgument(graphdef)
    leaves, state_treedef = jax.tree.flatten(state)
    same_order = len(leaves) == len(variables) and all(
        isinstance(v, nnx.Variable) and leaf is v.get_raw_value()
        for leaf, v in zip(leaves, variables, strict=False)
    )
    if unshared and same_order:
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        _LAYOUTS[key] = (graph, state_treedef)
    return _Split(graph, state, variables if same_order else [])


def _write_back(
    split: _Split, pair: tuple[StatefulModule, nnx.Optimizer], state: nnx.State
) -> None:
    """``nnx.update(pair, state)``, through the Variables :func:`_split` found.

    Like ``nnx.update``, it replaces each Variable's raw value (``set_value`` would
    also copy the value and look for array references: 6-11 us a Variable).
    """
    if not split.variables:
        nnx.update(pair, state)
        return
    for variable, value in zip(split.variables, jax.tree.leaves(state), strict=True):
        variable.set_raw_value(value)


class InFlight(NamedTuple):
    """PPO steps dispatched to the device, their results not yet fetched by the host.

    JAX runs them asynchronously: the host may dispatch the steps after them
    (:func:`dispatch_next`) before :func:`finish` fetches these, so the device
    does not wait for the host between calls.
    """

    start: TrainingState
    """The state the steps start from; its network and optimizer are written at :func:`finish`."""
    config: PPOConfig
    iterations: int
    split: _Split
    new_state: nnx.State
    carry: StepCarry
    reports: StepReport
    dispatched_at: float
    """The host's ``time.perf_counter()`` as the dispatch began."""

    @property
    def steps_after(self) -> int:
        """The env steps taken once these steps are done."""
        return self.start.steps_taken + self.iterations * self.config.steps_per_iteration


def _dispatch(
    env: RLEnv, start: TrainingState, config: PPOConfig, split: _Split, iterations: int
) -> InFlight:
    """Run the compiled steps from ``start`` (whose module state is ``split.state``), async."""
    dispatched_at = time.perf_counter()
    mesh = sharding.mesh_of(start)
    arguments = _program_arguments(env, config, split, start)
    if iterations == 1 and mesh is None:
        # One step as three programs: the reset (the initial state's), the rollout and
        # the learning. The step's own two compile in parallel, without a reset in them.
        collected = _compiled_collect(*arguments, _fresh_env_states(env, start, config.n_envs))
        new_state, carry, reports = _compiled_learn(*_learning_arguments(arguments, collected))
        carry = carry._replace(env_states=collected.env_states)
    else:
        with sharding.training_mesh(mesh):
            new_state, carry, reports = _compiled_steps(*arguments, iterations)
    return InFlight(start, config, iterations, split, new_state, carry, reports, dispatched_at)


def dispatch_steps(
    owner: str, env: RLEnv, training_state: TrainingState, config: PPOConfig, iterations: int
) -> InFlight:
    """Check ``training_state`` against ``config`` and dispatch ``iterations`` steps from it."""
    require_int(owner, "iterations", iterations)
    training_state = _prepared(owner, training_state, config)
    mesh = sharding.mesh_of(training_state)
    if mesh is not None:
        sharding.require_divisible(owner, mesh, config.n_envs, config.n_minibatches, None)
        training_state = sharding.shard_training_state(training_state, mesh)
    split = _split((training_state.networks, training_state.optimizer))
    return _dispatch(env, training_state, config, split, iterations)


def dispatch_next(env: RLEnv, in_flight: InFlight, iterations: int) -> InFlight:
    """Dispatch ``iterations`` steps after ``in_flight``'s, from its results on the device.

    Nothing is fetched or written: if ``in_flight`` turns out to have diverged,
    or the caller stops, the steps dispatched here are dropped unseen.
    """
    start = _advanced(in_flight.start, in_flight.carry, in_flight.steps_after)
    split = in_flight.split._replace(state=in_flight.new_state)
    return _dispatch(env, start, in_flight.config, split, iterations)


def finish(in_flight: InFlight) -> tuple[TrainingState, list[dict[str, float]]]:
    """Fetch ``in_flight``'s reports, check them, and write its results to the network.

    Raises ``FloatingPointError`` before the network is touched if a step diverged.
    """
    start = in_flight.start
    per_step = _host_metrics(
        StepReport(*jax.device_get(in_flight.reports)),
        start.steps_taken,
        in_flight.config,
        in_flight.iterations,
    )
    _write_back(in_flight.split, (start.networks, start.optimizer), in_flight.new_state)
    return _advanced(start, in_flight.carry, in_flight.steps_after), per_step


def _run_steps(
    owner: str, env: RLEnv, training_state: TrainingState, config: PPOConfig, iterations: int
) -> tuple[TrainingState, list[dict[str, float]]]:
    if isinstance(training_state, TrainingState):
        require_called_eagerly(owner, training_state.rng_key)
    if isinstance(config, PPOConfig):
        config.validate()  # a field may have changed since the config was built
    in_flight = dispatch_steps(owner, env, training_state, config, iterations)
    # Called inside a transform with a state it closes over: the programs ran traced.
    require_called_eagerly(owner, in_flight.reports.health)
    return finish(in_flight)


def _index(tree: Tree, i: int) -> Tree:
    return jax.tree.map(lambda leaf: leaf[i], tree)
