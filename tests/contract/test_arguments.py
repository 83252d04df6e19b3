"""require_int and require_number: the one validator of sizes and numbers, and its messages."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nnx_ppo.contract.arguments import require_int, require_number


@given(st.integers(-1000, 1000), st.integers(-10, 10), st.integers(0, 20))
def test_require_int_accepts_exactly_the_ints_within_the_bounds(value, minimum, width):
    maximum = minimum + width
    inside = minimum <= value <= maximum
    if inside:
        assert require_int("Owner", "size", value, minimum, maximum) == value
        assert require_int("Owner", "size", np.int32(value), minimum, maximum) == value
    else:
        with pytest.raises(ValueError, match=rf"Owner: size must lie in \[{minimum}, {maximum}\]"):
            require_int("Owner", "size", value, minimum, maximum)


@pytest.mark.parametrize(
    ("value", "bounds", "error", "message"),
    [
        (0, {}, ValueError, "Owner: size must be a positive int, got 0"),
        (-1, {"minimum": 0}, ValueError, "Owner: size must be >= 0, got -1"),
        (5, {"minimum": None, "maximum": 4}, ValueError, "Owner: size must be <= 4, got 5"),
        (True, {}, TypeError, "Owner: size must be an int, got bool True"),
        (2.0, {}, TypeError, "Owner: size must be an int, got float 2.0"),
        ("3", {"minimum": None}, TypeError, "Owner: size must be an int, got str '3'"),
    ],
)
def test_require_int_names_the_argument_and_the_bound(value, bounds, error, message):
    with pytest.raises(error) as caught:
        require_int("Owner", "size", value, **bounds)
    assert str(caught.value) == message


def test_require_int_without_bounds_takes_any_int():
    assert require_int("Owner", "seed", -(2**40), minimum=None) == -(2**40)


@given(st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_require_number_checks_the_bounds_and_their_strictness(value):
    bounds = {"minimum": 0.0, "maximum": 1.0}
    if 0.0 <= value <= 1.0:
        assert require_number("Owner", "rate", value, **bounds) == value
    else:
        with pytest.raises(ValueError, match=r"rate must lie in \[0.0, 1.0\]"):
            require_number("Owner", "rate", value, **bounds)
    if value > 0.0:
        assert require_number("Owner", "rate", np.float32(value), minimum=0.0, strict=True) == value
    else:
        with pytest.raises(ValueError, match=r"rate must be > 0\.0"):
            require_number("Owner", "rate", value, minimum=0.0, strict=True)


@pytest.mark.parametrize("array", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
@given(st.floats(min_value=-1e6, max_value=1e6, width=32) | st.integers(-1000, 1000))
def test_require_number_takes_a_0_d_array_as_its_number(array, value):
    assert require_number("Owner", "rate", array(value)) == pytest.approx(value)


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        np.float32("nan"),
        True,
        "1",
        None,
        np.ones(1),
        np.asarray(True),
        jnp.asarray(math.inf),
    ],
)
def test_require_number_rejects_what_is_not_a_finite_number(value):
    with pytest.raises(TypeError, match="Owner: rate must be a finite number, got"):
        require_number("Owner", "rate", value)
