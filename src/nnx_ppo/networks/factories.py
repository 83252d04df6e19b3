"""Ready-made networks: MLPs and MLP actor-critics for continuous and discrete actions."""

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from flax import nnx
from jaxtyping import Array

from nnx_ppo.contract.arguments import require_bool, require_int, require_number, require_sizes
from nnx_ppo.contract.env_checks import (
    discrete_action_flags,
    require_env,
    single_state_shapes,
)
from nnx_ppo.networks._initializers import variance_scaling_uniform, zeros
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential, Splitter
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import ActionSampler, CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import Filter, Flattener, Map

__all__ = [
    "ACTIVATIONS",
    "make_default_network",
    "make_discrete_mlp_actor_critic",
    "make_lstm_actor_critic",
    "make_mlp",
    "make_mlp_actor_critic",
    "make_mlp_layers",
]

Activation = Callable[[Array], Array]

ACTIVATIONS: Mapping[str, Activation] = {
    "elu": nnx.elu,
    "gelu": nnx.gelu,
    "relu": nnx.relu,
    "swish": nnx.swish,
    "tanh": nnx.tanh,
}
"""The activations the factories accept by name."""


def make_mlp_layers(
    sizes: Sequence[int],
    rngs: nnx.Rngs,
    activation: Activation | str | None = nnx.relu,
    activation_last_layer: bool = True,
    **linear_kwargs: Any,
) -> list[Dense]:
    """The :class:`~nnx_ppo.networks.feedforward.Dense` layers of an MLP, to splice into a
    :class:`~nnx_ppo.networks.containers.Sequential`.

    Args:
      sizes: the widths from input to output, e.g. ``[obs_size, 64, 64, action_size]``;
        at least two.
      rngs: initialises the weights.
      activation: applied after every layer but, unless ``activation_last_layer``,
        the last: a function, a name of :data:`ACTIVATIONS`, or ``None`` for none.
      activation_last_layer: whether the last layer is followed by ``activation``.
      **linear_kwargs: passed to every :class:`flax.nnx.Linear` (``kernel_init``, ...).

    Example::

        Sequential([Flattener(), *make_mlp_layers([12, 64, 32], rngs), LSTM(32, 16, rngs)])
    """
    sizes = require_sizes("make_mlp_layers", "sizes", sizes)
    activation_last_layer = require_bool(
        "make_mlp_layers", "activation_last_layer", activation_last_layer
    )
    if len(sizes) < 2:
        raise ValueError(f"an MLP needs an input and an output size, got sizes={sizes}")
    if activation is not None:
        activation = _resolve_activation("make_mlp_layers", activation)
    n_layers = len(sizes) - 1
    return [
        Dense(
            in_features,
            out_features,
            rngs,
            activation=activation if i < n_layers - 1 or activation_last_layer else None,
            **linear_kwargs,
        )
        for i, (in_features, out_features) in enumerate(itertools.pairwise(sizes))
    ]


def make_mlp(
    sizes: Sequence[int],
    rngs: nnx.Rngs,
    activation: Activation | str | None = nnx.relu,
    activation_last_layer: bool = True,
    **linear_kwargs: Any,
) -> Sequential:
    """An MLP as a :class:`~nnx_ppo.networks.containers.Sequential` of
    :class:`~nnx_ppo.networks.feedforward.Dense` layers; see :func:`make_mlp_layers`."""
    return Sequential(
        make_mlp_layers(sizes, rngs, activation, activation_last_layer, **linear_kwargs)
    )


