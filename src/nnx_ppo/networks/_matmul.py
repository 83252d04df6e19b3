"""Dense's product, with a weight gradient that XLA:CPU runs as a row-major product."""

from __future__ import annotations

import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jaxtyping import Array, Float

NARROWEST_ROUTED = 9
"""Layers at least this many outputs wide get the routed weight gradient.

Narrower ones (value and action heads) keep XLA's: routed, config A's heads made
its PPO iteration slower again.
"""

_ROW_TIMES_MATRIX = (((1,), (0,)), ((), ()))


def dense_dot_general(
    lhs: Array,
    rhs: Array,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
) -> Array:
    """``lax.dot_general``, whose weight gradient is one row-major product on CPU.

    Reverse-mode autodiff of ``x @ w`` makes the weight gradient as
    ``dot_general(x, dy)`` contracted over the batch axis of both. XLA:CPU
    (jaxlib 0.10) runs that product in its own Eigen kernel; only products whose
    left operand is contracted on its last axis go to YNNPACK. So the tangent
    here multiplies by ``x.T`` materialised (behind ``lax.optimization_barrier``,
    which keeps XLA from folding the transpose back into the product):
    transposed for reverse mode, that is ``x.T @ dy`` with ``x.T`` row-major.
    Config A's PPO iteration took 8% less time (``benchmarks/README.md``,
    "Dense's weight gradient as a row-major product").

    The forward product is ``lax.dot_general`` itself, and the input gradient
    the same product as ``lax.dot_general``'s (the same bits on the machines
    measured). The weight gradient is the same sum in another order, so its
    last bits may differ from XLA's. Layers narrower than :data:`NARROWEST_ROUTED`
    outputs (a value or action head), other ranks, dtypes and dimension numbers,
    other backends than CPU, and programs traced under a mesh of several devices
    get ``lax.dot_general`` unchanged.
    """
    routed = (
        lhs.ndim == 2
        and rhs.ndim == 2
        and dimension_numbers == _ROW_TIMES_MATRIX
        and rhs.shape[1] >= NARROWEST_ROUTED
        and lhs.dtype == rhs.dtype == jnp.float32
        and preferred_element_type is None
        and out_sharding is None
        and jax.default_backend() == "cpu"
        and _one_device_program()
    )
    if not routed:
        return lax.dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
        )
    return _routed_product(lhs, rhs, precision)


def _one_device_program() -> bool:
    """Whether the program being traced runs on one device (no mesh of several is set).

    Partitioned over a mesh, ``x.T`` moves the sharded batch axis, which the
    partitioner must then reshard; split over two processes, such a program
    hung in its collectives.
    """
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.empty or mesh.size == 1


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _routed_product(
    x: Float[Array, "B I"], w: Float[Array, "I O"], precision: Any
) -> Float[Array, "B O"]:
    return lax.dot_general(x, w, _ROW_TIMES_MATRIX, precision=precision)


def _routed_product_jvp(
    precision: Any, primals: tuple[Array, Array], tangents: tuple[Any, Any]
) -> tuple[Float[Array, "B O"], Float[Array, "B O"]]:
    x, w = primals
    x_tangent, w_tangent = tangents
    terms = []
    if not isinstance(x_tangent, SymbolicZero):
        terms.append(lax.dot_general(x_tangent, w, _ROW_TIMES_MATRIX, precision=precision))
    if not isinstance(w_tangent, SymbolicZero):
        # (x.T).T @ dw: transposed, the weight gradient is x.T @ dy with x.T row-major.
        x_transposed = lax.optimization_barrier(x.T)
        terms.append(
            lax.dot_general(x_transposed, w_tangent, (((0,), (0,)), ((), ())), precision=precision)
        )
    return _routed_product(x, w, precision), functools.reduce(operator.add, terms)


_routed_product.defjvp(_routed_product_jvp, symbolic_zeros=True)
