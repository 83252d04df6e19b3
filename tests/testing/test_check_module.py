"""check_module: what it accepts, what its errors carry, that it compiles little and
changes nothing, and the pytest plugin that serves it as a fixture."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from jaxtyping import Array

import nnx_ppo
from nnx_ppo.networks.containers import Parallel, Sequential
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import ContractPropertyError, ModuleProperty, check_module
from nnx_ppo.testing.module_properties import (
    MAX_EXAMPLES_ENV_VAR,
    MODULE_PROPERTIES,
    _dependencies,
)
from nnx_ppo.testing.modules import Linear, RunningSum, StatsRecorder
from nnx_ppo.testing.strategies import pytree_observations


class Accumulator(StatefulModule):
    """A correct module over a dict input with a float, an int and a bool leaf."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"sum": jnp.zeros((batch_size, 2)), "count": jnp.zeros((batch_size,), jnp.int32)}

    def reset_state(self, prev_state: Any) -> Any:
        return jax.tree.map(jnp.zeros_like, prev_state)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        gate = jnp.where(x["on"], 1.0, -1.0)[:, None]
        total = state["sum"] + gate * x["value"] * x["scale"][:, None]
        count = state["count"] + 1
        return StatefulModuleOutput(
            {"sum": total, "count": count}, total, jnp.zeros(()), {"count": count}, None
        )


ACCUMULATOR_INPUT = {
    "value": jax.ShapeDtypeStruct((2,), jnp.float32),
    "scale": jax.ShapeDtypeStruct((), jnp.int32),
    "on": jax.ShapeDtypeStruct((), jnp.bool_),
}


def test_the_table_orders_every_property_once_and_the_docstring_lists_it() -> None:
    assert [row.property for row in MODULE_PROPERTIES] == list(ModuleProperty)
    doc = check_module.__doc__ or ""
    listed = [doc.index(f"{number}. ``{prop}``:") for number, prop in enumerate(ModuleProperty, 1)]
    assert listed == sorted(listed)
    words = " ".join(doc.replace("\\*", "*").split())  # the docstring escapes reST's "*"
    for row in MODULE_PROPERTIES:
        assert " ".join(row.rule.split()) in words


def test_modules_and_factories_with_pytree_inputs_pass() -> None:
    check_module(Accumulator(), ACCUMULATOR_INPUT, max_examples=5)
    check_module(lambda: Linear(6, 2, rngs=nnx.Rngs(0)), jnp.zeros((2, 3)), max_examples=5)
    check_module(
        Sequential([RunningSum(3), StatsRecorder(3)]), np.zeros(3, np.float32), max_examples=5
    )


def test_the_checked_module_is_left_unchanged() -> None:
    recorder = StatsRecorder(3)
    sampler = CategoricalSampler(nnx.Rngs(0), 0.01)
    before = [
        jax.tree.map(np.asarray, nnx.state(m, nnx.Not(nnx.RngKey))) for m in (recorder, sampler)
    ]

    check_module(recorder, jnp.zeros(3), max_examples=3)
    check_module(sampler, jnp.zeros(3), max_examples=3, stochastic=True)

    after = [
        jax.tree.map(np.asarray, nnx.state(m, nnx.Not(nnx.RngKey))) for m in (recorder, sampler)
    ]
    jax.tree.map(np.testing.assert_array_equal, before, after)
    assert int(recorder.updates[...]) == 0


class TraceCounter(RunningSum):
    """Counts how often JAX traces its __call__, and how often it is called eagerly."""

    traces: ClassVar[int] = 0
    eager_calls: ClassVar[int] = 0

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        if isinstance(x, jax.core.Tracer):
            TraceCounter.traces += 1
        else:
            TraceCounter.eager_calls += 1
        return super().__call__(state, x, rollout_extras)


def test_the_step_compiles_once_per_batch_size_and_mode() -> None:
    TraceCounter.traces = 0
    check_module(TraceCounter(2), jnp.zeros(2), batch_sizes=(1, 2), max_examples=12)
    # Two batch sizes, each in rollout (extras None) and in replay (extras given).
    assert 1 <= TraceCounter.traces <= 4


