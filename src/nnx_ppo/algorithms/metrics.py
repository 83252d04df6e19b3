"""Training and evaluation metrics: flat ``str -> float`` dicts with ``/``-separated names.

A tree of values becomes one entry per leaf, its path appended to the name
(``losses/critic/agent_0/mean``). A distribution is summarised by ``mean`` and
``std``, or by ``p<N>`` percentiles when percentiles are asked for; a boolean
array by the fraction that holds; a scalar is logged as it is.

Which metrics a training step computes follows the
:class:`~nnx_ppo.algorithms.types.LoggingLevel` flags:

=============== ================================================================
flag            metrics
=============== ================================================================
LOSSES          ``losses/actor``, ``losses/critic`` (per leaf), ``losses/regularization``,
                ``losses/total``: over the step's minibatch updates
ACTOR_EXTRA     ``losses/clipping_fraction``, ``losses/approx_kl`` (per action leaf),
                ``losses/epochs_completed``, ``loglikelihood``, ``policy/entropy``
CRITIC_EXTRA    ``losses/predicted_value``, ``losses/advantages``, ``losses/critic_R^2``,
                ``losses/explained_variance`` (per reward leaf; NaN for targets that
                do not vary)
ROLLOUT_STATS   ``rollout_batch/{reward,action,done_rate,truncation_rate}``, and for
                episodes that ended in the rollout ``rollout_batch/episode_reward/mean``,
                ``rollout_batch/lifespan/mean``, ``rollout_batch/episodes_completed``
ROLLOUT_OBS     ``rollout_batch/obs``
ENV_METRICS     ``env/...``: the env's ``metrics``
NETWORK_METRICS ``net/...``: the network's ``metrics``
GRAD_NORM       ``grad_norm``: the global gradient norm before clipping
WEIGHTS         ``weights``: every ``nnx.Param`` entry pooled
THROUGHPUT      ``throughput/train_sps``, ``throughput/eval_sps``: env steps per second
=============== ================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int, PyTree, Shaped

from nnx_ppo.algorithms.types import LoggingLevel, RunningEpisodes, Transition
from nnx_ppo.contract.axes import BoolHistory, FloatBatch, FloatHistory, Mask

__all__ = [
    "EpisodeTotals",
    "compute_metrics",
    "episode_metrics",
    "has_reward_leaves",
    "log_weight_stats",
    "summarize",
    "to_host",
    "track_episodes",
]

_LOSS_METRIC_LEVELS: dict[str, LoggingLevel] = {
    "losses/actor": LoggingLevel.LOSSES,
    "losses/critic": LoggingLevel.LOSSES,
    "losses/regularization": LoggingLevel.LOSSES,
    "losses/total": LoggingLevel.LOSSES,
    "losses/clipping_fraction": LoggingLevel.ACTOR_EXTRA,
    "losses/approx_kl": LoggingLevel.ACTOR_EXTRA,
    "losses/epochs_completed": LoggingLevel.ACTOR_EXTRA,
    "losses/critic_R^2": LoggingLevel.CRITIC_EXTRA,
    "losses/advantages": LoggingLevel.CRITIC_EXTRA,
    "losses/explained_variance": LoggingLevel.CRITIC_EXTRA,
    "grad_norm": LoggingLevel.GRAD_NORM,
}
"""The flag each of the training step's loss metrics is logged under."""

_ROLLOUT_METRIC_LEVELS: dict[str, LoggingLevel] = {
    "env": LoggingLevel.ENV_METRICS,
    "net": LoggingLevel.NETWORK_METRICS,
}
"""The flag each group of a rollout's ``Transition.metrics`` is logged under."""


def _logged_rollout_metrics(metrics: dict[str, Any], logging_level: LoggingLevel) -> dict[str, Any]:
    """A rollout's ``Transition.metrics`` with each group that ``logging_level`` does
    not log replaced by ``{}``.

    A program returns every array it is asked for, so a rollout compiled as a program
    of its own computes and stores each step's metrics unless they are dropped first.
    Dropped, a metric that nothing logs costs nothing: a ``NormalTanhSampler``'s
    entropy, integrated numerically at every step, was 14% of config A's rollout
    program (``benchmarks/README.md``).
    """
    return {
        group: tree if _ROLLOUT_METRIC_LEVELS[group] in logging_level else {}
        for group, tree in metrics.items()
    }


