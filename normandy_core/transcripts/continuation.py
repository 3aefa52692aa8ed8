"""``compact()`` before every request: a growing list is compacted as a continuation.

Users of other frameworks call :func:`normandy_core.compact` before each model request on
the list their framework holds, which has grown by one tool batch since the last call
(their full history, or the list the last call returned plus the new messages), bare or
in the request they send (Anthropic's ``system`` beside ``messages``, the Responses API's
``instructions`` beside ``input``). Reading, checking and counting the whole list every
time would cost the whole history per call.

This module remembers, per process, the last few compactions (:data:`MAX_STATES`, at most
:data:`MAX_MESSAGES` messages in all; a :class:`ContinuationMemo` given to ``compact(...,
memo=...)`` holds them instead, within its own bounds): the messages they were given
and returned, and the compacted conversation with its token counts. A call whose list
*extends* one of those lists (the same messages first, compared by content, then new
ones) reads, checks and counts only the new messages and runs the compactor on the
remembered compacted conversation plus the new entries, exactly as the turn loop does between two
boundaries. The result therefore keeps the earlier cut points (a stable prefix, which
keeps the provider's prompt cache warm), ``meta["dropped"]`` reports only what this call
newly dropped (what earlier calls dropped was reported by them), and
:attr:`~normandy_core.CompactResult.continued` is true. ``compact(...,
fresh=True)`` compacts the list from scratch instead.

A list that does not extend a remembered one (other messages, a different config, a
different format) takes the full path; nothing is ever guessed. A request continues only
a call given (or returning) a request with the same keys and the same system prompt, by
value (a private copy is kept, so blocks changed in place are noticed); its other keys
are taken from the request given. The remembered prefix is compared in C as a list
(``==``: the same objects cost one pointer comparison each), and kept messages always
come back as the caller's own objects: each message the last call returned must be the
very object the caller now holds at its position (an equal copy sends the call down the
full path, which returns the caller's objects), and its content is compared against
private copies made when it was returned (each dict, list and SDK object's fields in it,
shallow, compared part by part), so a kept message changed in place after a call also
takes the full path. (A message the conversation no longer holds cannot change the
continuation, so it only has to be equal.)
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import is_
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from normandy_core.contract import plugins
from normandy_core.contract.boundary import run_compaction
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.transcripts.detection import detect
from normandy_core.transcripts.formats import as_mapping, check_values, dumped
from normandy_core.transcripts.result import CompactResult, check_pairs, compact_result
from normandy_core.transcripts.staging import (
    Transcript,
    check_tools,
    extend,
    newest_compaction,
)
from normandy_core.transcripts.transcript import request_keys, stage, write

if TYPE_CHECKING:
    from normandy_core.contract.config import AgentConfig
    from normandy_core.conversation.memory import AgentMemory

__all__ = [
    "MAX_MESSAGES",
    "MAX_STATES",
    "ContinuationMemo",
    "clear",
    "config_key",
    "remember",
    "resume",
]

#: How many compactions the process-wide memo remembers (the most recently used are kept).
MAX_STATES = 8
#: How many messages the process-wide memo's lists may hold in all; beyond, the oldest
#: go. A memo holds references to these messages (and deep copies of the live ones), so
#: this bounds what it keeps alive; :func:`clear` releases everything.
MAX_MESSAGES = 200_000

#: A request without a system prompt (no value under its system key).
_ABSENT: Any = object()
#: The returned request's system prompt was the one the call was given.
_GIVEN: Any = object()


@dataclass(frozen=True, slots=True)
class _Request:
    """A call's input as a continuation reads it: the message list, and for a request (a
    dict) the keys it holds that list and its system prompt under."""

    data: Any  # as given: the list, or the request
    messages: list[Any]
    keys: tuple[str, str] | None  # (list key, system key); None for a bare list
    system: Any  # the value under the system key, or _ABSENT

    def wrap(self, out: list[Any], system: Any) -> Any:
        """``out`` in this call's container, the system key holding ``system`` (_GIVEN:
        as given in this call; _ABSENT: nothing), every other key as given."""
        if self.keys is None:
            return out
        list_key, system_key = self.keys
        request = dict(self.data)
        request[list_key] = out
        if system is _ABSENT:
            request.pop(system_key, None)
        elif system is not _GIVEN:
            request[system_key] = system
        return request

    def returned(self, rendered: Any) -> tuple[list[Any], Any] | None:
        """The message list of ``rendered`` (what a call given this returned) and what its
        system key held (see :meth:`system_returned`), or ``None`` when it holds none."""
        if self.keys is None:
            return (rendered, _ABSENT) if isinstance(rendered, list) else None
        if not isinstance(rendered, Mapping) or not isinstance(rendered.get(self.keys[0]), list):
            return None
        return rendered[self.keys[0]], self.system_returned(rendered)

    def system_returned(self, rendered: Any) -> Any:
        """What the system key of ``rendered`` (the request a call given this returned)
        holds: _GIVEN when it is the very value given, _ABSENT, or a private copy."""
        if self.keys is None:
            return _ABSENT
        system = rendered.get(self.keys[1], _ABSENT)
        if system is not _ABSENT and system is self.system:
            return _GIVEN
        return _snapshot(system)


def _request(data: Any) -> _Request | None:
    """``data`` as a continuation reads it, or ``None`` for a shape that cannot continue
    (a tuple, a generator, a string ``input``, a Normandy dump...)."""
    if isinstance(data, list):
        return _Request(data, data, None, _ABSENT)
    if not isinstance(data, Mapping):
        return None
    keys = request_keys(data)
    if keys is None or not isinstance(data[keys[0]], list):
        return None
    return _Request(data, data[keys[0]], keys, data.get(keys[1], _ABSENT))


def _snapshot(value: Any) -> Any:
    """A private copy of a system prompt (strings are immutable; _ABSENT is itself)."""
    if value is _ABSENT or isinstance(value, str):
        return value
    return copy.deepcopy(value)


#: Values no one can change in place.
_IMMUTABLE = (str, int, float, bytes, type(None))


@dataclass(frozen=True, slots=True)
class _Seen:
    """What one message held when a call returned it: each of its mutable parts (its
    dicts and lists, an SDK object's fields) with a shallow copy, and a private deep copy
    of any other object in it.

    Comparing the parts with their copies notices any change made in place since, part
    by part in C, without calling an SDK object's ``__eq__`` for each nested object (a
    deep copy compared whole costs about five microseconds per SDK message).
    """

    parts: list[Any]
    copies: list[Any]


def _seen(message: Any) -> _Seen:
    """The mutable parts of ``message`` and their copies (see :class:`_Seen`)."""
    parts: list[Any] = []
    copies: list[Any] = []
    visited: set[int] = set()
    stack = [message]
    while stack:
        obj = stack.pop()
        if isinstance(obj, _IMMUTABLE) or id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, tuple):
            stack.extend(obj)
        elif isinstance(obj, BaseModel):  # an SDK object: its fields live in dicts
            stack.append(obj.__dict__)
            if obj.__pydantic_extra__:
                stack.append(obj.__pydantic_extra__)
        elif isinstance(obj, (dict, list)):
            parts.append(obj)
            copies.append(obj.copy())
            stack.extend(obj.values() if isinstance(obj, dict) else obj)
        else:  # another kind of object: compared by value with a private copy
            parts.append(obj)
            copies.append(copy.deepcopy(obj))
    return _Seen(parts, copies)


def _watched(seen: Sequence[_Seen]) -> tuple[list[Any], list[Any]]:
    """The parts of several messages and their copies, each in one list."""
    return (
        list(chain.from_iterable(s.parts for s in seen)),
        list(chain.from_iterable(s.copies for s in seen)),
    )


def _unchanged(st: _State) -> bool:
    """Whether no message ``st`` returned has changed in place since."""
    try:
        parts, copies = st.watched
        return parts == copies  # each part with its copy, in C
    except Exception:  # an object whose comparison raises: treated as changed
        return False


def _same_system(expected: Any, given: Any) -> bool:
    """Whether the system prompt ``given`` is the one ``expected`` (by value)."""
    if given is expected:
        return True
    if given is _ABSENT or expected is _ABSENT:
        return False
    try:
        return bool(given == expected)
    except Exception:  # an object whose comparison raises: not the same
        return False


def _extends(st: _State, req: _Request) -> tuple[int, bool] | None:
    """How ``req`` extends what ``st`` remembers: the length of the list it extends and
    whether that is the list given (not the one returned), or ``None``."""
    messages = req.messages
    n = len(messages)
    for given, system in ((st.given, st.given_system), (st.out, st.returned_system())):
        k = len(given)
        if k == 0 or k > n or messages[k - 1] is not given[k - 1]:
            continue
        if not _same_system(system, req.system):
            continue
        if not _unchanged(st):
            return None  # a live message was changed in place since it was seen
        if given is st.out:
            if not all(map(is_, given, messages)):  # the very same objects, in C
                continue
        elif not _same_prefix(given, messages, st.out, st.out_pos):
            continue
        return k, given is st.given
    return None


@dataclass(slots=True)
class _State:
    """One remembered compaction: what continues it, and what it left."""

    key: tuple[Any, ...]
    acc: AgentConfig  # the prepared config (same session id for every continuation)
    transcript: Transcript  # sources of every entry of ``memory``, turn numbering, ids
    memory: AgentMemory  # the compacted conversation (token counts cached)
    given: list[Any]  # the messages as given; empty when continuing ``out``
    out: list[Any]  # the messages returned: the live ones
    out_pos: list[int]  # where each of ``out`` sits in ``given`` (-1: an object of ours)
    out_seen: list[_Seen]  # what each of ``out`` held when it was returned
    keys: tuple[str, str] | None  # the request's list and system keys; None: a list
    given_system: Any  # a private copy of the system prompt given (or _ABSENT)
    out_system: Any  # what the returned request's system key held: _GIVEN, _ABSENT or it
    watched: tuple[list[Any], list[Any]]  # the parts of ``out_seen`` and their copies
    size: int = 0  # messages counted against the memo's max_messages while remembered

    def returned_system(self) -> Any:
        """The system prompt a request continuing the returned list must hold."""
        return self.given_system if self.out_system is _GIVEN else self.out_system


class ContinuationMemo:
    """The compactions :func:`~normandy_core.compact` remembers to continue, least
    recently used first: at most ``max_states`` of them, holding at most ``max_messages``
    messages in all (the given and returned lists of each); safe to use from several
    threads.

    :func:`~normandy_core.compact` uses one per process (:data:`MAX_STATES`,
    :data:`MAX_MESSAGES`) unless given another with ``memo=``: a process that compacts
    many conversations at once (a proxy, a server of agents) sizes its own to them, so
    each conversation's next call still finds its last compaction. Raises
    :class:`ValueError` for a bound that is not a positive integer.
    """

    def __init__(self, max_states: int = MAX_STATES, max_messages: int = MAX_MESSAGES) -> None:
        for name, value in (("max_states", max_states), ("max_messages", max_messages)):
            # bool is an int, but True as a bound is surely a mistake
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ContinuationMemo: {name} must be a positive integer, got {value!r}"
                )
        self._max_states = max_states
        self._max_messages = max_messages
        self._lock = threading.Lock()
        self._states: OrderedDict[int, _State] = OrderedDict()
        self._messages = 0  # the sizes of the states held

    @property
    def max_states(self) -> int:
        """How many compactions it remembers at most (fixed: a memo is made to a size)."""
        return self._max_states

    @property
    def max_messages(self) -> int:
        """How many messages its remembered lists may hold in all."""
        return self._max_messages

    @property
    def messages(self) -> int:
        """How many messages the remembered lists hold in all (at most ``max_messages``)."""
        return self._messages

    def __len__(self) -> int:
        """How many compactions are remembered (at most ``max_states``)."""
        return len(self._states)

    def clear(self) -> None:
        """Forget every remembered compaction."""
        with self._lock:
            self._states.clear()
            self._messages = 0

    def put(self, st: _State) -> None:
        """Remember ``st`` (unless its lists alone are over ``max_messages``),
        forgetting the least recently used beyond the bounds."""
        size = st.size = len(st.given) + len(st.out)
        if size > self.max_messages:
            return
        with self._lock:
            self._states[id(st)] = st
            self._messages += size
            while self._states and (
                len(self._states) > self.max_states or self._messages > self.max_messages
            ):
                _, old = self._states.popitem(last=False)
                self._messages -= old.size

    def take(self, key: tuple[Any, ...], req: _Request) -> tuple[_State, int, bool] | None:
        """The remembered state ``req`` extends, removed from the memo, the length of
        the list it extends, and whether that list is the one it was given (not the one
        it returned)."""
        with self._lock:
            for sid, st in reversed(self._states.items()):
                if st.key != key or st.keys != req.keys:
                    continue
                hit = _extends(st, req)
                if hit is None:
                    continue
                del self._states[sid]
                self._messages -= st.size
                return st, *hit
        return None


#: The compactions this process remembers (``compact()`` without ``memo=``).
_states = ContinuationMemo()


def clear() -> None:
    """Forget every compaction the process-wide memo remembers."""
    _states.clear()


def _opaque(obj: Any) -> str:
    return f"<{type(obj).__qualname__} at {id(obj):#x}>"


def config_key(
    compactor: str,
    opts: Mapping[str, Any] | None,
    model: str | None,
    window: int | None,
    timeout: float | None,
    format: str,
    client: Any = None,
    survival: Any = None,
    recall: Any = None,
) -> tuple[Any, ...] | None:
    """What a continuation must share with the call it continues, or ``None`` (no memo).

    ``client`` counts by identity: a call with another client object (or none) never
    continues one made with this one. Its ``id`` cannot be reused by another object while
    the remembered state lives, since the state's config holds the client. ``survival``
    (the rules, a mapping or :class:`~normandy_core.SurvivalRules`) counts by value, its
    ``keep_if`` predicate by identity, held by the state's config the same way.
    ``recall`` (``None``, a bool or frozen :class:`~normandy_core.RecallSettings`) counts
    by value.
    """
    if survival is not None and not isinstance(survival, Mapping):
        fields = getattr(type(survival), "model_fields", None) or {}
        survival = {name: getattr(survival, name) for name in fields}
    try:
        frozen = json.dumps(opts or {}, sort_keys=True, default=_opaque)
        rules = json.dumps(survival, sort_keys=True, default=_opaque)
    except (TypeError, ValueError):
        return None
    try:
        handle = plugins.resolve_compactor(compactor)
    except Exception:  # an unknown or broken compactor: the full path reports it
        return None
    return (
        compactor,
        frozen,
        rules,
        model,
        window,
        timeout,
        format,
        recall,
        plugins.generation(),  # a reload of the plugins starts afresh
        id(handle),
        id(client),
    )


def _same_prefix(given: list[Any], messages: list[Any], out: list[Any], out_pos: list[int]) -> bool:
    """Whether ``messages`` starts with ``given`` and holds the very objects of ``out`` at
    their positions; on success ``given`` is extended to equal ``messages``.

    Two lists of one length compare in C without touching their messages where they are
    the same objects (one pointer comparison each; an equal copy is compared by value), so
    ``given`` is extended by the new messages and compared whole: slicing ``messages``
    or copying it would touch every message of the history (a cache miss each, about a
    millisecond per 10,000 messages), and the extended list is the next call's ``given``.
    """
    k = len(given)
    given.extend(messages[k:])
    try:
        same = given == messages
    except Exception:  # an object whose comparison raises: not a continuation
        same = False
    if same and all(p < 0 or messages[p] is m for p, m in zip(out_pos, out, strict=True)):
        return True
    del given[k:]
    return False


def _positions(out: Sequence[Any], known: Mapping[int, int]) -> list[int]:
    """Where each of ``out`` sits in the caller's list (``known``: id to position)."""
    return [known.get(id(m), -1) for m in out]


