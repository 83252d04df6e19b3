"""Routing utilities (Flattener, Filter, Scale, Merge, Map) and the per-env key helpers."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import nnx_ppo
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Parallel, Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import (
    Filter,
    Flattener,
    Map,
    Merge,
    Scale,
    new_env_keys,
    split_env_keys,
)
from nnx_ppo.networks.variational import VariationalBottleneck


@nnx.jit
def _call(module: StatefulModule, state: Any, x: Any, rollout_extras: Any = None) -> Any:
    return module(state, x, rollout_extras)


def _nested(batch: int) -> dict[str, Any]:
    return {
        "a": {"p": jnp.arange(batch * 4.0).reshape(batch, 4), "t": jnp.ones((batch, 2, 3))},
        "b": -jnp.ones((batch, 1)),
    }


# -------------------------------------------------------------------------- Flattener


def test_flattener_concatenates_leaves_in_tree_order():
    x = _nested(2)
    out = Flattener()((), x)
    expected = np.concatenate(
        [np.asarray(x["a"]["p"]), np.asarray(x["a"]["t"]).reshape(2, 6), np.asarray(x["b"])],
        axis=-1,
    )
    np.testing.assert_array_equal(out.output, expected)
    assert out.rollout_extras is None and out.next_state == ()


def test_flattener_preserves_the_top_levels():
    x = _nested(2)
    one = Flattener(preserve_levels=1)((), x).output
    assert set(one) == {"a", "b"}
    assert one["a"].shape == (2, 10) and one["b"].shape == (2, 1)
    two = Flattener(preserve_levels=2)((), {"a": x["a"], "b": {"c": x["b"]}}).output
    assert two["a"]["t"].shape == (2, 6)
    np.testing.assert_array_equal(two["b"]["c"], x["b"])  # already flat: unchanged
    lists = Flattener(preserve_levels=1)((), [x["b"], x["a"]]).output
    assert isinstance(lists, list) and lists[1].shape == (2, 10)


class _Body(NamedTuple):
    pos: jax.Array
    vel: jax.Array


def test_flattener_keeps_a_namedtuple_level():
    x = _Body(jnp.arange(12.0).reshape(2, 2, 3), jnp.ones((2, 5)))
    out = Flattener(preserve_levels=1)((), x).output
    assert isinstance(out, _Body)
    np.testing.assert_array_equal(out.pos, np.arange(12.0).reshape(2, 6))
    np.testing.assert_array_equal(out.vel, np.ones((2, 5)))
    assert _call(Flattener(preserve_levels=1), (), x).output.pos.shape == (2, 6)


def test_flattener_bad_depths_are_named():
    with pytest.raises(ValueError, match="preserve_levels must be >= 0"):
        Flattener(-1)
    with pytest.raises(TypeError, match=r"x\['b'\] is a .*1 more level"):
        Flattener(preserve_levels=2)((), _nested(2))


# ----------------------------------------------------------------------------- Filter


def test_filter_by_key_path_index_and_function():
    x = {"obs": {"pos": jnp.ones((2, 3)), "vel": jnp.zeros((2, 1))}, "list": [jnp.ones((2, 5))]}
    spec = {
        "pos": ("obs", "pos"),
        "all_obs": "obs",
        "first": ("list", 0),
        "speed": lambda t: 2.0 * t["obs"]["vel"],
    }
    out = Filter(spec)((), x).output
    assert set(out) == set(spec)
    assert out["pos"] is x["obs"]["pos"]
    assert out["all_obs"] is x["obs"]
    assert out["first"] is x["list"][0]
    np.testing.assert_array_equal(out["speed"], np.zeros((2, 1)))


@pytest.mark.parametrize("caught", [KeyError, ValueError])
def test_filter_names_the_missing_entry(caught: type[Exception]):
    # 0.3.0 raised KeyError; ValueError is this version's type for bad inputs: both catch it.
    with pytest.raises(caught, match=r"x\['obs'\] has no entry 'vel'.*\['pos'\]") as raised:
        Filter({"v": ("obs", "vel")})((), {"obs": {"pos": jnp.ones((2, 1))}})
    assert str(raised.value).startswith("Filter output 'v' reads")  # not repr-quoted


def test_filter_path_errors_keep_the_types_of_0_3_0():
    x = {"list": [jnp.ones((2, 1))], "leaf": jnp.ones((2, 1))}
    with pytest.raises(IndexError, match=r"x\['list'\] has no entry 3") as raised:
        Filter({"v": ("list", 3)})((), x)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(TypeError, match=r"x\['leaf'\] has no entry 'a'") as raised:
        Filter({"v": ("leaf", "a")})((), x)
    assert isinstance(raised.value, ValueError)


def test_filter_bad_specs_are_named():
    with pytest.raises(TypeError, match="Filter spec must be a dict"):
        Filter(["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="spec for 'x'"):
        Filter({"x": 1.5})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="at least one"):
        Filter({})


def test_filter_graphdef_is_hashable_for_jit_caches():
    graphdef, _ = nnx.split(Filter({"a": "x", "b": ("y", 0), "c": abs}))
    hash(graphdef)


# ------------------------------------------------------------------------------ Scale


@given(factor=st.floats(-3, 3), batch=st.sampled_from([1, 2, 3]))
def test_scale_multiplies_every_leaf(factor: float, batch: int):
    x = {"a": jnp.arange(batch * 2.0).reshape(batch, 2), "b": [jnp.ones((batch,))]}
    out = Scale(factor)((), x).output
    np.testing.assert_allclose(out["a"], factor * np.asarray(x["a"]), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(out["b"][0], factor * np.ones(batch), rtol=1e-6, atol=1e-30)


def test_scale_rejects_non_numbers():
    with pytest.raises(TypeError, match="Scale: factor"):
        Scale("2")  # type: ignore[arg-type]


# ------------------------------------------------------------------------ Merge, Map


def test_merge_flattens_children_outputs_and_follows_the_container_rules():
    rngs = nnx.Rngs(0)
    # Merge children output dicts: a Filter wraps the bottleneck's array.
    merge = Merge(
        policy=Sequential(
            [Normalizer(2), VariationalBottleneck(1, rngs), Filter({"z": lambda z: z})]
        ),
        heads=Parallel(value=Dense(2, 1, rngs), aux=Scale(2.0)),
    )
    state = merge.initialize_state(3)
    assert set(state) == {"policy", "heads"}
    x = jnp.arange(6.0).reshape(3, 2)
    out = _call(merge, state, x)
    assert set(out.output) == {"z", "value", "aux"}
    np.testing.assert_array_equal(out.output["aux"], 2.0 * np.asarray(x))
    assert set(out.metrics) == {"policy", "heads"}
    np.testing.assert_allclose(
        out.regularization_loss, out.metrics["policy"][1]["kl_divergence"], rtol=1e-6
    )
    replay = _call(merge, state, x, out.rollout_extras)
    # Replay recomputes in another program: equal to float32 rounding, not bit for bit.
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        out.output,
        replay.output,
    )

    merge.update_statistics(jax.tree.map(lambda e: e[None], out.rollout_extras))
    normalizer = merge["policy"][0]
    assert isinstance(normalizer, Normalizer)
    assert float(normalizer.counter[...]) == 3.0
    reset = merge.reset_state(out.next_state)
    assert jax.tree.structure(reset) == jax.tree.structure(state)


def test_merge_rejects_duplicate_keys_and_non_dict_children():
    duplicate = Merge(a=Filter({"k": "x"}), b=Filter({"k": "y"}))
    with pytest.raises(ValueError, match="'a' and 'b' both output key 'k'"):
        duplicate({"a": (), "b": ()}, {"x": jnp.ones((1, 1)), "y": jnp.ones((1, 1))})
    with pytest.raises(TypeError, match="child 's' must output a dict"):
        Merge(s=Scale(1.0))({"s": ()}, jnp.ones((1, 1)))
    with pytest.raises(ValueError, match="at least one"):
        Merge()


def test_map_dispatches_by_key_and_drops_unnamed_entries():
    rngs = nnx.Rngs(0)
    net = Map(fast=Scale(2.0), slow=Dense(3, 1, rngs))
    x = {"fast": jnp.ones((2, 2)), "slow": jnp.ones((2, 3)), "unused": jnp.ones((2, 7))}
    out = _call(net, net.initialize_state(2), x)
    assert set(out.output) == {"fast", "slow"}
    np.testing.assert_array_equal(out.output["fast"], np.full((2, 2), 2.0))
    assert out.output["slow"].shape == (2, 1)
    keyed = Map({"not an identifier": Scale(1.0)})
    assert set(keyed.initialize_state(1)) == {"not an identifier"}


def test_map_routes_samplers_state_extras_and_statistics():
    rngs = nnx.Rngs(0)
    net = Map(
        left=Sequential([Normalizer(3), CategoricalSampler(rngs, 0.1)]),
        right=CategoricalSampler(rngs, 0.2),
    )
    state = net.initialize_state(2)
    x = {"left": jnp.ones((2, 3)), "right": jnp.zeros((2, 3))}
    out = _call(net, state, x)
    np.testing.assert_allclose(
        out.regularization_loss, -(0.1 + 0.2) * np.log(3) * np.ones(2), rtol=1e-5
    )
    assert out.rollout_extras["right"].shape == (2,)
    replay = _call(net, state, x, out.rollout_extras)
    # Replay recomputes in another program: equal to float32 rounding, not bit for bit.
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        out.output,
        replay.output,
    )
    assert nnx_ppo.checks_enabled()  # so a routing miss would raise
    net.update_statistics(jax.tree.map(lambda e: e[None], out.rollout_extras))
    assert float(net["left"][0].counter[...]) == 2.0


def test_map_missing_entries_are_named():
    net = Map(a=Scale(1.0), b=Scale(1.0))
    for caught in (KeyError, ValueError):  # 0.3.0's type, and this version's
        with pytest.raises(caught, match=r"lacks the entries \['b'\]") as raised:
            net({"a": (), "b": ()}, {"a": jnp.ones((1, 1))})
        assert str(raised.value).startswith("Map input lacks")
    with pytest.raises(nnx_ppo.ContractError, match=r"Map\.__call__: argument x"):
        net({"a": (), "b": ()}, jnp.ones((1, 1)))
    with nnx_ppo.checks(False), pytest.raises(TypeError, match="expects a dict input") as raised:
        net({"a": (), "b": ()}, jnp.ones((1, 1)))
    assert isinstance(raised.value, ValueError)
    with pytest.raises(ValueError, match="either a dict or keyword"):
        Map({"a": Scale(1.0)}, b=Scale(1.0))


def test_concat_input_errors_keep_the_types_of_0_3_0():
    net = Concat(a=Scale(1.0), b=Scale(1.0))
    state = {"a": (), "b": ()}
    with pytest.raises(KeyError, match=r"keys \['a', 'b'\], got \['a'\]") as missing:
        net(state, {"a": jnp.ones((1, 1))})
    assert isinstance(missing.value, ValueError)
    with pytest.raises(ValueError, match=r"got \['a', 'b', 'c'\]"):
        net(state, {"a": jnp.ones((1, 1)), "b": jnp.ones((1, 1)), "c": jnp.ones((1, 1))})
    with nnx_ppo.checks(False), pytest.raises(TypeError, match="got a ArrayImpl") as raised:
        net(state, jnp.ones((1, 1)))
    assert isinstance(raised.value, ValueError)


def test_flattener_feeds_a_ppo_adapter():
    rngs = nnx.Rngs(0)
    net = Sequential(
        [
            Flattener(),
            PPOAdapter(
                action=CategoricalSampler(rngs, 0.0), value=Filter({"v": lambda x: x[:, :1]})
            ),
        ]
    )
    x = {"a": jnp.ones((2, 1)), "b": jnp.zeros((2, 1))}
    out = _call(net, net.initialize_state(2), x)
    assert out.output.actions.shape == (2,)


# ------------------------------------------------------------------------ env keys


def test_env_keys_are_independent_rows_and_split_per_row():
    keys = new_env_keys(nnx.Rngs(0), 5)
    assert keys.shape == (5,) and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    data = jax.random.key_data
    assert len({tuple(np.asarray(row)) for row in data(keys)}) == 5
    next_keys, step_keys = split_env_keys(keys)
    rows = np.array([4, 0])
    sliced_next, sliced_step = split_env_keys(keys[rows])
    np.testing.assert_array_equal(data(sliced_next), data(next_keys)[rows])
    np.testing.assert_array_equal(data(sliced_step), data(step_keys)[rows])
    assert not np.array_equal(data(next_keys), data(keys))
    assert not np.array_equal(data(next_keys), data(step_keys))