class SmallLeak(RunningSum):
    """Leaks a thousandth of the batch mean into every row."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return super().__call__(state, x + 1e-3 * x.mean(axis=0), rollout_extras)


def test_the_tolerance_is_the_callers() -> None:
    with pytest.raises(ContractPropertyError):
        check_module(SmallLeak(2), jnp.zeros(2), max_examples=5)
    check_module(SmallLeak(2), jnp.zeros(2), max_examples=5, rtol=0.0, atol=0.1)


class ConstantScale(StatefulModule):
    """A constant kept as a plain array attribute (Flax NNX state, no Variable), and a
    Python number as the regularization loss: both allowed."""

    def __init__(self) -> None:
        self.scale = jnp.array([1.0, 2.0, 3.0])

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput((), x * self.scale, 0.0, {}, None)


def test_a_plain_array_attribute_and_a_python_number_loss_pass() -> None:
    # The kit read every state leaf as a Variable: AttributeError 'get_value'.
    check_module(ConstantScale, jnp.zeros(3), max_examples=3)


class NormalizerEnsemble(StatefulModule):
    """Three Normalizers made, called and updated through nnx.vmap (contract.rst's
    ensemble idiom): each transform calls a copy of the members, never the node itself."""

    def __init__(self) -> None:
        @nnx.vmap(in_axes=None, out_axes=0, axis_size=3)
        def make() -> Normalizer:
            return Normalizer(4)

        self.members = make()

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        def one(member: Normalizer, x: Array) -> tuple[Array, Array]:
            out = member((), x)
            return out.output, out.rollout_extras

        y, extras = nnx.vmap(one, in_axes=(0, None), out_axes=1)(self.members, x)
        return StatefulModuleOutput((), y.mean(axis=1), jnp.zeros(()), {}, extras)

    def update_statistics(self, rollout_extras: Any) -> None:  # (T, B, 3, 4)
        nnx.vmap(lambda member, h: member.update_statistics(h), in_axes=(0, 2))(
            self.members, rollout_extras
        )


def test_statistics_routed_through_an_nnx_transform_reach_the_members() -> None:
    # The routing check matched reached modules by identity: "update_statistics never
    # reached NormalizerEnsemble.members (Normalizer)".
    check_module(NormalizerEnsemble, jnp.zeros(4), max_examples=2)


class HalfPrecisionCarry(RunningSum):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        return out.replace(
            next_state={**out.next_state, "total": out.next_state["total"].astype(jnp.float16)}
        )


def test_a_contract_error_is_wrapped_with_its_cause_even_with_checks_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(nnx_ppo.CHECKS_ENV_VAR, "0")
    with pytest.raises(ContractPropertyError) as caught:
        check_module(HalfPrecisionCarry(2), jnp.zeros(2), max_examples=3)
    error = caught.value
    assert isinstance(error, AssertionError)
    assert isinstance(error.cause, nnx_ppo.ContractError)
    assert error.property == ModuleProperty.CARRY_PRESERVATION
    assert error.leaf == "next_state['total']"
    assert error.sizes == {"B": 1, "T": 1}
    assert "changed the dtype from float32 to float16" in str(error)
    # Hypothesis adds the failing example; it shows the sizes, not the arrays.
    assert any("Example(B=1, T=1" in note for note in getattr(error, "__notes__", []))


def test_stochastic_requires_keys_in_the_carry() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(RunningSum(2), jnp.zeros(2), stochastic=True, max_examples=3)
    assert caught.value.property == ModuleProperty.PER_ENV_KEYS
    assert "holds no typed PRNG keys" in str(caught.value)


def test_an_error_inside_the_module_is_reported_with_the_property() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(Normalizer(3), jnp.zeros(4), max_examples=3)
    assert caught.value.property == ModuleProperty.CHECKED_CALL
    assert isinstance(caught.value.cause, ValueError)
    assert "Normalizer.__call__: x has shape (1, 4), expected (B, 3)" in str(caught.value)


class ParamStatistics(StatsRecorder):
    """Records histories like StatsRecorder, but keeps the count of updates in an nnx.Param."""

    def __init__(self, features: int) -> None:
        super().__init__(features)
        self.seen = nnx.Param(jnp.zeros(()))

    def update_statistics(self, rollout_extras: Any) -> None:
        super().update_statistics(rollout_extras)
        self.seen[...] = self.seen[...] + 1.0


def test_a_statistic_kept_in_an_nnx_param_is_named_with_its_module_path() -> None:
    network = Sequential([RunningSum(3), ParamStatistics(3)])
    with pytest.raises(ContractPropertyError) as caught:
        check_module(network, jnp.zeros(3), max_examples=3)
    error = caught.value
    assert error.property == ModuleProperty.STATISTICS_NOT_TRAINED
    # The runtime check sees the write first; the kit files it under its own property.
    assert error.leaf == "Sequential.layers[1].seen (Param)"
    message = str(error)
    assert "update_statistics wrote the variable Sequential.layers[1].seen (Param)" in message
    assert "running statistics are nnx.BatchStat" in message


class ParamStatisticsUpdatedInPlace(StatsRecorder):
    """Records histories like StatsRecorder, and keeps a running mean in a dict held by an
    nnx.Param, updated in place: the variable keeps its value object, the dict a new leaf."""

    def __init__(self, features: int) -> None:
        super().__init__(features)
        self.moments = nnx.Param({"mean": jnp.zeros(features)})

    def update_statistics(self, rollout_extras: Any) -> None:
        super().update_statistics(rollout_extras)
        moments = self.moments.get_raw_value()
        moments["mean"] = 0.9 * moments["mean"] + 0.1 * rollout_extras.mean(axis=(0, 1))


def test_a_param_written_in_place_is_named_by_the_runtime_check() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(ParamStatisticsUpdatedInPlace(3), jnp.zeros(3), max_examples=3)
    error = caught.value
    assert error.property == ModuleProperty.STATISTICS_NOT_TRAINED, str(error)
    assert isinstance(error.cause, nnx_ppo.ContractError), str(error)
    assert error.leaf == "ParamStatisticsUpdatedInPlace.moments (Param)"
    assert "update_statistics wrote the variable ParamStatisticsUpdatedInPlace.moments" in str(
        error
    )


def test_a_batched_example_input_gets_a_hint_that_it_is_one_sample() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(RunningSum(4), jnp.zeros((8, 4)), max_examples=3)
    message = str(caught.value)
    assert caught.value.property == ModuleProperty.CHECKED_CALL
    assert "found:    f32[1,8,4]" in message
    assert (
        "hint:     example_input is ONE sample, without the batch axis: the kit adds B "
        "itself. Every leaf of yours leads with 8 (example_input (8, 4)); if 8 is a batch, "
        "pass one sample, e.g. example_input[0]" in message
    ), message


def test_a_single_axis_example_input_gets_no_batch_hint() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(HalfPrecisionCarry(2), jnp.zeros(2), max_examples=3)
    assert "hint:" not in str(caught.value)


def test_the_environment_variable_sets_the_default_number_of_examples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    TraceCounter.eager_calls = 0
    monkeypatch.setenv(MAX_EXAMPLES_ENV_VAR, "4")
    check_module(TraceCounter(2), jnp.zeros(2), batch_sizes=(2,), time_lengths=(2,))
    # Each example calls the module eagerly twice (the eager-vs-compiled property).
    assert TraceCounter.eager_calls == 2 * 4
    monkeypatch.setenv(MAX_EXAMPLES_ENV_VAR, "many")
    with pytest.raises(ValueError, match="NNX_PPO_MAX_EXAMPLES must be a positive int"):
        check_module(TraceCounter(2), jnp.zeros(2))
    TraceCounter.eager_calls = 0
    monkeypatch.setenv(MAX_EXAMPLES_ENV_VAR, "")  # a CI variable left blank: unset
    check_module(TraceCounter(2), jnp.zeros(2), batch_sizes=(2,), time_lengths=(2,))
    assert TraceCounter.eager_calls == 2 * 10


@pytest.mark.filterwarnings("error")
def test_an_example_input_in_numpy_s_default_dtypes_draws_without_a_warning() -> None:
    # float64 and int64, which JAX (x64 off) truncates with a warning at every draw: a
    # suite run with -W error failed.
    example = {"value": np.zeros(2), "scale": np.zeros((), np.int64), "on": np.zeros((), bool)}
    check_module(Accumulator(), example, batch_sizes=(2,), time_lengths=(2,), max_examples=2)


@settings(max_examples=3, database=None, deadline=None)
@given(pytree_observations(jax.ShapeDtypeStruct((3,), jnp.complex64), batch_size=2))
def test_complex_inputs_are_drawn_with_an_imaginary_part(x: Array) -> None:
    # With the imaginary part 0, a module mixing envs through it would pass every check.
    assert x.dtype == jnp.complex64
    assert bool((x.imag != 0).all())


def _checkpointed(x: Array, y: Array) -> Any:
    return jax.checkpoint(lambda x, y: (2 * x, y))(x, y)


@jax.custom_jvp
def _triple(x: Array) -> Array:
    return 3 * x


_triple.defjvp(lambda primals, tangents: (3 * primals[0], 3 * tangents[0]))


@jax.custom_vjp
def _double(x: Array) -> Array:
    return 2 * x


_double.defvjp(lambda x: (2 * x, None), lambda _, g: (2 * g,))


def _chosen(p: Array, x: Array, y: Array) -> Array:
    return jax.lax.cond(p.sum() > 0, lambda x, y: x, lambda x, y: 2 * x, x, y)


def _scanned(a: Array, b: Array, xs: Array) -> Any:
    # b takes a's value at each step: only the fixed point over the carry sees it, and
    # after one step or more b's first value is gone.
    return jax.lax.scan(lambda carry, x: ((carry[0], carry[0] + x), x), (a, b), xs)


def _looped(i: Array, a: Array, b: Array, unused: Array) -> Any:
    return jax.lax.while_loop(
        lambda c: c[0].sum() < 3, lambda c: (c[0] + 1, c[1], c[2] + c[1]), (i, a, b)
    )


@pytest.mark.parametrize(
    ("function", "arguments", "expected"),
    [
        (_checkpointed, 2, [{0}, {1}]),
        (lambda x, y: (_triple(x), _double(y)), 2, [{0}, {1}]),
        # The branch index decides every output; the operand no branch returns, none.
        (_chosen, 3, [{0, 1}]),
        (_scanned, 3, [{0}, {0, 2}, {2}]),
        # How often the body runs (i) decides every carry the body changes.
        (_looped, 4, [{0}, {1}, {0, 1, 2}]),
    ],
)
def test_where_values_flow_is_followed_into_inner_programs(
    function: Any, arguments: int, expected: list[set[int]]
) -> None:
    # A wrapper such as jax.checkpoint taken as "every output depends on every input" hid
    # a module drawing from a fixed key, or reading its log-likelihood back, inside it.
    program = jax.make_jaxpr(function)(*(jnp.ones(2) for _ in range(arguments)))
    masks = _dependencies(program.jaxpr, [1 << i for i in range(arguments)])
    assert [{i for i in range(arguments) if mask >> i & 1} for mask in masks] == expected


def test_batch_sizes_without_two_envs_are_refused() -> None:
    # With B=1 only, no property compares one env's rows with another's: a carry averaged
    # over the batch passed.
    with pytest.raises(ValueError, match=r"batch_sizes \(1,\) has no size of 2 or more"):
        check_module(TraceCounter(2), jnp.zeros(2), batch_sizes=(1,))


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ((object(), jnp.zeros(2)), TypeError, "needs a StatefulModule"),
        ((lambda: "not a module", jnp.zeros(2)), TypeError, "got str"),
        ((RunningSum(2), {"x": 2.0}), TypeError, "example_input['x'] is a float"),
        ((RunningSum(2), {}), ValueError, "no array leaves"),
        (
            (RunningSum(2), {"x": jnp.zeros((0, 2))}),
            ValueError,
            "example_input has no elements (['x'] (0, 2))",
        ),
        (
            (RunningSum(2), {"obs": jnp.zeros(2), "name": np.array(["ab", "c"])}),
            TypeError,
            "example_input['name'] has dtype <U2, which the kit cannot draw inputs of (it "
            "draws floats",
        ),
    ],
)
def test_bad_arguments_are_named(arguments: tuple[Any, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        check_module(*arguments)


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"batch_sizes": ()}, TypeError, "batch_sizes must be a non-empty sequence"),
        ({"batch_sizes": 3}, TypeError, "batch_sizes must be a non-empty sequence"),
        ({"time_lengths": (2, 0)}, ValueError, r"time_lengths\[1\] must be a positive int"),
        ({"time_lengths": (1,)}, ValueError, r"time_lengths \(1,\) has no length of 2 or more"),
        ({"episodic": "false"}, TypeError, "episodic must be True or False, got str 'false'"),
        ({"stochastic": 1}, TypeError, "stochastic must be True, False or 'per_episode'"),
        ({"batch_sizes": (1, 2.0)}, TypeError, r"batch_sizes\[1\] must be an int"),
        ({"rtol": -1e-3}, ValueError, "rtol must be >= 0"),
        ({"atol": float("nan")}, TypeError, "atol must be a finite number"),
        ({"max_examples": 0}, ValueError, "max_examples must be a positive int"),
    ],
)
def test_bad_keywords_are_named(keywords: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        check_module(RunningSum(2), jnp.zeros(2), **keywords)


# ------------------------------------------------------------------------------ plugin

USER_TESTS = """
import jax
import jax.numpy as jnp
from nnx_ppo.testing import check_module as kit_check_module
from nnx_ppo.testing.modules import RunningSum