def make_mlp_actor_critic(
    obs_size: int | Mapping[str, int],
    action_size: int,
    actor_hidden_sizes: Sequence[int],
    critic_hidden_sizes: Sequence[int],
    rngs: nnx.Rngs,
    activation: Activation | str = nnx.relu,
    normalize_obs: bool = True,
    initializer_scale: float = 1.0,
    entropy_weight: float = 1e-2,
    min_std: float = 1e-1,
    std_scale: float = 1.0,
    *,
    actor_obs_keys: Sequence[str] | None = None,
    critic_obs_keys: Sequence[str] | None = None,
    reward_keys: Sequence[str] | None = None,
) -> StatefulModule:
    """An MLP actor and an MLP critic for continuous actions in ``[-1, 1]``.

    The network is::

        Sequential([
            Normalizer(obs_size),              # if normalize_obs
            Flattener(),                       # if obs_size is a dict
            PPOAdapter(
                action=Sequential([*actor_layers, NormalTanhSampler(...)]),
                value=critic,
            ),
        ])

    or the bare ``PPOAdapter`` for an array observation without normalisation.
    The actor and the critic share no layers. Its output is a
    :class:`~nnx_ppo.networks.types.PPONetworkOutput` with actions
    ``(B, action_size)``, log-likelihoods and values ``(B,)``.

    Args:
      obs_size: the observation width, or for dict observations a dict of widths
        (each entry ``(B, width)``; they are normalised per entry, then
        concatenated in sorted key order).
      action_size: the action width.
      actor_hidden_sizes, critic_hidden_sizes: the hidden widths of the two MLPs.
      rngs: initialises the weights and seeds the sampler's per-env keys.
      activation: a function, or one of the names in :data:`ACTIVATIONS`.
      normalize_obs: put a :class:`~nnx_ppo.networks.normalizer.Normalizer` first.
      initializer_scale: the scale of the fan-in variance-scaling (uniform)
        initialisation of every kernel.
      entropy_weight, min_std, std_scale: passed to
        :class:`~nnx_ppo.networks.sampling_layers.NormalTanhSampler`.
      actor_obs_keys, critic_obs_keys: for dict observations, the entries the actor
        and the critic each read (all of them when ``None``): e.g. ``("state",)``
        and ``("privileged_state",)`` for MuJoCo Playground's asymmetric envs,
        whose critic alone may see the simulator's privileged state. Each side then
        starts with a :class:`~nnx_ppo.networks.utils.Filter` of its entries and a
        :class:`~nnx_ppo.networks.utils.Flattener`; a side left ``None`` beside one
        given keys starts with a ``Flattener`` of all the entries.
      reward_keys: for a dict reward (one entry per objective), its keys: the critic
        then returns a dict of ``(B,)`` values by these keys, one per reward leaf.
    """
    require_int("make_mlp_actor_critic", "action_size", action_size)
    sampler = NormalTanhSampler(
        rngs, entropy_weight=entropy_weight, min_std=min_std, std_scale=std_scale
    )
    return _mlp_actor_critic(
        "make_mlp_actor_critic",
        obs_size,
        2 * action_size,
        sampler,
        actor_hidden_sizes,
        critic_hidden_sizes,
        rngs,
        activation,
        normalize_obs,
        initializer_scale,
        (actor_obs_keys, critic_obs_keys),
        reward_keys,
    )


