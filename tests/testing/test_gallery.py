"""A gallery of classic bugs in modules and environments, each caught by the kit.

Every entry below is a small, deliberately broken module or environment with one
mistake that users make; its test asserts which property of the contract the kit
reports and that the message names the leaf (or variable) at fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jaxtyping import Array

from nnx_ppo import envs
from nnx_ppo.envs.state import Shared
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import new_env_keys, split_env_keys
from nnx_ppo.testing import (
    ContractPropertyError,
    EnvProperty,
    ModuleProperty,
    check_env,
    check_module,
)
from nnx_ppo.testing.modules import RunningSum

FEATURES = 3


def _out(next_state: Any, output: Any, extras: Any = None) -> StatefulModuleOutput:
    return StatefulModuleOutput(next_state, output, jnp.zeros(()), {}, extras)


class Leaky(StatefulModule):
    """A correct leaky integrator, ``h <- 0.5 h + x``; the bugs below each change one thing."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"h": jnp.zeros((batch_size, FEATURES))}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = 0.5 * state["h"] + x
        return _out({"h": h}, h)

    def reset_state(self, prev_state: Any) -> Any:
        return jax.tree.map(jnp.zeros_like, prev_state)


# ------------------------------------------------------------------------------ modules


class BatchMeanInForward(Leaky):
    """Centres its input on the batch mean: each env's output depends on the others."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = 0.5 * state["h"] + x - x.mean(axis=0)
        return _out({"h": h}, h)


class ScansTheBatchAsTime(Leaky):
    """Written for (T, feat) sequences, it scans its leading axis: the batch, not time."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        def cell(carry: Array, x_t: Array) -> tuple[Array, Array]:
            carry = 0.5 * carry + x_t
            return carry, carry

        _, outputs = jax.lax.scan(cell, jnp.zeros(FEATURES), x)
        return _out(state, outputs)


class ChangesCarryDtype(Leaky):
    """Saves memory by storing the carry in float16; the carry's dtype changes."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = 0.5 * state["h"] + x
        return _out({"h": h.astype(jnp.float16)}, h)


class HardCodedBatch(Leaky):
    """Built for the training run's 16 envs: the carry ignores the batch size asked for."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"h": jnp.zeros((16, FEATURES))}


class StartsFromTheBatchSize(Leaky):
    """Starts each env's carry at 1 / batch_size: an env acts otherwise in a batch of
    another size (evaluation's envs against training's)."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"h": jnp.full((batch_size, FEATURES), 1.0 / batch_size)}


class SpreadOverTheBatch(Leaky):
    """Starts the envs spread over [0, 1]: env 0 at 0 whatever the batch size, env 1 at 1
    of 2 and at 0.5 of 3."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        start = jnp.linspace(0.0, 1.0, batch_size)[:, None]
        return {"h": jnp.broadcast_to(start, (batch_size, FEATURES))}


class RemembersTheBatchSize(Leaky):
    """Stores the batch size it was set up for in a variable: training's compiled
    ``initialize_state`` runs on a copy of the network and loses the write."""

    def __init__(self) -> None:
        self.batch_size = nnx.Variable(jnp.ones(()))

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        self.batch_size[...] = jnp.asarray(float(batch_size))
        return super().initialize_state(batch_size)


class ResetDropsTheBatchAxis(Leaky):
    """Resets to a fresh one-env carry, dropping the batch axis of a batched carry."""

    def reset_state(self, prev_state: Any) -> Any:
        return {"h": jnp.zeros(FEATURES)}


class ResetAssumesABatchAxis(Leaky):
    """Reads the batch size off the carry: under vmap, on one env's slice, there is none."""

    def reset_state(self, prev_state: Any) -> Any:
        return {"h": jnp.zeros((prev_state["h"].shape[0], FEATURES))}


class ResamplesInReplay(NormalSampler):
    """Ignores the stored action in replay and samples again: PPO scores the wrong action."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return super().__call__(state, x, None)


class ReplaysItsStoredLogLikelihood(NormalSampler):
    """Stores its log-likelihood beside the raw action and hands it back in replay:
    replay reproduces the rollout, but PPO's ratio stays 1 and the policy never learns."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, None if rollout_extras is None else rollout_extras["raw"])
        stored = out.output["log_likelihood"] if rollout_extras is None else rollout_extras["logp"]
        return out.replace(
            output={**out.output, "log_likelihood": stored},
            rollout_extras={"raw": out.rollout_extras, "logp": stored},
        )


class ModuleLevelRng(Leaky):
    """Adds noise from an ``nnx.Rngs`` it holds, advanced in every call."""

    def __init__(self) -> None:
        self.rngs = nnx.Rngs(0)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = 0.5 * state["h"] + x + 0.1 * jax.random.normal(self.rngs.noise(), x.shape)
        return _out({"h": h}, h)


class RunningMeanInCall(Leaky):
    """Updates its running mean in the forward pass instead of in update_statistics."""

    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(FEATURES))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        self.mean[...] = 0.99 * self.mean[...] + 0.01 * x.mean(axis=0)
        h = 0.5 * state["h"] + x - self.mean[...]
        return _out({"h": h}, h)


class LastStepStatistics(StatefulModule):
    """Keeps the mean of the last step of each rollout: it folds time as if it were order."""

    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(FEATURES))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), x - self.mean[...], x)

    def update_statistics(self, rollout_extras: Array) -> None:
        self.mean[...] = rollout_extras[-1].mean(axis=0)


class AveragesSampleBySample(StatefulModule):
    """Moves its running mean towards each sample in turn, in the order the history lists
    them: the samples of a step have no order, so the mean depends on which came last."""

    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(FEATURES))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), x - self.mean[...], x)

    def update_statistics(self, rollout_extras: Array) -> None:
        def towards(mean: Array, sample: Array) -> tuple[Array, None]:
            return 0.9 * mean + 0.1 * sample, None

        samples = rollout_extras.reshape(-1, FEATURES)
        self.mean[...], _ = jax.lax.scan(towards, self.mean[...], samples)


class CountsStepsNotSamples(StatefulModule):
    """A running mean that weighs each history by its T steps, forgetting its B envs."""

    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(FEATURES))
        self.count = nnx.BatchStat(jnp.zeros(()))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), x - self.mean[...], x)

    def update_statistics(self, rollout_extras: Array) -> None:
        steps = rollout_extras.shape[0]
        count = self.count[...] + steps
        batch_mean = rollout_extras.mean(axis=(0, 1))
        self.mean[...] = self.mean[...] + (batch_mean - self.mean[...]) * steps / count
        self.count[...] = count


