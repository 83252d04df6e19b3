"""XLA compiler options shared by the library's programs."""

from __future__ import annotations

from typing import Any

import jax


def fast_compile_options() -> dict[str, Any] | None:
    """``jax.jit`` compiler options for programs compiled once and run a few times.

    On CPU, skipping the backend's optimisation of machine code saves about 40% of
    the compile time (an MJX reset of 256 envs: 5.8 s against 9.2 s) and costs
    nothing that matters for a program run once or a few times. Other backends keep
    their defaults.
    """
    return {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None
