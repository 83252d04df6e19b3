"""A k-step delay line: the output at step ``t`` is the input from step ``t - k``."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PyTree, Shaped

from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.axes import BatchedTree
from nnx_ppo.networks.normalizer import canonical_tree, check_feature_shapes
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Delay"]

DelayCarry = dict[str, Any]
"""``{"buffer": tree of (B, k_steps, *feat), "idx": (B,) int32}``, the names of 0.3.0."""


class Delay(StatefulModule):
    """Returns the input it was given ``k_steps`` calls ago.

    Until an env has been stepped ``k_steps`` times since its last reset, the
    output is ``initial_value``. Inputs may be any pytree of ``(B, *feat)``
    arrays matching ``sample_input``; the output has the same tree, shapes and
    the dtypes of ``sample_input``. A float leaf takes integers and floats, cast to
    its dtype (``float32`` to ``bfloat16`` rounds); an integer or bool leaf takes
    only what it holds exactly (``int8`` into ``int32``): floats, which would be
    truncated, and wider integers, which would wrap, are an error.

    Carry: a per-env ring buffer,
    ``{"buffer": tree of (B, k_steps, *feat), "idx": (B,) int32}``, where
    ``idx`` is the slot read (the oldest input) and then overwritten this step.
    ``reset_state`` refills the buffer with ``initial_value`` and rewinds
    ``idx``. Emits no ``rollout_extras``.

    Args:
      sample_input: one unbatched example of the input pytree; only its tree,
        shapes and dtypes are kept.
      k_steps: the delay, at least 1.
      initial_value: the output before the delay line has filled.

    Example::

        Sequential([Delay(env.reset(key).obs, k_steps=3), policy])
    """

    def __init__(self, sample_input: Any, k_steps: int, initial_value: float = 0.0) -> None:
        require_int("Delay", "k_steps", k_steps)
        sample = canonical_tree(sample_input)
        leaves = jax.tree.leaves(sample)
        if not leaves:
            raise ValueError("Delay sample_input has no array leaves")
        for leaf in leaves:
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                raise TypeError(
                    f"Delay sample_input leaves must be arrays, got {type(leaf).__name__}"
                )
        for path, leaf in jax.tree_util.tree_flatten_with_path(sample)[0]:
            held = np.asarray(initial_value).astype(leaf.dtype)
            if not jnp.issubdtype(leaf.dtype, jnp.inexact) and held != initial_value:
                raise ValueError(
                    f"Delay: initial_value {initial_value!r} cannot be held by the "
                    f"{leaf.dtype} leaf sample_input{jax.tree_util.keystr(path)} (it would "
                    f"become {held.item()!r}); give a value that leaf's dtype holds"
                )
        self.k_steps = k_steps
        self.initial_value = initial_value
        # Only the tree, shapes and dtypes are kept, as hashable static attributes so that
        # the module's graphdef stays hashable (a jit cache key).
        self.sample_treedef = jax.tree.structure(sample)
        self.sample_leaves = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in leaves)

    @property
    def sample(self) -> PyTree[jax.ShapeDtypeStruct]:
        """The tree of per-sample shapes and dtypes the delay line was built for."""
        return jax.tree.unflatten(self.sample_treedef, self.sample_leaves)

    def __call__(
        self,
        state: DelayCarry,
        x: BatchedTree,
        rollout_extras: None = None,
    ) -> StatefulModuleOutput:
        x = canonical_tree(x)
        check_feature_shapes("Delay.__call__", "x", self.sample, x, ("B",))
        self._check_kinds(x)

        def step_one_env(
            buffer: PyTree[Shaped[Array, "k ..."]],
            idx: Int[Array, ""],
            value: PyTree[Shaped[Array, "..."]],
        ) -> tuple[PyTree[Shaped[Array, "k ..."]], PyTree[Shaped[Array, "..."]]]:
            oldest = jax.tree.map(lambda b: b[idx], buffer)
            written = jax.tree.map(lambda b, v: b.at[idx].set(v.astype(b.dtype)), buffer, value)
            return written, oldest

        buffer, output = jax.vmap(step_one_env)(state["buffer"], state["idx"], x)
        idx = (state["idx"] + 1) % self.k_steps
        return StatefulModuleOutput({"buffer": buffer, "idx": idx}, output, jnp.zeros(()), {}, None)

    def _check_kinds(self, x: BatchedTree) -> None:
        received, _ = jax.tree_util.tree_flatten_with_path(x)
        for declared, (path, leaf) in zip(self.sample_leaves, received, strict=True):
            exact = not jnp.issubdtype(declared.dtype, jnp.inexact)
            if not jnp.can_cast(leaf.dtype, declared.dtype, "safe" if exact else "same_kind"):
                raise ValueError(
                    f"Delay.__call__: x{jax.tree_util.keystr(path)} is {leaf.dtype}, but the "
                    f"delay line holds {declared.dtype} (the dtype of sample_input): storing "
                    f"it would change its values. Build the Delay from a sample_input of "
                    f"dtype {leaf.dtype}, or cast the input first"
                )

    def initialize_state(self, batch_size: int) -> DelayCarry:
        buffer = jax.tree.map(
            lambda s: jnp.full((batch_size, self.k_steps, *s.shape), self.initial_value, s.dtype),
            self.sample,
        )
        return {"buffer": buffer, "idx": jnp.zeros((batch_size,), jnp.int32)}

    def reset_state(self, prev_state: DelayCarry) -> DelayCarry:
        return {
            "buffer": jax.tree.map(
                lambda b: jnp.full_like(b, self.initial_value), prev_state["buffer"]
            ),
            "idx": jnp.zeros_like(prev_state["idx"]),
        }
