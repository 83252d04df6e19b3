"""Action samplers: distribution parameters in, an action and its log-likelihood out.

A sampler is an ordinary :class:`~nnx_ppo.networks.types.StatefulModule`, usually
the last layer of the ``action`` port of a
:class:`~nnx_ppo.networks.adapter.PPOAdapter`. Every sampler here:

* carries one typed PRNG key per environment, shape ``(B,)``, seeded in
  ``initialize_state`` from the ``nnx.Rngs`` it was built with and split each
  step, so that rollout, replay and any slice of the batch see the same random
  numbers for the same env. ``reset_state`` keeps the key stream (it returns
  the keys it is given, batched or one env's);
* in rollout and inference (``rollout_extras is None``) draws a raw action and
  emits it as ``rollout_extras``; in loss replay scores the **stored** raw
  action under the current parameters and emits it back unchanged;
* returns :class:`SampledAction` ``{"action": (B, *action), "log_likelihood": (B,)}``;
* adds ``-entropy_weight * entropy`` as its ``regularization_loss``, shape ``(B,)``;
* reports its distribution parameters (or what :meth:`ActionSampler.reported`
  makes of them) and its entropy in ``metrics``;
* has a deterministic mode (the mean, or the most likely class) that
  ``module.eval()`` switches on and ``module.train()`` off, through the
  ``deterministic`` attribute NNX sets. Replay scores the stored action in
  either mode.

To write a new sampler, subclass :class:`ActionSampler` and describe the
distribution; the base class does the keys, the extras and the bookkeeping.
"""

import abc
import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.scipy.special import erf
from jaxtyping import Array, Float, Int, Key, PyTree, Shaped

from nnx_ppo.contract import ContractError, describe_module
from nnx_ppo.contract.arguments import require_int, require_number
from nnx_ppo.contract.axes import AnyArray, FloatBatch, PerEnvKeys
from nnx_ppo.contract.errors import rule_text
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import (
    KeySource,
    new_env_keys,
    require_key_source,
    split_env_keys,
)

__all__ = [
    "ActionSampler",
    "CategoricalSampler",
    "DistributionParameters",
    "NormalSampler",
    "NormalTanhSampler",
    "ReportedDistribution",
    "SampledAction",
]

DistributionParameters = dict[str, Float[Array, "..."]]
"""A sampler's distribution parameters by name.

``dict[str, Float[Array, "..."]]``: batched, leaves ``(B, ...)``, as
:meth:`ActionSampler.distribution_parameters` returns them and every method but
:meth:`ActionSampler.sample` takes them; ``sample``, vmapped over the envs, receives
one env's slice, leaves ``(...)`` without ``B``.
"""

ReportedDistribution = dict[str, PyTree[Float[Array, "B ..."]]]
"""What a sampler's ``metrics`` show of its distribution (:meth:`ActionSampler.reported`)."""


class SampledAction(TypedDict):
    """The output of an :class:`ActionSampler`, as consumed by ``PPOAdapter``.

    Attributes:
      action: the action handed to the environment, ``(B, *action)``.
      log_likelihood: its log-likelihood under the current parameters, ``(B,)``.
    """

    action: Shaped[Array, "B *action"]
    log_likelihood: FloatBatch


