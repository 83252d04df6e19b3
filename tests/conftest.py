"""Test-suite configuration: Hypothesis profiles and the JAX CPU backend."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compile cache: two ci-fresh runs had an xdist worker segfault in
# jaxlib's deserialize_executable, reading an entry of the kit's programs that another
# process wrote (with and without JAX's file lock around the cache).

from collections.abc import Iterator
from pathlib import Path

import jax
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=15,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs() -> Iterator[None]:
    """Drop JAX's compiled programs after each test module.

    XLA:CPU keeps each cached program's machine code in memory mappings of its own,
    and Linux caps a process's mappings (``vm.max_map_count``, often 65,530). One
    xdist worker running half the suite reached 64,152 by the end, and past the cap
    the next compile segfaults (``benchmarks/program_maps.py``). Programs are reused
    within a module, seldom across modules, so clearing here costs little.
    """
    yield
    jax.clear_caches()


@pytest.fixture
def checkpoints_030(tmp_path: Path) -> Path:
    """A directory as nnx-ppo 0.3.0's ``make_checkpoint_fn`` left it: per step, Orbax
    checkpoints of the network and the optimizer, and a pickle (their contents stand-ins)."""
    root = tmp_path / "checkpoints_030"
    for step in (0, 20):
        step_dir = root / f"step_{step:010d}"
        for item in ("networks", "optimizer"):
            (step_dir / item).mkdir(parents=True)
            (step_dir / item / "_CHECKPOINT_METADATA").write_text("{}")
        (step_dir / "metadata.pkl").write_bytes(b"\x80\x04N.")
    return root
