"""Normalizer: running statistics against NumPy, read-only forward pass, replay, bad input."""

import math
from collections import OrderedDict
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.core import FrozenDict
from hypothesis import given
from hypothesis import strategies as st

import nnx_ppo
from nnx_ppo.networks.normalizer import Normalizer, NormalizerStatistics
from nnx_ppo.networks.types import StatefulModuleOutput

FEATURES = OrderedDict(joints=(3,), camera=(2, 2))
# float32 statistics against float64 NumPy over data with mean ~10 and std ~3.
RTOL, ATOL = 1e-4, 1e-4


@nnx.jit
def _call(module: Normalizer, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
    return module((), x, rollout_extras)


@nnx.jit
def _update(module: Normalizer, history: Any) -> None:
    module.update_statistics(history)


def _statistics(module: Normalizer) -> Any:
    return jax.tree.map(np.asarray, nnx.state(module, NormalizerStatistics))


def _sample(rng: np.random.Generator, leading: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Data with a per-feature offset and scale, so a merge error shows in mean and variance."""
    return {
        name: (10.0 + 3.0 * rng.normal(size=shape) * rng.normal(size=(*leading, *shape))).astype(
            np.float32
        )
        for name, shape in FEATURES.items()
    }


def _expected(x: dict[str, np.ndarray], seen: list[dict[str, np.ndarray]], module: Normalizer):
    """NumPy normalisation of ``x`` by the population mean and variance of ``seen``."""
    out = {}
    for name, shape in FEATURES.items():
        samples = np.concatenate([s[name].reshape(-1, *shape) for s in seen]).astype(np.float64)
        std = np.sqrt(np.maximum(samples.var(axis=0), module.epsilon))
        out[name] = (x[name] - samples.mean(axis=0)) / std
    return out


@given(
    sizes=st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 5])), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_statistics_match_numpy_over_all_samples_seen(sizes: list[tuple[int, int]], seed: int):
    assert nnx_ppo.checks_enabled()
    normalizer = Normalizer(FEATURES)
    rng = np.random.default_rng(seed)
    seen: list[dict[str, np.ndarray]] = []
    for n_steps, batch in [(1, 2), *sizes]:
        history = _sample(rng, (n_steps, batch))
        _update(normalizer, history)
        seen.append(history)

    n_samples = sum(n_steps * batch for n_steps, batch in [(1, 2), *sizes])
    assert float(normalizer.counter.get_value()) == n_samples
    for name, shape in FEATURES.items():
        samples = np.concatenate([s[name].reshape(-1, *shape) for s in seen]).astype(np.float64)
        mean = normalizer.mean.get_value()[name]
        m2 = normalizer.M2.get_value()[name]
        assert mean.dtype == m2.dtype == jnp.float32
        np.testing.assert_allclose(mean, samples.mean(axis=0), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(m2 / n_samples, samples.var(axis=0), rtol=RTOL, atol=ATOL)

    x = _sample(rng, (3,))
    before = _statistics(normalizer)
    out = _call(normalizer, x)
    jax.tree.map(np.testing.assert_array_equal, _statistics(normalizer), before)
    expected = _expected(x, seen, normalizer)
    jax.tree.map(
        lambda got, want: np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL),
        out.output,
        expected,
    )


def test_emits_raw_input_and_replay_gives_identical_output():
    normalizer = Normalizer(FEATURES, clip=1.5)
    rng = np.random.default_rng(0)
    _update(normalizer, _sample(rng, (2, 3)))
    x = jax.tree.map(jnp.asarray, _sample(rng, (3,)))

    rollout = _call(normalizer, x)
    replay = _call(normalizer, x, rollout.rollout_extras)

    jax.tree.map(np.testing.assert_array_equal, rollout.rollout_extras, x)
    jax.tree.map(np.testing.assert_array_equal, replay.rollout_extras, x)
    jax.tree.map(np.testing.assert_array_equal, replay.output, rollout.output)
    assert max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(rollout.output)) <= 1.5
    assert rollout.next_state == ()


def test_clip_bounds_the_normalised_value_only():
    normalizer = Normalizer(2, clip=2.0)
    _update(normalizer, jnp.asarray([[[0.0, 0.0]], [[2.0, 4.0]]]))  # mean (1, 2), std (1, 2)
    out = _call(normalizer, jnp.asarray([[2.0, 4.0], [11.0, -40.0]]))
    np.testing.assert_allclose(out.output, [[1.0, 1.0], [2.0, -2.0]], rtol=1e-6)
    np.testing.assert_array_equal(out.rollout_extras, [[2.0, 4.0], [11.0, -40.0]])


def test_before_any_data_it_divides_by_ten_like_0_3_0():
    out = _call(Normalizer(3), jnp.asarray([[1.0, -20.0, 5.0]]))
    np.testing.assert_allclose(out.output, [[0.1, -2.0, 0.5]], rtol=1e-6)


def test_constant_feature_is_floored_by_epsilon_not_divided_by_zero():
    normalizer = Normalizer((), epsilon=1e-4)
    _update(normalizer, jnp.full((2, 3), 7.0))
    out = _call(normalizer, jnp.asarray([7.0, 7.5]))
    np.testing.assert_allclose(out.output, [0.0, 0.5 / 1e-2], rtol=1e-5)


@pytest.mark.parametrize("value", [123.456, 12345.678, -98765.43])
def test_a_constant_feature_far_from_zero_normalises_to_zero(value):
    # The float32 mean of 63 equal values is a few ulps off them; taken about it, M2
    # held that rounding, and the feature normalised to +-1 instead of 0.
    normalizer = Normalizer(2)
    for _ in range(5):
        _update(normalizer, jnp.full((7, 9, 2), value, jnp.float32))
    assert (_statistics(normalizer)["M2"] == 0.0).all()
    out = _call(normalizer, jnp.full((3, 2), value, jnp.float32))
    np.testing.assert_array_equal(out.output, np.zeros((3, 2)))


def test_epsilon_floors_the_variance_and_is_not_added_to_it():
    normalizer = Normalizer((), epsilon=1.0)
    _update(normalizer, jnp.asarray([[5.0, 9.0]]))  # mean 7, variance 4 above the floor
    out = _call(normalizer, jnp.asarray([11.0, 7.0]))
    np.testing.assert_allclose(out.output, [2.0, 0.0], rtol=1e-6)  # sqrt(4 + 1) would give 1.79


@pytest.mark.parametrize(
    ("declared", "expected_shapes"),
    [
        (4, (4,)),
        ((2, 3), (2, 3)),
        ([2, 3], (2, 3)),
        ((), ()),
        ({"a": 2, "b": (1, 3)}, {"a": (2,), "b": (1, 3)}),
        (OrderedDict(a=jnp.zeros((2,)), b=np.zeros((3, 1))), {"a": (2,), "b": (3, 1)}),
        (FrozenDict(a=jax.ShapeDtypeStruct((5,), jnp.int32)), {"a": (5,)}),
        ({"nested": {"x": 1}, "pair": ((2,), 3)}, {"nested": {"x": (1,)}, "pair": ((2,), (3,))}),
    ],
)
def test_declared_shape_forms_give_float32_statistics(declared: Any, expected_shapes: Any):
    normalizer = Normalizer(declared)
    mean = normalizer.mean.get_value()
    is_shape = lambda s: isinstance(s, tuple) and all(isinstance(d, int) for d in s)  # noqa: E731
    assert jax.tree.structure(mean) == jax.tree.structure(expected_shapes, is_leaf=is_shape)
    shapes = jax.tree.map(lambda v: v.shape, mean)
    assert shapes == expected_shapes
    assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(normalizer.M2.get_value()))


@pytest.mark.parametrize(
    ("declared", "expected_shapes"),
    [
        # A NumPy integer is a size, not a 0-d example array (it used to give shape ()).
        (np.int64(3), (3,)),
        ((np.int32(2), 3), (2, 3)),
        ({"a": np.int64(2), "b": [np.int64(1), 2]}, {"a": (2,), "b": (1, 2)}),
    ],
)
def test_numpy_integers_declare_sizes(declared: Any, expected_shapes: Any):
    mean = Normalizer(declared).mean.get_value()
    assert jax.tree.map(lambda v: v.shape, mean) == expected_shapes


def test_a_bool_is_not_a_size():
    with pytest.raises(TypeError, match="int, a shape tuple or an example array"):
        Normalizer(True)
    # Not a shape (2, 1), so a tuple of two leaves, the bool one refused.
    with pytest.raises(TypeError, match="got bool True"):
        Normalizer((2, True))


def test_statistics_are_not_trainable_parameters():
    normalizer = Normalizer({"a": 2})
    assert not issubclass(NormalizerStatistics, nnx.Param)
    assert len(jax.tree.leaves(nnx.state(normalizer, nnx.Param))) == 0
    assert len(jax.tree.leaves(nnx.state(normalizer, NormalizerStatistics))) == 3


def test_other_mapping_types_line_up_with_the_declared_dict():
    normalizer = Normalizer({"b": 1, "a": 2})
    x = OrderedDict(a=jnp.ones((2, 2)), b=jnp.ones((2, 1)))
    out = normalizer((), x)
    assert type(out.output) is dict and set(out.output) == {"a", "b"}
    normalizer.update_statistics(FrozenDict(a=jnp.ones((1, 2, 2)), b=jnp.ones((1, 2, 1))))
    assert float(normalizer.counter.get_value()) == 2.0


def test_mismatched_inputs_are_named():
    normalizer = Normalizer({"a": 2, "b": (1, 3)})
    with pytest.raises(ValueError, match=r"x\['b'\] has shape \(4, 3\), expected \(B, 1, 3\)"):
        normalizer((), {"a": jnp.ones((4, 2)), "b": jnp.ones((4, 3))})
    with pytest.raises(ValueError, match="tree structure"):
        normalizer((), {"a": jnp.ones((4, 2))})
    with pytest.raises(ValueError, match=r"x has shape \(4, 2\), expected \(B,\) as declared"):
        Normalizer(())((), jnp.ones((4, 2)))
    with pytest.raises(ValueError, match=r"rollout_extras\['a'\].*\(T, B, 2\)"):
        normalizer.update_statistics({"a": jnp.ones((2, 4, 3)), "b": jnp.ones((2, 4, 1, 3))})
    with pytest.raises(nnx_ppo.ContractError, match="T=2"):
        normalizer.update_statistics({"a": jnp.ones((2, 4, 2)), "b": jnp.ones((3, 4, 1, 3))})


def test_clip_takes_infinity_as_no_clip_and_a_0_d_array():
    # Both were taken before clip was checked as a number.
    x = jnp.array([[1e6, -1e6]])
    unclipped = Normalizer(2, clip=math.inf)
    normalised = unclipped(unclipped.initialize_state(1), x).output
    plain = Normalizer(2)
    np.testing.assert_array_equal(normalised, plain(plain.initialize_state(1), x).output)
    assert Normalizer(2, clip=jnp.array(5.0)).clip == 5.0


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("3",), {}, TypeError, "int, a shape tuple or an example array"),
        (({"a": 1.5},), {}, TypeError, "float"),
        (((2, -1),), {}, ValueError, "negative"),
        (({},), {}, ValueError, "no leaves"),
        ((3,), {"clip": 0.0}, ValueError, "clip"),
        ((3,), {"epsilon": -1.0}, ValueError, "epsilon"),
        ((3,), {"clip": float("nan")}, TypeError, "Normalizer: clip must be a finite number"),
        ((3,), {"clip": "5"}, TypeError, "Normalizer: clip must be a finite number"),
        ((3,), {"clip": True}, TypeError, "Normalizer: clip must be a finite number"),
        ((3,), {"epsilon": float("inf")}, TypeError, "Normalizer: epsilon must be a finite"),
        ((3,), {"epsilon": "1e-6"}, TypeError, "Normalizer: epsilon must be a finite"),
    ],
)
def test_bad_constructor_arguments_are_named(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        Normalizer(*args, **kwargs)
