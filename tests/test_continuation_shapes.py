"""``compact()`` before every request continues its last call in every input shape.

Issue 32, case 8: given an Anthropic request (``system`` beside ``messages``) the memo
remembered nothing, so every call read, checked and counted the whole history again
(``continued`` was always false), and a Responses request (``instructions`` beside
``input``) was refused. Here every shape of ``benchmarks/shapes.py`` grows by one tool
batch per call: each call after the first continues the last one, reads only the new
messages, and keeps exactly what compacting the list the last call returned plus the new
messages from scratch keeps (the turn loop's cut, which the continuation promises). A
request whose system prompt or instructions changed, a list edited in place, a shorter
list, another client or another container is compacted from scratch instead, and gives
what a fresh compaction gives.

Real compactors (``window_manager``), real tiktoken counts, real SDK objects, the
archive in a temporary file (root conftest).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from reliability_counts import (
    CONTINUATION_CALLS,
    CONTINUATION_EXAMPLES,
    CONTINUATION_PROBES,
    CONTINUATION_SHAPES,
)

from benchmarks.shapes import SHAPES, Shape, ShapedSession, shaped_session
from normandy_core import compact
from normandy_core.clients.scripted import ScriptedClient
from normandy_core.transcripts import continuation, formats
from normandy_core.transcripts.result import CompactResult

OPTS = {"counter": "cl100k_base", "reserved_tokens": 0}
WINDOW = 12_000
SHAPE_IDS = [s.name for s in SHAPES]


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    continuation.clear()


def _call(data: Any, **kw: Any) -> CompactResult:
    return compact(data, window=WINDOW, model="gpt-4o", opts=OPTS, **kw)


def _session(shape: Shape, seed: int = 5, entries: int = 320) -> ShapedSession:
    return shaped_session(shape, seed, entries)


def _listed(list_key: str | None, data: Any) -> list[Any]:
    """The message list of ``data``: itself, or what the request holds under ``list_key``."""
    listed: list[Any] = data if list_key is None else data[list_key]
    return listed


def _same(list_key: str | None, got: Any, want: Any, mine: set[int]) -> bool:
    """Whether two results hold the same transcript: the caller's own objects (``mine``)
    in the same places, what Normandy rendered equal, the request's other keys the same."""
    if list_key is not None:
        others = {k: v for k, v in got.items() if k != list_key}
        wanted = {k: v for k, v in want.items() if k != list_key}
        if others.keys() != wanted.keys():
            return False
        if any(v is not wanted[k] and v != wanted[k] for k, v in others.items()):
            return False
    got_list, want_list = _listed(list_key, got), _listed(list_key, want)
    if len(got_list) != len(want_list):
        return False
    for g, w in zip(got_list, want_list, strict=True):
        if id(g) in mine or id(w) in mine:
            if g is not w:
                return False
        elif g != w:
            return False
    return True


def _as_fresh(
    data: Any, list_key: str | None, mine: set[int], got: CompactResult, **kw: Any
) -> bool:
    """Whether ``got`` is what compacting ``data`` from scratch gives."""
    return _same(list_key, got.messages, _call(data, fresh=True, **kw).messages, mine)


