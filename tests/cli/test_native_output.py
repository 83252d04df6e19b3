"""Simulator warnings printed by native code are counted and logged, never shown."""

import ctypes
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_runs import TINY

from nnx_ppo.algorithms import ppo
from nnx_ppo.cli.main import main

# MuJoCo Warp's report of a solver overflow, as its kernels printf it.
WARP_WARNING = (
    b"solver iterations limit reached - please increase iterations beyond %d\n"
    b"To disable the print warning: m.opt.warn_overflow &= ~mjw.OverflowType.ITERATIONS "
    b"(or = 0 for all)\n"
)


def native_print(text: bytes, *args: int) -> None:
    """Print from C, as a simulator's kernels do, past Python's sys.stdout."""
    libc = ctypes.CDLL(None)
    libc.printf(text, *args)
    libc.fflush(None)


def test_warnings_are_counted_and_other_output_passes_through() -> None:
    script = textwrap.dedent(
        """
        import ctypes, sys
        from nnx_ppo.cli.native_output import SimulatorWarnings
        libc = ctypes.CDLL(None)
        with SimulatorWarnings() as warnings:
            print("python line")
            for _ in range(3):
                libc.printf(WARNING, 4)
            libc.printf(b"another native line\\n")
        print("count", warnings.count, "passed on", warnings.passed_on)
        """
    ).replace("WARNING", repr(WARP_WARNING))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == [
        "python line",
        "another native line",
        "count 3 passed on 1",
    ]


def test_a_training_run_logs_them_and_its_summary_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    real_train_ppo = ppo.train_ppo

    def train_ppo_with_a_noisy_simulator(*args: Any, **kwargs: Any) -> Any:
        for _ in range(3):
            native_print(WARP_WARNING, 4)
        return real_train_ppo(*args, **kwargs)

    monkeypatch.setattr(ppo, "train_ppo", train_ppo_with_a_noisy_simulator)
    run_dir = tmp_path / "run"
    assert main(["train", "--steps", "128", "--run-dir", str(run_dir), "--quiet", *TINY]) == 0

    shown = capfd.readouterr().out
    assert "limit reached" not in shown and "To disable" not in shown
    assert "simulator warnings    │ 3 (logged in" in shown
    logged = (run_dir / "simulator.log").read_text().splitlines()
    assert sum("solver iterations limit reached" in line for line in logged) == 3
