"""PopulationGraph: the contract, exact delays, resets, static order and clear build errors."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_ppo
import nnx_ppo.networks.graph as graph_package
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.contract import ContractError
from nnx_ppo.envs import make
from nnx_ppo.networks import (
    CategoricalSampler,
    Filter,
    Flattener,
    Normalizer,
    PPOAdapter,
    Scale,
    Sequential,
)
from nnx_ppo.networks.graph import PopulationGraph
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import check_module
from nnx_ppo.testing.modules import RunningSum, StatsRecorder


def identity() -> Scale:
    """A transform that hands its input on unchanged."""
    return Scale(1.0)


def recurrent_graph() -> PopulationGraph:
    """Two inputs, a delayed self-loop, delayed reciprocal connections, stateful transforms."""
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("sensory", 3, input_from="position", activation=jnp.tanh)
    graph.add_input("cue", 2, input_from="cue")
    graph.add_population("memory", 4, activation=jnp.tanh)
    graph.add_population("gate", 4)
    graph.add_population("echo", 3)
    graph.add_output("motor", 2, output_to="action")
    graph.connect("sensory", "echo", transform=Normalizer(3))
    graph.connect("echo", "memory")
    graph.connect("cue", "memory")
    graph.connect("memory", "memory", delay=2)
    graph.connect("memory", "gate", delay=1, reciprocal=True)
    graph.connect("gate", "gate", transform=RunningSum(4), delay=1)
    graph.connect("memory", "motor")
    graph.connect("gate", "motor")
    graph.connect("echo", "echo", transform=StatsRecorder(3), delay=1)
    graph.connect("motor", "motor", transform=RunningSum(2), delay=3)
    graph.finalize()
    return graph


def test_check_module_passes_on_a_graph_with_delayed_loops():
    example = {"position": jnp.zeros(3), "cue": jnp.zeros(2), "ignored": jnp.zeros(5)}
    check_module(recurrent_graph, example, batch_sizes=(1, 3), max_examples=3)


def test_check_module_passes_on_a_feedforward_graph():
    def build() -> PopulationGraph:
        graph = PopulationGraph(nnx.Rngs(1))
        graph.add_input("a", 2, input_from="x")
        graph.add_output("b", 3, activation=nnx.relu)
        graph.connect("a", "b")
        graph.finalize()
        return graph

    check_module(build, {"x": jnp.zeros(2)}, batch_sizes=(2,), max_examples=2)


def delay_line(delays: tuple[int, ...]) -> PopulationGraph:
    """``src`` copies ``x``; output ``d{k}`` is ``src`` through an identity with delay ``k``."""
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("src", 2, input_from="x")
    for k in delays:
        graph.add_output(f"d{k}", 2)
        graph.connect("src", f"d{k}", transform=identity(), delay=k)
    graph.finalize()
    return graph


def inputs(step: int, batch: int) -> dict[str, jax.Array]:
    """Values unique per (step, env, feature), so an output names the step it came from."""
    env = np.arange(batch)[:, None]
    return {"x": jnp.asarray(100.0 * (step + 1) + 10.0 * env + np.arange(2), jnp.float32)}


@pytest.mark.parametrize("delays", [(1, 2, 4), (4, 1, 2)])
def test_a_delay_k_connection_delivers_the_source_output_from_k_steps_earlier(delays):
    graph = delay_line(delays)
    state = graph.initialize_state(3)
    assert state["populations"]["src"]["buffer"].shape == (3, 4, 2)
    for step in range(7):
        out = graph(state, inputs(step, 3))
        for k in delays:
            expected = inputs(step - k, 3)["x"] if step >= k else jnp.zeros((3, 2))
            np.testing.assert_array_equal(out.output[f"d{k}"], expected)
        state = out.next_state


class ReplaysItsInput(StatefulModule):
    """Hands its input on and emits it; given that emission back (a replay), hands it on
    instead of the new input, as a sampler replays its stored action."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = x if rollout_extras is None else rollout_extras
        return StatefulModuleOutput(
            next_state=state,
            output=out,
            rollout_extras=x,
            metrics={},
            regularization_loss=jnp.zeros(()),
        )


