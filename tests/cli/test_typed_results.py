"""Typed results of ``compact()``: fields always present, ``check()``, ``raise_on_error``, the
warning logged for an error result, and the README's first example run as written."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest

import normandy_core
from normandy_core import CompactionError, compact
from normandy_core.transcripts.facade import acompact
from normandy_core.transcripts.result import CannotFitError

ROOT = Path(__file__).resolve().parents[2]


def small_chat() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the rounding bug in billing.py."},
        {"role": "assistant", "content": "Looking at billing.py now."},
    ]


def huge_chat() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "word " * 4000}]


def typed(result: Any) -> tuple[Any, ...]:
    return (
        result.compacted,
        result.tokens_before,
        result.tokens_after,
        result.tokens_removed,
        result.dropped,
        result.error,
        result.archive,
    )


def test_fields_are_present_when_nothing_was_compacted() -> None:
    result = compact(small_chat(), model="gpt-4o", window=32_000, fresh=True)
    compacted, before, after, removed, dropped, error, archive = typed(result)
    assert compacted is False and dropped == [] and error is None and archive is None
    assert type(before) is int and type(after) is int and type(removed) is int
    assert before == after > 0 and removed == 0
    # the same count a compaction of the same input reports as its tokens_before
    squeezed = compact(
        small_chat(), model="gpt-4o", window=60, opts={"reserved_tokens": 0}, fresh=True
    )
    assert squeezed.meta.get("tokens_before", before) == before
    assert result.check() is result


def test_fields_mirror_the_meta_of_a_compaction(openai_messages: Any) -> None:
    result = compact(openai_messages, model="gpt-4o", window=20_000, fresh=True)
    assert result.compacted
    meta = result.meta
    assert result.tokens_before == meta["tokens_before"] > result.tokens_after
    assert result.tokens_after == meta["tokens_after"]
    assert result.tokens_removed == meta["tokens_removed"]
    assert [e.id for e in result.dropped] == [e.id for e in meta["dropped"]]
    assert result.error is None and result.check() is result
    # the workspace's archive hook is installed: its note says where the entries went
    assert result.archive is not None and result.archive == result.note("archive")
    assert result.archive["entries"] == len(result.dropped)


def test_an_error_result_has_the_fields_and_check_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="normandy_core"):
        result = compact(huge_chat(), window=3000, opts={"reserved_tokens": 500}, fresh=True)
    assert not result.compacted and result.error and "cannot fit" in result.error
    assert result.tokens_before == result.tokens_after > 3000
    assert result.tokens_removed == 0 and result.dropped == [] and result.archive is None
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, caplog.text
    assert warned[0].name.split(".")[0] == "normandy_core"
    assert "'window_manager'" in warned[0].getMessage()
    assert "cannot fit" in warned[0].getMessage()
    with pytest.raises(CannotFitError, match=r"compactor 'window_manager'.*cannot fit") as info:
        result.check()
    assert isinstance(info.value, CompactionError)
    assert info.value.result is result
    assert normandy_core.CannotFitError is CannotFitError


def test_raise_on_error_is_opt_in() -> None:
    tight = {"reserved_tokens": 500}
    with pytest.raises(CannotFitError, match="cannot fit"):
        compact(huge_chat(), window=3000, opts=tight, raise_on_error=True, fresh=True)
    with pytest.raises(CannotFitError, match="cannot fit"):
        asyncio.run(acompact(huge_chat(), window=3000, opts=tight, raise_on_error=True, fresh=True))
    assert compact(huge_chat(), window=3000, opts=tight, fresh=True).error  # returned
    ok = compact(small_chat(), window=32_000, raise_on_error=True, fresh=True)
    assert ok.error is None


def test_a_continued_call_has_the_fields_too() -> None:
    history = small_chat()
    first = compact(history, model="gpt-4o", window=32_000)
    history.append({"role": "user", "content": "And add a test for it."})
    second = compact(history, model="gpt-4o", window=32_000)
    assert second.continued and not second.compacted
    assert second.tokens_before == second.tokens_after > first.tokens_before
    assert second.tokens_removed == 0 and second.dropped == [] and second.archive is None
    history.append({"role": "user", "content": "word " * 4000})
    third = compact(history, model="gpt-4o", window=3000, opts={"reserved_tokens": 500})
    assert third.error and third.tokens_before == third.tokens_after
    with pytest.raises(CannotFitError):
        third.check()


def _readme_first_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    return block.group(1)


@pytest.mark.parametrize("case", ["fits", "compacted", "cannot fit"])
def test_the_readme_first_example_runs_whether_or_not_it_fits(
    case: str, openai_messages: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _readme_first_example()
    assert "compact(messages" in code
    messages = {
        "fits": small_chat(),
        "compacted": list(openai_messages),
        "cannot fit": [{"role": "user", "content": "word " * 40_000}],
    }[case]
    exec(compile(code, "README.md", "exec"), {"messages": messages})
    printed = capsys.readouterr().out.split()
    assert int(printed[0]) > 0 and printed[1] == "->" and int(printed[2]) > 0
