"""Policy distillation: train a student network to act like a frozen teacher.

The student drives the environment; the teacher watches the same observations
with its own carry, in deterministic mode (its samplers emit the mean, or the
most likely class, as their raw action). The student is trained to maximise the
log-likelihood of the teacher's deterministic action under its own
distribution, plus its own regularization (e.g. its samplers' entropy bonus)::

    loss = -sum over action leaves of mean_{t, b} log p_student(a_teacher | history) + reg

Teacher and student may have different architectures (an LSTM teacher, a
student with a delay line, a population graph): only their action trees must
match, leaf for leaf, with raw actions of the same shape. Each sampler's raw
action is found in the network's ``rollout_extras`` by tracing one call, so the
teacher's raw actions are handed to the student's samplers in loss replay.

The teacher is never mutated: the step runs a deterministic copy of it, and
no optimizer sees its parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Float, Integer, PRNGKeyArray

from nnx_ppo._compile import warn_if_mappings_near_cap
from nnx_ppo.algorithms import rollout
from nnx_ppo.algorithms._loss import _replay
from nnx_ppo.algorithms._removed import missing_attribute
from nnx_ppo.algorithms._step import (
    _STATISTICS_OVERFLOW_HINT,
    _ConfigArgument,
    _EnvArgument,
    _finite_leaves,
    _typed_as_given,
    _update_statistics_checked,
)
from nnx_ppo.algorithms._timing import ProgramClock
from nnx_ppo.algorithms._train import (
    _check_video,
    _HostWork,
    _new_training_state,
    _require_env_and_callbacks,
    _require_seed,
    _with_overrides,
)
from nnx_ppo.algorithms.checkpointing import (
    _load_checkpoint,
    _marked_as_checkpointing,
    _require_checkpointing,
    make_checkpoint_fn,
)
from nnx_ppo.algorithms.config import (
    EvalConfig,
    VideoConfig,
    VideoData,
    _accept_030_forms,
    _FieldsOnly,
    _require_logging,
    _require_optimizer_options,
    _require_rollouts_and_minibatches,
    _store_int,
)
from nnx_ppo.algorithms.metrics import compute_metrics, log_weight_stats, to_host
from nnx_ppo.algorithms.types import EnvState, LoggingLevel, RLEnv, TrainingState, Transition
from nnx_ppo.contract.arguments import require_called_eagerly, require_int, require_number
from nnx_ppo.contract.axes import BatchedTree, Carry, CarrySlice, Extras, HistoryTree, Scalar
from nnx_ppo.contract.checking import (
    FROZEN_STATISTICS_MARK,
    CallRecord,
    checks,
    format_graph_path,
    observe_calls,
    require_float_parameters,
    require_hashable_settings,
    require_no_hijax,
    typechecked,
)
from nnx_ppo.jax_dataclass import Replaceable
from nnx_ppo.networks.sampling_layers import ActionSampler, CategoricalSampler
from nnx_ppo.networks.types import (
    StatefulModule,
    StatefulModuleOutput,
    checked_ppo_output,
)

__all__ = [
    "DistillationConfig",
    "DistillationState",
    "DistillationTrainConfig",
    "DistillationTrainResult",
    "default_distillation_config",
    "distillation_loss",
    "distillation_step",
    "load_distillation_checkpoint",
    "make_distillation_checkpoint_fn",
    "new_distillation_state",
    "train_distillation",
]


def __getattr__(name: str) -> Any:
    raise missing_attribute(__name__, name)


# ----------------------------------------------------------------------------- config


@dataclass
class DistillationConfig(_FieldsOnly):
    """The distillation algorithm's parameters.

    Attributes:
      n_envs: environments stepped in parallel (the student acts in them).
      rollout_length: steps ``T`` collected per env between updates.
      total_steps: env steps to train for (``n_envs * rollout_length`` per step).
      learning_rate: Adam's learning rate.
      n_epochs: passes over the rollout per distillation step.
      n_minibatches: minibatches per epoch; each is a set of whole environments.
      gradient_clipping: clip gradients to this global norm; ``None`` for no clipping.
      weight_decay: AdamW's decay (``True`` for optax's default); ``None`` for Adam.
      logging_level: which training metrics to compute.
      logging_percentiles: summarise distributions by these percentiles instead
        of mean and std.
    """

    n_envs: int = 256
    rollout_length: int = 20
    total_steps: int = 512_000
    learning_rate: float = 1e-4
    n_epochs: int = 4
    n_minibatches: int = 4
    gradient_clipping: float | None = None
    weight_decay: float | bool | None = None
    logging_level: LoggingLevel = LoggingLevel.LOSSES
    logging_percentiles: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``TypeError``/``ValueError`` naming the first invalid field."""
        owner = "DistillationConfig"
        _accept_030_forms(self)
        _require_rollouts_and_minibatches(owner, self)
        self.learning_rate = require_number(owner, "learning_rate", self.learning_rate, minimum=0.0)
        _, self.gradient_clipping, self.weight_decay = _require_optimizer_options(
            owner, self.learning_rate, self.gradient_clipping, self.weight_decay
        )
        _require_logging(owner, self)

    @property
    def steps_per_iteration(self) -> int:
        """Env steps one distillation step collects, ``n_envs * rollout_length``."""
        return self.n_envs * self.rollout_length


