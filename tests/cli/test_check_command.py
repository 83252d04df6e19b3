"""``nnx-ppo check``: the contract test kit from the command line, run in-process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from nnx_ppo.cli.main import main

CELLS = """
import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import new_env_keys, split_env_keys
from nnx_ppo.testing.modules import RunningSum


class BatchCentred(RunningSum):
    def __call__(self, state, x, rollout_extras=None):
        return super().__call__(state, x - x.mean(axis=0), rollout_extras)


def make_good():
    return RunningSum(3)


def rocket():  # ":rocket:" is an emoji code to rich
    return RunningSum(3)


def make_bad():
    return BatchCentred(3)


class RemembersAcrossEpisodes(RunningSum):
    def reset_state(self, prev_state):
        return prev_state


def make_remembering():
    return RemembersAcrossEpisodes(3)


class EpisodeNoise(StatefulModule):
    def initialize_state(self, batch_size):
        return self._drawn(new_env_keys(nnx.Rngs(0), batch_size))

    def reset_state(self, prev_state):
        return self._drawn(split_env_keys(prev_state["keys"])[0])

    @staticmethod
    def _drawn(keys):
        noise = jax.vmap(lambda key: jax.random.normal(key, (3,)))(keys.reshape(-1))
        return {"keys": keys, "noise": noise.reshape(*keys.shape, 3)}

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(state, x + state["noise"], jnp.zeros(()), {}, None)


def make_episode_noise():
    return EpisodeNoise()


def make_broken():
    raise RuntimeError("no weights on disk")


def make_and_exit():
    raise SystemExit("bad config")


class Pair:
    @staticmethod
    def normalizer():
        return Normalizer({"a": 2, "b": 3})


not_a_module = 42
flax_linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))  # callable, but no factory to call


def make_scalar_normalizer():
    return Normalizer(())


def make_env():
    from nnx_ppo import envs

    return envs.CartPole()