def make_discrete_mlp_actor_critic(
    obs_size: int | Mapping[str, int],
    n_actions: int,
    actor_hidden_sizes: Sequence[int],
    critic_hidden_sizes: Sequence[int],
    rngs: nnx.Rngs,
    activation: Activation | str = nnx.relu,
    normalize_obs: bool = True,
    initializer_scale: float = 1.0,
    entropy_weight: float = 1e-2,
    *,
    actor_obs_keys: Sequence[str] | None = None,
    critic_obs_keys: Sequence[str] | None = None,
    reward_keys: Sequence[str] | None = None,
) -> StatefulModule:
    """An MLP actor and an MLP critic for a discrete action out of ``n_actions``.

    The same network as :func:`make_mlp_actor_critic`, with the actor producing
    ``n_actions`` logits for a
    :class:`~nnx_ppo.networks.sampling_layers.CategoricalSampler`: actions are
    ``int32`` class indices ``(B,)``.

    Args:
      obs_size: the observation width, or a dict of widths for dict observations.
      n_actions: the number of discrete actions, at least 2.
      actor_hidden_sizes, critic_hidden_sizes: the hidden widths of the two MLPs.
      rngs: initialises the weights and seeds the sampler's per-env keys.
      activation: a function, or one of the names in :data:`ACTIVATIONS`.
      normalize_obs: put a :class:`~nnx_ppo.networks.normalizer.Normalizer` first.
      initializer_scale: the scale of the kernels' variance-scaling initialisation.
      entropy_weight: passed to the sampler.
      actor_obs_keys, critic_obs_keys: the dict observation's entries each side
        reads, as for :func:`make_mlp_actor_critic`.
      reward_keys: a dict reward's keys, for one value per entry, as for
        :func:`make_mlp_actor_critic`.
    """
    _require_choices("make_discrete_mlp_actor_critic", "n_actions", n_actions)
    return _mlp_actor_critic(
        "make_discrete_mlp_actor_critic",
        obs_size,
        n_actions,
        CategoricalSampler(rngs, entropy_weight=entropy_weight),
        actor_hidden_sizes,
        critic_hidden_sizes,
        rngs,
        activation,
        normalize_obs,
        initializer_scale,
        (actor_obs_keys, critic_obs_keys),
        reward_keys,
    )


def _resolve_activation(owner: str, activation: Activation | str) -> Activation:
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"{owner}: unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)} "
                "or pass a function"
            )
        return ACTIVATIONS[activation]
    if not callable(activation):
        raise TypeError(f"{owner}: activation must be a name or a function, got {activation!r}")
    return activation


def _observation_width(owner: str, obs_size: int | Mapping[str, int]) -> int:
    if isinstance(obs_size, Mapping):
        if not obs_size:
            raise ValueError(f"{owner}: obs_size is an empty dict")
        for key, size in obs_size.items():
            require_int(owner, f"obs_size[{key!r}]", size)
        return sum(obs_size.values())
    require_int(owner, "obs_size", obs_size)
    return obs_size


def _obs_selection(
    owner: str, obs_size: int | Mapping[str, int], keys: Sequence[str] | None, side: str
) -> tuple[int | None, list[StatefulModule]]:
    """The input width and first layers of a side reading only ``keys`` of a dict
    observation: ``(None, [])`` when it reads the whole observation."""
    if keys is None:
        return None, []
    if isinstance(keys, str) or not keys:
        raise TypeError(
            f"{owner}: {side}_obs_keys must be a non-empty sequence of keys, got {keys!r}"
        )
    if not isinstance(obs_size, Mapping):
        raise ValueError(f"{owner}: {side}_obs_keys needs a dict obs_size, got {obs_size!r}")
    missing = [key for key in keys if key not in obs_size]
    if missing:
        raise ValueError(
            f"{owner}: {side}_obs_keys names {missing}, which obs_size lacks "
            f"(its keys: {sorted(obs_size)})"
        )
    width = sum(int(obs_size[key]) for key in keys)
    return width, [Filter({key: key for key in keys}), Flattener()]


def _value_split(owner: str, reward_keys: Sequence[str] | None) -> tuple[int, list[Splitter]]:
    """The critic's output width, and the layer splitting it into one value per key of a
    dict reward (none for one reward)."""
    if reward_keys is None:
        return 1, []
    keys = list(reward_keys) if isinstance(reward_keys, Sequence) else []
    if (
        isinstance(reward_keys, str)
        or not keys
        or not all(isinstance(key, str) for key in keys)
        or len(set(keys)) != len(keys)
    ):
        raise TypeError(
            f"{owner}: reward_keys must be a non-empty sequence of distinct str keys, those "
            f"of a dict reward, got {reward_keys!r}"
        )
    return len(keys), [Splitter(**dict.fromkeys(keys, 1))]