@dataclass
class DistillationTrainConfig(_FieldsOnly):
    """A whole distillation run: the algorithm, evaluation, video, seed and checkpoint cadence
    (``checkpoint_every_steps``; 0 writes no checkpoint)."""

    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    seed: int = 17
    checkpoint_every_steps: int = 500_000

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Validate this config and every sub-config."""
        _accept_030_forms(self)
        for name, kind in (
            ("distillation", DistillationConfig),
            ("eval", EvalConfig),
            ("video", VideoConfig),
        ):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(
                    f"DistillationTrainConfig.{name} must be a {kind.__name__}, "
                    f"got {type(value).__name__}"
                )
            value.validate()
        owner = "DistillationTrainConfig"
        _store_int(owner, self, "seed", minimum=-(2**63), maximum=2**63 - 1)
        _store_int(owner, self, "checkpoint_every_steps", minimum=0)


def default_distillation_config() -> DistillationTrainConfig:
    """The default :class:`DistillationTrainConfig`."""
    return DistillationTrainConfig()


# ------------------------------------------------------------------------------ state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DistillationState(Replaceable):
    """Everything a distillation run carries from one step to the next.

    The teacher is not held here (it is passed to every step, like the env);
    only its per-env carry is. ``steps_taken`` is a host ``int``.

    Attributes:
      student: the network being trained.
      student_states: the student's carry in every training env, leaves ``(n_envs, ...)``.
      teacher_states: the teacher's carry in every training env, leaves ``(n_envs, ...)``.
      env_states: the batched env states.
      optimizer: an ``nnx.Optimizer`` over the student's ``nnx.Param`` s only.
      rng_key: the key the next step splits.
      steps_taken: env steps taken so far.
    """

    student: StatefulModule
    student_states: Carry
    teacher_states: Carry
    env_states: EnvState
    optimizer: nnx.Optimizer
    rng_key: PRNGKeyArray
    steps_taken: int = dataclasses.field(default=0, metadata={"static": True})


@dataclass
class DistillationTrainResult:
    """What :func:`train_distillation` returns.

    Attributes:
      training_state: the state after the last step (resume from it).
      final_metrics: the metrics logged last, a flat ``str -> float`` dict.
      eval_history: one ``{"step": s, **eval_metrics}`` per evaluation of the student,
        with ``episode_reward_mean`` naming ``eval/episode_reward/mean``, as in
        :class:`~nnx_ppo.algorithms.config.TrainResult`.
      total_steps: env steps taken, exact.
      total_iterations: distillation steps taken in this call.
    """

    training_state: DistillationState
    final_metrics: dict[str, float]
    eval_history: list[dict[str, float]]
    total_steps: int
    total_iterations: int


# ------------------------------------------------------- where samplers keep their action


@dataclass(frozen=True)
class _SamplerLeaves:
    """For each action leaf (by path), where its sampler's raw action sits in the extras.

    Tuples of pairs, not dicts: the value is a jit static argument and must hash.
    """

    action_tree: Any
    extras_paths: tuple[tuple[str, tuple[Any, ...]], ...]
    raw_shapes: tuple[tuple[str, jax.ShapeDtypeStruct], ...]
    samplers: tuple[tuple[str, tuple[str, tuple[int, ...]]], ...]
    """Each action's sampler: its class and the shape of one env's input (the logits of a
    categorical sampler, whose width is its number of classes)."""


def _sampler_leaves(network: StatefulModule, obs: BatchedTree, role: str) -> _SamplerLeaves:
    """Trace one call of ``network`` (no compilation) and locate every sampler's raw action.

    A sampler's action output is a leaf of ``PPONetworkOutput.actions`` and its raw
    action a leaf of the network's ``rollout_extras``: the very same traced values,
    matched by identity. A copy of the network is traced, so no random-stream
    counter of the network itself is advanced.
    """
    probe = nnx.clone(network)
    found: list[_SamplerLeaves] = []

    def traced(probe: StatefulModule, obs: BatchedTree) -> None:
        records: list[CallRecord] = []
        with checks(True), observe_calls(records.append):
            out = probe(probe.initialize_state(jax.tree.leaves(obs)[0].shape[0]), obs)
        output = checked_ppo_output(out.output, f"distillation ({role})")
        sampler_calls = {
            id(record.result.output["action"]): record
            for record in records
            if isinstance(record.module, ActionSampler)
            and record.method == "__call__"
            and record.result is not None
        }
        raw_of_action = {
            action: record.result.rollout_extras
            for action, record in sampler_calls.items()
            if record.result is not None
        }
        extras_path_of = {
            id(leaf): tuple(path)
            for path, leaf in jax.tree_util.tree_flatten_with_path(out.rollout_extras)[0]
        }
        paths, shapes, samplers = [], [], []
        for path, action in jax.tree_util.tree_flatten_with_path(output.actions)[0]:
            name = jax.tree_util.keystr(path)
            raw = raw_of_action.get(id(action))
            if raw is None or id(raw) not in extras_path_of:
                raise ValueError(
                    f"distillation: the {role}'s action{name} does not come from an "
                    "ActionSampler whose raw action the network emits in rollout_extras; "
                    "distillation scores the teacher's raw action with the student's sampler"
                )
            paths.append((name, extras_path_of[id(raw)]))
            shapes.append((name, jax.ShapeDtypeStruct(raw.shape[1:], raw.dtype)))
            call = sampler_calls[id(action)]
            given = jax.tree.leaves(call.arguments[1][1])  # the sampler's x
            width = tuple(given[0].shape[1:]) if len(given) == 1 else ()
            samplers.append((name, (type(call.module).__name__, width)))
        found.append(
            _SamplerLeaves(
                jax.tree.structure(output.actions), tuple(paths), tuple(shapes), tuple(samplers)
            )
        )

    try:
        nnx.eval_shape(traced, probe, obs)
    except Exception as error:
        error.add_note(f"(raised while distillation traced the {role} network)")
        raise
    return found[0]


def _require_same_actions(teacher: _SamplerLeaves, student: _SamplerLeaves) -> None:
    if teacher.action_tree != student.action_tree:
        raise ValueError(
            "distillation: the teacher and the student have different action trees, so the "
            f"student cannot be scored on the teacher's actions.\n  teacher actions: "
            f"{teacher.action_tree}\n  student actions: {student.action_tree}"
        )
    student_samplers = dict(student.samplers)
    for name, (kind, width) in teacher.samplers:
        other, other_width = student_samplers[name]
        if kind != other:
            raise ValueError(
                f"distillation: the samplers of action{name} differ: the teacher's is a {kind}, "
                f"the student's a {other}; the student learns the teacher's raw action, which "
                "only a sampler of the same kind turns into the same action (a "
                "NormalTanhSampler squashes what a NormalSampler emits as it is)"
            )
        if kind == CategoricalSampler.__name__ and width != other_width:
            raise ValueError(
                f"distillation: the samplers of action{name} choose among different classes: "
                f"the teacher's takes logits {width} per env, the student's {other_width}"
            )
    student_shapes = dict(student.raw_shapes)
    for name, wanted in teacher.raw_shapes:
        got = student_shapes[name]
        integer = jnp.issubdtype(wanted.dtype, jnp.integer)
        if wanted.shape != got.shape or integer != jnp.issubdtype(got.dtype, jnp.integer):
            raise ValueError(
                f"distillation: the samplers of action{name} differ: the teacher's raw action "
                f"is {wanted.shape} {wanted.dtype} per env, the student's {got.shape} "
                f"{got.dtype}; give both the same kind of sampler for this action"
            )


def _with_teacher_actions(
    student_extras: Extras, teacher_extras: Extras, teacher: _SamplerLeaves, student: _SamplerLeaves
) -> Extras:
    """The student's extras, each sampler's raw action replaced by the teacher's."""
    student_paths = dict(student.extras_paths)
    by_path = {
        student_paths[name]: _leaf_at(teacher_extras, path) for name, path in teacher.extras_paths
    }
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: by_path.get(tuple(path), leaf), student_extras
    )