class _FoldsARunningMean:
    """A mixin that folds the history into the module's running mean."""

    mean: nnx.BatchStat[Array]

    def update_statistics(self, rollout_extras: Array) -> None:
        self.mean[...] = rollout_extras.reshape(-1, FEATURES).mean(axis=0)


class MixinShadowedByTheDefault(StatefulModule, _FoldsARunningMean):
    """Lists its statistics mixin after StatefulModule, whose no-op default update_statistics
    then shadows the mixin's: the mean never moves."""

    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(FEATURES))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), x - self.mean[...], x)


class ReplaySkipsTheCarry(Leaky):
    """In replay, keeps the carry it was given instead of advancing it."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = 0.5 * state["h"] + x
        next_h = state["h"] if rollout_extras is not None else h
        return _out({"h": next_h}, h, x)


class ReplayGainsByPosition(Leaky):
    """Scales each env's input by the env's own gain, kept in its carry (one gain per env,
    as in domain randomisation). To save a gather, its replay takes the gains in batch
    order instead: right when the whole rollout is replayed, wrong for a minibatch of
    some of the envs."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        gains = 1.0 + jnp.arange(batch_size, dtype=jnp.float32)
        return {"h": jnp.zeros((batch_size, FEATURES)), "gain": gains}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        in_order = 1.0 + jnp.arange(x.shape[0], dtype=jnp.float32)
        gain = state["gain"] if rollout_extras is None else in_order
        h = 0.5 * state["h"] + gain[:, None] * x
        return _out({"h": h, "gain": state["gain"]}, h, x)

    def reset_state(self, prev_state: Any) -> Any:
        return {"h": jnp.zeros_like(prev_state["h"]), "gain": prev_state["gain"]}


class Pair(StatefulModule):
    """A correct container: runs ``first`` then ``second``, routing everything per child."""

    def __init__(self, first: StatefulModule, second: StatefulModule) -> None:
        self.first = first
        self.second = second

    def initialize_state(self, batch_size: int) -> dict[str, Any]:
        return {
            "first": self.first.initialize_state(batch_size),
            "second": self.second.initialize_state(batch_size),
        }

    def reset_state(self, prev_state: Any) -> Any:
        return {
            "first": self.first.reset_state(prev_state["first"]),
            "second": self.second.reset_state(prev_state["second"]),
        }

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        extras = rollout_extras or {"first": None, "second": None}
        a = self.first(state["first"], x, extras["first"])
        b = self.second(state["second"], a.output, extras["second"])
        return StatefulModuleOutput(
            {"first": a.next_state, "second": b.next_state},
            b.output,
            a.regularization_loss + b.regularization_loss,
            {"first": a.metrics, "second": b.metrics},
            {"first": a.rollout_extras, "second": b.rollout_extras},
        )

    def update_statistics(self, rollout_extras: Any) -> None:
        self.first.update_statistics(rollout_extras["first"])
        self.second.update_statistics(rollout_extras["second"])


class ForgetsOneChildsState(Pair):
    """Reassembles the next carry from its first child alone."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        return out.replace(next_state={"first": out.next_state["first"]})


class ForgetsUpdateStatistics(Pair):
    """Routes everything but update_statistics: the normaliser inside never learns."""

    def update_statistics(self, rollout_extras: Any) -> None:
        self.first.update_statistics(rollout_extras["first"])


class NormalizesTwoViews(Pair):
    """A correct container: normalises ``x`` and ``2 x``, one Normalizer each."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        extras = rollout_extras or {"first": None, "second": None}
        a = self.first(state["first"], x, extras["first"])
        b = self.second(state["second"], 2.0 * x, extras["second"])
        return StatefulModuleOutput(
            {"first": a.next_state, "second": b.next_state},
            a.output + b.output,
            jnp.zeros(()),
            {},
            {"first": a.rollout_extras, "second": b.rollout_extras},
        )


class SwapsHistories(NormalizesTwoViews):
    """Routes each child the other's history: same shapes, so only the values tell."""

    def update_statistics(self, rollout_extras: Any) -> None:
        self.first.update_statistics(rollout_extras["second"])
        self.second.update_statistics(rollout_extras["first"])


class PacksAndSwapsHistories(NormalizesTwoViews):
    """Packs both histories into one array and unpacks them the wrong way round: the
    children are given arrays the container computed, not the ones it was given."""

    def update_statistics(self, rollout_extras: Any) -> None:
        packed = jnp.stack([rollout_extras["first"], rollout_extras["second"]])
        self.first.update_statistics(packed[1])
        self.second.update_statistics(packed[0])


class FeedsFirstBothHistories(NormalizesTwoViews):
    """A copy-paste slip: the first child is also given its sibling's history."""

    def update_statistics(self, rollout_extras: Any) -> None:
        self.first.update_statistics(rollout_extras["first"])
        self.first.update_statistics(rollout_extras["second"])
        self.second.update_statistics(rollout_extras["second"])


class ForgetsResetState(Pair):
    """Resets its first child's carry only: the second's goes on across episodes."""

    def reset_state(self, prev_state: Any) -> Any:
        return {**prev_state, "first": self.first.reset_state(prev_state["first"])}


class Residual(StatefulModule):
    """``x + inner(x)``: routes the carry and the extras, inherits the no-op update_statistics."""

    def __init__(self, inner: StatefulModule) -> None:
        self.inner = inner

    def initialize_state(self, batch_size: int) -> Any:
        return self.inner.initialize_state(batch_size)

    def reset_state(self, prev_state: Any) -> Any:
        return self.inner.reset_state(prev_state)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.inner(state, x, rollout_extras)
        return out.replace(output=x + out.output)


class Rematerialized(Residual):
    """A correct wrapper that saves memory: its child runs under ``jax.checkpoint``."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return jax.checkpoint(lambda s, x, e: self.inner(s, x, e))(state, x, rollout_extras)

    def update_statistics(self, rollout_extras: Any) -> None:
        self.inner.update_statistics(rollout_extras)


class KeysNeverSplit(Leaky):
    """Draws noise from per-env keys in its carry, but hands the same keys on."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"keys": new_env_keys(nnx.Rngs(0), batch_size)}

    def reset_state(self, prev_state: Any) -> Any:
        return prev_state

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        _, step_keys = split_env_keys(state["keys"])
        noise = jax.vmap(lambda key: jax.random.normal(key, (FEATURES,)))(step_keys)
        return _out(state, x + noise)