def remember(
    key: tuple[Any, ...] | None,
    acc: AgentConfig,
    t: Transcript,
    memory: AgentMemory,
    given: Any,
    out: Any,
    memo: ContinuationMemo | None = None,
) -> None:
    """Remember a compaction of ``given`` (a list, or a request holding one) that
    returned ``out``, in ``memo`` (``None``: the process-wide one)."""
    req = _request(given) if key is not None else None
    if key is None or req is None or t.container is not req.data:
        return
    returned = req.returned(out)
    if returned is None:
        return
    out_list, out_system = returned
    try:
        out_seen = [_seen(m) for m in out_list]
        given_system = _snapshot(req.system)
    except Exception:  # an object that cannot be copied: no memo for it
        return
    known = {id(m): i for i, m in enumerate(req.messages)}
    pos = _positions(out_list, known)
    (_states if memo is None else memo).put(
        _State(
            key,
            acc,
            t,
            memory.copy(),
            list(req.messages),
            list(out_list),
            pos,
            out_seen,
            req.keys,
            given_system,
            out_system,
            _watched(out_seen),
        )
    )


def _tail_merges(t: Transcript, first: Any, full: bool, head: str | None) -> bool:
    """Whether the first new message would join the entry of the last remembered one.

    The transcript noted the staged role of the last message it read (``t.tail``), so
    that message is not read again (an SDK object would be converted again). It is the
    last remembered one when the call extends the list given last time (``full``), or
    when the conversation still ends with its entry (``head``); otherwise (a compactor
    dropped the newest entry) the answer is yes, which compacts the list from scratch.
    """
    if t.format == "anthropic":
        return False
    if t.tail is None or not (full or head == t.tail[0]):
        return True
    first_message = as_mapping(first, None, None)
    if t.format == "openai":
        return t.tail[1] == "tool" and first_message.get("role") == "tool"
    side = _responses_side(first_message)
    return side != "input" and side == _TAIL_SIDES.get(t.tail[1])