def _leaf_at(tree: Any, path: tuple[Any, ...]) -> Any:
    for leaf_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if tuple(leaf_path) == path:
            return leaf
    raise KeyError(jax.tree_util.keystr(path))


# ---------------------------------------------------------------------------- rollout


class _StudentWithTeacher(StatefulModule):
    """The student acting while the (deterministic) teacher watches the same inputs.

    Carry and extras are ``{"student": ..., "teacher": ...}``; the output is the
    student's, so :func:`~nnx_ppo.algorithms.rollout.unroll_env` rolls it out.
    """

    def __init__(self, student: StatefulModule, teacher: StatefulModule) -> None:
        self.student = student
        self.teacher = teacher

    def __call__(
        self, state: dict[str, Carry], x: BatchedTree, rollout_extras: Extras = None
    ) -> StatefulModuleOutput:
        del rollout_extras  # only rolled out, never replayed
        student = self.student(state["student"], x)
        teacher = self.teacher(state["teacher"], x)
        return StatefulModuleOutput(
            next_state={"student": student.next_state, "teacher": teacher.next_state},
            output=student.output,
            regularization_loss=student.regularization_loss,
            metrics=student.metrics,
            rollout_extras={"student": student.rollout_extras, "teacher": teacher.rollout_extras},
        )

    def initialize_state(self, batch_size: int) -> dict[str, Carry]:
        return {
            "student": self.student.initialize_state(batch_size),
            "teacher": self.teacher.initialize_state(batch_size),
        }

    def reset_state(self, prev_state: CarrySlice) -> CarrySlice:
        return {
            "student": self.student.reset_state(prev_state["student"]),
            "teacher": self.teacher.reset_state(prev_state["teacher"]),
        }


# ------------------------------------------------------------------------------- loss


@typechecked
def distillation_loss(
    student: StatefulModule,
    student_state: Carry,
    rollout_data: Transition,
    targets: HistoryTree,
) -> tuple[Scalar, dict[str, Any]]:
    """The student's negative log-likelihood of the teacher's actions, plus its regularization.

    Args:
      student: the network being trained.
      student_state: its carry where the rollout started, leaves ``(B, ...)``.
      rollout_data: the minibatch's transitions, leaves ``(T, B, ...)``; their
        ``carries``, where kept, are the student's (it is then replayed in one flat
        batch where its parameters cannot change its carry, as ``ppo_loss`` is).
      targets: the student's rollout extras with every sampler's raw action replaced by
        the teacher's deterministic one, leaves ``(T, B, ...)``; replaying the student
        on them scores the teacher's actions.

    Returns:
      The scalar loss and ``losses/distillation_nll`` (per action leaf),
      ``losses/regularization`` and ``losses/total``.
    """
    rollout_data, targets = jax.lax.stop_gradient((rollout_data, targets))
    scored = rollout_data.replace(rollout_extras=targets)
    output, regularization = _replay(student, student_state, scored, "distillation_loss")
    nll = jax.tree.map(lambda ll: -jnp.mean(ll), output.loglikelihoods)
    total = jax.tree.reduce(jnp.add, nll) + jnp.mean(regularization)
    return total, {
        "losses/distillation_nll": nll,
        "losses/regularization": jnp.mean(regularization),
        "losses/total": total,
    }