class Batchy(RunningSum):
    def __call__(self, state, x, rollout_extras=None):
        return super().__call__(state, x - x.mean(axis=0), rollout_extras)


class EagerCounter(RunningSum):
    eager_calls = 0

    def __call__(self, state, x, rollout_extras=None):
        if not isinstance(x, jax.core.Tracer):
            EagerCounter.eager_calls += 1
        return super().__call__(state, x, rollout_extras)


def test_good_cell(check_module):
    check_module(RunningSum(2), jnp.zeros(2))


def test_bad_cell(check_module):
    check_module(Batchy(2), jnp.zeros(2))


def test_bad_argument(check_module):
    check_module(RunningSum(2), jnp.zeros(2), max_examples=0)


def test_env(check_env):
    from nnx_ppo import envs
    check_env(envs.make("pendulum"), n_envs=2, steps=2)


def test_the_option_reaches_a_direct_call():
    kit_check_module(EagerCounter(2), jnp.zeros(2), batch_sizes=(2,), time_lengths=(2,))
    # Each example calls the module eagerly twice (the eager-vs-compiled property).
    assert EagerCounter.eager_calls == 2 * 3
"""


def _failure_section(output: str, test: str) -> list[str]:
    """The lines pytest prints for one failed test, from its header to the next."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip("_ ") == test)
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith(("___", "==="))),
        len(lines),
    )
    return lines[start:end]


