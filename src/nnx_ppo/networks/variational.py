"""Variational bottlenecks: a reparameterised Gaussian latent with a KL penalty.

Both modules take the mean and the pre-softplus std of the latent concatenated,
``(B, 2 * latent_size)``, draw ``z = mu + sigma * eps`` with ``eps`` from the
per-env keys in their carry, and add ``kl_weight * KL(N(mu, sigma) || N(0, 1))``
(plus, for the AR(1) variant, a smoothness penalty) as ``regularization_loss``.
Because the noise comes from the carry, a loss replay from the same initial
carry reproduces it exactly, with gradients flowing through ``mu`` and ``sigma``;
the modules emit no extras.
"""

from typing import TypedDict

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Key

from nnx_ppo.contract.arguments import require_int, require_number
from nnx_ppo.contract.axes import AnyArray, PerEnvKeys
from nnx_ppo.networks.sampling_layers import _normal_std
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import (
    KeySource,
    new_env_keys,
    require_key_source,
    split_env_keys,
)

__all__ = ["AR1State", "AR1VariationalBottleneck", "VariationalBottleneck"]


class _GaussianLatent(StatefulModule):
    """What both bottlenecks share: the latent's parameters, its sample and its KL."""

    def __init__(self, latent_size: int, rng: KeySource, kl_weight: float, min_std: float) -> None:
        name = type(self).__name__
        require_int(name, "latent_size", latent_size)
        require_key_source(name, "rng", rng)
        require_number(name, "kl_weight", kl_weight, minimum=0.0)
        require_number(name, "min_std", min_std, minimum=0.0)
        self.latent_size = latent_size
        self.rng = rng
        self.kl_weight = float(kl_weight)
        self.min_std = float(min_std)

    def _sample_latent(
        self, keys: PerEnvKeys, x: Float[Array, "B params"]
    ) -> tuple[PerEnvKeys, Float[Array, "B latent"], dict[str, Array]]:
        """``(next_keys, z, metrics)``; metrics hold ``mu``, ``sigma`` and ``kl_divergence``."""
        if x.shape[-1] != 2 * self.latent_size:
            raise ValueError(
                f"{type(self).__name__}(latent_size={self.latent_size}) expects the mean and the "
                f"pre-softplus std concatenated, (B, {2 * self.latent_size}), but its input has "
                f"shape {tuple(x.shape)}"
            )
        mu, raw_std = jnp.split(x, 2, axis=-1)
        sigma = _normal_std(jax.nn.softplus(raw_std) + self.min_std)
        next_keys, step_keys = split_env_keys(keys)
        eps = jax.vmap(lambda key: jax.random.normal(key, (self.latent_size,), x.dtype))(step_keys)
        z = mu + sigma * eps
        kl_divergence = 0.5 * jnp.sum(
            jnp.square(mu) + jnp.square(sigma) - 2.0 * jnp.log(sigma) - 1.0, axis=-1
        )
        return next_keys, z, {"mu": mu, "sigma": sigma, "kl_divergence": kl_divergence}


class VariationalBottleneck(_GaussianLatent):
    """A Gaussian latent ``z ~ N(mu, sigma)`` with a KL penalty towards ``N(0, 1)``.

    Input: ``(B, 2 * latent_size)``, the mean and the pre-softplus std;
    ``sigma = softplus(raw_std) + min_std``. Output: ``z``, ``(B, latent_size)``.
    Regularization: ``kl_weight * KL``, ``(B,)``. Metrics: ``mu``, ``sigma``,
    ``kl_divergence``.

    Carry: the per-env keys, ``(B,)``; ``reset_state`` keeps the key stream.
    Emits no extras: replay reproduces the noise from the carry.

    Args:
      latent_size: the size of ``z``.
      rng: seeds the per-env keys in ``initialize_state``: an ``nnx.Rngs``, one of
        its streams, or a function returning a key (see
        :data:`~nnx_ppo.networks.utils.KeySource`).
      kl_weight: the weight of the KL penalty, ``>= 0``.
      min_std: a floor added to ``sigma``, ``>= 0``.
    """

    def __init__(
        self, latent_size: int, rng: KeySource, kl_weight: float = 1.0, min_std: float = 1e-6
    ) -> None:
        super().__init__(latent_size, rng, kl_weight, min_std)

    def __call__(
        self,
        state: PerEnvKeys,
        x: Float[AnyArray, "B params"],
        rollout_extras: None = None,
    ) -> StatefulModuleOutput:
        next_keys, z, metrics = self._sample_latent(state, jnp.asarray(x))
        return StatefulModuleOutput(
            next_state=next_keys,
            output=z,
            regularization_loss=self.kl_weight * metrics["kl_divergence"],
            metrics=metrics,
            rollout_extras=None,
        )

    def initialize_state(self, batch_size: int) -> PerEnvKeys:
        return new_env_keys(self.rng, batch_size)


