"""Issue 34 item 4: ``clear_tool_results`` sized to the window it is given.

A conversation of about 33k tokens (cl100k, as ``gpt-4`` counts) at a 20,000-token
window: before, its default trigger was 100,000 tokens whatever the window, so
``normandy compact`` printed "not compacted: 33,... tokens" and exited 0, and
``compact(..., raise_on_error=True)`` returned it unchanged. Now it is cleared under the
usable window; where clearing cannot get there, meta says so (``target_met`` false, the
reason in ``target_missed``), ``raise_on_error`` raises and the command exits 4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from normandy_core import CannotFitError, OptionsError, compact, get_counter
from normandy_core.app.cli import EXIT_OVER_WINDOW
from normandy_core.app.workload import generate_session
from normandy_core.transcripts.chat import to_openai
from tests.cli.conftest import run_cli, write_json

WINDOW = 20_000
USABLE = WINDOW - 4096  # reserved_tokens' default


def _chat() -> list[dict[str, Any]]:
    messages = to_openai(generate_session(3, messages=52))
    tokens = sum(get_counter("cl100k_base").count_entry(e) for e in generate_session(3, 52))
    assert 31_000 < tokens < 35_000  # the size
    return messages


def _over(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with a user message of about 18k tokens: no clearing fits it."""
    return [*messages, {"role": "user", "content": "Here is the spec. " + "word " * 18_000}]


def test_compact_clears_under_the_window_it_is_given() -> None:
    result = compact(
        _chat(), compactor="clear_tool_results", window=WINDOW, model="gpt-4", raise_on_error=True
    )
    assert result.compacted and result.meta["target_met"] is True
    assert result.tokens_after is not None and result.tokens_after < USABLE
    assert result.target_missed is None


def test_a_result_still_over_the_window_is_an_error_on_request() -> None:
    messages = _over(_chat())
    result = compact(messages, compactor="clear_tool_results", window=WINDOW, model="gpt-4")
    assert result.compacted and result.error is None  # it cleared what it could
    assert result.meta["target_met"] is False
    assert "against a usable window of 15,904" in (result.target_missed or "")
    with pytest.raises(CannotFitError, match=r"target_met False.*usable window of 15,904"):
        compact(
            messages,
            compactor="clear_tool_results",
            window=WINDOW,
            model="gpt-4",
            raise_on_error=True,
            fresh=True,  # not continued from the call above, which cleared it already
        )


def test_the_command_clears_under_the_window_or_exits_4(tmp_path: Path) -> None:
    src = write_json(tmp_path / "chat.json", _chat())
    out = tmp_path / "out.json"
    common = ["--compactor", "clear_tool_results", "--model", "gpt-4", "--window", str(WINDOW)]
    r = run_cli("compact", str(src), "-o", str(out), *common)
    assert r.code == 0, r
    assert "not compacted" not in r.err and "->" in r.err
    kept = json.loads(out.read_text())
    assert len(kept) == len(json.loads(src.read_text()))  # cleared in place, nothing dropped
    over = write_json(tmp_path / "over.json", _over(_chat()))
    r = run_cli("compact", str(over), "-o", str(out), *common)
    assert r.code == EXIT_OVER_WINDOW == 4, r
    assert "could not bring the transcript under the window (target_met false)" in r.err


def test_the_window_options_are_checked_where_the_config_is_made() -> None:
    with pytest.raises(OptionsError, match="reserved_tokens applies only when clearing sizes"):
        compact(
            _chat(),
            compactor="clear_tool_results",
            opts={"trigger_tokens": 9, "reserved_tokens": 9},
        )
    with pytest.raises(OptionsError, match=r"option 'reserved_tokens'.*leave nothing"):
        compact(_chat(), compactor="clear_tool_results", window=4000, model="gpt-4")