#: The Responses side (see :func:`_responses_side`) of each staged role that joins.
_TAIL_SIDES = {"assistant": "model", "tool": "outputs"}


def _responses_side(item: Mapping[str, Any]) -> str:
    """Which entry a Responses item joins: its own (``input``), the model-side run or the
    outputs run."""
    kind = item.get("type") or "message"
    if kind == "message":
        return "model" if item.get("role") == "assistant" else "input"
    if kind.endswith("_output") or kind == "mcp_approval_response":  # outputs side
        return "outputs"
    return "model"


def resume(
    key: tuple[Any, ...] | None,
    data: Any,
    mid_round: bool,
    *,
    force: bool = False,
    focus: str | None = None,
    memo: ContinuationMemo | None = None,
) -> CompactResult | None:
    """The result of compacting ``data`` (a list, or a request holding one) as a
    continuation of a compaction ``memo`` remembers (``None``: the process-wide one), or
    ``None`` (full path); ``force`` and ``focus`` as
    :func:`~normandy_core.run_compaction` takes them.

    Raises :class:`~normandy_core.TranscriptError` for bad new messages, naming their
    position in the message list.
    """
    memo = _states if memo is None else memo
    if key is None or not memo:
        return None
    req = _request(data)
    if req is None:
        return None
    hit = memo.take(key, req)
    if hit is None:
        return None
    st, k, full = hit
    messages = req.messages
    new = messages[k:]
    if new and _tail_merges(st.transcript, new[0], full, st.memory.head):
        return None
    asked = {"mid_round": mid_round, "force": force, "focus": focus}
    return _continue(memo, st, req, k, new, full, asked)


