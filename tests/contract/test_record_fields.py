"""The field annotations of a NamedTuple, TypedDict or dataclass a module's method names.

They went unchecked, and nothing said so: a carry ``NT(h=(B, 5))`` annotated
``h: Float[Array, "B 3"]`` was accepted.
"""

import dataclasses
import warnings
from typing import Annotated, Any, NamedTuple, NotRequired, Protocol, Required, TypedDict

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import Array, Float

from nnx_ppo import ContractError
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


class NamedCarry(NamedTuple):
    h: Float[Array, "B H"]


class DictCarry(TypedDict):
    h: Float[Array, "B H"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DataCarry:
    h: Float[Array, "B H"]


Carries = pytest.mark.parametrize(
    ("carry", "field"), [(NamedCarry, ".h"), (DictCarry, "['h']"), (DataCarry, ".h")]
)


def _module(carry: Any) -> StatefulModule:
    class Cell(StatefulModule):
        def __call__(
            self, state: carry, x: Float[Array, "B H"], rollout_extras: Any = None
        ) -> StatefulModuleOutput:
            return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    return Cell()


@Carries
def test_a_carrys_fields_are_checked_and_the_field_named(carry: Any, field: str) -> None:
    module = _module(carry)
    assert module(carry(h=jnp.zeros((4, 3))), jnp.ones((4, 3))).output.shape == (4, 3)

    with pytest.raises(ContractError) as caught:
        module(carry(h=jnp.zeros((4,))), jnp.ones((4, 3)))
    assert caught.value.leaf == "state" + field
    assert "found:    f32[4]" in str(caught.value)

    # The field binds H for the whole call: x, of another width, is the one refused.
    with pytest.raises(ContractError) as caught:
        module(carry(h=jnp.zeros((4, 5))), jnp.ones((4, 3)))
    assert caught.value.leaf == "x"
    assert "expected: Float[Array, 'B H'] with B=4, H=5" in str(caught.value)


@Carries
def test_a_returned_records_field_is_named(carry: Any, field: str) -> None:
    class Cell(StatefulModule):
        def initialize_state(self, batch_size: int) -> carry:
            return carry(h=jnp.zeros((batch_size,)))

        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
            return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    with pytest.raises(ContractError) as caught:
        Cell().initialize_state(4)

    assert caught.value.leaf == "return value" + field
    assert str(caught.value).startswith(
        f"Cell.initialize_state: the return value at {field} does not match"
    )


class _Unchecked(Protocol):
    def size(self) -> int: ...


class WithAProtocol(NamedTuple):
    h: Float[Array, "B 3"]
    other: _Unchecked


def test_a_field_beartype_cannot_check_is_left_unchecked_with_a_warning_once() -> None:
    module = _module(WithAProtocol)
    carry = WithAProtocol(jnp.zeros((4, 3)), jnp.zeros((4,)))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module(carry, jnp.ones((4, 3)))
        module(carry, jnp.ones((4, 3)))

    assert len(caught) == 1
    assert "field other of WithAProtocol is not checked" in str(caught[0].message)
    assert caught[0].filename == __file__  # the user's call, past jaxtyping's wrapper
    with pytest.raises(ContractError, match=r"argument state\.h does not match"):
        module(WithAProtocol(jnp.zeros((4, 2)), jnp.zeros((4,))), jnp.ones((4, 3)))


def test_the_output_is_left_to_the_contracts_own_rules() -> None:
    # StatefulModuleOutput's fields are checked by the contract after the call, with
    # their rules: a Python number is a scalar regularization_loss there.
    class Cell(StatefulModule):
        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
            return StatefulModuleOutput(state, x, 0.0, {})  # type: ignore[arg-type]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Cell()((), jnp.ones((4, 3))).regularization_loss == 0.0


def test_the_library_carries_annotate_one_envs_slice_too() -> None:
    # reset_state is given one env's slice under vmap: the carries' fields say *B.
    from flax import nnx

    from nnx_ppo.networks.recurrent import LSTM
    from nnx_ppo.networks.variational import AR1VariationalBottleneck

    for module in (LSTM(3, 4, nnx.Rngs(0)), AR1VariationalBottleneck(2, nnx.Rngs(0))):
        carry = module.initialize_state(5)
        sliced = nnx.vmap(lambda m, s: m.reset_state(s), in_axes=(None, 0))(module, carry)
        assert jax.tree.structure(sliced) == jax.tree.structure(carry)


class Obs(TypedDict):
    pos: Float[Array, "B 3"]
    vel: NotRequired[Float[Array, "B 3"]]
    goal: Annotated[NotRequired[Float[Array, "B 2"]], "a target"]


class PartialObs(TypedDict, total=False):
    pos: Required[Float[Array, "B 3"]]
    vel: Float[Array, "B 3"]
    goal: Float[Array, "B 2"]


# What ``from __future__ import annotations`` makes of Obs: Python 3.11 builds it while
# the marks are strings, and counts every key of a total TypedDict as required.
class PostponedObs(TypedDict):
    pos: "Float[Array, 'B 3']"
    vel: "NotRequired[Float[Array, 'B 3']]"
    goal: "Annotated[NotRequired[Float[Array, 'B 2']], 'a target']"


class PostponedPartialObs(TypedDict, total=False):
    pos: "Required[Float[Array, 'B 3']]"
    vel: "Float[Array, 'B 3']"
    goal: "Float[Array, 'B 2']"


_OBSERVATIONS = (Obs, PartialObs, PostponedObs, PostponedPartialObs)
_OBSERVERS = {observation: _module(observation) for observation in _OBSERVATIONS}
_WIDTHS = {"pos": 3, "vel": 3, "goal": 2}


@given(
    st.sampled_from(_OBSERVATIONS),
    st.sets(st.sampled_from(sorted(_WIDTHS))),
    st.integers(1, 5),
)
def test_a_typeddict_refuses_a_missing_required_key_and_allows_a_not_required_one(
    observation: Any, keys: set[str], batch: int
) -> None:
    # The carry stands in for the observation: __call__ returns it as next_state.
    state = {key: jnp.zeros((batch, _WIDTHS[key])) for key in keys}
    module = _OBSERVERS[observation]
    x = jnp.ones((batch, 3))
    if "pos" in keys:
        assert module(state, x).next_state.keys() == keys
        return
    with pytest.raises(ContractError) as caught:
        module(state, x)
    assert caught.value.leaf == "state['pos']"
    assert str(caught.value).startswith(
        f"Cell.__call__: argument state['pos'] is missing: the TypedDict "
        f"{observation.__qualname__} requires the key 'pos'."
    )
    found = caught.value.found
    assert found is not None and found.startswith("no key 'pos' in {")
    for key in keys:
        assert f"'{key}': f32[{batch},{_WIDTHS[key]}]" in found


class _Either(TypedDict):
    a: Float[Array, "B 3"]


class _Or(TypedDict):
    b: Float[Array, "B 3"]


def test_a_missing_required_key_tells_typeddicts_in_a_union_apart() -> None:
    module = _module(_Either | _Or)
    assert module({"b": jnp.zeros((4, 3))}, jnp.ones((4, 3))).next_state.keys() == {"b"}
    with pytest.raises(ContractError, match=r"argument state does not match"):
        module({"c": jnp.zeros((4, 3))}, jnp.ones((4, 3)))


typing_extensions = pytest.importorskip("typing_extensions")


class ExtensionsCarry(typing_extensions.TypedDict):
    """typing.is_typeddict does not know typing_extensions' classes on Python 3.11: its
    fields and keys went unchecked."""

    h: Float[Array, "B H"]
    seen: typing_extensions.ReadOnly[typing_extensions.NotRequired[Float[Array, "B H"]]]


def test_a_typing_extensions_typeddicts_fields_and_keys_are_checked() -> None:
    module = _module(ExtensionsCarry)
    x = jnp.ones((4, 3))
    module({"h": jnp.zeros((4, 3))}, x)  # a ReadOnly NotRequired key may be absent
    module({"h": jnp.zeros((4, 3)), "seen": jnp.zeros((4, 3))}, x)

    for carry, leaf in [
        ({"h": jnp.zeros((4,))}, "state['h']"),
        ({"h": jnp.zeros((4, 3)), "seen": jnp.zeros((4,))}, "state['seen']"),
        ({"seen": jnp.zeros((4, 3))}, "state['h']"),
    ]:
        with pytest.raises(ContractError) as caught:
            module(carry, x)
        assert caught.value.leaf == leaf


class ClosedCarry(typing_extensions.TypedDict, closed=True):
    h: Float[Array, "B H"]


class ClosedByItsParent(ClosedCarry):
    """Says nothing of extra keys: it takes its parent's closed=True, as type checkers do."""


class ExtraCarry(typing_extensions.TypedDict, extra_items=Float[Array, "B 2"]):
    h: Float[Array, "B H"]


class ReadOnlyExtraCarry(
    typing_extensions.TypedDict,
    extra_items=typing_extensions.ReadOnly[Float[Array, "B 2"]],
):
    h: Float[Array, "B H"]


class OpenedAgain(ClosedCarry, closed=False):
    pass


_EXTRA_ITEMS: dict[Any, Any] = {
    DictCarry: "open",
    ExtensionsCarry: "open",
    OpenedAgain: "open",
    ClosedCarry: "closed",
    ClosedByItsParent: "closed",
    ExtraCarry: 2,
    ReadOnlyExtraCarry: 2,
}
_EXTRA_KEEPERS = {carry: _module(carry) for carry in _EXTRA_ITEMS}


@given(
    st.sampled_from(list(_EXTRA_ITEMS)),
    st.lists(st.sampled_from(["g", "u", "v"]), unique=True, max_size=2),
    st.sampled_from([2, 5]),
)
def test_keys_a_typeddict_does_not_declare_follow_its_closed_and_extra_items(
    carry: Any, extra: list[str], width: int
) -> None:
    module = _EXTRA_KEEPERS[carry]
    state = {"h": jnp.zeros((4, 3))} | {key: jnp.zeros((4, width)) for key in extra}
    x = jnp.ones((4, 3))
    takes = _EXTRA_ITEMS[carry]
    if not extra or takes == "open" or takes == width:
        assert module(state, x).next_state.keys() == state.keys()
        return
    with pytest.raises(ContractError) as caught:
        module(state, x)
    assert caught.value.leaf == f"state[{extra[0]!r}]"
    if takes == "closed":
        assert str(caught.value).startswith(
            f"Cell.__call__: argument state[{extra[0]!r}] is not a key of the TypedDict "
            f"{carry.__qualname__}, which is closed."
        )
        keys = ", ".join(repr(key) for key in state)
        assert caught.value.found == f"the keys {keys}; {carry.__qualname__} declares 'h'"
    else:
        assert caught.value.found == f"f32[4,{width}]"


def test_keys_of_closed_typeddicts_in_a_union_tell_them_apart() -> None:
    module = _module(ClosedCarry | ExtraCarry)
    module({"h": jnp.zeros((4, 3)), "g": jnp.zeros((4, 2))}, jnp.ones((4, 3)))
    with pytest.raises(ContractError, match=r"argument state does not match"):
        module({"h": jnp.zeros((4, 3)), "g": jnp.zeros((4, 5))}, jnp.ones((4, 3)))
