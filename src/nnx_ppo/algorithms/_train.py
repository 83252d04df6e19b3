"""A training run: a fresh training state, and the host loop that evaluates, logs and
checkpoints around the compiled PPO steps."""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Float, Integer, PRNGKeyArray, UInt8

from nnx_ppo._compile import training_jit, warn_if_mappings_near_cap
from nnx_ppo.algorithms import rollout, sharding
from nnx_ppo.algorithms._step import (
    InFlight,
    _abstract,
    _compile_ahead,
    _compiled_reset,
    _EnvArgument,
    _no_running_episodes,
    _on_device,
    _require_training_state,
    dispatch_next,
    dispatch_steps,
    finish,
    require_env_count,
)
from nnx_ppo.algorithms._timing import ProgramClock, WatchedCall
from nnx_ppo.algorithms.checkpointing import _require_checkpointing
from nnx_ppo.algorithms.config import (
    EvalConfig,
    TrainConfig,
    TrainResult,
    VideoConfig,
    VideoData,
    _require_optimizer_options,
    _warn_unused_video,
)
from nnx_ppo.algorithms.metrics import (
    to_host,
)
from nnx_ppo.algorithms.recording import _unstacked
from nnx_ppo.algorithms.types import (
    EnvState,
    LoggingLevel,
    RLEnv,
    TrainingState,
)
from nnx_ppo.contract.arguments import is_int, require_callable, require_int
from nnx_ppo.contract.checking import (
    format_graph_path,
    require_float_parameters,
    require_hashable_settings,
    require_no_hijax,
)
from nnx_ppo.contract.env_checks import require_env
from nnx_ppo.networks.sampling_layers import ActionSampler
from nnx_ppo.networks.types import (
    ModuleState,
    StatefulModule,
)


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
    rate = optax.scale_by_learning_rate(learning_rate[1])
    return _adam_with_rate(rate, gradient_clipping[1], weight_decay[1])


def _adam_with_rate(
    rate: optax.GradientTransformation,
    gradient_clipping: float | None,
    weight_decay: float | bool | None,
) -> optax.GradientTransformation:
    """The default optimizer, Adam(W) after optional clipping, with its step applied by ``rate``.

    Laid out as ``optax.adam``/``optax.adamw`` are (``scale_by_adam``, decayed
    weights, then the rate), so with ``rate = optax.scale_by_learning_rate(lr)``
    its state has their structure; the many-runs trainer passes a rate held in
    the optimizer state instead, one per run.
    """
    inner = [optax.scale_by_adam()]
    if weight_decay is True:
        inner.append(optax.add_decayed_weights(_ADAMW_DEFAULT_DECAY))
    elif weight_decay is not None and weight_decay is not False:
        inner.append(optax.add_decayed_weights(weight_decay))
    inner.append(rate)
    clipping = [] if gradient_clipping is None else [optax.clip_by_global_norm(gradient_clipping)]
    return optax.chain(*clipping, optax.chain(*inner))


_ADAMW_DEFAULT_DECAY = 1e-4
"""``optax.adamw``'s default ``weight_decay``: what ``weight_decay=True`` asks for."""


def _require_seed(seed: Any, owner: str = "new_training_state") -> None:
    """A seed is an ``int`` (Python or NumPy) or an integer scalar array."""
    if isinstance(seed, jax.Array | np.ndarray):
        if seed.shape != () or not jnp.issubdtype(seed.dtype, jnp.integer):
            raise TypeError(
                f"{owner}: seed must be an int or an integer scalar array, got an "
                f"array of shape {seed.shape} and dtype {seed.dtype}"
            )
        return
    # Any int seeds a key (TrainConfig.seed may be negative).
    require_int(owner, "seed", seed, minimum=None)


def _seed_argument(seed: int | Integer[Array, ""]) -> Integer[Array | np.ndarray, ""]:
    """The seed as the start program takes it: an array, so every seed shares one program.

    ``jax.random.key`` of a Python int keeps its low 32 bits (its high word is 0),
    as ``key`` of this ``uint32`` does; an integer array is passed as it is.
    """
    if isinstance(seed, jax.Array | np.ndarray):
        return seed
    return np.asarray(int(seed) % 2**32, np.uint32)