def _pytest_session(
    project: Path, *options: str, pythonpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest`` run in ``project`` as a user's session: the plugin loaded as
    its entry point loads it (named with ``-p`` where nnx-ppo is not installed)."""
    installed = any(
        entry.value == "nnx_ppo.testing.pytest_plugin"
        for entry in importlib.metadata.entry_points(group="pytest11")
    )
    load = [] if installed else ["-p", "nnx_ppo.testing.pytest_plugin"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, os.environ.get("PYTHONPATH", "")])
    flags = ["-p", "no:cacheprovider", "-q", "--rootdir", str(project)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *load, *flags, *options],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=300,
        check=False,
    )


def test_the_pytest_plugin_serves_the_kit_and_reports_a_failure_in_a_few_lines(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    result = _pytest_session(tmp_path, "--nnx-ppo-max-examples=3", "test_user.py")
    output = result.stdout + result.stderr
    assert "2 failed, 3 passed" in output, output
    headline = "check_module(Batchy): property 'batch-of-one agreement' fails at B=2"
    report = _failure_section(output, "test_bad_cell")
    # The test's own line, the message once, Hypothesis's example; no library frames.
    assert len(report) <= 20, "\n".join(report)
    assert sum(headline in line for line in report) == 1, "\n".join(report)
    assert not any("site-packages" in line or "nnx_ppo/" in line for line in report)
    # An argument error too: the validator's frames (require_int's source) are hidden.
    report = _failure_section(output, "test_bad_argument")
    assert any("max_examples must be a positive int" in line for line in report), output
    assert not any("nnx_ppo/" in line or "def require_int" in line for line in report)


WITHOUT_HYPOTHESIS_TESTS = """
from nnx_ppo.envs import CartPole


def test_an_env(check_env):
    check_env(CartPole(), n_envs=2, steps=3)


def test_a_module(check_module):
    pass
"""


def test_pytest_runs_where_hypothesis_is_not_installed(tmp_path: Path) -> None:
    """pytest imports the plugin in every session of an environment with nnx-ppo, so
    the plugin must import without Hypothesis; check_env works there, and the
    check_module fixture says how to install Hypothesis."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_user.py").write_text(WITHOUT_HYPOTHESIS_TESTS)
    hidden = tmp_path / "no_hypothesis" / "hypothesis"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'hypothesis'\", name='hypothesis')\n"
    )
    result = _pytest_session(
        project, "-p", "no:hypothesispytest", "test_user.py", pythonpath=str(hidden.parent)
    )
    output = result.stdout + result.stderr
    assert "1 passed, 1 error" in output, output
    assert "nnx_ppo.testing.check_module needs Hypothesis: pip install 'nnx-ppo[testing]'" in output


