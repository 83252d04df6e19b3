"""One import path per concept: each module's ``__all__`` is exactly what it makes public."""

import importlib
import inspect
import pkgutil

import pytest

import nnx_ppo
import nnx_ppo.networks

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(nnx_ppo.__path__, "nnx_ppo.")
    if "._" not in info.name and not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_every_public_definition_and_nothing_else(name: str) -> None:
    module = importlib.import_module(name)
    defined = {
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == name
    }
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert not defined, f"{name} defines {sorted(defined)} but has no __all__"
        return
    assert defined <= set(exported), f"{name}.__all__ lacks {sorted(defined - set(exported))}"
    assert all(hasattr(module, attribute) for attribute in exported)


def test_the_networks_package_reexports_the_deep_paths_objects() -> None:
    for attribute in nnx_ppo.networks.__all__:
        value = getattr(nnx_ppo.networks, attribute)
        home = importlib.import_module(getattr(value, "__module__", "nnx_ppo.networks"))
        assert getattr(home, attribute, value) is value


def test_the_paths_and_parameter_names_of_0_3_0_still_work() -> None:
    """Where this version and 0.3.0 differ only by a name or a path, 0.3.0's is kept."""
    from nnx_ppo.algorithms import checkpointing, config, distillation, ppo, rollout, types
    from nnx_ppo.networks import recording
    from nnx_ppo.networks import types as network_types

    for name in (
        "DistillationConfig",
        "DistillationState",
        "DistillationTrainConfig",
        "DistillationTrainResult",
    ):
        assert getattr(config, name) is getattr(distillation, name)
    assert types.DistillationState is distillation.DistillationState
    # What 0.3.0's ppo module imported, and so its users' scripts imported from it.
    for name in (
        "PPOConfig",
        "TrainConfig",
        "EvalConfig",
        "VideoConfig",
        "VideoData",
        "TrainResult",
    ):
        assert getattr(ppo, name) is getattr(config, name)
    for name in ("TrainingState", "LoggingLevel", "RLEnv", "EnvState"):
        assert getattr(ppo, name) is getattr(types, name)
    assert ppo.rollout is rollout
    assert (ppo.StatefulModule, ppo.ModuleState) == (
        network_types.StatefulModule,
        network_types.ModuleState,
    )
    assert (
        ppo.compute_metrics.__module__
        == ppo.log_weight_stats.__module__
        == "nnx_ppo.algorithms.metrics"
    )
    assert network_types.ACTIVATION_KEY is recording.ACTIVATION_KEY
    save = checkpointing.make_checkpoint_fn("never-written")  # nothing is written before a save
    assert isinstance(save, checkpointing.CheckpointCallback)

    def parameters(function: object) -> list[str]:
        return [p for p in inspect.signature(function).parameters if p != "self"]  # type: ignore[arg-type]

    assert parameters(ppo.gae)[:5] == [
        "rewards", "values_excl_last", "next_values", "done", "truncation"
    ]  # fmt: skip
    assert parameters(rollout.unroll_env)[-1] == "rng_key_for_env_reset"
    assert parameters(rollout.tree_where)[:3] == ["cond", "on_true", "on_false"]
    assert parameters(recording.with_recording) == ["net"]
    assert parameters(recording.Recorder.__init__) == ["wrapped"]


@pytest.mark.parametrize("name", MODULES)
def test_no_package_attribute_hides_a_submodule(name: str) -> None:
    """``import nnx_ppo.a.b as m`` binds the package's attribute ``b``: it must be the module."""
    module = importlib.import_module(name)
    parent, _, leaf = name.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is module, (
        f"{parent}.{leaf} is not the module {name}; a name {parent} exports hides it"
    )


@pytest.mark.parametrize(
    ("module", "name", "replacement"),
    [
        ("nnx_ppo.algorithms.rollout", "single_transition", "unroll_env runs every step"),
        ("nnx_ppo.algorithms.distillation", "distillation_unroll_env", "distillation_step runs"),
        ("nnx_ppo.algorithms.types", "DistillationTransition", "is a Transition whose"),
    ],
)
def test_a_name_0_3_0_had_and_this_version_removed_says_what_replaces_it(
    module: str, name: str, replacement: str
) -> None:
    hint = f"{name} of nnx-ppo 0.3.0 is gone: .*{replacement}"
    with pytest.raises(ImportError, match=hint):
        exec(f"from {module} import {name}")
    # Looked up any other way, an AttributeError: hasattr and getattr's default still work.
    with pytest.raises(AttributeError, match=hint):
        getattr(importlib.import_module(module), name)
    assert not hasattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="has no attribute 'single_transitions'"):
        _ = importlib.import_module(module).single_transitions