class ActionSampler(StatefulModule):
    """The base of action samplers: per-env keys, rollout extras, replay and entropy bonus.

    Carry: the per-env keys, ``(B,)`` typed PRNG keys. Emits the raw sampled
    action (before any squashing), ``(B, *raw)``, as ``rollout_extras``.

    Subclasses describe the distribution with :meth:`distribution_parameters`,
    :meth:`sample`, :meth:`mode`, :meth:`log_likelihood`, :meth:`entropy` and,
    when the environment's action is a transform of the raw sample, :meth:`squash`.

    Args:
      rng: seeds the per-env keys in ``initialize_state``: an ``nnx.Rngs`` (its
        default stream), one of its streams, or a function returning a key.
      entropy_weight: the entropy bonus; ``regularization_loss`` is
        ``-entropy_weight * entropy``. Must be ``>= 0``.
    """

    deterministic: bool

    def __init__(self, rng: KeySource, entropy_weight: float) -> None:
        name = type(self).__name__
        require_key_source(name, "rng", rng)
        require_number(name, "entropy_weight", entropy_weight, minimum=0.0)
        self.rng = rng
        self.entropy_weight = float(entropy_weight)
        self.deterministic = False

    # ------------------------------------------------------------- the distribution

    @abc.abstractmethod
    def distribution_parameters(self, x: Float[Array, "B params"]) -> DistributionParameters:
        """The distribution's parameters from the sampler's input, leaves ``(B, ...)``."""

    @abc.abstractmethod
    def sample(
        self, key: Key[Array, ""], parameters: DistributionParameters
    ) -> Shaped[Array, "*raw"]:
        """One raw sample for **one** environment: ``key`` and ``parameters`` are unbatched."""

    @abc.abstractmethod
    def mode(self, parameters: DistributionParameters) -> Shaped[Array, "B *raw"]:
        """The deterministic raw action (mean or most likely class), batched."""

    @abc.abstractmethod
    def log_likelihood(
        self, raw_action: Shaped[Array, "B *raw"], parameters: DistributionParameters
    ) -> FloatBatch:
        """The log-likelihood of the action that ``raw_action`` becomes after
        :meth:`~nnx_ppo.networks.sampling_layers.ActionSampler.squash`."""

    @abc.abstractmethod
    def entropy(self, parameters: DistributionParameters) -> FloatBatch:
        """The entropy of the action distribution (after
        :meth:`~nnx_ppo.networks.sampling_layers.ActionSampler.squash`), one per sample."""

    def squash(self, raw_action: Shaped[Array, "B *raw"]) -> Shaped[Array, "B *action"]:
        """The action handed to the environment. The identity unless overridden."""
        return raw_action

    def reported(self, parameters: DistributionParameters) -> ReportedDistribution:
        """The distribution's description in ``metrics``: the parameters unless overridden.

        Each leaf is logged as its mean and std over the batch and its own axes.
        Override it where that mean says little (probabilities over classes, whose
        mean is ``1/n``), or is not finite (a log-probability of ``-inf``).
        """
        return dict(parameters)

    # --------------------------------------------------------------- the contract

    def __call__(
        self,
        state: PerEnvKeys,
        x: Float[AnyArray, "B params"],
        rollout_extras: Shaped[AnyArray, "B *raw"] | None = None,
    ) -> StatefulModuleOutput:
        """Sample (rollout, inference) or score the stored action (replay).

        Args:
          state: the per-env keys, ``(B,)``.
          x: the distribution's parameters in the sampler's input format, ``(B, params)``.
          rollout_extras: ``None``, or in replay the raw action emitted in rollout.

        Returns:
          ``output`` is a :class:`SampledAction`; ``rollout_extras`` is the raw action.
        """
        parameters = self.distribution_parameters(jnp.asarray(x))
        next_keys, step_keys = split_env_keys(state)
        if rollout_extras is not None:
            raw_action = jnp.asarray(rollout_extras)
            self._check_stored_action(raw_action, parameters)
        elif self.deterministic:
            raw_action = self.mode(parameters)
        else:
            # The action is data for the loss, not a function of the parameters.
            raw_action = jax.lax.stop_gradient(jax.vmap(self.sample)(step_keys, parameters))
        entropy = self.entropy(parameters)
        output = SampledAction(
            action=self.squash(raw_action),
            log_likelihood=self.log_likelihood(raw_action, parameters),
        )
        return StatefulModuleOutput(
            next_state=next_keys,
            output=output,
            regularization_loss=-self.entropy_weight * entropy,
            metrics={**self.reported(parameters), "entropy": entropy},
            rollout_extras=raw_action,
        )

    def initialize_state(self, batch_size: int) -> PerEnvKeys:
        return new_env_keys(self.rng, batch_size)

    def _check_stored_action(
        self, stored: Shaped[Array, "B *raw"], parameters: DistributionParameters
    ) -> None:
        expected = jax.eval_shape(self.mode, parameters)
        stored_integer = jnp.issubdtype(stored.dtype, jnp.integer)
        expected_integer = jnp.issubdtype(expected.dtype, jnp.integer)
        if stored.shape == expected.shape and stored_integer == expected_integer:
            return
        raise ContractError.violation(
            f"{describe_module(self)}.__call__",
            "the stored raw action does not fit this sampler's distribution.",
            leaf="rollout_extras",
            expected=f"shape {expected.shape} {expected.dtype}",
            found=f"shape {stored.shape} {stored.dtype}",
            rule=rule_text(
                "in loss replay a sampler is given back the raw action it emitted in rollout",
                "rules",
            ),
        )


