"""The quality benchmark's framework peers (issue 37): Strands Agents, LlamaIndex and Google
ADK, each through the real framework objects, Normandy's adapter beside the framework's
own manager.

Each subject is a ``fit(new_entries) -> (view, reductions)`` closure, as the other peers
of :mod:`benchmarks.quality.replay`: the messages new since the last model call are
converted to the framework's objects (by the converters of ``benchmarks.peers`` and
``benchmarks.adapters_*``), given to the framework as it gets them in a run, and what the
framework would send is led back to the session's entries, so the same ``locate()`` judge
and billing apply. A message the framework created (a marker, a summary) becomes an entry
marked as inserted: a fact found only there counts as available *in a summary*.

Every subject has the peers' window: the messages may take ``window - RESERVED - fixed``
tokens (``fixed``: the system prompt and tool definitions, which the request sends
beside them). Normandy's adapters get ``window - fixed`` with window_manager's default
reserve (4,096 tokens, :data:`~benchmarks.quality.replay.RESERVED`); the frameworks'
token limits get the messages' budget itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.peers import Checker, group_kept
from normandy_core import Entry, ThinkingBlock
from normandy_core.conversation.keys import MARKER_KEY
from normandy_core.conversation.tokens import TokenCounter
from normandy_core.transcripts.chat import to_openai

__all__ = ["FRAMEWORK_PEERS", "Fit", "framework_fit"]

#: ``(entries new since the last call) -> (what the request carries, reductions)``.
Fit = Callable[[list[Entry]], tuple[list[Entry], int]]
#: Where one framework object came from: the entry and, for one tool result, its call id.
Origin = list[tuple[Entry, str | None]]

#: Peer name -> subject label, in the order the subjects run.
FRAMEWORK_PEERS: dict[str, str] = {
    "strands-normandy": "Strands NormandyConversationManager (window_manager)",
    "strands-summarizing": "Strands SummarizingConversationManager (scripted summarizer)",
    "llamaindex-normandy": "LlamaIndex NormandyMemory (window_manager)",
    "llamaindex-memory": "LlamaIndex Memory (token_limit)",
    "llamaindex-buffer": "LlamaIndex ChatMemoryBuffer (token_limit)",
    "adk-normandy": "ADK normandy-adk ContentsCompactor (window_manager, as the plugin)",
    "adk-filter": "ADK ContextFilterPlugin (num_invocations_to_keep=1)",
    "adk-events": "ADK EventsCompactionConfig (scripted summarizer)",
}


class _Origins:
    """Framework objects -> the entries they stand for (each object held, so its ``id``
    is never reused while it is looked up)."""

    def __init__(self) -> None:
        self.of: dict[int, tuple[Any, Origin]] = {}

    def note(self, obj: Any, origin: Origin) -> None:
        """Record that ``obj`` stands for ``origin``."""
        self.of[id(obj)] = (obj, origin)

    def entries(self, view: Sequence[Any], created: Callable[[Any], Entry]) -> list[Entry]:
        """The entries ``view`` carries; an object the framework made becomes
        ``created(obj)``, marked as inserted."""
        out: list[Entry] = []
        run: Origin = []
        for obj in view:
            hit = self.of.get(id(obj))
            if hit is not None and hit[0] is obj:
                run += hit[1]
                continue
            out += Checker.entries(group_kept(run))
            run = []
            made = created(obj)
            out.append(made.model_copy(update={"metadata": {**made.metadata, MARKER_KEY: True}}))
        return out + Checker.entries(group_kept(run))


def _chat(entries: Sequence[Entry]) -> tuple[list[dict[str, Any]], Origin]:
    """The entries as Chat Completions dicts (the input of the LlamaIndex and ADK
    converters), with the entry (and result) each dict comes from: the entry without its
    thinking, which Chat Completions messages do not carry (so the judge and the billing
    see what the framework sends)."""
    dicts: list[dict[str, Any]] = []
    origin: Origin = []
    for e in entries:
        sent = e
        if not isinstance(e.content, str) and any(isinstance(b, ThinkingBlock) for b in e.blocks):
            kept = tuple(b for b in e.blocks if not isinstance(b, ThinkingBlock))
            sent = e.model_copy(update={"content": kept})
        for d in to_openai([e]):
            dicts.append(d)
            origin.append((sent, str(d["tool_call_id"]) if d["role"] == "tool" else None))
    return dicts, origin


def _text_entry(role: str, text: str) -> Entry:
    return Entry(
        id="made", role="assistant" if role in ("assistant", "model") else "user", content=text
    )


# -- Strands ------------------------------------------------------------------------------------


def _strands(manager: Any, manage: Callable[[Any], int]) -> Fit:
    """A real Strands agent holding the messages from call to call; before each model
    call the new ones are appended and ``manage(agent)`` changes them in place."""
    from benchmarks.adapters_strands import scripted_agent
    from benchmarks.peers import strands_convert
    from benchmarks.quality.replay import from_strands

    agent = scripted_agent(manager)
    origins = _Origins()

    def fit(new: list[Entry]) -> tuple[list[Entry], int]:
        msgs, back = strands_convert(new)
        for m in msgs:
            origins.note(m, [(back[id(m)], None)])
        agent.messages.extend(msgs)
        reductions = manage(agent)
        return origins.entries(agent.messages, from_strands), reductions

    return fit


def _strands_overflow(budget: int, counter: TokenCounter, manager: Any) -> Fit:
    """Strands' overflow path, as the sliding-window peer's: ``reduce_context`` with the
    provider's refusal (stood in for by the exact count over ``budget``) until it fits."""
    from strands.types.exceptions import ContextWindowOverflowException

    from benchmarks.quality.replay import from_strands

    sizes: dict[int, tuple[Any, Any, int]] = {}

    def size(messages: list[Any]) -> int:
        total = 0
        for m in messages:
            hit = sizes.get(id(m))
            if hit is None or hit[0] is not m or hit[1] is not m["content"]:
                hit = sizes[id(m)] = (m, m["content"], counter.count_entry(from_strands(m)))
            total += hit[2]
        return total

    def manage(agent: Any) -> int:
        reductions = 0
        while size(agent.messages) > budget:
            was = size(agent.messages)
            try:
                manager.reduce_context(agent, e=ContextWindowOverflowException("too long"))
            except ContextWindowOverflowException:  # nothing left to summarize
                break
            if size(agent.messages) >= was:
                break
            reductions += 1
        return reductions

    return _strands(manager, manage)


