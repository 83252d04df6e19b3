"""Recurrent cells as stateful modules: :class:`LSTM` and :class:`GRU`.

Both wrap Flax's cells and carry their hidden state explicitly. On an episode
reset the carry returns to zeros, or to a learned initial state when built with
``trainable_initial_state=True`` (then gradients reach it through every reset
the loss replays).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.axes import AnyArray
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["GRU", "LSTM", "LSTMCarry"]


class LSTMCarry(NamedTuple):
    """The carry of an :class:`LSTM`, in Flax's order ``(cell, hidden)``.

    Leaves are ``(B, hidden_features)`` in a batched carry and
    ``(hidden_features,)`` in one env's slice.
    """

    cell: Float[AnyArray, "*B hidden"]
    """The cell state ``c``: the LSTM's long-term memory."""
    hidden: Float[AnyArray, "*B hidden"]
    """The hidden state ``h``: also the module's output."""


def _cell_kwargs(
    name: str,
    in_features: int,
    hidden_features: int,
    gate_fn: Callable[[Array], Array],
    activation_fn: Callable[[Array], Array],
    initializers: dict[str, Callable[..., Array] | None],
) -> dict[str, Any]:
    """Validate the sizes; the keyword arguments of a Flax cell, Flax's defaults kept."""
    require_int(name, "in_features", in_features)
    require_int(name, "hidden_features", hidden_features)
    for arg, fn in (("gate_fn", gate_fn), ("activation_fn", activation_fn)):
        if not callable(fn):
            raise TypeError(f"{name} {arg} must be callable, got {fn!r}")
    given = {key: init for key, init in initializers.items() if init is not None}
    return {"gate_fn": gate_fn, "activation_fn": activation_fn, **given}


def _initial_param(trainable: bool, hidden_features: int) -> nnx.Param[Array] | None:
    return nnx.Param(jnp.zeros((hidden_features,), jnp.float32)) if trainable else None


def _initial_value(
    initial: nnx.Param[Array] | None, shape: tuple[int, ...], dtype: Any
) -> Float[Array, "*B hidden"]:
    """The reset value of one carry leaf of ``shape``: zeros, or the learned vector."""
    if initial is None:
        return jnp.zeros(shape, dtype)
    return jnp.broadcast_to(initial[...], shape).astype(dtype)