class OneKeyForAllEnvs(KeysNeverSplit):
    """Seeds every env with the same key: all envs draw the same noise."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"keys": jnp.broadcast_to(jax.random.key(0), (batch_size,))}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        next_keys, step_keys = split_env_keys(state["keys"])
        noise = jax.vmap(lambda key: jax.random.normal(key, (FEATURES,)))(step_keys)
        return _out({"keys": next_keys}, x + noise)


class NoiseFromAFixedKey(KeysNeverSplit):
    """Splits its per-env keys every step, as it should, but draws the noise from a fixed
    key: every env and every step get the same noise."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        next_keys, _ = split_env_keys(state["keys"])
        return _out({"keys": next_keys}, x + jax.random.normal(jax.random.key(0), (FEATURES,)))


class NoiseKeyedOnItsInputs(KeysNeverSplit):
    """Folds every input into its per-env keys (the same observation, the same noise) and
    keeps the key stream through reset_state, as it may: the keys now carry the episode
    across its end. reset_state of the final carry and of the initial one, given the same
    keys, agree; only a rollout given other inputs before the end shows it."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        keys = state["keys"]
        for bits in jax.lax.bitcast_convert_type(x, jnp.uint32).T:
            keys = jax.vmap(jax.random.fold_in)(keys, bits)
        next_keys, step_keys = split_env_keys(keys)
        noise = jax.vmap(lambda key: jax.random.normal(key, (FEATURES,)))(step_keys)
        return _out({"keys": next_keys}, x + noise)


class EpisodeNoise(Leaky):
    """Correct: noise drawn once per episode (at initialize_state and reset_state) from
    per-env keys, added to every step's input; the keys change at resets only."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return self._drawn(new_env_keys(nnx.Rngs(0), batch_size))

    def reset_state(self, prev_state: Any) -> Any:
        return self._drawn(split_env_keys(prev_state["keys"])[0])

    @staticmethod
    def _drawn(keys: Array) -> dict[str, Array]:
        # (B,) keys give (B, F) noise; one env's slice under vmap, a () key, gives (F,).
        noise = jax.vmap(lambda key: jax.random.normal(key, (FEATURES,)))(keys.reshape(-1))
        return {"keys": keys, "noise": noise.reshape(*keys.shape, FEATURES)}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out(state, x + state["noise"])


class EpisodeNoiseKeptAtReset(EpisodeNoise):
    """Draws once per episode, but reset_state keeps the keys and the noise: every episode
    of an env draws the same noise."""

    def reset_state(self, prev_state: Any) -> Any:
        return prev_state


class EpisodeNoiseFromFixedKeys(EpisodeNoise):
    """Draws each new episode's noise from keys folded from one fixed key and the env's
    index: distinct per env and from the keys before, but the same at every reset."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {**super().initialize_state(batch_size), "env": jnp.arange(batch_size)}

    def reset_state(self, prev_state: Any) -> Any:
        env = prev_state["env"]
        keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(7), i))(env.reshape(-1))
        return {**self._drawn(keys.reshape(env.shape)), "env": env}


class EpisodeNoiseKeptWhenKeysSplit(EpisodeNoise):
    """At reset, splits the keys but keeps the episode's noise: every episode of an env
    gets the noise of its first, though its keys change."""

    def reset_state(self, prev_state: Any) -> Any:
        return {"keys": split_env_keys(prev_state["keys"])[0], "noise": prev_state["noise"]}


class StepNoiseNewKeysAtReset(KeysNeverSplit):
    """Correct for stochastic=True: splits its keys and draws fresh noise at every step,
    and reset_state replaces the keys too. Declared per-episode, its draws still change
    from step to step within an episode."""

    def reset_state(self, prev_state: Any) -> Any:
        return {"keys": split_env_keys(prev_state["keys"])[0]}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        next_keys, step_keys = split_env_keys(state["keys"])
        noise = jax.vmap(lambda key: jax.random.normal(key, (FEATURES,)))(step_keys)
        return _out({"keys": next_keys}, x + noise)


class EpisodeLatentFromStepKeys(StepNoiseNewKeysAtReset):
    """Correct: one key leaf, split every step for the step's noise, from which reset_state
    also draws the episode's latent, kept through the episode: draws of both kinds."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        keys = new_env_keys(nnx.Rngs(0), batch_size)
        return {"keys": keys, "latent": EpisodeNoise._drawn(keys)["noise"]}

    def reset_state(self, prev_state: Any) -> Any:
        keys = split_env_keys(prev_state["keys"])[0]
        return {"keys": keys, "latent": EpisodeNoise._drawn(keys)["noise"]}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x + state["latent"], rollout_extras)
        return out.replace(next_state={**out.next_state, "latent": state["latent"]})


class EpisodeNoiseDrawnAtFirstStep(StepNoiseNewKeysAtReset):
    """Correct for stochastic='per_episode': splits its keys and draws at every step, but
    keeps the noise drawn at an episode's first step (flagged by reset_state) through the
    episode, so its noise changes at resets only."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {
            "keys": new_env_keys(nnx.Rngs(0), batch_size),
            "noise": jnp.zeros((batch_size, FEATURES)),
            "first_step": jnp.ones((batch_size,), bool),
        }

    def reset_state(self, prev_state: Any) -> Any:
        return {
            "keys": split_env_keys(prev_state["keys"])[0],
            "noise": jnp.zeros_like(prev_state["noise"]),
            "first_step": jnp.ones_like(prev_state["first_step"]),
        }

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        next_keys, step_keys = split_env_keys(state["keys"])
        drawn = jax.vmap(lambda key: jax.random.normal(key, (FEATURES,)))(step_keys)
        noise = jnp.where(state["first_step"][:, None], drawn, state["noise"])
        first_step = jnp.zeros_like(state["first_step"])
        return _out({"keys": next_keys, "noise": noise, "first_step": first_step}, x + noise)


def episode_noise_then_sampler() -> StatefulModule:
    """Correct: a per-episode latent (keys replaced at reset) before a sampler (keys split
    every step, kept at reset)."""
    return Sequential([EpisodeNoise(), NormalSampler(nnx.Rngs(0), 0.01, action_size=FEATURES)])


class StaleMeanSampler(NormalSampler):
    """Stores its distribution's mean beside the raw action and scores the replayed action
    under the stored mean: replay reproduces the rollout, but the mean gets no gradient."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        parameters = self.distribution_parameters(x)
        out = super().__call__(state, x, None if rollout_extras is None else rollout_extras["raw"])
        if rollout_extras is not None:
            stale = {**parameters, "mu": rollout_extras["mu"]}
            logp = self.log_likelihood(rollout_extras["raw"], stale)
            out = out.replace(output={**out.output, "log_likelihood": logp})
        return out.replace(rollout_extras={"raw": out.rollout_extras, "mu": parameters["mu"]})


