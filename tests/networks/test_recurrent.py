"""LSTM and GRU: steps against hand-written NumPy cells, carry order, resets, bad input."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import nnx_ppo
from nnx_ppo.networks.recurrent import GRU, LSTM, LSTMCarry
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.variational import AR1VariationalBottleneck

IN, HIDDEN = 3, 4
BATCH_SIZES = [1, 2, 3, 5]
# Non-zero biases, so a reference that drops or misplaces one fails.
BIAS_INIT = nnx.initializers.normal(1.0)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _np(variable: Any) -> np.ndarray:
    return np.asarray(variable[...], np.float64)


def _lstm_gate_weights(cell: nnx.Module) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{gate: (W_input, W_recurrent, bias)}`` for gates i, f, g, o of either Flax cell."""
    if isinstance(cell, nnx.OptimizedLSTMCell):
        w_in = np.split(_np(cell.dense_i.kernel), 4, axis=-1)
        w_rec = np.split(_np(cell.dense_h.kernel), 4, axis=-1)
        bias = np.split(_np(cell.dense_h.bias), 4)
        return {g: (w_in[k], w_rec[k], bias[k]) for k, g in enumerate("ifgo")}
    assert isinstance(cell, nnx.LSTMCell)
    layers = {"i": (cell.ii, cell.hi), "f": (cell.if_, cell.hf), "g": (cell.ig, cell.hg)}
    layers["o"] = (cell.io, cell.ho)
    return {g: (_np(xi.kernel), _np(hh.kernel), _np(hh.bias)) for g, (xi, hh) in layers.items()}


def numpy_lstm_step(lstm: LSTM, cell: np.ndarray, hidden: np.ndarray, x: np.ndarray):
    """One textbook LSTM step; returns (new cell state, new hidden state)."""
    pre = {g: x @ wi + hidden @ wh + b for g, (wi, wh, b) in _lstm_gate_weights(lstm.cell).items()}
    new_cell = _sigmoid(pre["f"]) * cell + _sigmoid(pre["i"]) * np.tanh(pre["g"])
    new_hidden = _sigmoid(pre["o"]) * np.tanh(new_cell)
    return new_cell, new_hidden


def numpy_gru_step(gru: GRU, hidden: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One GRU step in Flax's parametrisation (input bias only, reset gate on W_hn h)."""
    x_r, x_z, x_n = np.split(x @ _np(gru.cell.dense_i.kernel) + _np(gru.cell.dense_i.bias), 3, -1)
    h_r, h_z, h_n = np.split(hidden @ _np(gru.cell.dense_h.kernel), 3, -1)
    reset, update = _sigmoid(x_r + h_r), _sigmoid(x_z + h_z)
    candidate = np.tanh(x_n + reset * h_n)
    return (1.0 - update) * candidate + update * hidden


@nnx.jit
def _call(module: StatefulModule, state: Any, x: jax.Array) -> StatefulModuleOutput:
    return module(state, x)


@nnx.jit
def _reset(module: StatefulModule, state: Any) -> Any:
    return module.reset_state(state)


@nnx.jit
def _reset_each_env(module: StatefulModule, state: Any) -> Any:
    return jax.vmap(module.reset_state)(state)


def _random_carry(module: StatefulModule, batch: int, rng: np.random.Generator) -> Any:
    """A carry of the module's structure, filled with values well away from the reset value."""
    return jax.tree.map(
        lambda leaf: jnp.asarray(rng.normal(size=leaf.shape) * 2.0, leaf.dtype),
        module.initialize_state(batch),
    )


def _shapes_and_dtypes(tree: Any) -> Any:
    return jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), tree)


@pytest.fixture(scope="module", params=[True, False], ids=["optimized", "plain"])
def lstm(request: pytest.FixtureRequest) -> LSTM:
    return LSTM(IN, HIDDEN, nnx.Rngs(0), bias_init=BIAS_INIT, use_optimized=request.param)


@pytest.fixture(scope="module")
def gru() -> GRU:
    return GRU(IN, HIDDEN, nnx.Rngs(1), bias_init=BIAS_INIT)


