"""nnx_ppo.summary: every row agrees with what its module really does on a real batch."""

import io
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from rich.console import Console
from transformed_modules import DenseEnsemble

import nnx_ppo
from nnx_ppo import envs
from nnx_ppo.cli.main import main
from nnx_ppo.contract.checking import CallRecord, checks, format_graph_path, observe_calls
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.network_summary import LeafShape, ModuleRow, NetworkSummary, print_summary
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

B, T = 3, 2


def shapes(tree: Any, axes: tuple[str, ...] = ("B",)) -> list[tuple[str, tuple[Any, ...], str]]:
    """(key, shape with its leading len(axes) sizes replaced by their names, dtype) per leaf."""
    return [
        (jax.tree_util.keystr(path), (*axes, *leaf.shape[len(axes) :]), str(leaf.dtype))
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def as_tuples(leaves: tuple[LeafShape, ...] | None) -> list[tuple[str, tuple[Any, ...], str]]:
    assert leaves is not None
    return [(leaf.key, leaf.shape, leaf.dtype) for leaf in leaves]


def modules_by_path(network: StatefulModule) -> dict[str, StatefulModule]:
    return {
        format_graph_path(network, tuple(path)): node
        for path, node in nnx.iter_graph(network)
        if isinstance(node, StatefulModule)
    }


def real_calls(network: StatefulModule, obs: Any) -> list[tuple[str, CallRecord]]:
    """A compiled step and update_statistics on a batch of B: each checked call, with its path."""
    records: list[tuple[str, CallRecord]] = []

    @nnx.jit
    def step(network: StatefulModule, x: Any) -> None:
        inner = {id(module): path for path, module in modules_by_path(network).items()}
        with checks(True), observe_calls(lambda r: records.append((inner[id(r.module)], r))):
            out = network(network.initialize_state(B), x)
            history = jax.tree.map(lambda e: jnp.stack([e] * T), out.rollout_extras)
            network.update_statistics(history)

    step(network, jax.tree.map(lambda leaf: jnp.stack([leaf] * B), obs))
    return records


def param_count(module: Any) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(module, nnx.Param)))


def check_against_a_real_step(name: str) -> NetworkSummary:
    env = envs.make(name)
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
    obs = env.reset(jax.random.key(0)).obs
    result = nnx_ppo.summary(network, obs)
    assert result.error is None
    assert result.rows[0].path == "" and result.rows[0].depth == 0
    assert result.parameters == param_count(network) > 0

    modules = modules_by_path(network)
    called = real_calls(network, obs)
    calls = {path: r for path, r in called if r.method == "__call__"}
    histories = {path: r for path, r in called if r.method == "update_statistics"}
    rows = {row.path: row for row in result.rows}
    assert set(rows) == set(calls)
    for path, row in rows.items():
        record = calls[path]
        assert row.module_class == type(record.module).__name__
        assert row.depth == record.depth
        assert as_tuples(row.input) == shapes(dict(record.arguments)["x"])
        assert as_tuples(row.carry) == shapes(dict(record.arguments)["state"])
        assert as_tuples(row.output) == shapes(record.result.output)
        assert as_tuples(row.extras) == shapes(record.result.rollout_extras)
        assert row.parameters == param_count(modules[path])
        assert row.error is None
        if row.keeps_statistics:
            history = dict(histories[path].arguments)["rollout_extras"]
            assert as_tuples(row.history) == shapes(history, ("T", "B"))
    return result


def test_cartpole_rows_match_a_real_step() -> None:
    result = check_against_a_real_step("cartpole")
    (normalizer,) = [row for row in result.rows if row.keeps_statistics]
    assert normalizer.module_class == "Normalizer" and normalizer.parameters == 0
    assert [str(leaf) for leaf in normalizer.history or ()] == ["(T, B, 4)"]
    assert [str(leaf) for leaf in result.rows[0].input or ()] == ["(B, 4)"]


def test_lstm_memory_preset_rows_match_a_real_step() -> None:
    result = check_against_a_real_step("memory")
    (lstm,) = [row for row in result.rows if row.module_class == "LSTM"]
    assert [str(leaf) for leaf in lstm.carry] == [".cell (B, 8)", ".hidden (B, 8)"]


