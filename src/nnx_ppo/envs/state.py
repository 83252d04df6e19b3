"""The state of one built-in environment, and the time limit they share.

Every built-in environment follows the MuJoCo Playground convention (the docs'
environments page): ``reset(key) -> State`` and ``step(state, action) -> State`` for
**one** environment, which the library vmaps over ``n_envs``.

Conventions shared by the built-in environments:

- ``done`` is a ``float32`` scalar, 1.0 at the end of an episode (as in
  Playground);
- ``info["truncated"]`` is a ``bool`` scalar, ``True`` when the episode ended
  by its time limit rather than by termination (a step that both terminates
  and reaches the limit counts as terminated);
- ``observation_size`` and ``action_size`` follow Playground: an ``int`` for a
  flat array, a dict of shapes (observations) or of ints (actions) for dict
  trees;
- ``discrete_actions`` (a class attribute, ``bool``) tells whether an action
  leaf is one integer scalar choosing among ``action_size`` options (``True``)
  or an array of ``action_size`` floats (``False``; Playground envs have no
  such attribute and are continuous).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree, Shaped

from nnx_ppo.contract.axes import Scalar, Unbatched
from nnx_ppo.contract.errors import ContractError, rule_text
from nnx_ppo.jax_dataclass import Replaceable

__all__ = ["EnvState", "RLEnv", "Shared", "State", "episode_flags", "time_limit"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State(Replaceable):
    """One environment's state: a frozen pytree dataclass with Playground's fields.

    ``state.replace(**changes)`` returns a copy with the given fields replaced, as
    Playground's ``State.replace`` does.

    Attributes:
      obs: the observation, a pytree of arrays.
      reward: the reward of the step that led here, a scalar or a pytree of
        scalars (one per agent or objective); zero after ``reset``.
      done: a ``float32`` scalar, 1.0 when the episode ended at this step.
      metrics: a dict of scalars, for logging.
      info: a dict; the built-in envs write ``info["truncated"]`` here.
      data: the environment's hidden state (positions, counters, the cue of a
        memory task); Playground keeps its ``mjx.Data`` in this field.
    """

    obs: Unbatched
    reward: PyTree[Scalar]
    done: Scalar
    metrics: dict[str, Any]
    info: dict[str, Any]
    data: Any = ()


@runtime_checkable
class EnvState(Protocol):
    """One environment's state, as in MuJoCo Playground.

    The fields are read-only properties so that frozen dataclasses (Playground's
    ``State``, :class:`nnx_ppo.envs.State <nnx_ppo.envs.state.State>`) satisfy the
    protocol. ``done`` is a scalar (``float`` in Playground, ``bool`` elsewhere) or
    one scalar per reward leaf; ``info["truncated"]`` (ours) or
    ``info["truncation"]`` (Playground) marks an episode cut short by a time limit.

    The same type describes one env's state (``obs``, ``reward`` and ``done`` leaves
    ``(...)``) and the library's batched states (leaves ``(B, ...)``), hence the
    ``"..."`` shapes.
    """

    @property
    def obs(self) -> PyTree[Shaped[Array, "..."]]: ...
    @property
    def reward(self) -> PyTree[Shaped[Array, "..."]]: ...
    @property
    def done(self) -> PyTree[Shaped[Array, "..."]]: ...
    @property
    def metrics(self) -> dict[str, Any]: ...
    @property
    def info(self) -> dict[str, Any]: ...
    def replace(self, **changes: Any) -> Any:
        """A copy with the given fields replaced (Playground's and our ``State`` have it)."""
        ...


@runtime_checkable
class RLEnv(Protocol):
    """One unbatched environment; the library vmaps ``reset`` and ``step`` over envs.

    ``step`` takes the env's own state type and one env's action (an
    :data:`~nnx_ppo.contract.axes.Unbatched` tree); the protocol leaves both as
    ``Any``, since a protocol's parameters must accept every env's narrower types.
    """

    def reset(self, rng: PRNGKeyArray, /) -> EnvState: ...
    def step(self, state: Any, action: Any, /) -> EnvState: ...


def time_limit(
    terminated: Bool[Array, ""], steps_taken: Int[Array, ""], max_steps: int
) -> tuple[Float[Array, ""], Bool[Array, ""]]:
    """The ``(done, truncated)`` pair of a step, given termination and a step budget.

    Truncation is marked only where the episode did not terminate, so a value
    target bootstraps exactly where the episode was cut short.

    Args:
      terminated: whether the env reached a terminal state at this step.
      steps_taken: the number of steps taken in the episode, this one included.
      max_steps: the episode's time limit.

    Returns:
      ``done`` as a ``float32`` scalar and ``truncated`` as a ``bool`` scalar.
    """
    truncated = jnp.logical_and(steps_taken >= max_steps, jnp.logical_not(terminated))
    return jnp.logical_or(terminated, truncated).astype(jnp.float32), truncated


def episode_flags(
    state: EnvState, before: EnvState | None = None
) -> tuple[PyTree[Bool[Array, "..."]], PyTree[Bool[Array, "..."]]]:
    """``(done, truncated)`` of a (batched) env state, as ``bool`` trees shaped like ``done``.

    Truncation is read from ``info["truncated"]`` (this library) and
    ``info["truncation"]`` (MuJoCo Playground), either of which may be absent,
    and only counts where ``done`` holds.

    Args:
      state: the state a ``step`` returned.
      before: the state that ``step`` was given. With per-agent ends, a finished
        agent's ``done`` leaf stays set until the episode ends, so a single
        time-limit flag would also mark the agents that terminated earlier as cut
        short; given ``before``, a leaf counts as truncated only at the step its
        ``done`` was first set. (Where ``done`` is one flag, ``before`` was never
        done, and it changes nothing.)
    """
    done = jax.tree.map(lambda d: jnp.asarray(d).astype(bool), state.done)
    truncated = jax.tree.map(jnp.zeros_like, done)
    for name in ("truncated", "truncation"):
        if name not in state.info:
            continue
        mark = state.info[name]
        if hasattr(mark, "shape"):  # one flag for a tree of per-agent ``done``
            mark = jax.tree.map(lambda _, m=mark: m, done)
        elif jax.tree.structure(mark) != jax.tree.structure(done):
            raise ContractError.violation(
                "episode_flags",
                f'info["{name}"] is neither one flag nor a tree shaped like done.',
                leaf=f'info["{name}"]',
                expected=f"one bool, or bools with done's structure {jax.tree.structure(done)}",
                found=str(jax.tree.structure(mark)),
                rule=_RULE_TRUNCATION,
            )
        truncated = jax.tree.map(lambda t, m: t | jnp.asarray(m).astype(bool), truncated, mark)
    truncated = jax.tree.map(jnp.logical_and, truncated, done)
    if before is not None:
        truncated = jax.tree.map(
            lambda t, d: t & ~jnp.asarray(d).astype(bool), truncated, before.done
        )
    return done, truncated


@jax.tree_util.register_pytree_node_class
class Shared:
    """Marks a part of an env state that carries no per-env axis.

    The library's vmapped ``reset`` and ``step`` do not map a ``Shared`` node
    (``in_axes``/``out_axes`` ``None``): every env sees the one value, and the
    batched state holds it once, unbroadcast. Its value must therefore not
    depend on the env (a reset key, an env's action). Where finished
    environments are swapped for fresh ones,
    ``nnx_ppo.algorithms.rollout.tree_where`` keeps the stepped state's
    ``Shared`` value. Wrap shared model handles or buffers in it, e.g.
    ``info={"model": Shared(handle)}``.
    """

    def __init__(self, value: Any) -> None:
        self.value = value

    def tree_flatten(self) -> tuple[tuple[Any], None]:
        return (self.value,), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[Any]) -> Shared:
        del aux
        return cls(children[0])