def _split_mean_and_std(owner: str, x: Float[Array, "B params"]) -> tuple[Array, Array]:
    if x.shape[-1] % 2:
        raise ValueError(
            f"{owner} expects the mean and the pre-softplus std concatenated, (B, 2 * action), "
            f"but its input has an odd width: shape {tuple(x.shape)}"
        )
    mean, raw_std = jnp.split(x, 2, axis=-1)
    return mean, raw_std


def _normal_log_density(
    u: Float[Array, "B action"], mu: Float[Array, "B action"], sigma: Float[Array, "B action"]
) -> Float[Array, "B action"]:
    return -0.5 * jnp.square((u - mu) / sigma) - jnp.log(sigma) - 0.5 * math.log(2 * math.pi)


def _normal_entropy(sigma: Float[Array, "B action"]) -> Float[Array, "B action"]:
    return 0.5 + 0.5 * math.log(2 * math.pi) + jnp.log(sigma)


def _normal_std(sigma: Float[Array, "..."]) -> Float[Array, "..."]:
    """``sigma``, at least the smallest normal float of its dtype.

    With ``min_std=0`` a very negative raw std (below about -87 in float32) makes
    ``softplus`` underflow to 0, and a std of 0 a NaN log-likelihood and an infinite
    KL; every std above that floor passes unchanged, its gradient too.
    """
    return jnp.maximum(sigma, jnp.finfo(sigma.dtype).tiny)


class _Normal(ActionSampler):
    """A diagonal Gaussian over the raw action; metrics ``mu`` and ``sigma``, ``(B, action)``."""

    def sample(
        self, key: Key[Array, ""], parameters: DistributionParameters
    ) -> Float[Array, " action"]:
        mu, sigma = parameters["mu"], parameters["sigma"]
        return mu + sigma * jax.random.normal(key, mu.shape, mu.dtype)

    def mode(self, parameters: DistributionParameters) -> Float[Array, "B action"]:
        return parameters["mu"]