class MixesInTheImaginaryPart(StatefulModule):
    """A complex-valued layer whose imaginary part adds the batch mean of the input's
    imaginary part: the real part, all a float64 comparison sees, is per-sample."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), x + 1j * x.imag.mean(axis=0))


class SummedPenalty(Leaky):
    """Penalises large states with a scalar summed over the batch, not averaged: the loss
    averages regularization over samples, so this one grows with the minibatch."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        return out.replace(regularization_loss=jnp.sum(out.output**2))


class SpreadPenalty(Leaky):
    """Penalises the spread of the states across the batch: a scalar, but no per-sample
    value at all (one env alone has none)."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        return out.replace(regularization_loss=jnp.var(out.output, axis=0).sum())


class LockstepClock(Leaky):
    """Counts each episode's steps in its carry but reads the count off env 0: right while
    every env starts its episode together, wrong once one env's episode ends alone."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"h": jnp.zeros((batch_size, FEATURES)), "t": jnp.zeros((batch_size,))}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        t = state["t"] + 1.0
        h = 0.5 * state["h"] + x / t[0]
        return _out({"h": h, "t": t}, h)


class ChildrenInAttributeOrder(StatefulModule):
    """Applies its children in the order of its attributes: the order they were set in
    eagerly, sorted by name once NNX has split and merged the module (as jit does)."""

    def __init__(self) -> None:
        self.widen = Scale(2.0)
        self.shift = Shift(1.0)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        for child in vars(self).values():
            if isinstance(child, StatefulModule):
                x = child((), x).output
        return _out((), x)


class Scale(StatefulModule):
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), self.factor * x)


class Shift(Scale):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), x + self.factor)


class RunningMeanAsParam(StatefulModule):
    """Keeps its running mean in an nnx.Param: the optimizer trains it too."""

    def __init__(self) -> None:
        self.mean = nnx.Param(jnp.zeros(FEATURES))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return _out((), x - self.mean[...], x)

    def update_statistics(self, rollout_extras: Array) -> None:
        self.mean[...] = 0.9 * self.mean[...] + 0.1 * rollout_extras.mean(axis=(0, 1))


class ResetToOneKey(OneKeyForAllEnvs):
    """Seeds every env with its own key, but resets every env to the same one."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"keys": new_env_keys(nnx.Rngs(0), batch_size)}

    def reset_state(self, prev_state: Any) -> Any:
        return {"keys": jnp.broadcast_to(jax.random.key(0), prev_state["keys"].shape)}


class KeepsTheDefaultReset(Leaky):
    """Ported from nnx-ppo 0.3.0 without a reset_state: the default keeps the carry, so
    the trace runs from one episode into the next."""

    reset_state = StatefulModule.reset_state


class RemembersOnPurpose(Leaky):
    """Carries its trace across episodes by design, and says so with its reset_state."""

    def reset_state(self, prev_state: Any) -> Any:
        return prev_state


class ResetsHalfTheCarry(Leaky):
    """Keeps two traces and resets only the first."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"h": jnp.zeros((batch_size, FEATURES)), "slow": jnp.zeros((batch_size, FEATURES))}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h, slow = 0.5 * state["h"] + x, 0.9 * state["slow"] + x
        return _out({"h": h, "slow": slow}, h + slow)

    def reset_state(self, prev_state: Any) -> Any:
        return {"h": jnp.zeros_like(prev_state["h"]), "slow": prev_state["slow"]}


