"""Names of nnx-ppo 0.3.0 that this version removed, each with what does its work now."""

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

    For a name of nnx-ppo 0.3.0 this version removed, an ``ImportError`` saying what
    does its work (``from module import name`` passes an ``ImportError`` on as it is,
    where it would replace an ``AttributeError`` with its own message); for any other
    name, Python's usual ``AttributeError``.
    """
    replacement = _REMOVED.get(module, {}).get(name)
    if replacement is None:
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    return ImportError(
        f"{module}.{name} of nnx-ppo 0.3.0 is gone: {replacement} (the docs' page "
        "'Migrating from nnx-ppo 0.3.0' lists every change)",
        name=module,
    )
