"""Every rule a contract message cites links to a section that exists in the docs."""

import itertools
import re
from pathlib import Path

import pytest

from nnx_ppo.contract import checking, env_checks
from nnx_ppo.contract.errors import DOCS_URL, rule_text
from nnx_ppo.networks import containers, types

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(re.escape(DOCS_URL) + r"([a-z_]+)\.html#([a-z0-9-]+)")


def _anchors(page: str) -> set[str]:
    """The ids Sphinx gives the page's sections: explicit labels and slugged titles."""
    text = (ROOT / "docs" / f"{page}.rst").read_text()
    labels = set(re.findall(r"^\.\. _([a-z0-9-]+):$", text, re.MULTILINE))
    lines = text.splitlines()
    titles = {
        re.sub(r"[^a-z0-9]+", "-", line.lower()).strip("-")
        for line, under in itertools.pairwise(lines)
        if line and under and set(under) <= set("=-~^") and len(under) >= len(line)
    }
    return labels | titles


def test_rule_text_links_into_the_docs() -> None:
    assert rule_text("a rule", "rules") == f"a rule (see {DOCS_URL}contract.html#rules)"


@pytest.mark.parametrize("page", ["contract", "environments", "custom_containers"])
def test_every_cited_section_exists(page: str) -> None:
    cited = {
        match.groups()
        for module in (checking, env_checks, types, containers)
        for value in vars(module).values()
        if isinstance(value, str)
        for match in LINK.finditer(value)
    }
    on_page = {anchor for cited_page, anchor in cited if cited_page == page}
    assert on_page, f"no rule links to {page}.html"
    missing = on_page - _anchors(page)
    assert not missing, f"{page}.rst has no section for {sorted(missing)}"


def test_the_kits_failures_link_to_the_section_listing_their_properties() -> None:
    from nnx_ppo.testing._harness import PROPERTY_SECTIONS, property_failure

    anchors = _anchors("testing_kit")
    assert set(PROPERTY_SECTIONS.values()) <= anchors
    error = property_failure("check_env", "determinism", "Env", {"n_envs": 2}, "x.", rule="r")
    assert f"rule:     r (see {DOCS_URL}testing_kit.html#environments)" in str(error)
