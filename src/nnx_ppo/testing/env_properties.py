"""``check_env``: the environment side of the contract, checked on a short rollout.

The library vmaps one unbatched environment over ``n_envs`` and compiles its
steps. :func:`check_env` does the same on a short rollout with random actions and
checks what the library relies on; the shape checks are those of
:mod:`nnx_ppo.contract.env_checks`, run while JAX traces. The properties live in one
ordered table, :data:`ENV_PROPERTIES`: the checks run in its order, and
:func:`check_env`'s docstring lists them from it.

Example::

    from nnx_ppo.testing import check_env

    def test_my_env():
        check_env(MyEnv(max_steps=5), n_envs=4, steps=8)
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Bool, Int, PRNGKeyArray

from nnx_ppo._compile import fast_compile_options
from nnx_ppo.contract import checks
from nnx_ppo.contract.arguments import require_bool, require_callable, require_int, require_key
from nnx_ppo.contract.axes import Unbatched
from nnx_ppo.contract.checking import named_leaves
from nnx_ppo.contract.env_checks import (
    check_action_tree,
    check_env_state,
    check_env_unbatched,
    discrete_action_flags,
    is_size,
    require_env,
    size_shape,
    traced_attribute,
)
from nnx_ppo.envs.state import _holds_shared, _vmap_reset, _vmap_step
from nnx_ppo.testing._harness import (
    Condition,
    ContractPropertyError,
    PropertyCheck,
    as_numpy,
    contract_leaf,
    describe_difference,
    document_properties,
    property_failure,
)

__all__ = ["ENV_PROPERTIES", "TRUNCATION_KEYS", "EnvProperty", "check_env", "random_action"]

TRUNCATION_KEYS = ("truncated", "truncation")
"""The ``info`` entries that mark a time-limit end: this library's and MuJoCo Playground's."""


class EnvProperty(enum.StrEnum):
    """The names of the properties :func:`check_env` checks.

    The order they run in, their rules and what each compares are the rows of
    :data:`~nnx_ppo.testing.ENV_PROPERTIES`.
    """

    RESET = "single-env reset"
    STEP = "single-env step"
    VMAP_JIT = "vmappable and jittable"
    FINITE = "finite observations and rewards"
    DETERMINISM = "deterministic given the key"
    RANDOM_RESET = "reset draws from its key"
    TRUNCATION = "truncation signal"
    DONE_LEAVES = "per-leaf done stays set"


_RESETS_COMPARED = 32
"""Resets ``reset draws from its key`` compares: an env of two equally likely starts gives
32 equal ones once in 2**31."""


def _action_size(env: Any) -> Any:
    __tracebackhide__ = True
    action_size = getattr(env, "action_size", None)
    if action_size is None:
        raise TypeError(
            f"{type(env).__name__} has no action_size to draw random actions from; pass "
            "action_fn=lambda key: ... (one environment's action) to check_env"
        )
    return action_size


def random_action(env: Any, key: PRNGKeyArray) -> Unbatched:
    """One environment's uniformly random action, from ``env.action_size``.

    An ``int`` or shape leaf of ``action_size`` gives floats uniform in ``[-1, 1]``
    of that shape, or, where ``env.discrete_actions`` is ``True``, one ``int32``
    index below the leaf's value.

    Raises:
      TypeError: ``env`` has no ``action_size``.
    """
    action_size = _action_size(env)
    sizes, treedef = jax.tree.flatten(action_size, is_leaf=is_size)
    keys = jax.random.split(key, len(sizes))
    leaves = [
        jax.random.randint(k, (), 0, int(n), jnp.int32)
        if discrete
        else jax.random.uniform(k, size_shape(n), minval=-1, maxval=1)
        for k, n, discrete in zip(keys, sizes, discrete_action_flags(env), strict=True)
    ]
    return jax.tree.unflatten(treedef, leaves)


class _EnvKit:
    """One environment, the rollout it is checked on, and the failures it reports."""

    def __init__(
        self,
        env: Any,
        n_envs: int,
        steps: int,
        key: PRNGKeyArray,
        action_fn: Callable[[PRNGKeyArray], Any],
        random_reset: bool,
    ) -> None:
        self.env, self.n_envs, self.steps, self.key = env, n_envs, steps, key
        self.action_fn, self.random_reset = action_fn, random_reset
        self.name = type(env).__name__
        self.reference: Any = None
        self.program = ""  # the rollout's traced program, as text
        self.result: tuple[Any, Any, Any] = (None, None, None)

    def fail(self, prop: EnvProperty, sentence: str, **details: Any) -> ContractPropertyError:
        sizes = {"n_envs": self.n_envs, "steps": self.steps}
        return property_failure(
            "check_env", prop, self.name, sizes, sentence, rule=_RULES[prop], **details
        )

    def failed_call(self, prop: EnvProperty, what: str, error: Exception) -> ContractPropertyError:
        sentence = f"{what} raised {type(error).__name__}."
        return self.fail(prop, sentence, leaf=contract_leaf(error), cause=error)

    # ------------------------------------------------------------------------- checks

    def check_reset(self) -> None:
        try:
            self.reference = check_env_unbatched(self.env, jax.random.split(self.key)[0])
        except Exception as error:
            raise self.failed_call(EnvProperty.RESET, "env.reset on one key", error) from None
        self.check_nothing_kept_on_the_env(EnvProperty.RESET, "env.reset")

    def check_step(self) -> None:
        try:
            # Shapes suffice here; the rollout below draws actual actions.
            action = jax.eval_shape(self.action_fn, jax.random.split(self.key)[1])
            check_action_tree(action, self.env, where=f"{self.name}.step")
            stepped = jax.eval_shape(self.env.step, self.reference, action)
            check_env_state(stepped, where=f"{self.name}.step", reference=self.reference)
        except Exception as error:
            raise self.failed_call(
                EnvProperty.STEP, "env.step on one environment's state", error
            ) from None
        self.check_nothing_kept_on_the_env(EnvProperty.STEP, "env.step")

    def check_nothing_kept_on_the_env(self, prop: EnvProperty, method: str) -> None:
        """A traced value left on the env object: state kept outside the State (a key in
        ``self._key``), which fails later in JAX with a message that names nothing."""
        kept = traced_attribute(self.env, "env")
        if kept is not None:
            raise self.fail(
                prop,
                f"{method} stored a traced value on the env object, at {kept}: an env is a "
                "pure function of its state. Keep what it remembers between steps (a key, a "
                "counter) in the State's data.",
                leaf=kept,
            )

    def rollout(self) -> jax.stages.Wrapped:
        """A freshly traced ``jit(key -> (reset states, stepped states, starts))``.

        The states are over ``n_envs``; the starts are ``_RESETS_COMPARED`` more resets,
        for ``reset draws from its key``, in the same program so that no second one
        compiles. Each call of this method traces anew, so two rollouts compare two traces.
        """
        env, reference, name = self.env, self.reference, self.name
        # Batched as training batches it: Shared nodes stay unbatched.
        shared = _holds_shared(reference)

        def reset_one(key: PRNGKeyArray) -> Any:
            state = env.reset(key)
            check_env_state(state, where=f"{name}.reset", reference=reference)
            return state

        def step_one(state: Any, action: Any) -> Any:
            stepped = env.step(state, action)
            check_env_state(stepped, where=f"{name}.step", reference=reference)
            return stepped

        def step_all(states: Any, keys: PRNGKeyArray) -> tuple[Any, Any]:
            actions = jax.vmap(self.action_fn)(keys)
            check_action_tree(actions, env, where=f"{name}.step", batch_size=self.n_envs)
            stepped = _vmap_step(step_one, shared)(states, actions)
            return stepped, stepped

        def run(key: PRNGKeyArray) -> tuple[Any, Any, Any]:
            reset_keys = jax.random.split(jax.random.fold_in(key, 0), self.n_envs)
            action_keys = jax.random.split(jax.random.fold_in(key, 1), (self.steps, self.n_envs))
            start_keys = jax.random.split(jax.random.fold_in(key, 2), _RESETS_COMPARED)
            states = _vmap_reset(reset_one, shared)(reset_keys)
            _, trajectory = jax.lax.scan(step_all, states, action_keys)
            return states, trajectory, _vmap_reset(reset_one, shared)(start_keys)

        return jax.jit(run, compiler_options=fast_compile_options())

    def check_batched(self) -> None:
        """Compile and run the rollout; keep its program and its states on the host."""
        try:
            lowered = self.rollout().lower(self.key)
            self.result = jax.device_get(lowered.compile()(self.key))
            self.program = lowered.as_text()
        except Exception as error:
            raise self.failed_call(
                EnvProperty.VMAP_JIT,
                f"jax.jit of env.reset and env.step vmapped over {self.n_envs} envs",
                error,
            ) from None

    def episode_ends(self) -> Int[np.ndarray, " envs"]:
        """Each env's last step of its first episode: where every leaf of ``done`` is
        first set, or the rollout's last step (the env is stepped on past it, unreset)."""
        flags = [np.asarray(leaf) != 0 for _, leaf in named_leaves("done", self.result[1].done)]
        ended: Bool[np.ndarray, "steps envs"] = np.all(np.stack(flags), axis=0)
        return np.where(ended.any(axis=0), np.argmax(ended, axis=0), self.steps - 1)

    def check_finite(self) -> None:
        # Only the first episode counts: training resets an env where it ends, so what
        # an unreset env computes past its end (a pendulum left to spin up) is never used.
        states, trajectory, _ = self.result
        in_first_episode = np.arange(self.steps)[:, None] <= self.episode_ends()[None, :]
        every_env = np.ones((self.n_envs,), bool)
        for stage, batch, counted in (
            ("reset", states, every_env),
            ("step", trajectory, in_first_episode),
        ):
            for part in ("obs", "reward"):
                for name, leaf in named_leaves(f"state.{part}", getattr(batch, part)):
                    values = as_numpy(leaf)
                    at = _first_not_finite(values, counted)
                    if at is None:
                        continue
                    odd = np.ravel(values[at])
                    where = f"step {at[0]}, env {at[1]}" if stage == "step" else f"env {at[0]}"
                    raise self.fail(
                        EnvProperty.FINITE,
                        f"env.{stage} returned a {part} that is not finite: in training's "
                        "batch it makes the losses NaN.",
                        leaf=f"{name} at {where}",
                        expected="finite values over each env's first episode",
                        found=f"{odd[~np.isfinite(odd)][0]} among {odd.size} value(s)",
                    )

    def check_determinism(self) -> None:
        # A pure env traces to the same program twice; only if it does not, or calls
        # back to Python (NumPy's generator would draw anew at run time, in one program
        # text), are both run (compiling is what costs). Programs may also differ
        # harmlessly (a host callback's id), so it is the states that decide.
        second = self.rollout()
        text = second.lower(self.key).as_text()
        if text != self.program or "callback" in text:
            self._compare_runs(self.result, jax.device_get(second(self.key)))

    def _compare_runs(self, first: Any, second: Any) -> None:
        for stage, index, a_states, b_states in (
            ("env.reset", "(env, ...)", first[0], second[0]),
            ("env.step", "(step, env, ...)", first[1], second[1]),
        ):
            for (name, a), (_, b) in zip(
                named_leaves("state", a_states), named_leaves("state", b_states), strict=True
            ):
                a, b = as_numpy(a), as_numpy(b)
                if a.shape == b.shape and _same_run(a, b):
                    continue
                raise self.fail(
                    EnvProperty.DETERMINISM,
                    f"two runs from the same key, each traced anew, give different states from "
                    f"{stage}.",
                    leaf=f"{name}, indexed {index}",
                    expected="the same values in both runs",
                    found=f"first run vs second run: {describe_difference(a, b)}",
                )

    def check_random_reset(self) -> None:
        # Many resets, not the rollout's n_envs: an env with a few starts (a cue of two
        # values) gives n_envs equal ones now and then, never this many.
        # Keys count (as their data, typed or raw): an env that keeps its key to draw
        # from later does not ignore it.
        states = self.result[2]
        starts = [
            as_numpy(leaf)
            for part in ("obs", "data", "info")
            for _, leaf in named_leaves(f"state.{part}", getattr(states, part))
        ]
        if any((leaf != leaf[:1]).any() for leaf in starts if leaf.ndim):
            return
        raise self.fail(
            EnvProperty.RANDOM_RESET,
            f"env.reset from {_RESETS_COMPARED} different keys gave {_RESETS_COMPARED} equal "
            "states: it ignores its key, so every env would start every episode alike.",
            leaf="state.obs, state.data and state.info",
            expected="states that differ between keys, in the start or in a key kept to "
            "draw from later (check_env(..., random_reset=False) where the start is fixed "
            "on purpose)",
            found=f"the same state from all {_RESETS_COMPARED} keys",
        )

    def check_done_leaves(self) -> None:
        done = named_leaves("state.done", self.result[1].done)  # each (steps, n_envs)
        flags: Bool[np.ndarray, "leaves steps envs"] = np.stack(
            [np.asarray(leaf) != 0 for _, leaf in done]
        )
        for env, last in enumerate(self.episode_ends()):
            for (name, _), leaf in zip(done, flags[:, : last + 1, env], strict=True):
                cleared = np.flatnonzero(leaf[:-1] & ~leaf[1:])
                if cleared.size:
                    t = int(cleared[0])
                    raise self.fail(
                        EnvProperty.DONE_LEAVES,
                        f"{name} was set at step {t} and cleared at step {t + 1}, before every "
                        "leaf of state.done was: the env is reset only once every leaf is "
                        "done, so its episode would never end.",
                        leaf=f"{name} at step {t + 1}, env {env}",
                        expected="a leaf's done kept set from its agent's end until every "
                        "leaf is done",
                        found=f"{name} = 0 after {name} = 1",
                    )

    def check_truncation(self) -> None:
        states, trajectory, _ = self.result
        for stage, batch in (("reset", states), ("step", trajectory)):
            for key in TRUNCATION_KEYS:
                if key in batch.info:
                    self._check_flag(stage, f"state.info[{key!r}]", batch.info[key], batch)

    def _check_flag(self, stage: str, name: str, flag: Any, batch: Any) -> None:
        # Its shape and tree (one flag, or one per done leaf) are the contract's, checked
        # at every reset and step of the rollout; here its values.
        flags = named_leaves(name, flag)
        done = named_leaves("state.done", batch.done)
        for flag_name, leaf in flags:
            values = np.asarray(leaf)
            if values.dtype != np.bool_ and not np.isin(values, (0, 1)).all():
                odd = values[~np.isin(values, (0, 1))]
                raise self.fail(
                    EnvProperty.TRUNCATION,
                    f"{flag_name} from env.{stage} is not bool-like.",
                    leaf=flag_name,
                    expected="a bool, or 0 and 1",
                    found=f"{values.dtype} values such as {odd.flat[0]}",
                )
        # One flag for a tree of done means the whole episode was cut: every leaf ends.
        pairs = (
            [(flags[0], d) for d in done]
            if len(flags) == 1
            else list(zip(flags, done, strict=True))
        )
        for (flag_name, leaf), (done_name, done_leaf) in pairs:
            undone = np.argwhere(
                np.asarray(leaf).astype(bool) & ~np.asarray(done_leaf).astype(bool)
            )
            if undone.size:
                at = undone[0]
                step = f"step {at[0]}, " if stage == "step" else ""
                raise self.fail(
                    EnvProperty.TRUNCATION,
                    f"{flag_name} marks a truncation where {done_name} is not set.",
                    leaf=f"{flag_name} at {step}env {at[-1]}",
                    expected=f"{done_name} set wherever {flag_name} is",
                    found=f"{flag_name} = {np.asarray(leaf)[tuple(at)]}, "
                    f"{done_name} = {np.asarray(done_leaf)[tuple(at)]}",
                )