class NormalSampler(_Normal):
    """A diagonal Gaussian action, unsquashed.

    Input, by default: the mean and the pre-softplus std concatenated,
    ``(B, 2 * action)``; ``sigma = (softplus(raw_std) + min_std) * std_scale``.

    With ``action_size`` given, the std does not depend on the input: the
    sampler owns a learned parameter ``log_std`` of shape ``(action_size,)``,
    ``sigma = (exp(log_std) + min_std) * std_scale``, and the input is the mean
    alone, ``(B, action_size)``.

    Output action: the raw sample, ``(B, action)``. Entropy: exact.

    Args:
      rng: seeds the per-env keys.
      entropy_weight: the entropy bonus, ``>= 0``.
      min_std: a floor added to the std, ``>= 0``.
      std_scale: multiplies the std, ``> 0``.
      action_size: if given, the std is a state-independent learned parameter.
      initial_log_std: the initial value of every entry of ``log_std``.
    """

    def __init__(
        self,
        rng: KeySource,
        entropy_weight: float,
        min_std: float = 1e-3,
        std_scale: float = 1.0,
        *,
        action_size: int | None = None,
        initial_log_std: float = 0.0,
    ) -> None:
        super().__init__(rng, entropy_weight)
        require_number("NormalSampler", "min_std", min_std, minimum=0.0)
        require_number("NormalSampler", "std_scale", std_scale, minimum=0.0, strict=True)
        require_number("NormalSampler", "initial_log_std", initial_log_std)
        self.min_std = float(min_std)
        self.std_scale = float(std_scale)
        if action_size is not None:
            require_int("NormalSampler", "action_size", action_size)
        elif initial_log_std != 0.0:
            raise ValueError(
                f"NormalSampler: initial_log_std={initial_log_std} sets the learned log_std "
                "that action_size creates; without action_size the std is read from the "
                "input. Pass action_size=N as well, or leave initial_log_std out"
            )
        self.log_std: nnx.Param[Array] | None = (
            None
            if action_size is None
            else nnx.Param(jnp.full((action_size,), float(initial_log_std)))
        )

    def distribution_parameters(self, x: Float[Array, "B params"]) -> DistributionParameters:
        if self.log_std is None:
            mean, raw_std = _split_mean_and_std("NormalSampler", x)
            sigma = (jax.nn.softplus(raw_std) + self.min_std) * self.std_scale
            return {"mu": mean, "sigma": _normal_std(sigma)}
        action_size = self.log_std.shape[0]
        if x.shape[-1] != action_size:
            raise ValueError(
                f"NormalSampler(action_size={action_size}) learns its std and expects the mean "
                f"alone, (B, {action_size}), but its input has shape {tuple(x.shape)}"
            )
        sigma = (jnp.exp(self.log_std[...]) + self.min_std) * self.std_scale
        return {"mu": x, "sigma": jnp.broadcast_to(_normal_std(sigma), x.shape)}

    def log_likelihood(
        self, raw_action: Float[Array, "B action"], parameters: DistributionParameters
    ) -> FloatBatch:
        log_density = _normal_log_density(raw_action, parameters["mu"], parameters["sigma"])
        return jnp.sum(log_density, axis=-1)

    def entropy(self, parameters: DistributionParameters) -> FloatBatch:
        return jnp.sum(_normal_entropy(parameters["sigma"]), axis=-1)


def _log_one_minus_tanh_squared(u: Array) -> Array:
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), finite for every u.
    return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


# Gauss-Legendre rule on [-1, 1] for the bounded part of the tanh entropy term; with
# the kink at 0 split off and the interval mu +- 6 sigma, 20 nodes reach float32 rounding.
_LEGENDRE_NODES, _LEGENDRE_WEIGHTS = np.polynomial.legendre.leggauss(20)
# Node sums against these give a half's integral of f and of Z f (see _remainder_nodes).
_LEGENDRE_MOMENT_BASIS = _LEGENDRE_WEIGHTS[:, None] * _LEGENDRE_NODES[:, None] ** np.arange(2)
_INTERVAL_HALF_WIDTH_IN_STDS = 6.0
# log1p(exp(-2|u|)) < 1e-8 beyond this.
_REMAINDER_SUPPORT = 10.0


def _log1p(x: Array) -> Array:
    """``log1p(x)`` for ``x >= 0`` from ``log``, which XLA:CPU vectorises (it does not ``log1p``).

    ``log(w) * x / (w - 1)`` with ``w = 1 + x`` rounded cancels the rounding of ``w``.
    """
    w = 1.0 + x
    return jnp.where(w == 1.0, x, jnp.log(w) * x / jnp.where(w == 1.0, 1.0, w - 1.0))


class _RemainderNodes(NamedTuple):
    """The quadrature of ``E[f(U)]``, ``U ~ N(mu, sigma)``, over ``Z = (U - mu) / sigma``."""

    middle: Float[Array, "2 M"]  # each half's middle in Z (the lower half's first)
    half_width: Float[Array, "2 M"]  # each half's half width in Z
    gauss: Float[Array, "N 2 M"]  # exp(-Z^2 / 2) at each node
    e: Float[Array, "N 2 M"]  # exp(-2 |U|) at each node
    scale: Float[Array, "2 M"]  # half_width / sqrt(2 pi): a half's sum to an expectation