def test_a_replay_hands_each_connection_its_own_emitted_extras():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("src", 2, input_from="x")
    graph.add_output("out", 2)
    graph.add_output("other", 2)
    graph.connect("src", "out", transform=ReplaysItsInput())
    graph.connect("src", "other", transform=Scale(3.0))
    graph.finalize()
    state = graph.initialize_state(3)
    first = graph(state, inputs(0, 3))
    replayed = graph(state, inputs(1, 3), first.rollout_extras)
    np.testing.assert_array_equal(replayed.output["out"], inputs(0, 3)["x"])
    np.testing.assert_array_equal(replayed.output["other"], 3 * inputs(1, 3)["x"])


def test_a_delayed_self_loop_accumulates():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("a", 1, input_from="x")
    graph.connect("a", "a", transform=identity(), delay=1)
    graph.add_output("o", 1)
    graph.connect("a", "o", transform=identity())
    graph.finalize()
    state = graph.initialize_state(1)
    totals = []
    for value in (1.0, 2.0, 3.0):
        out = graph(state, {"x": jnp.full((1, 1), value)})
        totals.append(float(out.output["o"][0, 0]))
        state = out.next_state
    assert totals == [1.0, 3.0, 6.0]


def test_reset_state_clears_the_ring_buffer_batched_and_per_env():
    graph = delay_line((2,))
    state = graph.initialize_state(2)
    for step in range(3):
        state = graph(state, inputs(step, 2)).next_state
    assert float(jnp.abs(state["populations"]["src"]["buffer"]).sum()) > 0
    for reset in (graph.reset_state(state), jax.vmap(graph.reset_state)(state)):
        np.testing.assert_array_equal(reset["populations"]["src"]["buffer"], jnp.zeros((2, 2, 2)))
        np.testing.assert_array_equal(reset["populations"]["src"]["buffer_idx"], [0, 0])
        # After a reset the delayed connection delivers zeros until it has filled again.
        first = graph(reset, inputs(10, 2))
        second = graph(first.next_state, inputs(11, 2))
        third = graph(second.next_state, inputs(12, 2))
        np.testing.assert_array_equal(first.output["d2"], jnp.zeros((2, 2)))
        np.testing.assert_array_equal(second.output["d2"], jnp.zeros((2, 2)))
        np.testing.assert_array_equal(third.output["d2"], inputs(10, 2)["x"])


def test_eager_and_jit_agree_over_a_rollout():
    graph = recurrent_graph()
    step = nnx.jit(lambda g, s, x: g(s, x))
    eager_state = jit_state = graph.initialize_state(2)
    key = jax.random.key(0)
    for _ in range(4):
        key, k1, k2 = jax.random.split(key, 3)
        x = {"position": jax.random.normal(k1, (2, 3)), "cue": jax.random.normal(k2, (2, 2))}
        eager, jitted = graph(eager_state, x), step(graph, jit_state, x)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
            (eager.output, eager.next_state, eager.regularization_loss),
            (jitted.output, jitted.next_state, jitted.regularization_loss),
        )
        eager_state, jit_state = eager.next_state, jitted.next_state


def test_the_evaluation_order_is_topological_static_and_survives_split_merge():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_output("z_out", 2)
    graph.add_population("m_mid", 2)
    graph.add_input("a_in", 2, input_from="x")
    graph.connect("m_mid", "z_out")
    graph.connect("a_in", "m_mid")
    graph.connect("z_out", "a_in", delay=1)
    graph.finalize()
    assert graph.evaluation_order == ("a_in", "m_mid", "z_out")
    definition, state = nnx.split(graph)
    assert nnx.merge(definition, state).evaluation_order == graph.evaluation_order


def test_evaluation_order_takes_the_earliest_declared_ready_population():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("x1", 2, input_from="a")
    graph.add_input("x2", 2, input_from="b")
    graph.add_population("y", 2)  # ready once x1 is placed
    graph.add_input("z", 2, input_from="c")  # ready from the start, declared after y
    graph.add_output("out", 2)
    graph.connect("x1", "y")
    graph.connect("y", "out")
    graph.connect("x2", "out")
    graph.connect("z", "out")
    graph.finalize()
    assert graph.evaluation_order == ("x1", "x2", "y", "z", "out")


