"""Collecting experience: training rollouts with episode resets, and evaluation episodes.

The library vmaps the env's ``reset`` and ``step`` over ``n_envs`` here, and
only here. While JAX traces, every state the env returns is checked against the
env contract (:mod:`nnx_ppo.contract.env_checks`), so an env that changes a
dtype or returns a batched reward fails with a message naming the field.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NamedTuple, TypeAlias, TypeVar

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Integer, PRNGKeyArray, PyTree, Shaped

from nnx_ppo._threefry import standard_keys, straight_line_keys
from nnx_ppo.algorithms import sharding
from nnx_ppo.algorithms._removed import missing_attribute
from nnx_ppo.algorithms.metrics import _episode_sum_dtype, has_reward_leaves, summarize
from nnx_ppo.algorithms.recording import (
    SlimData,
    SlimState,
    eval_rollout_for_render_scan,
    record_activations_rollout,
    unstack_trajectory,
)
from nnx_ppo.algorithms.types import EnvState, LoggingLevel, RLEnv, Shared, Transition
from nnx_ppo.contract import ContractError, checks_enabled
from nnx_ppo.contract.arguments import one_key_ndim, require_int
from nnx_ppo.contract.axes import (
    Batched,
    BatchedTree,
    BoolHistory,
    Carry,
    FloatBatch,
    FloatHistory,
    History,
    Mask,
    PerEnvKeys,
    Unbatched,
    align_leading,
)
from nnx_ppo.contract.checking import describe_leaf, is_key, typechecked
from nnx_ppo.contract.env_checks import (
    check_action_tree,
    check_env_keeps_no_tracer,
    check_env_reset_key,
    check_env_state,
    check_given_env_state,
    plain_values,
    single_state_shapes,
)
from nnx_ppo.contract.errors import rule_text
from nnx_ppo.envs.state import (
    _holds_shared,
    _is_shared,
    _vmap_reset,
    _vmap_step,
    episode_flags,
)
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, checked_ppo_output

__all__ = [
    "SlimData",
    "SlimState",
    "episode_ended",
    "episode_flags",
    "eval_rollout",
    "eval_rollout_for_render_scan",
    "n_envs_of",
    "per_reward_leaf",
    "record_activations_rollout",
    "record_episode",
    "reset_envs",
    "scan_module",
    "tree_where",
    "unmapped_state_paths",
    "unroll_env",
    "unstack_trajectory",
]


def __getattr__(name: str) -> Any:
    raise missing_attribute(__name__, name)


Tree = TypeVar("Tree")
ScanCarry = TypeVar("ScanCarry")
_Scanned: TypeAlias = PyTree[Shaped[Array, "T ..."]]
"""What :func:`scan_module` scans over or stacks: leaves ``(T, ...)`` (``None``: no leaves)."""
_ScanSlice: TypeAlias = PyTree[Shaped[Array, "..."]]
"""One step of it: a leaf of :data:`_Scanned` without its ``T``."""


@typechecked
def tree_where(
    cond: Mask,
    on_true: Tree,
    on_false: Tree,
    unmapped: Collection[str] = frozenset(),
) -> Tree:
    """Per environment, pick ``on_true``'s slice where ``cond`` holds, else ``on_false``'s.

    The rule is explicit: every array leaf leads with the env axis ``B`` and is
    selected along it, except two kinds of leaves that carry no env axis and pass
    through as ``on_false`` has them (the stepped state keeps its shared handles):
    those in a :class:`~nnx_ppo.envs.state.Shared` node, and those whose
    path (``jax.tree_util.keystr``) is in ``unmapped``: the env's vmap left them
    unbatched (e.g. MJX's model-wide fields; see :func:`unmapped_state_paths`).
    Any other leaf that does not lead with ``B`` is an error, never silently
    passed through.

    Raises:
      ContractError: a leaf of either tree does not lead with ``B``; the message names it.
    """

    def require_env_axis(side: str, path: Any, leaf: Any) -> None:
        shape = getattr(leaf, "shape", None)
        if shape is None or tuple(shape[:1]) != tuple(cond.shape):
            raise ContractError.violation(
                "tree_where",
                f"a leaf of {side} does not lead with the env axis B.",
                leaf="state" + jax.tree_util.keystr(path),
                expected=f"(B={cond.shape[0]}, ...)",
                found="not an array" if shape is None else f"shape {tuple(shape)}",
                rule=rule_text(
                    "every per-env leaf leads with B; wrap leaves that carry no env axis in "
                    "nnx_ppo.envs.state.Shared",
                    "the-contract",
                    "environments",
                ),
            )

    def select(path: Any, when_true: Any, when_false: Any) -> Any:
        if isinstance(when_true, Shared) or jax.tree_util.keystr(path) in unmapped:
            return when_false
        # Both sides: jnp.where would broadcast an on_false leaf without B over the envs.
        require_env_axis("on_true", path, when_true)
        require_env_axis("on_false", path, when_false)
        return jnp.where(align_leading(cond, when_true), when_true, when_false)

    return jax.tree_util.tree_map_with_path(
        select, on_true, on_false, is_leaf=lambda node: isinstance(node, Shared)
    )


def scan_module(
    module: StatefulModule,
    body: Callable[[StatefulModule, ScanCarry, _ScanSlice], tuple[ScanCarry, _ScanSlice]],
    init: ScanCarry,
    xs: _Scanned = None,
    *,
    length: int | None = None,
) -> tuple[ScanCarry, _Scanned]:
    """``jax.lax.scan`` of ``body(module, carry, x)``, the module's variables held fixed.

    ``xs`` leaves are ``(T, ...)`` (``body`` sees one step's ``(...)`` slice), as are the
    stacked outputs of ``body`` it returns. Forward passes never write NNX variables (a
    checked rule), so the module's state goes through the scan unchanged; gradients
    flow through it. It is carried rather than closed over so that the module ``body``
    gets holds variables of the scan's own trace: an NNX transform inside a module's
    ``__call__`` (``nnx.vmap``, ``nnx.scan``, ``nnx.cond``) refuses variables of an
    outer trace.
    """
    # What the module sowed before (an eager call's nnx.Intermediate) is not carried:
    # a sow inside the scan would lengthen it, and the carry must keep its structure.
    graphdef, state, sown = nnx.split(module, nnx.Not(nnx.Intermediate), nnx.Intermediate)

    def step(
        carried: tuple[nnx.State, ScanCarry], x: _ScanSlice
    ) -> tuple[tuple[nnx.State, ScanCarry], _ScanSlice]:
        state, carry = carried
        # Copied here, so that a sow writes variables of the scan's own trace.
        sown_here = jax.tree.map(lambda value: value, sown)
        carry, y = body(nnx.merge(graphdef, state, sown_here), carry, x)
        return (state, carry), y

    (_, final), ys = jax.lax.scan(step, (state, init), xs, length=length)
    return final, ys


def episode_ended(done: PyTree[Bool[Array, "..."]]) -> Bool[Array, "..."]:
    """Whether the environment's episode ended: every leaf of ``done`` holds.

    With one ``done`` per reward leaf (per-agent ends), the episode, and so the
    env reset, waits for the last agent.
    """
    return jax.tree.reduce(jnp.logical_and, done)


class _BatchedEnv:
    """``env.reset`` and ``env.step`` vmapped over envs, checked while JAX traces.

    :class:`~nnx_ppo.envs.state.Shared` nodes of the state are not
    vmapped (``in_axes``/``out_axes`` ``None``): they enter ``step`` and leave
    ``reset`` and ``step`` as one unbatched value. An env whose ``Shared`` value
    depends on the env (e.g. on the reset key) fails in ``vmap``.
    """

    def __init__(self, env: RLEnv) -> None:
        self.env = env
        self.name = type(env).__name__
        self.single_state = single_state_shapes(env)
        self.reference = self.single_state if checks_enabled() else None
        self.has_shared = _holds_shared(self.single_state)
        self._unmapped: frozenset[str] | None = frozenset() if self.has_shared else None

    @property
    def unmapped(self) -> frozenset[str]:
        """The state paths ``vmap`` left without an env axis, read off a batched state."""
        if self._unmapped is None:
            raise RuntimeError("_BatchedEnv.unmapped is known once reset has been traced")
        return self._unmapped

    def adopt(self, states: EnvState) -> EnvState:
        """Batched states built elsewhere (by ``reset_envs``): their unmapped paths are read."""
        if self._unmapped is None:
            self._unmapped = _unmapped_paths(self.single_state, states)
        return states

    def reset(self, keys: PerEnvKeys) -> EnvState:
        def reset_one(key: PRNGKeyArray) -> EnvState:
            check_env_reset_key(key, where=f"{self.name}.reset")
            state = _env_call(self.env.reset, key)
            check_env_state(state, where=f"{self.name}.reset", reference=self.reference)
            return state

        before = plain_values(self.env) if checks_enabled() else None
        states = _vmap_reset(reset_one, self.has_shared)(keys)
        check_env_keeps_no_tracer(self.env, where=f"{self.name}.reset", values_before=before)
        if not self.has_shared:
            self._unmapped = _unmapped_paths(self.single_state, states)
        return states

    def step(self, state: EnvState, actions: BatchedTree) -> EnvState:
        where = f"{self.name}.step"
        check_action_tree(actions, self.env, where=where, batch_size=n_envs_of(state, where))

        def step_one(state: EnvState, action: Unbatched) -> EnvState:
            if self.reference is not None:
                given = f"{where} (the env states given to it)"
                check_given_env_state(state, where=given, reference=self.reference)
            stepped = _env_call(self.env.step, state, action)
            check_env_state(stepped, where=where, reference=self.reference)
            return stepped

        before = plain_values(self.env) if checks_enabled() else None
        stepped = _vmap_step(step_one, self.has_shared)(state, actions)
        check_env_keeps_no_tracer(self.env, where=where, values_before=before)
        return stepped


def unmapped_state_paths(env: RLEnv) -> frozenset[str]:
    """The paths of the env-state leaves that ``vmap`` leaves without an env axis.

    Simulators may declare parts of their state model-wide (MJX's ``Data`` keeps
    some fields out of ``vmap`` with its own batching rule); this reads which,
    from ``vmap``'s own output, by comparing one reset with a vmapped one:
    a leaf whose rank did not grow was not mapped. Computed while tracing.
    """
    batched = jax.eval_shape(jax.vmap(env.reset), jax.random.split(jax.random.key(0), 2))
    return _unmapped_paths(jax.eval_shape(env.reset, jax.random.key(0)), batched)


def _unmapped_paths(single: EnvState, batched: EnvState) -> frozenset[str]:
    """The paths of ``batched``'s leaves whose rank is ``single``'s: ``vmap`` did not map them."""
    return frozenset(
        jax.tree_util.keystr(path)
        for (path, one), many in zip(
            jax.tree_util.tree_flatten_with_path(single)[0],
            jax.tree.leaves(batched),
            strict=True,
        )
        if jnp.ndim(many) == len(one.shape)
    )


def reset_envs(env: RLEnv, keys: PerEnvKeys) -> EnvState:
    """``env.reset`` vmapped over ``keys``, one env per key, checked while JAX traces.

    :class:`~nnx_ppo.envs.state.Shared` nodes of the state stay unbatched.

    Raises:
      ContractError: ``keys`` is not one key per env: one key, or no keys.
    """
    key_ndim = one_key_ndim(keys)
    if checks_enabled() and (key_ndim is None or jnp.ndim(keys) != key_ndim + 1):
        raise ContractError.violation(
            "reset_envs",
            "keys must hold one PRNG key per env, along a leading axis B.",
            leaf="keys",
            expected="typed keys of shape (B,), e.g. jax.random.split(jax.random.key(0), B)",
            found=describe_leaf(keys),
            rule=rule_text(
                "the library holds n_envs env states batched along a leading axis B, each "
                "reset with its own key",
                "the-contract",
            ),
        )
    return _BatchedEnv(env).reset(keys)


def n_envs_of(env_state: EnvState, where: str = "n_envs_of") -> int:
    """The number of environments in a batched env state (the leading axis of ``done``).

    Raises:
      ContractError: a ``done`` leaf has no env axis (an unbatched state); the
        message names the leaf and ``where``, the caller.
    """
    for path, done in jax.tree_util.tree_flatten_with_path(env_state.done)[0]:
        if jnp.ndim(done) == 0:
            raise ContractError.violation(
                where,
                "env_state must be batched, leaves (B, ...), but its done has no env axis.",
                leaf="env_state.done" + jax.tree_util.keystr(path),
                expected="(B,): a batched env state, leaves (B, ...)",
                found=f"shape {jnp.shape(done)}",
                rule=rule_text(
                    "the library holds n_envs env states batched along a leading axis B; "
                    "build them with reset_envs or new_training_state",
                    "the-contract",
                    "environments",
                ),
            )
    return int(jnp.shape(jax.tree.leaves(env_state.done)[0])[0])


def _is_inexact(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def per_reward_leaf(
    flags: BoolHistory | PyTree[BoolHistory], rewards: PyTree[FloatHistory]
) -> PyTree[BoolHistory]:
    """``done``/``truncated`` as a tree like the rewards: one env-wide flag is shared."""
    return jax.tree.map(lambda _: flags, rewards) if isinstance(flags, jax.Array) else flags


_RUN_AXIS: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_axis", default=None)
"""The ``vmap`` axis name of stacked runs while one is being traced, else ``None``."""


@contextlib.contextmanager
def _across_runs(axis_name: str) -> Iterator[None]:
    """While tracing ``jax.vmap(..., axis_name=axis_name)`` over stacked runs.

    A ``lax.cond`` whose predicate varies along a ``vmap`` axis becomes a
    ``select`` that computes both branches. Where a branch only saves work,
    :func:`_in_any_run` decides it for all runs at once, so it stays a branch.
    """
    token = _RUN_AXIS.set(axis_name)
    try:
        yield
    finally:
        _RUN_AXIS.reset(token)


def _in_any_run(flag: Bool[Array, ""]) -> Bool[Array, ""]:
    """``flag`` of this run, or of any stacked run under :func:`_across_runs`."""
    axis = _RUN_AXIS.get()
    return flag if axis is None else jax.lax.psum(flag.astype(jnp.int32), axis) > 0


_STRAIGHT_LINE_ENV_KEYS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "straight_line_env_keys", default=False
)
"""Whether the env's ``reset`` and ``step`` being traced draw with straight-line keys."""


@contextlib.contextmanager
def _env_draws_straight_line(enabled: bool) -> Iterator[None]:
    """While tracing, with ``enabled``: the env's ``reset`` and ``step`` get their keys as
    straight-line keys (``nnx_ppo._threefry``) and hand back JAX's own.

    The several-runs program on CPU hashes its own keys so; an env's draws (a reset's
    initial state, noise from a key kept in the state) would otherwise keep JAX's
    loop, which several runs outgrow: it then runs op by op and takes a large share of
    the program's compile. The numbers are the same, and the env state keeps JAX's
    keys outside the call, so the env sees one key type in all its calls.
    """
    token = _STRAIGHT_LINE_ENV_KEYS.set(enabled)
    try:
        yield
    finally:
        _STRAIGHT_LINE_ENV_KEYS.reset(token)


def _env_call(call: Callable[..., EnvState], *arguments: Any) -> EnvState:
    """``call(*arguments)``, an env's ``reset`` or ``step``, with the keys
    :func:`_env_draws_straight_line` asks for."""
    if not _STRAIGHT_LINE_ENV_KEYS.get():
        return call(*arguments)
    return standard_keys(call(*straight_line_keys(arguments)))


def _values(networks: StatefulModule, carry: Carry, obs: BatchedTree) -> PyTree[FloatBatch]:
    out = networks(carry, obs)
    return checked_ppo_output(out.output, "unroll_env").value_estimates


def _next_values(
    values: PyTree[FloatHistory],
    last_values: PyTree[FloatBatch],
    at_truncation: PyTree[FloatHistory],
    ended: BoolHistory,
    truncated: PyTree[BoolHistory],
) -> PyTree[FloatHistory]:
    """``V(next_obs)`` per step without a second pass over the rollout.

    Where no episode ended, step ``t``'s next observation and carry are step
    ``t + 1``'s own, so its value is ``values[t + 1]`` (``last_values`` after the
    last step). Where one was truncated, the value computed at that step from
    the pre-reset carry is taken; where one terminated, GAE never reads it: 0.
    """

    def leaf(
        value: FloatHistory, last: FloatBatch, cut: FloatHistory, was_cut: BoolHistory
    ) -> FloatHistory:
        following = jnp.concatenate([value[1:], last[None]])
        return jnp.where(ended, jnp.where(was_cut, cut, 0.0), following)

    return jax.tree.map(
        leaf, values, last_values, at_truncation, per_reward_leaf(truncated, values)
    )


def _carry_follows_parameters(networks: StatefulModule, carry: Carry, obs: BatchedTree) -> bool:
    """Whether the network's next carry, or the carry ``reset_state`` starts an episode
    from, depends on a parameter, read from the data flow of the call and the reset.

    Conservative: an operation with a parameter-dependent input taints all of its
    outputs, so a carry is only called parameter-free when no path leads to it.
    """
    graphdef, parameters, rest = nnx.split(networks, nnx.Param, ...)

    def next_carry(parameters: nnx.State, rest: nnx.State) -> tuple[Carry, Carry]:
        network = nnx.merge(graphdef, parameters, rest)
        return network(carry, obs).next_state, network.reset_state(carry)

    jaxpr = jax.make_jaxpr(next_carry)(parameters, rest).jaxpr
    tainted = set(jaxpr.invars[: len(jax.tree.leaves(parameters))])
    for equation in jaxpr.eqns:
        if any(isinstance(v, jex_core.Var) and v in tainted for v in equation.invars):
            tainted.update(equation.outvars)
    return any(isinstance(v, jex_core.Var) and v in tainted for v in jaxpr.outvars)


def _replays_flat(networks: StatefulModule, network_state: Carry, rollout_data: Transition) -> bool:
    """Whether :func:`_replay_flat` may replay this rollout: it kept every step's carry
    (``carries``), and the parameters cannot change the carry, so the stored one is the
    carry a replay would reach."""
    if rollout_data.carries is None:
        return False
    first_obs = jax.tree.map(lambda x: x[0], rollout_data.obs)
    return not _carry_follows_parameters(networks, network_state, first_obs)


def _replay_flat(
    networks: StatefulModule, rollout_data: Transition, where: str
) -> tuple[PPONetworkOutput, Float[Array, " T"]]:
    """Every step of a rollout in one call over ``B * T`` rows, from the stored carries.

    Rows are independent (a forward pass is per-sample pure), so this is a scan's
    result, computed with a few large matrix products instead of ``T`` small
    ones. The rows go env by env (``B`` major): an env axis split over devices
    then stays split, each device replaying its own envs. Each step gets its
    stored ``rollout_extras``. ``where`` names the caller in contract errors.

    Returns:
      The network's output, leaves ``(T, B, ...)``, and its regularisation loss
      per step, ``(T,)``.
    """
    time_steps, n_envs = jax.tree.leaves(rollout_data.rewards)[0].shape

    def flat(x: History) -> Batched:  # (T, B, ...) -> (B * T, ...), env by env
        return jnp.swapaxes(x, 0, 1).reshape((-1, *x.shape[2:]))

    def unflat(x: Batched) -> History:
        return jnp.swapaxes(x.reshape((n_envs, time_steps, *x.shape[1:])), 0, 1)

    out = networks(
        jax.tree.map(flat, rollout_data.carries),
        jax.tree.map(flat, rollout_data.obs),
        jax.tree.map(flat, rollout_data.rollout_extras),
    )
    checked_ppo_output(out.output, where, jax.tree.map(flat, rollout_data.rewards))
    output = jax.tree.map(unflat, out.output)
    regularization = jnp.broadcast_to(out.regularization_loss, (n_envs * time_steps,))
    return output, jnp.mean(regularization.reshape(n_envs, time_steps), axis=0)


def _rollout_values(
    networks: StatefulModule, network_state: Carry, transitions: Transition
) -> PyTree[FloatHistory]:
    """The value of every step's observation, from one flat replay where the carry allows it.

    The env never waits for a value, yet computed in the scan the critic's
    products run at ``n_envs`` rows beside the env's step, and on a CPU they
    contend with it for the cores: config A's rollout took 14.8 ms with its 2 x
    256 critic against 8.4 ms with a critic of 8 units (``benchmarks/README.md``,
    "The rollout's values from one flat replay"). When the rollout kept
    every step's carry and the parameters cannot change it, the values come from
    :func:`_replay_flat` instead, as the loss replays the rollout (its products at
    ``B * T`` rows), and XLA drops the scan's own value products, which nothing
    reads any more. A recurrent carry keeps the values computed in the scan.
    """
    if not _replays_flat(networks, network_state, transitions):
        return transitions.network_output.value_estimates
    return _replay_flat(networks, transitions, "unroll_env")[0].value_estimates


class _RolloutCarry(NamedTuple):
    """The scan carry of :func:`unroll_env`."""

    network_state: Carry
    env_state: EnvState
    pre_reset: Carry
    """The carry the last step ended with, before any reset: the last next value's."""


class _EvalCarry(NamedTuple):
    """The scan carry of :func:`eval_rollout`: per env, the episode so far."""

    network_state: Carry
    env_state: EnvState
    finished: Mask
    returns: PyTree[FloatBatch]
    lifespan: Integer[Array, " B"]
    metric_sums: dict[str, BatchedTree]
    """``{"env": ..., "net": ...}`` (those logged): each metric summed over the episode."""


class _RecordCarry(NamedTuple):
    """The scan carry of :func:`record_episode`: one env (``B`` = 1)."""

    network_state: Carry
    env_state: EnvState
    finished: Mask
    total: FloatBatch
    """The first episode's return so far (reward leaves summed)."""


@typechecked
def unroll_env(
    env: RLEnv,
    env_state: EnvState,
    networks: StatefulModule,
    network_state: Carry,
    unroll_length: int,
    rng_key_for_env_reset: PRNGKeyArray,
) -> tuple[Carry, EnvState, Transition]:
    """Step ``n_envs`` environments ``unroll_length`` times with the network acting.

    Where an episode ends, that env is swapped for a fresh one and its carry for
    ``networks.reset_state`` of it. The fresh states come from **one** vmapped
    ``reset`` at the start of the rollout (keys ``jax.random.split(rng_key_for_env_reset,
    n_envs)``), so a step costs no reset; an env that ends twice in a rollout
    restarts from the same fresh state both times.

    Args:
      env: one unbatched environment (vmapped here).
      env_state: the batched env states, leaves ``(B, ...)``.
      networks: the PPO network, called with ``rollout_extras=None``.
      network_state: its carry, leaves ``(B, ...)``.
      unroll_length: the number of steps ``T``.
      rng_key_for_env_reset: the key of the fresh reset states.

    Returns:
      ``(final carry, final env state, transitions)``; the transitions are
      stacked, leaves ``(T, B, ...)``, with ``next_obs`` the pre-reset
      observations and ``next_value_estimates`` their values (0 where an
      episode terminated: GAE does not bootstrap there); ``carries`` holds each
      step's carry when it has no floating-point leaf. When ``carries`` is
      kept and the parameters cannot change the carry (per-env keys,
      counters), the steps' ``value_estimates`` are computed after the scan,
      in one call over all ``B * T`` steps, rather than step by step (the same
      values, each from its step's carry and observation).
    """
    require_int("unroll_env", "unroll_length", unroll_length)
    n_envs = n_envs_of(env_state, "unroll_env")
    fresh_states = reset_envs(env, jax.random.split(rng_key_for_env_reset, n_envs))
    return _unroll_from(env, env_state, networks, network_state, unroll_length, fresh_states)


def _unroll_from(
    env: RLEnv,
    env_state: EnvState,
    networks: StatefulModule,
    network_state: Carry,
    unroll_length: int,
    fresh_states: EnvState,
) -> tuple[Carry, EnvState, Transition]:
    """:func:`unroll_env` with its fresh states given: ended episodes restart from them.

    The PPO step of one iteration per call takes them from a reset program of
    their own, so that the step's program holds no reset (a simulator's reset
    takes seconds to compile).
    """
    batched = _BatchedEnv(env)
    n_envs = n_envs_of(env_state, "unroll_env")
    fresh_states = sharding.constrain_envs(batched.adopt(fresh_states), n_envs)

    keep_carries = not any(map(_is_inexact, jax.tree.leaves(network_state)))

    def step(
        networks: StatefulModule, carry: _RolloutCarry, _: None
    ) -> tuple[_RolloutCarry, Transition]:
        network_state, env_state = carry.network_state, carry.env_state
        out = networks(network_state, env_state.obs)
        output = checked_ppo_output(out.output, "unroll_env")
        stepped = batched.step(env_state, output.actions)
        checked_ppo_output(output, "unroll_env", rewards=stepped.reward)
        done, truncated = episode_flags(stepped, before=env_state)
        # The value of a truncated episode's final observation, under its pre-reset
        # carry: computed only at the steps where some episode was truncated (values
        # computed for other envs are never read).
        # The module goes in as an operand: a transform inside its __call__ (nnx.vmap)
        # refuses variables closed over from the scan's trace.
        graphdef, variables = nnx.split(networks)
        at_truncation = jax.lax.cond(
            _in_any_run(jax.tree.reduce(jnp.logical_or, jax.tree.map(jnp.any, truncated))),
            lambda v: _values(nnx.merge(graphdef, v), out.next_state, stepped.obs),
            lambda v: jax.tree.map(jnp.zeros_like, output.value_estimates),
            variables,
        )
        transition = Transition(
            obs=env_state.obs,
            network_output=output,
            rewards=stepped.reward,
            done=done,
            truncated=truncated,
            next_obs=stepped.obs,
            metrics={"env": stepped.metrics, "net": out.metrics},
            rollout_extras=out.rollout_extras,
            next_value_estimates=at_truncation,
            carries=network_state if keep_carries else None,
        )
        ended = episode_ended(done)
        next_env_state = tree_where(ended, fresh_states, stepped, batched.unmapped)
        reset_carry = networks.reset_state(out.next_state)
        next_network_state = tree_where(ended, reset_carry, out.next_state)
        return _RolloutCarry(next_network_state, next_env_state, out.next_state), transition

    start = _RolloutCarry(network_state, env_state, pre_reset=network_state)
    final, transitions = scan_module(networks, step, start, length=unroll_length)
    values = _rollout_values(networks, network_state, transitions)
    last_obs = jax.tree.map(lambda x: x[-1], transitions.next_obs)
    next_values = _next_values(
        values,
        _values(networks, final.pre_reset, last_obs),
        transitions.next_value_estimates,
        episode_ended(transitions.done),
        transitions.truncated,
    )
    transitions = transitions.replace(
        network_output=transitions.network_output.replace(value_estimates=values),
        next_value_estimates=next_values,
    )
    return final.network_state, final.env_state, transitions


def _per_env(leaf: Shaped[Array, "..."], n_envs: int) -> Batched:
    """A metric leaf as ``(B, ...)``, in the dtype its sum over an episode is kept in
    (booleans as 0/1 floats, counting the steps they were true): scalars (shared by
    every env) are broadcast."""
    leaf = leaf.astype(_episode_sum_dtype(leaf.dtype))
    return jnp.broadcast_to(leaf, (n_envs,)) if leaf.ndim == 0 else leaf


def _masked(alive: Mask, leaf: Batched) -> Batched:
    return jnp.where(align_leading(alive, leaf), leaf, jnp.zeros_like(leaf))


def _rekeyed(carry: Carry, key: PRNGKeyArray) -> Carry:
    """``carry`` with every typed PRNG-key leaf drawn afresh from ``key``.

    Leaf ``i`` (in tree order) gets keys seeded by ``bits(fold_in(key, i))``, one
    per entry and in the leaf's own key implementation; every other leaf is kept.
    """
    leaves, structure = jax.tree.flatten(carry)

    def fresh(index: int, leaf: Shaped[Array, "..."]) -> Shaped[Array, "..."]:
        if not is_key(leaf):
            return leaf
        impl = jax.random.key_impl(leaf)
        seeds = jax.random.bits(jax.random.fold_in(key, index), (leaf.size,), jnp.uint32)
        keys = jax.vmap(lambda s: jax.random.key(s, impl=impl))(seeds)
        return keys.reshape(leaf.shape)

    return jax.tree.unflatten(structure, [fresh(i, leaf) for i, leaf in enumerate(leaves)])


_CARRY_STREAM = 0x63617272
"""Folded into an evaluation's ``key`` for the network's carry keys (its envs reset from
``split(key, n_envs)``)."""

_RNGS_STREAM = 0x726E6773
"""Folded into a carry's ``key`` for the ``nnx.Rngs`` keys ``initialize_state`` draws from."""


def _seeded_initialize_state(networks: StatefulModule, n_envs: int, key: PRNGKeyArray) -> Carry:
    """``networks.initialize_state(n_envs)``, every random number in it drawn from ``key``.

    While it runs, the network's ``nnx.Rngs`` hold keys drawn from ``key`` (their
    counts at 0); they are put back as they were after it. So what
    ``initialize_state`` derives from its keys (noise drawn once per episode, a
    random initial state) follows ``key`` alone, and the network is left unchanged.
    The carry's own key leaves are then drawn from ``key`` (:func:`_rekeyed`).
    """
    own = jax.tree.map(lambda value: value, nnx.state(networks, nnx.RngState))  # a copy
    reseeded = _rekeyed(own, jax.random.fold_in(key, _RNGS_STREAM))
    nnx.update(networks, jax.tree.map(lambda v: v if is_key(v) else jnp.zeros_like(v), reseeded))
    carry = networks.initialize_state(n_envs)
    nnx.update(networks, own)
    return _rekeyed(carry, key)


def _initial_carry(networks: StatefulModule, n_envs: int, key: PRNGKeyArray) -> Carry:
    """An evaluation's carry: :func:`_seeded_initialize_state` from the evaluation's ``key``
    (the same ``key`` gives the same episodes)."""
    return _seeded_initialize_state(networks, n_envs, jax.random.fold_in(key, _CARRY_STREAM))


@typechecked
def eval_rollout(
    env: RLEnv,
    networks: StatefulModule,
    n_envs: int,
    max_episode_length: int,
    key: PRNGKeyArray,
    logging_percentiles: tuple[int, ...] | None = None,
    logging_level: LoggingLevel = LoggingLevel.NONE,
) -> dict[str, Float[Array, ""]]:
    """Run one episode in each of ``n_envs`` environments and summarise them.

    The policy is whatever mode ``networks`` is in: call ``networks.eval()``
    first for a deterministic policy (``train_ppo`` does). No env is reset: an
    episode counts the steps up to and including the one that ended it
    (``max_episode_length`` if none did), and nothing after.

    Returns:
      ``eval/episode_reward/{mean,std}`` of the return summed over reward
      leaves, and per reward leaf ``eval/episode_reward/<leaf>/...`` when the
      reward is a tree; ``eval/lifespan/{mean,std}``; ``p<N>`` entries for each
      of ``logging_percentiles``; with ``ENV_METRICS``/``NETWORK_METRICS`` in
      ``logging_level``, ``eval/env/...``/``eval/net/...``: each env's metric
      averaged over its episode, then summarised over envs.
    """
    require_int("eval_rollout", "n_envs", n_envs)
    require_int("eval_rollout", "max_episode_length", max_episode_length)
    batched = _BatchedEnv(env)
    env_states, network_state = sharding.constrain_envs(
        (batched.reset(jax.random.split(key, n_envs)), _initial_carry(networks, n_envs, key)),
        n_envs,
    )
    log_env = LoggingLevel.ENV_METRICS in logging_level
    log_net = LoggingLevel.NETWORK_METRICS in logging_level

    def step_metrics(
        env_metrics: dict[str, PyTree[Shaped[Array, "..."]]],
        net_metrics: dict[str, PyTree[Shaped[Array, "..."]]],
    ) -> dict[str, BatchedTree]:
        logged = {"env": env_metrics} if log_env else {}
        if log_net:
            logged["net"] = net_metrics
        return jax.tree.map(lambda m: _per_env(m, n_envs), logged)

    def step(networks: StatefulModule, carry: _EvalCarry, _: None) -> tuple[_EvalCarry, None]:
        out = networks(carry.network_state, carry.env_state.obs)
        actions = checked_ppo_output(out.output, "eval_rollout").actions
        stepped = batched.step(carry.env_state, actions)
        alive = jnp.logical_not(carry.finished)
        metrics = step_metrics(stepped.metrics, out.metrics)
        return _EvalCarry(
            network_state=out.next_state,
            env_state=stepped,
            finished=carry.finished | episode_ended(episode_flags(stepped)[0]),
            returns=jax.tree.map(lambda g, r: g + _masked(alive, r), carry.returns, stepped.reward),
            lifespan=carry.lifespan + alive,
            metric_sums=jax.tree.map(
                lambda s, m: s + _masked(alive, m), carry.metric_sums, metrics
            ),
        ), None

    def first_metrics(networks: StatefulModule) -> dict[str, BatchedTree]:
        return step_metrics(env_states.metrics, networks(network_state, env_states.obs).metrics)

    zero_sums = jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype), nnx.eval_shape(first_metrics, networks)
    )
    start = _EvalCarry(
        network_state=network_state,
        env_state=env_states,
        finished=jnp.zeros(n_envs, bool),
        returns=jax.tree.map(
            lambda r: jnp.zeros(r.shape, _episode_sum_dtype(r.dtype)), env_states.reward
        ),
        lifespan=jnp.zeros(n_envs, jnp.int32),
        metric_sums=zero_sums,
    )
    final, _ = scan_module(networks, step, start, length=max_episode_length)
    return _eval_summary(final.returns, final.lifespan, final.metric_sums, logging_percentiles)