class LSTM(StatefulModule):
    """A long short-term memory cell, one step per call.

    Input ``(B, in_features)``; output the new hidden state ``(B, hidden_features)``.
    Carry: an :class:`LSTMCarry` ``(cell, hidden)``, each ``(B, hidden_features)``,
    kept in its own dtype whatever the input's. Emits no ``rollout_extras``.

    Args:
      in_features: width of the input.
      hidden_features: width of the cell and hidden states, and of the output.
      rngs: the random streams that initialise the weights.
      gate_fn: the gates' nonlinearity.
      activation_fn: the nonlinearity of the candidate and of the output.
      kernel_init, recurrent_kernel_init, bias_init: initialisers of the input,
        recurrent and bias weights; ``None`` keeps Flax's default.
      use_optimized: use :class:`flax.nnx.OptimizedLSTMCell` (one fused matmul
        per step) rather than :class:`flax.nnx.LSTMCell`; the maths is the same.
      trainable_initial_state: learn the carry an episode starts from, rather
        than starting from zeros.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        rngs: nnx.Rngs,
        *,
        gate_fn: Callable[[Array], Array] = nnx.sigmoid,
        activation_fn: Callable[[Array], Array] = nnx.tanh,
        kernel_init: Callable[..., Array] | None = None,
        recurrent_kernel_init: Callable[..., Array] | None = None,
        bias_init: Callable[..., Array] | None = None,
        use_optimized: bool = True,
        trainable_initial_state: bool = False,
    ) -> None:
        kwargs = _cell_kwargs(
            "LSTM",
            in_features,
            hidden_features,
            gate_fn,
            activation_fn,
            {
                "kernel_init": kernel_init,
                "recurrent_kernel_init": recurrent_kernel_init,
                "bias_init": bias_init,
            },
        )
        cell_type = nnx.OptimizedLSTMCell if use_optimized else nnx.LSTMCell
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.trainable_initial_state = trainable_initial_state
        self.cell = cell_type(in_features, hidden_features, rngs=rngs, **kwargs)
        self.initial_cell = _initial_param(trainable_initial_state, hidden_features)
        self.initial_hidden = _initial_param(trainable_initial_state, hidden_features)

    def __call__(
        self,
        state: LSTMCarry,
        x: Float[AnyArray, "B {self.in_features}"],
        rollout_extras: None = None,
    ) -> StatefulModuleOutput:
        for name, leaf in zip(state._fields, state, strict=True):
            if leaf.shape != (x.shape[0], self.hidden_features):
                raise ValueError(
                    f"LSTM.__call__: state.{name} has shape {tuple(leaf.shape)}, expected "
                    f"(B={x.shape[0]}, hidden_features={self.hidden_features})"
                )
        # Flax's LSTM cells take and return the carry as (c, h), promoted with the input's
        # dtype (float64 under x64); the carry keeps its own.
        carry = (jnp.asarray(state.cell), jnp.asarray(state.hidden))
        (cell, hidden), output = self.cell(carry, jnp.asarray(x))
        next_state = LSTMCarry(
            cell=cell.astype(state.cell.dtype), hidden=hidden.astype(state.hidden.dtype)
        )
        return StatefulModuleOutput(next_state, output, jnp.zeros(()), {}, None)

    def initialize_state(self, batch_size: int) -> LSTMCarry:
        return self.reset_state(
            LSTMCarry(
                cell=jnp.zeros((batch_size, self.hidden_features), jnp.float32),
                hidden=jnp.zeros((batch_size, self.hidden_features), jnp.float32),
            )
        )

    def reset_state(self, prev_state: LSTMCarry) -> LSTMCarry:
        return LSTMCarry(
            cell=_initial_value(self.initial_cell, prev_state.cell.shape, prev_state.cell.dtype),
            hidden=_initial_value(
                self.initial_hidden, prev_state.hidden.shape, prev_state.hidden.dtype
            ),
        )


class GRU(StatefulModule):
    """A gated recurrent unit, one step per call (Flax's :class:`flax.nnx.GRUCell`).

    Input ``(B, in_features)``; output the new hidden state ``(B, hidden_features)``.
    Carry: the hidden state itself, an array ``(B, hidden_features)``, kept in its own
    dtype whatever the input's. Emits no ``rollout_extras``.

    Args:
      in_features: width of the input.
      hidden_features: width of the hidden state and of the output.
      rngs: the random streams that initialise the weights.
      gate_fn: the reset and update gates' nonlinearity.
      activation_fn: the candidate state's nonlinearity.
      kernel_init, recurrent_kernel_init, bias_init: initialisers of the input,
        recurrent and bias weights; ``None`` keeps Flax's default.
      trainable_initial_state: learn the hidden state an episode starts from,
        rather than starting from zeros.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        rngs: nnx.Rngs,
        *,
        gate_fn: Callable[[Array], Array] = nnx.sigmoid,
        activation_fn: Callable[[Array], Array] = nnx.tanh,
        kernel_init: Callable[..., Array] | None = None,
        recurrent_kernel_init: Callable[..., Array] | None = None,
        bias_init: Callable[..., Array] | None = None,
        trainable_initial_state: bool = False,
    ) -> None:
        kwargs = _cell_kwargs(
            "GRU",
            in_features,
            hidden_features,
            gate_fn,
            activation_fn,
            {
                "kernel_init": kernel_init,
                "recurrent_kernel_init": recurrent_kernel_init,
                "bias_init": bias_init,
            },
        )
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.trainable_initial_state = trainable_initial_state
        self.cell = nnx.GRUCell(in_features, hidden_features, rngs=rngs, **kwargs)
        self.initial_hidden = _initial_param(trainable_initial_state, hidden_features)

    def __call__(
        self,
        state: Float[AnyArray, "B {self.hidden_features}"],
        x: Float[AnyArray, "B {self.in_features}"],
        rollout_extras: None = None,
    ) -> StatefulModuleOutput:
        carry = jnp.asarray(state)
        # Flax's cell promotes the carry with the input's dtype; the carry keeps its own.
        hidden, output = self.cell(carry, jnp.asarray(x))
        return StatefulModuleOutput(hidden.astype(carry.dtype), output, jnp.zeros(()), {}, None)

    def initialize_state(self, batch_size: int) -> Float[Array, "{batch_size} hidden"]:
        return _initial_value(self.initial_hidden, (batch_size, self.hidden_features), jnp.float32)

    def reset_state(
        self, prev_state: Float[AnyArray, "*B {self.hidden_features}"]
    ) -> Float[Array, "*B {self.hidden_features}"]:
        return _initial_value(self.initial_hidden, prev_state.shape, prev_state.dtype)
