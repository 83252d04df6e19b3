"""Sphinx configuration for the nnx-ppo documentation."""

import re
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx

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
    # jaxtyping.TypeCheckError and the like: no inventory offline.
    (r"py:.*", r"jaxtyping\..*"),
]
nitpick_ignore = [
    # The standard library, in the "alias of" lines of KeySource and LeafFactory: no
    # Python inventory offline.
    ("py:class", "collections.abc.Callable"),
]
html_theme = "alabaster"


_AXES_MODULE = "nnx_ppo.contract.axes."


def _readable_alias(value: object) -> str:
    """``Shaped[Array, 'B ...'] | Shaped[ndarray, 'B ...']``: an alias of the vocabulary."""
    text = repr(value)
    text = re.sub(r"^<class '(.*)'>$", r"\1", text)
    text = text.replace("jaxlib._jax.Array", "Array").replace("jaxtyping.", "")
    union = re.fullmatch(r"typing\.Union\[(.*)\]", text)
    if union is None:
        return text
    # Split the members at the commas outside brackets.
    members, depth, start = [], 0, 0
    for index, char in enumerate(union.group(1)):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            members.append(union.group(1)[start:index].strip())
            start = index + 1
    members.append(union.group(1)[start:].strip())
    return " | ".join(members)


def _state_the_annotation(
    app: Sphinx, what: str, name: str, obj: object, options: Any, lines: list[str]
) -> None:
    del app, options
    if what in ("data", "class") and name.startswith(_AXES_MODULE):
        lines.extend(["", f"The annotation: ``{_readable_alias(obj)}``."])


def _drop_sphinx_alias_lines(app: Sphinx, doctree: nodes.document) -> None:
    # Sphinx's own "alias of" line cannot render jaxtyping's quoted shape strings (it
    # shows "alias of '] | ']"); _state_the_annotation writes the annotation instead.
    del app
    for description in list(doctree.findall(addnodes.desc)):
        ids = [
            id_
            for signature in description.findall(addnodes.desc_signature)
            for id_ in signature["ids"]
        ]
        if any(id_.startswith(_AXES_MODULE) for id_ in ids):
            for paragraph in list(description.findall(nodes.paragraph)):
                if paragraph.astext().startswith("alias of"):
                    paragraph.parent.remove(paragraph)


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-docstring", _state_the_annotation)
    app.connect("doctree-read", _drop_sphinx_alias_lines)
