"""Every shipped module, container and network passes check_module; every built-in env
passes check_env. A failure here is a bug in the library, named by the kit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Parallel, Sequential, Splitter
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.factories import (
    make_discrete_mlp_actor_critic,
    make_mlp,
    make_mlp_actor_critic,
)
from nnx_ppo.networks.feedforward import Dense, Stateless
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU, LSTM
from nnx_ppo.networks.sampling_layers import (
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
)
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import Filter, Flattener, Map, Merge, Scale
from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck
from nnx_ppo.testing import check_env, check_module

# Few examples and two batch sizes per module: the kit's own tests exercise its search;
# these only need every property to run on a batch of one and a larger one.
MAX_EXAMPLES = 5
BATCH_SIZES = (1, 3)


def rngs() -> nnx.Rngs:
    return nnx.Rngs(0)


def sample(*shape: int) -> jax.Array:
    return jnp.zeros(shape, jnp.float32)


DICT_SAMPLE = {"a": sample(2), "b": sample(2, 3)}


def eval_mode(module: StatefulModule) -> StatefulModule:
    module.eval()
    return module


@dataclass(frozen=True)
class Case:
    """A module factory, one sample of its input, and whether it draws random numbers."""

    build: Callable[[], StatefulModule]
    example_input: Any
    stochastic: bool = False


CASES: dict[str, Case] = {
    "Dense": Case(lambda: Dense(3, 4, rngs(), activation=nnx.tanh), sample(3)),
    "Stateless": Case(
        lambda: Stateless(
            nnx.Sequential(nnx.Linear(3, 4, rngs=rngs()), nnx.LayerNorm(4, rngs=rngs()))
        ),
        sample(3),
    ),
    "LSTM": Case(lambda: LSTM(3, 4, rngs()), sample(3)),
    "LSTM-trainable-initial-state": Case(
        lambda: LSTM(3, 4, rngs(), use_optimized=False, trainable_initial_state=True), sample(3)
    ),
    "GRU": Case(lambda: GRU(3, 4, rngs(), trainable_initial_state=True), sample(3)),
    "Normalizer": Case(lambda: Normalizer(3, clip=5.0), sample(3)),
    "Normalizer-pytree": Case(lambda: Normalizer({"a": 2, "b": (2, 3)}), DICT_SAMPLE),
    "Delay": Case(lambda: Delay(sample(3), k_steps=2), sample(3)),
    "Delay-pytree": Case(lambda: Delay(DICT_SAMPLE, k_steps=1, initial_value=-1.0), DICT_SAMPLE),
    "NormalSampler": Case(lambda: NormalSampler(rngs(), 0.01), sample(4), stochastic=True),
    "NormalSampler-learned-std": Case(
        lambda: NormalSampler(rngs(), 0.01, action_size=2), sample(2), stochastic=True
    ),
    "NormalTanhSampler": Case(lambda: NormalTanhSampler(rngs(), 0.01), sample(4), stochastic=True),
    "CategoricalSampler": Case(
        lambda: CategoricalSampler(rngs(), 0.01), sample(3), stochastic=True
    ),
    "CategoricalSampler-eval": Case(lambda: eval_mode(CategoricalSampler(rngs(), 0.01)), sample(3)),
    "VariationalBottleneck": Case(
        lambda: VariationalBottleneck(2, rngs()), sample(4), stochastic=True
    ),
    "AR1VariationalBottleneck": Case(
        lambda: AR1VariationalBottleneck(2, rngs(), ar1_weight=0.5), sample(4), stochastic=True
    ),
    "Flattener": Case(lambda: Flattener(), DICT_SAMPLE),
    "Flattener-preserve-levels": Case(lambda: Flattener(preserve_levels=1), DICT_SAMPLE),
    "Filter": Case(lambda: Filter({"x": "a", "y": ("b",), "z": lambda x: 2 * x["a"]}), DICT_SAMPLE),
    "Scale": Case(lambda: Scale(-2.0), DICT_SAMPLE),
    "Merge": Case(lambda: Merge(left=Filter({"p": "a"}), right=Filter({"q": "b"})), DICT_SAMPLE),
    "Map": Case(lambda: Map(a=Dense(2, 3, rngs()), b=Normalizer((2, 3))), DICT_SAMPLE),
    "Sequential": Case(lambda: Sequential([Normalizer(3), make_mlp([3, 4, 2], rngs())]), sample(3)),
    "Parallel": Case(lambda: Parallel(cell=GRU(3, 2, rngs()), norm=Normalizer(3)), sample(3)),
    "Concat": Case(lambda: Concat(a=Dense(2, 3, rngs()), b=Flattener()), DICT_SAMPLE),
    "Splitter": Case(
        lambda: Sequential(
            [Splitter(left=1, right=2), Concat(left=Scale(2.0), right=LSTM(2, 2, rngs()))]
        ),
        sample(3),
    ),
    "recurrent-actor-critic": Case(
        lambda: Sequential(
            [
                Normalizer(3),
                Dense(3, 4, rngs(), activation=nnx.relu),
                LSTM(4, 4, rngs()),
                PPOAdapter(
                    action=Sequential([Dense(4, 2, rngs()), NormalTanhSampler(rngs(), 0.01)]),
                    value=Dense(4, 1, rngs()),
                ),
            ]
        ),
        sample(3),
        stochastic=True,
    ),
    "make_mlp_actor_critic": Case(
        lambda: make_mlp_actor_critic(3, 2, [4], [4], rngs()), sample(3), stochastic=True
    ),
    "make_mlp_actor_critic-dict-obs": Case(
        lambda: make_mlp_actor_critic({"a": 2, "b": 1}, 1, [4], [4], rngs()),
        {"a": sample(2), "b": sample(1)},
        stochastic=True,
    ),
    "make_discrete_mlp_actor_critic": Case(
        lambda: make_discrete_mlp_actor_critic(3, 3, [4], [4], rngs(), normalize_obs=False),
        sample(3),
        stochastic=True,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_shipped_module_passes_check_module(name: str) -> None:
    case = CASES[name]
    check_module(
        case.build,
        case.example_input,
        batch_sizes=BATCH_SIZES,
        stochastic=case.stochastic,
        max_examples=MAX_EXAMPLES,
    )


# Episodes shorter than the rollout, so that its ends and truncations are checked too.
SHORT_EPISODES: dict[str, dict[str, int]] = {
    "cartpole": {"max_steps": 3},
    "pendulum": {"max_steps": 3},
    "memory": {"delay": 1},
    "two_agent": {"max_steps": 3},
}


def test_every_built_in_env_is_checked() -> None:
    assert set(SHORT_EPISODES) <= set(envs.names())
    assert len(SHORT_EPISODES) == 4


@pytest.mark.parametrize("name", list(SHORT_EPISODES))
def test_built_in_env_passes_check_env(name: str) -> None:
    check_env(envs.make(name, **SHORT_EPISODES[name]), n_envs=3, steps=5)
