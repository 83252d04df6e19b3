"""Env options: ``make(name, **options)``, the run config's ``env_kwargs`` and ``--set``.

The Playground tests skip, with the reason, where the ``playground`` extra is absent.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
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


def test_set_env_picks_that_envs_preset_and_an_object_value_sets_its_keys():
    assert run_config("--set", "env=pendulum") == run_config("--env", "pendulum")
    config = run_config("--steps", "204800", "--set", 'eval={"every_steps": 8192}')
    assert config["train"]["eval"]["every_steps"] == 8192  # not the run length's cadence
    assert run_config("--steps", "204800")["train"]["eval"]["every_steps"] != 8192


def test_a_bad_env_option_is_named_by_the_env():
    config = run_config("--set", "env_kwargs.max_steps=0")
    with pytest.raises(ValueError, match="CartPole: max_steps"):
        _make_env(config)


def test_an_option_a_built_in_env_lacks_is_named_with_those_it_has():
    with pytest.raises(
        ValueError,
        match="make\\('memory'\\): dealy is not an option of this env; its options: n_cues, delay",
    ):
        envs.make("memory", dealy=3)
    with pytest.raises(ValueError, match="cues, delays are not options of this env"):
        envs.make("memory", delays=3, cues=2)


def test_count_options_may_be_whole_floats_as_in_0_3_0():
    env = envs.make("cartpole", max_steps=3.0)
    assert env.max_steps == 3 and type(env.max_steps) is int
    assert envs.make("memory", n_cues=3.0, delay=0.0).n_cues == 3
    with pytest.raises(TypeError, match=r"CartPole: max_steps must be an int, got float 3\.5"):
        envs.make("cartpole", max_steps=3.5)
    # Every whole number is taken, whatever its float type (np.float32 was refused).
    for whole in (np.float32(3.0), np.array(3.0), jnp.asarray(3.0), np.int16(3), jnp.asarray(3)):
        assert envs.make("cartpole", max_steps=whole).max_steps == 3
    with pytest.raises(TypeError, match=r"max_steps must be an int, got"):
        envs.make("cartpole", max_steps=np.float32(3.5))


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
    from mujoco_playground import registry

    config = registry.get_default_config("CartpoleBalance")
    config.impl = "warp"
    assert envs.make("CartpoleBalance", config=config)._config.impl == "warp"


@needs_playground
def test_playground_options_through_set_and_unknown_fields_named():
    config = run_config("--env", "CartpoleBalance", "--set", "env_kwargs.episode_length=300")
    assert _make_env(config)._config.episode_length == 300
    assert "impl=jax (the fastest on cpu" in _simulator_backend(config)
    told = run_config("--env", "CartpoleBalance", "--set", "env_kwargs.impl=warp")
    assert _simulator_backend(told) == "simulator backend impl=warp (set by env_kwargs)"
    told = run_config(
        "--env", "CartpoleBalance", "--set", 'env_kwargs.config_overrides={"impl": "warp"}'
    )
    assert _simulator_backend(told) == "simulator backend impl=warp (set by env_kwargs)"
    with pytest.raises(ValueError, match="flavour is not a field of its Playground config"):
        envs.make("CartpoleBalance", flavour=3)
    # A table for a sub-config changes its fields one by one: the others keep their defaults.
    vision = envs.make("CartpoleBalance", vision_config={"nworld": 4})._config.vision_config
    assert vision.nworld == 4 and tuple(vision.cam_res) == (64, 64)


@needs_playground
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="vision runs with Warp on a GPU")
def test_vision_on_the_cpu_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from nnx_ppo.cli.main import main

    argv = ["train", "--env", "CartpoleBalance", "--set", "env_kwargs.vision=true"]
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    said = capsys.readouterr()
    assert "Traceback" not in said.err and said.out == ""
    assert said.err.count("error:") == 1 and "MuJoCo Warp" in said.err
    assert "{'vision': True} cannot run on this machine's cpu backend" in said.err


class _Table(dict):
    """A sub-config, as Playground's ConfigDict is one: updated key by key."""

    def update_from_flattened_dict(self, flattened: dict) -> None:
        raise NotImplementedError  # read by make only as the mark of a table


class RecordingRegistry:
    """A Playground registry that keeps the overrides its ``load`` is given."""

    ALL_ENVS = ("Walker",)
    loaded: ClassVar[dict] = {}

    @staticmethod
    def get_default_config(name: str) -> _Table:
        return _Table(sim_dt=0.01, reward=_Table(scales=_Table(speed=1.0, energy=0.1)))

    @staticmethod
    def load(name: str, config: object = None, config_overrides: dict | None = None) -> str:
        RecordingRegistry.loaded = dict(config_overrides or {})
        return "env"


def test_playground_overrides_reach_it_as_dotted_fields_each_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Playground sets a nested dict as a sub-config's whole value: the other reward
    # scales were dropped, and a misspelt one was taken.
    monkeypatch.setattr(envs, "_playground_registry", lambda: RecordingRegistry)
    envs.make("Walker", reward={"scales": {"speed": 2.0}}, config_overrides={"sim_dt": 0.02})
    assert RecordingRegistry.loaded == {"reward.scales.speed": 2.0, "sim_dt": 0.02}
    misspelt = r"reward.scales.sped is not a field .*; the fields of reward.scales: energy, speed"
    with pytest.raises(ValueError, match=misspelt):
        envs.make("Walker", reward={"scales": {"sped": 2.0}})
    with pytest.raises(ValueError, match=r"sim_dt of its Playground config is a value, not a"):
        envs.make("Walker", config_overrides={"sim_dt.x": 1})
    with pytest.raises(ValueError, match=r"config must be a whole Playground ConfigDict"):
        envs.make("Walker", config={"sim_dt": 0.02})


