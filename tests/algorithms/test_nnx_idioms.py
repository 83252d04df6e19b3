"""Modules written with ordinary Flax NNX idioms train as the contract says they do."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo import ContractError
from nnx_ppo.algorithms.checkpointing import load_checkpoint, make_checkpoint_fn
from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step, ppo_steps
from nnx_ppo.algorithms.rollout import eval_rollout
from nnx_ppo.envs import make
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import check_module

CONFIG = PPOConfig(n_envs=4, rollout_length=6, n_minibatches=2, n_epochs=1)
WIDTH = 4  # cart-pole's observation


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + jnp.tanh(self.linear(x))


class PerSampleVmap(StatefulModule):
    """A child applied row by row with ``nnx.vmap`` (the module broadcast)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.block = Block(rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        y = nnx.vmap(lambda block, row: block(row), in_axes=(None, 0))(self.block, x)
        return StatefulModuleOutput(state, y, jnp.zeros(()), {})


class ScanOverLayers(StatefulModule):
    """Three blocks made with ``nnx.vmap`` and applied with ``nnx.scan``."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def blocks(rngs: nnx.Rngs) -> Block:
            return Block(rngs)

        self.blocks = blocks(rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def apply(block: Block, h: jax.Array) -> jax.Array:
            return block(h)

        return StatefulModuleOutput(state, apply(self.blocks, x), jnp.zeros(()), {})


class Sows(StatefulModule):
    """Keeps its hidden activation with ``sow`` (``nnx.Intermediate``): exempt."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = self.linear(x)
        self.sow(nnx.Intermediate, "hidden", h)
        return StatefulModuleOutput(state, h, jnp.zeros(()), {})


def _policy(trunk: StatefulModule, rngs: nnx.Rngs) -> PPOAdapter:
    return PPOAdapter(
        action=Sequential(
            [trunk, Dense(WIDTH, 2, rngs), CategoricalSampler(rngs, entropy_weight=0.0)]
        ),
        value=Dense(WIDTH, 1, rngs),
    )


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside")  # Flax's, on Sows
@pytest.mark.parametrize("trunk", [PerSampleVmap, ScanOverLayers, Sows])
def test_a_module_using_an_nnx_transform_or_sow_passes_the_kit_and_trains(trunk) -> None:
    # The rollout's scan and its truncation cond hand the module variables of their own
    # trace: nnx.vmap and nnx.scan refuse variables closed over from an outer one.
    check_module(trunk(nnx.Rngs(0)), jnp.zeros(WIDTH), max_examples=2)
    env, network = make("cartpole"), _policy(trunk(nnx.Rngs(1)), nnx.Rngs(2))
    before = jax.tree.map(np.asarray, nnx.state(network, nnx.Param))
    state = new_training_state(env, network, CONFIG.n_envs, seed=0, learning_rate=1e-2)
    state, _ = ppo_step(env, state, CONFIG)  # rollout and learning as programs of their own
    state, (_, metrics) = ppo_steps(env, state, CONFIG, 2)  # both in one program's scan
    after = nnx.state(network, nnx.Param)
    assert np.isfinite(metrics["losses/total/mean"])
    pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    assert not all(np.array_equal(a, b) for a, b in pairs)


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside")
def test_a_network_that_sowed_in_an_eager_call_evaluates_trains_and_loads(tmp_path) -> None:
    # An eager sanity call left the sown tuple in the network: the rollout's scan carried
    # it, a sow inside lengthened it, and the carry changed structure (a raw TypeError).
    network = _policy(Sows(nnx.Rngs(1)), nnx.Rngs(2))
    network(network.initialize_state(2), jnp.zeros((2, WIDTH)))
    env = make("cartpole")
    returns = eval_rollout(env, network, 2, 8, jax.random.key(0))
    assert np.isfinite(returns["eval/episode_reward/mean"])
    state = new_training_state(env, network, CONFIG.n_envs, seed=0, learning_rate=1e-2)
    state, (_, metrics) = ppo_steps(env, state, CONFIG, 2)
    assert np.isfinite(metrics["losses/total/mean"])
    # Saved and loaded into a network that sowed again (no training state either way).
    make_checkpoint_fn(tmp_path)(state, state.steps_taken)
    template = _policy(Sows(nnx.Rngs(3)), nnx.Rngs(4))
    template(template.initialize_state(2), jnp.zeros((2, WIDTH)))
    assert load_checkpoint(tmp_path, template)["step"] == state.steps_taken
    loaded, trained = (jax.tree.leaves(nnx.state(n, nnx.Param)) for n in (template, network))
    assert all(np.array_equal(a, b) for a, b in zip(loaded, trained, strict=True))


def test_training_runs_under_x64() -> None:
    # The episode totals kept float32 and int32 while x64 made the rewards float64 and
    # the sums int64: the scan's carry changed type.
    with jax.enable_x64(True):
        for name in ("cartpole", "two_agent"):
            env = make(name)
            network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
            state = new_training_state(env, network, CONFIG.n_envs, seed=0)
            state, _ = ppo_step(env, state, CONFIG)
            state, metrics = ppo_step(env, state, CONFIG)
            assert np.isfinite(metrics["losses/total/mean"])
            assert all(
                r.dtype == jnp.float64 for r in jax.tree.leaves(state.running_episodes.returns)
            )


class IntegerParam(StatefulModule):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.order = nnx.Param(jnp.arange(WIDTH)[::-1])
        self.linear = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, self.linear(x[:, self.order[...]]), jnp.zeros(()), {})