def _continue(
    memo: ContinuationMemo,
    st: _State,
    req: _Request,
    k: int,
    new: list[Any],
    full: bool,
    asked: dict[str, Any],
) -> CompactResult | None:
    """Compact ``req``, the remembered list of ``st`` (its first ``k``) and ``new``, and
    remember the result in ``memo``; ``full``: they extend the list given last time, not
    the one returned. ``None`` when the new messages are of another format. ``asked``:
    the boundary's arguments (``mid_round``, ``force``, ``focus``)."""
    memory = _grown_memory(st, new, k)
    if memory is None:
        return None
    t = st.transcript
    t.container = req.data
    if t.system is not None and (full or st.out_system is _GIVEN):
        t.system = req.system  # equal to the one read: the caller's own object comes back
    new_acc, meta = run_compaction(st.acc.with_memory(memory), **asked)
    compacted = bool(meta.get("compacted"))
    if compacted:
        check_pairs(st.acc, new_acc.memory)
        kept = new_acc.memory
        rendered = write(t, kept)  # in the container's shape
        out = rendered if req.keys is None else rendered[req.keys[0]]
        out_system = req.system_returned(rendered)
    else:
        kept = memory
        out, out_system = [*st.out, *new], st.out_system
        rendered = req.wrap(out, out_system)
    _prune_sources(t, kept)
    result = compact_result(st.acc, rendered, meta, t.format, kept, continued=True)
    memo.put(_next_state(st, kept, (out, out_system), new, k, compacted=compacted, full=full))
    return result