def _require_choices(owner: str, name: str, n_actions: int) -> None:
    """A discrete action chooses among at least two: one leaves the policy nothing to learn."""
    require_int(owner, name, n_actions)
    if n_actions < 2:
        raise ValueError(f"{owner} {name} must be >= 2 (discrete actions), got {n_actions}")


def _mlp_actor_critic(
    owner: str,
    obs_size: int | Mapping[str, int],
    actor_output_size: int,
    sampler: ActionSampler,
    actor_hidden_sizes: Sequence[int],
    critic_hidden_sizes: Sequence[int],
    rngs: nnx.Rngs,
    activation: Activation | str,
    normalize_obs: bool,
    initializer_scale: float,
    obs_keys: tuple[Sequence[str] | None, Sequence[str] | None] = (None, None),
    reward_keys: Sequence[str] | None = None,
) -> StatefulModule:
    activation = _resolve_activation(owner, activation)
    n_values, value_split = _value_split(owner, reward_keys)
    normalize_obs = require_bool(owner, "normalize_obs", normalize_obs)
    require_number(owner, "initializer_scale", initializer_scale, minimum=0.0, strict=True)
    actor_hidden_sizes = require_sizes(owner, "actor_hidden_sizes", actor_hidden_sizes)
    critic_hidden_sizes = require_sizes(owner, "critic_hidden_sizes", critic_hidden_sizes)
    width = _observation_width(owner, obs_size)
    (actor_width, actor_input), (critic_width, critic_input) = (
        _obs_selection(owner, obs_size, keys, side)
        for keys, side in zip(obs_keys, ("actor", "critic"), strict=True)
    )
    if actor_input or critic_input:
        # No shared Flattener once one side filters: the side given no keys reads the
        # whole dict, so it flattens it itself.
        actor_input = actor_input or [Flattener()]
        critic_input = critic_input or [Flattener()]
    kernel_init = variance_scaling_uniform(float(initializer_scale))
    actor = make_mlp_layers(
        [actor_width or width, *actor_hidden_sizes, actor_output_size],
        rngs,
        activation,
        activation_last_layer=False,
        kernel_init=kernel_init,
        bias_init=zeros,
    )
    critic = make_mlp_layers(
        [critic_width or width, *critic_hidden_sizes, n_values],
        rngs,
        activation,
        activation_last_layer=False,
        kernel_init=kernel_init,
        bias_init=zeros,
    )
    adapter = PPOAdapter(
        action=Sequential([*actor_input, *actor, sampler]),
        value=Sequential([*critic_input, *critic, *value_split]),
    )
    preprocessing: list[StatefulModule] = []
    if normalize_obs:
        preprocessing.append(
            Normalizer(dict(obs_size) if isinstance(obs_size, Mapping) else obs_size)
        )
    if isinstance(obs_size, Mapping) and not (actor_input or critic_input):
        preprocessing.append(Flattener())
    if not preprocessing:
        return adapter
    return Sequential([*preprocessing, adapter])