ENV_PROPERTIES: tuple[PropertyCheck[_EnvKit], ...] = (
    PropertyCheck(
        EnvProperty.RESET,
        "env.reset(key) takes one key and returns one environment's state: scalar done, a "
        "scalar or pytree of scalars for reward, obs a pytree of arrays (shaped as "
        "env.observation_size declares), metrics and info dicts",
        "``env.reset`` on one key returns one environment's state: ``done`` a scalar (or "
        "one per reward leaf), ``reward`` a scalar or a pytree of scalars, ``obs`` a "
        "pytree of arrays shaped as ``env.observation_size`` says (where the env has one), "
        "``metrics`` and ``info`` dicts (traced with ``jax.eval_shape``, nothing computed)",
        _EnvKit.check_reset,
    ),
    PropertyCheck(
        EnvProperty.STEP,
        "env.step(state, action) returns one environment's state with exactly the tree, "
        "shapes and dtypes env.reset returned",
        "one random action fits ``env.action_size``, and ``env.step`` returns exactly the "
        "tree, shapes and dtypes ``reset`` returned (the obs structure included)",
        _EnvKit.check_step,
    ),
    PropertyCheck(
        EnvProperty.VMAP_JIT,
        "the library runs jax.jit(jax.vmap(env.reset)) and jax.jit(jax.vmap(env.step)) over n_envs",
        "``jax.jit`` of ``reset`` and of ``steps`` steps, both ``jax.vmap``-ed over "
        "``n_envs``, runs, with the checks of the first two repeated on every state while "
        "JAX traces",
        _EnvKit.check_batched,
    ),
    PropertyCheck(
        EnvProperty.FINITE,
        "observations and rewards are finite: a NaN or an infinity from the env becomes a NaN loss",
        "the float leaves of ``obs`` and ``reward`` from ``reset``, and from ``step`` up to "
        "each env's first end of episode (where every leaf of ``done`` is set), are finite",
        _EnvKit.check_finite,
    ),
    PropertyCheck(
        EnvProperty.DETERMINISM,
        "an environment is a pure function of its key, state and action, checked as: two "
        "runs from the same key, each traced anew, give the same states. Python-side state "
        "or a NumPy draw that changes from one trace to the next shows; noise fixed at "
        "trace time (a NumPy generator seeded inside step) is the same in both runs and is "
        "not caught",
        "a second, freshly traced run from the same key gives the same states: integers, "
        "booleans and keys exactly, floats to float32 rounding (a second program may fuse "
        "differently)",
        _EnvKit.check_determinism,
    ),
    PropertyCheck(
        EnvProperty.RANDOM_RESET,
        "env.reset draws its start from its key: envs reset from different keys do not all "
        "start alike",
        f"the starts ``reset`` returns from {_RESETS_COMPARED} keys (``obs``, ``data`` and "
        "``info``, keys kept there included) are not all the same",
        _EnvKit.check_random_reset,
        Condition("``random_reset=True``", lambda kit: kit.random_reset),
    ),
    PropertyCheck(
        EnvProperty.TRUNCATION,
        "info['truncated'] (or Playground's info['truncation']) is a bool-like flag shaped "
        "like done, and a truncated step is a done step",
        '``info["truncated"]`` and Playground\'s ``info["truncation"]``, where present, '
        "are bool-like (bool, or 0 and 1), one flag per environment (or per ``done`` "
        "leaf), and set only where ``done`` is",
        _EnvKit.check_truncation,
    ),
    PropertyCheck(
        EnvProperty.DONE_LEAVES,
        "with one done per reward leaf, a leaf's done stays set from its agent's end until "
        "every leaf is done: only then does the episode end and the env reset",
        "over the rollout, no leaf of ``done`` is cleared before every leaf is set",
        _EnvKit.check_done_leaves,
        Condition(
            "``done`` has several leaves",
            lambda kit: len(jax.tree.leaves(kit.result[1].done)) > 1,
        ),
    ),
)
"""The properties :func:`check_env` checks, in the order it checks them."""

