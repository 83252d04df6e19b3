"""The run configuration of the ``nnx-ppo`` command: env, network preset and TrainConfig.

A run configuration is a JSON-ready dict::

    {
      "env": "cartpole",
      "episode_length": null,          # wrap the env in an EpisodeWrapper of this length
      "env_kwargs": {},                # options of nnx_ppo.envs.make, e.g. {"impl": "warp"}
      "network": {"kind": "auto", "hidden_sizes": null, "activation": "tanh",
                  "entropy_weight": null},  # null: the network's default sizes, bonus
      "train": {...}                   # a TrainConfig, as checkpointing.config_to_dict writes it
    }

Each built-in env, and each Playground env with a file in ``preset_files/``, has a
preset tuned to converge within minutes on two CPU cores (other Playground envs
share ``playground.toml``); ``--config FILE`` and ``--set key=value`` override
any part of it. Unless
set, the evaluation and checkpoint cadences follow the run's length: about ten
evaluations and five checkpoints per run, on whole PPO steps.
"""

import copy
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nnx_ppo.algorithms.checkpointing import config_from_dict, config_to_dict
from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.contract.arguments import as_whole
from nnx_ppo.networks.factories import ACTIVATIONS

__all__ = [
    "FIXED_ON_RESUME",
    "apply_override",
    "cadences_set_by_hand",
    "changed_on_resume",
    "fixed_on_resume",
    "follow_run_length",
    "is_factory_name",
    "leaf_keys",
    "lookup",
    "merge",
    "parse_override",
    "parse_run_config",
    "preset",
    "preset_names",
    "preset_path",
    "read_config_file",
    "read_utf8",
]

EVALUATIONS_PER_RUN = 10
CHECKPOINTS_PER_RUN = 5
_CADENCES = ("train.eval.every_steps", "train.checkpoint_every_steps")

FIXED_ON_RESUME = (
    "env",
    "env_kwargs",
    "episode_length",
    "network.kind",
    "network.hidden_sizes",
    "network.activation",
    "train.ppo.n_envs",
    "train.ppo.gradient_clipping",
    "train.ppo.weight_decay",
    "train.ppo.learning_rate_schedule",
    "train.seed",
)
"""Settings that shape the saved state or its random streams: a resumed run keeps them
(clipping and weight decay: on or off, each a stage of the optimizer's chain). The
checkpoint holds the run's keys, so a new seed would reseed only its evaluations and
leave ``config.json`` naming a seed the run never trained with."""

_ON_OR_OFF = frozenset({"train.ppo.gradient_clipping", "train.ppo.weight_decay"})
"""Of :data:`FIXED_ON_RESUME`, those whose value may change but not whether it is set."""

_UNSET_MEANS = {"env_kwargs": {}}
"""Of :data:`FIXED_ON_RESUME`, those a run's ``config.json`` may lack, and their value then."""


def fixed_on_resume() -> str:
    """:data:`FIXED_ON_RESUME` in words, for messages."""
    return ", ".join(
        key.removeprefix("train.") + (" (on or off)" if key in _ON_OR_OFF else "")
        for key in FIXED_ON_RESUME
    )


PRESET_DIR = Path(__file__).with_name("preset_files")
"""The preset files, one TOML run configuration per env kind (``nnx-ppo preset NAME``)."""

GENERIC_PRESET = "playground"
"""The preset of a Playground env without a file of its own."""

_CLI_LOGGING = (
    LoggingLevel.LOSSES
    | LoggingLevel.ACTOR_EXTRA
    | LoggingLevel.CRITIC_EXTRA
    | LoggingLevel.ROLLOUT_STATS
    | LoggingLevel.GRAD_NORM
    | LoggingLevel.THROUGHPUT
)
"""What ``nnx-ppo train`` logs unless a config says otherwise."""


def is_factory_name(env_name: str) -> bool:
    """``MODULE:FACTORY``: a user's env, built by calling what it names with ``env_kwargs``."""
    return ":" in env_name


def preset_path(env_name: str) -> Path:
    """The preset file for ``env_name``: its own, else the generic Playground one."""
    own = PRESET_DIR / f"{env_name}.toml"
    return own if own.is_file() else PRESET_DIR / f"{GENERIC_PRESET}.toml"