def make_lstm_actor_critic(
    obs_size: int,
    action_size: int,
    hidden_size: int,
    rngs: nnx.Rngs,
    *,
    discrete: bool = False,
    activation: Activation | str = nnx.relu,
    normalize_obs: bool = True,
    entropy_weight: float = 1e-2,
    reward_keys: Sequence[str] | None = None,
) -> StatefulModule:
    """A recurrent actor-critic: an encoder and an LSTM shared by two linear heads.

    The network is::

        Sequential([
            Normalizer(obs_size),                       # if normalize_obs
            Dense(obs_size, hidden_size, activation),
            LSTM(hidden_size, hidden_size),
            PPOAdapter(
                action=Sequential([Dense(hidden_size, n_out), sampler]),
                value=Dense(hidden_size, 1),
            ),
        ])

    with a :class:`~nnx_ppo.networks.sampling_layers.CategoricalSampler` over
    ``action_size`` actions when ``discrete``, else a
    :class:`~nnx_ppo.networks.sampling_layers.NormalTanhSampler` of width
    ``action_size``. The LSTM's carry is reset when an episode ends. For a dict
    reward (one entry per objective), ``reward_keys`` are its keys: the value head
    then returns a dict of ``(B,)`` values by these keys.
    """
    owner = "make_lstm_actor_critic"
    require_int(owner, "obs_size", obs_size)
    require_int(owner, "action_size", action_size)
    require_int(owner, "hidden_size", hidden_size)
    discrete = require_bool(owner, "discrete", discrete)
    normalize_obs = require_bool(owner, "normalize_obs", normalize_obs)
    if discrete:
        _require_choices(owner, "action_size", action_size)
    activation = _resolve_activation(owner, activation)
    n_values, value_split = _value_split(owner, reward_keys)
    sampler: ActionSampler
    if discrete:
        sampler, n_out = CategoricalSampler(rngs, entropy_weight=entropy_weight), action_size
    else:
        sampler, n_out = NormalTanhSampler(rngs, entropy_weight=entropy_weight), 2 * action_size
    layers: list[StatefulModule] = [Normalizer(obs_size)] if normalize_obs else []
    layers += [
        Dense(obs_size, hidden_size, rngs, activation=activation),
        LSTM(hidden_size, hidden_size, rngs),
        PPOAdapter(
            action=Sequential([Dense(hidden_size, n_out, rngs), sampler]),
            value=Sequential([Dense(hidden_size, n_values, rngs), *value_split])
            if value_split
            else Dense(hidden_size, 1, rngs),
        ),
    ]
    return Sequential(layers)


def _width(owner: str, name: str, size: Any) -> int:
    """An observation width from Playground's ``observation_size`` (``name`` the entry
    read): an int or a shape."""
    if isinstance(size, Mapping):
        raise TypeError(
            f"{owner}: {name} is the dict {dict(size)!r}; the preset networks read one "
            "observation leaf (an int or a shape) per dict entry, one per agent for dict "
            "actions. Build the network yourself for nested dict observations (see the "
            "layers page)."
        )
    if isinstance(size, tuple | list):
        width = 1
        for dim in size:
            width *= require_int(owner, f"{name} entry", dim)
        return width
    return require_int(owner, name, size)


def _flat(size: Any) -> bool:
    """Whether an observation declared as ``size`` (an int or a shape) is ``(B, width)``."""
    return not isinstance(size, tuple | list) or len(size) == 1


def _observation_flattener(obs_size: Any) -> Flattener | None:
    """What reshapes observations to the ``(B, width)`` entries the presets read: a
    shape of another rank than one (an image, a scalar) is flattened, a dict entry by
    entry; ``None`` where every entry is flat already."""
    if isinstance(obs_size, Mapping):
        return None if all(map(_flat, obs_size.values())) else Flattener(preserve_levels=1)
    return None if _flat(obs_size) else Flattener()


def _require_one_action(owner: str, name: str, size: Any) -> None:
    """``size`` describes one action leaf (an int or a shape), not a tuple or dict of actions."""
    if isinstance(size, Mapping):
        raise TypeError(
            f"{owner}: {name} is {dict(size)!r}, a dict of actions; the preset networks "
            "take a dict action as one action per agent, and each agent's action must be "
            "one leaf (an int or (n,)). Build the network yourself (see the layers page)."
        )
    if isinstance(size, tuple | list) and not all(isinstance(dim, int) for dim in size):
        raise TypeError(
            f"{owner}: {name} is {size!r}, a tuple of actions; the preset networks "
            "sample one action, or a dict of them (one actor per entry). Describe the "
            "action as a dict, or build the network yourself (see the layers page)."
        )


