"""Recording rollouts: every module's activations over an episode, and slim states to render.

* :func:`record_activations_rollout` runs one evaluation episode in each of
  ``n_envs`` environments through a :class:`~nnx_ppo.networks.recording.Recorder`
  of the network and returns every contract module's ``output`` at every step,
  leaves ``(T, B, *feat)``, keyed by the module's path in the network.
* :func:`eval_rollout_for_render_scan` and :func:`unstack_trajectory` are
  :func:`~nnx_ppo.algorithms.rollout.record_episode` with the states it visits cut
  down to what rendering needs (:class:`SlimState`), the names nnx-ppo 0.3.0 used.

Everything here is importable from :mod:`nnx_ppo.algorithms.rollout` too.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, PyTree, Shaped

from nnx_ppo.algorithms import rollout
from nnx_ppo.algorithms.types import EnvState, RLEnv
from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.axes import BatchedTree, BoolHistory, Carry, HistoryTree, Mask
from nnx_ppo.contract.checking import require_no_hijax, typechecked
from nnx_ppo.networks.recording import Recorder, extract_activations
from nnx_ppo.networks.types import StatefulModule, checked_ppo_output

__all__ = [
    "SlimData",
    "SlimState",
    "eval_rollout_for_render_scan",
    "record_activations_rollout",
    "unstack_trajectory",
]


@typechecked
def record_activations_rollout(
    env: RLEnv,
    networks: StatefulModule,
    n_envs: int,
    max_episode_length: int,
    key: PRNGKeyArray,
) -> tuple[dict[str, HistoryTree], BoolHistory]:
    """Run one episode in each of ``n_envs`` envs, recording every module's activations.

    The episodes are :func:`~nnx_ppo.algorithms.rollout.eval_rollout`'s: no env
    is reset, each runs ``max_episode_length`` steps, and the policy is whatever
    mode ``networks`` is in (call ``networks.eval()`` first for a deterministic
    one). ``networks`` is not changed: it is run through a
    :class:`~nnx_ppo.networks.recording.Recorder`.

    Memory: ``max_episode_length * n_envs`` times the size of every module's
    output is kept on the device.

    Returns:
      ``(activations, finished)``: ``activations`` maps each contract module's
      path in the network (``""`` for the network itself, ``".layers[0]"``, ...)
      to its ``output`` at every step, leaves ``(T, B, *feat)``; ``finished`` is
      ``(T, B)`` bool, ``True`` at the steps taken after the env's episode had
      already ended (mask those out).

    Raises:
      ValueError: a module is called twice in one step, or is not in the
        network's NNX graph (see :class:`~nnx_ppo.networks.recording.Recorder`).
    """
    require_int("record_activations_rollout", "n_envs", n_envs)
    require_int("record_activations_rollout", "max_episode_length", max_episode_length)
    require_no_hijax("record_activations_rollout", networks)
    recorder = networks if isinstance(networks, Recorder) else Recorder(networks)
    batched = rollout._BatchedEnv(env)
    env_state = batched.reset(jax.random.split(key, n_envs))

    def step(
        module: StatefulModule, carry: tuple[Carry, EnvState, Mask], _: None
    ) -> tuple[tuple[Carry, EnvState, Mask], tuple[dict[str, BatchedTree], Mask]]:
        network_state, env_state, finished = carry
        out = module(network_state, env_state.obs)
        actions = checked_ppo_output(out.output, "record_activations_rollout").actions
        stepped = batched.step(env_state, actions)
        ended = rollout.episode_ended(rollout.episode_flags(stepped)[0])
        return (out.next_state, stepped, finished | ended), (
            extract_activations(out.metrics),
            finished,
        )

    init = (rollout._initial_carry(recorder, n_envs, key), env_state, jnp.zeros(n_envs, bool))
    _, (activations, finished) = rollout.scan_module(
        recorder, step, init, length=max_episode_length
    )
    return activations, finished


class SlimData(NamedTuple):
    """The fields of an MJX ``Data`` that rendering reads (a pytree).

    The rest of ``Data`` (contact and constraint buffers, which MuJoCo Warp
    preallocates at full size) is left out of a recorded trajectory. ``*T`` is the
    time axis of a stacked trajectory, absent in one state.
    """

    qpos: Float[Array, "*T nq"]
    qvel: Float[Array, "*T nv"]
    time: Float[Array, "*T"]
    mocap_pos: Float[Array, "*T nmocap 3"]
    mocap_quat: Float[Array, "*T nmocap 4"]
    xfrc_applied: Float[Array, "*T nbody 6"]


class SlimState(NamedTuple):
    """An env state cut down to what rendering reads (a pytree).

    ``done``, ``info``, ``metrics`` and ``obs`` are the state's own. ``data`` is a
    :class:`SlimData` when the state's ``data`` has all of its fields (an MJX
    ``Data``), and otherwise the state's ``data`` as it is (the built-in envs keep
    a few scalars there). ``*T`` is the time axis of a stacked trajectory, absent in
    one state. (nnx-ppo 0.3.0's had no ``obs``; a renderer may read it here.)
    """

    data: SlimData | PyTree[Shaped[Array, "..."]]  # (*T, ...): one variadic axis per shape
    done: PyTree[Shaped[Array, "*T"]]
    info: dict[str, Any]
    metrics: dict[str, Any]
    obs: PyTree[Shaped[Array, "..."]] = None


_SLIM_FIELDS = SlimData._fields

Tree = TypeVar("Tree")


def _slim(state: EnvState) -> SlimState:
    data = getattr(state, "data", ())
    if all(hasattr(data, name) for name in _SLIM_FIELDS):
        data = SlimData(*(getattr(data, name) for name in _SLIM_FIELDS))
    return SlimState(data, state.done, state.info, state.metrics, state.obs)


def eval_rollout_for_render_scan(
    env: RLEnv, networks: StatefulModule, max_episode_length: int, key: PRNGKeyArray
) -> tuple[SlimState, SlimState, Float[Array, ""]]:
    """:func:`~nnx_ppo.algorithms.rollout.record_episode`, its states slimmed for rendering.

    One env runs ``max_episode_length`` steps, restarted where an episode ends,
    with the policy in whatever mode ``networks`` is in. Traceable: ``jit`` it.

    Returns:
      ``(states, final_state, episode_return)``: the :class:`SlimState` of the
      ``max_episode_length`` states each step started from, stacked (leaves
      ``(T, ...)``, no env axis); that of the state after the last step; and the
      return of the first episode (reward leaves summed).
    """
    require_int("eval_rollout_for_render_scan", "max_episode_length", max_episode_length)
    trajectory, episode_return = rollout.record_episode(env, networks, max_episode_length, key)
    slim = _slim(trajectory)
    states = jax.tree.map(lambda leaf: leaf[:-1], slim)
    final_state = jax.tree.map(lambda leaf: leaf[-1], slim)
    return states, final_state, episode_return


def unstack_trajectory(
    stacked_states: SlimState, final_state: SlimState, max_episode_length: int
) -> list[SlimState]:
    """The first ``max_episode_length`` stacked states, one by one, then the state that
    followed them: a list for an env's ``render``. That is ``final_state`` where the
    stacked states are exactly ``max_episode_length``, and the next stacked one where
    they are more. Runs eagerly (it builds a Python list).

    Raises:
      ValueError: ``stacked_states`` holds fewer than ``max_episode_length`` states.
    """
    require_int("unstack_trajectory", "max_episode_length", max_episode_length)
    held = min(int(jnp.shape(leaf)[0]) for leaf in jax.tree.leaves(stacked_states))
    if held < max_episode_length:
        raise ValueError(
            f"unstack_trajectory: max_episode_length={max_episode_length}, but the stacked "
            f"states hold {held} steps"
        )
    if held > max_episode_length:  # the state after the last one asked for is held too
        return _unstacked(stacked_states, max_episode_length + 1)
    return [*_unstacked(stacked_states, max_episode_length), final_state]


def _unstacked(stacked: Tree, length: int) -> list[Tree]:
    """The first ``length`` entries of a tree stacked on a leading axis, one tree each."""
    return [jax.tree.map(lambda leaf, t=t: leaf[t], stacked) for t in range(length)]
