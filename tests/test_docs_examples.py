"""Every Python block of README.md and docs/ runs, as a reader would run it.

Per Markdown file, its ``python`` blocks run in order in one namespace, in a fresh
interpreter (tests/docs_runner.py) whose working directory, ``HOME`` and archive are
temporary. The markers above a block (tests/doc_blocks.py) say what it needs: a
``needs: anthropic`` or ``needs: openai`` block runs against the loopback stand-in of that
API (tests/clients/servers.py), which answers as the API does and refuses what it would
refuse, reached through the SDK's own ``*_BASE_URL`` variable; ``given:`` names the
reader's own objects (their transcript, client, tools), bound as docs_runner.GIVEN says;
``skip: reason`` leaves out a deliberately partial block (at most ``MAX_SKIPS`` of them).
Blocks that are files of the plugin guide's example distributions (``# file:``) are
installed and tested as distributions by tests/cli/test_docs.py instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from doc_blocks import ROOT, Block, blocks
from docs_runner import GIVEN
from project_paths import project_pythonpath

#: Deliberately partial blocks, over all pages, each with its reason.
MAX_SKIPS = 3
PROVIDERS = ("anthropic", "openai")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _servers() -> ModuleType:
    name = "normandy_client_test_servers"  # the name tests/clients/conftest.py uses
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests/clients/servers.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _python_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang == "python" and b.file is None]


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


RUNNABLE = [p for p in PAGES if any("skip" not in b.markers for b in _python_blocks(p))]


def test_the_markers_are_known_and_skips_are_few_with_reasons() -> None:
    skips = []
    for page in PAGES:
        for block in blocks(page):
            markers = block.markers
            if markers and block.lang != "python":
                pytest.fail(f"{block.where}: markers on a {block.lang or 'plain'} block")
            assert markers.get("needs", "anthropic") in PROVIDERS, block.where
            assert set(block.given) <= set(GIVEN), f"{block.where}: unknown given names"
            if "client" in block.given:
                assert "needs" in markers, f"{block.where}: 'given: client' without 'needs:'"
            if "skip" in markers:
                assert len(markers["skip"]) >= 20, f"{block.where}: give the skip a reason"
                assert set(markers) == {"skip"}, f"{block.where}: a skipped block runs nothing"
                skips.append(block.where)
    assert len(skips) <= MAX_SKIPS, f"too many skipped blocks: {skips}"


def test_python_blocks_are_fenced_as_python() -> None:
    """No Python block escapes the runner under another fence name, or by being indented
    (a fence inside a list item, which the block reader does not look for)."""
    for page in PAGES:
        for block in blocks(page):
            assert block.lang not in ("py", "python3", "pycon", "ipython"), block.where
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"^[ \t]+```", text, flags=re.M), f"an indented fence in {page}"


def test_every_page_with_python_blocks_is_run() -> None:
    assert {_rel(p) for p in RUNNABLE} >= {
        "README.md",
        "docs/index.md",
        "docs/compact.md",
        "docs/turn-loop.md",
        "docs/hooks.md",
    }


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=_rel)
def test_the_python_blocks_of_the_page_run(page: Path, tmp_path: Path) -> None:
    to_run = [b for b in _python_blocks(page) if "skip" not in b.markers]
    payload = [
        {
            "where": b.where,
            "path": _rel(page),
            "line": b.line,
            "code": b.code,
            "given": b.given,
            "needs": b.markers.get("needs"),
        }
        for b in to_run
    ]
    (tmp_path / "blocks.json").write_text(json.dumps(payload), encoding="utf-8")
    scratch = tmp_path / "cwd"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NORMANDY_", "OPENAI_"))}
    env = {k: v for k, v in env.items() if not k.startswith("ANTHROPIC_")}
    env.update(
        {
            "PYTHONPATH": project_pythonpath(),
            "NORMANDY_ARCHIVE_PATH": str(tmp_path / "archive.sqlite3"),
            "NORMANDY_CACHE_DIR": str(tmp_path / "cache"),
            "HOME": str(tmp_path / "home"),
            "XDG_DATA_HOME": str(tmp_path / "data"),
        }
    )
    needs = sorted({b.markers["needs"] for b in to_run if "needs" in b.markers})
    with ExitStack() as stack:
        providers: dict[str, Any] = {}
        for kind in needs:
            provider = stack.enter_context(_servers().FakeProvider(kind, lifetime=120))
            providers[kind] = provider
            env[f"{kind.upper()}_BASE_URL"] = provider.base_url
            env[f"{kind.upper()}_API_KEY"] = "docs-test-key"
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "tests" / "docs_runner.py"),
                str(tmp_path / "blocks.json"),
                str(tmp_path / "result.json"),
            ],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    output = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert (tmp_path / "result.json").exists(), output
    result = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert result["failed"] is None, f"{result['failed']} failed:\n{result['error']}\n{output}"
    assert proc.returncode == 0, output
    assert result["ran"] == [b.where for b in to_run]
    for kind, provider in providers.items():
        assert provider.requests, f"no block of {_rel(page)} called the {kind} stand-in"
        assert provider.refusals == [], f"the {kind} stand-in refused: {provider.refusals}"
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())