class _Start(NamedTuple):
    """What the start program makes of a network and a seed."""

    network_states: ModuleState
    env_key: PRNGKeyArray
    rng_key: PRNGKeyArray


@training_jit(0, 1)
def _compiled_start(
    graphdef: nnx.GraphDef[StatefulModule],
    n_envs: int,
    network_state: nnx.State,
    seed: Integer[Array | np.ndarray, ""],
) -> _Start:
    """A fresh run's keys and carries: one program per network and ``n_envs``.

    Op by op, the key split, carry draw and rekeying were about ten programs,
    0.2 s of compiling at start-up on CPU.
    """
    networks = nnx.merge(graphdef, network_state)
    env_key, training_key, carry_key = jax.random.split(jax.random.key(seed), 3)
    carries = rollout._seeded_initialize_state(networks, n_envs, carry_key)
    return _Start(carries, env_key, training_key)


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
    carry** (samplers' and bottlenecks' noise). ``networks.initialize_state``
    draws from keys the seed gives in place of the module's own ``nnx.Rngs`` keys,
    and the carry's keys are drawn from the seed, so two seeds give different
    action noise (and different values derived from keys in ``initialize_state``)
    from one network, and one seed gives the same run each time. The ``nnx.Rngs``
    still decides the initial parameters.

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
      TypeError: ``networks`` is not a ``StatefulModule``, ``seed`` is not an
        integer (a Python ``int`` or an integer scalar array), or an optimizer
        setting is no number (as :class:`~nnx_ppo.algorithms.config.PPOConfig` checks
        them).
      ValueError: ``n_envs`` is not a positive int, or an optimizer setting is out of
        range (a negative learning rate or weight decay, a clipping norm <= 0).
    """
    return _new_training_state(
        env,
        networks,
        n_envs,
        seed,
        learning_rate,
        gradient_clipping,
        weight_decay,
        optimizer=optimizer,
    )


def _require_sampling(networks: StatefulModule) -> None:
    """Refuse an action sampler left in eval mode: training's rollouts would take its
    mode action at every step, never exploring, and learn from actions the policy
    never drew."""
    for path, node in nnx.iter_graph(networks):
        if isinstance(node, ActionSampler) and node.deterministic:
            raise ValueError(
                f"new_training_state: {type(networks).__name__}"
                f"{format_graph_path(networks, tuple(path))} is a {type(node).__name__} in "
                "eval mode (deterministic=True, as networks.eval() sets it): training would "
                "act on its mode action and never explore. Call networks.train() before "
                "training; evaluations put the network in eval mode themselves."
            )


def _new_training_state(
    env: RLEnv,
    networks: StatefulModule,
    n_envs: int,
    seed: int | Integer[Array, ""],
    learning_rate: float | optax.Schedule,
    gradient_clipping: float | None,
    weight_decay: float | bool | None,
    *,
    optimizer: optax.GradientTransformation | None,
    while_start_compiles: Callable[[TrainingState], None] | None = None,
    explores: bool = True,
) -> TrainingState:
    """:func:`new_training_state`, running ``while_start_compiles`` while the start compiles.

    ``explores=False`` lets the network's samplers be in eval mode: distillation's
    student acts in either mode, where PPO's rollouts must sample.

    ``while_start_compiles`` gets the state with abstract env states, carries,
    key and optimizer (``jax.ShapeDtypeStruct`` leaves, placed as the real ones
    will be), to compile a program that takes it. A second thread meanwhile
    compiles and runs the start program and the reset (seconds to compile for a
    simulator) and makes the optimizer's state: compiling releases the GIL, so
    the two overlap on a second core.
    """
    if not is_int(n_envs) or n_envs <= 0:
        raise ValueError(f"new_training_state: n_envs must be a positive int, got {n_envs!r}")
    n_envs = int(n_envs)
    require_env("new_training_state", env)
    if not isinstance(networks, StatefulModule):
        raise TypeError(
            "new_training_state: networks must be a StatefulModule (the PPO network), "
            f"got a {type(networks).__name__}"
        )
    _require_seed(seed)
    require_float_parameters("new_training_state", networks)
    require_hashable_settings("new_training_state", networks)
    if explores:
        _require_sampling(networks)
    require_no_hijax("new_training_state", networks)
    # What an eager call sowed (nnx.Intermediate) is no training state: the step's
    # programs keep none, so their state in and out must hold none either.
    nnx.pop(networks, nnx.Intermediate)
    if optimizer is None:
        learning_rate, gradient_clipping, weight_decay = _require_optimizer_options(
            "new_training_state", learning_rate, gradient_clipping, weight_decay
        )
        optimizer = _default_optimizer(learning_rate, gradient_clipping, weight_decay)
    graphdef, network_state = nnx.split(networks)
    static = (graphdef, n_envs)
    dynamic = (network_state, _seed_argument(seed))

    def new_optimizer() -> nnx.Optimizer:
        return nnx.Optimizer(networks, optimizer, wrt=nnx.Param)

    def start(
        program: Callable[..., _Start], reset: Callable[..., EnvState]
    ) -> tuple[_Start, EnvState, nnx.Optimizer]:
        started = program(*dynamic)
        # Optax's state is made op by op: a program per optimizer would compile again
        # for each run of a learning-rate sweep, where the eager ops compile once.
        return started, reset(started.env_key), new_optimizer()

    if while_start_compiles is None:
        started, env_states, optimizer_module = start(
            functools.partial(_compiled_start, *static),
            lambda key: _compiled_reset(_EnvArgument(env), key, n_envs),
        )
    else:
        start_program = _compiled_start.lower(*static, *dynamic)
        # The outputs are committed to a device if an input is, as JAX places them.
        committed = [
            leaf.sharding
            for leaf in jax.tree.leaves(dynamic)
            if isinstance(leaf, jax.Array) and leaf.committed
        ]
        placement = committed[0] if committed else None
        begun = _abstract(start_program.out_info, placement)
        reset_program = _compiled_reset.lower(_EnvArgument(env), begun.env_key, n_envs)
        abstract_env_states = _abstract(reset_program.out_info, placement)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            starting = pool.submit(lambda: start(start_program.compile(), reset_program.compile()))
            while_start_compiles(
                TrainingState(
                    networks=networks,
                    network_states=begun.network_states,
                    env_states=abstract_env_states,
                    optimizer=nnx.eval_shape(new_optimizer),
                    rng_key=begun.rng_key,
                    steps_taken=0,
                    running_episodes=_no_running_episodes(abstract_env_states),
                )
            )
            started, env_states, optimizer_module = starting.result()
    env_states = _on_device(env_states)
    return TrainingState(
        networks=networks,
        network_states=_on_device(started.network_states),
        env_states=env_states,
        optimizer=optimizer_module,
        rng_key=started.rng_key,
        steps_taken=0,
        running_episodes=_on_device(_no_running_episodes(env_states)),
    )


def default_config() -> TrainConfig:
    """The default :class:`~nnx_ppo.algorithms.config.TrainConfig`."""
    return TrainConfig()


@training_jit(0, 1, 3, 4, 6, 7)
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


@training_jit(0, 1, 3)
def _compiled_recording(
    env: _EnvArgument,
    graphdef: nnx.GraphDef[Any],
    state: nnx.State,
    episode_length: int,
    key: PRNGKeyArray,
) -> tuple[EnvState, Float[Array, ""]]:
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
    clock: ProgramClock | None,
    mesh: sharding.Mesh | None,
) -> dict[str, float]:
    """One evaluation with the deterministic policy (``networks.eval()``), over ``mesh``;
    timed (``throughput/eval_sps``) where there is a ``clock``."""
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
    if clock is not None:
        end = time.perf_counter()
        elapsed = end - clock.idle_from(start)
        metrics["throughput/eval_sps"] = config.n_envs * config.max_episode_length / elapsed
    return metrics


def _render_of(env: RLEnv, where: str) -> Callable[..., Any]:
    """The eval env's ``render``, which a video needs; ``where`` names the trainer."""
    render = getattr(env, "render", None)
    if render is None:
        raise TypeError(
            f"{where}: video needs an eval env with render(); {type(env).__name__} has none"
        )
    return render