"""


@pytest.fixture
def cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of cells in the current directory, under a name no other test imports."""
    (tmp_path / "kit_cli_cells.py").write_text(textwrap.dedent(CELLS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "kit_cli_cells"


def check(*argv: str) -> int:
    return main(["check", *argv, "--max-examples", "3"])


def test_a_module_that_keeps_the_contract_exits_0(
    cells: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(f"{cells}:make_good", "--input-shape", "3") == 0
    assert "RunningSum has every property of the contract" in capsys.readouterr().out


def test_the_target_is_printed_as_written(cells: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(f"{cells}:rocket", "--input-shape", "3") == 0
    assert f"{cells}:rocket: RunningSum has every property" in capsys.readouterr().out


def test_a_failure_exits_1_with_the_kit_s_message_and_no_traceback(
    cells: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(f"{cells}:make_bad", "--input-shape", "3") == 1
    out = capsys.readouterr().out
    assert "check_module(BatchCentred): property 'batch-of-one agreement' fails at B=2" in out
    assert "leaf:     output at step 0, env 0" in out
    assert "example=Example(B=2, T=1, episode ends (step, env)=[]" in out
    assert "Traceback" not in out


def test_not_episodic_skips_the_episodes_property(
    cells: str, capsys: pytest.CaptureFixture[str]
) -> None:
    remembering = [f"{cells}:make_remembering", "--input-shape", "3", "--time-lengths", "4"]
    assert check(*remembering) == 1
    assert "property 'episodes are independent' fails" in capsys.readouterr().out
    assert check(*remembering, "--not-episodic") == 0
    assert "skipped by --not-episodic" in capsys.readouterr().out


def test_noise_drawn_once_per_episode_says_so(
    cells: str, capsys: pytest.CaptureFixture[str]
) -> None:
    noisy = [f"{cells}:make_episode_noise", "--input-shape", "3"]
    assert check(*noisy, "--stochastic") == 1
    assert "stochastic='per_episode'" in capsys.readouterr().out
    assert check(*noisy, "--stochastic-per-episode") == 0


def test_the_example_input_may_be_an_npz_dict_of_arrays(
    cells: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.savez(tmp_path / "sample.npz", a=np.zeros(2, np.float32), b=np.zeros(3, np.float32))
    assert check(f"{cells}:Pair.normalizer", "--example-input", "sample.npz") == 0
    assert "Normalizer has every property" in capsys.readouterr().out


def test_the_example_input_may_be_an_npy_array(cells: str, tmp_path: Path) -> None:
    np.save(tmp_path / "sample.npy", np.zeros(3, np.float32))
    assert check(f"{cells}:make_good", "--example-input", "sample.npy") == 0


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        ("kit_cli_cells", [], "expected MODULE:FACTORY, e.g. my_pkg.cells:make_cell"),
        ("no_such_package.cells:make", [], "cannot import no_such_package.cells"),
        ("kit_cli_cells:make_nothing", [], "kit_cli_cells has no attribute 'make_nothing'"),
        (
            "kit_cli_cells:not_a_module",
            [],
            "kit_cli_cells:not_a_module gives a value of type int: expected a StatefulModule",
        ),
        (
            "kit_cli_cells:flax_linear",
            [],
            "gives a value of type Linear: expected a StatefulModule or a function of no "
            "arguments that builds one; subclass nnx_ppo.networks.StatefulModule",
        ),
        (
            "kit_cli_cells:make_env",
            [],
            "it looks like an environment, which nnx-ppo check does not take: check it with "
            "nnx_ppo.testing.check_env",
        ),
        (
            "kit_cli_cells:make_broken",
            [],
            "kit_cli_cells:make_broken() raised RuntimeError: no weights on disk",
        ),
        (
            "kit_cli_cells:make_and_exit",
            [],
            "kit_cli_cells:make_and_exit() raised SystemExit: bad config",
        ),
        ("kit_cli_cells:make_good", ["--input-dtype", "floaty"], "'floaty' is not a dtype"),
    ],
)
def test_wrong_arguments_exit_2_with_a_message_that_names_them(
    cells: str, capsys: pytest.CaptureFixture[str], target: str, extra: list[str], message: str
) -> None:
    assert check(target, "--input-shape", "3", *extra) == 2
    assert message in capsys.readouterr().err


def test_no_numbers_after_input_shape_is_a_scalar_sample(cells: str) -> None:
    assert check(f"{cells}:make_scalar_normalizer", "--input-shape") == 0


def test_a_missing_or_unknown_example_file_is_named(
    cells: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(f"{cells}:make_good", "--example-input", "missing.npy") == 2
    assert "--example-input missing.npy does not exist" in capsys.readouterr().err
    (tmp_path / "sample.txt").write_text("0 0 0")
    assert check(f"{cells}:make_good", "--example-input", "sample.txt") == 2
    assert "must be a .npy or .npz file" in capsys.readouterr().err


def test_a_file_that_is_no_array_and_a_dtype_it_would_ignore_are_named(
    cells: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "garbage.npy").write_text("not an array")
    assert check(f"{cells}:make_good", "--example-input", "garbage.npy") == 2
    shown = capsys.readouterr().err
    assert "--example-input garbage.npy is not a .npy or .npz file of numeric arrays" in shown
    # A .npz reads its arrays lazily: an object array fails at the read, named the same way.
    np.savez(tmp_path / "objects.npz", a=np.array([1, "x"], dtype=object))
    assert check(f"{cells}:make_good", "--example-input", "objects.npz") == 2
    shown = capsys.readouterr().err
    assert "--example-input objects.npz is not a .npy or .npz file of numeric arrays" in shown
    np.save(tmp_path / "sample.npy", np.zeros(3, np.float32))
    given_a_dtype = ("--example-input", "sample.npy", "--input-dtype", "int32")
    assert check(f"{cells}:make_good", *given_a_dtype) == 2
    assert "--input-dtype goes with --input-shape" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "raised"),
    [
        ("def broken(:\n", "SyntaxError"),
        ("raise RuntimeError('no GPU here')\n", "RuntimeError"),
        # A script module that runs and exits at import: no exit 0 with nothing checked.
        ("import sys\nsys.exit(0)\n", "SystemExit"),
    ],
)
def test_a_package_that_fails_to_import_exits_2_not_as_a_failed_property(
    cells: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, raised: str
) -> None:
    (tmp_path / f"kit_cli_broken_{raised}.py").write_text(source)
    assert check(f"kit_cli_broken_{raised}:make", "--input-shape", "3") == 2
    assert f"cannot import kit_cli_broken_{raised}: {raised}" in capsys.readouterr().err


def test_negative_sizes_and_seeds_beyond_int64_are_usage_errors(
    cells: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        check(f"{cells}:make_good", "--input-shape", "-4")
    assert exited.value.code == 2
    assert "-4 is not an axis length" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # the target after --input-shape's numbers
        main(["check", "--input-shape", "4", f"{cells}:make_good"])
    assert exited.value.code == 2
    assert f"MODULE:FACTORY goes before --input-shape, e.g. nnx-ppo check {cells}:make_good" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exited:
        main(["eval", "somewhere", "--seed", str(2**70)])
    assert exited.value.code == 2
    assert "beyond the int64 range a seed may take" in capsys.readouterr().err
