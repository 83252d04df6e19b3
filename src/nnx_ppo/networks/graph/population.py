"""A population: one named node of a :class:`~nnx_ppo.networks.graph.PopulationGraph`."""

from collections.abc import Callable

from flax import nnx
from jaxtyping import Array

__all__ = ["Population"]


class Population(nnx.Module):
    """A node of a population graph: a vector of ``size`` units and its transfer function.

    Each step the population sums what reaches it (its observation entry, if it is an
    input, and the output of every incoming connection), applies ``activation`` once,
    and offers the result to its outgoing connections and, if it is an output, to the
    graph's output dict. Built by the graph's ``add_population``, ``add_input`` and
    ``add_output``, not directly. Its parameters are its activation's, if that is a
    module (``nnx.LayerNorm``): trained and counted with the graph's.

    Attributes:
      name: the population's name, unique in its graph.
      size: the width of its output, ``(B, size)``.
      activation: applied to the summed input; ``None`` leaves it linear.
      input_from: the observation key whose ``(B, size)`` entry is added to the
        sum, or ``None`` for a population that reads no observation.
      output_to: the key of the graph's output under which the population's output
        appears, or ``None`` for one that is not an output.
      max_outgoing_delay: the longest delay of a connection leaving the population,
        set by ``finalize()``; its carry keeps that many past outputs (none if 0).
    """

    def __init__(
        self,
        name: str,
        size: int,
        activation: Callable[[Array], Array] | None,
        input_from: str | None,
        output_to: str | None,
    ) -> None:
        self.name = name
        self.size = size
        self.activation = activation
        self.input_from = input_from
        self.output_to = output_to
        self.max_outgoing_delay = 0