class AR1State(TypedDict):
    """The carry of :class:`AR1VariationalBottleneck`.

    Leaves lead with ``B`` in a batched carry and lack it in one env's slice (which
    ``reset_state`` is also given, under ``vmap``); the annotations say ``*B``.

    Attributes:
      keys: per-env keys, ``(B,)``.
      last_z: the previous step's latent, ``(B, latent_size)``, in this leaf's own dtype
        whatever the input's; zeros after a reset.
      has_last_z: whether ``last_z`` holds a latent of this episode, ``(B,)``.
    """

    keys: Key[Array, "*B"]
    last_z: Float[AnyArray, "*B latent"]
    has_last_z: Bool[AnyArray, "*B"]


class AR1VariationalBottleneck(_GaussianLatent):
    """A :class:`VariationalBottleneck` that also penalises jumps between consecutive latents.

    Regularization per sample: ``kl_weight * KL + ar1_weight * l2_diff`` with
    ``l2_diff = mean_i (z_i - last_z_i)^2``, which is 0 on an episode's first step
    (no previous latent). Metrics: ``mu``, ``sigma``, ``kl_divergence``, ``l2_diff``.

    Carry: :class:`AR1State`. ``reset_state`` keeps the key stream and forgets
    the previous latent. Emits no extras.

    Args:
      latent_size: the size of ``z``.
      rng: seeds the per-env keys in ``initialize_state``: an ``nnx.Rngs``, one of
        its streams, or a function returning a key (see
        :data:`~nnx_ppo.networks.utils.KeySource`).
      kl_weight: the weight of the KL penalty, ``>= 0``.
      min_std: a floor added to ``sigma``, ``>= 0``.
      ar1_weight: the weight of the smoothness penalty, ``>= 0``.
      backprop_through_time: whether the smoothness penalty's gradient also moves
        the previous latent towards the current one (through the carry); if
        ``False`` only the current latent is pulled.
    """

    def __init__(
        self,
        latent_size: int,
        rng: KeySource,
        kl_weight: float = 1.0,
        min_std: float = 1e-6,
        ar1_weight: float = 1.0,
        backprop_through_time: bool = True,
    ) -> None:
        super().__init__(latent_size, rng, kl_weight, min_std)
        require_number("AR1VariationalBottleneck", "ar1_weight", ar1_weight, minimum=0.0)
        self.ar1_weight = float(ar1_weight)
        self.backprop_through_time = bool(backprop_through_time)

    def __call__(
        self,
        state: AR1State,
        x: Float[AnyArray, "B params"],
        rollout_extras: None = None,
    ) -> StatefulModuleOutput:
        next_keys, z, metrics = self._sample_latent(state["keys"], jnp.asarray(x))
        last_z = state["last_z"]
        if not self.backprop_through_time:
            last_z = jax.lax.stop_gradient(last_z)
        squared_jump = jnp.mean(jnp.square(z - last_z), axis=-1)
        l2_diff = jnp.where(state["has_last_z"], squared_jump, 0.0)
        # The carry keeps its own dtype whatever the input's (a bfloat16 z would change it).
        next_state = AR1State(
            keys=next_keys,
            last_z=z.astype(state["last_z"].dtype),
            has_last_z=jnp.ones_like(state["has_last_z"]),
        )
        return StatefulModuleOutput(
            next_state=next_state,
            output=z,
            regularization_loss=self.kl_weight * metrics["kl_divergence"]
            + self.ar1_weight * l2_diff,
            metrics={**metrics, "l2_diff": l2_diff},
            rollout_extras=None,
        )

    def initialize_state(self, batch_size: int) -> AR1State:
        return AR1State(
            keys=new_env_keys(self.rng, batch_size),
            last_z=jnp.zeros((batch_size, self.latent_size)),
            has_last_z=jnp.zeros((batch_size,), bool),
        )

    def reset_state(self, prev_state: AR1State) -> AR1State:
        return AR1State(
            keys=prev_state["keys"],
            last_z=jnp.zeros_like(prev_state["last_z"]),
            has_last_z=jnp.zeros_like(prev_state["has_last_z"]),
        )