def test_the_option_refuses_a_count_below_one_when_pytest_starts(tmp_path: Path) -> None:
    result = _pytest_session(tmp_path, "--nnx-ppo-max-examples=0", "--collect-only")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "--nnx-ppo-max-examples must be a positive int, got 0" in result.stderr


def _mismatched_product(x: jax.Array) -> jax.Array:
    return x @ jnp.ones((x.shape[-1] + 1, 2))  # the width is off by one


class CallsAHelperThatRaises(RunningSum):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        _mismatched_product(x)
        return super().__call__(state, x, rollout_extras)


def test_an_error_in_the_users_code_names_the_line_that_raised() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(CallsAHelperThatRaises(2), jnp.zeros(2), max_examples=2)
    message = str(caught.value)
    assert "TypeError: dot_general requires contracting dimensions" in message
    line = _mismatched_product.__code__.co_firstlineno + 1
    assert f"raised in your code at {__file__}:{line} in _mismatched_product" in message


class MeanOverTimeInPlace(StatsRecorder):
    """Writes a mean over T alone into a (features,) statistic: JAX refuses the broadcast."""

    def __init__(self, features: int) -> None:
        super().__init__(features)
        self.mean = nnx.BatchStat(jnp.zeros(features))

    def update_statistics(self, rollout_extras: Any) -> None:
        super().update_statistics(rollout_extras)
        self.mean[...] = rollout_extras.mean(axis=0)