def _remainder_nodes(mu: Float[Array, " M"], sigma: Float[Array, " M"]) -> _RemainderNodes:
    """Gauss-Legendre nodes on ``[lo, kink]`` and ``[kink, hi]`` in ``Z``.

    ``[lo, hi]`` is ``+-6`` stds, clipped to where the remainder ``log1p(exp(-2|u|))``
    is not negligible; the kink is at ``U = 0``, where the remainder is not smooth.
    Laid out in ``Z``, the interval stays six stds wide however small ``sigma`` is
    (laid out in ``U``, it rounded to one point below about ``1e-7 |mu|``), and no
    sum is divided by ``sigma``.
    """
    support = _REMAINDER_SUPPORT
    # Both bounds capped on both sides: an overflowed bound (a tiny sigma) then makes an
    # empty interval at one end, for either sign of mu.
    lo = jnp.clip(
        (-support - mu) / sigma, -_INTERVAL_HALF_WIDTH_IN_STDS, _INTERVAL_HALF_WIDTH_IN_STDS
    )
    hi = jnp.maximum(jnp.minimum(_INTERVAL_HALF_WIDTH_IN_STDS, (support - mu) / sigma), lo)
    kink = jnp.clip(-mu / sigma, lo, hi)
    half_width = jnp.stack([kink - lo, hi - kink]) / 2
    middle = jnp.stack([lo, kink]) + half_width
    z = middle + half_width * jnp.asarray(_LEGENDRE_NODES, mu.dtype)[:, None, None]
    u = mu + sigma * z
    return _RemainderNodes(
        middle=middle,
        half_width=half_width,
        gauss=jnp.exp(-0.5 * jnp.square(z)),
        e=jnp.exp(-2.0 * jnp.abs(u)),
        scale=half_width / math.sqrt(2 * math.pi),
    )


