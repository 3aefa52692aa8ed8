"""``compact()`` before every request: a growing list is compacted as a continuation.

Real compactors, real tiktoken counts, the archive in a temporary file (root conftest).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import compact
from normandy_core.app.workload import generate_session
from normandy_core.conversation.structure import pairing_problems
from normandy_core.transcripts import continuation
from normandy_core.transcripts.chat import to_openai
from normandy_core.transcripts.formats import TranscriptError
from normandy_core.transcripts.result import CompactResult
from normandy_core.transcripts.transcript import read

OPTS = {"counter": "cl100k_base", "reserved_tokens": 0}
WINDOW = 12_000


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    continuation.clear()


def _session(n: int, seed: int = 5) -> tuple[list[dict[str, Any]], list[int]]:
    """A Chat Completions session and the positions where a tool batch starts."""
    msgs = to_openai(generate_session(seed, n))
    cuts = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")]
    return msgs, cuts


def _call(messages: list[Any], **kw: Any) -> CompactResult:
    return compact(messages, window=WINDOW, model="gpt-4o", opts=OPTS, **kw)


def _fits(result: CompactResult) -> None:
    assert pairing_problems(result.memory.entries()) == []
    if result.compacted:
        assert result.meta["tokens_after"] <= WINDOW


def test_a_growing_full_history_is_continued_and_counts_only_what_is_new() -> None:
    msgs, cuts = _session(400)
    live = msgs[: cuts[20]]
    first = _call(live)
    assert not first.continued and first.compacted
    dropped_ids = {e.id for e in first.dropped}
    pos = cuts[20]
    for nxt in cuts[21:40]:
        live.extend(msgs[pos:nxt])
        pos = nxt
        r = _call(live)
        assert r.continued
        _fits(r)
        # what comes back is the caller's own objects (and markers), in order
        given = {id(m): k for k, m in enumerate(live)}
        order = [given[id(m)] for m in r.messages if id(m) in given]
        assert order == sorted(order) and order[-1] == len(live) - 1
        # nothing is reported dropped twice across calls
        now = {e.id for e in r.dropped}
        assert not now & dropped_ids
        dropped_ids |= now


def test_the_returned_list_plus_new_messages_is_continued_too() -> None:
    msgs, cuts = _session(400)
    live = msgs[: cuts[20]]
    r = _call(live)
    out = list(r.messages)
    pos = cuts[20]
    for nxt in cuts[21:35]:
        out = [*out, *msgs[pos:nxt]]
        pos = nxt
        r = _call(out)
        assert r.continued
        _fits(r)
        out = list(r.messages)


def test_a_continuation_matches_the_turn_loop_cut_not_a_fresh_one() -> None:
    msgs, cuts = _session(400)
    live = msgs[: cuts[20]]
    _call(live)
    live.extend(msgs[cuts[20] : cuts[21]])
    cont = _call(live)
    fresh = _call(live, fresh=True)
    assert cont.continued and not fresh.continued
    _fits(cont)
    _fits(fresh)
    # both are valid; the fresh one drops the whole prefix again
    assert len(fresh.dropped) > len(cont.dropped)


def test_a_kept_message_changed_in_place_takes_the_full_path() -> None:
    msgs, cuts = _session(300)
    live = copy.deepcopy(msgs[: cuts[15]])
    r = _call(live)
    kept = r.messages[-1]
    assert kept is live[-1]  # the newest message is always kept
    kept["content"] = "edited after the call"
    live.extend(copy.deepcopy(msgs[cuts[15] : cuts[16]]))
    again = _call(live)
    assert not again.continued
    assert any(m.get("content") == "edited after the call" for m in again.messages) or any(
        e.text() == "edited after the call" for e in again.dropped
    )


def test_other_options_or_another_list_are_not_continued() -> None:
    msgs, cuts = _session(300)
    live = msgs[: cuts[15]]
    _call(live)
    live.extend(msgs[cuts[15] : cuts[16]])
    other = compact(live, window=WINDOW + 1, model="gpt-4o", opts=OPTS)
    assert not other.continued
    # equal content in other objects: the last remembered message is not the same object
    assert not _call(copy.deepcopy(live)).continued


def test_bad_new_messages_are_refused_naming_their_position_in_the_whole_list() -> None:
    msgs, cuts = _session(300)
    live = msgs[: cuts[15]]
    _call(live)
    n = len(live)
    live.append({"role": "tool", "tool_call_id": "nobody", "content": "x"})
    with pytest.raises(TranscriptError) as info:
        _call(live)
    assert (info.value.index, info.value.field) == (n, "tool_call_id")


def test_the_memo_is_bounded() -> None:
    msgs, cuts = _session(200)
    for k in range(continuation.MAX_STATES + 5):
        _call(copy.deepcopy(msgs[: cuts[5 + k]]))
    assert len(continuation._states) <= continuation.MAX_STATES


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 1000),
    start=st.integers(3, 30),
    steps=st.integers(1, 12),
    keep_full=st.booleans(),
)
def test_continuation_property(seed: int, start: int, steps: int, keep_full: bool) -> None:
    """Every call of a growing sequence is valid, loses nothing unreported, keeps objects."""
    continuation.clear()
    msgs, cuts = _session(260, seed)
    if len(cuts) < start + steps + 1:
        return
    live = list(msgs[: cuts[start]])
    r = _call(live)
    entries_seen = len(r.memory)
    pos = cuts[start]
    for nxt in cuts[start + 1 : start + 1 + steps]:
        new = msgs[pos:nxt]
        pos = nxt
        base = live if keep_full else list(r.messages)
        base.extend(new)
        if keep_full:
            live = base
        before = {e.id for e in r.memory}
        r = _call(base)
        assert r.continued
        _fits(r)
        given_ids = {id(m) for m in base}
        assert all(
            id(m) in given_ids or str(m.get("content", "")).startswith("[normandy:")
            for m in r.messages
        )
        # what was live plus the new entries is what is live now plus what was dropped
        # (a shortened entry is live and reported; a marker created now is new)
        fresh_entries = len(read(new, "openai").memory)
        inserted = ("normandy.compaction_marker", "normandy.summary")
        created = sum(
            1 for e in r.memory if e.id not in before and any(k in e.metadata for k in inserted)
        )
        shortened = len(r.meta.get("shortened", ()))
        live_now = len(r.memory)
        assert live_now + len(r.dropped) - shortened == len(before) + fresh_entries + created
        assert {e.id for e in r.dropped} <= before | {e.id for e in r.memory}
        entries_seen += fresh_entries
    assert entries_seen > 0


def test_acompact_gives_what_compact_gives_and_leaves_the_loop_free() -> None:
    import asyncio
    import threading

    from normandy_core import acompact

    msgs, cuts = _session(300)
    live = msgs[: cuts[15]]
    loop_thread: list[int] = []

    async def main() -> CompactResult:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        loop_thread.append(threading.get_ident())
        task = asyncio.create_task(ticker())
        result = await acompact(live, window=WINDOW, model="gpt-4o", opts=OPTS, fresh=True)
        task.cancel()
        assert ticks > 1  # the loop ran the ticker while the compaction ran elsewhere
        return result

    result = asyncio.run(main())
    same = _call(live, fresh=True)
    assert result.messages == same.messages
    assert [e.content for e in result.dropped] == [e.content for e in same.dropped]


def test_an_equal_copy_of_a_message_is_not_taken_for_the_remembered_one() -> None:
    msgs, cuts = _session(300)
    live = msgs[: cuts[15]]
    _call(live)
    twin = copy.deepcopy(live[-1])  # equal, another object
    again = [*live[:-1], twin, *msgs[cuts[15] : cuts[16]]]
    r = _call(again)
    assert not r.continued
    assert any(m is twin for m in r.messages)  # the caller's own object comes back


def test_an_equal_copy_of_a_dropped_message_still_continues() -> None:
    msgs, cuts = _session(300)
    live = msgs[: cuts[15]]
    first = _call(live)
    assert first.compacted
    returned = {id(m) for m in first.messages}
    gone = next(i for i, m in enumerate(live) if id(m) not in returned)
    again = [*live[:gone], copy.deepcopy(live[gone]), *live[gone + 1 :]]
    again.extend(msgs[cuts[15] : cuts[16]])
    r = _call(again)
    assert r.continued
    # a kept message of the caller comes back as the caller's object, never an equal twin
    mine = {id(m) for m in again}
    for m in r.messages:
        assert id(m) in mine or m not in again


def test_a_dropped_message_changed_to_other_content_takes_the_full_path() -> None:
    msgs, cuts = _session(300)
    live = msgs[: cuts[15]]
    first = _call(live)
    returned = {id(m) for m in first.messages}
    gone = next(i for i, m in enumerate(live) if id(m) not in returned)
    other = {**live[gone], "content": "a different message"}
    again = [*live[:gone], other, *live[gone + 1 :], *msgs[cuts[15] : cuts[16]]]
    assert not _call(again).continued


def test_a_replaced_kept_message_after_a_continuation_takes_the_full_path() -> None:
    msgs, cuts = _session(300)
    live = msgs[: cuts[15]]
    _call(live)
    live.extend(msgs[cuts[15] : cuts[16]])
    assert _call(live).continued  # positions of the live messages now come from a continuation
    twin = copy.deepcopy(live[-1])
    again = [*live[:-1], twin, *msgs[cuts[16] : cuts[17]]]
    r = _call(again)
    assert not r.continued
    assert any(m is twin for m in r.messages)