def _grown_memory(st: _State, new: list[Any], k: int) -> AgentMemory | None:
    """The remembered conversation of ``st`` with the messages ``new`` (numbered from
    ``k``) read onto it, or ``None`` when they are evidence of another format."""
    if not new:
        return st.memory.copy()
    t = st.transcript
    looked = [dumped(m) for m in new]  # an SDK object dumped once for both checks
    check_values(looked, k)
    fmt = detect(looked, prefer=t.format)
    if fmt != t.format and fmt != "openai":  # evidence of another format
        return None
    staged = list(stage(t.format, new, k))
    t.pending = check_tools(staged, True, t.seen, t.pending)
    newest = newest_compaction(staged)
    if newest < 0:
        memory = st.memory.copy()
    else:  # a newer provider compaction: the pin moves to it
        memory = st.memory.derive(
            e.model_copy(update={"pinned": False})
            if e.pinned and e.metadata.get(PROVIDER_COMPACTION_KEY)
            else e
            for e in st.memory
        )
    extend(t, memory, staged, pin=newest)
    return memory


def _next_state(
    st: _State,
    kept: AgentMemory,
    returned: tuple[list[Any], Any],
    new: list[Any],
    k: int,
    *,
    compacted: bool,
    full: bool,
) -> _State:
    """What continues the call that continued ``st`` with ``new`` and returned
    ``returned`` (its message list, and what its system key held: see ``_State``)."""
    out, out_system = returned
    fresh = [_seen(m) for m in new]
    if compacted:
        seen = {id(m): s for m, s in zip(st.out, st.out_seen, strict=True)}
        seen.update({id(m): s for m, s in zip(new, fresh, strict=True)})
        out_seen = [seen[id(m)] if id(m) in seen else _seen(m) for m in out]
        watched = _watched(out_seen)
    else:
        out_seen = [*st.out_seen, *fresh]
        parts, copies = _watched(fresh)
        watched = (st.watched[0] + parts, st.watched[1] + copies)
    if full:  # the caller keeps its whole history: remember where the live messages sit
        given = st.given  # extended to equal the caller's list by the prefix check
        if compacted:
            known = {id(m): p for m, p in zip(st.out, st.out_pos, strict=True)}
            known.update({id(m): k + j for j, m in enumerate(new)})
            out_pos = _positions(out, known)
        else:
            out_pos = [*st.out_pos, *range(k, k + len(new))]
    else:  # continued from the list returned: matched by identity against ``out``
        given, out_pos = [], [-1] * len(out)
    return _State(
        st.key,
        st.acc,
        st.transcript,
        kept.copy(),
        given,
        list(out),
        out_pos,
        out_seen,
        st.keys,
        st.given_system,
        out_system,
        watched,
    )


def _prune_sources(t: Transcript, memory: AgentMemory) -> None:
    """Keep the sources of live entries only, so the memo holds what the output needs."""
    if len(t.sources) > 4 * len(memory) + 1024:
        live = {e.id for e in memory}
        t.sources = {eid: s for eid, s in t.sources.items() if eid in live}