def _action_width(owner: str, name: str, size: Any, discrete: bool) -> int:
    """An action leaf's width from ``action_size``: an int, or a shape of one axis."""
    _require_one_action(owner, name, size)
    if isinstance(size, tuple | list) and not discrete:
        if len(size) != 1:
            raise TypeError(
                f"{owner}: {name} is the shape {tuple(size)!r}; the preset networks "
                "sample actions of one axis, (action_size,) per leaf"
            )
        size = size[0]
    return require_int(owner, name, size)


_DEFAULT_MLP_SIZES = (64, 64)
_DEFAULT_LSTM_WIDTH = 64


def make_default_network(
    env: Any,
    rngs: nnx.Rngs,
    *,
    kind: str = "auto",
    hidden_sizes: Sequence[int] | None = None,
    activation: Activation | str = nnx.tanh,
    entropy_weight: float | None = None,
) -> StatefulModule:
    """The preset network for an environment, chosen from its observation and action spec.

    - ``kind="lstm"``, or ``"auto"`` for an env with ``requires_memory`` (the
      built-in ``memory`` task): :func:`make_lstm_actor_critic`, on a flat
      observation, its one hidden size (``hidden_sizes`` of one entry; ``[64]``
      by default) the width of its encoder and its LSTM;
    - dict actions (one entry per agent, e.g. ``two_agent``): one MLP actor and one
      MLP critic per entry, on that entry's observation, so values are per agent
      (the env's reward must be a dict with the same keys, checked on a traced
      ``reset``);
      each actor samples its entry's kind of action (``discrete_actions`` may be
      a dict of bools);
    - ``env.discrete_actions``: :func:`make_discrete_mlp_actor_critic`;
    - otherwise (Playground envs included): :func:`make_mlp_actor_critic`.

    These presets with one action give their one critic a value per reward leaf
    (``reward_keys``): one value for one reward, a dict of values for a flat dict of
    rewards by str keys (one per objective, read on a traced ``reset``). One action
    then has several advantages: train with ``PPOConfig(combine_advantages=True)``.
    Another reward tree (nested, a tuple) is a ``ValueError``: build the network
    yourself.

    A dict observation with ``state`` and ``privileged_state`` entries (MuJoCo
    Playground's asymmetric envs) gives the actor ``state`` alone and the critic
    ``privileged_state`` alone, as Brax PPO's defaults for those envs do: the policy
    never reads what only the simulator knows. Other dict observations are read
    whole by both.

    An observation declared with a shape of another rank than one (an image
    ``(H, W, C)``, a scalar ``()``) is flattened first, a dict's entries each on its
    own (:class:`~nnx_ppo.networks.utils.Flattener`); a dict observation's entry that
    is itself a dict is a ``TypeError`` naming it (build that network yourself), and
    so are dict actions keyed by other than str. Each action leaf is an int or a
    one-axis shape ``(n,)``; a tuple of actions, or an action of several axes, is a
    ``TypeError`` (describe it as a dict, or build the network yourself), and so is
    an agent's entry of dict actions that is itself a dict of actions (build it
    yourself).

    The MLPs use ``hidden_sizes`` (``[64, 64]`` by default) for actor and critic
    alike, and every preset
    normalises observations. ``entropy_weight`` sets the action sampler's entropy
    bonus; ``None`` keeps each factory's default (``1e-2``; ``1e-3`` for the
    continuous per-agent actors).
    """
    owner = "make_default_network"
    require_env(owner, env, needs=())
    if kind not in ("auto", "mlp", "lstm"):
        raise ValueError(f"{owner}: kind must be 'auto', 'mlp' or 'lstm', got {kind!r}")
    hidden = None if hidden_sizes is None else require_sizes(owner, "hidden_sizes", hidden_sizes)
    if hidden == []:
        raise ValueError(f"{owner}: hidden_sizes is empty")
    flattener = _observation_flattener(env.observation_size)
    network = _preset(owner, env, rngs, kind, hidden, activation, entropy_weight)
    return network if flattener is None else Sequential([flattener, network])