# ------------------------------------------------------------------------------- step


def _learn(
    student: StatefulModule,
    optimizer: nnx.Optimizer,
    data: tuple[Carry, Transition, HistoryTree],
    key: PRNGKeyArray,
    config: DistillationConfig,
) -> dict[str, Any]:
    """Epochs of gradient steps on minibatches of whole environments."""
    nnx.pop(student, nnx.Intermediate)  # what the rollout sowed: the scan carries none
    graphdef, state = nnx.split((student, optimizer))
    first_carry, transitions, targets = data
    # The loss replays the student alone: of the carries the pair's rollout kept, the student's.
    carries = None if transitions.carries is None else transitions.carries["student"]
    transitions = transitions.replace(metrics={}, carries=carries)

    def update(state: nnx.State, ids: Integer[Array, " b"]) -> tuple[nnx.State, dict[str, Any]]:
        student, optimizer = nnx.merge(graphdef, state)
        carry = jax.tree.map(lambda x: x[ids], first_carry)
        batch, batch_targets = jax.tree.map(lambda x: x[:, ids], (transitions, targets))
        grads, diagnostics = nnx.grad(
            lambda s: distillation_loss(s, carry, batch, batch_targets), has_aux=True
        )(student)
        diagnostics["grad_norm"] = optax.tree.norm(grads)
        optimizer.update(student, grads)
        nnx.pop(student, nnx.Intermediate)  # what the replay sowed: the scan keeps none
        return nnx.state((student, optimizer)), diagnostics

    def epoch(state: nnx.State, key: PRNGKeyArray) -> tuple[nnx.State, dict[str, Any]]:
        ids = jax.random.permutation(key, config.n_envs).reshape(config.n_minibatches, -1)
        return jax.lax.scan(update, state, ids)

    state, diagnostics = jax.lax.scan(epoch, state, jax.random.split(key, config.n_epochs))
    nnx.update((student, optimizer), state)
    return diagnostics


def _step(
    env: RLEnv,
    config: DistillationConfig,
    leaves: tuple[_SamplerLeaves, _SamplerLeaves],
    pair: _StudentWithTeacher,
    optimizer: nnx.Optimizer,
    carry: tuple[dict[str, Carry], EnvState, PRNGKeyArray],
) -> tuple[
    tuple[dict[str, Carry], EnvState, PRNGKeyArray], dict[str, Float[Array, ""]], dict[str, Any]
]:
    """Roll out the student with the teacher watching, learn, fold statistics. Traced once.

    Returns the next carry, the metrics, and the step's health: whether each quantity
    :func:`_raise_if_distillation_diverged` reads is finite.
    """
    states, env_states, key = carry
    rollout_key, learn_key, next_key = jax.random.split(key, 3)
    final_states, final_env_states, transitions = rollout.unroll_env(
        env, env_states, pair, states, config.rollout_length, rollout_key
    )
    # _StudentWithTeacher emits {"student": ..., "teacher": ...}, stacked (T, B, ...).
    extras = cast(dict[str, HistoryTree], transitions.rollout_extras)
    teacher_leaves, student_leaves = leaves
    targets = _with_teacher_actions(
        extras["student"], extras["teacher"], teacher_leaves, student_leaves
    )
    data = (states["student"], transitions, targets)
    diagnostics = _learn(pair.student, optimizer, data, learn_key, config)
    statistics_finite = _update_statistics_checked(pair.student, extras["student"])
    metrics = {  # the student's network metrics under 0.3.0's name for them, student/...
        _STUDENT_PREFIX + name.removeprefix("net/") if name.startswith("net/") else name: value
        for name, value in compute_metrics(
            diagnostics, transitions, config.logging_level, config.logging_percentiles
        ).items()
    }
    if LoggingLevel.WEIGHTS in config.logging_level:
        log_weight_stats(metrics, pair.student, config.logging_percentiles)
    health = {
        # Statistics too: the teacher's Normalizer is never updated here, so NaN statistics
        # (a teacher that diverged, a damaged checkpoint) would teach NaN-fed actions.
        "teacher_variables_finite": _finite_leaves(nnx.state(pair.teacher, nnx.Not(nnx.RngState))),
        "observations_finite": _finite_leaves(transitions.obs),
        "teacher_actions_finite": {
            name: jnp.all(jnp.isfinite(_leaf_at(extras["teacher"], path)))
            for name, path in teacher_leaves.extras_paths
        },
        "loss_finite": jnp.isfinite(diagnostics["losses/total"]),
        "parameters_finite": _finite_leaves(nnx.state(pair.student, nnx.Param)),
        "statistics_finite": statistics_finite,
    }
    nnx.pop(pair, nnx.Intermediate)  # what the rollout sowed: the state keeps none
    return (final_states, final_env_states, next_key), metrics, health


