"""A trainer started in a process near Linux's cap on memory mappings says so first."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flax import nnx

from nnx_ppo import _compile
from nnx_ppo.algorithms.distillation import train_distillation
from nnx_ppo.algorithms.ppo import train_ppo, train_ppo_runs
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network


def _fake_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int, held: int) -> None:
    (tmp_path / "max_map_count").write_text(f"{cap}\n")
    (tmp_path / "maps").write_text("7f00-7f01 r-xp 00000000 00:00 0\n" * held)
    monkeypatch.setattr(_compile, "MAX_MAP_COUNT", tmp_path / "max_map_count")
    monkeypatch.setattr(_compile, "PROCESS_MAPS", tmp_path / "maps")


def _network() -> Any:
    return make_default_network(make("cartpole"), nnx.Rngs(0), hidden_sizes=[4])


# Each call fails on a bad argument right after the check, so nothing compiles.
TRAINERS: dict[str, tuple[Callable[[], Any], type[Exception]]] = {
    "train_ppo": (lambda: train_ppo(make("cartpole"), _network(), initial_state="x"), TypeError),
    "train_ppo_runs": (
        lambda: train_ppo_runs(
            make("cartpole"), lambda seed: _network(), seeds=[0], on_divergence="x"
        ),
        ValueError,
    ),
    "train_distillation": (
        lambda: train_distillation(make("cartpole"), _network(), _network(), initial_state="x"),
        TypeError,
    ),
}


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_a_trainer_near_the_cap_names_the_counts_and_the_remedy(
    trainer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_process(tmp_path, monkeypatch, cap=65_530, held=60_000)
    call, error = TRAINERS[trainer]
    with warnings.catch_warnings(record=True) as caught, pytest.raises(error):
        warnings.simplefilter("always")
        call()
    near = [w for w in caught if "memory mappings" in str(w.message)]
    assert len(near) == 1
    assert near[0].category is RuntimeWarning
    assert str(near[0].message).startswith(
        f"{trainer}: this process holds 60,000 of the 65,530 memory mappings Linux allows it"
    )
    assert "jax.clear_caches()" in str(near[0].message)
    assert near[0].filename == __file__  # the user's call, not the library's


def test_below_the_cap_or_off_linux_nothing_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_process(tmp_path, monkeypatch, cap=65_530, held=49_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile.warn_if_mappings_near_cap("train_ppo")
        monkeypatch.setattr(_compile, "PROCESS_MAPS", tmp_path / "absent")
        _compile.warn_if_mappings_near_cap("train_ppo")
