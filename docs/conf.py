"""Sphinx configuration for the nnx-ppo documentation."""

project = "nnx-ppo"
author = "the nnx-ppo authors"
copyright = "2026, the nnx-ppo authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
autodoc_typehints = "none"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
# jaxtyping shape strings ("*T B") are not reStructuredText; docstrings state shapes instead.
napoleon_attr_annotations = False
exclude_patterns = ["_build"]

# Every cross-reference must resolve: the -W build fails on a dangling one.
nitpicky = True
nitpick_ignore_regex = [
    # External projects: intersphinx cannot download their inventories offline, so
    # references to them (flax.nnx.Linear, jax.sharding.Mesh, rich.table.Table, ...)
    # stay unlinked.
    (r"py:.*", r"flax\..*"),
    (r"py:.*", r"jax\..*"),
    (r"py:.*", r"rich\..*"),
    # jaxtyping's shape-annotated types (jaxtyping.Float[ndarray, 'T B'], ...) in the
    # "alias of" lines of nnx_ppo.contract.axes, and jaxtyping.TypeCheckError: no
    # inventory offline, and the subscripted types are not objects any inventory lists.
    (r"py:.*", r"jaxtyping\..*"),
]
nitpick_ignore = [
    # The standard library, in the "alias of" lines of KeySource and LeafFactory: no
    # Python inventory offline.
    ("py:class", "collections.abc.Callable"),
]
html_theme = "alabaster"