_STUDENT_PREFIX = "student/"
"""Where a distillation step logs the student's ``NETWORK_METRICS`` (PPO: ``net/``)."""


def _raise_if_distillation_diverged(health: dict[str, Any], steps: int) -> None:
    """Raise ``FloatingPointError`` naming the step and the first non-finite quantity.

    A teacher's non-finite parameter or statistic is named even where its actions stay
    finite: a categorical teacher's NaN logits still choose an action, and the student
    would learn it.
    """
    step = f"distillation step ending at env step {steps}"
    unchanged = "the student and optimizer are left as they were before the call."
    teacher = [name for name, finite in health["teacher_variables_finite"].items() if not finite]
    if teacher:
        raise FloatingPointError(
            f"{step}: the teacher's parameters or statistics are NaN or infinite "
            f"({', '.join(teacher[:5])}): what it teaches means nothing, even where its "
            f"actions are finite (a categorical sampler still picks one); {unchanged} Distil "
            "a teacher whose parameters and statistics are finite (one that diverged in "
            "training has none)."
        )
    actions = [name for name, finite in health["teacher_actions_finite"].items() if not finite]
    bad_updates = np.argwhere(~np.asarray(health["loss_finite"]))
    student = [name for name, finite in health["parameters_finite"].items() if not finite]
    statistics = [name for name, finite in health["statistics_finite"].items() if not finite]
    if not (actions or bad_updates.size or student or statistics):
        return
    observations = [name for name, finite in health["observations_finite"].items() if not finite]
    if observations:  # named only where the step diverged: an unread inf may be harmless
        raise FloatingPointError(
            f"{step}: the env returned NaN or infinite observations (obs{observations[0]}), "
            f"and the step diverged; {unchanged}"
        )
    if actions:
        raise FloatingPointError(
            f"{step}: the teacher's action{actions[0]} is NaN or infinite where its "
            f"parameters and the observations are finite; {unchanged}"
        )
    if bad_updates.size:
        epoch, minibatch = bad_updates[0]
        raise FloatingPointError(
            f"{step}: the distillation loss is NaN or infinite (epoch {epoch}, minibatch "
            f"{minibatch}); {unchanged}"
        )
    if student:
        raise FloatingPointError(
            f"{step}: the student's parameters became NaN or infinite: "
            f"{', '.join(student[:5])}; {unchanged}"
        )
    raise FloatingPointError(
        f"{step}: the student's running statistics became NaN or infinite in "
        f"update_statistics: {', '.join(statistics[:5])} ({_STATISTICS_OVERFLOW_HINT}); "
        f"{unchanged}"
    )


@functools.partial(jax.jit, static_argnums=(0, 1))
def _compiled_step(
    static: tuple[
        _EnvArgument, _ConfigArgument[DistillationConfig], tuple[_SamplerLeaves, _SamplerLeaves]
    ],
    graphdef: nnx.GraphDef[Any],
    state: nnx.State,
    carry: tuple[dict[str, Carry], EnvState, PRNGKeyArray],
) -> tuple[
    nnx.State,
    tuple[dict[str, Carry], EnvState, PRNGKeyArray],
    dict[str, Float[Array, ""]],
    dict[str, Any],
]:
    env, config, leaves = static
    as_given = _typed_as_given(state)
    pair, optimizer = nnx.merge(graphdef, state)
    carry, metrics, health = _step(env.env, config.config, leaves, pair, optimizer, carry)
    return as_given(nnx.state((pair, optimizer))), carry, metrics, health


def _require_unshared(teacher: StatefulModule, student: StatefulModule) -> None:
    """Refuse a student holding a variable of the teacher: training it would change the teacher.

    Raises:
      ValueError: the student is the teacher, or holds one of its trained variables.
    """
    if student is teacher:
        raise ValueError("distillation: the student is the teacher; give it a network of its own")

    # Random streams shared through one nnx.Rngs are no concern: training writes none.
    def trained(value: Any) -> bool:
        return isinstance(value, nnx.Variable) and not isinstance(value, nnx.RngState)

    # Nor are statistics the student holds fixed under FrozenStatistics (a normaliser
    # reused from the teacher): its update_statistics never reaches them, and the
    # optimizer moves Params alone.
    frozen = [
        tuple(path)
        for path, node in nnx.iter_graph(student)
        if getattr(node, FROZEN_STATISTICS_MARK, False)
    ]

    def held_fixed(path: tuple[Any, ...], value: Any) -> bool:
        return not isinstance(value, nnx.Param) and any(path[: len(f)] == f for f in frozen)

    of_teacher = {id(value): path for path, value in nnx.iter_graph(teacher) if trained(value)}
    for path, value in nnx.iter_graph(student):
        if trained(value) and id(value) in of_teacher and not held_fixed(tuple(path), value):
            raise ValueError(
                f"distillation: student{format_graph_path(student, path)} is "
                f"teacher{format_graph_path(teacher, of_teacher[id(value)])}: training the "
                "student would change the teacher. Give the student copies (nnx.clone) of "
                "what it takes from the teacher."
            )