def _strands_summarizing(budget: int, counter: TokenCounter) -> Fit:
    from strands.agent.conversation_manager import SummarizingConversationManager

    return _strands_overflow(budget, counter, SummarizingConversationManager())


def _strands_normandy(window: int) -> Fit:
    from benchmarks.quality.replay import COUNTER
    from normandy_strands import NormandyConversationManager

    manager = NormandyConversationManager("window_manager", {"counter": COUNTER}, window=window)
    return _strands(manager, lambda agent: int(manager.compact_agent(agent).compacted))


# -- LlamaIndex -------------------------------------------------------------------------------


def _llamaindex(step: Callable[[list[Any]], list[Any]]) -> Fit:
    """A LlamaIndex memory given the new messages, read before the call (``step``)."""
    from benchmarks.adapters_llamaindex import to_llamaindex

    origins = _Origins()
    state = {"size": 0}

    def fit(new: list[Entry]) -> tuple[list[Entry], int]:
        dicts, origin = _chat(new)
        conv = to_llamaindex(dicts)
        for obj, sources in zip(conv.objects, conv.sources, strict=True):
            origins.note(obj, [origin[j] for j in sources])
        state["size"] += len(conv.objects)
        view = step(conv.objects)
        return origins.entries(view, lambda m: _text_entry(m.role.value, m.content or "")), int(
            len(view) < state["size"]
        )

    return fit


def _put_get(memory: Any, new: list[Any]) -> list[Any]:
    """Put the new messages in a synchronous memory and read it, as an agent step does."""
    memory.put_messages(new)
    return list(memory.get())


