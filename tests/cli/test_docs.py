"""The documentation stays true: the generated hook reference and the plugin-author guide."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from doc_blocks import guide_files, write_guide_dists
from project_paths import project_pythonpath

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "gen_hooks_doc.py"
    spec = importlib.util.spec_from_file_location("gen_hooks_doc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_hookspec_is_in_the_hook_reference() -> None:
    from normandy_core.contract import hookspecs

    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    names = _generator().hookspec_names()
    assert set(names) == {
        "maybe_compact",
        "options_model",
        "needs_window",
        "validate_opts",
        "requires_client",
        "compaction_threshold",
        "before_commit",
        "after_compact",
        "on_boundary",
        "recall_entries",
        "recall_similar",
    }
    for specs in (hookspecs.CompactorSpec, hookspecs.HookSpec):
        for name in dir(specs):
            if hasattr(getattr(specs, name), "normandy_spec"):
                assert f"## `{name}`" in text, f"hookspec {name} is missing from docs/hooks.md"


def test_hook_reference_is_not_stale() -> None:
    current = (DOCS / "hooks.md").read_text(encoding="utf-8")
    assert current == _generator().render(), (
        "docs/hooks.md is stale: run `uv run python scripts/gen_hooks_doc.py`"
    )


def test_the_plugin_guide_holds_two_complete_distributions() -> None:
    dists = guide_files()
    assert {d: sorted(files) for d, files in dists.items()} == {
        "normandy-keep-recent": [
            "pyproject.toml",
            "src/normandy_keep_recent/__init__.py",
            "tests/test_keep_recent.py",
        ],
        "normandy-boundary-log": [
            "pyproject.toml",
            "src/normandy_boundary_log/__init__.py",
            "tests/test_boundary_log.py",
        ],
    }


def _guide_env(tmp_path: Path) -> dict[str, str]:
    """A clean environment for the examples' processes: nothing in the home directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NORMANDY_")}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        {
            "PYTHONPATH": project_pythonpath(),
            "NORMANDY_ARCHIVE_PATH": str(tmp_path / "archive.sqlite3"),
            "NORMANDY_CACHE_DIR": str(tmp_path / "cache"),
            "XDG_DATA_HOME": str(tmp_path / "data"),
            "HOME": str(tmp_path),
        }
    )
    return env


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dist", "passed"),
    # keep_recent: its own 5 tests and the 5 of the conformance kit
    [("normandy-keep-recent", 10), ("normandy-boundary-log", 5)],
)
def test_plugin_guide_distribution_installs_and_passes_its_tests(
    guide_dists, tmp_path: Path, dist: str, passed: int
) -> None:
    """Each example, built as a wheel and installed in a fresh venv, passes its own tests
    there (run by that venv's python, so they see only what was installed)."""
    source = guide_dists.sources / dist
    proc = subprocess.run(
        [str(guide_dists.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=source,
        env=_guide_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{passed} passed" in proc.stdout


@pytest.mark.slow
def test_the_guide_hook_plugin_sees_every_boundary_of_the_cli(guide_dists, tmp_path: Path):
    """The installed ``boundary_log``, outside its own tests: ``normandy plugins`` lists it,
    and ``normandy compact`` reaches it at a compacting boundary and prints its note."""
    env = _guide_env(tmp_path)
    proc = subprocess.run(
        [str(guide_dists.python), "-m", "normandy_core.app.cli", "plugins", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {(r["name"], r["distribution"], r["status"]) for r in json.loads(proc.stdout)}
    assert ("boundary_log", "normandy-boundary-log", "loaded") in rows
    assert ("keep_recent", "normandy-keep-recent", "loaded") in rows
    chat = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(30):
        chat.append({"role": "user", "content": f"question {i} " + "q" * 400})
        chat.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})
    (tmp_path / "chat.json").write_text(json.dumps(chat), encoding="utf-8")
    log = tmp_path / "boundaries.jsonl"
    proc = subprocess.run(
        [
            str(guide_dists.python),
            "-m",
            "normandy_core.app.cli",
            "compact",
            "chat.json",
            "-o",
            "small.json",
            "--compactor",
            "keep_recent",
            "--opt",
            "keep=4",
        ],
        cwd=tmp_path,
        env={**env, "NORMANDY_BOUNDARY_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    *dropped, boundary = [json.loads(line) for line in log.read_text().splitlines()]
    assert boundary["outcome"] == "compacted" and boundary["compactor"] == "keep_recent"
    assert boundary["distribution"] == "normandy-keep-recent"
    # all but the newest 4 units and the first user message, which survives by default
    assert boundary["dropped"] == len(dropped) == 60 - 4 - 1
    assert f"{len(dropped)} entries logged to {log}" in proc.stderr
    assert len(json.loads((tmp_path / "small.json").read_text())) < len(chat)


@pytest.mark.slow
def test_the_guide_examples_are_lint_and_type_clean(tmp_path: Path) -> None:
    """Readers copy them: ruff (check and format) and mypy --strict pass on the sources."""
    dists = write_guide_dists(tmp_path)
    bin_dir = Path(sys.executable).parent
    config = str(ROOT / "pyproject.toml")
    for args in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [str(bin_dir / "ruff"), *args, "--config", config, "."],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for dist in dists:
        sources = sorted(str(p) for p in (dist / "src").rglob("*.py"))
        proc = subprocess.run(
            [str(bin_dir / "mypy"), "--strict", "--no-incremental", *sources],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _api_directives() -> dict[str, set[str]]:
    """Each ``::: identifier`` of docs/api/, with the members its options list (if any)."""
    found: dict[str, set[str]] = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", text, flags=re.M):
            found[m.group(1)] = set(re.findall(r"^ +- (\w+)$", m.group(2), flags=re.M))
    return found


@pytest.mark.parametrize("module", ["normandy_core", "normandy_core.clients", "normandy_core.turn"])
def test_every_public_name_is_in_the_api_reference(module: str) -> None:
    """The core's names are spread over several pages: each has a directive on one of
    them, and a table row with a sentence (readable on the repository host)."""
    import importlib

    names = set(importlib.import_module(module).__all__) - {"__version__"}
    directives = _api_directives()
    missing = sorted(n for n in names if f"{module}.{n}" not in directives)
    assert not missing, f"not in docs/api/: {', '.join(f'{module}.{n}' for n in missing)}"
    entries: dict[str, str] = {}
    for page in (DOCS / "api").glob("*.md"):
        entries.update(_table_entries(page.read_text(encoding="utf-8")))
    unexplained = sorted(n for n in names if len(entries.get(n, "").split()) < 4)
    assert not unexplained, f"no table row with a sentence in docs/api/: {unexplained}"


#: The API page of each package whose every public name (``__all__``) has an entry there:
#: a table row naming it, with a sentence, and its own ``::: package.name`` directive.
#: A new distribution is one more row here and one more page under docs/api/.
API_PAGES = {
    "normandy_core.testing": "testing.md",
    "normandy_core.testing.strategies": "testing.md",
    "normandy_archive": "archive.md",
    "normandy_archive_postgres": "archive-postgres.md",
    "normandy_window_manager": "window-manager.md",
    "normandy_clear_tool_results": "clear-tool-results.md",
    "normandy_pipeline": "pipeline.md",
    "normandy_native": "native.md",
    "normandy_otel": "otel.md",
    "normandy_embed_bert": "embed-bert.md",
    "normandy_langchain": "langchain.md",
    "normandy_pydantic_ai": "pydantic-ai.md",
    "normandy_openai_agents": "openai-agents.md",
    "normandy_strands": "strands.md",
    "normandy_llamaindex": "llamaindex.md",
    "normandy_adk": "adk.md",
    "normandy_serve": "serve.md",
}


def _table_entries(text: str) -> dict[str, str]:
    """The first column of every table row of a page that names one thing in code, with
    the sentence beside it: ``| `name` | sentence |``."""
    rows = re.findall(r"^\| `([\w.]+)` \| (.+?) \|$", text, flags=re.M)
    return dict(rows)


@pytest.mark.parametrize("package", sorted(API_PAGES))
def test_every_public_name_has_an_entry_on_its_api_page(package: str) -> None:
    import importlib

    page = DOCS / "api" / API_PAGES[package]
    text = page.read_text(encoding="utf-8")
    names = set(importlib.import_module(package).__all__)
    entries = _table_entries(text)
    unexplained = sorted(n for n in names if len(entries.get(n, "").split()) < 4)
    assert not unexplained, f"no table row with a sentence in {page.name}: {unexplained}"
    directives = set(re.findall(r"^::: (\S+)$", text, flags=re.M))
    undocumented = sorted(n for n in names if f"{package}.{n}" not in directives)
    assert not undocumented, f"no ::: {package}.NAME in {page.name}: {undocumented}"


def test_every_distribution_has_an_api_page() -> None:
    """Each plugin distribution's package is in ``API_PAGES``: none is left out."""
    packages = {p.name for p in (ROOT / "plugins").glob("*/src/*") if p.is_dir()}
    assert packages <= set(API_PAGES)


def test_every_api_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "api").glob("*.md"))
    assert len(pages) >= 9
    assert [p for p in pages if f": {p}\n" not in nav] == []


def _results_sections() -> dict[str, str]:
    """benchmarks/RESULTS.md by section number ("1", "1b", "8"...)."""
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        m = re.match(r"(\d+[a-z]?)\.", part)
        if m:
            sections[m.group(1)] = sections.get(m.group(1), "") + part
    return sections


_FIGURE = re.compile(r"(?<![\w.])\d(?:[\d,]*\d)?(?:\.\d+)?")


def test_every_figure_of_the_choosing_page_is_in_the_section_it_cites() -> None:
    """docs/choosing.md invents no number: each figure of a paragraph or table (outside
    code spans) is in a section of benchmarks/RESULTS.md that the block, or the paragraph
    introducing a table, cites as §N."""
    sections = _results_sections()
    text = (DOCS / "choosing.md").read_text(encoding="utf-8")
    blocks = [b for b in re.split(r"\n\s*\n", text) if not b.startswith("#")]
    checked = 0
    previous_cites: list[str] = []
    for block in blocks:
        cites = re.findall(r"§(\d+[a-z]?)", block)
        if not cites and block.startswith("|"):
            cites = previous_cites  # a table cited by the paragraph that introduces it
        assert all(c in sections for c in cites), f"no such section in RESULTS.md: {cites}"
        figures = _FIGURE.findall(re.sub(r"`[^`]*`|§\d+[a-z]?", "", block))
        if figures:
            assert cites, f"figures without a citation: {figures} in\n{block}"
        source = "".join(sections[c] for c in cites)
        for figure in figures:
            assert re.search(rf"(?<![\d,.]){re.escape(figure)}(?![\d,]|\.\d)", source), (
                f"{figure} is not in RESULTS.md section(s) {', '.join(cites)}:\n{block}"
            )
            checked += 1
        previous_cites = cites
    assert checked > 80
