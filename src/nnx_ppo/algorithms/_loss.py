"""The PPO loss of a minibatch of whole environments, and the replay it rests on (which
distillation's loss shares)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from nnx_ppo._numerics import fraction_explained, moments
from nnx_ppo.algorithms import rollout
from nnx_ppo.algorithms.config import (
    AdvantageNormalization,
    PPOConfig,
)
from nnx_ppo.algorithms.types import (
    Transition,
)
from nnx_ppo.contract.axes import (
    BatchedTree,
    Carry,
    Extras,
    FloatBatch,
    FloatHistory,
    Mask,
    Scalar,
)
from nnx_ppo.contract.checking import typechecked
from nnx_ppo.networks.types import (
    ModuleState,
    PPONetworkOutput,
    StatefulModule,
    checked_ppo_output,
)

_EPSILON = 1e-8


def _replay(
    networks: StatefulModule, network_state: ModuleState, rollout_data: Transition, where: str
) -> tuple[PPONetworkOutput, Float[Array, " T"]]:
    """Re-run the network over the stored observations, as the rollout ran it.

    Each step is fed its stored ``rollout_extras`` (so samplers score the stored
    action). A carry that the parameters cannot change (per-env keys, counters:
    the rollout kept it in ``carries``) is the stored one, so every step is
    replayed at once, in one flat batch of ``T * B``. Otherwise the steps are
    scanned from the rollout's first carry, which is reset where an episode
    ended, as in the rollout, and gradients flow through the carry. ``where``
    names the loss in contract errors.

    Returns:
      The network's output, leaves ``(T, B, ...)``, and its regularisation loss
      per step, ``(T,)``.
    """
    if rollout._replays_flat(networks, network_state, rollout_data):
        return rollout._replay_flat(networks, rollout_data, where)

    def step(
        networks: StatefulModule,
        carry: ModuleState,
        inputs: tuple[BatchedTree, Mask, Extras, PyTree[FloatBatch]],
    ) -> tuple[ModuleState, tuple[PPONetworkOutput, Float[Array, ""]]]:
        obs, ended, extras, rewards = inputs
        out = networks(carry, obs, extras)
        checked_ppo_output(out.output, where, rewards)
        carry = rollout.tree_where(ended, networks.reset_state(out.next_state), out.next_state)
        return carry, (out.output, jnp.mean(out.regularization_loss))

    ended = rollout.episode_ended(rollout_data.done)
    inputs = (rollout_data.obs, ended, rollout_data.rollout_extras, rollout_data.rewards)
    _, (output, regularization) = rollout.scan_module(networks, step, network_state, inputs)
    return output, regularization


def _policy_advantages(
    advantages: PyTree[FloatHistory], loglikelihoods: PyTree[FloatHistory], combine: bool
) -> PyTree[FloatHistory]:
    """One advantage per action leaf.

    ``combine`` trains every action leaf on the sum over reward leaves (a team
    advantage); a single reward leaf is shared by every action leaf; otherwise
    the reward and action trees must match leaf for leaf (one agent each).
    """
    require_advantage_per_action("ppo_loss", advantages, loglikelihoods, combine)
    if combine or len(jax.tree.leaves(advantages)) == 1:
        shared = jax.tree.reduce(jnp.add, advantages)
        return jax.tree.map(lambda _: shared, loglikelihoods)
    return advantages


def require_advantage_per_action(
    owner: str, rewards: PyTree[Any], loglikelihoods: PyTree[Any], combine: bool
) -> None:
    """Every action leaf of ``loglikelihoods`` gets an advantage from the reward tree
    ``rewards`` (or the advantages, its mirror), as :func:`ppo_loss` assigns them;
    reads the trees' structures only."""
    if combine or len(jax.tree.leaves(rewards)) == 1:
        return
    if jax.tree.structure(rewards) == jax.tree.structure(loglikelihoods):
        return
    if len(jax.tree.leaves(loglikelihoods)) == 1:
        raise ValueError(
            f"{owner}: the network returns one joint log-likelihood for its actions (one "
            f"probability ratio), but the reward tree {jax.tree.structure(rewards)} "
            "gives one advantage per leaf. Set PPOConfig.combine_advantages=True to train "
            "the joint policy on the summed advantage, return one log-likelihood per "
            "reward leaf (a dict with the reward's keys), or give a single reward."
        )
    raise ValueError(
        f"{owner}: the reward tree "
        f"{jax.tree.structure(rewards)} and the log-likelihood tree "
        f"{jax.tree.structure(loglikelihoods)} differ, so no action leaf has its own "
        "advantage. Give one reward leaf per action leaf, or set "
        "PPOConfig.combine_advantages=True to train every action leaf on the summed advantage."
    )


def _standardize(
    advantages: PyTree[FloatHistory], mode: AdvantageNormalization
) -> PyTree[FloatHistory]:
    """Advantages less their mean, over their std; equal advantages give exactly 0 (with
    float32's mean alone, about -1 everywhere). ``"global"`` pools every leaf."""
    if mode == "per_leaf":
        return jax.tree.map(lambda a: _standardized(a, *moments(a)), advantages)
    pooled = moments(jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(advantages)]))
    return jax.tree.map(lambda a: _standardized(a, *pooled), advantages)


def _standardized(
    advantage: FloatHistory, mean: Float[Array, ""], variance: Float[Array, ""]
) -> FloatHistory:
    return (advantage - mean) / (jnp.sqrt(variance) + _EPSILON)


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
    output, regularization = _replay(networks, network_state, rollout_data, "ppo_loss")
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
            lambda v, t: fraction_explained(jnp.mean((v - t) ** 2), t),
            output.value_estimates,
            value_targets,
        ),
    }
    return total, diagnostics
