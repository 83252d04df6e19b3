"""Dense, LSTM and GRU: one step on a batch of 5, and an episode reset of the carry."""

import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.recurrent import GRU, LSTM, LSTMCarry

rngs = nnx.Rngs(0)
x = jnp.ones((5, 3))  # B=5 samples of 3 features

dense = Dense(3, 8, rngs, activation=nnx.relu)
out = dense(dense.initialize_state(5), x)
print("Dense:", out.output.shape, "carry", out.next_state)

lstm = LSTM(3, 4, rngs)
carry = lstm.initialize_state(5)
out = lstm(carry, x)
assert isinstance(out.next_state, LSTMCarry)
cell, hidden = out.next_state
print(f"LSTM: {out.output.shape}, carry cell {cell.shape} and hidden {hidden.shape}")
print("LSTM output is the new hidden state:", bool(jnp.all(out.output == hidden)))

gru = GRU(3, 4, rngs, trainable_initial_state=True)
out = gru(gru.initialize_state(5), x)
print("GRU:", out.output.shape, "carry", out.next_state.shape)
# reset_state works on the batched carry and on one env's slice alike.
h = out.next_state
print(f"GRU reset: batched {gru.reset_state(h).shape}, one env {gru.reset_state(h[0]).shape}")