class OfflineRegistry:
    """Playground's registry on a machine without internet access: its robot env's
    load fails in the ``git clone`` of MuJoCo Menagerie, as Playground 0.2 raises it."""

    ALL_ENVS = ("Go1Getup",)

    @staticmethod
    def get_default_config(name: str) -> dict:
        return {"episode_length": 1000}

    @staticmethod
    def load(name: str, config: object = None, config_overrides: object = None) -> None:
        raise subprocess.CalledProcessError(128, ["git", "clone"])


def test_a_failed_menagerie_download_says_where_to_put_menagerie(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(envs, "_playground_registry", lambda: OfflineRegistry)
    with pytest.raises(OSError, match=r"Go1Getup needs MuJoCo Menagerie") as raised:
        envs.make("Go1Getup")
    message = str(raised.value)
    assert "git clone exited with 128" in message
    assert "clone https://github.com/google-deepmind/mujoco_menagerie into" in message
    assert isinstance(raised.value.__cause__, subprocess.CalledProcessError)
    # The CLI prints it as an error and exits 2, with no traceback.
    from nnx_ppo.cli.main import main

    run_dir = tmp_path / "run"
    assert main(["train", "--env", "Go1Getup", "--steps", "64", "--run-dir", str(run_dir)]) == 2
    shown = capsys.readouterr().err
    assert "error: Go1Getup needs MuJoCo Menagerie" in " ".join(shown.split())


class _MjSpec:
    """Stands for ``mujoco._specs.MjSpec`` of a MuJoCo version Playground was not written for."""

    __module__ = "mujoco._specs"


class MismatchedMujocoRegistry(OfflineRegistry):
    """Playground 0.2.0's registry with mujoco 3.17.0: building the Reacher envs asks
    MuJoCo's ``MjSpec`` for a method that version lacks."""

    ALL_ENVS = ("ReacherEasy", "Broken")

    @staticmethod
    def load(name: str, config: object = None, config_overrides: object = None) -> None:
        if name == "Broken":  # a bug of the env's own, not a MuJoCo API mismatch
            raise AttributeError("'NoneType' object has no attribute 'qpos'", obj=None)
        raise AttributeError(
            "'mujoco._specs.MjSpec' object has no attribute 'find_body'", obj=_MjSpec()
        )


def test_a_mujoco_that_playground_was_not_written_for_is_named_with_the_versions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(envs, "_playground_registry", lambda: MismatchedMujocoRegistry)
    with pytest.raises(ImportError, match=r"MuJoCo Playground cannot build ReacherEasy") as raised:
        envs.make("ReacherEasy")
    message = str(raised.value)
    assert "has no attribute 'find_body'" in message
    assert "mujoco " in message and "mujoco-mjx " in message  # each with its version
    assert isinstance(raised.value.__cause__, AttributeError)
    # Any other AttributeError is the env's own and passes through unchanged.
    with pytest.raises(AttributeError, match="no attribute 'qpos'"):
        envs.make("Broken")
    from nnx_ppo.cli.main import main

    run_dir = tmp_path / "run"
    assert main(["train", "--env", "ReacherEasy", "--steps", "64", "--run-dir", str(run_dir)]) == 2
    assert "error: MuJoCo Playground cannot build ReacherEasy" in " ".join(
        capsys.readouterr().err.split()
    )
    monkeypatch.setenv("COLUMNS", "400")  # each row on one line
    assert main(["envs"]) == 0
    listed = " ".join(capsys.readouterr().out.split())
    assert "unavailable: MuJoCo Playground cannot build ReacherEasy" in listed


class _MujocoWarningHandler:
    """Stands for the ``mujoco`` module's one global warning handler."""

    def __init__(self) -> None:
        self.handler: Callable[[str], None] | None = None

    def get_mju_user_warning(self) -> Callable[[str], None] | None:
        return self.handler

    def set_mju_user_warning(self, handler: Callable[[str], None] | None) -> None:
        self.handler = handler


def test_mujoco_warnings_while_a_playground_env_is_built_are_logged_not_printed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mujoco = _MujocoWarningHandler()
    outer = mujoco.handler = lambda message: None  # a handler of the user's own

    class DeprecatedModelRegistry(OfflineRegistry):
        ALL_ENVS = ("CheetahRun",)

        @staticmethod
        def load(name: str, config: object = None, config_overrides: object = None) -> str:
            handler = mujoco.get_mju_user_warning()
            assert handler is not None and handler is not outer
            handler("compiler attribute 'settotalmass' is deprecated")  # as MuJoCo's compiler
            return "env"

    monkeypatch.setitem(sys.modules, "mujoco", mujoco)
    monkeypatch.setattr(envs, "_playground_registry", lambda: DeprecatedModelRegistry)
    with caplog.at_level(logging.INFO, logger="nnx_ppo.envs"):
        assert envs.make("CheetahRun") == "env"
    assert "CheetahRun: MuJoCo warned: compiler attribute 'settotalmass' is deprecated" in (
        caplog.text
    )
    assert mujoco.handler is outer  # restored


@needs_playground
def test_a_playground_model_that_warns_leaves_no_mujoco_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="nnx_ppo.envs"):
        envs.make("CheetahRun")  # its XML uses the deprecated `settotalmass`
    assert "MuJoCo warned" in caplog.text
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
