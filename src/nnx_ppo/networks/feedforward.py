"""Feedforward layers: stateless modules with no carry and no rollout extras."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.axes import AnyArray, BatchedTree
from nnx_ppo.networks._matmul import dense_dot_general
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Dense", "Stateless"]


class Dense(StatefulModule):
    """An affine layer, ``activation(x @ W + b)``, as a
    :class:`~nnx_ppo.networks.types.StatefulModule`.

    Input ``(B, in_features)``, output ``(B, out_features)``. Stateless: its carry
    is ``()``; it emits no ``rollout_extras`` and no regularization.

    Args:
      in_features: width of the input's last axis.
      out_features: width of the output's last axis.
      rngs: the random streams that initialise the weights.
      activation: applied to the affine output; ``None`` leaves it linear.
      **linear_kwargs: passed on to :class:`flax.nnx.Linear` (``use_bias``,
        ``kernel_init``, ``bias_init``, ``dtype``, ...). ``dot_general`` defaults
        to one whose weight gradient XLA:CPU runs as a row-major product (same
        forward values; the weight gradient's last bits may differ from
        ``jax.lax.dot_general``'s).

    Example::

        Dense(4, 32, nnx.Rngs(0), activation=nnx.relu)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rngs: nnx.Rngs,
        activation: Callable[[Array], Array] | None = None,
        **linear_kwargs: Any,
    ) -> None:
        require_int("Dense", "in_features", in_features)
        require_int("Dense", "out_features", out_features)
        if activation is not None and not callable(activation):
            raise TypeError(f"Dense activation must be callable or None, got {activation!r}")
        self.in_features = in_features
        self.out_features = out_features
        linear_kwargs.setdefault("dot_general", dense_dot_general)
        self.linear = nnx.Linear(in_features, out_features, rngs=rngs, **linear_kwargs)
        self.activation = activation

    def __call__(
        self,
        state: tuple[()],
        x: Float[AnyArray, "B {self.in_features}"],
        rollout_extras: None = None,
    ) -> StatefulModuleOutput:
        y = self.linear(jnp.asarray(x))
        if self.activation is not None:
            y = self.activation(y)
        return StatefulModuleOutput(state, y, jnp.zeros(()), {}, None)


class Stateless(StatefulModule):
    """A stateless Flax NNX module, or any function of a batch, as a
    :class:`~nnx_ppo.networks.types.StatefulModule`.

    ``Stateless(f)`` returns ``f(x)``: ``nnx.Linear``, ``nnx.Conv``, ``nnx.LayerNorm``,
    ``nnx.Embed``, an ``nnx.Sequential`` of them, or a function such as ``jnp.tanh``.
    Its carry is ``()``; it emits no ``rollout_extras`` and no regularization. ``f``
    takes the ``(B, *feat)`` batch and returns ``(B, *out)`` leaves; like any module,
    it must treat each row on its own and write no variable, which the checks and
    :func:`~nnx_ppo.testing.check_module` hold it to (``nnx.BatchNorm`` in training
    mode and ``nnx.Dropout`` drawing from an ``nnx.Rngs`` fail them; the NNX page of
    the contract docs shows their patterns).

    Example::

        Stateless(nnx.Sequential(nnx.Linear(4, 32, rngs=rngs), nnx.LayerNorm(32, rngs=rngs)))

    Raises:
      TypeError: ``f`` is not callable, or is already a ``StatefulModule``.
    """

    def __init__(self, f: Callable[[Any], Any]) -> None:
        if isinstance(f, StatefulModule):
            raise TypeError(
                f"Stateless: {type(f).__name__} is already a StatefulModule; use it as it is"
            )
        if isinstance(f, type) or not callable(f):
            raise TypeError(
                f"Stateless takes an NNX module or a function, got {f!r}"
                + (" (a class: pass an instance)" if isinstance(f, type) else "")
            )
        self.f = f

    def __call__(
        self, state: tuple[()], x: BatchedTree, rollout_extras: None = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, self.f(x), jnp.zeros(()), {}, None)