def _key_name(key: Any) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def summarize(
    name: str,
    tree: PyTree[Shaped[Array, "..."]],
    percentiles: tuple[int, ...] | None = None,
    *,
    always_moments: bool = False,
    ignore_nan: bool = False,
) -> dict[str, Float[Array, ""]]:
    """Summarise every leaf of ``tree`` under ``name`` plus the leaf's path.

    Args:
      name: the prefix, e.g. ``"losses/critic"``.
      tree: a pytree of arrays (or one array).
      percentiles: report ``p<N>`` for each, instead of ``mean`` and ``std`` (``None``
        or ``()``: ``mean`` and ``std``, as the configs' ``logging_percentiles``).
      always_moments: report ``mean`` and ``std`` even with percentiles.
      ignore_nan: leave NaN entries out (they mark skipped updates).

    Returns:
      ``{name/path/mean, name/path/std}`` or ``{name/path/p<N>}`` per leaf; a
      boolean leaf gives ``{name/path: fraction true}``, a scalar ``{name/path: value}``.
    """
    mean, std, percentile = (
        (jnp.nanmean, jnp.nanstd, jnp.nanpercentile)
        if ignore_nan
        else (jnp.mean, jnp.std, jnp.percentile)
    )
    summary: dict[str, Float[Array, ""]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        leaf_name = "/".join([name, *(_key_name(key) for key in path)])
        leaf = jnp.asarray(leaf)
        if leaf.dtype == jnp.bool_:
            summary[leaf_name] = jnp.mean(leaf)
            continue
        if leaf.ndim == 0:
            summary[leaf_name] = leaf.astype(jnp.float32)
            continue
        leaf = leaf.astype(jnp.float32)
        if not percentiles or always_moments:
            summary[f"{leaf_name}/mean"] = mean(leaf)
            summary[f"{leaf_name}/std"] = std(leaf)
        if percentiles:
            values = percentile(leaf, jnp.asarray(percentiles, jnp.float32))
            for level, value in zip(percentiles, values, strict=True):
                summary[f"{leaf_name}/p{level}"] = value
    return summary


def compute_metrics(
    loss_metrics: dict[str, PyTree[Shaped[Array, "..."]]],
    rollout_data: Transition,
    logging_level: LoggingLevel,
    percentile_levels: tuple[int, ...] | None = None,
) -> dict[str, Float[Array, ""]]:
    """The training step's metrics, as ``logging_level`` asks.

    Args:
      loss_metrics: name to tree of values (per minibatch update, NaN where an
        update was skipped by the KL early stop); names in the table above are
        kept under their flag, other names always.
      rollout_data: the step's stacked transitions, leaves ``(T, B, ...)``.
      logging_level: which metrics to compute.
      percentile_levels: summarise by these percentiles instead of mean and std.
    """
    metrics: dict[str, Float[Array, ""]] = {}
    for name, tree in loss_metrics.items():
        if _LOSS_METRIC_LEVELS.get(name, logging_level) in logging_level:
            metrics |= summarize(name, tree, percentile_levels, ignore_nan=True)
    output = rollout_data.network_output
    groups: list[tuple[LoggingLevel, str, Any]] = [
        *(
            (level, group, rollout_data.metrics[group])
            for group, level in _ROLLOUT_METRIC_LEVELS.items()
        ),
        (LoggingLevel.ROLLOUT_STATS, "rollout_batch/reward", rollout_data.rewards),
        (LoggingLevel.ROLLOUT_STATS, "rollout_batch/action", output.actions),
        (LoggingLevel.ROLLOUT_STATS, "rollout_batch/done_rate", rollout_data.done),
        (LoggingLevel.ROLLOUT_STATS, "rollout_batch/truncation_rate", rollout_data.truncated),
        (LoggingLevel.ROLLOUT_OBS, "rollout_batch/obs", rollout_data.obs),
        (LoggingLevel.ACTOR_EXTRA, "loglikelihood", output.loglikelihoods),
        (LoggingLevel.CRITIC_EXTRA, "losses/predicted_value", output.value_estimates),
    ]
    for level, name, tree in groups:
        if level in logging_level:
            metrics |= summarize(name, tree, percentile_levels)
    if LoggingLevel.ACTOR_EXTRA in logging_level:
        # -E[log pi(a)] over the actions taken: a Monte Carlo estimate of the entropy.
        entropy = jax.tree.map(lambda ll: -jnp.mean(ll), output.loglikelihoods)
        metrics |= summarize("policy/entropy", entropy)
    return metrics


def log_weight_stats(
    metrics: dict[str, Any],
    networks: nnx.Module,
    percentile_levels: tuple[int, ...] | None = None,
) -> None:
    """Add ``weights/...``: every ``nnx.Param`` entry of ``networks`` pooled, to ``metrics``."""
    leaves = jax.tree.leaves(nnx.state(networks, nnx.Param))
    if not leaves:
        raise ValueError("log_weight_stats: the network has no nnx.Param to summarise")
    pooled = jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])
    metrics.update(summarize("weights", pooled, percentile_levels))