def _stop_asked(answer: object) -> bool:
    """``should_stop``'s answer, which must be a bool: ``"no"`` is truthy."""
    if not isinstance(answer, bool | np.bool_):
        raise TypeError(
            f"train_ppo: should_stop must return a bool, got {type(answer).__name__} {answer!r}"
        )
    return bool(answer)


def _require_env_and_callbacks(
    owner: str, env: object, eval_env: object, **callbacks: tuple[object, tuple[str, ...]]
) -> None:
    """The envs are environments and each callback a function or None that takes the
    arguments named beside it, before anything compiles (a callback that is not would
    fail only once step 0 had run)."""
    require_env(owner, env)
    if eval_env is not None:
        require_env(owner, eval_env, name="eval_env")
    for name, (callback, arguments) in callbacks.items():
        require_callable(owner, name, callback, arguments)


def _check_video(owner: str, video: VideoConfig, video_fn: object, eval_env: RLEnv) -> None:
    """Warn when only one of ``video.enabled`` and ``video_fn`` asks for videos; where
    both do, refuse an eval env without ``render`` before anything compiles."""
    _warn_unused_video(owner, video, video_fn, stacklevel=4)
    if video.enabled and video_fn is not None:
        _render_of(eval_env, owner)


def _record(
    env: RLEnv,
    networks: StatefulModule,
    config: VideoConfig,
    seed: int,
    steps: int,
    where: str,
) -> VideoData:
    """A deterministic episode (``networks.eval()``) recorded with ``env.render``."""
    render = _render_of(env, where)
    with _eval_mode(networks):
        graphdef, state = nnx.split(networks)
        length = config.episode_length
        states, episode_reward = jax.device_get(
            _compiled_recording(_EnvArgument(env), graphdef, state, length, _key_at(seed, steps))
        )
    frames = _checked_frames(
        render(_unstacked(states, length + 1), **config.render_kwargs),
        length + 1,
        f"{where}: {type(env).__name__}.render",
    )
    return VideoData(frames, steps, float(episode_reward), length)


