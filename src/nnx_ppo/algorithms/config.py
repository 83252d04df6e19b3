"""The configuration of a training run, validated on construction.

Fields and defaults are those of nnx-ppo 0.3.0, so its scripts run unchanged;
the options after ``logging_percentiles`` in :class:`PPOConfig` are new and
default to 0.3.0's behaviour. Every config checks its fields in
``__post_init__`` and again in its ``validate`` method
(:meth:`TrainConfig.validate <nnx_ppo.algorithms.config.TrainConfig.validate>` validates
every sub-config; ``train_ppo`` calls it, so a field changed after construction is checked too).
Both also write what 0.3.0 took in this version's form: a count of env steps given
as a whole float (``total_steps=1e6``) as an int, an empty ``logging_percentiles``
as ``None``.
"""

from __future__ import annotations

import difflib
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import optax
from jaxtyping import UInt8

from nnx_ppo.algorithms.types import LoggingLevel, TrainingState
from nnx_ppo.contract.arguments import as_whole, require_callable, require_int, require_number

__all__ = [
    "EvalConfig",
    "PPOConfig",
    "TrainConfig",
    "TrainResult",
    "VideoConfig",
    "VideoData",
]

AdvantageNormalization = Literal["per_leaf", "global"]
LearningRateSchedule = Literal["constant", "linear"]


@functools.lru_cache(maxsize=32)
def _linear_decay(start: float, updates: int) -> Callable[[Any], Any]:
    """One schedule object per setting, so runs with equal settings share a compiled step."""
    return optax.linear_schedule(start, 0.0, transition_steps=updates)


