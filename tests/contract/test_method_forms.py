"""How a contract method may be written: its signature, and NNX transforms inside it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jaxtyping import Array, Float

from nnx_ppo import ContractError
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


def test_a_call_without_rollout_extras_is_refused_when_the_class_is_made() -> None:
    # The library calls __call__(state, x, rollout_extras) in replay: a TypeError
    # naming no module came at the first replay.
    with pytest.raises(TypeError) as caught:

        class NoExtras(StatefulModule):
            def __call__(self, state: Any, x: Any) -> StatefulModuleOutput:
                return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    message = str(caught.value)
    assert "NoExtras.__call__(self, state, x) cannot be called as the library" in message
    assert "with (state, x, rollout_extras)" in message
    assert "Define __call__(self, state, x, rollout_extras=None)" in message


def test_the_refused_signature_is_shown_as_written() -> None:
    # Its parameters were joined by name: "(self, batch_size)" hid the "*" that made the
    # method uncallable, the very signature the message then asked for.
    with pytest.raises(TypeError) as caught:

        class KeywordOnly(StatefulModule):
            def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
                return StatefulModuleOutput(state, x, jnp.zeros(()), {})

            def initialize_state(self, *, batch_size: int) -> Any:
                return jnp.zeros(batch_size)

    message = str(caught.value)
    assert message.startswith("KeywordOnly.initialize_state(self, *, batch_size) cannot be")
    assert "Define initialize_state(self, batch_size)" in message


def test_a_statistics_method_taking_two_histories_is_refused() -> None:
    with pytest.raises(TypeError, match=r"update_statistics\(self, rollout_extras\)"):

        class TwoHistories(StatefulModule):
            def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
                return StatefulModuleOutput(state, x, jnp.zeros(()), {})

            def update_statistics(self, first: Any, second: Any) -> None:
                del first, second


def test_extra_keyword_only_parameters_are_accepted() -> None:
    class Flexible(StatefulModule):
        def __call__(
            self, state: Any, x: Any, rollout_extras: Any = None, *, scale: float = 1.0
        ) -> Any:
            return StatefulModuleOutput(state, scale * x, jnp.zeros(()), {})

    out = Flexible()((), jnp.ones((2, 3)))
    assert out.output.shape == (2, 3)


class Block(nnx.Module):
    def __init__(self) -> None:
        self.linear = nnx.Linear(3, 3, rngs=nnx.Rngs(0))

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.linear(x))


class ThroughNnxJit(StatefulModule):
    def __init__(self) -> None:
        self.block = Block()

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        y = nnx.jit(lambda block, h: block(h))(self.block, x)
        return StatefulModuleOutput(state, y, jnp.zeros(()), {})


class ThroughNnxRemat(ThroughNnxJit):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        y = nnx.remat(lambda block, h: block(h))(self.block, x)
        return StatefulModuleOutput(state, y, jnp.zeros(()), {})


def test_an_eager_nnx_jit_that_hands_back_equal_values_is_no_write() -> None:
    # nnx.jit gives every variable back as a new array: compared by identity alone, each
    # was "written".
    out = ThroughNnxJit()((), jnp.ones((2, 3)))
    assert out.output.shape == (2, 3)


def test_a_traced_nnx_remat_write_back_is_named_with_the_way_around_it() -> None:
    module = ThroughNnxRemat()
    with pytest.raises(ContractError) as caught:
        nnx.jit(lambda m, x: m((), x).output)(module, jnp.ones((2, 3)))
    message = str(caught.value)
    assert "wrote the variable ThroughNnxRemat.block.linear" in message
    assert "an NNX transform inside the call (nnx.remat, nnx.jit) did" in message
    assert "jax.checkpoint" in message


def test_a_real_write_under_jit_gets_no_transform_hint() -> None:
    class RunningMean(StatefulModule):
        def __init__(self) -> None:
            self.mean = nnx.BatchStat(jnp.zeros(3))

        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
            self.mean[...] = 0.9 * self.mean[...] + 0.1 * x.mean(0)
            return StatefulModuleOutput(state, x - self.mean[...], jnp.zeros(()), {})

    for call in (
        lambda module, x: module((), x),
        nnx.jit(lambda module, x: module((), x).output),  # a traced write: a tracer too
    ):
        with pytest.raises(ContractError) as caught:
            call(RunningMean(), jnp.ones((2, 3)))
        assert "wrote the variable RunningMean.mean" in str(caught.value)
        assert "NNX transform" not in str(caught.value)


class Doubles:
    """A mixin outside the contract."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, 2 * x, jnp.zeros(()), {})