def test_an_error_in_a_modules_own_update_statistics_is_not_blamed_on_routing() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(MeanOverTimeInPlace(3), jnp.zeros(3), max_examples=3)
    error = caught.value
    assert error.property == ModuleProperty.STATISTICS
    assert isinstance(error.cause, ValueError)
    assert "hint:     update_statistics raised in the module's own code" in str(error)
    assert "fold T and B into one batch" in str(error)


class MetricsForExtras(StatsRecorder):
    """Returns its history as metrics, the 4th field, and no rollout_extras."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {"x": x})

    def update_statistics(self, rollout_extras: Any) -> None:
        self.samples[...] += rollout_extras.reshape(-1, 3).shape[0]


def test_update_statistics_given_none_says_the_module_emitted_no_extras() -> None:
    # The hint said to fold T and B, about (T, B, *feat) leaves the module never got.
    network = Sequential([Linear(3, 3, rngs=nnx.Rngs(0)), MetricsForExtras(3)])
    with pytest.raises(ContractPropertyError) as caught:
        check_module(network, jnp.zeros(3), max_examples=1)
    error = caught.value
    assert error.property == ModuleProperty.STATISTICS
    assert isinstance(error.cause, AttributeError)
    assert (
        "hint:     Sequential.layers[1].update_statistics was given None: its __call__ "
        "emitted no rollout_extras. Return what its statistics need as rollout_extras, the "
        "5th field of StatefulModuleOutput(next_state, output, regularization_loss, "
        "metrics, rollout_extras)"
    ) in str(error)


class NumPyCell(StatefulModule):
    """Starts its carry and builds one output leaf with NumPy, in float64."""

    def initialize_state(self, batch_size: int) -> Any:
        return {"h": np.zeros((batch_size, 2))}

    def reset_state(self, prev_state: Any) -> Any:
        return jax.tree.map(jnp.zeros_like, prev_state)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = 0.5 * jnp.asarray(state["h"]) + x
        output = {"h": h, "ones": np.ones((x.shape[0], 1))}
        return StatefulModuleOutput({"h": h}, output, jnp.zeros(()), {})


def test_numpy_float64_leaves_compare_as_the_float32_jax_holds() -> None:
    # Eagerly float64, compiled float32: the kit called that a difference between them.
    check_module(NumPyCell, jnp.zeros(2), max_examples=2)


_STEPS = [0]


class GlobalStepCount(StatefulModule):
    """Scales its input by a global count of its calls: compiled, it counts once."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        _STEPS[0] += 1
        return StatefulModuleOutput(state, x * _STEPS[0], jnp.zeros(()), {})


def test_an_eager_compiled_difference_names_side_effects_not_only_attribute_order() -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(GlobalStepCount, jnp.ones(2), max_examples=1)
    assert caught.value.property == ModuleProperty.EAGER_COMPILED
    assert "nothing depends on Python side effects or global state" in str(caught.value)


class BFloat16Cell(StatefulModule):
    """A bfloat16 carry: eager ops and the fused program round it differently."""

    def __init__(self) -> None:
        self.linear = nnx.Linear(
            4, 4, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
        )

    def initialize_state(self, batch_size: int) -> Array:
        return jnp.zeros((batch_size, 4), jnp.bfloat16)

    def reset_state(self, prev_state: Array) -> Array:
        return jnp.zeros_like(prev_state)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = jnp.tanh(self.linear(x) + state)
        return StatefulModuleOutput(h, h.astype(jnp.float32), jnp.zeros(()), {})


