"""The training programs' XLA options: chosen per backend, skipped where XLA lacks them."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo import _compile
from nnx_ppo._compile import TrainingProgram, training_compile_options


@pytest.fixture
def fresh_options() -> Iterator[None]:
    """``training_compile_options`` decided afresh in the test, and again after it."""
    training_compile_options.cache_clear()
    yield
    training_compile_options.cache_clear()


def _layer(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w) @ w


def test_a_training_program_computes_what_the_plain_jit_does() -> None:
    x = jax.random.normal(jax.random.key(0), (64, 32))
    w = jax.random.normal(jax.random.key(1), (32, 32)) / 8
    program = TrainingProgram(_layer, static_argnums=())
    np.testing.assert_allclose(program(x, w), program.plain(x, w), rtol=1e-5, atol=1e-6)
    assert program.__name__ == "_layer"
    # Nested in another trace, where JAX refuses compiler options, it runs as plain jit.
    assert "tanh" in str(jax.make_jaxpr(lambda x: program(x, w))(x))


def test_cpu_programs_get_the_options_other_backends_keep_defaults(
    fresh_options: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert jax.default_backend() == "cpu"
    assert training_compile_options() == _compile._CPU_TRAINING_OPTIONS
    training_compile_options.cache_clear()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert training_compile_options() is None


def test_a_jaxlib_without_the_option_keeps_defaults(
    fresh_options: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_compile, "_CPU_TRAINING_OPTIONS", {"xla_cpu_no_such_option": ""})
    assert training_compile_options() is None