class DoublesClipped(Doubles):
    """A refinement of the mixin, which a subclass may mix in after it."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        return out.replace(output=jnp.clip(out.output, -1.0, 1.0))


class Doubler(Doubles, StatefulModule):
    pass


class ClippedDoubler(Doubler, DoublesClipped):
    pass


def test_a_subclass_runs_the_mixin_method_python_resolves_to() -> None:
    # The checked copy of Doubles.__call__ installed on Doubler hid DoublesClipped's from
    # ClippedDoubler, whose MRO puts DoublesClipped first: it ran Doubles' silently.
    assert [c.__name__ for c in ClippedDoubler.__mro__[:3]] == [
        "ClippedDoubler",
        "Doubler",
        "DoublesClipped",
    ]
    x = jnp.full((2, 3), 5.0)
    assert float(ClippedDoubler()((), x).output.max()) == 1.0
    assert float(Doubler()((), x).output.max()) == 10.0

    class Plain(Doubler):
        pass

    assert Plain.__call__ is Doubler.__call__  # the same mixin method: its checked copy
    with pytest.raises(ContractError, match=r"ClippedDoubler.__call__: argument"):
        ClippedDoubler()((), {"x": x, "y": jnp.zeros((3, 3))})


def test_a_method_that_copies_its_parents_metadata_is_checked_itself() -> None:
    # functools.wraps(Parent.__call__) copied the parent wrapper's mark, and the method
    # was taken for one already checked.
    import functools

    class Parent(StatefulModule):
        def initialize_state(self, batch_size: int) -> Any:
            return {"h": jnp.zeros((batch_size, 3))}

        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
            return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    class DropsB(Parent):
        @functools.wraps(Parent.__call__)
        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
            return StatefulModuleOutput({"h": state["h"].mean(0)}, x, jnp.zeros(()), {})

    module = DropsB()
    with pytest.raises(ContractError, match=r"DropsB.__call__: next_state\['h'\]"):
        module(module.initialize_state(4), jnp.ones((4, 3)))


def test_a_method_behind_a_decorator_of_args_and_kwargs_is_checked_by_the_contract_names():
    def logged(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # no functools.wraps
            return fn(*args, **kwargs)

        return wrapper

    class Cell(StatefulModule):
        @logged
        def initialize_state(self, batch_size: int) -> Any:
            return {"h": jnp.zeros((batch_size, 3))}

        @logged
        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
            return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    module = Cell()
    state = module.initialize_state(4)
    assert module(state, jnp.ones((4, 3))).output.shape == (4, 3)
    with pytest.raises(ContractError, match=r"Cell.__call__: argument state\['h'\] has B=4"):
        module(state, jnp.ones((2, 3)))


@pytest.mark.parametrize("kind", [staticmethod, classmethod])
def test_a_static_or_class_method_is_refused_with_how_the_library_calls_it(kind: Any) -> None:
    with pytest.raises(TypeError) as caught:

        class Fixed(StatefulModule):
            initialize_state = kind(lambda *_: {})

    message = str(caught.value)
    assert f"Fixed.initialize_state is a {kind.__name__}, not a method" in message
    assert "as initialize_state(self, batch_size)" in message


class ReadsALaterAlias(StatefulModule):
    """Annotated with an alias this module defines below the class (postponed annotations):
    unresolvable when the class is made, it was left unchecked with a warning."""

    def __call__(
        self, state: Any, x: ThreeFeatures, rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {})


ThreeFeatures = Float[Array, "B 3"]


def test_an_alias_defined_below_the_class_is_resolved_and_checked_at_the_first_call() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ReadsALaterAlias()((), jnp.ones((2, 3))).output.shape == (2, 3)
        with pytest.raises(ContractError, match="argument x does not match its jaxtyping"):
            ReadsALaterAlias()((), jnp.ones((2, 5)))


def test_a_subclass_calling_super_keeps_the_parents_annotations_checked() -> None:
    # The super() call ran the parent's method unchecked: a wrong width reached
    # jnp.dot, whose error named no module.
    from nnx_ppo.networks.feedforward import Dense

    class Scaled(Dense):
        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
            out = super().__call__(state, x, rollout_extras)
            return out.replace(output=2 * out.output)

    layer = Scaled(3, 2, nnx.Rngs(0))
    assert layer((), jnp.ones((4, 3))).output.shape == (4, 2)
    with pytest.raises(ContractError) as caught:
        layer((), jnp.ones((4, 5)))
    # The annotation broken is Dense's, reached through super(), not Scaled's own.
    assert str(caught.value).startswith(
        "Scaled.__call__ (Dense.__call__, reached through super()): argument x does not match"
    )


class ThreeFeatureBase(StatefulModule):
    def __call__(
        self, state: Any, x: Float[Array, "B 3"], rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {})


class SixFeatures(ThreeFeatureBase):
    """Takes six features and hands its parent two: the parent's annotation is broken."""

    def __call__(
        self, state: Any, x: Float[Array, "B 6"], rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return super().__call__(state, x[:, :2], rollout_extras)


def test_a_super_call_breaking_the_parents_annotation_names_the_parents_method() -> None:
    # It named SixFeatures.__call__ alone, whose x ('B 6') the value matched, beside the
    # parent's annotation ('B 3').
    with pytest.raises(ContractError) as caught:
        SixFeatures()((), jnp.ones((2, 6)))

    message = str(caught.value)
    assert message.startswith(
        "SixFeatures.__call__ (ThreeFeatureBase.__call__, reached through super()): "
        "argument x does not match its jaxtyping annotation."
    )
    assert "expected: Float[Array, 'B 3']\n" in message
