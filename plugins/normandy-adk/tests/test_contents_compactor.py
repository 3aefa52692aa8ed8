"""``ContentsCompactor`` on ``google.genai`` contents built here: any session comes back
valid with kept objects unchanged, and a growing session continued call after call
reports each dropped content once."""

from __future__ import annotations

from collections import Counter

import pytest
from adk_scripted import pairing_problems, read_chunk
from google.genai import types
from hypothesis import given, strategies as st

from normandy_adk import ContentsCompactor, Prompt
from normandy_core.transcripts.formats import TranscriptError

TASK = "Summarize the logs."


def _round(r: int, width: int, ids: bool) -> list[types.Content]:
    """A model content with a thought and ``width`` calls, then the responses."""
    calls = [
        types.FunctionCall(
            name="read_chunk", args={"n": r * 10 + j}, id=f"c{r}-{j}" if ids else None
        )
        for j in range(width)
    ]
    model = types.Content(
        role="model",
        parts=[
            types.Part(text=f"think {r}", thought=True),
            types.Part(text=f"round {r}"),
            *(types.Part(function_call=c) for c in calls),
        ],
    )
    responses = types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    name="read_chunk", id=c.id, response={"result": read_chunk(r * 10 + j)}
                )
            )
            for j, c in enumerate(calls)
        ],
    )
    return [model, responses]


def session(rounds: int, width: int = 1, *, ids: bool = False) -> list[types.Content]:
    """The task, ``rounds`` tool rounds of ``width`` calls, a final answer."""
    out = [types.Content(role="user", parts=[types.Part(text=TASK)])]
    for r in range(rounds):
        out += _round(r, width, ids)
    out.append(types.Content(role="model", parts=[types.Part(text="done")]))
    return out


@given(
    rounds=st.integers(min_value=0, max_value=14),
    width=st.integers(min_value=1, max_value=3),
    window=st.integers(min_value=1500, max_value=6000),
    open_round=st.booleans(),
    ids=st.booleans(),
)
def test_any_session_comes_back_valid_with_kept_objects_unchanged(
    rounds: int, width: int, window: int, open_round: bool, ids: bool
) -> None:
    contents = session(rounds, width, ids=ids)
    if open_round and rounds:
        contents = contents[:-1]  # the model is about to continue the round
    before = [c.model_dump() for c in contents]
    done = ContentsCompactor("window_manager", {"reserved_tokens": 300}, window=window).run(
        contents
    )
    assert pairing_problems(done.contents) == []
    assert [c.model_dump() for c in contents] == before  # the input is untouched
    at = {id(c): i for i, c in enumerate(contents)}
    positions = [at[id(c)] for c in done.contents if id(c) in at]
    assert positions == sorted(positions)
    assert done.contents[0] is contents[0]  # the task
    if not done.compacted:
        assert done.contents == contents and done.removed == []
    else:
        assert {id(c) for c in done.removed} == set(at) - {id(c) for c in done.contents}
        assert done.result.tokens_after < done.result.tokens_before


@given(
    rounds=st.integers(min_value=4, max_value=16),
    window=st.integers(min_value=1500, max_value=4000),
)
def test_a_growing_session_reports_each_dropped_content_once(rounds: int, window: int) -> None:
    """The list is built anew (equal copies) before every call, as ADK builds it."""
    full = session(rounds)
    compactor = ContentsCompactor("window_manager", {"reserved_tokens": 300}, window=window)
    dropped: list[str] = []
    for end in range(1, len(full) + 1):
        copies = [c.model_copy(deep=True) for c in full[:end]]
        done = compactor.run(copies, session="s")
        assert pairing_problems(done.contents, in_flight=True) == []
        assert done.contents[0] is copies[0]
        # the newest content is kept: the caller's own, or without its thinking
        newest = done.contents[-1]
        assert newest is copies[-1] or _unthought(newest) == _unthought(copies[-1])
        dropped += [e.id for e in done.result.dropped]
    assert [i for i, n in Counter(dropped).items() if n > 1] == []


def _unthought(content: types.Content) -> list[types.Part]:
    return [p for p in content.parts or [] if not p.thought]


def test_a_response_without_its_call_is_refused() -> None:
    contents = [
        types.Content(role="user", parts=[types.Part(text="hi")]),
        types.Content(role="model", parts=[types.Part(text="ok")]),
        types.Content(
            role="user",
            parts=[types.Part(function_response=types.FunctionResponse(name="stray", response={}))],
        ),
    ]
    refused = r"content 2.*'stray@content 2\.0' without its tool use"
    with pytest.raises(TranscriptError, match=refused):
        ContentsCompactor(opts={"reserved_tokens": 300}, window=4000).run(contents)


def test_the_prompt_shares_the_window() -> None:
    """A long system instruction leaves less room for the contents."""
    contents = session(8)
    compactor = ContentsCompactor("window_manager", {"reserved_tokens": 300}, window=4000)
    plain = compactor.run(contents)
    config = types.GenerateContentConfig(system_instruction="Be brief. " * 400)
    prompted = compactor.run(contents, prompt=Prompt.of(config))
    assert len(prompted.contents) < len(plain.contents)
