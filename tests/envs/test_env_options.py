"""Env options: ``make(name, **options)``, the run config's ``env_kwargs`` and ``--set``.

The Playground tests skip, with the reason, where the ``playground`` extra is absent.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging

import jax
import pytest

from nnx_ppo import envs
from nnx_ppo.cli.main import _build_parser, _make_env, _resolve_config, _simulator_backend

needs_playground = pytest.mark.skipif(
    importlib.util.find_spec("mujoco_playground") is None,
    reason="MuJoCo Playground is not installed (pip install 'nnx-ppo[playground]')",
)


def run_config(*argv: str) -> dict:
    args: argparse.Namespace = _build_parser().parse_args(["train", *argv])
    return _resolve_config(args)


def test_env_kwargs_reach_a_built_in_env_through_set():
    config = run_config(
        "--env", "memory", "--set", "env_kwargs.delay=7", "--set", "env_kwargs.n_cues=3"
    )
    assert config["env_kwargs"] == {"delay": 7, "n_cues": 3}
    env = _make_env(config)
    assert (env.delay, env.n_cues) == (7, 3)
    assert _simulator_backend(config) is None  # not a Playground env


def test_a_bad_env_option_is_named_by_the_env():
    config = run_config("--set", "env_kwargs.max_steps=0")
    with pytest.raises(ValueError, match="CartPole: max_steps"):
        _make_env(config)


def test_playground_backend_is_none_for_a_built_in_name():
    assert envs.playground_backend("cartpole") is None


@needs_playground
def test_playground_gets_the_jax_backend_on_cpu_unless_told(caplog):
    assert jax.default_backend() == "cpu"
    assert envs.playground_backend("CartpoleBalance") == "jax"
    with caplog.at_level(logging.INFO, logger="nnx_ppo.envs"):
        env = envs.make("CartpoleBalance")
    assert env._config.impl == "jax"
    assert "CartpoleBalance: simulator backend impl=jax" in caplog.text
    chosen = envs.make("CartpoleBalance", impl="warp", episode_length=500)
    assert (chosen._config.impl, chosen._config.episode_length) == ("warp", 500)
    overridden = envs.make("CartpoleBalance", config_overrides={"impl": "warp"})
    assert overridden._config.impl == "warp"


@needs_playground
def test_playground_options_through_set_and_unknown_fields_named():
    config = run_config("--env", "CartpoleBalance", "--set", "env_kwargs.episode_length=300")
    assert _make_env(config)._config.episode_length == 300
    assert "impl=jax (the fastest on cpu" in _simulator_backend(config)
    told = run_config("--env", "CartpoleBalance", "--set", "env_kwargs.impl=warp")
    assert _simulator_backend(told) == "simulator backend impl=warp (set by env_kwargs.impl)"
    with pytest.raises(ValueError, match="flavour is not a field of its Playground config"):
        envs.make("CartpoleBalance", flavour=3)
