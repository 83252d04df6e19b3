"""Names of nnx-ppo 0.3.0 that this version removed, each with what does its work now."""

import dis
import sys

_REMOVED: dict[str, dict[str, str]] = {
    "nnx_ppo.algorithms.rollout": {
        "single_transition": (
            "unroll_env runs every step of a rollout itself, and draws the fresh env "
            "states once per rollout, so a step takes no reset keys"
        ),
    },
    "nnx_ppo.algorithms.distillation": {
        "distillation_single_transition": (
            "distillation_step runs teacher and student together through unroll_env"
        ),
        "distillation_unroll_env": (
            "distillation_step runs teacher and student together through unroll_env"
        ),
        "DistillationTransition": (
            "a distillation rollout is a Transition whose rollout_extras are "
            '{"student": ..., "teacher": ...}'
        ),
    },
    "nnx_ppo.algorithms.types": {
        "DistillationTransition": (
            "a distillation rollout is a Transition whose rollout_extras are "
            '{"student": ..., "teacher": ...}'
        ),
    },
}


def missing_attribute(module: str, name: str) -> AttributeError | ImportError:
    """The error a module's ``__getattr__`` raises for ``name``, which it does not have.

    For a name of nnx-ppo 0.3.0 this version removed, the message says what does its
    work: an ``ImportError`` where ``from module import name`` asked (Python would
    replace an ``AttributeError``'s message with its own there), an ``AttributeError``
    anywhere else, so that ``hasattr`` and ``getattr(module, name, None)`` still answer.
    """
    replacement = _REMOVED.get(module, {}).get(name)
    if replacement is None:
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    message = (
        f"{module}.{name} of nnx-ppo 0.3.0 is gone: {replacement} (the docs' page "
        "'Migrating from nnx-ppo 0.3.0' lists every change)"
    )
    if _asked_by_an_import_statement():
        return ImportError(message, name=module)
    return AttributeError(message)


def _asked_by_an_import_statement() -> bool:
    """Whether the code that looked up the attribute runs a ``from ... import`` (this
    function's caller's caller is the module ``__getattr__``, called by that code)."""
    frame = sys._getframe(3)
    return frame.f_code.co_code[frame.f_lasti] == dis.opmap["IMPORT_FROM"]