def preset_names() -> list[str]:
    """The names of the preset files: env names, and the generic ``playground``."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.toml"))


def preset(env_name: str) -> dict[str, Any]:
    """The run configuration preset for ``env_name``.

    The library's defaults (with the CLI's logging), overridden by the env's
    preset file (:func:`preset_path`); the evaluation and checkpoint cadences
    the file does not set follow the run's length. A user's env
    (``MODULE:FACTORY``) has no preset file: it starts from the defaults.
    """
    settings = {} if is_factory_name(env_name) else read_config_file(preset_path(env_name))
    settings.pop("env", None)
    base = {
        "env": env_name,
        "episode_length": None,
        "env_kwargs": {},
        "network": {
            "kind": "auto",
            "hidden_sizes": None,  # the preset network's: [64, 64] for an MLP, [64] an LSTM
            "activation": "tanh",
            "entropy_weight": None,
        },
        "train": config_to_dict(TrainConfig(ppo=PPOConfig(logging_level=_CLI_LOGGING), seed=0)),
    }
    return follow_run_length(merge(base, settings), set(leaf_keys(settings)))


_SECTIONS = frozenset({"network", "train", "train.ppo", "train.eval", "train.video"})
"""The tables that group settings: a value in place of one is a mistaken key."""

_FREE_FORM = frozenset({"env_kwargs", "train.video.render_kwargs"})
"""Tables whose keys are the env's own options (of making it, of rendering it), checked
by the env rather than here."""


def merge(base: dict[str, Any], update: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``base`` with ``update`` merged in, recursively; unknown keys are an error
    (except inside ``env_kwargs``, whose keys ``nnx_ppo.envs.make`` checks, and
    ``train.video.render_kwargs``, the env's ``render``'s)."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        name = f"{where}{key}"
        if any(where.startswith(f"{table}.") for table in _FREE_FORM):
            # An env's nested option table merges key by key too: two --set inside it
            # (or a file's table and a --set) keep both.
            current = merged.get(key)
            if isinstance(current, dict) and isinstance(value, dict):
                merged[key] = merge(current, value, f"{name}.")
            else:
                merged[key] = copy.deepcopy(value)
            continue
        if key not in merged:
            nested = [f"{section}.{key}" for section in ("train", "train.ppo", "train.eval")
                      if key in (lookup(merged, section) or {})]  # fmt: skip
            hint = f" (did you mean {nested[0]}?)" if nested and not where else ""
            raise ValueError(f"unknown config key {name!r}{hint}; known here: {sorted(merged)}")
        if isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge(merged[key], value, f"{name}.")
        elif name in _SECTIONS and not isinstance(value, dict):
            example = next(leaf_keys(merged[key], f"{name}."), f"{name}.key")
            raise ValueError(
                f"config key {name!r} is a table, not a value: set its keys, e.g. {example}=..."
            )
        else:
            merged[key] = value
    return merged


def read_utf8(path: Path) -> str:
    """``path``'s text; a file that is not UTF-8 is a ``ValueError`` naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text: byte {error.object[error.start]:#04x} at position "
            f"{error.start}"
        ) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """A run configuration (or part of one) from a JSON or TOML file."""
    if path.is_dir():
        raise IsADirectoryError(f"config file {path} is a directory; give a .toml or .json file")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    if path.suffix not in (".toml", ".json"):
        raise ValueError(f"config file {path} must be a .toml or .json file")
    text = read_utf8(path)
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path} is not valid TOML: {error}") from error
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold an object of config keys, got {type(data).__name__}")
    return data


