"""The preset files: each loads into a valid run config, prints, and works as a --config file."""

import math
import tomllib
from pathlib import Path

import pytest
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.cli.main import _build_parser, _make_env_and_network, _resolve_config, main
from nnx_ppo.cli.presets import (
    GENERIC_PRESET,
    PRESET_DIR,
    apply_override,
    parse_run_config,
    preset,
    preset_names,
    preset_path,
)
from nnx_ppo.networks.sampling_layers import ActionSampler

BUILT_IN = ("cartpole", "pendulum", "memory", "two_agent")


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_file_is_a_valid_run_config(name: str) -> None:
    config, train_config = parse_run_config(preset(name))
    settings = tomllib.loads(preset_path(name).read_text())
    assert settings.get("env", name) == name
    for key, value in settings.get("train", {}).get("ppo", {}).items():
        assert getattr(train_config.ppo, key) == value, key
    assert config["network"]["kind"] == settings["network"]["kind"]


def test_each_built_in_env_has_its_own_preset_and_playground_names_share_one() -> None:
    for name in BUILT_IN:
        assert preset_path(name) == PRESET_DIR / f"{name}.toml"
    assert preset_path("HopperHop") == PRESET_DIR / f"{GENERIC_PRESET}.toml"
    assert preset("HopperHop")["env"] == "HopperHop"
    assert preset("HopperHop")["episode_length"] == 1000


def test_presets_scale_their_cadences_to_the_run_length() -> None:
    ppo = preset("cartpole")["train"]
    per_step = ppo["ppo"]["n_envs"] * ppo["ppo"]["rollout_length"]
    assert ppo["eval"]["every_steps"] % per_step == 0
    assert ppo["checkpoint_every_steps"] % per_step == 0
    assert ppo["ppo"]["total_steps"] // ppo["eval"]["every_steps"] in range(9, 11)


def test_the_preset_command_prints_the_file_and_refuses_unknown_names(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["preset", "pendulum"]) == 0
    assert capsys.readouterr().out == (PRESET_DIR / "pendulum.toml").read_text()
    # A Playground env without its own preset: the generic file, naming that env.
    monkeypatch.setattr(envs, "names", lambda: ("cartpole", "CheetahRun"))
    assert main(["preset", "CheetahRun"]) == 0
    printed = capsys.readouterr().out
    assert tomllib.loads(printed)["env"] == "CheetahRun"
    assert (
        printed.replace('env = "CheetahRun"\n', "") == (PRESET_DIR / "playground.toml").read_text()
    )
    assert main(["preset", "no_such_env"]) == 2
    shown = capsys.readouterr()
    assert shown.out == ""  # `nnx-ppo preset NAME > FILE` leaves no error text in FILE
    error = shown.err
    assert "no preset for 'no_such_env'" in error and "pendulum" in error


def test_a_copied_preset_file_resolves_to_the_same_config(tmp_path: Path) -> None:
    copied = tmp_path / "my.toml"
    copied.write_text((PRESET_DIR / "pendulum.toml").read_text())
    parser = _build_parser()
    from_file = _resolve_config(parser.parse_args(["train", "--config", str(copied)]))
    from_env = _resolve_config(parser.parse_args(["train", "--env", "pendulum"]))
    assert from_file == from_env


def test_entropy_weight_reaches_the_sampler_and_bad_values_are_named() -> None:
    config = apply_override(preset("cartpole"), "network.entropy_weight=0.05")
    config, _ = parse_run_config(config)
    _, network = _make_env_and_network(config)
    samplers = [m for _, m in nnx.iter_modules(network) if isinstance(m, ActionSampler)]
    assert [sampler.entropy_weight for sampler in samplers] == [0.05]
    config["network"]["entropy_weight"] = 0  # no entropy bonus is a setting, not an error
    assert parse_run_config(config)[0]["network"]["entropy_weight"] == 0
    for bad in (-1, "high", True, math.nan, math.inf):
        config["network"]["entropy_weight"] = bad
        with pytest.raises(ValueError, match=r"entropy_weight must be a finite number >= 0"):
            parse_run_config(config)


