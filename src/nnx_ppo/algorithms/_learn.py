"""Learn from a rollout: epochs of minibatches of whole environments over the loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jaxtyping import Array, Bool, Integer, PRNGKeyArray, PyTree

from nnx_ppo.algorithms._loss import ppo_loss
from nnx_ppo.algorithms.config import (
    PPOConfig,
)
from nnx_ppo.algorithms.types import Transition
from nnx_ppo.contract.axes import Carry, FloatHistory
from nnx_ppo.networks.types import (
    StatefulModule,
)


class _LearnData(NamedTuple):
    """What the updates learn from: a rollout and its scores (a minibatch of one, too)."""

    carry: Carry
    """The carry the rollout started from, leaves ``(B, ...)``."""
    transitions: Transition
    """The rollout, leaves ``(T, B, ...)``."""
    advantages: PyTree[FloatHistory]
    targets: PyTree[FloatHistory]
    """The value targets, like the advantages one ``(T, B)`` leaf per reward leaf."""


def _select_envs(
    columns: Integer[Array, " groups"], n_minibatches: int, data: _LearnData
) -> _LearnData:
    """One minibatch: from every group of ``n_minibatches`` neighbouring envs, one env.

    Env ``g * n_minibatches + columns[g]`` of each group ``g`` is taken. Groups
    never straddle devices (``n_envs`` is a multiple of devices x minibatches), so
    a minibatch takes the same number of envs from every device and no rollout
    moves between them, whatever the device count. Carry leaves are ``(B, ...)``,
    the rest ``(T, B, ...)``.
    """
    carry, transitions, advantages, targets = data
    transitions = transitions.replace(metrics={})

    def take(env_axis: int) -> Callable[[Array], Array]:
        def pick(x: Array) -> Array:
            shape = x.shape
            groups = shape[env_axis] // n_minibatches  # not -1: a leaf may have no elements
            grouped = x.reshape(*shape[:env_axis], groups, n_minibatches, *shape[env_axis + 1 :])
            one_per_group = jax.vmap(
                lambda group, column: jnp.take(group, column, axis=env_axis),
                in_axes=(env_axis, 0),
                out_axes=env_axis,
            )
            return one_per_group(grouped, columns)

        return pick

    return _LearnData(
        jax.tree.map(take(0), carry),
        jax.tree.map(take(1), transitions),
        *jax.tree.map(take(1), [advantages, targets]),
    )


def _minibatch_update(
    graphdef: nnx.GraphDef[Any], config: PPOConfig, data: _LearnData
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
        # What the replay sowed (nnx.Intermediate) is not kept: the scan's carry keeps
        # the structure it started with.
        nnx.pop(networks, nnx.Intermediate)
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
    data: _LearnData,
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
    nnx.pop(networks, nnx.Intermediate)  # what the rollout sowed: the scan carries none
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