def _is_shared(node: Any) -> bool:
    return isinstance(node, Shared)


def _holds_shared(state: Any) -> bool:
    """Whether an env state holds a :class:`Shared` node."""
    return any(map(_is_shared, jax.tree.leaves(state, is_leaf=_is_shared)))


def _split_shared(state: Any) -> tuple[Any, Any]:
    """``(per-env part, shared part)``: two trees shaped like ``state``.

    The per-env part holds ``Shared(None)`` (no leaves) in place of every
    :class:`Shared` node, the shared part ``None`` in place of every other leaf, so
    ``vmap`` maps the first and broadcasts the second.
    """
    per_env = jax.tree.map(
        lambda n: Shared(None) if _is_shared(n) else n, state, is_leaf=_is_shared
    )
    shared = jax.tree.map(lambda n: n if _is_shared(n) else None, state, is_leaf=_is_shared)
    return per_env, shared


def _join_shared(per_env: Any, shared: Any) -> Any:
    """The inverse of :func:`_split_shared`."""
    return jax.tree.map(lambda p, s: s if _is_shared(p) else p, per_env, shared, is_leaf=_is_shared)


def _vmap_reset(reset_one: Callable[[Any], Any], shared: bool) -> Callable[[Any], Any]:
    """``jax.vmap(reset_one)`` over keys; with ``shared``, :class:`Shared` nodes leave
    unbatched (``out_axes`` ``None``).

    Only states that hold ``Shared`` nodes are split: simulators' own state types
    (MJX's ``Data``) carry custom vmap rules that a tree of ``None`` placeholders
    would break.
    """
    if not shared:
        return jax.vmap(reset_one)

    def reset(keys: Any) -> Any:
        with _shared_values_checked("reset", lambda: jax.eval_shape(reset_one, keys[0])):
            split = jax.vmap(lambda key: _split_shared(reset_one(key)), out_axes=(0, None))(keys)
        return _join_shared(*split)

    return reset