def _deterministic_copy(teacher: StatefulModule) -> StatefulModule:
    """A copy of the teacher in eval mode, its arrays shared; the teacher itself is untouched."""
    copy = nnx.clone(teacher)
    copy.eval()
    return copy


def distillation_step(
    env: RLEnv,
    teacher: StatefulModule,
    distillation_state: DistillationState,
    n_envs: int,
    rollout_length: int,
    n_epochs: int,
    n_minibatches: int,
    logging_level: LoggingLevel = LoggingLevel.LOSSES,
    logging_percentiles: tuple[int, ...] | None = None,
) -> tuple[DistillationState, dict[str, float]]:
    """One distillation step: roll out, then epochs of minibatch updates of the student.

    The teacher runs deterministically (a copy in eval mode) whatever mode it is in;
    it is not modified. The step is compiled once per env, network structure and
    settings and reused.

    Args:
      env: one unbatched training environment.
      teacher: the frozen teacher.
      distillation_state: from :func:`new_distillation_state` or a previous step.
      n_envs: must equal the number of envs in ``distillation_state``.
      rollout_length, n_epochs, n_minibatches, logging_level, logging_percentiles:
        as in :class:`DistillationConfig`.

    Returns:
      The next state and the step's metrics, a flat ``str -> float`` dict with
      ``total_steps``.

    Raises:
      ValueError: teacher and student have different action trees or samplers (the
        message shows both), found before anything is compiled; ``n_envs`` is not the
        state's number of environments; or a setting is invalid.
      FloatingPointError: the teacher's parameters or actions, the loss, or the
        student's parameters or running statistics are NaN or infinite (named); the
        student and optimizer are left as they were before the call.
    """
    config = DistillationConfig(
        n_envs=n_envs,
        rollout_length=rollout_length,
        total_steps=rollout_length * n_envs,
        n_epochs=n_epochs,
        n_minibatches=n_minibatches,
        logging_level=logging_level,
        logging_percentiles=logging_percentiles,
    )
    if not isinstance(distillation_state, DistillationState):
        raise TypeError(
            "distillation_step: distillation_state must be a DistillationState, got a "
            f"{type(distillation_state).__name__}"
        )
    require_called_eagerly("distillation_step", distillation_state.rng_key)
    held = rollout.n_envs_of(distillation_state.env_states, "distillation_step")
    if held != n_envs:
        raise ValueError(
            f"distillation_step: n_envs is {n_envs} but distillation_state holds {held} "
            "environments; pass the n_envs the state was made with"
        )
    student = distillation_state.student
    _require_unshared(teacher, student)
    frozen = _deterministic_copy(teacher)
    leaves = _matched_samplers(frozen, student, distillation_state.env_states.obs)
    pair = _StudentWithTeacher(student, frozen)
    graphdef, state = nnx.split((pair, distillation_state.optimizer))
    carry = (
        {
            "student": distillation_state.student_states,
            "teacher": distillation_state.teacher_states,
        },
        distillation_state.env_states,
        distillation_state.rng_key,
    )
    static = (_EnvArgument(env), _ConfigArgument(config), leaves)
    state, (states, env_states, key), metrics, health = _compiled_step(
        static, graphdef, state, carry
    )
    # Called inside a transform with a state it closes over: the program ran traced.
    require_called_eagerly("distillation_step", health)
    total = distillation_state.steps_taken + config.steps_per_iteration
    _raise_if_distillation_diverged(jax.device_get(health), total)
    nnx.update((pair, distillation_state.optimizer), state)
    host = to_host(metrics)
    host["total_steps"] = float(total)
    return distillation_state.replace(
        student_states=states["student"],
        teacher_states=states["teacher"],
        env_states=env_states,
        rng_key=key,
        steps_taken=total,
    ), host