def _checked_frames(
    frames: Any, count: int, who: str
) -> UInt8[np.ndarray, "frames height width channels"]:
    """``render``'s frames stacked: ``count`` ``uint8`` ``(H, W, C)`` arrays of one shape,
    given as a sequence or as one array (NumPy's, JAX's) of frames along its first axis."""
    if hasattr(frames, "__array__") and np.ndim(frames) > 0:
        if np.ndim(frames) != 4:
            raise ValueError(
                f"{who} returned one array of shape {tuple(np.shape(frames))}; frames given "
                "as one array are (frames, height, width, channels)"
            )
        frames = list(np.asarray(frames))
    if not isinstance(frames, Sequence) or isinstance(frames, str):
        raise TypeError(
            f"{who} must return a sequence of frames (a list, or an array of frames along "
            f"its first axis), got {type(frames).__name__}"
        )
    if len(frames) != count:
        raise ValueError(
            f"{who} returned {len(frames)} frames for the {count} states of a "
            f"{count - 1}-step recording; it must return one per state"
        )
    shapes = {np.shape(frame) for frame in frames}
    dtypes = {np.asarray(frame).dtype for frame in frames}
    if len(shapes) > 1 or any(len(shape) != 3 for shape in shapes):
        raise ValueError(
            f"{who} must return frames of one (height, width, channels) shape; got "
            f"shapes {sorted(shapes)}"
        )
    if dtypes - {np.dtype(np.uint8)}:
        raise TypeError(
            f"{who} must return uint8 frames (0-255); got {', '.join(map(str, dtypes))}"
        )
    return np.stack(frames)


