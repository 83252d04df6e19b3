"""Test-suite configuration: Hypothesis profiles, the JAX CPU backend and its compile cache."""

import getpass
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests compile the same programs: in other xdist workers, and in the subprocesses
# of the CLI, fault and sharding tests, which inherit these variables. JAX's persistent
# cache compiles each once per machine.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"nnx-ppo-tests-jax-cache-{getpass.getuser()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# A size limit turns on JAX's file lock around the cache's reads and writes. Without it
# an entry is written in place while another process may read it, and a worker that
# deserialized a half-written executable crashed (a segfault in a ci-fresh run).
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 * 2**30))

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