def test_two_agent_rows_match_a_real_step() -> None:
    result = check_against_a_real_step("two_agent")
    root = result.rows[0]
    assert [str(leaf) for leaf in root.input or ()] == ["['agent_0'] (B, 4)", "['agent_1'] (B, 4)"]
    assert "['agent_1']" in str(result)


def test_an_abstract_input_works_and_the_network_is_left_unchanged() -> None:
    env = envs.make("cartpole")
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
    before = jax.tree.map(lambda leaf: leaf, nnx.state(network))
    abstract_obs = jax.eval_shape(env.reset, jax.random.key(0)).obs
    result = nnx_ppo.summary(network, abstract_obs)
    assert result.error is None and len(result.rows) == 10
    after = nnx.state(network)
    assert jax.tree.structure(before) == jax.tree.structure(after)
    assert all(a is b for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True))


class DropsTheBatch(StatefulModule):
    """Averages its carry over the batch: the carry loses its batch axis."""

    def initialize_state(self, batch_size: int) -> dict[str, jax.Array]:
        return {"h": jnp.zeros((batch_size, 3))}

    def __call__(
        self, state: dict[str, jax.Array], x: jax.Array, rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        h = 0.9 * state["h"] + x
        return StatefulModuleOutput({"h": h.mean(axis=0)}, h, jnp.zeros(()), {})


def test_a_violation_ends_the_table_at_the_failing_module_and_marks_it() -> None:
    rngs = nnx.Rngs(0)
    network = Sequential([Dense(4, 3, rngs), DropsTheBatch(), Dense(3, 2, rngs)])
    result = nnx_ppo.summary(network, jnp.zeros(4))

    assert isinstance(result.error, nnx_ppo.ContractError)
    assert [(row.path, row.module_class) for row in result.rows] == [
        ("", "Sequential"),
        (".layers[0]", "Dense"),
        (".layers[1]", "DropsTheBatch"),
    ]
    root, dense, failing = result.rows
    assert root.error is None and root.output is None  # its call raised, through its child
    assert dense.error is None and as_tuples(dense.output) == [("", ("B", 3), "float32")]
    assert failing.error is result.error and failing.output is None
    assert as_tuples(failing.carry) == [("['h']", ("B", 3), "float32")]
    assert result.error.leaf == "next_state['h']"
    assert "DropsTheBatch" in (result.error.where or "")

    text = str(result)
    marked = [line for line in text.splitlines() if "✗" in line]
    assert len(marked) == 1 and ".layers[1] (DropsTheBatch) ✗" in marked[0]
    assert "contract violation:" in text
    assert f"found:    {result.error.found}" in text


class Doubled(Dense):
    """A subclass that calls its parent's ``__call__`` through ``super()``."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        return out.replace(output=2 * out.output)


class DropsTheBatchTwice(DropsTheBatch):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return super().__call__(state, 2 * x, rollout_extras)


def test_a_call_through_super_is_one_row_and_its_violation_marks_it() -> None:
    rngs = nnx.Rngs(0)
    result = nnx_ppo.summary(Sequential([Dense(4, 3, rngs), Doubled(3, 2, rngs)]), jnp.zeros(4))
    assert [(row.path, row.depth, row.module_class) for row in result.rows] == [
        ("", 0, "Sequential"),
        (".layers[0]", 1, "Dense"),
        (".layers[1]", 1, "Doubled"),
    ]

    result = nnx_ppo.summary(Sequential([Dense(4, 3, rngs), DropsTheBatchTwice()]), jnp.zeros(4))
    assert [row.module_class for row in result.rows] == [
        "Sequential",
        "Dense",
        "DropsTheBatchTwice",
    ]
    assert result.rows[-1].error is result.error is not None


class KeepsStatistics(StatefulModule):
    """Emits its input for update_statistics, which it does not route from anywhere."""

    def __init__(self) -> None:
        self.count = nnx.BatchStat(jnp.zeros(()))

    def __call__(
        self, state: Any, x: jax.Array, rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, x)

    def update_statistics(self, rollout_extras: jax.Array) -> None:
        self.count.value = self.count.value + rollout_extras.shape[0]


class ForgetsStatistics(StatefulModule):
    """A wrapper that routes __call__ but inherits the no-op update_statistics."""

    def __init__(self) -> None:
        self.inner = KeepsStatistics()

    def __call__(
        self, state: Any, x: jax.Array, rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return self.inner(state, x, rollout_extras)


def test_a_violation_in_update_statistics_marks_the_row_whose_check_raised() -> None:
    result = nnx_ppo.summary(ForgetsStatistics(), jnp.zeros(2))
    assert result.error is not None and "never reached" in str(result.error)
    root, inner = result.rows
    assert root.error is result.error and inner.error is None
    assert inner.keeps_statistics and inner.history is None
    assert as_tuples(inner.extras) == [("", ("B", 2), "float32")]


def test_print_summary_prints_and_returns_the_summary() -> None:
    rngs = nnx.Rngs(0)
    buffer = io.StringIO()
    result = print_summary(
        Sequential([Dense(4, 3, rngs), Dense(3, 2, rngs)]),
        jnp.zeros(4),
        Console(file=buffer, width=120, color_system=None),
    )
    assert result.parameters == 4 * 3 + 3 + 3 * 2 + 2
    printed = buffer.getvalue()
    assert "Sequential: 23 parameters" in printed
    assert "(B, 4)" in printed and "(B, 2)" in printed
    assert isinstance(result.rows[1], ModuleRow)


def test_statistics_under_frozen_statistics_show_as_frozen() -> None:
    from nnx_ppo.networks.containers import FrozenStatistics
    from nnx_ppo.networks.normalizer import Normalizer

    buffer = io.StringIO()
    print_summary(
        Sequential([FrozenStatistics(Normalizer(3)), Normalizer(3)]),
        jnp.zeros(3),
        Console(file=buffer, width=160, color_system=None),
    )
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    frozen = next(line for line in lines if ".module (Normalizer)" in line)
    live = next(line for line in lines if ".layers[1] (Normalizer)" in line)
    assert frozen.endswith("frozen")  # the step completed; no history reaches it
    assert live.endswith("(T, B, 3)")


def test_off_a_terminal_the_summary_is_not_folded_to_the_consoles_width() -> None:
    env = envs.make("cartpole")
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=[8])
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, color_system=None)  # a log file: no terminal
    print_summary(network, jnp.zeros(4), console)
    lines = buffer.getvalue().splitlines()
    assert max(map(len, lines)) > 80 and console.width == 80
    assert any(".layers[0] (Normalizer)" in line for line in lines)
    assert any("[1]['action'][2] (B,) key<fry>" in line for line in lines)


def test_on_a_narrow_terminal_every_cell_folds_and_a_narrower_one_gets_blocks() -> None:
    # Deep paths in a module column kept whole left the other columns no room at all.
    rngs = nnx.Rngs(0)
    wide = {f"agent_number_{i}": Sequential([Dense(4, 4, rngs), Dense(4, 2, rngs)]) for i in (1, 2)}
    network = Sequential([Sequential([Sequential([nnx_ppo.networks.Map(**wide)])])])
    example = {name: jnp.zeros(4) for name in wide}

    def printed(width: int, terminal: bool) -> str:
        buffer = io.StringIO()
        console = Console(file=buffer, width=width, force_terminal=terminal, color_system=None)
        print_summary(network, example, console)
        return buffer.getvalue()

    def characters(text: str) -> list[str]:  # folding moves characters, never drops one
        return sorted(text.replace("─", "").replace(" ", "").replace("\n", ""))

    whole = printed(160, terminal=False)
    for width in (72, 80):
        folded = printed(width, terminal=True)
        assert max(map(len, folded.splitlines())) <= width
        assert characters(folded) == characters(whole)
    blocks = printed(50, terminal=True)
    assert max(map(len, blocks.splitlines())) <= 50
    assert "    input: ['agent_number_1'] (B, 4)" in blocks
    assert blocks.count("params:") == len(summary_rows := nnx_ppo.summary(network, example).rows)
    assert len(summary_rows) == 10
    # A violation's first line wraps as its others do: it was cut at the console's width.
    broken = Sequential([nnx_ppo.networks.Parallel(**wide)])  # each Dense given the dict
    buffer = io.StringIO()
    print_summary(broken, example, Console(file=buffer, width=60, force_terminal=True))
    said = buffer.getvalue().replace("\n", "")
    assert "Sequential.layers[0].components['agent_number_1'].layers[0] (Dense).__call__" in said


class StopsTraining(Exception):
    """Raised in place of training: the CLI test needs only what is printed before it."""


@pytest.mark.parametrize("quiet", [False, True])
def test_train_prints_the_summary_unless_quiet(
    quiet: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def train_ppo(*args: Any, **kwargs: Any) -> None:
        raise StopsTraining

    monkeypatch.setattr("nnx_ppo.algorithms.ppo.train_ppo", train_ppo)
    flags = ["--set", "network.hidden_sizes=[4]", *(["--quiet"] if quiet else [])]
    # Raised in this file, the stand-in is reported as a user's code's error: status 1.
    assert main(["train", "--run-dir", str(tmp_path), *flags]) == 1
    printed = capsys.readouterr().out
    assert ("Sequential: 55 parameters" in printed) is not quiet


class UnbatchedCarry(StatefulModule):
    """Its initialize_state forgets the batch axis."""

    def initialize_state(self, batch_size: int) -> jax.Array:
        return jnp.zeros(3)

    def __call__(
        self, state: jax.Array, x: jax.Array, rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {})


def test_a_violation_in_initialize_state_lists_the_modules_asked_for_a_carry() -> None:
    network = Sequential([Dense(4, 3, nnx.Rngs(0)), UnbatchedCarry()])
    with nnx_ppo.checks(False):  # the summary turns the checks on for its step
        result = nnx_ppo.summary(network, jnp.zeros(4))
    assert result.error is not None and result.error.found == "shape (3,) float32"
    assert [(row.path, row.input, row.error is not None) for row in result.rows] == [
        ("", None, False),
        (".layers[0]", None, False),
        (".layers[1]", None, True),
    ]


def test_a_module_at_two_places_has_each_path_and_its_parameters_counted_once() -> None:
    dense = Dense(4, 4, rngs=nnx.Rngs(0))
    result = nnx_ppo.summary(Sequential([dense, Sequential([dense]), dense]), jnp.zeros(4))
    assert [(row.path, row.shared) for row in result.rows] == [
        ("", False),
        (".layers[0]", False),
        (".layers[1]", False),
        (".layers[1].layers[0]", True),
        (".layers[2]", True),
    ]
    assert result.parameters == param_count(dense) == 20
    lines = str(result).splitlines()
    assert lines[0].strip() == "Sequential: 20 parameters"
    assert [line.split()[-1] for line in lines[3:]] == ["20", "20", "20", "shared", "shared"]


def test_a_batch_given_as_the_example_input_gets_a_hint() -> None:
    network = make_default_network(envs.CartPole(), nnx.Rngs(0), hidden_sizes=(4,))

    with pytest.raises(ValueError, match=r"x has shape \(37, 37, 4\)") as caught:
        nnx_ppo.summary(network, jnp.zeros((37, 4)))

    assert any("example_input is ONE sample" in note for note in caught.value.__notes__)


def test_modules_called_inside_a_transform_count_in_their_container_s_row() -> None:
    # The heads' calls were shown as one 20-parameter Dense "not in the network's graph".
    rngs = nnx.Rngs(0)
    table = nnx_ppo.summary(Sequential([DenseEnsemble(rngs), Dense(4, 2, rngs)]), jnp.zeros(4))
    assert [(row.path, row.module_class, row.parameters) for row in table.rows] == [
        ("", "Sequential", 70),
        (".layers[0]", "DenseEnsemble", 60),
        (".layers[1]", "Dense", 10),
    ]