def __getattr__(name: str) -> Any:
    """The distillation configs and state at 0.3.0's path: defined in ``algorithms.distillation``.

    That module imports this one, so they are fetched on first use (PEP 562); they are
    not in ``__all__``, whose names are this module's own.
    """
    if name in (
        "DistillationConfig",
        "DistillationState",
        "DistillationTrainConfig",
        "DistillationTrainResult",
    ):
        from nnx_ppo.algorithms import distillation

        return getattr(distillation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _FieldsOnly:
    """A dataclass base that refuses to set an attribute that is not one of its fields.

    A misspelt field (``config.ppo.learnin_rate = 1e-3``) raises ``AttributeError``
    instead of being kept beside the field it meant, which would train at the default.
    Unlike ``slots=True``, instances keep their ``__dict__``: ``vars(config)`` works.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        fields = getattr(type(self), "__dataclass_fields__", {})
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AttributeError(f"{type(self).__name__} has no field {name!r}{hint}")
        object.__setattr__(self, name, value)


_STEP_COUNTS = frozenset({"total_steps", "every_steps", "checkpoint_every_steps"})
"""The config fields that count env steps: written as whole floats (``1e6``) too."""


def _accept_030_forms(config: Any) -> None:
    """Write in this version's form what nnx-ppo 0.3.0 took: a count of env steps given as
    a whole float (``total_steps=1e6``) becomes an int, and an empty
    ``logging_percentiles`` is ``None`` (mean and std)."""
    for name in _STEP_COUNTS & set(getattr(type(config), "__dataclass_fields__", {})):
        setattr(config, name, as_whole(getattr(config, name)))
    percentiles = getattr(config, "logging_percentiles", None)
    if isinstance(percentiles, tuple) and not percentiles:
        config.logging_percentiles = None


def _store_int(owner: str, config: Any, name: str, **bounds: int | None) -> None:
    """Check the int field ``name`` of ``config`` and store it as a Python ``int``: a NumPy
    integer is as good a count, but a checkpoint's JSON config cannot hold one."""
    setattr(config, name, require_int(owner, name, getattr(config, name), **bounds))


def _require_logging(owner: str, config: Any) -> None:
    """Check ``config``'s ``logging_level`` and ``logging_percentiles``, storing the
    percentiles as Python ints."""
    level, percentiles = config.logging_level, config.logging_percentiles
    if not isinstance(level, LoggingLevel):
        raise TypeError(
            f"{owner}.logging_level must be a LoggingLevel flag, got {type(level).__name__}"
        )
    if percentiles is None:
        return
    if not isinstance(percentiles, tuple):
        raise TypeError(
            f"{owner}.logging_percentiles must be a tuple of ints or None, got {percentiles!r}"
        )
    config.logging_percentiles = tuple(
        require_int(owner, "logging_percentiles entry", p, minimum=0, maximum=100)
        for p in percentiles
    )


def _require_rollouts_and_minibatches(owner: str, config: Any, *more_ints: str) -> None:
    """The positive ints every trainer's config has (and ``more_ints``), and minibatches of
    whole environments."""
    names = ("n_envs", "rollout_length", "total_steps", "n_epochs", "n_minibatches", *more_ints)
    for name in names:
        _store_int(owner, config, name)
    if config.n_envs % config.n_minibatches:
        raise ValueError(
            f"{owner}.n_envs ({config.n_envs}) must be divisible by n_minibatches "
            f"({config.n_minibatches}): a minibatch is a set of whole environments"
        )


def _require_optimizer_options(
    owner: str,
    learning_rate: float | Callable[[Any], Any],
    gradient_clipping: float | None,
    weight_decay: float | bool | None,
) -> tuple[float | Callable[[Any], Any], float | None, float | bool | None]:
    """The three options checked, numbers as Python floats (a NumPy scalar is as good a
    rate, but a checkpoint's JSON config cannot hold one): ``learning_rate`` a rate >= 0
    or an optax schedule of the update count; ``gradient_clipping`` a positive norm or
    None (off); ``weight_decay`` a rate >= 0, True (optax's default decay) or None (plain
    Adam)."""
    if callable(learning_rate):
        require_callable(owner, "learning_rate", learning_rate, ("count",))
    else:
        learning_rate = require_number(owner, "learning_rate", learning_rate, minimum=0.0)
    if gradient_clipping is not None:
        gradient_clipping = require_number(
            owner, "gradient_clipping", gradient_clipping, minimum=0.0, strict=True
        )
    if not isinstance(weight_decay, bool | None):
        weight_decay = require_number(owner, "weight_decay", weight_decay, minimum=0.0)
    return learning_rate, gradient_clipping, weight_decay


def _require_choice(owner: str, name: str, value: Any, choices: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is one of the ``Literal`` ``choices``."""
    allowed = get_args(choices)
    if value not in allowed:
        raise ValueError(f"{owner}.{name} must be {' or '.join(map(repr, allowed))}, got {value!r}")


@dataclass
class PPOConfig(_FieldsOnly):
    """The PPO algorithm's parameters.

    Attributes:
      n_envs: environments stepped in parallel.
      rollout_length: steps ``T`` collected per env between updates.
      total_steps: env steps to train for (``n_envs * rollout_length`` per PPO step).
      gae_lambda: GAE's lambda.
      discounting_factor: the discount gamma.
      clip_range: epsilon of the clipped surrogate objective.
      learning_rate: Adam's learning rate, or an ``optax`` schedule. This field,
        ``learning_rate_schedule``, ``gradient_clipping``, ``weight_decay`` and
        ``total_steps`` shape the optimizer, which ``train_ppo`` builds and a
        ``TrainingState`` holds: ``ppo_step`` and ``ppo_steps`` use the state's and
        read none of them (pass them to ``new_training_state``).
      normalize_advantages: standardise advantages per minibatch.
      combine_advantages: sum the advantages of every reward leaf into one team
        advantage that every action leaf is trained on (cooperative multi-agent).
      n_epochs: passes over the rollout per PPO step.
      n_minibatches: minibatches per epoch; each is a set of whole environments.
      critic_loss_weight: weight of the value loss, itself half the mean squared
        error (``0.5 * mean((V - target) ** 2)``): the default 1.0 weighs the squared
        error by 0.5, where CleanRL's and Brax's value coefficient of 0.5 weighs it
        by 0.25.
      gradient_clipping: clip gradients to this global norm; ``None`` for no clipping.
      weight_decay: AdamW's decay (``True`` for optax's default); ``None`` for Adam.
      logging_level: which training metrics to compute.
      logging_percentiles: summarise distributions by these percentiles instead
        of mean and std.
      value_clip_range: clip the value prediction to within this distance of the
        rollout's value (PPO2's value clipping); ``None`` turns it off.
      advantage_normalization: ``"per_leaf"`` standardises each reward leaf's
        advantages on its own; ``"global"`` pools every leaf for one mean and std,
        keeping the leaves' relative scale.
      target_kl: stop a PPO step's remaining epochs once an epoch's mean approximate
        KL divergence from the rollout policy exceeds this; ``None`` runs every epoch.
        With several action leaves it is the joint policy's KL: the sum of the
        leaves' (each logged as ``losses/approx_kl/<leaf>``), as the leaves are
        sampled independently.
      iterations_per_call: ``train_ppo`` runs up to this many PPO steps in one
        compiled call (one round-trip to the host), ending a call early at the step
        where an evaluation, video or checkpoint falls due; a large value runs
        everything between two evaluations (or the whole run) in one call. The
        result is the same as running the steps one by one, and ``log_fn`` still
        gets every step's metrics; ``should_stop`` is polled between calls. A call
        in which a step diverges is dropped whole: the state kept is the one it
        started from, and its steps before the one that diverged are not logged.
      reward_scaling: multiply the rewards by this before computing advantages and
        value targets (the critic learns scaled returns); logged returns and
        evaluations stay in the env's units. 1 leaves them as they are.
      learning_rate_schedule: ``"constant"``, or ``"linear"`` to decay a number
        ``learning_rate`` to 0 over the run's gradient updates
        (``ceil(total_steps / steps_per_iteration) * n_epochs * n_minibatches``).
    """

    n_envs: int = 256
    rollout_length: int = 20
    total_steps: int = 512_000
    gae_lambda: float = 0.95
    discounting_factor: float = 0.99
    clip_range: float = 0.2
    learning_rate: float | Callable[[Any], Any] = 1e-4
    normalize_advantages: bool = True
    combine_advantages: bool = False
    n_epochs: int = 4
    n_minibatches: int = 4
    critic_loss_weight: float = 1.0
    gradient_clipping: float | None = None
    weight_decay: float | bool | None = None
    logging_level: LoggingLevel = LoggingLevel.LOSSES
    logging_percentiles: tuple[int, ...] | None = None
    value_clip_range: float | None = None
    advantage_normalization: AdvantageNormalization = "per_leaf"
    target_kl: float | None = None
    iterations_per_call: int = 1
    reward_scaling: float = 1.0
    learning_rate_schedule: LearningRateSchedule = "constant"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``TypeError``/``ValueError`` naming the first invalid field."""
        owner = "PPOConfig"
        _accept_030_forms(self)
        _require_rollouts_and_minibatches(owner, self, "iterations_per_call")
        for name in ("normalize_advantages", "combine_advantages"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"PPOConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.normalize_advantages and self.steps_per_iteration == self.n_minibatches:
            raise ValueError(
                f"PPOConfig: each minibatch holds one sample (rollout_length "
                f"{self.rollout_length} x n_envs {self.n_envs} / n_minibatches "
                f"{self.n_minibatches}), whose advantage normalize_advantages standardises "
                "to 0: the policy would get no gradient. Use fewer minibatches or a longer "
                "rollout, or set normalize_advantages=False"
            )
        # Stored as Python floats: the loss's annotations take a float, and an int or a
        # NumPy scalar (1, np.float32(0.2)) is as good a number here.
        for name in ("gae_lambda", "discounting_factor"):
            value = require_number(owner, name, getattr(self, name), minimum=0.0, maximum=1.0)
            setattr(self, name, value)
        self.clip_range = require_number(
            owner, "clip_range", self.clip_range, minimum=0.0, strict=True
        )
        self.critic_loss_weight = require_number(
            owner, "critic_loss_weight", self.critic_loss_weight, minimum=0.0
        )
        for name in ("value_clip_range", "target_kl"):  # None turns these off
            if getattr(self, name) is not None:
                number = require_number(owner, name, getattr(self, name), minimum=0.0, strict=True)
                setattr(self, name, number)
        self.learning_rate, self.gradient_clipping, self.weight_decay = _require_optimizer_options(
            owner, self.learning_rate, self.gradient_clipping, self.weight_decay
        )
        _require_logging(owner, self)
        _require_choice(
            owner, "advantage_normalization", self.advantage_normalization, AdvantageNormalization
        )
        self.reward_scaling = require_number(
            owner, "reward_scaling", self.reward_scaling, minimum=0.0, strict=True
        )
        _require_choice(
            owner, "learning_rate_schedule", self.learning_rate_schedule, LearningRateSchedule
        )
        if self.learning_rate_schedule == "linear" and callable(self.learning_rate):
            raise ValueError(
                "PPOConfig.learning_rate_schedule='linear' decays a number; learning_rate is "
                "already a schedule (leave learning_rate_schedule='constant')"
            )

    def optimizer_learning_rate(self) -> float | Callable[[Any], Any]:
        """What the optimizer gets: ``learning_rate``, or its linear decay to 0 over the run."""
        if self.learning_rate_schedule == "constant" or callable(self.learning_rate):
            return self.learning_rate
        return _linear_decay(float(self.learning_rate), self.total_updates)

    @property
    def total_updates(self) -> int:
        """Gradient steps over the run, one per minibatch of every epoch of every PPO step."""
        iterations = -(-self.total_steps // self.steps_per_iteration)
        return iterations * self.n_epochs * self.n_minibatches

    @property
    def steps_per_iteration(self) -> int:
        """Env steps one PPO step collects, ``n_envs * rollout_length``."""
        return self.n_envs * self.rollout_length


@dataclass
class EvalConfig(_FieldsOnly):
    """The evaluation rollouts: deterministic policy, one episode per env.

    Attributes:
      enabled: evaluate at step 0 and every ``every_steps`` env steps.
      every_steps: env steps between evaluations; 0 evaluates at step 0 only.
      n_envs: episodes per evaluation (one per env).
      max_episode_length: steps an evaluation episode may last.
      logging_level: ``ENV_METRICS``/``NETWORK_METRICS`` add episode-averaged metrics.
      logging_percentiles: percentiles of returns and lifespans to report besides
        their mean and std.
    """

    enabled: bool = True
    every_steps: int = 50_000
    n_envs: int = 64
    max_episode_length: int = 1000
    logging_level: LoggingLevel = LoggingLevel.NONE
    logging_percentiles: tuple[int, ...] | None = (0, 25, 50, 75, 100)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``TypeError``/``ValueError`` naming the first invalid field."""
        _accept_030_forms(self)
        if not isinstance(self.enabled, bool):
            raise TypeError(f"EvalConfig.enabled must be a bool, got {self.enabled!r}")
        _store_int("EvalConfig", self, "every_steps", minimum=0)
        for name in ("n_envs", "max_episode_length"):
            _store_int("EvalConfig", self, name)
        _require_logging("EvalConfig", self)


@dataclass
class VideoConfig(_FieldsOnly):
    """Recording a deterministic episode with ``env.render``.

    Attributes:
      enabled: record at step 0 and every ``every_steps`` env steps (needs a
        ``video_fn`` and an eval env with a ``render`` method).
      every_steps: env steps between recordings; 0 records at step 0 only.
      episode_length: steps recorded.
      render_kwargs: passed to ``env.render(trajectory, **render_kwargs)``.
    """

    enabled: bool = False
    every_steps: int = 200_000
    episode_length: int = 1000
    render_kwargs: dict[str, Any] = field(default_factory=lambda: {"height": 480, "width": 640})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``TypeError``/``ValueError`` naming the first invalid field."""
        _accept_030_forms(self)
        if not isinstance(self.enabled, bool):
            raise TypeError(f"VideoConfig.enabled must be a bool, got {self.enabled!r}")
        _store_int("VideoConfig", self, "every_steps", minimum=0)
        _store_int("VideoConfig", self, "episode_length")
        if not isinstance(self.render_kwargs, dict):
            raise TypeError(
                f"VideoConfig.render_kwargs must be a dict, got {type(self.render_kwargs).__name__}"
            )


@dataclass
class TrainConfig(_FieldsOnly):
    """A whole training run: PPO, evaluation, video, seed, checkpoint cadence and devices.

    Attributes:
      checkpoint_every_steps: env steps between checkpoints (a run also checkpoints
        at step 0 and at its end); 0 writes none.
      devices: how many devices the envs are split over (the first ``devices``
        of ``jax.devices()``); ``None`` for all of them when there is more than
        one. ``train_ppo_runs`` splits its runs over them instead (``None``: as
        many as divide the runs evenly). See :mod:`nnx_ppo.algorithms.sharding`.
    """

    ppo: PPOConfig = field(default_factory=PPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    seed: int = 17
    checkpoint_every_steps: int = 500_000
    devices: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Validate this config and every sub-config."""
        _accept_030_forms(self)
        for name, kind in (("ppo", PPOConfig), ("eval", EvalConfig), ("video", VideoConfig)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(
                    f"TrainConfig.{name} must be a {kind.__name__}, got {type(value).__name__}"
                )
            value.validate()
        # The int64 range jax.random.key takes (its keys keep the low 32 bits).
        _store_int("TrainConfig", self, "seed", minimum=-(2**63), maximum=2**63 - 1)
        _store_int("TrainConfig", self, "checkpoint_every_steps", minimum=0)
        if self.devices is not None:
            _store_int("TrainConfig", self, "devices")


def _warn_unused_video(
    owner: str, video: VideoConfig, video_fn: object, stacklevel: int = 3
) -> None:
    """Warn when only one of ``video.enabled`` and ``video_fn`` asks for videos."""
    if video.enabled and video_fn is None:
        warnings.warn(
            f"{owner}: config.video.enabled is True but no video_fn is given: nothing will be "
            "recorded. Pass video_fn=... to receive each recording.",
            stacklevel=stacklevel,
        )
    elif video_fn is not None and not video.enabled:
        warnings.warn(
            f"{owner}: a video_fn is given but config.video.enabled is False: it will never "
            "be called. Set config.video.enabled = True to record.",
            stacklevel=stacklevel,
        )


@dataclass
class VideoData:
    """What ``video_fn`` receives after a recording.

    Attributes:
      frames: ``(episode_length + 1, H, W, C)`` ``uint8`` frames: the reset state's,
        then one per step.
      step: the env step the recording was made at.
      episode_reward: the recorded episode's return (every reward leaf summed).
      episode_length: the steps recorded.
    """

    frames: UInt8[np.ndarray, "frames height width channels"]
    step: int
    episode_reward: float
    episode_length: int


@dataclass
class TrainResult:
    """What :func:`~nnx_ppo.algorithms.ppo.train_ppo` returns.

    Attributes:
      training_state: the state after the last PPO step (resume from it).
      final_metrics: the metrics logged last, a flat ``str -> float`` dict.
      eval_history: one ``{"step": s, **eval_metrics}`` per evaluation, with
        ``episode_reward_mean`` naming ``eval/episode_reward/mean``.
      total_steps: env steps taken, exact.
      total_iterations: PPO steps taken in this call.
      diverged: ``None``, or for a run that
        :func:`~nnx_ppo.algorithms.ppo.train_ppo_runs` set aside
        (``on_divergence="continue"``) the error that would have stopped it; its
        state and counts are those of its last good step.
    """

    training_state: TrainingState
    final_metrics: dict[str, float]
    eval_history: list[dict[str, float]]
    total_steps: int
    total_iterations: int
    diverged: str | None = None