@given(batch=st.sampled_from(BATCH_SIZES), seed=st.integers(0, 2**16))
def test_lstm_steps_match_numpy(lstm: LSTM, batch: int, seed: int):
    assert nnx_ppo.checks_enabled()
    rng = np.random.default_rng(seed)
    state = _random_carry(lstm, batch, rng)
    cell, hidden = np.asarray(state.cell, np.float64), np.asarray(state.hidden, np.float64)
    for _ in range(3):
        x = rng.normal(size=(batch, IN)).astype(np.float32)
        out = _call(lstm, state, jnp.asarray(x))
        cell, hidden = numpy_lstm_step(lstm, cell, hidden, x)
        np.testing.assert_allclose(np.asarray(out.next_state.cell), cell, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.next_state.hidden), hidden, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.output), hidden, rtol=1e-5, atol=1e-5)
        assert out.rollout_extras is None
        state = out.next_state


@given(batch=st.sampled_from(BATCH_SIZES), seed=st.integers(0, 2**16))
def test_gru_steps_match_numpy(gru: GRU, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    state = _random_carry(gru, batch, rng)
    hidden = np.asarray(state, np.float64)
    for _ in range(3):
        x = rng.normal(size=(batch, IN)).astype(np.float32)
        out = _call(gru, state, jnp.asarray(x))
        hidden = numpy_gru_step(gru, hidden, x)
        np.testing.assert_allclose(np.asarray(out.next_state), hidden, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.output), hidden, rtol=1e-5, atol=1e-5)
        assert out.rollout_extras is None
        state = out.next_state


def test_lstm_carry_fields_are_flax_cell_state_and_hidden_state(lstm: LSTM):
    rng = np.random.default_rng(0)
    cell, hidden = (jnp.asarray(rng.normal(size=(2, HIDDEN)) * 2, jnp.float32) for _ in "ch")
    x = jnp.asarray(rng.normal(size=(2, IN)), jnp.float32)
    (flax_cell, flax_hidden), flax_output = lstm.cell((cell, hidden), x)

    out = lstm(LSTMCarry(cell=cell, hidden=hidden), x)

    np.testing.assert_allclose(out.next_state.cell, flax_cell, rtol=1e-6)
    np.testing.assert_allclose(out.next_state.hidden, flax_hidden, rtol=1e-6)
    np.testing.assert_allclose(out.output, flax_output, rtol=1e-6)
    # The two states differ here, so a swap of the fields could not pass unnoticed.
    assert not np.allclose(flax_cell, flax_hidden)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("trainable", [False, True], ids=["zeros", "trainable"])
def test_reset_returns_initial_carry_batched_and_per_env(kind: str, trainable: bool):
    module_type = LSTM if kind == "lstm" else GRU
    module = module_type(IN, HIDDEN, nnx.Rngs(2), trainable_initial_state=trainable)
    rng = np.random.default_rng(3)
    initial: dict[str, np.ndarray] = {}
    for name in ("initial_cell", "initial_hidden"):
        param = getattr(module, name, None)
        if trainable and param is not None:
            initial[name] = rng.normal(size=HIDDEN).astype(np.float32)
            param[...] = jnp.asarray(initial[name])
        else:
            initial[name] = np.zeros(HIDDEN, np.float32)
    if kind == "lstm":
        expected_row: Any = LSTMCarry(initial["initial_cell"], initial["initial_hidden"])
    else:
        expected_row = initial["initial_hidden"]
    batch = 3
    expected = jax.tree.map(lambda row: np.broadcast_to(row, (batch, HIDDEN)), expected_row)
    state = _random_carry(module, batch, rng)

    one_env = jax.tree.map(lambda leaf: leaf[0], state)
    one_env_reset = module.reset_state(one_env)
    assert _shapes_and_dtypes(one_env_reset) == _shapes_and_dtypes(one_env)
    jax.tree.map(np.testing.assert_array_equal, one_env_reset, expected_row)
    for reset in (
        module.initialize_state(batch),
        _reset(module, state),
        _reset_each_env(module, state),
    ):
        assert _shapes_and_dtypes(reset) == _shapes_and_dtypes(state)
        assert type(reset) is type(state)
        jax.tree.map(np.testing.assert_array_equal, reset, expected)


@pytest.mark.parametrize(
    ("dtype", "x64"), [(jnp.bfloat16, False), (jnp.float16, False), (jnp.float64, True)]
)
@pytest.mark.parametrize(
    "build",
    [
        lambda: LSTM(IN, HIDDEN, nnx.Rngs(0)),
        lambda: LSTM(IN, HIDDEN, nnx.Rngs(0), use_optimized=False),
        lambda: GRU(IN, HIDDEN, nnx.Rngs(0)),
    ],
    ids=["optimized-lstm", "plain-lstm", "gru"],
)
def test_the_carry_keeps_its_dtype_whatever_the_input_s(
    build: Callable[[], StatefulModule], dtype: Any, x64: bool
):
    """Flax's cells promote the carry with the input: a float64 input under x64 made it
    float64, and the contract check blamed the library's cell for changing it."""
    module = build()
    state = module.initialize_state(2)
    with jax.enable_x64(x64):
        # Traced, not run: the contract check on next_state is what failed.
        out = nnx.eval_shape(_call, module, state, jnp.ones((2, IN), dtype))
    assert _shapes_and_dtypes(out.next_state) == _shapes_and_dtypes(state)
    assert jax.tree.structure(out.next_state) == jax.tree.structure(state)