def _flat(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` of flat ``(M,)`` arrays applied to ``(B, action)`` ones: the element-wise
    work then runs along the batch rather than along a trailing axis often 1 wide."""

    def flat(mu: Array, sigma: Array) -> Any:
        out = function(mu.reshape(-1), sigma.reshape(-1))
        return jax.tree.map(lambda leaf: leaf.reshape(mu.shape), out)

    return flat


@jax.custom_jvp
def _expected_remainder(
    mu: Float[Array, "B action"], sigma: Float[Array, "B action"]
) -> Float[Array, "B action"]:
    """``E[r(U)]``, ``r(u) = log1p(exp(-2|u|))``, for ``U ~ N(mu, sigma)``, by quadrature.

    Its derivatives are pathwise, ``dE/dmu = E[r'(U)]`` and ``dE/dsigma = E[r'(U) Z]``,
    taken at the same nodes from the same ``exp`` (:func:`_expected_remainder_jvp`):
    no transcendental function is evaluated again for the backward pass, and they
    stay float32-accurate for any ``sigma`` (the Gaussian score's ``E[r Z] / sigma``
    does not, as ``sigma`` goes to 0).
    """

    def expected(mu: Array, sigma: Array) -> Array:
        nodes = _remainder_nodes(mu, sigma)
        integrand = nodes.gauss * _log1p(nodes.e)
        sums = jnp.tensordot(jnp.asarray(_LEGENDRE_WEIGHTS, mu.dtype), integrand, axes=1)
        return jnp.sum(nodes.scale * sums, axis=0)

    return _flat(expected)(mu, sigma)


def _remainder_and_derivatives(
    mu: Float[Array, " M"], sigma: Float[Array, " M"]
) -> tuple[Float[Array, " M"], Float[Array, " M"], Float[Array, " M"]]:
    """``E[r(U)]``, ``E[r'(U)]`` and ``E[r'(U) Z]`` from one evaluation per node.

    On each half ``Z`` is affine in the node ``x`` and ``r'`` has one sign, so the three
    follow from the node sums of ``g r`` and ``g r'`` against ``w`` and ``w x``: one
    small product instead of a reduction per expectation, each of which XLA would
    evaluate the transcendental functions for again.
    """
    nodes = _remainder_nodes(mu, sigma)
    side = jnp.asarray([-1.0, 1.0], mu.dtype)[:, None]  # the sign of U on each half
    slope = -2.0 * side * nodes.e / (1.0 + nodes.e)  # r'(u)
    # Two products on the leading (node) axis, not one on a concatenation: XLA computes
    # both integrands in one loop then, each exp once (a concatenation evaluates them
    # again for each half of its output).
    weights = jnp.asarray(_LEGENDRE_WEIGHTS, mu.dtype)
    of_value = jnp.tensordot(weights, nodes.gauss * _log1p(nodes.e), axes=1)
    basis = jnp.asarray(_LEGENDRE_MOMENT_BASIS, mu.dtype)
    by_one, by_node = jnp.tensordot(basis, nodes.gauss * slope, axes=((0,), (0,)))
    value = jnp.sum(nodes.scale * of_value, axis=0)
    d_mu = jnp.sum(nodes.scale * by_one, axis=0)
    d_sigma = jnp.sum(nodes.scale * (nodes.middle * by_one + nodes.half_width * by_node), axis=0)
    return value, d_mu, d_sigma


@_expected_remainder.defjvp
def _expected_remainder_jvp(
    primals: tuple[Array, Array], tangents: tuple[Array, Array]
) -> tuple[Array, Array]:
    mu, sigma = primals
    mu_tangent, sigma_tangent = tangents
    value, d_mu, d_sigma = _flat(_remainder_and_derivatives)(mu, sigma)
    return value, d_mu * mu_tangent + d_sigma * sigma_tangent


@jax.custom_jvp
def _expected_abs(
    mu: Float[Array, "B action"], sigma: Float[Array, "B action"]
) -> Float[Array, "B action"]:
    """``E|U|`` for ``U ~ N(mu, sigma)``, the folded normal's mean.

    Its derivatives are written out, ``erf(t / sqrt 2)`` and ``sqrt(2 / pi) exp(-t^2 / 2)``
    with ``t = mu / sigma``: differentiated through, two terms in ``t^2`` cancel, and
    for a tiny ``sigma`` they are ``inf * 0``.
    """
    t = mu / sigma
    return sigma * math.sqrt(2.0 / math.pi) * jnp.exp(-0.5 * jnp.square(t)) + mu * erf(
        t / math.sqrt(2.0)
    )


@_expected_abs.defjvp
def _expected_abs_jvp(
    primals: tuple[Array, Array], tangents: tuple[Array, Array]
) -> tuple[Array, Array]:
    mu, sigma = primals
    mu_tangent, sigma_tangent = tangents
    t = mu / sigma
    d_mu = erf(t / math.sqrt(2.0))
    d_sigma = math.sqrt(2.0 / math.pi) * jnp.exp(-0.5 * jnp.square(t))
    return _expected_abs(mu, sigma), d_mu * mu_tangent + d_sigma * sigma_tangent


def _expected_log_one_minus_tanh_squared(
    mu: Float[Array, "B action"], sigma: Float[Array, "B action"]
) -> Float[Array, "B action"]:
    """``E[log(1 - tanh(U)^2)]`` for ``U ~ N(mu, sigma)``, elementwise and deterministic.

    ``log(1 - tanh(u)^2) = 2 log 2 - 2|u| - 2 log1p(exp(-2|u|))``. ``E|U|`` (a folded
    normal mean) is closed form; the bounded remainder is integrated by quadrature
    (:func:`_expected_remainder`).
    """
    return (
        2.0 * math.log(2.0) - 2.0 * _expected_abs(mu, sigma) - 2.0 * _expected_remainder(mu, sigma)
    )


class NormalTanhSampler(_Normal):
    """A diagonal Gaussian squashed by ``tanh``: actions in ``[-1, 1]`` (float32's ``tanh``
    reaches +-1 exactly for raw values beyond about 8; the log-likelihood is of the raw
    value, so it stays finite).

    Input: the mean and the pre-softplus std concatenated, ``(B, 2 * action)``;
    ``sigma = (softplus(raw_std) + min_std) * std_scale``. Emits the raw,
    unsquashed sample ``u`` as extras; the action is ``tanh(u)``.

    Log-likelihood, by change of variables:
    ``sum_i log N(u_i; mu_i, sigma_i) - log(1 - tanh(u_i)^2)``.

    Entropy of the squashed action: ``H[N(mu, sigma)] + E[log(1 - tanh(U)^2)]``
    per dimension, the expectation computed deterministically (closed form plus
    a fixed quadrature, accurate to float32 rounding), so the entropy bonus adds
    no sampling noise to the gradient.

    Args:
      rng: seeds the per-env keys.
      entropy_weight: the entropy bonus, ``>= 0``.
      min_std: a floor added to the std, ``>= 0``.
      std_scale: multiplies the std, ``> 0``.
    """

    def __init__(
        self,
        rng: KeySource,
        entropy_weight: float,
        min_std: float = 1e-3,
        std_scale: float = 1.0,
    ) -> None:
        super().__init__(rng, entropy_weight)
        require_number("NormalTanhSampler", "min_std", min_std, minimum=0.0)
        require_number("NormalTanhSampler", "std_scale", std_scale, minimum=0.0, strict=True)
        self.min_std = float(min_std)
        self.std_scale = float(std_scale)

    def distribution_parameters(self, x: Float[Array, "B params"]) -> DistributionParameters:
        mean, raw_std = _split_mean_and_std("NormalTanhSampler", x)
        sigma = (jax.nn.softplus(raw_std) + self.min_std) * self.std_scale
        return {"mu": mean, "sigma": _normal_std(sigma)}

    def squash(self, raw_action: Float[Array, "B action"]) -> Float[Array, "B action"]:
        return jnp.tanh(raw_action)

    def log_likelihood(
        self, raw_action: Float[Array, "B action"], parameters: DistributionParameters
    ) -> FloatBatch:
        log_density = _normal_log_density(raw_action, parameters["mu"], parameters["sigma"])
        return jnp.sum(log_density - _log_one_minus_tanh_squared(raw_action), axis=-1)

    def entropy(self, parameters: DistributionParameters) -> FloatBatch:
        mu, sigma = parameters["mu"], parameters["sigma"]
        per_dimension = _normal_entropy(sigma) + _expected_log_one_minus_tanh_squared(mu, sigma)
        return jnp.sum(per_dimension, axis=-1)


class CategoricalSampler(ActionSampler):
    """A categorical action over ``n`` classes: integer actions ``(B,)``.

    Input: unnormalised logits, ``(B, n)``. The action is the class index
    (``int32``), emitted as extras too. Deterministic mode takes the most likely
    class. Entropy: exact, ``-sum_k p_k log p_k``. Metric ``probs``: a tuple of
    ``n`` leaves ``(B,)``, each class's probability (finite where a masked class's
    log-probability is ``-inf``, so its mean over the batch is too), logged per
    class as ``probs/k/mean``.

    Args:
      rng: seeds the per-env keys.
      entropy_weight: the entropy bonus, ``>= 0``.
    """

    def distribution_parameters(self, x: Float[Array, "B params"]) -> DistributionParameters:
        return {"log_probs": jax.nn.log_softmax(x, axis=-1)}

    def sample(self, key: Key[Array, ""], parameters: DistributionParameters) -> Int[Array, ""]:
        return jax.random.categorical(key, parameters["log_probs"]).astype(jnp.int32)

    def reported(self, parameters: DistributionParameters) -> ReportedDistribution:
        probs = jnp.exp(parameters["log_probs"])
        # One leaf per class: pooled over classes, the mean would be 1/n whatever the policy.
        return {"probs": tuple(probs[:, k] for k in range(probs.shape[-1]))}

    def mode(self, parameters: DistributionParameters) -> Int[Array, " B"]:
        return jnp.argmax(parameters["log_probs"], axis=-1).astype(jnp.int32)

    def log_likelihood(
        self, raw_action: Int[Array, " B"], parameters: DistributionParameters
    ) -> FloatBatch:
        chosen = jnp.take_along_axis(parameters["log_probs"], raw_action[:, None], axis=-1)
        return chosen[:, 0]

    def entropy(self, parameters: DistributionParameters) -> FloatBatch:
        log_probs = parameters["log_probs"]
        # Classes with probability 0 (logit -inf) contribute 0, not 0 * -inf; masking the
        # log as well keeps the gradient finite. A NaN stays in, so it shows.
        possible = ~jnp.isneginf(log_probs)
        safe_log_probs = jnp.where(possible, log_probs, 0.0)
        terms = jnp.where(possible, jnp.exp(safe_log_probs) * safe_log_probs, 0.0)
        return -jnp.sum(terms, axis=-1)