def _preset(
    owner: str,
    env: Any,
    rngs: nnx.Rngs,
    kind: str,
    hidden: list[int] | None,
    activation: Activation | str,
    entropy_weight: float | None,
) -> StatefulModule:
    """:func:`make_default_network`'s choice, on observations flattened to ``(B, width)``;
    ``hidden`` ``None`` for the preset's own sizes."""
    obs_size, action_size = env.observation_size, env.action_size
    flags = discrete_action_flags(env)
    discrete = all(flags)
    entropy = 1e-2 if entropy_weight is None else entropy_weight
    if not isinstance(action_size, Mapping):
        action_size = _action_width(owner, "action_size", action_size, discrete)
    if kind == "lstm" or (kind == "auto" and getattr(env, "requires_memory", False)):
        why = "kind='lstm'" if kind == "lstm" else "chosen because env.requires_memory"
        if isinstance(obs_size, Mapping):
            raise TypeError(
                f"{owner}: the LSTM preset ({why}) reads one flat observation, but "
                f"observation_size is the dict {obs_size!r}. Flatten the observation in a "
                "wrapper, or build a recurrent network of your own (see the layers page)."
            )
        if isinstance(action_size, Mapping):
            raise TypeError(
                f"{owner}: the LSTM preset ({why}) samples one action, but action_size is "
                f"the dict {dict(action_size)!r}: build a recurrent network of your own "
                "(see the layers page)."
            )
        if hidden is not None and len(hidden) != 1:
            raise ValueError(
                f"{owner}: the LSTM preset ({why}) has one hidden size, the width of its "
                f"encoder and its LSTM, but hidden_sizes is {hidden}: give one, e.g. "
                f"[{hidden[0]}], or build a recurrent network of your own (see the layers "
                "page)."
            )
        return make_lstm_actor_critic(
            _width(owner, "observation_size", obs_size),
            action_size,
            _DEFAULT_LSTM_WIDTH if hidden is None else hidden[0],
            rngs,
            discrete=discrete,
            activation=activation,
            entropy_weight=entropy,
            reward_keys=_objective_keys(owner, env),
        )
    hidden = list(_DEFAULT_MLP_SIZES) if hidden is None else hidden
    if isinstance(action_size, Mapping):
        not_str = [key for key in action_size if not isinstance(key, str)]
        if not_str:
            raise TypeError(
                f"{owner}: action_size's keys {not_str!r} are not str; the per-agent preset "
                "names each agent's actor, critic and metrics by its key, a str. Key the "
                "env's observations, actions and rewards by str (e.g. 'agent_0')."
            )
        for key, size in action_size.items():
            _require_one_action(owner, f"action_size[{key!r}]", size)
        _require_reward_per_agent(owner, env, action_size)
        per_key = dict(zip(sorted(action_size), flags, strict=True))  # JAX's dict order
        return _per_agent_actor_critic(
            owner, obs_size, action_size, hidden, rngs, per_key, activation, entropy_weight
        )
    keys: dict[str, Any] = {}
    if isinstance(obs_size, Mapping):
        obs_size = {
            key: _width(owner, f"observation_size[{key!r}]", size) for key, size in obs_size.items()
        }
        if set(_ASYMMETRIC_KEYS.values()) <= set(obs_size):
            keys = {f"{side}_obs_keys": (key,) for side, key in _ASYMMETRIC_KEYS.items()}
    else:
        obs_size = _width(owner, "observation_size", obs_size)
    factory = make_discrete_mlp_actor_critic if discrete else make_mlp_actor_critic
    return factory(
        obs_size,
        action_size,
        hidden,
        hidden,
        rngs,
        activation=activation,
        entropy_weight=entropy,
        reward_keys=_objective_keys(owner, env),
        **keys,
    )


_ASYMMETRIC_KEYS = {"actor": "state", "critic": "privileged_state"}
"""MuJoCo Playground's asymmetric observation: what the policy may see, and what the
critic alone sees (Brax PPO's ``policy_obs_key``/``value_obs_key``)."""