class _OutsideKey:
    """A value handed to a cached function outside its cache key: all are equal."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _OutsideKey)


_Structure = tuple[nnx.GraphDef[Any], tuple[Any, ...]]
"""A network's graph and the abstract values (shape, dtype) of its state's leaves."""


def _structure(network: StatefulModule) -> _Structure:
    # The graph alone holds no array shapes: a layer sized by its Param's shape alone is
    # one graph at every width.
    return nnx.graphdef(network), tuple(map(jax.typeof, jax.tree.leaves(nnx.state(network))))


@functools.lru_cache(maxsize=32)
def _matched_by_structure(
    teacher_structure: _Structure,
    student_structure: _Structure,
    obs_shapes: tuple[tuple[jax.ShapeDtypeStruct, ...], Any],
    networks: _OutsideKey,
) -> tuple[_SamplerLeaves, _SamplerLeaves]:
    """:func:`_matched_samplers`' tracing, cached.

    ``teacher_structure``, ``student_structure`` and ``obs_shapes`` are read only as
    the cache's key; the networks traced are those ``networks`` holds, which takes no
    part in the key.
    """
    teacher, student = networks.value
    obs = jax.tree.unflatten(obs_shapes[1], obs_shapes[0])
    teacher_leaves = _sampler_leaves(teacher, obs, "teacher")
    student_leaves = _sampler_leaves(student, obs, "student")
    _require_same_actions(teacher_leaves, student_leaves)
    return teacher_leaves, student_leaves


def _matched_samplers(
    teacher: StatefulModule, student: StatefulModule, obs: BatchedTree
) -> tuple[_SamplerLeaves, _SamplerLeaves]:
    """Both networks' sampler leaves, after checking their action trees agree.

    Traced once per pair of network structures and observation shapes.
    """
    leaves, tree = jax.tree.flatten(obs)
    shapes = (tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves), tree)
    return _matched_by_structure(
        _structure(teacher), _structure(student), shapes, _OutsideKey((teacher, student))
    )


# ------------------------------------------------------------------------------ setup


def new_distillation_state(
    env: RLEnv,
    teacher: StatefulModule,
    student: StatefulModule,
    n_envs: int,
    seed: int,
    learning_rate: float = 1e-4,
    gradient_clipping: float | None = None,
    weight_decay: float | bool | None = None,
) -> DistillationState:
    """A fresh distillation state: ``n_envs`` reset envs, fresh carries for both networks.

    Envs, student carry, key and optimizer are made as
    :func:`~nnx_ppo.algorithms.ppo.new_training_state` makes them for the student;
    the optimizer (Adam, AdamW with ``weight_decay``, after optional global-norm
    clipping) tracks the student's ``nnx.Param`` s only. The teacher's carry comes
    from a copy of it, so not even its random streams advance.

    Raises:
      ValueError: teacher and student have different action trees or samplers (the
        message shows both), found by tracing before anything is compiled; the
        student is the teacher or holds one of its variables (named by path); or
        ``n_envs`` is not positive.
      TypeError: teacher or student is not a ``StatefulModule``; ``n_envs`` or
        ``seed`` is not an integer.
    """
    n_envs = require_int("new_distillation_state", "n_envs", n_envs)
    _require_seed(seed, "new_distillation_state")
    for role, network in (("teacher", teacher), ("student", student)):
        if not isinstance(network, StatefulModule):
            raise TypeError(
                f"new_distillation_state: the {role} must be a StatefulModule, "
                f"got a {type(network).__name__}"
            )
        require_no_hijax(f"new_distillation_state ({role})", network)
        require_hashable_settings(f"new_distillation_state ({role})", network)
    require_float_parameters("new_distillation_state (student)", student)
    obs = jax.eval_shape(
        lambda: rollout.reset_envs(env, jax.random.split(jax.random.key(0), n_envs)).obs
    )
    _require_unshared(teacher, student)
    frozen = _deterministic_copy(teacher)
    _matched_samplers(frozen, student, obs)
    start = _new_training_state(
        env,
        student,
        n_envs,
        seed,
        learning_rate,
        gradient_clipping,
        weight_decay,
        optimizer=None,
        explores=False,
    )
    return DistillationState(
        student=student,
        student_states=start.network_states,
        teacher_states=frozen.initialize_state(n_envs),
        env_states=start.env_states,
        optimizer=start.optimizer,
        rng_key=start.rng_key,
        steps_taken=0,
    )


# ------------------------------------------------------------------------ checkpoints


def _as_training_state(state: DistillationState) -> TrainingState:
    """The distillation state in the form checkpointing stores: both carries as one."""
    return TrainingState(
        networks=state.student,
        network_states={"student": state.student_states, "teacher": state.teacher_states},
        env_states=state.env_states,
        optimizer=state.optimizer,
        rng_key=state.rng_key,
        steps_taken=state.steps_taken,
    )


def make_distillation_checkpoint_fn(
    directory: str | Path, *, keep_last: int = 3
) -> Callable[[DistillationState, int], None]:
    """A ``checkpoint_fn`` for :func:`train_distillation`, written like PPO's checkpoints.

    Each checkpoint holds the student, its optimizer, both networks' carries, the
    env states, the key and the step count (see
    :func:`~nnx_ppo.algorithms.checkpointing.make_checkpoint_fn`); not the teacher,
    which is not trained. Restore with :func:`load_distillation_checkpoint`, or the
    student alone with :func:`~nnx_ppo.algorithms.checkpointing.load_checkpoint`.
    """
    save = make_checkpoint_fn(directory, keep_last=keep_last)

    def checkpoint_fn(state: DistillationState, step: int) -> None:
        save(_as_training_state(state), step)

    return _marked_as_checkpointing(checkpoint_fn, "DistillationState")


_DISTILLATION_OPTIMIZER = (
    "as train_distillation does from its config: new_distillation_state(env, teacher, "
    "student, d.n_envs, seed, d.learning_rate, d.gradient_clipping, d.weight_decay) with "
    "d = config.distillation"
)


def load_distillation_checkpoint(
    path: str | Path, template: DistillationState, *, step: int | None = None
) -> DistillationState:
    """Resume from a checkpoint of :func:`make_distillation_checkpoint_fn`.

    Args:
      path: a run directory, a checkpoint directory (the latest is taken) or one
        step directory.
      template: a state of the same student, teacher and ``n_envs`` (from
        :func:`new_distillation_state`, with the run's learning rate, clipping and
        decay: the resumed run trains with the template's optimizer, whatever a
        config says); its student and optimizer are updated in place.
      step: a specific step instead of the latest.

    Raises:
      CheckpointError: missing, corrupted, or not of this architecture (the message
        names the paths that differ).
    """
    loaded = _load_checkpoint(
        path, _as_training_state(template), None, step, _DISTILLATION_OPTIMIZER
    )["training_state"]
    return template.replace(
        student_states=loaded.network_states["student"],
        teacher_states=loaded.network_states["teacher"],
        env_states=loaded.env_states,
        rng_key=loaded.rng_key,
        steps_taken=loaded.steps_taken,
    )


# ------------------------------------------------------------------------------ train


def train_distillation(
    env: RLEnv,
    teacher: StatefulModule,
    student: StatefulModule,
    config: DistillationTrainConfig | None = None,
    *,
    total_steps: int | None = None,
    seed: int | None = None,
    log_fn: Callable[[dict[str, float], int], None] | None = None,
    video_fn: Callable[[VideoData], None] | None = None,
    checkpoint_fn: Callable[[DistillationState, int], None] | None = None,
    eval_env: RLEnv | None = None,
    initial_state: DistillationState | None = None,
) -> DistillationTrainResult:
    """Distil ``teacher`` into ``student`` on ``env`` until ``total_steps`` env steps.

    Evaluates the student's deterministic policy (if enabled), records it (if video
    is enabled and ``video_fn`` is given) and checkpoints (if ``checkpoint_fn`` is
    given) at the start and whenever the step count passes a multiple of their
    ``every_steps``.

    Args:
      env: one unbatched training environment.
      teacher: the frozen teacher; never modified (a deterministic copy of it runs).
      student: the network to train, in place.
      config: the run's configuration; :func:`default_distillation_config` when ``None``.
      total_steps, seed: override ``config.distillation.total_steps`` and ``config.seed``.
      log_fn: called as ``log_fn(metrics, step)`` after every step (and after the
        initial evaluation).
      video_fn: receives a :class:`~nnx_ppo.algorithms.config.VideoData` per recording
        of the student, made with the eval env's ``render``.
      checkpoint_fn: called as ``checkpoint_fn(state, step)``, e.g.
        :func:`make_distillation_checkpoint_fn`'s.
      eval_env: the evaluation environment; ``env`` when ``None``.
      initial_state: resume from this state instead of a fresh one (its optimizer
        included: the config's ``learning_rate``, ``gradient_clipping`` and
        ``weight_decay`` then go unused).

    Returns:
      A :class:`DistillationTrainResult`.

    Raises:
      ValueError: teacher and student have different action trees or samplers (the
        message shows both), before anything is compiled.
      TypeError: ``config`` is not a :class:`DistillationTrainConfig`, or video is asked
        of an eval env without ``render``.
      FloatingPointError: a step diverged, as :func:`distillation_step` raises it; the
        student and the ``checkpoint_fn``'s checkpoints hold the last good step.
    """
    config = _with_overrides(
        "train_distillation",
        DistillationTrainConfig,
        "distillation",
        config,
        total_steps,
        seed=seed,
    )
    _require_env_and_callbacks(
        "train_distillation",
        env,
        eval_env,
        log_fn=(log_fn, ("metrics", "step")),
        video_fn=(video_fn, ("video",)),
        checkpoint_fn=(checkpoint_fn, ("state", "step")),
    )
    _require_checkpointing("train_distillation", checkpoint_fn, "DistillationState")
    warn_if_mappings_near_cap("train_distillation")
    settings = config.distillation
    if initial_state is None:
        state = new_distillation_state(
            env,
            teacher,
            student,
            settings.n_envs,
            config.seed,
            settings.learning_rate,
            settings.gradient_clipping,
            settings.weight_decay,
        )
    elif isinstance(initial_state, DistillationState):
        if initial_state.student is not student:
            raise ValueError(
                "train_distillation: student is not initial_state.student; a resumed state "
                "trains the student it holds, so pass train_distillation(env, teacher, "
                "initial_state.student, ..., initial_state=initial_state)"
            )
        held = rollout.n_envs_of(initial_state.env_states, "train_distillation")
        if held != settings.n_envs:
            raise ValueError(
                f"train_distillation: initial_state holds {held} envs, but "
                f"config.distillation.n_envs is {settings.n_envs}"
            )
        state = initial_state
    else:
        raise TypeError(
            "train_distillation: initial_state must be a DistillationState, got a "
            f"{type(initial_state).__name__}"
        )
    eval_env = env if eval_env is None else eval_env
    timed = LoggingLevel.THROUGHPUT in settings.logging_level
    _check_video("train_distillation", config.video, video_fn, eval_env)
    host = _HostWork(
        "train_distillation",
        config,
        eval_env,
        state.steps_taken,
        ProgramClock() if timed else None,  # nothing runs ahead of its host work
        None,
        video_fn,
        checkpoint_fn,
    )
    metrics = host.start(state, state.student, log_fn)
    iterations = 0
    while state.steps_taken < settings.total_steps:
        start = time.perf_counter()
        state, metrics = distillation_step(
            env,
            teacher,
            state,
            settings.n_envs,
            settings.rollout_length,
            settings.n_epochs,
            settings.n_minibatches,
            settings.logging_level,
            settings.logging_percentiles,
        )
        if timed:
            metrics["throughput/train_sps"] = settings.steps_per_iteration / (
                time.perf_counter() - start
            )
        iterations += 1
        metrics |= host.evaluate_and_record(state.student, state.steps_taken)
        if log_fn is not None:
            log_fn(metrics, state.steps_taken)
        host.checkpoint(state, ends=state.steps_taken >= settings.total_steps)
    return DistillationTrainResult(state, metrics, host.history, state.steps_taken, iterations)
