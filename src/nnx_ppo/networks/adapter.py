"""``PPOAdapter``: the two ports that turn a network's output into a ``PPONetworkOutput``.

A PPO network ends in a :class:`PPOAdapter`. Its ``action`` port ends in one
action sampler, or a pytree of them for pytree actions (e.g.
``Map(left=NormalTanhSampler(...), right=CategoricalSampler(...))``); its
``value`` port produces one value per sample, or a pytree of them for pytree
rewards::

    Sequential([
        Normalizer(obs_size),
        PPOAdapter(
            action=Sequential([*make_mlp_layers([obs_size, 64, 2 * action_size], rngs),
                               NormalTanhSampler(rngs, entropy_weight=1e-2)]),
            value=make_mlp([obs_size, 64, 1], rngs, activation_last_layer=False),
        ),
    ])
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array

from nnx_ppo.contract import ContractError, describe_module
from nnx_ppo.contract.axes import BatchedTree, Carry, Extras, FloatBatch
from nnx_ppo.networks.containers import Parallel
from nnx_ppo.networks.sampling_layers import SampledAction
from nnx_ppo.networks.types import (
    PPONetworkOutput,
    StatefulModule,
    StatefulModuleOutput,
    require_stateful_module,
)

__all__ = ["PPOAdapter", "is_sampled_action"]

_SAMPLED_ACTION_KEYS = frozenset(SampledAction.__annotations__)


def is_sampled_action(node: Any) -> bool:
    """Whether ``node`` is one sampler's output, a ``SampledAction`` dict."""
    return isinstance(node, Mapping) and set(node) == _SAMPLED_ACTION_KEYS


class PPOAdapter(Parallel):
    """Runs an ``action`` and a ``value`` port on the same input; outputs a ``PPONetworkOutput``.

    A :class:`~nnx_ppo.networks.containers.Parallel` with the fixed keys
    ``"action"`` and ``"value"``: carry, extras and metrics are dicts by those
    keys and the two ports' regularization is summed. The output is built so:

    * ``actions`` and ``loglikelihoods``: the action port's output must be a
      pytree whose nodes are :class:`~nnx_ppo.networks.sampling_layers.SampledAction`
      dicts ``{"action", "log_likelihood"}``; each is replaced by its action
      (``(B, *action)``) and its log-likelihood (``(B,)``) respectively.
    * ``value_estimates``: the value port's output, each leaf ``(B,)`` or
      ``(B, 1)``; a trailing length-1 axis is removed, never the batch axis.

    Args:
      action: the action port, ending in one sampler or a pytree of samplers.
      value: the value port.
    """

    def __init__(self, action: StatefulModule, value: StatefulModule) -> None:
        super().__init__(action=action, value=value)

    @property
    def action(self) -> StatefulModule:
        """The action port; assigning replaces it (as 0.3.0's attribute did)."""
        return self.components["action"]

    @action.setter
    def action(self, module: StatefulModule) -> None:
        require_stateful_module("PPOAdapter's action port", module)
        self.components["action"] = module

    @property
    def value(self) -> StatefulModule:
        """The value port; assigning replaces it (as 0.3.0's attribute did)."""
        return self.components["value"]

    @value.setter
    def value(self, module: StatefulModule) -> None:
        require_stateful_module("PPOAdapter's value port", module)
        self.components["value"] = module

    def __call__(
        self,
        state: dict[str, Carry],
        x: BatchedTree,
        rollout_extras: dict[str, Extras] | None = None,
    ) -> StatefulModuleOutput:
        outputs, rest = self._run_children(state, lambda _: x, rollout_extras)
        sampled = outputs["action"]
        self._check_action_output(sampled)
        network_output = PPONetworkOutput(
            actions=jax.tree.map(lambda s: s["action"], sampled, is_leaf=is_sampled_action),
            loglikelihoods=jax.tree.map(
                lambda s: s["log_likelihood"], sampled, is_leaf=is_sampled_action
            ),
            value_estimates=self._value_estimates(outputs["value"]),
        )
        return rest.replace(output=network_output)

    def _violation(self, problem: str, **details: str) -> ContractError:
        return ContractError.violation(f"{describe_module(self)}.__call__", problem, **details)

    def _check_action_output(self, sampled: Any) -> None:
        nodes, _ = jax.tree_util.tree_flatten_with_path(sampled, is_leaf=is_sampled_action)
        if not nodes:
            raise self._violation(
                "the action port's output holds no sampled action.",
                leaf="output['action']",
                expected="a SampledAction {'action', 'log_likelihood'} or a pytree of them",
                found=repr(sampled),
            )
        for path, node in nodes:
            where = "output['action']" + jax.tree_util.keystr(path)
            if not is_sampled_action(node):
                raise self._violation(
                    f"{where} is not part of a sampled action.",
                    leaf=where,
                    expected="every leaf of the action port's output inside a SampledAction "
                    "{'action', 'log_likelihood'} (end the port in an ActionSampler)",
                    found=f"shape {tuple(jnp.shape(node))} outside any SampledAction",
                )
            log_likelihood = node["log_likelihood"]
            if jnp.ndim(log_likelihood) != 1:
                raise self._violation(
                    f"{where}['log_likelihood'] is not one value per sample.",
                    leaf=f"{where}['log_likelihood']",
                    expected="(B,)",
                    found=f"shape {tuple(jnp.shape(log_likelihood))}",
                    rule="a log-likelihood is summed over the action's dimensions",
                )

    def _value_estimates(self, values: Any) -> Any:
        def per_sample(path: Any, value: Array) -> FloatBatch:
            if value.ndim == 2 and value.shape[-1] == 1:
                return value[:, 0]
            if value.ndim == 1:
                return value
            where = "output['value']" + jax.tree_util.keystr(path)
            raise self._violation(
                f"{where} is not one value per sample.",
                leaf=where,
                expected="(B,) or (B, 1)",
                found=f"shape {tuple(value.shape)}",
                rule="a value estimate is one number per sample and reward leaf; use a pytree "
                "of values for a pytree of rewards",
            )

        return jax.tree_util.tree_map_with_path(per_sample, values)