def _vmap_step(step_one: Callable[[Any, Any], Any], shared: bool) -> Callable[[Any, Any], Any]:
    """``jax.vmap(step_one)`` over states and actions; with ``shared``, :class:`Shared`
    nodes enter and leave unbatched (``in_axes``/``out_axes`` ``None``)."""
    if not shared:
        return jax.vmap(step_one)

    def step(states: Any, actions: Any) -> Any:
        def step_split(per_env: Any, shared_part: Any, action: Any) -> tuple[Any, Any]:
            return _split_shared(step_one(_join_shared(per_env, shared_part), action))

        per_env, shared_part = _split_shared(states)
        with _shared_values_checked("step", lambda: states):
            stepped = jax.vmap(step_split, in_axes=(0, None, 0), out_axes=(0, None))(
                per_env, shared_part, actions
            )
        return _join_shared(*stepped)

    return step


@contextlib.contextmanager
def _shared_values_checked(method: str, state_like: Callable[[], Any]) -> Iterator[None]:
    """Turn ``vmap``'s error for an unbatched output that varies across envs into a
    :class:`~nnx_ppo.contract.ContractError` naming the ``Shared`` nodes of
    ``state_like()`` (a state, or its shapes) and the rule. (``vmap``'s own message
    names a leaf of the other, batched part.)"""
    try:
        yield
    except ValueError as error:
        if "axis spec None" not in str(error):  # JAX's words for an unmapped output that varies
            raise
        shared = [
            "state" + jax.tree_util.keystr(path)
            for path, node in jax.tree_util.tree_flatten_with_path(
                state_like(), is_leaf=_is_shared
            )[0]
            if _is_shared(node)
        ]
        raise ContractError.violation(
            f"env.{method}",
            f"a Shared value of the state env.{method} returns differs between envs: it "
            "depends on the env's reset key, state or action.",
            leaf=shared[0] if len(shared) == 1 else "one of " + ", ".join(shared),
            expected="a Shared value that is the same for every env",
            found=f"a value that varies between the envs of jax.vmap(env.{method})",
            rule=_RULE_SHARED,
        ) from error


_RULE_TRUNCATION = rule_text(
    'info["truncated"] marks where an episode was cut short: one bool, or a tree of bools '
    "shaped like done (per agent), counted only where done holds",
    "the-contract",
    "environments",
)
_RULE_SHARED = rule_text(
    "a Shared node of the env state holds one value for every env (a model handle, a "
    "lookup table): the library keeps it unbatched, so it must not depend on the env",
    "the-contract",
    "environments",
)
