"""``JaxDataclass``: the pytree methods of a frozen dataclass, rebuilt without ``__init__``.

``flax.struct.dataclass`` rebuilds a pytree node by calling ``__init__``. When
``__init__`` is type-checked (beartype or jaxtyping's import hook), JAX's own
rebuilds inside ``jit``, ``vmap`` and ``scan``, which pass placeholder objects or
tracers for the fields, fail those checks. A :class:`JaxDataclass` rebuilds with
``object.__new__`` and sets the fields directly, so ``__init__`` (and
``__post_init__``) run only when user code constructs an instance.

The class is kept at nnx-ppo 0.3.0's name and import path. The library's own
pytree dataclasses use ``jax.tree_util.register_dataclass``, which does not call
``__init__`` either, and take only :class:`Replaceable`'s ``replace``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

__all__ = ["JaxDataclass", "Replaceable"]


class Replaceable:
    """A mixin giving a frozen dataclass a ``replace(**changes)`` method."""

    def replace(self, **changes: Any) -> Self:
        """A copy with the given fields replaced (``__init__`` runs, with its checks)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


class JaxDataclass(Replaceable):
    """A mixin giving a frozen dataclass ``replace`` and the pytree methods.

    Every dataclass field is a pytree child, in the order the fields are declared;
    register the class with ``jax.tree_util.register_pytree_node_class``.

    Example::

        @jax.tree_util.register_pytree_node_class
        @dataclasses.dataclass(frozen=True)
        class Pair(JaxDataclass):
            x: Float[Array, " B"]
            y: Float[Array, " B"]
    """

    def tree_flatten(self) -> tuple[list[Any], tuple[str, ...]]:
        """The field values as children, and the field names as auxiliary data."""
        names = tuple(field.name for field in dataclasses.fields(self))  # type: ignore[arg-type]
        return [getattr(self, name) for name in names], names

    @classmethod
    def tree_unflatten(cls, names: tuple[str, ...], children: Any) -> Self:
        """An instance with field ``names`` set to ``children``, built without ``__init__``."""
        node = object.__new__(cls)
        for name, child in zip(names, children, strict=True):
            object.__setattr__(node, name, child)
        return node
