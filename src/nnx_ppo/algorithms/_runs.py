"""Many training runs in one compiled program: seeds, and a learning rate per run.

A seed sweep of a small configuration spends most of its time in per-step
overhead, not arithmetic; :func:`train_ppo_runs` trains ``N`` runs of one
configuration as one program, ``jax.vmap`` over a leading run axis of the
networks, optimizers, env states and carries, so every PPO step of every run
happens in one call. Each run keeps its own seed (parameters, env resets,
action noise), may have its own learning rate, and gets its own metrics,
evaluations and checkpoints; the results equal those of training the runs one
after another with :func:`~nnx_ppo.algorithms.ppo.train_ppo`, up to float
rounding. With several devices, each trains its own share of the runs
(:func:`~nnx_ppo.algorithms.sharding.runs_mesh`).

Example::

    results = train_ppo_runs(
        make("cartpole"),
        lambda seed: make_default_network(make("cartpole"), nnx.Rngs(seed)),
        config,
        seeds=[0, 1, 2, 3],
        learning_rates=[1e-3, 1e-3, 3e-4, 3e-4],
        log_fn=lambda run, metrics, step: print(run, step, metrics.get("eval/episode_reward/mean")),
    )
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Integer, Real

from nnx_ppo._compile import warn_if_mappings_near_cap
from nnx_ppo.algorithms import _step, sharding
from nnx_ppo.algorithms._timing import ProgramClock
from nnx_ppo.algorithms._train import (
    _adam_with_rate,
    _crossed,
    _default_optimizer,
    _evaluate,
    _history_entry,
    _key_at,
    _new_training_state,
    _require_env_and_callbacks,
    _steps_until_host_needed,
    _with_overrides,
)
from nnx_ppo.algorithms.config import PPOConfig, TrainConfig, TrainResult, _linear_decay
from nnx_ppo.algorithms.metrics import _key_name
from nnx_ppo.algorithms.rollout import Tree
from nnx_ppo.algorithms.types import LoggingLevel, RLEnv, TrainingState
from nnx_ppo.contract.arguments import require_int, require_number
from nnx_ppo.contract.axes import AnyArray
from nnx_ppo.contract.checking import is_key, key_data_or_leaf
from nnx_ppo.networks.types import StatefulModule

__all__ = ["train_ppo_runs"]


def _run_optimizer(config: PPOConfig, learning_rate: float) -> optax.GradientTransformation:
    """The default optimizer with the learning rate in its state, where each run may differ.

    The final scale by ``-learning_rate`` is an injected hyperparameter (one
    array per run); a linear schedule multiplies it by the same decay in every run.
    """
    decay = (
        [optax.scale_by_schedule(_linear_decay(1.0, config.total_updates))]
        if config.learning_rate_schedule == "linear"
        else []
    )
    rate = optax.chain(*decay, optax.inject_hyperparams(optax.scale)(step_size=-learning_rate))
    return _adam_with_rate(rate, config.gradient_clipping, config.weight_decay)


def _as_single_run(state: TrainingState, config: PPOConfig, learning_rate: float) -> TrainingState:
    """``state`` with its optimizer as :func:`train_ppo` builds it at ``learning_rate``.

    A run of :func:`_run_optimizer` holds its learning rate in its optimizer state;
    the state a checkpoint stores is the one a single run at that rate would hold,
    so that it loads into ``new_training_state(..., learning_rate, ...)``. Both
    optimizers are :func:`_adam_with_rate`'s chains, which differ in their last
    transformation alone: the rate.
    """
    single = nnx.Optimizer(
        state.networks,
        _default_optimizer(
            dataclasses.replace(config, learning_rate=learning_rate).optimizer_learning_rate(),
            config.gradient_clipping,
            config.weight_decay,
        ),
        wrt=nnx.Param,
    )
    runs = state.optimizer

    def copy(source: Any, target: Any) -> None:
        def variables(tree: Any) -> list[nnx.Variable[Any]]:
            return jax.tree.leaves(tree, is_leaf=lambda leaf: isinstance(leaf, nnx.Variable))

        for value, variable in zip(variables(source), variables(target), strict=True):
            variable[...] = value[...]

    *clipping, inner = runs.opt_state
    *single_clipping, single_inner = single.opt_state
    copy(runs.step, single.step)
    copy((*clipping, *inner[:-1]), (*single_clipping, *single_inner[:-1]))
    if config.learning_rate_schedule == "linear":  # the rate: (decay, injected scale)
        copy(inner[-1][0], single_inner[-1])
    return state.replace(optimizer=single)


def _require_runs(
    seeds: Sequence[int] | Integer[AnyArray, " runs"] | None,
    learning_rates: Sequence[float] | Real[AnyArray, " runs"] | None,
    config: TrainConfig,
) -> tuple[list[int], list[float] | None]:
    if seeds is None and learning_rates is None:
        raise ValueError("train_ppo_runs: give seeds, learning_rates or both (one entry per run)")
    if learning_rates is not None:
        learning_rates = [
            require_number("train_ppo_runs", f"learning_rates[{i}]", rate, minimum=0.0, strict=True)
            for i, rate in enumerate(_per_run("learning_rates", learning_rates))
        ]
        if callable(config.ppo.learning_rate):
            raise ValueError(
                "train_ppo_runs: learning_rates replace config.ppo.learning_rate, which is an "
                "optax schedule; give a number there and learning_rate_schedule='linear' for "
                "a decay"
            )
    if seeds is None:
        assert learning_rates is not None
        seeds = [config.seed] * len(learning_rates)
    # The int64 range new_training_state takes; NumPy integers become ints, as
    # make_networks (nnx.Rngs) needs.
    seeds = [
        require_int("train_ppo_runs", f"seeds[{i}]", seed, minimum=-(2**63), maximum=2**63 - 1)
        for i, seed in enumerate(_per_run("seeds", seeds))
    ]
    if learning_rates is not None and len(learning_rates) != len(seeds):
        raise ValueError(
            f"train_ppo_runs: {len(seeds)} seeds but {len(learning_rates)} learning_rates; "
            "give one of each per run"
        )
    return seeds, learning_rates


def _per_run(name: str, values: Any) -> list[Any]:
    """``values`` as a list with one entry per run; anything else is a named error."""
    if isinstance(values, np.ndarray | jax.Array):
        if values.ndim != 1:
            raise TypeError(
                f"train_ppo_runs: {name} must be a sequence with one entry per run, got a "
                f"{values.ndim}-d {type(values).__name__} of shape {values.shape}; give a "
                "1-d array or a list"
            )
        # A jax.Array's entries are 0-d arrays, which the entry checks refuse as
        # numbers; NumPy's are NumPy scalars, which they take. Keys stay keys, named below.
        values = values if is_key(values) else np.asarray(values)
    elif isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(
            f"train_ppo_runs: {name} must be a sequence with one entry per run, got "
            f"{type(values).__name__} {values!r}"
        )
    if len(values) == 0:
        raise ValueError(f"train_ppo_runs: {name} is empty; give one entry per run")
    # A list of a jax.Array's entries (list(jnp.arange(3))): 0-d arrays, taken as the
    # NumPy scalars a 1-d array's entries become above.
    return [
        np.asarray(value)[()]
        if isinstance(value, jax.Array) and value.ndim == 0 and not is_key(value)
        else value
        for value in values
    ]


@dataclasses.dataclass(frozen=True)
class _HostKeys:
    """PRNG keys copied to the host: their raw data and their implementation."""

    data: np.ndarray
    impl: Any

    def on_device(self, where: NamedSharding | None) -> jax.Array:
        return jax.random.wrap_key_data(jax.device_put(self.data, where), impl=self.impl)


@dataclasses.dataclass(frozen=True)
class _HostWeak:
    """A weakly typed array copied to the host (a Variable's Python number, as JAX holds
    it): back on a device it is weakly typed again, as :func:`train_ppo` passes it, so a
    ``bfloat16`` computation with it stays ``bfloat16`` where a ``float32`` array would
    promote it."""

    data: np.ndarray

    def on_device(self, where: NamedSharding | None) -> jax.Array:
        if self.data.shape == ():
            return jax.device_put(jnp.asarray(self.data.item()), where)
        # JAX makes no weakly typed array from data; an update keeps the type of the array
        # it writes into (a Python number's zeros: its dtype is the data's, held alike).
        zeros = jax.lax.full(self.data.shape, self.data.dtype.type(0).item())
        return jax.device_put(zeros.at[...].set(self.data), where)


_HostLeaf = _HostKeys | _HostWeak
"""A host copy whose NumPy data does not say its JAX type."""


def _to_host(tree: Any) -> Any:
    """NumPy copies of ``tree``'s leaves, fetched together; PRNG keys as :class:`_HostKeys`,
    weakly typed leaves as :class:`_HostWeak`."""

    def host(leaf: Any, copy: Any) -> np.ndarray | _HostLeaf:
        if is_key(leaf):
            return _HostKeys(np.asarray(copy), jax.random.key_impl(leaf))
        held = jax.typeof(leaf)
        if held.weak_type:  # a Python float's copy is a float64 array: hold it as JAX does
            return _HostWeak(np.asarray(copy, held.dtype))
        return np.asarray(copy)

    return jax.tree.map(host, tree, jax.device_get(jax.tree.map(key_data_or_leaf, tree)))


def _to_device(tree: Any, where: NamedSharding | None) -> Any:
    """A host tree of :func:`_to_host` placed ``where`` (``None``: the default device)."""

    def put(leaf: np.ndarray | _HostLeaf) -> jax.Array:
        if isinstance(leaf, _HostLeaf):
            return leaf.on_device(where)
        return jax.device_put(leaf, where)

    return jax.tree.map(put, tree)


def _require_own_variables(networks: Sequence[nnx.Module]) -> None:
    """Every run's network holds its own variables, or a ValueError naming two runs.

    Each run trains its own stacked copy; a variable two networks share would be
    written back once per run, and hold the last run's values in both.
    """
    owners: dict[int, tuple[int, str]] = {}
    for run, module in enumerate(networks):
        for path, node in nnx.iter_graph(module):
            if not isinstance(node, nnx.Variable):
                continue
            owner, where = owners.setdefault(id(node), (run, _path_name(path)))
            if owner == run:
                continue
            if networks[owner] is module:
                raise ValueError(
                    f"train_ppo_runs: make_networks returned one network object for runs "
                    f"{owner} and {run}; each run trains a network of its own"
                )
            build = (
                "make_networks reuses one nnx.Rngs, so the seed it is given is not used: "
                "build it inside, nnx.Rngs(seed)"
                if isinstance(node, nnx.RngState)
                else "build every layer inside make_networks"
            )
            raise ValueError(
                f"train_ppo_runs: the networks of runs {owner} and {run} share one variable "
                f"object ({where} in run {owner}'s, {_path_name(path)} in run {run}'s); each "
                f"run trains a network of its own: {build}"
            )


def _path_name(path: tuple[Any, ...]) -> str:
    return "/".join(map(str, path)) or "the network itself"


def _split_path_name(path: tuple[Any, ...]) -> str:
    """A leaf's path in the split ``(network, optimizer)`` state, as ``_path_name`` writes it."""
    names = [_key_name(key) for key in path]
    if names[-1] == "value":  # the Variable's own field
        names.pop()
    owner = "" if names[0] == "0" else "the optimizer's "
    return owner + _path_name(tuple(names[1:]))