def test_keys_set_inside_one_nested_env_kwargs_table_are_all_kept(tmp_path: Path) -> None:
    parser = _build_parser()
    env = ["train", "--env", "my_envs:make"]
    two_sets = ["--set", "env_kwargs.physics.mass=2.0", "--set", "env_kwargs.physics.length=3.0"]
    resolved = _resolve_config(parser.parse_args([*env, *two_sets]))
    assert resolved["env_kwargs"] == {"physics": {"mass": 2.0, "length": 3.0}}
    config_file = tmp_path / "physics.toml"
    config_file.write_text("[env_kwargs.physics]\nmass = 2.0\nlength = 3.0\n")
    one_set = ["--config", str(config_file), "--set", "env_kwargs.physics.length=5.0"]
    resolved = _resolve_config(parser.parse_args([*env, *one_set]))
    assert resolved["env_kwargs"] == {"physics": {"mass": 2.0, "length": 5.0}}


def test_render_kwargs_take_the_envs_own_render_options(tmp_path: Path) -> None:
    # Checked against the default {height, width}: a camera was "an unknown config key".
    parser = _build_parser()
    camera = ["--set", "video.render_kwargs.camera=track"]
    resolved = _resolve_config(parser.parse_args(["train", "--env", "cartpole", *camera]))
    render_kwargs = resolved["train"]["video"]["render_kwargs"]
    assert render_kwargs == {"height": 480, "width": 640, "camera": "track"}
    config_file = tmp_path / "camera.toml"
    config_file.write_text('[train.video.render_kwargs]\ncamera = "side"\nheight = 240\n')
    resolved = _resolve_config(parser.parse_args(["train", "--config", str(config_file)]))
    render_kwargs = resolved["train"]["video"]["render_kwargs"]
    assert render_kwargs == {"height": 240, "width": 640, "camera": "side"}


def test_a_flag_is_compared_with_the_last_set_of_its_key_inside_an_object_too() -> None:
    # The object's 5000 is set again by the later --set: the run's value agrees with --steps.
    argv = ["train", "--steps", "6000", "--set", 'ppo={"total_steps": 5000, "n_envs": 8}',
            "--set", "ppo.total_steps=6000"]  # fmt: skip
    ppo = _resolve_config(_build_parser().parse_args(argv))["train"]["ppo"]
    assert (ppo["total_steps"], ppo["n_envs"]) == (6000, 8)


def test_cadences_a_user_set_are_kept_and_the_others_follow_a_resumed_runs_length(
    tmp_path: Path,
) -> None:
    import json

    parser = _build_parser()
    config_file = tmp_path / "cadence.json"
    config_file.write_text(json.dumps({"train": {"checkpoint_every_steps": 4096}}))
    resolved = _resolve_config(
        parser.parse_args(["train", "--config", str(config_file), "--steps", "500000",
                           "--set", "eval.every_steps=8192"])
    )["train"]  # fmt: skip
    assert (resolved["checkpoint_every_steps"], resolved["eval"]["every_steps"]) == (4096, 8192)
    scaled = _resolve_config(parser.parse_args(["train", "--steps", "500000"]))["train"]
    assert scaled["checkpoint_every_steps"] != 4096 and scaled["eval"]["every_steps"] != 8192

    def resume(*options: str) -> dict:
        return _resolve_config(parser.parse_args(["train", "--resume", str(run_dir), *options]))

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    original = _resolve_config(
        parser.parse_args(["train", "--steps", "50000", "--set", "checkpoint_every_steps=6144"])
    )
    (run_dir / "config.json").write_text(json.dumps(original))
    # Resumed as it was, nothing changes.
    assert resume() == original
    # Resumed for ten times the length: the evaluations follow it, the checkpoint
    # cadence the run set is kept.
    longer = resume("--steps", "500000")["train"]
    assert longer["ppo"]["total_steps"] == 500_000
    assert longer["eval"]["every_steps"] == scaled["eval"]["every_steps"] == 51_200
    assert longer["checkpoint_every_steps"] == 6144
    # A cadence given on the resuming command line is kept too.
    assert (
        resume("--steps", "500000", "--set", "eval.every_steps=2048")["train"]["eval"][
            "every_steps"
        ]
        == 2048
    )