class BFloat16CellOffWhenTraced(BFloat16Cell):
    """Its output moves by 1e-3 when traced: a mismatch on every CPU, of bfloat16's scale."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        if isinstance(x, jax.core.Tracer):
            return out.replace(output=out.output + 1e-3)
        return out


def test_a_low_precision_module_s_float_mismatch_says_its_rounding_scale() -> None:
    # The rule quoted (attribute order) misled: the difference is bfloat16 rounding.
    with pytest.raises(ContractPropertyError) as caught:
        check_module(BFloat16CellOffWhenTraced(), jnp.linspace(-1.0, 1.0, 4), max_examples=3)
    assert "The module computes in bfloat16, which rounds at about 8e-03" in str(caught.value)
    # Eager ops and the fused program round a bfloat16 carry differently; at its scale
    # the two agree.
    check_module(BFloat16Cell(), jnp.linspace(-1.0, 1.0, 4), max_examples=3, rtol=0.02, atol=0.02)


class SharedNormalizer(StatefulModule):
    """One Normalizer applied to two inputs; ``fold`` says how its histories go back."""

    def __init__(self, fold: str) -> None:
        self.norm = Normalizer(2)
        self.fold = fold

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        a, b = self.norm((), x["a"]), self.norm((), x["b"])
        extras = {"a": a.rollout_extras, "b": b.rollout_extras}
        return StatefulModuleOutput((), a.output - b.output, jnp.zeros(()), {}, extras)

    def update_statistics(self, rollout_extras: Any) -> None:
        a, b = rollout_extras["a"], rollout_extras["b"]
        histories = {
            "each": [a, b],
            "joined": [jnp.concatenate([a, b], axis=1)],  # (T, 2B, 2): B twice over
            "a twice": [a, a],
            "a only": [a],
        }[self.fold]
        for history in histories:
            self.norm.update_statistics(history)


_TWO_INPUTS = {"a": jnp.zeros(2), "b": jnp.zeros(2)}


@pytest.mark.parametrize("fold", ["each", "joined"])
def test_a_module_shared_by_two_inputs_folds_both_histories(fold: str) -> None:
    check_module(SharedNormalizer(fold), _TWO_INPUTS, max_examples=3)


@pytest.mark.parametrize(
    ("fold", "found"),
    [("a twice", "the samples it was given, sorted"), ("a only", "samples: ")],
)
def test_a_module_shared_by_two_inputs_given_one_history_twice_or_once_fails(
    fold: str, found: str
) -> None:
    with pytest.raises(ContractPropertyError) as caught:
        check_module(SharedNormalizer(fold), _TWO_INPUTS, max_examples=3)
    error = caught.value
    assert error.property == ModuleProperty.STATISTICS
    assert "SharedNormalizer.norm" in str(error)
    assert found in str(error)


class DelaysResetCrosswise(Parallel):
    """Two delay lines of one shape, each reset through the other's reset_state."""

    def reset_state(self, prev_state: dict[str, Any]) -> dict[str, Any]:
        a, b = self.components["a"], self.components["b"]
        return {"a": b.reset_state(prev_state["a"]), "b": a.reset_state(prev_state["b"])}


@pytest.mark.parametrize("container", [Parallel, DelaysResetCrosswise])
def test_children_of_one_kind_reset_each_through_the_other_fail(container: type) -> None:
    # The trace-time checks compare trees and shapes, alike here; the kit compares values.
    network = container(
        a=Delay(jnp.zeros(2), 3, initial_value=0.0), b=Delay(jnp.zeros(2), 3, initial_value=-1.0)
    )
    if container is Parallel:
        check_module(network, jnp.zeros(2), max_examples=3)
        return
    with pytest.raises(ContractPropertyError) as caught:
        check_module(network, jnp.zeros(2), max_examples=3)
    error = caught.value
    assert error.property == ModuleProperty.RESET_STATE
    assert (
        "reset_state gave DelaysResetCrosswise.components['a'] the carry "
        "DelaysResetCrosswise.components['b'] returned at the rollout's last step"
    ) in str(error)


class ManagerEveryTwoSteps(StatefulModule):
    """A GRU acting every other step, its carry kept in between: the carry its reset is
    given is not always the one it returned last, and that is right."""

    def __init__(self) -> None:
        self.manager = GRU(2, 3, nnx.Rngs(0))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        out = self.manager(state["manager"], x)
        acts = (state["count"] % 2 == 0)[:, None]
        manager = jnp.where(acts, out.next_state, state["manager"])
        next_state = {"manager": manager, "count": state["count"] + 1}
        return StatefulModuleOutput(next_state, manager, jnp.zeros(()), {})

    def initialize_state(self, batch_size: int) -> Any:
        count = jnp.zeros((batch_size,), jnp.int32)
        return {"manager": self.manager.initialize_state(batch_size), "count": count}

    def reset_state(self, prev_state: Any) -> Any:
        manager = self.manager.reset_state(prev_state["manager"])
        return {"manager": manager, "count": jnp.zeros_like(prev_state["count"])}


def test_a_child_whose_carry_the_container_keeps_between_calls_passes() -> None:
    check_module(ManagerEveryTwoSteps(), jnp.zeros(2), max_examples=10)


