"""The module contract and every module: one import path per concept.

``from nnx_ppo.networks import Sequential, Dense, LSTM, Normalizer, PPOAdapter`` works
for every layer, container and sampler; the deep paths (``nnx_ppo.networks.containers``,
...) stay valid, as nnx-ppo 0.3.0 had them.
"""

from nnx_ppo.networks.adapter import PPOAdapter, is_sampled_action
from nnx_ppo.networks.containers import Concat, FrozenStatistics, Parallel, Sequential, Splitter
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.factories import (
    ACTIVATIONS,
    make_default_network,
    make_discrete_mlp_actor_critic,
    make_lstm_actor_critic,
    make_mlp,
    make_mlp_actor_critic,
    make_mlp_layers,
)
from nnx_ppo.networks.feedforward import Dense, Stateless
from nnx_ppo.networks.graph import PopulationGraph
from nnx_ppo.networks.network_summary import print_summary, summary
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU, LSTM, LSTMCarry
from nnx_ppo.networks.sampling_layers import (
    ActionSampler,
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
    SampledAction,
)
from nnx_ppo.networks.types import (
    EntryTypeError,
    MissingEntryError,
    PPONetworkOutput,
    StatefulModule,
    StatefulModuleOutput,
    checked_ppo_output,
)
from nnx_ppo.networks.utils import Filter, Flattener, Map, Merge, Scale
from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck

__all__ = [
    "ACTIVATIONS",
    "GRU",
    "LSTM",
    "AR1VariationalBottleneck",
    "ActionSampler",
    "CategoricalSampler",
    "Concat",
    "Delay",
    "Dense",
    "EntryTypeError",
    "Filter",
    "Flattener",
    "FrozenStatistics",
    "LSTMCarry",
    "Map",
    "Merge",
    "MissingEntryError",
    "NormalSampler",
    "NormalTanhSampler",
    "Normalizer",
    "PPOAdapter",
    "PPONetworkOutput",
    "Parallel",
    "PopulationGraph",
    "SampledAction",
    "Scale",
    "Sequential",
    "Splitter",
    "StatefulModule",
    "StatefulModuleOutput",
    "Stateless",
    "VariationalBottleneck",
    "checked_ppo_output",
    "is_sampled_action",
    "make_default_network",
    "make_discrete_mlp_actor_critic",
    "make_lstm_actor_critic",
    "make_mlp",
    "make_mlp_actor_critic",
    "make_mlp_layers",
    "print_summary",
    "summary",
]