class CountsStepsAcrossEpisodes(Leaky):
    """Feeds its policy the time since the episode started, but its reset_state keeps the
    count: no input changes it, so only the reset itself shows it."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"t": jnp.zeros((batch_size,))}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        t = state["t"] + 1
        return _out({"t": t}, x + t[:, None])

    def reset_state(self, prev_state: Any) -> Any:
        return prev_state


MODULE_BUGS: dict[
    str, tuple[Any, dict[str, Any], ModuleProperty | tuple[ModuleProperty, ...], str]
] = {
    # name: (factory, check_module keywords, the property reported, a leaf it names)
    "batch mean in forward": (
        BatchMeanInForward,
        {},
        (ModuleProperty.PERMUTATION, ModuleProperty.BATCH_OF_ONE),
        "output",
    ),
    "time axis leaking into __call__": (
        ScansTheBatchAsTime,
        {},
        (ModuleProperty.PERMUTATION, ModuleProperty.BATCH_OF_ONE),
        "output",
    ),
    "carry dtype change": (
        ChangesCarryDtype,
        {},
        ModuleProperty.CARRY_PRESERVATION,
        "next_state['h']",
    ),
    "carry shape from a hard-coded batch": (
        HardCodedBatch,
        {},
        ModuleProperty.INITIALIZE_STATE,
        "state['h']",
    ),
    "an env's start that depends on the batch size": (
        StartsFromTheBatchSize,
        {},
        ModuleProperty.INITIALIZE_STATE,
        "state['h']",
    ),
    "a start spread over the batch, env 0 alone kept": (
        SpreadOverTheBatch,
        {},
        ModuleProperty.INITIALIZE_STATE,
        "state['h']",
    ),
    "the batch size written to a variable in initialize_state": (
        RemembersTheBatchSize,
        {},
        ModuleProperty.INITIALIZE_STATE,
        "RemembersTheBatchSize.batch_size",
    ),
    "reset that drops the leading axis": (
        ResetDropsTheBatchAxis,
        {},
        ModuleProperty.RESET_STATE,
        "returned state['h']",
    ),
    "reset that assumes a leading axis": (
        ResetAssumesABatchAxis,
        {},
        ModuleProperty.RESET_STATE,
        "returned state['h']",
    ),
    "recurrent carry kept by the default reset_state": (
        KeepsTheDefaultReset,
        {"time_lengths": (4,)},
        ModuleProperty.EPISODES_INDEPENDENT,
        "reset_state(state)['h']",
    ),
    "reset that forgets part of the carry": (
        ResetsHalfTheCarry,
        {"time_lengths": (4,)},
        ModuleProperty.EPISODES_INDEPENDENT,
        "reset_state(state)['slow']",
    ),
    "step count kept across episodes": (
        CountsStepsAcrossEpisodes,
        {"time_lengths": (4,)},
        ModuleProperty.EPISODES_INDEPENDENT,
        "reset_state(state)['t']",
    ),
    "noise keys that carry the inputs of the episode before": (
        NoiseKeyedOnItsInputs,
        {"stochastic": True, "time_lengths": (4,)},
        ModuleProperty.EPISODES_INDEPENDENT,
        "output",
    ),
    "sampler that resamples in replay": (
        lambda: ResamplesInReplay(nnx.Rngs(0), 0.01),
        {"example_input": jnp.zeros(4)},
        ModuleProperty.STORED_ACTION,
        "output['action']",
    ),
    "sampler that replays its stored log-likelihood": (
        lambda: ReplaysItsStoredLogLikelihood(nnx.Rngs(0), 0.01),
        {"example_input": jnp.zeros(4), "stochastic": True},
        ModuleProperty.STORED_ACTION,
        "the output's log-likelihood",
    ),
    "sampler that replays its stored log-likelihood, under jax.checkpoint": (
        lambda: Rematerialized(ReplaysItsStoredLogLikelihood(nnx.Rngs(0), 0.01)),
        {"example_input": jnp.zeros(4), "stochastic": True},
        ModuleProperty.STORED_ACTION,
        "the output's log-likelihood",
    ),
    "sampler that scores the replayed action under the stored mean": (
        lambda: StaleMeanSampler(nnx.Rngs(0), 0.01),
        {"example_input": jnp.zeros(4)},
        ModuleProperty.STORED_ACTION,
        "the output's log-likelihood",
    ),
    "complex layer mixing envs in the imaginary part only": (
        MixesInTheImaginaryPart,
        {"example_input": jnp.zeros(FEATURES, jnp.complex64)},
        (ModuleProperty.PERMUTATION, ModuleProperty.BATCH_OF_ONE),
        "output",
    ),
    "RNG held as a module variable advanced in __call__": (
        ModuleLevelRng,
        {},
        ModuleProperty.NO_WRITES,
        "ModuleLevelRng.rngs.default.count",
    ),
    "running statistic written in __call__": (
        RunningMeanInCall,
        {},
        ModuleProperty.NO_WRITES,
        "RunningMeanInCall.mean",
    ),
    "statistics that depend on the order of the samples": (
        LastStepStatistics,
        {},
        ModuleProperty.STATISTICS_ORDER,
        "LastStepStatistics.mean",
    ),
    "statistics that depend on the order of the samples within a step": (
        AveragesSampleBySample,
        {},
        ModuleProperty.STATISTICS_ORDER,
        "AveragesSampleBySample.mean",
    ),
    "statistics that count the steps of a history, not its samples": (
        CountsStepsNotSamples,
        {"time_lengths": (4,)},
        ModuleProperty.STATISTICS_ORDER,
        "CountsStepsNotSamples.count",
    ),
    "replay that does not advance the carry": (
        ReplaySkipsTheCarry,
        {"time_lengths": (2,)},
        ModuleProperty.REPLAY,
        "next_state['h']",
    ),
    "replay that assumes the whole batch, in order": (
        ReplayGainsByPosition,
        {},
        ModuleProperty.REPLAY_SUBSET,
        "output",
    ),
    "container that forgets one child's state": (
        lambda: ForgetsOneChildsState(RunningSum(FEATURES), RunningSum(FEATURES)),
        {},
        ModuleProperty.CARRY_PRESERVATION,
        "next_state['second']",
    ),
    "container that forgets to reset a child": (
        lambda: ForgetsResetState(Leaky(), Leaky()),
        {},
        ModuleProperty.RESET_STATE,
        "ForgetsResetState.second (Leaky)",
    ),
    "container that forgets update_statistics": (
        lambda: ForgetsUpdateStatistics(Leaky(), Normalizer(FEATURES)),
        {},
        ModuleProperty.STATISTICS,
        "ForgetsUpdateStatistics.second (Normalizer)",
    ),
    "container that swaps two children's histories": (
        lambda: SwapsHistories(Normalizer(FEATURES), Normalizer(FEATURES)),
        {},
        ModuleProperty.STATISTICS,
        "SwapsHistories.first history",
    ),
    "container that swaps two children's histories it packed into one array": (
        lambda: PacksAndSwapsHistories(Normalizer(FEATURES), Normalizer(FEATURES)),
        {},
        ModuleProperty.STATISTICS,
        "PacksAndSwapsHistories.first history",
    ),
    "container that also feeds a child its sibling's history": (
        lambda: FeedsFirstBothHistories(Normalizer(FEATURES), Normalizer(FEATURES)),
        {},
        ModuleProperty.STATISTICS,
        "FeedsFirstBothHistories.first",
    ),
    "container that inherits the no-op update_statistics": (
        lambda: Residual(Normalizer(FEATURES)),
        {},
        ModuleProperty.STATISTICS,
        "Residual.inner (Normalizer)",
    ),
    "statistics mixin shadowed by the no-op update_statistics": (
        MixinShadowedByTheDefault,
        {},
        ModuleProperty.STATISTICS,
        "MixinShadowedByTheDefault",
    ),
    "scalar penalty summed over the batch": (
        SummedPenalty,
        {"batch_sizes": (2,)},
        ModuleProperty.BATCH_OF_ONE,
        "regularization_loss at step",
    ),
    "step count read off one env": (
        LockstepClock,
        {},
        (ModuleProperty.PERMUTATION, ModuleProperty.BATCH_OF_ONE),
        "output",
    ),
    "children applied in attribute order": (
        ChildrenInAttributeOrder,
        {},
        ModuleProperty.EAGER_COMPILED,
        "output",
    ),
    "running mean kept in an nnx.Param": (
        RunningMeanAsParam,
        {},
        ModuleProperty.STATISTICS_NOT_TRAINED,
        "RunningMeanAsParam.mean",
    ),
    "every env reset to the same key": (
        ResetToOneKey,
        # Found before two envs end at the same step: its keys ignore the ones it is given.
        {"stochastic": True, "batch_sizes": (2,), "time_lengths": (4,)},
        ModuleProperty.PER_ENV_KEYS,
        "state['keys'] after reset_state",
    ),
    "per-env keys never split": (
        KeysNeverSplit,
        {"stochastic": True},
        ModuleProperty.PER_ENV_KEYS,
        "next_state['keys']",
    ),
    "one key shared by every env": (
        OneKeyForAllEnvs,
        {"stochastic": True},
        ModuleProperty.PER_ENV_KEYS,
        "state['keys']",
    ),
    "noise drawn from a fixed key beside the carry's": (
        NoiseFromAFixedKey,
        {"stochastic": True},
        ModuleProperty.PER_ENV_KEYS,
        "state",
    ),
    "per-episode keys kept by reset_state": (
        EpisodeNoiseKeptAtReset,
        {"stochastic": "per_episode"},
        ModuleProperty.PER_ENV_KEYS,
        "state['keys'] after reset_state",
    ),
    "per-episode keys split at reset, the episode's noise kept": (
        EpisodeNoiseKeptWhenKeysSplit,
        {"stochastic": "per_episode"},
        ModuleProperty.PER_ENV_KEYS,
        "state['keys']",
    ),
    "per-step keys checked as per-episode": (
        lambda: NormalSampler(nnx.Rngs(0), 0.01, action_size=FEATURES),
        {"stochastic": "per_episode"},
        ModuleProperty.PER_ENV_KEYS,
        "state after reset_state",
    ),
    "per-step keys replaced at reset, checked as per-episode": (
        StepNoiseNewKeysAtReset,
        {"stochastic": "per_episode"},
        ModuleProperty.PER_ENV_KEYS,
        "next_state['keys'] at step 0",
    ),
    "noise drawn from a fixed key, under jax.checkpoint": (
        lambda: Rematerialized(NoiseFromAFixedKey()),
        {"stochastic": True},
        ModuleProperty.PER_ENV_KEYS,
        "state",
    ),
    "per-episode keys drawn from a fixed key at reset": (
        EpisodeNoiseFromFixedKeys,
        {"stochastic": "per_episode"},
        ModuleProperty.PER_ENV_KEYS,
        "state['keys'] after reset_state",
    ),
    "per-episode noise checked as per-step": (
        EpisodeNoise,
        {"stochastic": True},
        ModuleProperty.PER_ENV_KEYS,
        "next_state['keys']",
    ),
}


@pytest.mark.parametrize("bug", list(MODULE_BUGS))
@pytest.mark.filterwarnings("ignore:nnx_ppo. KeepsTheDefaultReset keeps its carry")
def test_module_bug_is_caught_and_named(bug: str) -> None:
    factory, keywords, expected, leaf = MODULE_BUGS[bug]
    keywords = {"example_input": jnp.zeros(FEATURES), **keywords}
    with pytest.raises(ContractPropertyError) as caught:
        check_module(factory, **keywords, max_examples=8)
    error = caught.value
    properties = expected if isinstance(expected, tuple) else (expected,)
    assert error.property in properties, str(error)
    assert error.leaf is not None and error.leaf.startswith(leaf), str(error)
    assert f"property '{error.property}' fails at B=" in str(error)
    assert error.subject in str(error)


@pytest.mark.parametrize(
    ("module", "why"),
    [
        (SummedPenalty, r"it is their sum, which grows with the minibatch"),
        (SpreadPenalty, r"it depends on the other envs of the batch"),
    ],
)
def test_a_scalar_penalty_that_is_no_mean_is_told_apart(module: Any, why: str) -> None:
    # Every such penalty was called a sum over the batch.
    with pytest.raises(ContractPropertyError, match=why) as caught:
        check_module(module, jnp.zeros(FEATURES), batch_sizes=(2,), max_examples=8)
    assert caught.value.property == ModuleProperty.BATCH_OF_ONE


def test_the_correct_versions_pass() -> None:
    check_module(Leaky, jnp.zeros(FEATURES), max_examples=5)
    check_module(lambda: Pair(Leaky(), Normalizer(FEATURES)), jnp.zeros(FEATURES), max_examples=5)
    check_module(lambda: CategoricalSampler(nnx.Rngs(0), 0.0), jnp.zeros(2), stochastic=True)
    check_module(EpisodeNoise, jnp.zeros(FEATURES), stochastic="per_episode", max_examples=5)
    check_module(
        lambda: NormalizesTwoViews(Normalizer(FEATURES), Normalizer(FEATURES)),
        jnp.zeros(FEATURES),
        max_examples=5,
    )
    check_module(
        lambda: Rematerialized(Pair(Normalizer(FEATURES), Leaky())),
        jnp.zeros(FEATURES),
        max_examples=5,
    )
    # A module that remembers across episodes on purpose says so.
    check_module(RemembersOnPurpose, jnp.zeros(FEATURES), episodic=False, max_examples=5)


def test_an_action_delayed_after_its_sampler_passes() -> None:
    # Action latency: replay scores the delayed action from its carry, which a rollout's
    # earlier steps computed under the current parameters. The kit took it for a
    # log-likelihood read back from rollout_extras.
    from nnx_ppo.networks.delay import Delay

    sample = {"action": jnp.zeros((), jnp.int32), "log_likelihood": jnp.zeros(())}
    check_module(
        lambda: Sequential([CategoricalSampler(nnx.Rngs(0), 0.0), Delay(sample, 1)]),
        jnp.zeros(2),
        stochastic=True,
        batch_sizes=(2,),
        max_examples=3,
    )


# The key checks need no more than two envs and two steps: one compile per setting.
FEW_SMALL_EXAMPLES: dict[str, Any] = {"batch_sizes": (2,), "time_lengths": (2,), "max_examples": 3}


@pytest.mark.parametrize("stochastic", [True, "per_episode"])
@pytest.mark.parametrize(
    "factory",
    [
        # Keys of both kinds: the latent's replaced at reset, the sampler's split every
        # step. One rule for every key leaf failed it under both settings.
        pytest.param(episode_noise_then_sampler, id="latent before a sampler"),
        # One key leaf, split every step, which reset_state draws the latent from too.
        pytest.param(EpisodeLatentFromStepKeys, id="latent drawn from per-step keys"),
    ],
)
def test_draws_once_per_episode_and_every_step_pass_either_setting(
    factory: Callable[[], StatefulModule], stochastic: bool | Literal["per_episode"]
) -> None:
    check_module(factory, jnp.zeros(FEATURES), stochastic=stochastic, **FEW_SMALL_EXAMPLES)


def _first_step_latent_before_a_sampler() -> StatefulModule:
    sampler = NormalSampler(nnx.Rngs(0), 0.01, action_size=FEATURES)
    return Sequential([EpisodeNoiseDrawnAtFirstStep(), sampler])


@pytest.mark.parametrize(
    "factory",
    [EpisodeNoiseDrawnAtFirstStep, _first_step_latent_before_a_sampler],
    ids=["alone", "before a sampler"],
)
def test_noise_drawn_at_an_episodes_first_step_and_kept_passes_per_episode(
    factory: Callable[[], StatefulModule],
) -> None:
    # Its keys are split and drawn from at every step, yet the noise changes at resets
    # only: other keys change the call's results at an episode's first step, not a step
    # into it. A rule on where the keys flow refused it, and a first behavioural rule
    # refused it before a sampler, whose own per-step keys change the results.
    check_module(factory, jnp.zeros(FEATURES), stochastic="per_episode", **FEW_SMALL_EXAMPLES)


def test_per_step_noise_declared_per_episode_says_to_declare_true() -> None:
    # Its keys change at every reset, as per-episode keys do, but at every step too.
    noise = StepNoiseNewKeysAtReset
    with pytest.raises(ContractPropertyError) as caught:
        check_module(noise, jnp.zeros(FEATURES), stochastic="per_episode", **FEW_SMALL_EXAMPLES)
    message = str(caught.value)
    assert "the key in state['keys'] changes at every step within an episode" in message
    assert "its draws change from step to step within an episode" in message
    assert "says so with stochastic=True" in message
    assert "from other keys in state['keys']" in message
    check_module(noise, jnp.zeros(FEATURES), stochastic=True, **FEW_SMALL_EXAMPLES)


def test_purity_bugs_are_reported_at_the_smallest_batch_that_shows_them() -> None:
    # A batch mean is invisible in a batch of one: Hypothesis shrinks to B=2.
    with pytest.raises(ContractPropertyError) as caught:
        check_module(BatchMeanInForward, jnp.zeros(FEATURES), batch_sizes=(1, 2, 3, 5))
    assert caught.value.sizes == {"B": 2, "T": 1}


def test_a_leak_from_earlier_envs_is_reported_by_a_later_env_run_alone() -> None:
    # Scanning the batch leaves env 0 as it would be alone. The shrunk example keeps the
    # batch in its order (no permutation) and replays env 0 alone (the smallest subset):
    # only env 1 run alone shows the leak.
    with pytest.raises(ContractPropertyError) as caught:
        check_module(ScansTheBatchAsTime, jnp.zeros(FEATURES), batch_sizes=(1, 2))
    error = caught.value
    assert error.property == ModuleProperty.BATCH_OF_ONE, str(error)
    assert error.leaf == "output at step 0, env 1", str(error)
    assert error.sizes == {"B": 2, "T": 1}


# ------------------------------------------------------------------------- environments


class BatchedRewardEnv(envs.CartPole):
    """Returns its reward with a stray axis, as if it held a batch of one env."""

    def reset(self, rng: Any) -> envs.State:
        return super().reset(rng).replace(reward=jnp.int32(0))

    def step(self, state: envs.State, action: Any) -> envs.State:
        return super().step(state, action).replace(reward=jnp.ones((1,)))


class ObsStructureChangesEnv(envs.CartPole):
    """Adds a velocity entry to the observation after the first step."""

    observation_size: ClassVar[dict[str, int]] = {"position": 4}

    def reset(self, rng: Any) -> envs.State:
        state = super().reset(rng)
        return state.replace(obs={"position": state.obs})

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state.replace(obs=state.obs["position"]), action)
        return stepped.replace(obs={"position": stepped.obs, "velocity": stepped.obs[1::2]})


class TruncatedButNotDoneEnv(envs.CartPole):
    """Marks the time limit in info but forgets to end the episode there."""

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state, action)
        truncated = stepped.data["steps"] >= self.max_steps
        return stepped.replace(done=jnp.zeros(()), info={**stepped.info, "truncated": truncated})


class NumberedTruncationEnv(envs.CartPole):
    """Counts the steps left in Playground's ``truncation`` entry instead of a flag."""

    def reset(self, rng: Any) -> envs.State:
        state = super().reset(rng)
        return state.replace(info={**state.info, "truncation": jnp.asarray(self.max_steps, float)})

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state, action)
        left = jnp.asarray(self.max_steps, float) - stepped.data["steps"]
        return stepped.replace(info={**stepped.info, "truncation": left})