def test_many_delay_lines_of_different_lengths_reset_and_pass() -> None:
    # Modules without variables share one structure; the record of their carries is
    # bounded, and a forgotten one must not make a correct network fail.
    lines = {f"d{k}": Delay(jnp.zeros(2), k) for k in range(1, 20)}
    network = Parallel(**lines)
    network.reset_state(network.initialize_state(2))
    check_module(network, jnp.zeros(2), max_examples=2)


class PairStatistics(StatefulModule):
    """Emits two leaves a sample; its statistic needs each sample's leaves together."""

    def __init__(self) -> None:
        self.products = nnx.BatchStat(jnp.zeros(()))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, (x[:, 0], x[:, 1]))

    def update_statistics(self, rollout_extras: Any) -> None:
        first, second = rollout_extras
        self.products[...] += (first * second).sum()


class SharedPairStatistics(StatefulModule):
    def __init__(self, crossed: bool) -> None:
        self.pairs = PairStatistics()
        self.crossed = crossed

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        a, b = self.pairs((), x["a"]), self.pairs((), x["b"])
        extras = {"a": a.rollout_extras, "b": b.rollout_extras}
        return StatefulModuleOutput((), a.output - b.output, jnp.zeros(()), {}, extras)

    def update_statistics(self, rollout_extras: Any) -> None:
        a, b = rollout_extras["a"], rollout_extras["b"]
        if self.crossed:  # every leaf is there once, but paired with the other input's
            a, b = (a[0], b[1]), (b[0], a[1])
        self.pairs.update_statistics(a)
        self.pairs.update_statistics(b)


@pytest.mark.parametrize("crossed", [False, True])
def test_a_shared_module_given_its_samples_leaves_mixed_fails(crossed: bool) -> None:
    module = SharedPairStatistics(crossed)
    if not crossed:
        check_module(module, _TWO_INPUTS, max_examples=3)
        return
    with pytest.raises(ContractPropertyError, match="mixed the leaves of its samples"):
        check_module(module, _TWO_INPUTS, max_examples=3)


class EntityByEntity(StatefulModule):
    """A Normalizer on 3 entities folded into its batch, given one history per entity."""

    def __init__(self) -> None:
        self.norm = Normalizer(2)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        out = self.norm((), x.reshape(-1, 2))
        extras = out.rollout_extras.reshape(x.shape)
        return StatefulModuleOutput((), out.output.reshape(x.shape), jnp.zeros(()), {}, extras)

    def update_statistics(self, rollout_extras: Any) -> None:
        for entity in range(3):
            self.norm.update_statistics(rollout_extras[:, :, entity])


def test_a_folded_child_given_its_samples_in_several_calls_passes() -> None:
    check_module(EntityByEntity(), jnp.zeros((3, 2)), max_examples=3)


class SharedDictNormalizer(StatefulModule):
    """One Normalizer of a dict applied to two inputs (its emissions are dicts)."""

    def __init__(self) -> None:
        self.norm = Normalizer({"pos": 2, "vel": 1})

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        a, b = self.norm((), x["a"]), self.norm((), x["b"])
        extras = {"a": a.rollout_extras, "b": b.rollout_extras}
        output = a.output["pos"] - b.output["pos"]
        return StatefulModuleOutput((), output, jnp.zeros(()), {}, extras)

    def update_statistics(self, rollout_extras: Any) -> None:
        self.norm.update_statistics(rollout_extras["a"])
        self.norm.update_statistics(rollout_extras["b"])


def test_a_shared_normalizer_of_a_dict_passes() -> None:
    one = {"pos": jnp.zeros(2), "vel": jnp.zeros(1)}
    check_module(SharedDictNormalizer(), {"a": one, "b": one}, max_examples=3)


class _OneOddTrace(RunningSum):
    """Correct but for its third call, whose output is off by one: trace-time state."""

    calls: ClassVar[list[int]] = [0]

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
        _OneOddTrace.calls[0] += 1
        out = super().__call__(state, x, rollout_extras)
        return out.replace(output=out.output + 1.0) if _OneOddTrace.calls[0] == 3 else out


def test_a_failure_that_does_not_recur_is_the_kits_message_with_a_note() -> None:
    # Hypothesis's FlakyFailure, an exception group, escaped with a raw traceback.
    _OneOddTrace.calls[0] = 0
    with pytest.raises(ContractPropertyError) as caught:
        check_module(_OneOddTrace(3), jnp.zeros(3), max_examples=5)
    assert "did not happen again when the same example was run once more" in " ".join(
        caught.value.__notes__
    )