def _traced_reward(env: Any) -> Any:
    """The env's reward tree, read off a traced ``env.reset`` (nothing is computed; the
    shapes are kept for training's programs); ``None`` where the env has no reset that
    traces, or one that breaks the contract: training names that."""
    try:
        return single_state_shapes(env).reward
    except Exception:
        return None


def _objective_keys(owner: str, env: Any) -> tuple[str, ...] | None:
    """The keys of a dict reward (one entry per objective), for the preset's one critic
    to return a value per entry; ``None`` for one reward."""
    reward = _traced_reward(env)
    if reward is None or _is_leaf(reward):
        return None
    if (
        isinstance(reward, Mapping)
        and reward
        and all(isinstance(key, str) and _is_leaf(leaf) for key, leaf in reward.items())
    ):
        return tuple(sorted(reward))
    raise ValueError(
        f"{owner}: the preset's critic returns one value per reward leaf for one reward, "
        "or for a flat dict of rewards by str keys (one per objective); this env's "
        f"reward is the tree {jax.tree.structure(reward)}. Build the network yourself, "
        "with a value port shaped like the reward (see the layers page)."
    )


def _is_leaf(tree: Any) -> bool:
    return jax.tree_util.all_leaves([tree])


def _require_reward_per_agent(owner: str, env: Any, action_size: Mapping[str, Any]) -> None:
    """Per-agent critics need one reward per agent: a dict reward with the actions' keys
    (read off a traced ``env.reset``, where the env has one)."""
    reward = _traced_reward(env)
    if reward is None:
        return
    if isinstance(reward, Mapping) and set(reward) == set(action_size):
        return
    if isinstance(reward, Mapping):
        found = f"a dict of rewards with keys {sorted(map(str, reward))}"
    else:
        found = f"one reward of shape {tuple(getattr(reward, 'shape', ()))}"
    raise ValueError(
        f"{owner}: dict actions {sorted(action_size)} are taken as one per agent, each "
        f"with a critic of its own, which needs one reward per agent (a dict with the same "
        f"keys); this env returns {found}. For one agent acting through a dict of actions, "
        "build the network yourself, with one critic (see the layers page)."
    )


def _per_agent_actor_critic(
    owner: str,
    obs_size: Any,
    action_size: Mapping[str, Any],
    hidden: list[int],
    rngs: nnx.Rngs,
    discrete: Mapping[str, bool],
    activation: Activation | str,
    entropy_weight: float | None,
) -> StatefulModule:
    if not isinstance(obs_size, Mapping) or set(obs_size) != set(action_size):
        raise ValueError(
            f"{owner}: dict actions {sorted(action_size)} need dict observations with the "
            f"same keys, got observation_size={obs_size!r}"
        )
    activation = _resolve_activation(owner, activation)
    widths = {
        key: _width(owner, f"observation_size[{key!r}]", size) for key, size in obs_size.items()
    }
    actors: dict[str, StatefulModule] = {}
    critics: dict[str, StatefulModule] = {}
    for key, size in action_size.items():
        width = _action_width(owner, f"action_size[{key!r}]", size, discrete[key])
        sampler: ActionSampler
        if discrete[key]:
            weight = 1e-2 if entropy_weight is None else entropy_weight
            sampler, n_out = CategoricalSampler(rngs, entropy_weight=weight), width
        else:
            weight = 1e-3 if entropy_weight is None else entropy_weight
            sampler, n_out = NormalTanhSampler(rngs, entropy_weight=weight), 2 * width
        layers = make_mlp_layers([widths[key], *hidden, n_out], rngs, activation, False)
        actors[key] = Sequential([*layers, sampler])
        critics[key] = make_mlp([widths[key], *hidden, 1], rngs, activation, False)
    return Sequential([Normalizer(widths), PPOAdapter(action=Map(actors), value=Map(critics))])