def _static_attributes(module: nnx.Module) -> dict[str, Any]:
    """What a module's graph definition holds besides its arrays, by path: attributes
    that are not variables (sizes, activations, flags) and each variable's type."""
    attributes: dict[str, Any] = {}
    for path, node in nnx.iter_graph(module):
        if path and str(path[-1]).startswith("_pytree__"):
            continue  # NNX's own bookkeeping
        if isinstance(node, nnx.Variable):
            attributes[_path_name(path)] = type(node)
        elif not nnx.graph.is_node(node):  # modules, Rngs, lists: their contents are listed
            attributes[_path_name(path)] = node
    return attributes


def _same_static(a: Any, b: Any) -> bool:
    """Whether two static attributes are alike; a function built per run in make_networks
    is alike when its code and closure are (a lambda), or its function and arguments are
    (a ``functools.partial``, which compares by identity), and so are containers of them."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is not None and code_a is code_b:
        cells_a = [cell.cell_contents for cell in a.__closure__ or ()]
        cells_b = [cell.cell_contents for cell in b.__closure__ or ()]
        return len(cells_a) == len(cells_b) and all(map(_same_static, cells_a, cells_b))
    if isinstance(a, np.ndarray | jax.Array) and isinstance(b, np.ndarray | jax.Array):
        inexact = np.issubdtype(a.dtype, np.inexact)
        return (
            a.shape == b.shape
            and a.dtype == b.dtype
            and bool(np.array_equal(a, b, equal_nan=inexact))
        )
    if isinstance(a, functools.partial) and type(a) is type(b):
        return _same_static((a.func, a.args, a.keywords), (b.func, b.args, b.keywords))
    if isinstance(a, tuple | list) and type(a) is type(b):
        return len(a) == len(b) and all(map(_same_static, a, b))
    if isinstance(a, dict) and type(a) is type(b):
        return a.keys() == b.keys() and all(_same_static(a[key], b[key]) for key in a)
    try:
        return bool(a == b)
    except Exception:  # an attribute whose == is not a truth value (an array)
        return False


def _require_like_run_0(
    run: int, this: tuple[nnx.Module, nnx.State], first: tuple[nnx.Module, nnx.State]
) -> None:
    """Run ``run``'s network matches run 0's in everything but its arrays' values, or a
    ValueError naming the first difference.

    The runs share one program, traced from run 0's network: any other static
    attribute (a width, an activation, a sampler's ``entropy_weight``) would be run 0's
    in every run, and an array of another dtype would be cast to run 0's.
    """
    (networks, split), (first_networks, first_split) = this, first
    problem = None
    if nnx.graphdef(networks) != nnx.graphdef(first_networks):  # the optimizers' may differ
        mine, theirs = _static_attributes(networks), _static_attributes(first_networks)
        for path in sorted(mine.keys() | theirs.keys()):
            if path not in theirs:
                problem = f"it has {path}, which run 0's lacks"
            elif path not in mine:
                problem = f"it lacks {path}, which run 0's has"
            elif not _same_static(mine[path], theirs[path]):
                problem = f"{path} is {mine[path]!r} where run 0's is {theirs[path]!r}"
                if repr(mine[path]) == repr(theirs[path]):
                    problem = (
                        f"{path} is {mine[path]!r} in both, but another object in each run, "
                        "and the two do not compare equal: build it once, outside "
                        "make_networks, or give its class an __eq__"
                    )
            if problem is not None:
                break
    if problem is None:
        if jax.tree.structure(split) != jax.tree.structure(first_split):
            problem = "its variables differ"
        else:
            for (path, leaf), other in zip(
                jax.tree_util.tree_flatten_with_path(split)[0],
                jax.tree.leaves(first_split),
                strict=True,
            ):
                # As JAX holds them: a Variable's Python number is a weakly typed 0-d array.
                held, held_in_0 = _held(leaf), _held(other)
                if held != held_in_0:
                    problem = f"{_split_path_name(path)} is {held} where run 0's is {held_in_0}"
                    break
    if problem is not None:
        raise ValueError(
            f"train_ppo_runs: run {run}'s network differs from run 0's: {problem}. The runs "
            "share one program, built from run 0's network, so make_networks must build the "
            "same network for every seed, its parameters' values aside; sweep anything else "
            "(a layer's size, an entropy weight) with separate train_ppo calls"
        )


def _held(leaf: Any) -> str:
    """A leaf's type as the program holds it: ``float32[3]``, or ``float32[] (weakly
    typed: a Python number)``, in which the program computes in the dtype it meets."""
    value = jax.typeof(leaf)
    held = f"{value.dtype}{list(value.shape)}"
    return f"{held} (weakly typed: a Python number)" if value.weak_type else held


def _stack(trees: Sequence[Any], where: NamedSharding | None) -> Any:
    """The runs' trees stacked on a new leading axis, placed ``where``.

    Stacked on the host: a compiled stack of the small config's 8 runs took
    1.3 s to compile, an eager one 2.5 s (each leaf shape compiled on its own).
    """

    def stack(*leaves: Any) -> Any:
        if isinstance(leaves[0], _HostLeaf):
            return dataclasses.replace(leaves[0], data=np.stack([leaf.data for leaf in leaves]))
        return np.stack(leaves)

    return _to_device(jax.tree.map(stack, *(_to_host(tree) for tree in trees)), where)


def _unstack(tree: Tree, run: int) -> Tree:
    """Run ``run``'s slice of every leaf of a stacked host tree."""
    return jax.tree.map(
        lambda leaf: (
            dataclasses.replace(leaf, data=leaf.data[run])
            if isinstance(leaf, _HostLeaf)
            else leaf[run]
        ),
        tree,
    )


