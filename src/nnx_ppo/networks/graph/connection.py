"""A connection: one directed, possibly delayed edge of a population graph."""

from flax import nnx

from nnx_ppo.contract.arguments import require_int
from nnx_ppo.networks.types import StatefulModule, require_stateful_module

__all__ = ["Connection"]


class Connection(nnx.Module):
    """An edge from population ``src`` to population ``dst`` of a population graph.

    Each step, ``transform`` maps the source's output ``(B, src.size)`` to a
    ``(B, dst.size)`` contribution that is added to the destination's input. With
    ``delay == 0`` the source's output of the same step is used; with ``delay == k``
    the one from ``k`` steps earlier (zeros until the episode has run ``k`` steps).
    Built by the graph's ``connect``, not directly.

    Attributes:
      src: the source population's name.
      dst: the destination population's name.
      transform: the :class:`~nnx_ppo.networks.types.StatefulModule` on the edge; its
        carry, ``rollout_extras`` and statistics are routed by the graph.
      delay: the number of steps the signal takes, ``>= 0``.

    Raises:
      ValueError: ``delay`` is negative.
      TypeError: ``delay`` is not an int, or ``transform`` is not a StatefulModule.
    """

    def __init__(self, src: str, dst: str, transform: StatefulModule, delay: int) -> None:
        require_int(f"connection {src} -> {dst}", "delay", delay, minimum=0)
        require_stateful_module(f"connection {src} -> {dst}: transform", transform)
        self.src = src
        self.dst = dst
        self.transform = transform
        self.delay = int(delay)

    @property
    def label(self) -> str:
        """``"src -> dst"``, with ``" (delay k)"`` for a delayed connection: names it in errors."""
        arrow = f"{self.src} -> {self.dst}"
        return arrow if self.delay == 0 else f"{arrow} (delay {self.delay})"