class PythonCounterEnv(envs.CartPole):
    """Counts resets in a Python attribute: each trace freezes a different count."""

    calls: ClassVar[int] = 0

    def reset(self, rng: Any) -> envs.State:
        PythonCounterEnv.calls += 1
        state = super().reset(rng)
        return state.replace(obs=state.obs + PythonCounterEnv.calls)


class PythonBranchEnv(envs.CartPole):
    """Branches in Python on the pole angle: fine eagerly, impossible to trace."""

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state, action)
        if stepped.obs[2] > 0.1:
            return stepped.replace(reward=jnp.zeros(()))
        return stepped


class BatchedObsEnv(envs.CartPole):
    """Returns 8 copies of its observation: a batch where one env's obs belongs."""

    def reset(self, rng: Any) -> envs.State:
        state = super().reset(rng)
        return state.replace(obs=jnp.broadcast_to(state.obs, (8, 4)))

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state.replace(obs=state.obs[0]), action)
        return stepped.replace(obs=jnp.broadcast_to(stepped.obs, (8, 4)))


class InfiniteRewardEnv(envs.CartPole):
    """Rewards the pole's angle through a logarithm: an infinity where the angle is 0."""

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state, action)
        return stepped.replace(reward=-jnp.log(jnp.abs(stepped.obs[2]) * 0.0))