def _steps_until_host_needed(
    steps: int, config: TrainConfig, checkpointing: bool, recording: bool
) -> int:
    """How many PPO steps may run in one call from ``steps``: up to ``iterations_per_call``,
    ending at the first step where an evaluation, video or checkpoint falls due, or
    training ends.

    Only what will happen counts: a checkpoint cadence without a ``checkpoint_fn``,
    or a video cadence without a ``video_fn``, does not end a call.
    """
    per_step = config.ppo.steps_per_iteration
    limit = min(config.ppo.iterations_per_call, -(-(config.ppo.total_steps - steps) // per_step))
    every = [config.checkpoint_every_steps] if checkpointing else []
    every += [config.eval.every_steps] if config.eval.enabled else []
    every += [config.video.every_steps] if config.video.enabled and recording else []
    for cadence in filter(None, every):  # a cadence of 0 is due at the start only
        next_due = (steps // cadence + 1) * cadence
        limit = min(limit, -(-(next_due - steps) // per_step))
    return max(limit, 1)


def _crossed(previous: int | None, steps: int, every: int) -> bool:
    """Whether ``steps`` passed a multiple of ``every`` since ``previous``: always at the
    start, and only there when ``every`` is 0."""
    return previous is None or (every > 0 and steps // every > previous // every)


def _done_last_at(steps_taken: int) -> dict[str, int | None]:
    """The step the evaluation, the video and the checkpoint were last done at, for a run
    starting at ``steps_taken``: a resumed run did all three at the step it resumes from."""
    resumed_at = steps_taken if steps_taken > 0 else None
    return {"eval": resumed_at, "video": resumed_at, "checkpoint": resumed_at}


class _RunConfig(Protocol):
    """What ``train_ppo``'s and ``train_distillation``'s configs share."""

    eval: EvalConfig
    video: VideoConfig
    seed: int
    checkpoint_every_steps: int

    def validate(self) -> None: ...


_Config = TypeVar("_Config", bound=_RunConfig)


def _history_entry(steps: int, metrics: dict[str, float], run: str = "") -> dict[str, float]:
    """An ``eval_history`` entry: the evaluation at ``steps``, with ``episode_reward_mean``
    naming ``eval/episode_reward/mean`` (the key nnx-ppo 0.3.0's README read); a mean
    that is not finite is warned of (training never reads the eval env's rewards), the
    warning led by ``run``, which names one of several runs."""
    mean = metrics["eval/episode_reward/mean"]
    if not np.isfinite(mean):
        warnings.warn(
            f"{run}the evaluation at step {steps:,} has a mean episode reward of {mean}: the "
            "eval env returned a NaN or infinite reward (the training env's rewards are "
            "checked by the training step; the eval env's reach only this history)",
            RuntimeWarning,
            stacklevel=2,
        )
    return {"step": steps, **metrics, "episode_reward_mean": mean}


class _Steps(Protocol):
    """A training state, which counts its env steps."""

    @property
    def steps_taken(self) -> int: ...


_State = TypeVar("_State", bound=_Steps)


class _HostWork(Generic[_State]):
    """What a run does on the host between its compiled steps, when due: evaluate (keeping
    the ``history``), record a video, checkpoint.

    Each is done at the start and whenever the step count passes a multiple of its
    ``every_steps``; a run resumed past step 0 did all three at the step it resumes from.
    """

    def __init__(
        self,
        where: str,
        config: _RunConfig,
        eval_env: RLEnv,
        steps_taken: int,
        clock: ProgramClock | None,
        mesh: sharding.Mesh | None,
        video_fn: Callable[[VideoData], None] | None,
        checkpoint_fn: Callable[[_State, int], None] | None,
    ) -> None:
        self._where = where
        self._config = config
        self._eval_env = eval_env
        self._clock = clock
        self._mesh = mesh
        self._video_fn = video_fn
        # A checkpoint cadence of 0 turns checkpoints off, at the start and end too.
        self._checkpoint_fn = checkpoint_fn if config.checkpoint_every_steps else None
        self._last = _done_last_at(steps_taken)
        self.history: list[dict[str, float]] = []

    def start(
        self,
        state: _State,
        networks: StatefulModule,
        log_fn: Callable[[dict[str, float], int], None] | None,
    ) -> dict[str, float]:
        """The start's evaluation (logged, with ``total_steps``), video and checkpoint."""
        steps = state.steps_taken
        metrics = self.evaluate_and_record(networks, steps)
        if log_fn is not None and metrics:
            log_fn(metrics | {"total_steps": float(steps)}, steps)
        self.checkpoint(state, ends=False)
        return metrics

    def evaluate_and_record(self, networks: StatefulModule, steps: int) -> dict[str, float]:
        """The evaluation's metrics where one is due at ``steps`` (else none); a video if due."""
        config, last, metrics = self._config, self._last, {}
        if config.eval.enabled and _crossed(last["eval"], steps, config.eval.every_steps):
            key = _key_at(config.seed, steps)
            metrics = _evaluate(self._eval_env, networks, config.eval, key, self._clock, self._mesh)
            self.history.append(_history_entry(steps, metrics))
            last["eval"] = steps
        video_due = _crossed(last["video"], steps, config.video.every_steps)
        if config.video.enabled and self._video_fn is not None and video_due:
            start = time.perf_counter()
            video = _record(self._eval_env, networks, config.video, config.seed, steps, self._where)
            self._video_fn(video)
            if self._clock is not None:  # as 0.3.0: the steps over recording and video_fn
                end = time.perf_counter()
                elapsed = end - self._clock.idle_from(start)
                metrics["throughput/video_sps"] = config.video.episode_length / elapsed
            last["video"] = steps
        return metrics

    def checkpoint(self, state: _State, ends: bool) -> None:
        """Checkpoint ``state`` where one is due or the run ``ends``, once per step."""
        steps, last = state.steps_taken, self._last
        due = ends or _crossed(last["checkpoint"], steps, self._config.checkpoint_every_steps)
        if self._checkpoint_fn is not None and due and last["checkpoint"] != steps:
            self._checkpoint_fn(state, steps)
            last["checkpoint"] = steps


class _Watched(NamedTuple):
    """A dispatched call, and its clock's watch where one times it."""

    call: InFlight
    watch: WatchedCall | None


def _with_overrides(
    where: str,
    kind: type[_Config],
    algorithm: str,
    config: _Config | None,
    total_steps: int | None,
    **fields: Any,
) -> _Config:
    """A copy of ``config`` (``kind()`` when ``None``), validated, with a call's overrides:
    ``total_steps`` of its ``algorithm`` config, and each of ``fields`` not ``None``."""
    if config is not None and not isinstance(config, kind):
        inner = type(getattr(kind(), algorithm)).__name__
        raise TypeError(
            f"{where}: config must be a {kind.__name__}, got a {type(config).__name__}; "
            f"wrap a {inner} as {kind.__name__}({algorithm}=...)"
        )
    config = copy.deepcopy(config) if config is not None else kind()
    if total_steps is not None:
        getattr(config, algorithm).total_steps = total_steps
    for name, value in fields.items():
        if value is not None:
            setattr(config, name, value)
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
      video_fn: receives a :class:`~nnx_ppo.algorithms.config.VideoData` per recording.
      checkpoint_fn: called as ``checkpoint_fn(training_state, step)`` at step 0,
        every ``config.checkpoint_every_steps`` and at the last step (never when that
        is 0), after that step's ``log_fn``.
      eval_env: the evaluation environment; ``env`` when ``None``.
      initial_state: resume from this state (its optimizer included: the config's
        learning rate, clipping and decay then go unused) instead of a fresh one.
        It trains its own ``initial_state.networks``, so ``networks`` must be
        that same object.
      should_stop: polled after every compiled call (every PPO step with
        ``iterations_per_call=1``); when it returns ``True`` (a bool; e.g. a
        signal handler saw Ctrl-C), training stops early and ``checkpoint_fn``, if
        given and checkpoints are on, writes a final checkpoint of the state reached.

    Returns:
      A :class:`~nnx_ppo.algorithms.config.TrainResult`; ``eval_history`` holds
      ``{"step": s, **eval_metrics}`` per evaluation, with ``episode_reward_mean``
      naming ``eval/episode_reward/mean``.

    Raises:
      TypeError: ``config`` is not a :class:`~nnx_ppo.algorithms.config.TrainConfig`,
        ``initial_state`` not a :class:`~nnx_ppo.algorithms.types.TrainingState`, or
        video is asked of an eval env without ``render`` (these before anything
        compiles); ``render`` returned frames that are not ``uint8``, or
        ``should_stop`` something other than a bool.
      ValueError: ``networks`` is not ``initial_state.networks``, or ``n_envs``
        (training or evaluation) does not split evenly over the devices, raised
        before anything compiles; or ``render`` returned frames of several shapes,
        not ``(H, W, C)``, or not one per recorded state.
      FloatingPointError: the loss or a parameter became NaN or infinite.
    """
    config = _with_overrides(
        "train_ppo", TrainConfig, "ppo", config, total_steps, seed=seed, devices=devices
    )
    _require_env_and_callbacks(
        "train_ppo",
        env,
        eval_env,
        log_fn=(log_fn, ("metrics", "step")),
        video_fn=(video_fn, ("video",)),
        checkpoint_fn=(checkpoint_fn, ("training_state", "step")),
        should_stop=(should_stop, ()),
    )
    _require_checkpointing("train_ppo", checkpoint_fn, "TrainingState")
    warn_if_mappings_near_cap("train_ppo")
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
    _check_video("train_ppo", config.video, video_fn, eval_env)
    if initial_state is None:
        first_call = _steps_until_host_needed(
            0, config, checkpoint_fn is not None, video_fn is not None
        )

        def compile_first_call(abstract: TrainingState) -> None:
            _compile_ahead(env, abstract, config.ppo, first_call)

        single_device = mesh is None and config.ppo.total_steps > 0
        state = _new_training_state(
            env,
            networks,
            config.ppo.n_envs,
            config.seed,
            config.ppo.optimizer_learning_rate(),
            config.ppo.gradient_clipping,
            config.ppo.weight_decay,
            optimizer=None,
            while_start_compiles=compile_first_call if single_device else None,
        )
    else:
        state = initial_state
    if mesh is not None:
        # Before the state is split: a state of another env count is no layout problem.
        require_env_count("train_ppo", state, config.ppo)
        state = sharding.shard_training_state(state, mesh)
    clock = ProgramClock() if LoggingLevel.THROUGHPUT in config.ppo.logging_level else None
    host = _HostWork(
        "train_ppo", config, eval_env, state.steps_taken, clock, mesh, video_fn, checkpoint_fn
    )
    metrics = host.start(state, state.networks, log_fn)

    def steps_in_call(steps: int) -> int:
        return _steps_until_host_needed(
            steps, config, checkpoint_fn is not None, video_fn is not None
        )

    def watched(call: InFlight) -> _Watched:
        return _Watched(
            call, None if clock is None else clock.watch(call.reports, call.dispatched_at)
        )

    iterations = 0
    # The next call's steps are dispatched before this call's results are fetched, so
    # the device never waits for the host's logging, evaluation or checkpointing. They
    # start from this call's results on the device and are dropped unseen if this call
    # diverged or the run stops. Over several CPU devices each call finishes first.
    ahead = sharding._programs_may_overlap(mesh)
    in_flight: _Watched | None = None
    while state.steps_taken < config.ppo.total_steps:
        if in_flight is None:
            in_flight = watched(
                dispatch_steps(
                    "train_ppo", env, state, config.ppo, steps_in_call(state.steps_taken)
                )
            )
        current, in_flight = in_flight, None
        if ahead and current.call.steps_after < config.ppo.total_steps:
            next_call = dispatch_next(env, current.call, steps_in_call(current.call.steps_after))
            in_flight = watched(next_call)
        state, per_step = finish(current.call)
        fused = current.call.iterations
        iterations += fused
        if clock is not None and current.watch is not None:
            rate = fused * config.ppo.steps_per_iteration / clock.seconds(current.watch)
            for metrics in per_step:
                metrics["throughput/train_sps"] = rate
        *earlier, metrics = per_step
        metrics |= host.evaluate_and_record(state.networks, state.steps_taken)
        if log_fn is not None:
            for logged in earlier:
                log_fn(logged, int(logged["total_steps"]))
            log_fn(metrics, state.steps_taken)
        stopping = should_stop is not None and _stop_asked(should_stop())
        finished = state.steps_taken >= config.ppo.total_steps
        host.checkpoint(state, ends=stopping or finished)
        if stopping:
            break
    return TrainResult(state, metrics, host.history, state.steps_taken, iterations)
