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