class NaNPastTheEndEnv(envs.CartPole):
    """Finite within its first episode; stepped on unreset after it, its obs is NaN."""

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state, action)
        return stepped.replace(obs=jnp.where(state.done > 0, jnp.nan, stepped.obs))


class ObservationSizeMethodEnv(envs.CartPole):
    """Declares observation_size as a plain method: @property is missing."""

    def observation_size(self) -> int:  # type: ignore[override]
        return 4


class KeyedSharedTableEnv(envs.CartPole):
    """Keeps a lookup table in a ``Shared`` node, but draws it from the reset key."""

    def reset(self, rng: Any) -> envs.State:
        state = super().reset(rng)
        return state.replace(data={**state.data, "table": Shared(jax.random.normal(rng, (3,)))})

    def step(self, state: envs.State, action: Any) -> envs.State:
        stepped = super().step(state, action)
        return stepped.replace(data={**stepped.data, "table": state.data["table"]})


class PulsedDoneEnv:
    """Two agents, each done for one step only (agent a at step 2, b at step 4): every leaf
    is never done at once, so the episode never ends."""

    action_size = 1

    def reset(self, rng: Any) -> envs.State:
        zero = jnp.zeros(())
        return envs.State(
            obs=jax.random.normal(rng, (2,)),
            reward={"a": zero, "b": zero},
            done={"a": zero, "b": zero},
            metrics={},
            info={},
            data={"t": jnp.zeros((), jnp.int32)},
        )

    def step(self, state: envs.State, action: Any) -> envs.State:
        t = state.data["t"] + 1
        return state.replace(
            obs=state.obs + 0.1,
            reward={"a": jnp.ones(()), "b": jnp.ones(())},
            done={"a": (t == 2).astype(jnp.float32), "b": (t == 4).astype(jnp.float32)},
            data={"t": t},
        )