_RULES: dict[str, str] = {row.property: row.rule for row in ENV_PROPERTIES}


def _first_not_finite(
    values: np.ndarray, counted: Bool[np.ndarray, "*lead"]
) -> tuple[int, ...] | None:
    """The leading index (steps and envs, or envs) of the first counted entry of
    ``values`` holding a NaN or an infinity; ``None`` for integers and where all are finite."""
    if not np.issubdtype(values.dtype, np.inexact):
        return None
    not_finite = ~np.isfinite(values.reshape(*counted.shape, -1)).all(axis=-1) & counted
    return tuple(int(i) for i in np.argwhere(not_finite)[0]) if not_finite.any() else None


def _same_run(a: np.ndarray, b: np.ndarray) -> bool:
    """Two runs' values agree: exactly, or for floats to float32 rounding.

    Two traces of one pure env compute the same maths, but XLA may fuse two
    program texts differently and round the last bits differently; a frozen
    Python-side value or NumPy draw differs by far more than ``rtol=1e-5``.
    """
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True))
    return bool(np.array_equal(a, b))


def _trace_action_fn(action_fn: Callable[[PRNGKeyArray], Any], key: PRNGKeyArray) -> None:
    """Trace the caller's ``action_fn`` on one key before any property runs: an error in
    it is the caller's, and inside a property it would read as the env's."""
    __tracebackhide__ = True
    try:
        jax.eval_shape(action_fn, jax.random.split(key)[1])
    except Exception as error:
        # The caller's own exception, with its traceback into action_fn, is the clearest.
        error.add_note(
            "check_env: raised by action_fn, the function given to check_env, traced on one "
            "key before the env was reset or stepped"
        )
        raise


