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
html_theme = "alabaster"
