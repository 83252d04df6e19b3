"""Networks declared as graphs of named populations joined by (delayed) connections.

:class:`PopulationGraph` is the module; :class:`Population` and :class:`Connection`
are its nodes and edges, made by its ``add_*`` and ``connect`` methods.
"""

from nnx_ppo.networks.graph.connection import Connection
from nnx_ppo.networks.graph.graph import (
    GraphCarry,
    GraphExtras,
    GraphHistory,
    PopulationGraph,
    RingBuffer,
)
from nnx_ppo.networks.graph.population import Population

__all__ = [
    "Connection",
    "GraphCarry",
    "GraphExtras",
    "GraphHistory",
    "Population",
    "PopulationGraph",
    "RingBuffer",
]