def check_env(
    env: Any,
    *,
    n_envs: int = 4,
    steps: int = 8,
    key: PRNGKeyArray | None = None,
    action_fn: Callable[[PRNGKeyArray], Any] | None = None,
    random_reset: bool = True,
) -> None:
    """Check an environment against the env side of the contract.

    Checks, in this order (the names are :class:`EnvProperty` values, the rules
    those quoted by a failure):

    <properties>

    Environments are stepped on after their episode ends (no reset in between):
    choose ``steps`` and the env's time limit so the rollout shows what you want
    checked, e.g. a time limit below ``steps`` to see truncations.

    Args:
      env: one unbatched environment with ``reset(key)`` and ``step(state, action)``.
      n_envs: the number of environments vmapped.
      steps: the number of steps of the rollout.
      key: the PRNG key of the rollout, one key (typed, or a raw ``uint32`` key of
        shape ``(2,)``); ``jax.random.key(0)`` if not given.
      action_fn: ``key -> action`` for one environment; by default
        :func:`random_action` from ``env.action_size`` and ``env.discrete_actions``.
        An error it raises is raised as it is, with a note naming ``action_fn``.
      random_reset: whether ``reset`` draws the start from its key (checked as
        ``reset draws from its key``); ``False`` for an env that starts in one
        state on purpose.

    Raises:
      ContractPropertyError: a property failed; the message names it, the leaf,
        and quotes the error of the contract check (or of the env) that caused it.
      TypeError, ValueError: the arguments are malformed.
      Exception: whatever ``action_fn`` raises, unchanged but for a note.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the message
    require_env("check_env", env)
    rollout_key = jax.random.key(0) if key is None else require_key("check_env", "key", key)
    require_callable("check_env", "action_fn", action_fn, ("key",))
    kit = _EnvKit(
        env,
        require_int("check_env", "n_envs", n_envs),
        require_int("check_env", "steps", steps),
        rollout_key,
        (lambda k: random_action(env, k)) if action_fn is None else action_fn,
        require_bool("check_env", "random_reset", random_reset),
    )
    if action_fn is None:
        _action_size(env)  # a missing action_size is a usage error, raised now
    else:
        _trace_action_fn(action_fn, rollout_key)
    try:
        with checks(True):
            for row in ENV_PROPERTIES:
                if row.applies is None or row.applies.holds(kit):
                    row.check(kit)
    except ContractPropertyError as error:
        # The message says it all: no library frames, no chained cause (kept as .cause).
        raise error.with_traceback(None) from None


check_env.__doc__ = document_properties(check_env.__doc__, ENV_PROPERTIES)
