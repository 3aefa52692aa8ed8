"""The documentation stays true: the generated hook reference and the plugin-author guide."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from project_paths import with_project_path

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
    from normandy_core import hookspecs

    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    names = _generator().hookspec_names()
    assert set(names) == {
        "maybe_compact",
        "options_model",
        "needs_window",
        "validate_opts",
        "before_commit",
        "after_compact",
        "on_boundary",
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


def _guide_files() -> dict[str, str]:
    text = (DOCS / "plugin-guide.md").read_text(encoding="utf-8")
    files = {}
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", text, flags=re.S):
        first, _, body = block.partition("\n")
        if first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = body
    return files


def test_plugin_guide_distribution_installs_and_passes_its_tests(tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib")
    files = _guide_files()
    assert set(files) == {
        "pyproject.toml",
        "src/normandy_keep_recent/__init__.py",
        "tests/test_keep_recent.py",
    }
    for rel, body in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    project = tomllib.loads(files["pyproject.toml"])["project"]
    # Install it as pip would for an editable install: the package and its .dist-info
    # on the path, with the entry points from pyproject.toml.
    info = tmp_path / "src" / "normandy_keep_recent-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n",
        encoding="utf-8",
    )
    eps = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in table.items())
        for group, table in project["entry-points"].items()
    )
    (info / "entry_points.txt").write_text(eps, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env={
            "PYTHONPATH": with_project_path(str(tmp_path / "src")),
            "PATH": "/usr/bin:/bin",
            # The archive hook is installed beside the example: keep it out of the home.
            "NORMANDY_ARCHIVE_PATH": str(tmp_path / "archive.sqlite3"),
            "XDG_DATA_HOME": str(tmp_path / "data"),
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout


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
    import importlib

    names = set(importlib.import_module(module).__all__) - {"__version__"}
    directives = _api_directives()
    missing = sorted(n for n in names if f"{module}.{n}" not in directives)
    assert not missing, f"not in docs/api/: {', '.join(f'{module}.{n}' for n in missing)}"


def test_the_conformance_kit_is_in_the_api_reference() -> None:
    import normandy_core.testing
    import normandy_core.testing.strategies

    directives = _api_directives()
    assert set(normandy_core.testing.__all__) <= directives["normandy_core.testing"]
    assert directives["normandy_core.testing.strategies"] == set()  # the whole module


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
