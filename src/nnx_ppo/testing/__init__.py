"""The contract test kit: Hypothesis strategies and example modules for your own CI.

* :mod:`nnx_ppo.testing.strategies`: batch sizes, time lengths, batched pytree
  observations, and random nestings of the containers over leaf modules.
* :mod:`nnx_ppo.testing.modules`: small leaf modules, one stateless, one with a
  carry, one that keeps running statistics, to nest your own module among.
"""

from nnx_ppo.testing import modules, strategies

__all__ = ["modules", "strategies"]
