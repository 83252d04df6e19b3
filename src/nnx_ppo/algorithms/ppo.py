"""Proximal Policy Optimization for stateful networks and pytree actions and rewards.

A PPO step reads top to bottom: **collect** a rollout (:func:`unroll_env`),
**score** it (:func:`compute_advantages`, GAE per reward leaf), **learn** from it
(epochs of minibatches of whole environments over :func:`ppo_loss`), **fold**
the rollout into the network's running statistics (``update_statistics``), and
**advance** the carry, env states and key.

Truncation: an episode cut short by a time limit (``truncated``) bootstraps
from the value of its true final observation, ``V(next_obs)`` under the carry
before the reset; a terminated one bootstraps from zero. Either way the GAE
trace stops at the episode's end.

The step is compiled once per (env, network structure, optimizer, :class:`PPOConfig`):
:func:`ppo_step` keeps the compiled function and reuses it for every call.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Bool, Float, Integer, PRNGKeyArray, PyTree, ScalarLike

from nnx_ppo.algorithms import rollout, sharding
from nnx_ppo.algorithms.config import (
    EvalConfig,
    PPOConfig,
    TrainConfig,
    TrainResult,
    VideoData,
)
from nnx_ppo.algorithms.metrics import (
    compute_metrics,
    episode_metrics,
    log_weight_stats,
    to_host,
    track_episodes,
)
from nnx_ppo.algorithms.types import (
    LoggingLevel,
    RLEnv,
    RunningEpisodes,
    TrainingState,
    Transition,
)
from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.axes import BoolHistory, Carry, FloatHistory, Scalar
from nnx_ppo.contract.checks import typechecked
from nnx_ppo.networks.types import (
    ModuleState,
    PPONetworkOutput,
    StatefulModule,
    checked_ppo_output,
)

__all__ = [
    "compute_advantages",
    "default_config",
    "gae",
    "new_training_state",
    "ppo_loss",
    "ppo_step",
    "ppo_steps",
    "train_ppo",
]

_EPSILON = 1e-8


# ------------------------------------------------------------------------------ score


@typechecked
def gae(
    rewards: FloatHistory,
    values_excl_last: FloatHistory,
    next_values: FloatHistory,
    done: BoolHistory,
    truncation: BoolHistory,
    lambda_: ScalarLike,
    gamma: ScalarLike,
) -> FloatHistory:
    """Generalised advantage estimates of one reward leaf.

    ``delta_t = r_t + gamma * V(next_obs_t) * (not terminated_t) - V(obs_t)`` with
    ``terminated = done and not truncation``, and
    ``A_t = delta_t + gamma * lambda * (not done_t) * A_{t+1}``: termination cuts the
    bootstrap, truncation keeps it (from the true final observation), and any
    episode end cuts the trace. The last step's ``A_{T}`` is zero.

    Args:
      rewards, values_excl_last: per step, ``(T, B)``; ``values_excl_last`` is
        ``V(obs_t)`` (0.3.0's names for the arguments are kept).
      next_values: ``V(next_obs)`` per step, pre-reset (``Transition.next_value_estimates``).
      done, truncation: episode ends, and which of them were time limits.
      lambda_, gamma: GAE's lambda and the discount.

    Raises:
      ContractError: an input is not ``(T, B)`` with the ``T`` and ``B`` of
        ``rewards``; the message names the argument and both shapes.
    """
    terminated = jnp.logical_and(done, jnp.logical_not(truncation))
    deltas = jnp.asarray(
        rewards + gamma * jnp.where(terminated, 0.0, next_values) - values_excl_last
    )

    def step(later: Array, inputs: tuple[Array, Array]) -> tuple[Array, Array]:
        delta, ended = inputs  # one step's (B,) rows
        advantage = delta + gamma * lambda_ * jnp.where(ended, 0.0, later)
        return advantage, advantage

    ended = jnp.asarray(done)
    _, advantages = jax.lax.scan(step, jnp.zeros_like(deltas[0]), (deltas, ended), reverse=True)
    return jax.lax.stop_gradient(advantages)


@typechecked
def compute_advantages(
    rollout_data: Transition, gae_lambda: ScalarLike, discounting_factor: ScalarLike
) -> tuple[PyTree[FloatHistory], PyTree[FloatHistory]]:
    """GAE per reward leaf from the rollout's own value estimates.

    Returns:
      ``(advantages, value_targets)``, trees like the rewards with ``(T, B)``
      leaves; ``value_targets = advantages + value_estimates``.
    """
    values = rollout_data.network_output.value_estimates
    advantages = jax.tree.map(
        functools.partial(gae, lambda_=gae_lambda, gamma=discounting_factor),
        rollout_data.rewards,
        values,
        rollout_data.next_value_estimates,
        rollout.per_reward_leaf(rollout_data.done, rollout_data.rewards),
        rollout.per_reward_leaf(rollout_data.truncated, rollout_data.rewards),
    )
    return advantages, jax.tree.map(jnp.add, advantages, values)


# ------------------------------------------------------------------------------- loss


def _carry_follows_parameters(networks: StatefulModule, carry: Carry, obs: Any) -> bool:
    """Whether the network's next carry depends on a parameter, read from the call's data flow.

    Conservative: an operation with a parameter-dependent input taints all of its
    outputs, so a carry is only called parameter-free when no path leads to it.
    """
    graphdef, parameters, rest = nnx.split(networks, nnx.Param, ...)

    def next_carry(parameters: nnx.State) -> Any:
        return nnx.merge(graphdef, parameters, rest)(carry, obs).next_state

    jaxpr = jax.make_jaxpr(next_carry)(parameters).jaxpr
    tainted = set(jaxpr.invars)
    for equation in jaxpr.eqns:
        if any(isinstance(v, jex_core.Var) and v in tainted for v in equation.invars):
            tainted.update(equation.outvars)
    return any(isinstance(v, jex_core.Var) and v in tainted for v in jaxpr.outvars)


def _replay(
    networks: StatefulModule, network_state: ModuleState, rollout_data: Transition
) -> tuple[PPONetworkOutput, Float[Array, " T"]]:
    """Re-run the network over the stored observations, as the rollout ran it.

    Each step is fed its stored ``rollout_extras`` (so samplers score the stored
    action). A carry that the parameters cannot change (per-env keys, counters:
    the rollout kept it in ``carries``) is the stored one, so every step is
    replayed at once, in one flat batch of ``T * B``. Otherwise the steps are
    scanned from the rollout's first carry, which is reset where an episode
    ended, as in the rollout, and gradients flow through the carry.
    """
    if rollout_data.carries is not None:
        first_obs = jax.tree.map(lambda x: x[0], rollout_data.obs)
        if not _carry_follows_parameters(networks, network_state, first_obs):
            return _replay_flat(networks, rollout_data)

    def step(
        networks: StatefulModule, carry: ModuleState, inputs: tuple[Any, Any, Any, Any]
    ) -> tuple[ModuleState, tuple[Any, Float[Array, ""]]]:
        obs, ended, extras, rewards = inputs
        out = networks(carry, obs, extras)
        checked_ppo_output(out.output, "ppo_loss", rewards)
        carry = rollout.tree_where(ended, networks.reset_state(out.next_state), out.next_state)
        return carry, (out.output, jnp.mean(out.regularization_loss))

    ended = rollout.episode_ended(rollout_data.done)
    inputs = (rollout_data.obs, ended, rollout_data.rollout_extras, rollout_data.rewards)
    _, (output, regularization) = rollout.scan_module(networks, step, network_state, inputs)
    return output, regularization


def _replay_flat(
    networks: StatefulModule, rollout_data: Transition
) -> tuple[PPONetworkOutput, Float[Array, " T"]]:
    """Every step of the rollout in one call over ``T * B`` rows, from the stored carries.

    Rows are independent (a forward pass is per-sample pure), so this is the
    scan's result, computed with a few large matrix products instead of ``T``
    small ones.
    """
    time_steps, n_envs = jax.tree.leaves(rollout_data.rewards)[0].shape

    def flat(x: Array) -> Array:
        return x.reshape((-1, *x.shape[2:]))

    def unflat(x: Array) -> Array:
        return x.reshape((time_steps, -1, *x.shape[1:]))

    out = networks(
        jax.tree.map(flat, rollout_data.carries),
        jax.tree.map(flat, rollout_data.obs),
        jax.tree.map(flat, rollout_data.rollout_extras),
    )
    checked_ppo_output(out.output, "ppo_loss", jax.tree.map(flat, rollout_data.rewards))
    output = jax.tree.map(unflat, out.output)
    regularization = jnp.broadcast_to(out.regularization_loss, (time_steps * n_envs,))
    return output, jnp.mean(regularization.reshape(time_steps, n_envs), axis=1)


def _policy_advantages(advantages: Any, loglikelihoods: Any, combine: bool) -> Any:
    """One advantage per action leaf.

    ``combine`` trains every action leaf on the sum over reward leaves (a team
    advantage); a single reward leaf is shared by every action leaf; otherwise
    the reward and action trees must match leaf for leaf (one agent each).
    """
    if combine or isinstance(advantages, jax.Array):
        shared = jax.tree.reduce(jnp.add, advantages)
        return jax.tree.map(lambda _: shared, loglikelihoods)
    if jax.tree.structure(advantages) == jax.tree.structure(loglikelihoods):
        return advantages
    raise ValueError(
        "ppo_loss: the reward tree "
        f"{jax.tree.structure(advantages)} and the action tree "
        f"{jax.tree.structure(loglikelihoods)} differ, so no action leaf has its own "
        "advantage. Give one reward leaf per action leaf, or set "
        "PPOConfig.combine_advantages=True to train every action leaf on the summed advantage."
    )


def _standardize(advantages: Any, mode: str) -> Any:
    if mode == "per_leaf":
        return jax.tree.map(lambda a: (a - a.mean()) / (a.std() + _EPSILON), advantages)
    pooled = jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(advantages)])
    return jax.tree.map(lambda a: (a - pooled.mean()) / (pooled.std() + _EPSILON), advantages)


@typechecked
def _clipped_surrogate(
    log_ratio: FloatHistory, advantage: FloatHistory, clip_range: float
) -> Scalar:
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return -jnp.mean(jnp.minimum(ratio * advantage, clipped * advantage))


@typechecked
def _value_loss(
    value: FloatHistory,
    old_value: FloatHistory,
    target: FloatHistory,
    clip_range: float | None,
) -> Scalar:
    error = (value - target) ** 2
    if clip_range is not None:
        clipped = old_value + jnp.clip(value - old_value, -clip_range, clip_range)
        error = jnp.maximum(error, (clipped - target) ** 2)
    return 0.5 * jnp.mean(error)


@typechecked
def ppo_loss(
    networks: StatefulModule,
    network_state: Carry,
    rollout_data: Transition,
    advantages: PyTree[FloatHistory],
    value_targets: PyTree[FloatHistory],
    config: PPOConfig,
) -> tuple[Scalar, dict[str, Any]]:
    """The PPO loss of a minibatch of whole environments.

    ``clipped surrogate (per action leaf) + critic_loss_weight * value loss (per
    reward leaf) + the network's regularization`` (an entropy bonus is a
    sampler's regularization).

    Args:
      networks: the network being trained.
      network_state: the carry the rollout started from, leaves ``(B, ...)``.
      rollout_data: the minibatch's transitions, leaves ``(T, B, ...)``.
      advantages, value_targets: from :func:`compute_advantages`, ``(T, B)`` leaves.
      config: clip ranges, advantage options and the critic weight.

    Returns:
      The scalar loss, and per-term diagnostics (``losses/...`` names).
    """
    rollout_data = jax.lax.stop_gradient(rollout_data)
    output, regularization = _replay(networks, network_state, rollout_data)
    old = rollout_data.network_output
    log_ratios = jax.tree.map(jnp.subtract, output.loglikelihoods, old.loglikelihoods)
    policy_advantages = _policy_advantages(
        advantages, output.loglikelihoods, config.combine_advantages
    )
    if config.normalize_advantages:
        policy_advantages = _standardize(policy_advantages, config.advantage_normalization)
    actor = jax.tree.map(
        functools.partial(_clipped_surrogate, clip_range=config.clip_range),
        log_ratios,
        policy_advantages,
    )
    critic = jax.tree.map(
        functools.partial(_value_loss, clip_range=config.value_clip_range),
        output.value_estimates,
        old.value_estimates,
        value_targets,
    )
    total = (
        jax.tree.reduce(jnp.add, actor)
        + config.critic_loss_weight * jax.tree.reduce(jnp.add, critic)
        + jnp.mean(regularization)
    )
    diagnostics = {
        "losses/actor": actor,
        "losses/critic": critic,
        "losses/regularization": jnp.mean(regularization),
        "losses/total": total,
        "losses/clipping_fraction": jax.tree.map(
            lambda r: jnp.mean(jnp.abs(jnp.expm1(r)) > config.clip_range), log_ratios
        ),
        "losses/approx_kl": jax.tree.map(lambda r: jnp.mean(jnp.expm1(r) - r), log_ratios),
        "losses/critic_R^2": jax.tree.map(
            lambda v, t: 1.0 - jnp.mean((v - t) ** 2) / (jnp.var(t) + _EPSILON),
            output.value_estimates,
            value_targets,
        ),
    }
    return total, diagnostics


# ------------------------------------------------------------------------------ learn


def _select_envs(
    columns: Integer[Array, " groups"], n_minibatches: int, data: tuple[Any, ...]
) -> tuple[Any, ...]:
    """One minibatch: from every group of ``n_minibatches`` neighbouring envs, one env.

    Env ``g * n_minibatches + columns[g]`` of each group ``g`` is taken. Groups
    never straddle devices (``n_envs`` is a multiple of devices x minibatches), so
    a minibatch takes the same number of envs from every device and no rollout
    moves between them, whatever the device count. Carry leaves are ``(B, ...)``,
    the rest ``(T, B, ...)``.
    """
    carry, transitions, *per_step = data
    transitions = transitions.replace(metrics={})

    def take(env_axis: int) -> Callable[[Array], Array]:
        def pick(x: Array) -> Array:
            shape = x.shape
            grouped = x.reshape(*shape[:env_axis], -1, n_minibatches, *shape[env_axis + 1 :])
            one_per_group = jax.vmap(
                lambda group, column: jnp.take(group, column, axis=env_axis),
                in_axes=(env_axis, 0),
                out_axes=env_axis,
            )
            return one_per_group(grouped, columns)

        return pick

    return (
        jax.tree.map(take(0), carry),
        jax.tree.map(take(1), transitions),
        *jax.tree.map(take(1), per_step),
    )


def _minibatch_update(
    graphdef: nnx.GraphDef[Any], config: PPOConfig, data: tuple[Any, ...]
) -> Callable[[nnx.State, Integer[Array, " groups"]], tuple[nnx.State, dict[str, Any]]]:
    """One gradient step on a minibatch of environments, on the split (network, optimizer)."""

    def update(
        state: nnx.State, columns: Integer[Array, " groups"]
    ) -> tuple[nnx.State, dict[str, Any]]:
        networks, optimizer = nnx.merge(graphdef, state)
        carry, transitions, advantages, targets = _select_envs(columns, config.n_minibatches, data)
        grads, diagnostics = nnx.grad(
            lambda n: ppo_loss(n, carry, transitions, advantages, targets, config), has_aux=True
        )(networks)
        diagnostics["grad_norm"] = optax.tree.norm(grads)
        optimizer.update(networks, grads)
        return nnx.state((networks, optimizer)), diagnostics

    return update


def _epochs_until_kl(
    epoch: Callable[[nnx.State, PRNGKeyArray], tuple[nnx.State, dict[str, Any]]],
    state: nnx.State,
    keys: PRNGKeyArray,
    target_kl: float,
) -> tuple[nnx.State, dict[str, Any], Bool[Array, " E"]]:
    """Run epochs until one's mean approximate KL exceeds ``target_kl``; skip the rest.

    Skipped epochs cost no compute (``lax.cond``) and report NaN diagnostics.
    """

    def guarded(
        carry: tuple[nnx.State, Bool[Array, ""]], key: PRNGKeyArray
    ) -> tuple[tuple[nnx.State, Bool[Array, ""]], tuple[dict[str, Any], Bool[Array, ""]]]:
        state, stopped = carry

        def skip(state: nnx.State) -> tuple[nnx.State, dict[str, Any]]:
            shapes = jax.eval_shape(epoch, state, key)[1]
            return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

        state, diagnostics = jax.lax.cond(stopped, skip, lambda s: epoch(s, key), state)
        kl = jax.tree.reduce(jnp.add, jax.tree.map(jnp.mean, diagnostics["losses/approx_kl"]))
        return (state, stopped | (kl > target_kl)), (diagnostics, jnp.logical_not(stopped))

    (state, _), (diagnostics, ran) = jax.lax.scan(guarded, (state, jnp.asarray(False)), keys)
    return state, diagnostics, ran


def _learn(
    networks: StatefulModule,
    optimizer: nnx.Optimizer,
    data: tuple[Any, ...],
    key: PRNGKeyArray,
    config: PPOConfig,
) -> tuple[dict[str, Any], Bool[Array, " E"]]:
    """Epochs of minibatch updates; each minibatch is a set of whole environments.

    The envs fall in groups of ``n_minibatches`` neighbours; an epoch deals each
    group's envs out to the minibatches in a random order of its own, so each
    minibatch holds one env of every group (see :func:`_select_envs`).

    Args:
      data: ``(first carry, transitions, advantages, value_targets)``.

    Returns:
      The diagnostics of every update, leaves ``(n_epochs, n_minibatches, ...)``,
      and which epochs ran (all, unless ``target_kl`` stopped them).
    """
    graphdef, state = nnx.split((networks, optimizer))
    update = _minibatch_update(graphdef, config, data)
    groups = config.n_envs // config.n_minibatches

    def epoch(state: nnx.State, key: PRNGKeyArray) -> tuple[nnx.State, dict[str, Any]]:
        deal = jax.vmap(lambda k: jax.random.permutation(k, config.n_minibatches))
        columns = deal(jax.random.split(key, groups))  # (groups, n_minibatches)
        return jax.lax.scan(update, state, columns.T)

    keys = jax.random.split(key, config.n_epochs)
    if config.target_kl is None:
        state, diagnostics = jax.lax.scan(epoch, state, keys)
        ran = jnp.ones(config.n_epochs, bool)
    else:
        state, diagnostics, ran = _epochs_until_kl(epoch, state, keys, config.target_kl)
    nnx.update((networks, optimizer), state)
    return diagnostics, ran


# ------------------------------------------------------------------------------- step


def _finite_leaves(tree: Any) -> dict[str, Bool[Array, ""]]:
    """Whether each leaf is finite, by its path: the step's own record of what diverged."""
    return {
        jax.tree_util.keystr(path): jnp.all(jnp.isfinite(leaf))
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _train_step(
    env: RLEnv,
    config: PPOConfig,
    networks: StatefulModule,
    optimizer: nnx.Optimizer,
    carry: tuple[ModuleState, Any, RunningEpisodes, PRNGKeyArray],
) -> tuple[
    tuple[ModuleState, Any, RunningEpisodes, PRNGKeyArray], dict[str, Any], Any, dict[str, Any]
]:
    """Collect, score, learn, fold statistics, advance. Traced once per configuration."""
    network_states, env_states, running, key = carry
    rollout_key, learn_key, next_key = jax.random.split(key, 3)
    final_network_states, final_env_states, transitions = rollout.unroll_env(
        env, env_states, networks, network_states, config.rollout_length, rollout_key
    )
    advantages, targets = compute_advantages(
        transitions, config.gae_lambda, config.discounting_factor
    )
    data = (network_states, transitions, advantages, targets)
    diagnostics, ran = _learn(networks, optimizer, data, learn_key, config)
    networks.update_statistics(transitions.rollout_extras)
    running, episodes = track_episodes(
        running, transitions.rewards, rollout.episode_ended(transitions.done)
    )
    metrics = _step_metrics(networks, transitions, advantages, targets, diagnostics, ran, config)
    health = {
        "loss_finite": jnp.isfinite(diagnostics["losses/total"]) | ~ran[:, None],
        "parameters_finite": _finite_leaves(nnx.state(networks, nnx.Param)),
    }
    return (final_network_states, final_env_states, running, next_key), metrics, episodes, health


def _step_metrics(
    networks: StatefulModule,
    transitions: Transition,
    advantages: Any,
    targets: Any,
    diagnostics: dict[str, Any],
    ran: Bool[Array, " E"],
    config: PPOConfig,
) -> dict[str, Float[Array, ""]]:
    values = transitions.network_output.value_estimates
    loss_metrics = diagnostics | {
        "losses/epochs_completed": jnp.sum(ran),
        "losses/advantages": advantages,
        "losses/explained_variance": jax.tree.map(
            lambda v, t: 1.0 - jnp.var(t - v) / (jnp.var(t) + _EPSILON), values, targets
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


_OPTIMIZER_FIELDS = frozenset(
    {"total_steps", "learning_rate", "gradient_clipping", "weight_decay", "iterations_per_call"}
)
"""PPOConfig fields the compiled step never reads (they shape the run or the optimizer)."""


class _ConfigArgument:
    """A jit static argument holding a snapshot of a (mutable) config.

    Equal to another when every field the step reads is equal, so a run with a
    different ``total_steps`` or learning rate reuses the compiled step.
    """

    def __init__(self, config: PPOConfig) -> None:
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


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 5))
def _compiled_steps(
    env: _EnvArgument,
    config: _ConfigArgument,
    graphdef: nnx.GraphDef[Any],
    state: nnx.State,
    carry: tuple[ModuleState, Any, RunningEpisodes, PRNGKeyArray],
    iterations: int,
) -> tuple[nnx.State, Any]:
    """``iterations`` PPO steps in one program; per-step outputs stacked on a leading axis."""

    def one_step(scanned: tuple[nnx.State, Any], _: None) -> tuple[tuple[nnx.State, Any], Any]:
        state, carry = scanned
        networks, optimizer = nnx.merge(graphdef, state)
        (*per_env, key), *outputs = _train_step(env.env, config.config, networks, optimizer, carry)
        carry = (*sharding.constrain_envs(per_env, config.config.n_envs), key)
        state = sharding.constrain_replicated(nnx.state((networks, optimizer)))
        return (state, carry), sharding.constrain_replicated(tuple(outputs))

    (state, carry), outputs = jax.lax.scan(one_step, (state, carry), None, length=iterations)
    return state, (carry, *outputs)


def _on_device(tree: Any) -> Any:
    """Committed, strongly typed arrays: what the compiled step returns, so it never retraces."""

    def canonical(x: Any) -> Any:
        if isinstance(x, jax.Array) and not getattr(x, "weak_type", False):
            return x
        return jnp.asarray(x, dtype=jnp.asarray(x).dtype)

    return jax.tree.map(canonical, tree)


def _no_running_episodes(env_states: Any) -> RunningEpisodes:
    n_envs = rollout.n_envs_of(env_states)
    return RunningEpisodes(
        returns=jax.tree.map(lambda r: jnp.zeros(n_envs, jnp.float32), env_states.reward),
        lengths=jnp.zeros(n_envs, jnp.int32),
    )


def _raise_if_diverged(health: dict[str, Any], steps: int) -> None:
    """Raise ``FloatingPointError`` naming the step and the first non-finite quantity."""
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


def _require_training_state(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, TrainingState):
        raise TypeError(
            f"{owner}: {name} must be a TrainingState (from new_training_state or a "
            f"checkpoint), got a {type(value).__name__}"
        )


def ppo_step(
    env: RLEnv, training_state: TrainingState, config: PPOConfig
) -> tuple[TrainingState, dict[str, float]]:
    """One PPO step: collect ``n_envs * rollout_length`` steps and learn from them.

    Compiled once per (env, network structure, config) and reused. Updates the
    network and optimizer in place (NNX semantics) and returns the advanced state.

    Returns:
      The new training state, and the step's metrics as a flat ``str -> float``
      dict (with ``total_steps``).

    Raises:
      TypeError: ``training_state`` is not a :class:`TrainingState` or ``config``
        not a :class:`PPOConfig`.
      ValueError: the state holds a different number of envs than ``config.n_envs``.
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


def _run_steps(
    owner: str, env: RLEnv, training_state: TrainingState, config: PPOConfig, iterations: int
) -> tuple[TrainingState, list[dict[str, float]]]:
    _require_training_state(owner, "training_state", training_state)
    if not isinstance(config, PPOConfig):
        raise TypeError(f"{owner}: config must be a PPOConfig, got a {type(config).__name__}")
    require_int(owner, "iterations", iterations)
    n_envs = rollout.n_envs_of(training_state.env_states, owner)
    if n_envs != config.n_envs:
        raise ValueError(
            f"{owner}: the training state holds {n_envs} envs, but config.n_envs is {config.n_envs}"
        )
    running = training_state.running_episodes
    if running is None:
        running = _no_running_episodes(training_state.env_states)
    network_states, env_states, running = _on_device(
        (training_state.network_states, training_state.env_states, running)
    )
    training_state = training_state.replace(
        network_states=network_states, env_states=env_states, running_episodes=running
    )
    mesh = sharding.mesh_of(training_state)
    if mesh is not None:
        sharding.require_divisible(owner, mesh, n_envs, config.n_minibatches, None)
        training_state = sharding.shard_training_state(training_state, mesh)
    networks, optimizer = training_state.networks, training_state.optimizer
    graphdef, state = nnx.split((networks, optimizer))
    carry = (
        training_state.network_states,
        training_state.env_states,
        training_state.running_episodes,
        training_state.rng_key,
    )
    with sharding.training_mesh(mesh):
        new_state, (carry, metrics, episodes, health) = _compiled_steps(
            _EnvArgument(env), _ConfigArgument(config), graphdef, state, carry, iterations
        )
    metrics, episodes, health = jax.device_get((metrics, episodes, health))
    for i in range(iterations):  # before the caller's network is touched
        steps = training_state.steps_taken + (i + 1) * config.steps_per_iteration
        _raise_if_diverged(_index(health, i), steps)
    nnx.update((networks, optimizer), new_state)
    per_step = []
    for i in range(iterations):
        steps = training_state.steps_taken + (i + 1) * config.steps_per_iteration
        host_metrics = to_host(_index(metrics, i)) | {"total_steps": float(steps)}
        if LoggingLevel.ROLLOUT_STATS in config.logging_level:
            host_metrics |= episode_metrics(_index(episodes, i))
        per_step.append(host_metrics)
    network_states, env_states, running, key = carry
    return training_state.replace(
        network_states=network_states,
        env_states=env_states,
        rng_key=key,
        steps_taken=training_state.steps_taken + iterations * config.steps_per_iteration,
        running_episodes=running,
    ), per_step


def _index(tree: Any, i: int) -> Any:
    return jax.tree.map(lambda leaf: leaf[i], tree)


# ------------------------------------------------------------------------------ setup


def _default_optimizer(
    learning_rate: float | optax.Schedule,
    gradient_clipping: float | None,
    weight_decay: float | bool | None,
) -> optax.GradientTransformation:
    """Adam(W) after optional clipping; one object per setting, so runs share a compiled step.

    Settings are told apart by type as well as value: ``weight_decay=True``
    (optax's default decay) is not ``weight_decay=1`` (a decay of 1), though
    ``True == 1`` in Python.
    """
    return _cached_optimizer(
        (type(learning_rate), learning_rate),
        (type(gradient_clipping), gradient_clipping),
        (type(weight_decay), weight_decay),
    )


@functools.lru_cache(maxsize=32)
def _cached_optimizer(
    learning_rate: tuple[type, float | optax.Schedule],
    gradient_clipping: tuple[type, float | None],
    weight_decay: tuple[type, float | bool | None],
) -> optax.GradientTransformation:
    rate, clipping, decay = learning_rate[1], gradient_clipping[1], weight_decay[1]
    links = [] if clipping is None else [optax.clip_by_global_norm(clipping)]
    if decay is None or decay is False:
        links.append(optax.adam(rate))
    elif decay is True:
        links.append(optax.adamw(rate))
    else:
        links.append(optax.adamw(rate, weight_decay=decay))
    return optax.chain(*links)


def _require_seed(seed: Any) -> None:
    """A seed is an ``int`` (Python or NumPy) or an integer scalar array."""
    if isinstance(seed, jax.Array | np.ndarray):
        if seed.shape != () or not jnp.issubdtype(seed.dtype, jnp.integer):
            raise TypeError(
                "new_training_state: seed must be an int or an integer scalar array, got an "
                f"array of shape {seed.shape} and dtype {seed.dtype}"
            )
        return
    # Any int seeds a key (TrainConfig.seed may be negative).
    require_int("new_training_state", "seed", seed, minimum=None)


def _rekeyed(carry: ModuleState, key: PRNGKeyArray) -> ModuleState:
    """``carry`` with every typed PRNG-key leaf drawn afresh from ``key``.

    Leaf ``i`` (in tree order) gets keys seeded by ``bits(fold_in(key, i))``, one
    per entry and in the leaf's own key implementation; every other leaf is kept.
    """
    leaves, structure = jax.tree.flatten(carry)

    def fresh(index: int, leaf: Any) -> Any:
        if not jnp.issubdtype(getattr(leaf, "dtype", jnp.float32), jax.dtypes.prng_key):
            return leaf
        impl = jax.random.key_impl(leaf)
        seeds = jax.random.bits(jax.random.fold_in(key, index), (leaf.size,), jnp.uint32)
        keys = jax.vmap(lambda s: jax.random.key(s, impl=impl))(seeds)
        return keys.reshape(leaf.shape)

    return jax.tree.unflatten(structure, [fresh(i, leaf) for i, leaf in enumerate(leaves)])


def new_training_state(
    env: RLEnv,
    networks: StatefulModule,
    n_envs: int,
    seed: int | Integer[Array, ""],
    learning_rate: float | optax.Schedule = 1e-4,
    gradient_clipping: float | None = None,
    weight_decay: float | bool | None = None,
    *,
    optimizer: optax.GradientTransformation | None = None,
) -> TrainingState:
    """A fresh training state: ``n_envs`` reset envs, fresh carries, an optimizer.

    The seed is the run's only source of randomness after construction: it seeds
    the env resets, the training key and **every per-env key in the network's
    carry** (samplers' and bottlenecks' noise). The keys that
    ``networks.initialize_state`` drew from the module's own ``nnx.Rngs`` are
    replaced, so two seeds give different action noise from one network, and
    one seed gives the same run each time. The ``nnx.Rngs`` still decides the
    initial parameters.

    Args:
      env: one unbatched environment.
      networks: the PPO network.
      n_envs: environments stepped in parallel.
      seed: seeds the env resets, the per-env keys of the carry and every later key.
      learning_rate, gradient_clipping, weight_decay: build the default optimizer,
        Adam (AdamW with ``weight_decay``; ``True`` for optax's default decay),
        after global-norm clipping when ``gradient_clipping`` is set. A learning
        rate may be an ``optax`` schedule.
      optimizer: any ``optax.GradientTransformation``, used instead of the default.

    Raises:
      TypeError: ``networks`` is not a ``StatefulModule``, or ``seed`` is not an
        integer (a Python ``int`` or an integer scalar array).
      ValueError: ``n_envs`` is not a positive int.
    """
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs <= 0:
        raise ValueError(f"new_training_state: n_envs must be a positive int, got {n_envs!r}")
    if not isinstance(networks, StatefulModule):
        raise TypeError(
            "new_training_state: networks must be a StatefulModule (the PPO network), "
            f"got a {type(networks).__name__}"
        )
    _require_seed(seed)
    env_key, training_key, carry_key = jax.random.split(jax.random.key(seed), 3)
    env_states = jax.jit(functools.partial(rollout.reset_envs, env))(
        jax.random.split(env_key, n_envs)
    )
    network_states = jax.jit(_rekeyed)(networks.initialize_state(n_envs), carry_key)
    if optimizer is None:
        optimizer = _default_optimizer(learning_rate, gradient_clipping, weight_decay)
    return TrainingState(
        networks=networks,
        network_states=_on_device(network_states),
        env_states=_on_device(env_states),
        optimizer=nnx.Optimizer(networks, optimizer, wrt=nnx.Param),
        rng_key=training_key,
        steps_taken=0,
        running_episodes=_on_device(_no_running_episodes(env_states)),
    )


def default_config() -> TrainConfig:
    """The default :class:`TrainConfig`."""
    return TrainConfig()


# ------------------------------------------------------------------------------ train


@functools.partial(jax.jit, static_argnums=(0, 1, 3, 4, 6, 7))
def _compiled_eval(
    env: _EnvArgument,
    graphdef: nnx.GraphDef[Any],
    state: nnx.State,
    n_envs: int,
    max_episode_length: int,
    key: PRNGKeyArray,
    percentiles: tuple[int, ...] | None,
    logging_level: LoggingLevel,
) -> dict[str, Float[Array, ""]]:
    networks = nnx.merge(graphdef, state)
    return rollout.eval_rollout(
        env.env, networks, n_envs, max_episode_length, key, percentiles, logging_level
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 3))
def _compiled_recording(
    env: _EnvArgument,
    graphdef: nnx.GraphDef[Any],
    state: nnx.State,
    episode_length: int,
    key: PRNGKeyArray,
) -> tuple[Any, Float[Array, ""]]:
    return rollout.record_episode(env.env, nnx.merge(graphdef, state), episode_length, key)


def _key_at(seed: int, steps: int) -> PRNGKeyArray:
    """A key of its own for the evaluation at ``steps`` (exact past 2**32 steps)."""
    key = jax.random.fold_in(jax.random.key(seed), steps >> 32)
    return jax.random.fold_in(key, steps & 0xFFFFFFFF)


_MODE_ATTRIBUTES = ("deterministic", "use_running_average")
"""The attributes NNX's ``Module.eval()`` and ``.train()`` set on every module that has them."""


@contextlib.contextmanager
def _eval_mode(networks: StatefulModule) -> Iterator[None]:
    """``networks.eval()`` for the block; then every module's mode as it was before.

    Restoring (rather than calling ``.train()``) keeps a network the caller had
    put in eval mode, or only partly, as it was.
    """
    saved = [
        (module, name, getattr(module, name))
        for _, module in nnx.iter_graph(networks)
        if isinstance(module, nnx.Module)
        for name in _MODE_ATTRIBUTES
        if hasattr(module, name)
    ]
    networks.eval()
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _evaluate(
    env: RLEnv,
    networks: StatefulModule,
    config: EvalConfig,
    key: PRNGKeyArray,
    timed: bool,
    mesh: sharding.Mesh | None,
) -> dict[str, float]:
    """One evaluation with the deterministic policy (``networks.eval()``), over ``mesh``."""
    with _eval_mode(networks), sharding.training_mesh(mesh):
        start = time.perf_counter()
        graphdef, state = nnx.split(networks)
        metrics = to_host(
            _compiled_eval(
                _EnvArgument(env),
                graphdef,
                state,
                config.n_envs,
                config.max_episode_length,
                key,
                config.logging_percentiles,
                config.logging_level,
            )
        )
    if timed:
        elapsed = time.perf_counter() - start
        metrics["throughput/eval_sps"] = config.n_envs * config.max_episode_length / elapsed
    return metrics


def _record(
    env: RLEnv,
    networks: StatefulModule,
    config: TrainConfig,
    steps: int,
    video_fn: Callable[[VideoData], None],
) -> None:
    """Record a deterministic episode with ``env.render`` and hand it to ``video_fn``."""
    render = getattr(env, "render", None)
    if render is None:
        raise TypeError(f"train_ppo: video needs an eval env with render(); {type(env).__name__}")
    with _eval_mode(networks):
        graphdef, state = nnx.split(networks)
        length = config.video.episode_length
        states, episode_reward = jax.device_get(
            _compiled_recording(
                _EnvArgument(env), graphdef, state, length, _key_at(config.seed, steps)
            )
        )
    trajectory = [jax.tree.map(lambda x, t=t: x[t], states) for t in range(length + 1)]
    frames = np.stack(render(trajectory, **config.video.render_kwargs))
    video_fn(VideoData(frames, steps, float(episode_reward), length))


def _steps_until_host_needed(
    steps: int, config: TrainConfig, checkpointing: bool, recording: bool
) -> int:
    """How many PPO steps may run in one call: ``iterations_per_call``, or 1 if an
    evaluation, video or checkpoint falls due (or training ends) before the last.

    Only what will happen counts: a checkpoint cadence without a ``checkpoint_fn``,
    or a video cadence without a ``video_fn``, does not stop the fusion.
    """
    per_step = config.ppo.steps_per_iteration
    fused = config.ppo.iterations_per_call
    last_inner = steps + (fused - 1) * per_step
    if fused == 1 or last_inner >= config.ppo.total_steps:
        return 1
    every = [config.checkpoint_every_steps] if checkpointing else []
    every += [config.eval.every_steps] if config.eval.enabled else []
    every += [config.video.every_steps] if config.video.enabled and recording else []
    return 1 if any(_crossed(steps, last_inner, e) for e in every) else fused


def _crossed(previous: int | None, steps: int, every: int) -> bool:
    """Whether ``steps`` passed a multiple of ``every`` since ``previous`` (always at the start)."""
    return previous is None or steps // every > previous // every


def _with_overrides(
    config: TrainConfig | None, total_steps: int | None, seed: int | None, devices: int | None
) -> TrainConfig:
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(
            f"train_ppo: config must be a TrainConfig, got a {type(config).__name__}; "
            "wrap a PPOConfig as TrainConfig(ppo=...)"
        )
    config = copy.deepcopy(config) if config is not None else default_config()
    if total_steps is not None:
        config.ppo.total_steps = total_steps
    if seed is not None:
        config.seed = seed
    if devices is not None:
        config.devices = devices
    config.validate()
    return config


def train_ppo(
    env: RLEnv,
    networks: StatefulModule,
    config: TrainConfig | None = None,
    *,
    total_steps: int | None = None,
    seed: int | None = None,
    devices: int | None = None,
    log_fn: Callable[[dict[str, float], int], None] | None = None,
    video_fn: Callable[[VideoData], None] | None = None,
    checkpoint_fn: Callable[[TrainingState, int], None] | None = None,
    eval_env: RLEnv | None = None,
    initial_state: TrainingState | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train ``networks`` with PPO on ``env`` until ``config.ppo.total_steps`` env steps.

    Evaluates (if enabled), records video (if enabled and ``video_fn`` is given)
    and checkpoints (if ``checkpoint_fn`` is given) at the start and whenever the
    step count passes a multiple of their ``every_steps``. A run resumed from an
    ``initial_state`` past step 0 continues that cadence: nothing is evaluated,
    recorded, logged or checkpointed again at the step it resumes from. After a
    PPO step, ``log_fn`` is called before ``checkpoint_fn``, so every step a
    checkpoint holds has been logged.

    Args:
      env: one unbatched training environment (wrap it in an ``EpisodeWrapper``
        for a time limit).
      networks: the PPO network; trained in place.
      config: the run's configuration; :func:`default_config` when ``None``.
      total_steps, seed, devices: override ``config.ppo.total_steps``, ``config.seed``
        and ``config.devices`` (see :mod:`~nnx_ppo.algorithms.sharding`: envs are
        split over the devices, parameters replicated).
      log_fn: called as ``log_fn(metrics, step)`` after every PPO step (and after
        the initial evaluation), ``metrics`` a flat ``str -> float`` dict.
      video_fn: receives a :class:`VideoData` per recording.
      checkpoint_fn: called as ``checkpoint_fn(training_state, step)``.
      eval_env: the evaluation environment; ``env`` when ``None``.
      initial_state: resume from this state (its optimizer included: the config's
        learning rate, clipping and decay then go unused) instead of a fresh one.
        It trains its own ``initial_state.networks``, so ``networks`` must be
        that same object.
      should_stop: polled after every PPO step; when it returns ``True`` (e.g. a
        signal handler saw Ctrl-C), training stops early and ``checkpoint_fn``, if
        given, writes a final checkpoint of the state reached.

    Returns:
      A :class:`TrainResult`; ``eval_history`` holds ``{"step": s, **eval_metrics}``
      per evaluation, with ``episode_reward_mean`` naming ``eval/episode_reward/mean``.

    Raises:
      TypeError: ``config`` is not a :class:`TrainConfig`, ``initial_state`` not a
        :class:`TrainingState`, or video is asked of an eval env without ``render``.
      ValueError: ``networks`` is not ``initial_state.networks``, or ``n_envs``
        (training or evaluation) does not split evenly over the devices; raised
        before anything compiles.
      FloatingPointError: the loss or a parameter became NaN or infinite.
    """
    config = _with_overrides(config, total_steps, seed, devices)
    mesh = sharding.resolve_mesh(config.devices)
    eval_envs = config.eval.n_envs if config.eval.enabled else None
    sharding.require_divisible(
        "train_ppo", mesh, config.ppo.n_envs, config.ppo.n_minibatches, eval_envs
    )
    if initial_state is not None:
        _require_training_state("train_ppo", "initial_state", initial_state)
        if initial_state.networks is not networks:
            raise ValueError(
                "train_ppo: networks is not initial_state.networks; a resumed state trains "
                "the network it holds, so pass train_ppo(env, initial_state.networks, ..., "
                "initial_state=initial_state)"
            )
    eval_env = env if eval_env is None else eval_env
    if initial_state is None:
        state = new_training_state(
            env,
            networks,
            config.ppo.n_envs,
            config.seed,
            config.ppo.learning_rate,
            config.ppo.gradient_clipping,
            config.ppo.weight_decay,
        )
    else:
        state = initial_state
    if mesh is not None:
        state = sharding.shard_training_state(state, mesh)
    timed = LoggingLevel.THROUGHPUT in config.ppo.logging_level
    history: list[dict[str, float]] = []
    resumed_at = state.steps_taken if state.steps_taken > 0 else None
    last: dict[str, int | None] = {
        "eval": resumed_at,
        "video": resumed_at,
        "checkpoint": resumed_at,
    }

    def evaluate_and_record(state: TrainingState) -> dict[str, float]:
        steps, metrics = state.steps_taken, {}
        if config.eval.enabled and _crossed(last["eval"], steps, config.eval.every_steps):
            key = _key_at(config.seed, steps)
            metrics = _evaluate(eval_env, state.networks, config.eval, key, timed, mesh)
            headline = metrics["eval/episode_reward/mean"]
            history.append({"step": steps, **metrics, "episode_reward_mean": headline})
            last["eval"] = steps
        video_due = _crossed(last["video"], steps, config.video.every_steps)
        if config.video.enabled and video_fn is not None and video_due:
            _record(eval_env, state.networks, config, steps, video_fn)
            last["video"] = steps
        return metrics

    def checkpoint(state: TrainingState, due: bool) -> None:
        if checkpoint_fn is not None and last["checkpoint"] != state.steps_taken and due:
            checkpoint_fn(state, state.steps_taken)
            last["checkpoint"] = state.steps_taken

    def checkpoint_due(steps: int) -> bool:
        return _crossed(last["checkpoint"], steps, config.checkpoint_every_steps)

    metrics = evaluate_and_record(state)
    if log_fn is not None and metrics:
        log_fn(metrics, state.steps_taken)
    checkpoint(state, checkpoint_due(state.steps_taken))
    iterations = 0
    while state.steps_taken < config.ppo.total_steps:
        start = time.perf_counter()
        fused = _steps_until_host_needed(
            state.steps_taken, config, checkpoint_fn is not None, video_fn is not None
        )
        state, per_step = ppo_steps(env, state, config.ppo, fused)
        iterations += fused
        if timed:
            elapsed = time.perf_counter() - start
            for metrics in per_step:
                metrics["throughput/train_sps"] = fused * config.ppo.steps_per_iteration / elapsed
        *earlier, metrics = per_step
        metrics |= evaluate_and_record(state)
        if log_fn is not None:
            for logged in earlier:
                log_fn(logged, int(logged["total_steps"]))
            log_fn(metrics, state.steps_taken)
        stopping = should_stop is not None and should_stop()
        checkpoint(state, stopping or checkpoint_due(state.steps_taken))
        if stopping:
            break
    return TrainResult(state, metrics, history, state.steps_taken, iterations)