def _llamaindex_memory(kind: str, window: int, budget: int) -> Fit:
    from llama_index.core.memory import ChatMemoryBuffer, Memory

    from benchmarks.adapters_llamaindex import message_key
    from benchmarks.quality.replay import COUNTER
    from normandy_llamaindex import NormandyMemory

    if kind == "normandy":
        ours = NormandyMemory.from_compactor("window_manager", {"counter": COUNTER}, window=window)
        return _llamaindex(lambda new: _put_get(ours, new))
    if kind == "buffer":
        buffer = ChatMemoryBuffer.from_defaults(token_limit=budget)
        return _llamaindex(lambda new: _put_get(buffer, new))
    loop = asyncio.new_event_loop()
    memory = Memory.from_defaults(token_limit=budget)
    originals: dict[tuple[str, ...], Any] = {}

    def fifo(new: list[Any]) -> list[Any]:
        # Memory stores copies in SQLite: led back to the session's objects by content
        originals.update((message_key(m), m) for m in new)
        loop.run_until_complete(memory.aput_messages(new))
        got = loop.run_until_complete(memory.aget())
        return [originals.get(message_key(m), m) for m in got]

    return _llamaindex(fifo)


# -- Google ADK --------------------------------------------------------------------------------


def _adk(step: Callable[[list[Any], list[Any]], list[Any]]) -> Fit:
    """An ADK step given the whole history and the new contents (``step(history, new)``,
    as ``benchmarks.adapters_adk`` runs them), its output the session's own contents."""
    from benchmarks.adapters_adk import to_adk

    origins = _Origins()
    history: list[Any] = []

    def created(c: Any) -> Entry:
        return _text_entry(c.role or "user", "\n".join(p.text or "" for p in c.parts or []))

    def fit(new: list[Entry]) -> tuple[list[Entry], int]:
        dicts, origin = _chat(new)
        conv = to_adk(dicts)
        for obj, sources in zip(conv.objects, conv.sources, strict=True):
            origins.note(obj, [origin[j] for j in sources])
        history.extend(conv.objects)
        view = step(list(history), conv.objects)
        return origins.entries(view, created), int(len(view) != len(history))

    return fit


def _adk_subject(kind: str, window: int, budget: int) -> Fit:
    from google.adk.models.llm_request import LlmRequest
    from google.adk.plugins.context_filter_plugin import ContextFilterPlugin

    from benchmarks.adapters_adk import events_compaction, given_copies
    from benchmarks.quality.replay import COUNTER
    from normandy_adk import ContentsCompactor

    loop = asyncio.new_event_loop()
    if kind == "events":
        return _adk(events_compaction(loop, budget))
    if kind == "normandy":
        ours = ContentsCompactor("window_manager", {"counter": COUNTER}, window=window)
        return _adk(given_copies(lambda c: ours.run(c, session="quality").contents))
    keep_one = ContextFilterPlugin(num_invocations_to_keep=1)

    def filtered(contents: list[Any]) -> list[Any]:
        req = LlmRequest(contents=contents)
        callback = keep_one.before_model_callback(callback_context=None, llm_request=req)  # type: ignore[arg-type]
        loop.run_until_complete(callback)
        return req.contents

    return _adk(given_copies(filtered))


def framework_fit(peer: str, window: int, counter: TokenCounter, fixed: int, budget: int) -> Fit:
    """The fit closure of the framework peer ``peer`` (a key of :data:`FRAMEWORK_PEERS`)
    at ``window`` (``fixed``: tokens sent beside the messages; ``budget``: what the
    messages may take)."""
    builders: Mapping[str, Callable[[], Fit]] = {
        "strands-normandy": lambda: _strands_normandy(window - fixed),
        "strands-summarizing": lambda: _strands_summarizing(budget, counter),
        "llamaindex-normandy": lambda: _llamaindex_memory("normandy", window - fixed, budget),
        "llamaindex-memory": lambda: _llamaindex_memory("memory", window - fixed, budget),
        "llamaindex-buffer": lambda: _llamaindex_memory("buffer", window - fixed, budget),
        "adk-normandy": lambda: _adk_subject("normandy", window - fixed, budget),
        "adk-filter": lambda: _adk_subject("filter", window - fixed, budget),
        "adk-events": lambda: _adk_subject("events", window - fixed, budget),
    }
    return builders[peer]()