def test_regularization_is_per_sample_not_summed_over_the_batch():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("a", 2, input_from="x")
    graph.add_output("o", 2)
    graph.connect("a", "o", transform=RunningSum(2))
    graph.connect("a", "o", transform=RunningSum(2), delay=1)
    graph.finalize()
    x = {"x": jnp.array([[1.0, 0.0], [0.0, 3.0]])}
    out = graph(graph.initialize_state(2), x)
    # The same-step RunningSum penalises 1e-3 * |x|^2 per row; the delayed one sees zeros.
    np.testing.assert_allclose(out.regularization_loss, [1e-3, 9e-3])
    assert set(out.metrics["connections"]) == {0, 1}


def test_a_zero_delay_cycle_fails_at_finalize_and_is_named():
    graph = PopulationGraph(nnx.Rngs(0))
    for name in ("a", "b", "c", "d"):
        graph.add_population(name, 2)
    graph.add_output("o", 2)
    graph.connect("d", "a")
    graph.connect("a", "b")
    graph.connect("b", "c")
    graph.connect("c", "a")
    graph.connect("c", "o")
    with pytest.raises(ValueError, match="zero-delay cycle: a -> b -> c -> a"):
        graph.finalize()


def test_a_zero_delay_self_loop_is_named():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_output("a", 2)
    graph.connect("a", "a")
    with pytest.raises(ValueError, match="zero-delay cycle: a -> a"):
        graph.finalize()


def test_build_errors_name_the_offender():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("a", 2, input_from="x")
    graph.add_output("o", 2, output_to="act")
    with pytest.raises(ValueError, match="duplicate population 'a'"):
        graph.add_population("a", 3)
    with pytest.raises(ValueError, match=r"duplicate output key 'act'.*'o' and 'p'"):
        graph.add_output("p", 2, output_to="act")
    with pytest.raises(ValueError, match="unknown destination population 'missing'"):
        graph.connect("a", "missing")
    with pytest.raises(ValueError, match="unknown source population 'ghost'"):
        graph.connect("ghost", "o")
    with pytest.raises(ValueError, match=r"connection a -> o: delay must .*got -1"):
        graph.connect("a", "o", delay=-1)
    with pytest.raises(ValueError, match="reciprocal=True"):
        graph.connect("a", "o", transform=identity(), reciprocal=True)
    with pytest.raises(ValueError, match="size of population 'b'"):
        graph.add_population("b", 0)
    with pytest.raises(ValueError, match="output_to of population 'p' is empty"):
        graph.add_output("p", 2, output_to="")
    assert len(graph.connections) == 0


def first_column(v: jax.Array) -> jax.Array:
    return v[:, :1]


@pytest.mark.parametrize("output", [True, False])
def test_an_activation_that_changes_the_width_is_named(output: bool) -> None:
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("a", 3, input_from="x", activation=None if output else first_column)
    graph.add_output("o", 3, activation=first_column if output else None)
    graph.connect("a", "o", delay=0 if output else 1)
    graph.finalize()
    name = "o" if output else "a"
    expected = rf"activation of population '{name}' \(first_column\) must keep the population's "
    with pytest.raises(ValueError, match=expected + r"shape \(B=2, 3\); found shape \(2, 1\)"):
        graph(graph.initialize_state(2), {"x": jnp.ones((2, 3))})


def test_finalize_is_required_and_final():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("i", 2, input_from="x")
    graph.add_output("o", 2)
    graph.connect("i", "o")
    with pytest.raises(RuntimeError, match="not finalized; call finalize"):
        graph.initialize_state(1)
    graph.finalize()
    with pytest.raises(RuntimeError, match="finalized: cannot add population 'b'"):
        graph.add_population("b", 2)
    with pytest.raises(RuntimeError, match="finalized: cannot connect 'o' -> 'o'"):
        graph.connect("o", "o", delay=1)
    with pytest.raises(RuntimeError, match="finalized: cannot finalize"):
        graph.finalize()