class EpisodeTotals(TypedDict):
    """What :func:`track_episodes` totals over the episodes that ended in a rollout."""

    count: Int[Array, ""]
    """How many ended."""
    returns: PyTree[Float[Array, ""]]
    """Their returns summed, one scalar per reward leaf."""
    lengths: Int[Array, ""]
    """Their lengths summed."""


class _EpisodeScan(NamedTuple):
    """The scan carry of :func:`track_episodes`."""

    running: RunningEpisodes
    totals: EpisodeTotals


def _episode_sum_dtype(dtype: Any) -> np.dtype[Any]:
    """The dtype a value is summed in over an episode's steps: a float of at least 32 bits.

    A bfloat16 sum stops growing at 256 (256 + 1 rounds back to 256), a uint8 count
    wraps at 256 and a sum of booleans would be a logical or; so booleans, integers
    and floats narrower than float32 are summed as float32."""
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


def track_episodes(
    running: RunningEpisodes,
    rewards: PyTree[FloatHistory],
    ended: BoolHistory,
) -> tuple[RunningEpisodes, EpisodeTotals]:
    """Advance the episodes in progress through a rollout; total those that ended.

    Returns:
      The episodes still in progress after the rollout, and totals over the
      episodes that ended in it: ``count``, ``returns`` (summed per reward leaf)
      and ``lengths`` (summed), for :func:`episode_metrics`.
    """

    def step(
        carry: _EpisodeScan, inputs: tuple[PyTree[FloatBatch], Mask]
    ) -> tuple[_EpisodeScan, None]:
        running, totals = carry
        reward, end = inputs
        returns = jax.tree.map(jnp.add, running.returns, reward)
        lengths = running.lengths + 1
        # Sums keep the carry's dtypes: under x64 they would widen int32 to int64.
        totals = EpisodeTotals(
            count=totals["count"] + jnp.sum(end, dtype=jnp.int32),
            returns=jax.tree.map(
                lambda t, g: t + jnp.sum(jnp.where(end, g, 0.0), dtype=t.dtype),
                totals["returns"],
                returns,
            ),
            lengths=totals["lengths"] + jnp.sum(jnp.where(end, lengths, 0), dtype=jnp.int32),
        )
        running = RunningEpisodes(
            returns=jax.tree.map(lambda g: jnp.where(end, 0.0, g), returns),
            lengths=jnp.where(end, 0, lengths),
        )
        return _EpisodeScan(running, totals), None

    zero_totals = EpisodeTotals(
        count=jnp.zeros((), jnp.int32),
        returns=jax.tree.map(lambda g: jnp.zeros((), g.dtype), running.returns),
        lengths=jnp.zeros((), jnp.int32),
    )
    (running, totals), _ = jax.lax.scan(step, _EpisodeScan(running, zero_totals), (rewards, ended))
    return running, totals


def has_reward_leaves(returns: PyTree[Any]) -> bool:
    """Whether returns come as a tree (a dict, tuple, ...) whose leaves are logged apart,
    beside their total; a single array is the total alone."""
    return not jax.tree_util.treedef_is_leaf(jax.tree.structure(returns))


def episode_metrics(totals: EpisodeTotals) -> dict[str, float]:
    """Host-side means of :func:`track_episodes`' totals; only the count if none ended."""
    totals = jax.device_get(totals)
    count = int(totals["count"])
    metrics = {"rollout_batch/episodes_completed": float(count)}
    if count == 0:
        return metrics
    returns = totals["returns"]
    total = jax.tree.reduce(np.add, returns)
    metrics["rollout_batch/episode_reward/mean"] = float(total) / count
    if has_reward_leaves(returns):
        for path, value in jax.tree_util.tree_flatten_with_path(returns)[0]:
            name = "/".join(_key_name(key) for key in path)
            metrics[f"rollout_batch/episode_reward/{name}/mean"] = float(value) / count
    metrics["rollout_batch/lifespan/mean"] = float(totals["lengths"]) / count
    return metrics


def to_host(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Fetch device scalars into a plain ``str -> float`` dict (one transfer)."""
    return {name: float(value) for name, value in jax.device_get(dict(metrics)).items()}