def record_episode(
    env: RLEnv, networks: StatefulModule, episode_length: int, key: PRNGKeyArray
) -> tuple[EnvState, Float[Array, ""]]:
    """Run one env for ``episode_length`` steps, for rendering; restart it where it ends.

    Returns:
      The ``episode_length + 1`` states visited, stacked (leaves ``(T + 1, ...)``,
      no env axis): the state each step started from, then the last one reached.
      As in nnx-ppo 0.3.0, an episode's last state (``done`` set) is not among
      them: the state after its last step is the restarted episode's reset state.
      Also the return of the first episode (reward leaves summed).
    """
    require_int("record_episode", "episode_length", episode_length)
    batched = _BatchedEnv(env)
    start_key, fresh_key = jax.random.split(key)
    fresh_state = batched.reset(fresh_key[None])

    def step(
        networks: StatefulModule, carry: _RecordCarry, _: None
    ) -> tuple[_RecordCarry, EnvState]:
        network_state, env_state, finished, total = carry
        out = networks(network_state, env_state.obs)
        stepped = batched.step(env_state, checked_ppo_output(out.output, "record_episode").actions)
        reward = jax.tree.reduce(jnp.add, stepped.reward)
        total = total + jnp.where(finished, 0.0, reward)
        ended = episode_ended(episode_flags(stepped)[0])
        next_network_state = tree_where(ended, networks.reset_state(out.next_state), out.next_state)
        carry = _RecordCarry(
            next_network_state,
            tree_where(ended, fresh_state, stepped, batched.unmapped),
            finished | ended,
            total,
        )
        return carry, env_state

    init = _RecordCarry(
        _initial_carry(networks, 1, key),
        batched.reset(start_key[None]),
        jnp.zeros(1, bool),
        jnp.zeros(1),
    )
    (_, last_state, _, total), states = scan_module(networks, step, init, length=episode_length)

    def append_last(
        visited: PyTree[Shaped[Array, "T ..."]], last: PyTree[Shaped[Array, "..."]]
    ) -> PyTree[Shaped[Array, "T+1 ..."]]:
        # A (T, 1, ...) leaf and the last state's (1, ...), or a Shared node: (T, ...) leaves.
        if _is_shared(visited):  # no env axis: (T, ...) already
            return jax.tree.map(lambda v, x: jnp.concatenate([v, x[None]]), visited, last)
        return jnp.concatenate([visited[:, 0], last], axis=0)

    trajectory = jax.tree.map(append_last, states, last_state, is_leaf=_is_shared)
    return trajectory, total[0]


def _eval_summary(
    returns: PyTree[FloatBatch],
    lifespan: Shaped[Array, " B"],
    sums: dict[str, BatchedTree],
    percentiles: tuple[int, ...] | None,
) -> dict[str, Float[Array, ""]]:
    total = jax.tree.reduce(jnp.add, returns)
    metrics = summarize("eval/episode_reward", total, percentiles, always_moments=True)
    if has_reward_leaves(returns):
        metrics |= summarize("eval/episode_reward", returns, percentiles, always_moments=True)
    metrics |= summarize("eval/lifespan", lifespan, percentiles, always_moments=True)
    steps = jnp.maximum(lifespan, 1)
    averages = jax.tree.map(lambda s: s / align_leading(steps, s), sums)
    for group, tree in averages.items():
        if isinstance(tree, Mapping) and not tree:
            continue
        metrics |= summarize(f"eval/{group}", tree, percentiles)
    return metrics