def test_trainable_initial_state_receives_gradients_through_reset():
    lstm = LSTM(IN, HIDDEN, nnx.Rngs(4), trainable_initial_state=True)
    x = jnp.ones((2, IN))

    def loss(module: LSTM) -> jax.Array:
        state = module.reset_state(module.initialize_state(2))
        return jnp.sum(module(state, x).output)

    grads = nnx.grad(loss)(lstm)
    assert np.any(np.asarray(grads["initial_cell"][...]) != 0)
    assert np.any(np.asarray(grads["initial_hidden"][...]) != 0)
    assert nnx.state(LSTM(IN, HIDDEN, nnx.Rngs(4)), nnx.Param).get("initial_cell") is None


def test_rnns_reject_wrong_widths_naming_them(lstm: LSTM, gru: GRU):
    with pytest.raises(nnx_ppo.ContractError, match="in_features"):
        lstm(lstm.initialize_state(2), jnp.zeros((2, IN + 1)))
    with pytest.raises(nnx_ppo.ContractError, match="in_features"):
        gru(gru.initialize_state(2), jnp.zeros((2, IN + 1)))
    with pytest.raises(nnx_ppo.ContractError, match="hidden_features"):
        gru(jnp.zeros((2, HIDDEN + 1)), jnp.zeros((2, IN)))
    # LSTMCarry's fields share their hidden width: the contract names the one that differs.
    bad_carry = LSTMCarry(cell=jnp.zeros((2, HIDDEN)), hidden=jnp.zeros((2, HIDDEN + 1)))
    with pytest.raises(nnx_ppo.ContractError, match=r"argument state\.hidden does not match"):
        lstm(bad_carry, jnp.zeros((2, IN)))
    # Both wide agree with each other; the LSTM names the width it expected.
    wide_carry = LSTMCarry(cell=jnp.zeros((2, HIDDEN + 1)), hidden=jnp.zeros((2, HIDDEN + 1)))
    with pytest.raises(ValueError, match=r"state\.cell"):
        lstm(wide_carry, jnp.zeros((2, IN)))


@pytest.mark.parametrize("module_type", [LSTM, GRU])
@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((0, 4), {}, ValueError),
        ((3, -2), {}, ValueError),
        ((3, 4.0), {}, TypeError),
        ((3, 4), {"gate_fn": None}, TypeError),
        ((3, 4), {"activation_fn": "tanh"}, TypeError),
    ],
)
def test_rnns_reject_bad_constructor_arguments(module_type, args, kwargs, error):
    with pytest.raises(error, match=module_type.__name__):
        module_type(*args, nnx.Rngs(0), **kwargs)


def _population_graph() -> StatefulModule:
    from nnx_ppo.networks.graph import PopulationGraph

    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("a", 3, input_from="x")
    graph.add_output("b", 2)
    graph.connect("a", "b", delay=1)
    graph.finalize()
    return graph


@pytest.mark.parametrize(
    ("make", "as_input"),
    [
        (lambda: GRU(3, 4, nnx.Rngs(0)), lambda x: x),
        (lambda: LSTM(3, 4, nnx.Rngs(0)), lambda x: x),
        (_population_graph, lambda x: {"x": x}),
        (lambda: AR1VariationalBottleneck(3, nnx.Rngs(0)), lambda x: jnp.tile(x, 2)),
    ],
    ids=["gru", "lstm", "graph", "ar1"],
)
def test_a_carry_brought_back_to_the_host_steps_on(make: Callable[[], Any], as_input: Any):
    # The LSTM's and the graph's carries were annotated as JAX arrays only: a carry held
    # as NumPy's (jax.device_get between episodes) was refused, the GRU's accepted.
    module = make()
    carry = jax.device_get(module.initialize_state(2))
    stepped = module(carry, as_input(np.ones((2, 3), np.float32))).next_state
    module(jax.device_get(stepped), as_input(np.ones((2, 3), np.float32)))
    module.reset_state(carry)