def test_an_integer_param_is_named_before_anything_compiles() -> None:
    # nnx.grad failed inside the learning program, naming no module.
    network = _policy(IntegerParam(nnx.Rngs(0)), nnx.Rngs(1))
    with pytest.raises(
        TypeError, match=r"components\['action'\]\.layers\[0\]\.order is an nnx.Param of dtype int"
    ):
        new_training_state(make("cartpole"), network, CONFIG.n_envs, seed=0)


class ListScales(StatefulModule):
    """A setting held as a list: fine eagerly and under nnx.jit, which the kit compiles
    with; training takes the network's structure as a static jax.jit argument."""

    def __init__(self, scales: Any) -> None:
        self.scales = scales

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x * jnp.asarray(self.scales), jnp.zeros(()), {})


@pytest.mark.parametrize(("scales", "kind"), [([1.0, 0.5, 2.0, 1.0], "list"), ({"x": 1.0}, "dict")])
def test_an_unhashable_setting_is_named_by_training_and_the_kit(scales: Any, kind: str) -> None:
    # jax.jit refused the network's graph definition in thousands of lines.
    network = _policy(ListScales(scales), nnx.Rngs(1))
    where = rf"components\['action'\]\.layers\[0\]\.scales is a {kind}, which cannot be hashed"
    with pytest.raises(TypeError, match=r"^new_training_state: .*" + where):
        new_training_state(make("cartpole"), network, CONFIG.n_envs, seed=0)
    with pytest.raises(TypeError, match=r"^check_module: ListScales\.scales is a " + kind):
        check_module(ListScales(scales), jnp.zeros(WIDTH), max_examples=2)
    # As a tuple it trains.
    new_training_state(
        make("cartpole"), _policy(ListScales((1.0, 0.5, 2.0, 1.0)), nnx.Rngs(1)), 2, 0
    )


class WithBlocks(ListScales):
    """Layers in an nnx.data list (data, not a setting) beside a list setting."""

    def __init__(self, scales: Any) -> None:
        super().__init__(scales)
        self.blocks = nnx.data([nnx.Linear(WIDTH, WIDTH, rngs=nnx.Rngs(0))])


def test_the_unhashable_setting_is_named_not_a_data_list_beside_it() -> None:
    with pytest.raises(TypeError, match=r"^check_module: WithBlocks\.scales is a list"):
        check_module(WithBlocks([1.0, 2.0, 1.0, 1.0]), jnp.zeros(WIDTH), max_examples=2)


class PythonIntParam(IntegerParam):
    def __init__(self, rngs: nnx.Rngs) -> None:
        super().__init__(rngs)
        self.order = nnx.Param(2)  # type: ignore[assignment]


def test_the_kit_refuses_an_integer_param_as_training_does() -> None:
    with pytest.raises(TypeError, match=r"^check_module: IntegerParam\.order is an nnx.Param"):
        check_module(IntegerParam(nnx.Rngs(0)), jnp.zeros(WIDTH), max_examples=2)
    # A Python int, held as int32 (it had no dtype to read, and passed both).
    network = _policy(PythonIntParam(nnx.Rngs(0)), nnx.Rngs(1))
    with pytest.raises(TypeError, match=r"layers\[0\]\.order is an nnx.Param of dtype int32"):
        new_training_state(make("cartpole"), network, CONFIG.n_envs, seed=0)


class RngDropout(StatefulModule):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, self.dropout(x), jnp.zeros(()), {})


def test_a_draw_from_an_nnx_rngs_in_call_is_named_with_the_randomness_rule() -> None:
    module = RngDropout(nnx.Rngs(0))
    with pytest.raises(ContractError, match=r"drew from an nnx\.Rngs stream") as caught:
        module((), jnp.ones((3, WIDTH)))
    assert "per-env keys" in str(caught.value)
    assert caught.value.leaf.startswith("RngDropout.dropout.rngs")
    env, network = make("cartpole"), _policy(RngDropout(nnx.Rngs(1)), nnx.Rngs(2))
    state = new_training_state(env, network, CONFIG.n_envs, seed=0)
    with pytest.raises(ContractError, match=r"drew from an nnx\.Rngs stream"):
        ppo_step(env, state, CONFIG)
