"""The install instructions say what the distributions declare (issue 33, items 1-5).

Read from the pages and the ``pyproject.toml`` files, without installing anything:
tests/test_install.py runs the same commands in fresh virtual environments.
"""

from __future__ import annotations

import re

import pytest
from doc_blocks import ROOT, blocks, guide_files
from install_commands import (
    UV_INSTALL,
    distribution_roots,
    extra_requirements,
    install_blocks,
    pyproject,
    rel,
)
from packaging.requirements import Requirement

ADAPTER_PAGES = {
    "normandy-langchain": "docs/plugins/langchain.md",
    "normandy-pydantic-ai": "docs/plugins/pydantic-ai.md",
    "normandy-openai-agents": "docs/plugins/openai-agents.md",
    "normandy-strands": "docs/plugins/strands.md",
    "normandy-llamaindex": "docs/plugins/llamaindex.md",
    "normandy-adk": "docs/plugins/adk.md",
}
#: Pages whose install line is set by work under way elsewhere, with the reason.
NOT_YET: dict[str, str] = {}


def _names(text: str) -> list[str]:
    """The distribution names written as code in ``text`` (```normandy-x```), in order."""
    return re.findall(r"`(normandy-[a-z-]+)`", text)


def _all_extra() -> list[str]:
    return sorted(r.name for r in extra_requirements(ROOT, "all"))


def test_the_home_page_lists_the_all_extra_as_declared() -> None:
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    m = re.search(r"The `all` extra is (.*?)(?:, released|\.)", text, flags=re.S)
    assert m, "docs/index.md no longer says what the `all` extra is"
    assert sorted(_names(m.group(1))) == _all_extra()


def test_the_install_page_lists_the_all_extra_as_declared() -> None:
    text = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    [row] = [line for line in text.splitlines() if line.startswith('| `"normandy-core[all]"`')]
    assert sorted(set(_names(row))) == _all_extra()


def _dependencies(name: str) -> set[str]:
    roots = distribution_roots()
    return {Requirement(r).name for r in pyproject(roots[name])["project"]["dependencies"]}


def _compactors(name: str) -> set[str]:
    """The compactors the workspace distribution ``name`` registers (none for others)."""
    root = distribution_roots().get(name)
    if root is None:
        return set()
    entry_points = pyproject(root)["project"].get("entry-points", {})
    return set(entry_points.get("normandy_core.compactors", {}))


@pytest.mark.parametrize("adapter", sorted(ADAPTER_PAGES))
def test_each_adapter_brings_what_its_page_uses(adapter: str) -> None:
    """The compactors its page's first example names come with the adapter, and the
    archive too, since the page promises that nothing dropped is lost."""
    page = ROOT / ADAPTER_PAGES[adapter]
    first = next(b for b in blocks(page) if b.lang == "python")
    every = set().union(*(_compactors(d) for d in distribution_roots()))
    named = set(re.findall(r'"([a-z_]+)"', first.code)) & every
    assert named, f"{rel(page)}: no compactor named in the first example"
    brought = set().union(*(_compactors(d) for d in _dependencies(adapter) | {"normandy-core"}))
    assert named <= brought, f"{adapter} does not bring {sorted(named - brought)}"
    assert "normandy-archive" in _dependencies(adapter)
    [block] = install_blocks([page])
    assert block.installs == [f"{UV_INSTALL}--find-links dist {adapter}"]


def test_the_otel_page_installs_the_sdk_its_example_imports() -> None:
    page = ROOT / "docs" / "plugins" / "otel.md"
    first = next(b for b in blocks(page) if b.lang == "python")
    assert "from opentelemetry.sdk" in first.code
    [block] = install_blocks([page])
    assert block.installs == [f'{UV_INSTALL}--find-links dist "normandy-otel[sdk]"']
    sdk = extra_requirements(distribution_roots()["normandy-otel"], "sdk")
    assert [r.name for r in sdk] == ["opentelemetry-sdk"]


def test_the_plugin_guide_installs_the_testing_extra_before_its_test_step() -> None:
    """``pytest normandy-keep-recent/tests`` needs pytest and hypothesis: the install
    line before it brings the example's ``test`` extra, which is the core's ``testing``."""
    [block] = [
        b for b in install_blocks([ROOT / "docs" / "plugin-guide.md"])
        if "pytest normandy-keep-recent/tests" in b.lines
    ]  # fmt: skip
    assert block.installs == [f'{UV_INSTALL}-e "./normandy-keep-recent[test]"']
    assert block.lines.index(block.installs[0]) < block.lines.index(
        "pytest normandy-keep-recent/tests"
    )
    text = guide_files()["normandy-keep-recent"]["pyproject.toml"]
    test_extra = re.search(r"^test = \[(.*)\]$", text, flags=re.M)
    assert test_extra, "the example's pyproject.toml has no test extra"
    [req] = [Requirement(r.strip().strip('"')) for r in test_extra.group(1).split(",")]
    assert req.name == "normandy-core" and req.extras == {"testing"}
    testing = {r.name for r in extra_requirements(ROOT, "testing")}
    assert testing >= {"pytest", "hypothesis"}


def test_every_install_command_of_the_docs_is_one_the_install_tests_run() -> None:
    """Each is ``uv pip install ...`` on a line of its own, which tests/test_install.py
    runs as written (a plain ``pip install`` would need a venv seeded with pip)."""
    found = install_blocks()
    assert {b.page for b in found} >= {"README.md", "docs/install.md", *ADAPTER_PAGES.values()}
    for block in found:
        if block.page in NOT_YET:
            continue
        for line in block.installs:
            assert line.startswith(UV_INSTALL), f"{block.block.where}: {line}"
