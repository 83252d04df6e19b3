"""Test-suite configuration: Hypothesis profiles and the JAX CPU backend."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compile cache: two ci-fresh runs had an xdist worker segfault in
# jaxlib's deserialize_executable, reading an entry of the kit's programs that another
# process wrote (with and without JAX's file lock around the cache).

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