def leaf_keys(config: dict[str, Any], where: str = "") -> Iterator[str]:
    """The dotted keys of every value in ``config`` that is not itself an object."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from leaf_keys(value, f"{where}{key}.")
        else:
            yield f"{where}{key}"


def follow_run_length(config: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """Evaluation and checkpoint cadences scaled to ``train.ppo.total_steps``.

    About ten evaluations and five checkpoints per run, each on a whole PPO step;
    a cadence in ``given`` (dotted keys the user set) is kept.
    """
    config = copy.deepcopy(config)
    # A count written 1e6 is the count 1000000 (parse_run_config takes it so too).
    total, n_envs, rollout_length = (
        as_whole(lookup(config, f"train.ppo.{key}"))
        for key in ("total_steps", "n_envs", "rollout_length")
    )
    if not all(_positive_int(value) for value in (total, n_envs, rollout_length)):
        return config  # parse_run_config names the bad or missing field
    per_step = n_envs * rollout_length
    for key, count in zip(_CADENCES, (EVALUATIONS_PER_RUN, CHECKPOINTS_PER_RUN), strict=True):
        *section, name = key.split(".")
        table = lookup(config, ".".join(section))
        if key not in given and isinstance(table, dict):
            table[name] = max(math.ceil(total / count / per_step), 1) * per_step
    return config


def cadences_set_by_hand(config: dict[str, Any]) -> set[str]:
    """The cadences of a run configuration that its length did not give: a user set them.

    A resumed run's other cadences follow its new length (:func:`follow_run_length`).
    """
    by_length = follow_run_length(config, set())
    return {key for key in _CADENCES if lookup(config, key) != lookup(by_length, key)}


def lookup(config: Any, key: str) -> Any:
    """The value at a dotted key, or None where the configuration has none."""
    for part in key.split("."):
        if not isinstance(config, dict):
            return None
        config = config.get(part)
    return config


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def parse_run_config(config: dict[str, Any]) -> tuple[dict[str, Any], TrainConfig]:
    """Check every field of a run configuration; return it normalised, with its TrainConfig.

    Raises:
      ValueError: a field of the wrong form, named with the form expected.
    """
    config = copy.deepcopy(config)
    if not isinstance(config.get("env"), str) or not config["env"]:
        raise ValueError(
            f"config field env must be an env name, got {json.dumps(config.get('env'))}"
        )
    options = config.setdefault("env_kwargs", {})
    if not isinstance(options, dict):
        raise ValueError(
            "config field env_kwargs must be an object of the env's options, e.g. "
            f'{{"impl": "warp"}}; got {json.dumps(options)}'
        )
    length = config["episode_length"] = as_whole(config.get("episode_length"))
    if length is not None and not _positive_int(length):
        raise ValueError(
            "config field episode_length must be a positive integer or null; "
            f"got {json.dumps(length)}"
        )
    network = config.get("network")
    if not isinstance(network, dict):
        raise ValueError(
            'config field network must be an object, e.g. {"kind": "mlp", "hidden_sizes": [64]}; '
            f"got {json.dumps(network)}"
        )
    if network.get("kind") not in ("auto", "mlp", "lstm"):
        raise ValueError(
            f'config field network.kind must be "auto", "mlp" or "lstm"; '
            f"got {json.dumps(network.get('kind'))}"
        )
    sizes = network.setdefault("hidden_sizes", None)
    if _positive_int(sizes):
        sizes = [sizes]
    if sizes is not None and (
        not isinstance(sizes, list) or not sizes or not all(_positive_int(n) for n in sizes)
    ):
        raise ValueError(
            "config field network.hidden_sizes must be a list of positive integers, e.g. "
            f"[64, 64], or null for the network's default; got "
            f"{json.dumps(network.get('hidden_sizes'))}"
        )
    network["hidden_sizes"] = sizes
    entropy = network.setdefault("entropy_weight", None)
    if entropy is not None and (
        isinstance(entropy, bool)
        or not isinstance(entropy, int | float)
        or not math.isfinite(entropy)
        or entropy < 0
    ):
        raise ValueError(
            "config field network.entropy_weight must be a finite number >= 0, or null for the "
            f"network's default; got {json.dumps(entropy)}"
        )
    if network.get("activation") not in ACTIVATIONS:
        raise ValueError(
            f"config field network.activation must be one of {', '.join(sorted(ACTIVATIONS))}; "
            f"got {json.dumps(network.get('activation'))}"
        )
    train = config_from_dict(config["train"])
    config["train"] = config_to_dict(train)
    return config, train


def changed_on_resume(
    saved: dict[str, Any], wanted: dict[str, Any], keys: Sequence[str] = FIXED_ON_RESUME
) -> list[str]:
    """The settings of ``keys`` (of :data:`FIXED_ON_RESUME`) that differ, as
    ``key is SAVED in the run, WANTED here``."""

    def fixed(config: dict[str, Any], key: str) -> Any:
        value = _at(config, key)
        if value is None:
            value = _UNSET_MEANS.get(key)
        if key in _ON_OR_OFF:  # off is None, or False (weight decay); 0.0 is on
            return value is not None and value is not False
        return value

    return [
        f"{key.removeprefix('train.')} is {json.dumps(_at(saved, key))} in the run, "
        f"{json.dumps(_at(wanted, key))} here"
        for key in keys
        if fixed(saved, key) != fixed(wanted, key)
    ]


def _at(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def parse_override(config: dict[str, Any], assignment: str) -> tuple[list[str], Any]:
    """The full key (as parts) and the value of one ``--set key=value``: a dotted key,
    and a JSON value (or a bare string).

    ``ppo.*``, ``eval.*``, ``seed`` and ``checkpoint_every_steps`` may omit the
    leading ``train.``: ``--set ppo.n_envs=64`` is ``--set train.ppo.n_envs=64``.
    """
    if "=" not in assignment:
        raise ValueError(f"--set expects key=value, got {assignment!r}")
    key, raw = assignment.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    parts = key.strip().split(".")
    if parts[0] in config["train"] and parts[0] not in config:
        parts = ["train", *parts]
    return parts, value


def apply_override(config: dict[str, Any], assignment: str) -> dict[str, Any]:
    """Apply one ``--set key=value`` (:func:`parse_override`)."""
    parts, value = parse_override(config, assignment)
    update: Any = value
    for part in reversed(parts):
        update = {part: update}
    return merge(config, update)