class ResetIgnoresItsKeyEnv(envs.CartPole):
    """Starts every episode from one key: every env starts in the same state."""

    def reset(self, rng: Any) -> envs.State:
        return super().reset(jax.random.key(0))


ENV_BUGS: dict[str, tuple[Any, EnvProperty, str]] = {
    # name: (env, the property reported, a leaf it names)
    "env that returns a batched reward": (BatchedRewardEnv(), EnvProperty.RESET, "state.reward"),
    "env whose obs structure changes after reset": (
        ObsStructureChangesEnv(),
        EnvProperty.STEP,
        "state.obs",
    ),
    "truncation without done": (
        TruncatedButNotDoneEnv(max_steps=2),
        EnvProperty.TRUNCATION,
        "state.info['truncated'] at step 1",
    ),
    "truncation that is not bool-like": (
        NumberedTruncationEnv(max_steps=2),
        EnvProperty.TRUNCATION,
        "state.info['truncation']",
    ),
    "env with Python-side state": (PythonCounterEnv(), EnvProperty.DETERMINISM, "state.obs"),
    "reward that is infinite": (
        InfiniteRewardEnv(),
        EnvProperty.FINITE,
        "state.reward at step 0, env 0",
    ),
    "observation_size that is a method": (
        ObservationSizeMethodEnv(),
        EnvProperty.RESET,
        "env.observation_size",
    ),
    "env that branches in Python on a traced value": (
        PythonBranchEnv(),
        EnvProperty.STEP,
        None,
    ),
    "observation not shaped as observation_size declares": (
        BatchedObsEnv(),
        EnvProperty.RESET,
        "state.obs",
    ),
    "Shared value drawn from the reset key": (
        KeyedSharedTableEnv(),
        EnvProperty.VMAP_JIT,
        "state.data['table']",
    ),
    "reset that ignores its key": (ResetIgnoresItsKeyEnv(), EnvProperty.RANDOM_RESET, "state.obs"),
    "per-agent done set for one step only": (
        PulsedDoneEnv(),
        EnvProperty.DONE_LEAVES,
        "state.done['a'] at step 2",
    ),
}


def test_values_past_an_unreset_episode_end_are_not_checked_for_finiteness() -> None:
    # A one-step time limit: every env ends at step 0 and is stepped on unreset.
    env = NaNPastTheEndEnv(max_steps=1)
    check_env(env, n_envs=2, steps=3)
    ended = env.step(env.reset(jax.random.key(0)), jnp.int32(0))
    assert bool(ended.done) and bool(jnp.isnan(env.step(ended, jnp.int32(0)).obs).all())


def test_a_start_fixed_on_purpose_says_so() -> None:
    check_env(ResetIgnoresItsKeyEnv(), n_envs=2, steps=3, random_reset=False)


def test_an_env_of_few_starts_is_not_taken_for_one_that_ignores_its_key() -> None:
    # The memory task's cue takes two values: these keys reset n_envs envs alike.
    for key, n_envs in ((12, 4), (199, 2)):
        check_env(envs.make("memory"), n_envs=n_envs, steps=3, key=jax.random.key(key))


@pytest.mark.parametrize("bug", list(ENV_BUGS))
def test_env_bug_is_caught_and_named(bug: str) -> None:
    env, expected, leaf = ENV_BUGS[bug]
    with pytest.raises(ContractPropertyError) as caught:
        check_env(env, n_envs=2, steps=3)
    error = caught.value
    assert error.property == expected, str(error)
    if leaf is not None:
        assert error.leaf is not None and error.leaf.startswith(leaf), str(error)
    assert error.sizes == {"n_envs": 2, "steps": 3}
    assert f"check_env({type(env).__name__})" in str(error)


def test_a_traced_branch_is_reported_with_jax_s_own_error() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_env(PythonBranchEnv(), n_envs=2, steps=3)
    assert isinstance(caught.value.cause, jax.errors.TracerBoolConversionError)
    assert "TracerBoolConversionError" in str(caught.value)


def test_statistics_order_moves_the_last_sample_even_at_two_samples() -> None:
    # One step of two envs: a seeded shuffle of two samples can be the identity.
    with pytest.raises(ContractPropertyError) as caught:
        check_module(
            AveragesSampleBySample, jnp.zeros(FEATURES), batch_sizes=(2,), time_lengths=(1, 2)
        )
    assert caught.value.property == ModuleProperty.STATISTICS_ORDER, str(caught.value)
    assert caught.value.sizes == {"B": 2, "T": 1}
