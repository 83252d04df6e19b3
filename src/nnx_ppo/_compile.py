"""XLA compiler options shared by the library's programs, and the memory they hold."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import Tracer


def fast_compile_options() -> dict[str, Any] | None:
    """``jax.jit`` compiler options for programs compiled once and run a few times.

    On CPU, skipping the backend's optimisation of machine code saves about 40% of
    the compile time (an MJX reset of 256 envs: 5.8 s against 9.2 s) and costs
    nothing that matters for a program run once or a few times. Other backends keep
    their defaults.
    """
    return {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None


_CPU_TRAINING_OPTIONS = {
    # YNNPACK gets each dot alone; XLA fuses the element-wise work itself.
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
    # XLA's own kernels may use 512-bit vectors where the CPU has AVX-512; LLVM keeps
    # the widest the CPU has (256 bits with AVX2) on any other.
    "xla_cpu_prefer_vector_width": 512,
}


@functools.cache
def training_compile_options() -> dict[str, Any] | None:
    """``jax.jit`` compiler options for the training programs, which run many times.

    On CPU, XLA (jaxlib 0.10) hands YNNPACK dots together with the element-wise
    work around them, and whole element-wise graphs. Handing it each dot alone and
    fusing the rest with XLA's own emitters ran config A's PPO step (an MJX env,
    256 envs) 12% faster and its rollout 21% faster, with no change beyond noise on
    smaller built-in envs (``benchmarks/HISTORY.md``, "XLA:CPU's YNNPACK fusions").
    XLA's own kernels are then compiled for 512-bit vectors, which AVX-512 CPUs run
    the transcendental functions of activations and samplers with in about half
    the time. Other backends, and a jaxlib that lacks either option, keep their
    defaults.
    """
    if jax.default_backend() != "cpu":
        return None
    try:
        jax.jit(jnp.negative, compiler_options=_CPU_TRAINING_OPTIONS).lower(1.0).compile()
    except jax.errors.JaxRuntimeError as error:
        if "No such compile option" not in str(error):  # a jaxlib without it
            raise
        return None
    return _CPU_TRAINING_OPTIONS


class TrainingProgram:
    """``jax.jit(fun, static_argnums=...)`` with :func:`training_compile_options`.

    The options depend on the backend, so the jitted function is made at the first
    call or ``lower``, not at import (which would start the backend). Called inside
    another trace (``jax.make_jaxpr``, an outer ``jax.jit``), it is :attr:`plain`:
    compiler options belong to the outermost program.
    """

    def __init__(self, fun: Callable[..., Any], static_argnums: tuple[int, ...]) -> None:
        self._fun = fun
        self._static_argnums = static_argnums
        self.plain = jax.jit(fun, static_argnums=static_argnums)
        """The same program with XLA's default options."""
        functools.update_wrapper(self, fun)

    @functools.cached_property
    def _jitted(self) -> Any:
        return jax.jit(
            self._fun,
            static_argnums=self._static_argnums,
            compiler_options=training_compile_options(),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        traced = any(isinstance(leaf, Tracer) for leaf in jax.tree.leaves((args, kwargs)))
        try:
            return (self.plain if traced else self._jitted)(*args, **kwargs)
        except ValueError as error:
            # A program that fails as it runs (a host callback raised) may fail at its
            # dispatch, where JAX raises the runtime's status as a ValueError; at a fetch
            # it is a JaxRuntimeError, which callers tell from bad input.
            if not str(error).startswith("INTERNAL:"):
                raise
            raise jax.errors.JaxRuntimeError(str(error)) from error

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(...).lower``: trace and lower without compiling."""
        return self._jitted.lower(*args, **kwargs)


def training_jit(*static_argnums: int) -> Callable[[Callable[..., Any]], TrainingProgram]:
    """Decorator: compile ``fun`` as a :class:`TrainingProgram` with these static arguments."""
    return lambda fun: TrainingProgram(fun, static_argnums)


MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")
PROCESS_MAPS = Path("/proc/self/maps")
MAPPINGS_WARNING_FRACTION = 0.75


def memory_mappings() -> tuple[int, int] | None:
    """The memory mappings this process holds and the most Linux allows it
    (``vm.max_map_count``); ``None`` where neither can be read (not Linux)."""
    try:
        cap = int(MAX_MAP_COUNT.read_text())
        with PROCESS_MAPS.open("rb") as maps:
            return sum(1 for _ in maps), cap
    except (OSError, ValueError):
        return None


def warn_if_mappings_near_cap(where: str) -> None:
    """Warn when this process holds most of the memory mappings Linux allows it.

    XLA:CPU maps each compiled program's machine code on its own, and JAX keeps
    thousands of compiled programs for later calls; a process that trains run
    after run on new env objects or configurations keeps adding mappings. Past
    the cap (``vm.max_map_count``) the next compile aborts the process ("Unable
    to allocate section memory") or crashes it, with nothing naming the cause.
    Elsewhere than Linux, does nothing.
    """
    counts = memory_mappings()
    if counts is None:
        return
    held, cap = counts
    if held >= MAPPINGS_WARNING_FRACTION * cap:
        warnings.warn(
            f"{where}: this process holds {held:,} of the {cap:,} memory mappings Linux "
            "allows it (vm.max_map_count), mostly the machine code of programs JAX compiled "
            "and keeps; past the cap the next compile crashes the process. Between runs "
            "that share no programs, call jax.clear_caches() to release them (see the "
            "training docs, 'Many runs in one program').",
            RuntimeWarning,
            stacklevel=3,
        )