@dataclasses.dataclass(frozen=True)
class _SetAside:
    """A diverged run's last good step, on the host (``on_divergence="continue"``)."""

    split: Any
    carry: Any
    steps: int
    iterations: int
    error: str


def train_ppo_runs(
    env: RLEnv,
    make_networks: Callable[[int], StatefulModule],
    config: TrainConfig | None = None,
    *,
    seeds: Sequence[int] | Integer[AnyArray, " runs"] | None = None,
    learning_rates: Sequence[float] | Real[AnyArray, " runs"] | None = None,
    log_fn: Callable[[int, dict[str, float], int], None] | None = None,
    checkpoint_fn: Callable[[int, TrainingState, int], None] | None = None,
    eval_env: RLEnv | None = None,
    on_divergence: Literal["stop", "continue"] = "stop",
) -> list[TrainResult]:
    """Train one run per seed (and learning rate) of ``config``, all in one compiled program.

    The runs are split over ``config.devices`` devices (every device of this
    process by default, when there are several), each training its own runs.

    Args:
      env: one unbatched training environment, shared by the runs.
      make_networks: builds run ``i``'s network from its seed,
        ``make_networks(seeds[i])``; every run's network must have the same
        structure (the runs are stacked along a new leading axis).
      config: the configuration every run shares; :func:`train_ppo`'s default when ``None``.
      seeds: one seed per run (a sequence, or a 1-d NumPy or JAX array);
        ``config.seed`` for every run when only ``learning_rates`` is given.
      learning_rates: one learning rate per run (as ``seeds``), in place of
        ``config.ppo.learning_rate`` (``config.ppo.learning_rate_schedule``
        still applies to each).
      log_fn: called as ``log_fn(run, metrics, step)`` after every PPO step (and
        the initial evaluation) of every run, ``run`` its index. The runs' networks
        are brought up to date at each evaluation and checkpoint and when training
        ends or stops (also by an exception from a callback); in between, a
        ``log_fn`` that reads them sees the last of those.
      checkpoint_fn: called as ``checkpoint_fn(run, training_state, step)`` at step
        0, every ``config.checkpoint_every_steps`` and at the end (never when that
        is 0), after that step's ``log_fn``; ``training_state`` is run ``run``'s
        own, its optimizer state that of a single run at its learning rate, so it
        loads into
        ``new_training_state(..., learning_rate, ...)``.
      eval_env: the evaluation environment; ``env`` when ``None``.
      on_divergence: what a run whose loss, rewards or parameters become NaN or
        infinite does to the others. ``"stop"``: every run stops (the
        ``FloatingPointError`` below). ``"continue"``: that run is set aside at
        its last good step (where the compiled call in which it diverged started,
        see ``iterations_per_call``), with a ``RuntimeWarning`` and no more
        evaluations, logs or checkpoints, its result's ``diverged`` holding the
        error, while the others train on (a learning-rate sweep whose largest rate
        diverges). When every run has diverged, training ends there.

    Returns:
      One :class:`~nnx_ppo.algorithms.config.TrainResult` per run, in order; run
      ``i`` trained the network ``make_networks(seeds[i])`` returned, in place, and
      its training state holds the optimizer state of a single run at its rate, as
      its checkpoints do. A run set aside by ``on_divergence="continue"`` is at its
      last good step, and its ``total_steps`` and ``total_iterations`` count to there.

    Raises:
      TypeError: ``seeds`` or ``learning_rates`` neither a sequence nor a 1-d
        array, a seed that is not an integer or a learning rate that is not a
        finite number (named by its index), or a ``make_networks`` that returned
        no network (named with its seed and run).
      ValueError: no runs, lengths that differ, a learning rate that is not
        positive, an ``on_divergence`` other than ``"stop"`` or ``"continue"``,
        networks whose structures differ or one network object for two runs
        (named by run), or runs that do not split evenly over ``config.devices``.
      FloatingPointError: with ``on_divergence="stop"``, a run's loss, rewards or
        parameters became NaN or infinite, each such run of the call named; every
        run's network and optimizer are left at the last step before that call.
    """
    config = _with_overrides("train_ppo_runs", TrainConfig, "ppo", config, None)
    if isinstance(make_networks, nnx.Module):
        raise TypeError(
            f"train_ppo_runs: make_networks must build run i's network from its seed, "
            f"make_networks(seeds[i]); it is a network ({type(make_networks).__name__}). "
            "Pass a function, e.g. lambda seed: make_default_network(env, nnx.Rngs(seed))"
        )
    _require_env_and_callbacks(
        "train_ppo_runs",
        env,
        eval_env,
        make_networks=(make_networks, ("seed",)),
        log_fn=(log_fn, ("run", "metrics", "step")),
        checkpoint_fn=(checkpoint_fn, ("run", "training_state", "step")),
    )
    warn_if_mappings_near_cap("train_ppo_runs")
    if config.video.enabled:
        warnings.warn(
            "train_ppo_runs records no videos: config.video.enabled is ignored. Record a "
            "run's video with train_ppo, or from its checkpoint.",
            stacklevel=2,
        )
    seeds, rates = _require_runs(seeds, learning_rates, config)
    if jax.process_count() > 1:
        warnings.warn(
            f"train_ppo_runs splits its runs over this process's devices only: each of the "
            f"{jax.process_count()} processes trains all {len(seeds)} runs, and calls "
            "log_fn and checkpoint_fn for them. To split a sweep over hosts, give each "
            "process its own seeds.",
            RuntimeWarning,
            stacklevel=2,
        )
    if on_divergence not in ("stop", "continue"):
        raise ValueError(
            f'train_ppo_runs: on_divergence must be "stop" or "continue", got {on_divergence!r}'
        )
    if not config.checkpoint_every_steps:  # a cadence of 0 turns checkpoints off
        checkpoint_fn = None
    mesh = sharding.runs_mesh(config.devices, len(seeds))
    where = None if mesh is None else NamedSharding(mesh, PartitionSpec(sharding.RUNS_AXIS))
    ppo = config.ppo
    eval_env = env if eval_env is None else eval_env
    env_argument, config_argument = _step._EnvArgument(env), _step._ConfigArgument(ppo)
    first_call = _steps_until_host_needed(0, config, checkpoint_fn is not None, False)

    def compile_first_call(abstract: TrainingState) -> None:
        # From run 0's shapes, while its start and reset compile in a second thread.
        stacked_like_run_0 = functools.partial(
            _step._abstract, placement=where, leading=(len(seeds),)
        )
        graphdef, split = nnx.split((abstract.networks, abstract.optimizer))
        _step._compiled_run_steps.lower(
            env_argument,
            config_argument,
            _step._GraphArgument(graphdef),
            stacked_like_run_0(split, weak_types=True),  # as _stack keeps them
            stacked_like_run_0(_step._carry_of(abstract)),
            first_call,
            mesh,
        ).compile()

    states = []
    for run, seed in enumerate(seeds):
        networks = make_networks(seed)
        # Else new_training_state, which the caller never called, would name it.
        if not isinstance(networks, StatefulModule):
            raise TypeError(
                f"train_ppo_runs: make_networks({seed}) (run {run}) returned a "
                f"{type(networks).__name__}, not a StatefulModule (the PPO network); "
                "did it forget to return it?"
            )
        optimizer = None if rates is None else _run_optimizer(ppo, rates[run])
        state = _new_training_state(
            env,
            networks,
            ppo.n_envs,
            seed,
            ppo.optimizer_learning_rate(),
            ppo.gradient_clipping,
            ppo.weight_decay,
            optimizer=optimizer,
            while_start_compiles=compile_first_call if run == 0 and ppo.total_steps else None,
        )
        states.append(_step._prepared("train_ppo_runs", state, ppo))
    _require_own_variables([state.networks for state in states])
    graphdef, first = nnx.split((states[0].networks, states[0].optimizer))
    graph = _step._GraphArgument(graphdef)
    splits = [first]
    for run, state in enumerate(states[1:], start=1):
        _, split = nnx.split((state.networks, state.optimizer))
        _require_like_run_0(run, (state.networks, split), (states[0].networks, first))
        splits.append(split)
    stacked = _stack(splits, where)
    carries = _stack([_step._carry_of(state) for state in states], where)
    timed = LoggingLevel.THROUGHPUT in ppo.logging_level
    clock = ProgramClock() if timed else None
    histories: list[list[dict[str, float]]] = [[] for _ in seeds]
    last_metrics: list[dict[str, float]] = [{} for _ in seeds]
    last: dict[str, int | None] = {"eval": None, "checkpoint": None}
    steps_taken = iterations = 0
    set_aside: dict[int, _SetAside] = {}  # diverged runs, by index (on_divergence="continue")

    def current() -> list[TrainingState]:
        """Every run's training state, its network and optimizer brought up to date.

        A run set aside is at its last good step.
        """
        host_stacked, host_carries = _to_host((stacked, carries))
        advanced = []
        for run, state in enumerate(states):
            aside = set_aside.get(run)
            if aside is None:
                split, carry, steps = (
                    _unstack(host_stacked, run),
                    _unstack(host_carries, run),
                    steps_taken,
                )
            else:
                split, carry, steps = aside.split, aside.carry, aside.steps
            nnx.update((state.networks, state.optimizer), _to_device(split, None))
            advanced.append(_step._advanced(state, _to_device(carry, None), steps))
        return advanced

    def training() -> list[int]:
        return [run for run in range(len(seeds)) if run not in set_aside]

    def evaluate(states: list[TrainingState]) -> dict[int, dict[str, float]]:
        """Every training run's evaluation metrics, recorded in its history."""
        evaluations = {}
        for run in training():
            key = _key_at(seeds[run], steps_taken)
            metrics = _evaluate(eval_env, states[run].networks, config.eval, key, clock, None)
            named = f"run {run} (seed {seeds[run]}): "
            histories[run].append(_history_entry(steps_taken, metrics, named))
            evaluations[run] = metrics
        last["eval"] = steps_taken
        return evaluations

    def checkpoint(states: list[TrainingState]) -> None:
        """Every training run's checkpoint, as a single run at its rate would hold it."""
        assert checkpoint_fn is not None
        for run in training():
            state = states[run]
            checkpoint_fn(
                run, state if rates is None else _as_single_run(state, ppo, rates[run]), steps_taken
            )
        last["checkpoint"] = steps_taken

    def host_work(per_run: dict[int, list[dict[str, float]]], checkpoint_due: bool) -> None:
        """Evaluate, log every training run's steps, then checkpoint, as ``train_ppo`` does."""
        checkpointing = checkpoint_due and checkpoint_fn is not None
        eval_due = config.eval.enabled and _crossed(
            last["eval"], steps_taken, config.eval.every_steps
        )
        states = current() if eval_due or checkpointing else []
        evaluations = evaluate(states) if eval_due else {}
        for run in training():
            per_run[run][-1] |= evaluations.get(run, {})
            last_metrics[run] = per_run[run][-1]
            if log_fn is not None:
                for metrics in filter(None, per_run[run]):  # step 0 logs an evaluation only
                    logged = {"total_steps": float(steps_taken)} | metrics
                    log_fn(run, logged, int(logged["total_steps"]))
        if checkpointing:
            checkpoint(states)

    try:
        host_work({run: [{}] for run in training()}, checkpoint_due=True)  # the step-0 work
        while steps_taken < ppo.total_steps and training():
            fused = _steps_until_host_needed(steps_taken, config, checkpoint_fn is not None, False)
            dispatched_at = time.perf_counter()
            new_stacked, new_carries, reports = _step._compiled_run_steps(
                env_argument, config_argument, graph, stacked, carries, fused, mesh
            )
            watch = None if clock is None else clock.watch(reports, dispatched_at)
            reports = jax.device_get(reports)
            seconds = None if clock is None or watch is None else clock.seconds(watch)
            per_run, diverged = {}, {}
            for run in training():
                try:
                    per_run[run] = _step._host_metrics(
                        _step.StepReport(*_unstack(reports, run)), steps_taken, ppo, fused
                    )
                except FloatingPointError as error:
                    diverged[run] = f"run {run} (seed {seeds[run]}): {error}"
            if diverged and on_divergence == "stop":
                raise FloatingPointError("\n".join(diverged.values()))
            if diverged:
                # A run's slice of the stacked state keeps going, unread: a vmapped run's
                # NaNs reach no other run.
                host_stacked, host_carries = _to_host((stacked, carries))
                for run, error in diverged.items():
                    set_aside[run] = _SetAside(
                        _unstack(host_stacked, run),
                        _unstack(host_carries, run),
                        steps_taken,
                        iterations,
                        error,
                    )
                    warnings.warn(
                        f"{error} It is set aside at step {steps_taken:,}; the other runs go on.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            stacked, carries = new_stacked, new_carries
            steps_taken += fused * ppo.steps_per_iteration
            iterations += fused
            if seconds is not None:
                for metrics in (m for per_step in per_run.values() for m in per_step):
                    metrics["throughput/train_sps"] = fused * ppo.steps_per_iteration / seconds
            due = _crossed(last["checkpoint"], steps_taken, config.checkpoint_every_steps)
            host_work(per_run, checkpoint_due=due or steps_taken >= ppo.total_steps)
    except BaseException:
        # What was trained stays in the networks, as train_ppo leaves its own: every
        # run's last good step (a run that diverged under "stop", a callback that
        # raised, a KeyboardInterrupt).
        with contextlib.suppress(Exception):
            current()
        raise
    return [
        TrainResult(
            state if rates is None else _as_single_run(state, ppo, rates[run]),
            last_metrics[run],
            histories[run],
            state.steps_taken,
            iterations if run not in set_aside else set_aside[run].iterations,
            diverged=None if run not in set_aside else set_aside[run].error,
        )
        for run, state in enumerate(current())
    ]