@contextmanager
def _reads_of(watched: list[Any]) -> Iterator[list[int]]:
    """Counts, in a one-item list, how often a reader looks at one of ``watched``
    (``as_mapping`` is how every format's reader takes a message)."""
    ids = {id(m) for m in watched}
    code = formats.as_mapping.__code__
    seen = [0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code and id(frame.f_locals.get("obj")) in ids:
            seen[0] += 1

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def _started(shape: Shape) -> tuple[ShapedSession, set[int], list[Any], Any]:
    """A session in ``shape``, the ids of its messages (the caller's own), its list after
    eight tool batches, and that list in its shape (the request holding it)."""
    s = _session(shape)
    live = s.messages[: s.ends[8]]
    return s, {id(m) for m in s.messages}, live, s.request(live)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_every_shape_continues_its_last_call_as_the_turn_loop_would(shape: Shape) -> None:
    s, mine, live, request = _started(shape)  # the caller keeps one request, appends to it
    key = shape.list_key
    r = _call(request)
    assert not r.continued
    kept = list(_listed(key, r.messages))  # what the turn loop's last boundary kept
    compacted = watched = 0
    assert len(SHAPES) == CONTINUATION_SHAPES
    last = 8 + CONTINUATION_CALLS
    for begin, end in zip(s.ends[8:last], s.ends[9 : last + 1], strict=True):
        new = s.messages[begin:end]
        live.extend(new)
        sent = {id(m) for m in _listed(key, r.messages)}
        gone = [m for m in live[:begin] if id(m) not in sent]  # dropped by the last calls
        with _reads_of(gone) as reads:
            r = _call(request)
        assert r.continued, shape.name
        assert reads[0] == 0, f"{shape.name}: read {reads[0]} dropped messages again"
        watched += len(gone)
        ref = _call(s.request([*kept, *new]), fresh=True)
        assert _same(key, r.messages, ref.messages, mine), shape.name
        kept = list(_listed(key, ref.messages))
        compacted += r.compacted
        if shape.system_key is not None:
            assert r.messages[shape.system_key] is s.system()  # the caller's own
    assert compacted and watched  # the window forced compactions along the way


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_a_continued_call_reads_only_the_new_messages(shape: Shape) -> None:
    """No message an earlier call read is read again (an SDK object read is a
    ``model_dump``): the last one was read each call to see whether the first new
    message joins its entry, converting it again when it was an SDK object. (A call
    that compacts renders the entries it changed from the messages they came from: a
    window that fits the whole session keeps these calls from compacting.)"""
    s, _, live, request = _started(shape)
    roomy = {"window": 1_000_000, "model": "gpt-4o", "opts": OPTS}
    compact(request, **roomy)
    for begin, end in zip(s.ends[8:12], s.ends[9:13], strict=True):
        earlier = live[:begin]
        live.extend(s.messages[begin:end])
        with _reads_of(earlier) as reads:
            r = compact(request, **roomy)
        assert r.continued and not r.compacted
        assert reads[0] == 0, f"{shape.name}: read {reads[0]} earlier messages again"


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_the_returned_request_plus_new_messages_continues_too(shape: Shape) -> None:
    s = _session(shape)
    key = shape.list_key
    r = _call(s.request(s.messages[: s.ends[8]]))
    for begin, end in zip(s.ends[8:16], s.ends[9:17], strict=True):
        grown = [*_listed(key, r.messages), *s.messages[begin:end]]
        r = _call(grown if key is None else {**r.messages, key: grown})
        assert r.continued, shape.name


def _request_shapes() -> list[Shape]:
    return [s for s in SHAPES if s.system_key is not None]


@pytest.mark.parametrize("shape", _request_shapes(), ids=lambda s: s.name)
def test_a_changed_system_prompt_or_container_is_compacted_from_scratch(shape: Shape) -> None:
    s = _session(shape)
    key, system_key = shape.list_key, shape.system_key or ""
    mine = {id(m) for m in s.messages}
    live = s.messages[: s.ends[8]]
    _call(s.request(live))
    live.extend(s.messages[s.ends[8] : s.ends[9]])
    system = s.system()
    other = system + " Be brief." if isinstance(system, str) else [dict(system[0], text="x")]
    for changed in (s.request(live, **{system_key: other}), s.request(live, **{system_key: None})):
        r = _call(changed)
        assert not r.continued
        assert _as_fresh(changed, key, mine, r)
    r = _call(live)  # the same messages without their request
    assert not r.continued
    assert _as_fresh(live, None, mine, r)


def test_a_system_prompt_changed_in_place_is_compacted_from_scratch() -> None:
    shape = next(s for s in SHAPES if s.system_key == "system" and s.sdk)
    s = _session(shape)
    live = s.messages[: s.ends[8]]
    request = s.request(live)
    _call(request)
    live.extend(s.messages[s.ends[8] : s.ends[9]])
    request["system"][0]["text"] += " Answer briefly."  # the caller's blocks, edited
    r = _call(request)
    assert not r.continued
    assert r.messages["system"] is request["system"]
    assert _as_fresh(request, "messages", set(), r)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_a_list_edited_in_place_or_shorter_is_compacted_from_scratch(shape: Shape) -> None:
    s, mine, live, request = _started(shape)
    key = shape.list_key
    _call(request)
    live.extend(s.messages[s.ends[8] : s.ends[9]])
    first_user = next(i for i, m in enumerate(live) if _user_text(m) is not None)
    original = live[first_user]
    live[first_user] = _edited_user(original)
    r = _call(request)
    assert not r.continued
    assert _as_fresh(request, key, mine, r)
    live[first_user] = original
    shorter = s.request(s.messages[: s.ends[7]])
    r = _call(shorter)
    assert not r.continued
    assert _as_fresh(shorter, key, mine, r)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_another_client_is_compacted_from_scratch(shape: Shape) -> None:
    s = _session(shape)
    live = s.messages[: s.ends[8]]
    mine = ScriptedClient([])
    _call(s.request(live), client=mine)
    live.extend(s.messages[s.ends[8] : s.ends[9]])
    assert not _call(s.request(live), client=ScriptedClient([])).continued
    assert not _call(s.request(live)).continued
    live.extend(s.messages[s.ends[9] : s.ends[10]])
    assert _call(s.request(live), client=mine).continued  # its own call is still there


def _list_key(data: Any) -> str | None:
    """Where ``data`` holds its messages: ``None`` for a list, else the request's key."""
    if isinstance(data, list):
        return None
    return "messages" if "messages" in data else "input"


def _user_text(message: Any) -> str | None:
    """The text of a plain user message (a dict whose content is a string), or ``None``."""
    if isinstance(message, dict) and message.get("role") == "user":
        content = message.get("content")
        return content if isinstance(content, str) else None
    return None


def _edited_user(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "content": f"{message['content']} (edited)"}


def _kept_text(shape: Shape, message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Where the text of the newest message (a tool result, always kept) sits: its key
    and the dict holding it."""
    if shape.format == "openai":
        return "content", message
    if shape.format == "responses":
        return "output", message
    return "content", message["content"][-1]


def _other_container(shape: Shape, live: list[Any], note: str) -> Any:
    """``live`` in another container than ``shape``'s (with the system prompt ``note``
    where the format has one)."""
    if shape.format == "openai":
        return {"messages": live} if shape.list_key is None else live
    if shape.format == "responses":
        return {"model": "m", "instructions": note, "input": live}
    return {"model": "m", "system": note, "messages": live}


@contextmanager
def _disrupted(shape: Shape, s: ShapedSession, data: Any, kind: str, step: int) -> Iterator[Any]:
    """The data a disrupted call is given (``kind``, made unique by ``step``): changed in
    place where a caller would change it, and put back afterwards."""
    live = _listed(shape.list_key, data)
    note = f" Be brief ({step})."
    if kind == "kept":
        key, holder = _kept_text(shape, live[-1])
        original = holder[key]
        holder[key] = original + note
        yield data
        holder[key] = original
    elif kind == "list":
        i = next(i for i, m in enumerate(live) if _user_text(m) is not None)
        original = live[i]
        live[i] = {**original, "content": original["content"] + note}
        yield data
        live[i] = original
    elif kind == "system" and shape.system_key is not None:
        system = s.system()
        other = system + note if isinstance(system, str) else [dict(system[0], text=note)]
        yield {**data, shape.system_key: other}
    elif kind == "system":
        yield _other_container(shape, live, note)
    else:  # "client": the same data, another client
        yield data


@settings(max_examples=CONTINUATION_EXAMPLES, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 500),
    start=st.integers(2, 12),
    probes=st.lists(st.sampled_from([None, None, *CONTINUATION_PROBES]), min_size=1, max_size=8),
    returned=st.booleans(),
)
def test_continuation_property_every_shape(
    shape: Shape, seed: int, start: int, probes: list[str | None], returned: bool
) -> None:
    """Call by call on a growing list (the full history, or the list returned plus the
    new messages), in every shape: each call continues the last and keeps what the
    from-scratch compaction of what the last call kept plus the new messages keeps; a
    disrupted call (``probes``) is not continued and gives what a fresh call gives; the
    list of the call before, shorter, is not continued either."""
    continuation.clear()
    s = _session(shape, seed, 260)
    if len(s.ends) < start + len(probes) + 1:
        return
    key = shape.list_key
    mine = {id(m) for m in s.messages}
    client = ScriptedClient([])
    live = s.messages[: s.ends[start]]
    data = s.request(live)
    r = _call(data, client=client)
    assert not r.continued
    kept = list(_listed(key, r.messages))
    contained = False
    for k, probe in enumerate(probes):
        previous = s.request(list(_listed(key, data)))
        new = s.messages[s.ends[start + k] : s.ends[start + k + 1]]
        if returned:
            grown = [*_listed(key, r.messages), *new]
            data = grown if key is None else {**r.messages, key: grown}
        else:
            live.extend(new)
        r = _call(data, client=client)
        assert r.continued
        ref = _call(s.request([*kept, *new]), client=client, fresh=True)
        assert _same(key, r.messages, ref.messages, mine)
        kept = list(_listed(key, ref.messages))
        if probe is None or (probe == "system" and shape.format == "openai" and contained):
            continue  # Chat Completions has no system prompt to vary: one other container
        contained = contained or probe == "system"
        other = ScriptedClient([]) if probe == "client" else client
        with _disrupted(shape, s, data, probe, k) as probed:
            got = _call(probed, client=other)
            assert not got.continued, probe
            assert _as_fresh(probed, _list_key(probed), mine, got, client=other), probe
    got = _call(previous, client=client)  # shorter than the last call's list
    assert not got.continued
    assert _as_fresh(previous, key, mine, got, client=client)


def _sdk_edits(shape: Shape, live: list[Any]) -> list[tuple[Any, str, Any]]:
    """Edits in place of the SDK objects a compaction keeps (the newest reply's), each as
    ``(holder, attribute or key, new value)``: a field, a nested object's field, a value
    inside a dict an SDK object holds."""
    if shape.format == "openai":
        reply = next(m for m in reversed(live) if not isinstance(m, dict))
        call = reply.tool_calls[0]
        return [
            (reply, "content", "edited"),
            (call.function, "arguments", '{"path": "elsewhere.py"}'),
        ]
    if shape.format == "anthropic":
        reply = next(m for m in reversed(live) if m["role"] == "assistant")
        use = next(b for b in reply["content"] if b.type == "tool_use")
        return [(use, "name", "edited"), (use.input, "path", "elsewhere.py")]
    call = next(m for m in reversed(live) if not isinstance(m, dict))
    return [(call, "arguments", '{"path": "elsewhere.py"}'), (call, "name", "edited")]


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.sdk], ids=lambda s: s.name)
def test_an_sdk_object_changed_in_place_is_compacted_from_scratch(shape: Shape) -> None:
    s = _session(shape)
    live = s.messages[: s.ends[8]]
    request = s.request(live)
    edits = _sdk_edits(shape, live)
    for step, (holder, name, value) in enumerate(edits):
        continuation.clear()
        _call(request)
        if isinstance(holder, dict):
            original = holder[name]
            holder[name] = value
        else:
            original = getattr(holder, name)
            setattr(holder, name, value)
        r = _call(request)
        assert not r.continued, (step, name)
        if isinstance(holder, dict):
            holder[name] = original
        else:
            setattr(holder, name, original)
        assert _call(request).continued, (step, name)  # put back: the same as it was


def test_the_shapes_benchmark_times_continued_calls() -> None:
    """benchmarks/compact_shapes.py measures continuations, in every shape (a harness
    timing the full path by mistake would report a figure for the wrong thing)."""
    from benchmarks import compact_shapes

    for fmt in ("openai", "anthropic", "responses"):
        shapes = [s for s in SHAPES if s.format == fmt]
        arms = compact_shapes.measure(shapes, 120, 2)
        assert [a.session.shape for a in arms] == shapes
        for arm in arms:
            assert arm.continued == len(arm.times) == len(arm.floors) == 2, arm.session.shape
            assert all(f > 0 for f in arm.floors)


def test_the_shapes_benchmark_floors_the_same_strings_in_every_shape() -> None:
    """The floor of a batch encodes the same strings whatever holds them: a dict, an SDK
    object, or a dict holding SDK objects (an Anthropic reply's content blocks, whose
    texts and tool inputs the floor once skipped, making that shape's ratio look worse)."""
    from benchmarks.compact_shapes import batch_texts

    for fmt in ("openai", "anthropic", "responses"):
        shapes = [s for s in SHAPES if s.format == fmt]
        sessions = [_session(shape) for shape in shapes]
        batches = [s.messages[s.ends[8] : s.ends[12]] for s in sessions]
        texts = [sorted(batch_texts(batch)) for batch in batches]
        assert all(t == texts[0] for t in texts), fmt