def test_a_population_that_receives_or_feeds_nothing_is_refused():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("i", 3, input_from="obs")
    graph.add_population("a", 4)
    graph.add_output("o", 4)
    graph.connect("i", "a")
    with pytest.raises(ValueError, match="population 'a' feeds nothing and is no output"):
        graph.finalize()
    # Fed back to itself, or to populations that reach no output, it is read by nothing
    # still: its parameters got no gradient.
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("i", 3, input_from="obs")
    graph.add_population("a", 4)
    graph.add_population("b", 4)
    graph.add_output("o", 4)
    graph.connect("i", "o")
    graph.connect("i", "a")
    graph.connect("a", "b")
    graph.connect("b", "b", delay=1)
    message = r"population 'a' feeds only \['b'\], on no path to an output, and is no output"
    with pytest.raises(ValueError, match=message):
        graph.finalize()
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("i", 3, input_from="obs")
    graph.add_output("o", 4)
    graph.add_output("p", 4, output_to="q")
    graph.connect("i", "o")
    with pytest.raises(ValueError, match="population 'p' receives no connection and reads no"):
        graph.finalize()


def test_a_graph_without_outputs_is_refused():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_population("a", 2)
    with pytest.raises(ValueError, match=r"no output population among \['a'\]"):
        graph.finalize()


def test_call_errors_name_the_key_and_the_connection():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_input("a", 2, input_from="x")
    graph.add_output("o", 3)
    graph.connect("a", "o", transform=identity(), delay=1)
    graph.finalize()
    state = graph.initialize_state(2)
    with pytest.raises(ValueError, match=r"'a' reads x\['x'\], but the input has keys \['y'\]"):
        graph(state, {"y": jnp.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"'a' reads x\['x'\] as \(B=2, 2\), found shape \(2, 5\)"):
        graph(state, {"x": jnp.zeros((2, 5))})
    with pytest.raises(ValueError, match=r"connection a -> o \(delay 1\) \(Scale\) must return"):
        graph(state, {"x": jnp.zeros((2, 2))})


GRAPH = delay_line((1, 2))
STALE = delay_line((1,)).initialize_state(3)  # a graph of one connection fewer
CARRY_RULE = "custom_containers.html#the-four-rules"


@pytest.mark.parametrize(
    ("call", "where", "leaf", "expected", "found"),
    [
        (
            lambda: GRAPH(STALE, inputs(0, 3)),
            "__call__",
            "state['connections']",
            "a list with one entry per connection (2)",
            "a list of length 1",
        ),
        (
            lambda: GRAPH(GRAPH.initialize_state(3), inputs(0, 3), {"connections": [None]}),
            "__call__",
            "rollout_extras['connections']",
            "a list with one entry per connection (2)",
            "a list of length 1",
        ),
        (
            lambda: GRAPH.reset_state(STALE),
            "reset_state",
            "prev_state['connections']",
            "a list with one entry per connection (2)",
            "a list of length 1",
        ),
        (
            lambda: GRAPH.update_statistics({"connections": [None, None, None]}),
            "update_statistics",
            "rollout_extras['connections']",
            "a list with one entry per connection (2)",
            "a list of length 3",
        ),
    ],
)
def test_a_carry_or_extras_without_one_entry_per_connection_is_named(
    call: Any, where: str, leaf: str, expected: str, found: str
) -> None:
    """A carry or history of a graph of other connections failed in an IndexError or a
    bare zip() error; the containers' per-child error names it."""
    with pytest.raises(ContractError) as raised:
        call()
    error = raised.value
    assert str(error).startswith(f"PopulationGraph.{where}: {leaf} does not hold one entry")
    assert (error.leaf, error.expected, error.found) == (leaf, expected, found)
    assert error.rule is not None and CARRY_RULE in error.rule


@pytest.mark.parametrize("method", ["__call__", "reset_state"])
@pytest.mark.parametrize(
    ("rings", "found"),
    [
        ({}, "a dict with keys []"),
        ({"src": None, "other": None}, "a dict with keys ['src', 'other']"),
    ],
)
def test_a_carry_without_the_graphs_ring_buffers_is_named(
    method: str, rings: dict[str, Any], found: str
) -> None:
    """A carry of a graph with other delayed sources failed in a KeyError in __call__,
    and reset_state handed its buffers on."""
    held = GRAPH.initialize_state(3)
    carry = {"populations": {name: held["populations"]["src"] for name in rings}}
    carry["connections"] = held["connections"]
    with pytest.raises(ContractError) as raised:
        if method == "__call__":
            GRAPH(carry, inputs(0, 3))
        else:
            GRAPH.reset_state(carry)
    error = raised.value
    leaf = "state" if method == "__call__" else "prev_state"
    assert str(error).startswith(
        f"PopulationGraph.{method}: {leaf}['populations'] does not hold one ring buffer per "
        "population a delayed connection reads."
    )
    assert (error.leaf, error.expected, error.found) == (
        f"{leaf}['populations']",
        "a dict with a RingBuffer for each population a delayed connection reads: ['src']",
        found,
    )


def test_a_carry_without_its_connections_is_named_with_checks_on_and_off() -> None:
    # With the checks on, the carry's TypedDict annotation names the key first.
    carry = {"populations": STALE["populations"]}
    with pytest.raises(ContractError, match=r"argument prev_state\['connections'\] is missing"):
        GRAPH.reset_state(carry)
    with nnx_ppo.checks(False), pytest.raises(ContractError) as raised:
        GRAPH.reset_state(carry)
    error = raised.value
    assert (error.leaf, error.expected, error.found) == (
        "prev_state",
        "a dict whose 'connections' list holds one entry per connection (2)",
        "a dict with keys ['populations']",
    )


def test_a_stale_graph_carry_is_named_under_jit_inside_a_container_and_without_checks() -> None:
    net = Sequential([Scale(1.0), GRAPH])
    with pytest.raises(ContractError, match=r"^Sequential\.layers\[1\] \(PopulationGraph\)"):
        nnx.jit(lambda m, s, x: m(s, x))(net, [(), STALE], inputs(0, 3))
    with nnx_ppo.checks(False), pytest.raises(ContractError, match=r"found: +a list of length 1"):
        GRAPH.reset_state(STALE)


def test_reciprocal_adds_both_directions_with_their_own_dense():
    graph = PopulationGraph(nnx.Rngs(0))
    graph.add_population("a", 3)
    graph.add_output("b", 2)
    graph.connect("a", "b", delay=1, reciprocal=True)
    graph.finalize()
    edges = [(c.src, c.dst, c.delay) for c in graph.connections]
    assert edges == [("a", "b", 1), ("b", "a", 1)]
    shapes = [c.transform.linear.kernel.shape for c in graph.connections]
    assert shapes == [(3, 2), (2, 3)]


def test_all_is_exactly_the_public_names():
    public = {
        name
        for name, value in vars(graph_package).items()
        if not name.startswith("_") and isinstance(value, type)
    }
    assert sorted(graph_package.__all__) == sorted(public)


def graph_memory_policy(obs_size: int, n_actions: int, rngs: nnx.Rngs) -> Sequential:
    """An actor-critic whose only memory is the graph's delayed self-loop on ``memory``."""
    graph = PopulationGraph(rngs)
    graph.add_input("sensory", obs_size, input_from="obs")
    graph.add_population("memory", 32, activation=jnp.tanh)
    graph.add_output("policy", n_actions)
    graph.add_output("value", 1)
    graph.connect("sensory", "memory")
    graph.connect("memory", "memory", delay=1)
    graph.connect("memory", "policy")
    graph.connect("memory", "value")
    graph.finalize()
    return Sequential(
        [
            Filter({"obs": lambda obs: obs}),
            graph,
            PPOAdapter(
                action=Sequential(
                    [
                        Filter({"policy": "policy"}),
                        Flattener(),
                        CategoricalSampler(rngs, entropy_weight=0.01),
                    ]
                ),
                value=Sequential([Filter({"value": "value"}), Flattener()]),
            ),
        ]
    )


def test_a_graph_policy_learns_the_memory_task():
    env = make("memory")
    network = graph_memory_policy(env.observation_size, env.action_size, nnx.Rngs(0))
    config = TrainConfig(
        ppo=PPOConfig(
            n_envs=32,
            rollout_length=24,
            total_steps=15_000,
            learning_rate=3e-3,
            critic_loss_weight=0.5,
            gradient_clipping=0.5,
        ),
        eval=EvalConfig(every_steps=15_000, n_envs=256, max_episode_length=10),
        seed=0,
    )
    result = train_ppo(env, network, config)
    # Remembering the cue scores 1; without memory the expected return is 0.
    assert result.eval_history[-1]["eval/episode_reward/mean"] >= 0.9
