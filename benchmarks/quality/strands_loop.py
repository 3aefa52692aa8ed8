"""A quality session replayed through Strands' own event loop (issue 35 item 3).

Strands' ``ContextOffloader`` acts on ``AfterToolCallEvent``, which fires only when
Strands runs a tool itself; the message-by-message peers of :mod:`benchmarks.quality.replay`
never run one. Here each recorded turn is ``agent(user message)`` on a real
``strands.Agent``: its model is the replay model (the recorded replies, in order, as
Strands stream events), its tools answer with the recorded outputs, and its
conversation manager is ``SlidingWindowConversationManager`` on overflow (the model
refuses a request over the window, as a provider does, and Strands reduces and
retries). At each model call the request Strands sends is judged (``locate()``) and
billed as the other subjects' are. The offloader's retrieval tool is offered but never
called: the replay model asks only Normandy's ``recall`` for what it cannot see. What
a retrieval could have given is counted apart (:attr:`_Judge.stored`): a missing fact
that lies in a result offloaded earlier whose reference the request still carries
(eviction aside: Strands' storage drops what was not read for 20 cycles).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.adapters_strands import streaming_model
from benchmarks.quality.replay import (
    COUNTER,
    RESERVED,
    Billing,
    NeedResult,
    Run,
    Subject,
    _fixed,
    _has_task,
    _needs_by_call,
    from_strands,
    locate,
)
from benchmarks.quality.sessions import QualitySession, Turn
from normandy_core import get_counter

__all__ = ["OFFLOAD_SUBJECTS", "OFFLOAD_TOKENS", "PREVIEW_SHARE", "replay_strands_loop"]

#: The offload bound both offloaders are measured at (tokens), and the preview's share
#: of it: Strands' ``auto`` truncates over 1,500 tokens to 750; the quality sessions'
#: outputs are 500 tokens at the median, 1,600 at most, so 500 is where offloading acts.
OFFLOAD_TOKENS = 500
PREVIEW_SHARE = 0.3
#: The subjects of ``--offload``: ours in Normandy's loop (recall off and on; alone, and
#: in front of window_manager, the clearing at its default trigger, 0.8 of the usable
#: window), Strands' loop without and with its offloader, at the same bound and share.
OFFLOAD_SUBJECTS = [
    Subject(
        f"clear_tool_results offload_tokens={OFFLOAD_TOKENS}",
        "clear_tool_results",
        {"offload_tokens": OFFLOAD_TOKENS, "offload_preview": PREVIEW_SHARE},
    ),
    Subject(
        f"pipeline clear_tool_results(offload_tokens={OFFLOAD_TOKENS}) -> window_manager",
        "pipeline",
        {
            "steps": [
                {
                    "compactor": "clear_tool_results",
                    "opts": {
                        "counter": COUNTER,
                        "offload_tokens": OFFLOAD_TOKENS,
                        "offload_preview": PREVIEW_SHARE,
                    },
                },
                {"compactor": "window_manager", "opts": {"counter": COUNTER}},
            ]
        },
    ),
    Subject("Strands loop, SlidingWindowConversationManager on overflow", peer="strands-loop"),
    Subject(
        f"Strands loop + ContextOffloader({OFFLOAD_TOKENS}, preview "
        f"{int(PREVIEW_SHARE * OFFLOAD_TOKENS)})",
        peer="strands-loop-offloader",
    ),
]


def _events(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A recorded reply as the stream events a Strands model yields."""
    out: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
    uses = False
    for b in blocks:
        kind = b.get("type")
        if kind == "text":
            out.append({"contentBlockDelta": {"delta": {"text": b["text"]}}})
        elif kind == "thinking":
            r = {"text": b["thinking"], "signature": b.get("signature", "")}
            out.append({"contentBlockDelta": {"delta": {"reasoningContent": {"text": r["text"]}}}})
            out.append(
                {
                    "contentBlockDelta": {
                        "delta": {"reasoningContent": {"signature": r["signature"]}}
                    }
                }
            )
        elif kind == "tool_use":
            uses = True
            start = {"toolUse": {"toolUseId": b["id"], "name": b["name"]}}
            out.append({"contentBlockStart": {"start": start}})
            delta = {"toolUse": {"input": json.dumps(b.get("input") or {})}}
            out.append({"contentBlockDelta": {"delta": delta}})
        else:
            continue
        out.append({"contentBlockStop": {}})
    out.append({"messageStop": {"stopReason": "tool_use" if uses else "end_turn"}})
    return out


class _Judge:
    """What the replay model does at each request: refuse it over the window (Strands then
    reduces and retries), else judge the needs of this call and bill it."""

    def __init__(self, session: QualitySession, run: Run, window: int) -> None:
        self.session, self.run, self.window = session, run, window
        self.needs = _needs_by_call(session)
        self.task = session.turns[0].user
        self.t = self.c = 0
        self._seen: dict[int, tuple[Any, Any, Any]] = {}
        #: What the offloader stored, by reference (filled by :func:`_recording`).
        self.offloaded: dict[str, str] = {}
        #: Missing needs whose fact an offloaded result the request names holds.
        self.stored = 0

    def entries(self, messages: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The messages as entries, each converted once while its content is the same."""
        out = []
        for m in messages:
            hit = self._seen.get(id(m))
            if hit is None or hit[0] is not m or hit[1] is not m["content"]:
                hit = self._seen[id(m)] = (m, m["content"], from_strands(m))
            out.append(hit[2])
        return out

    def request(self, messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """The recorded reply of this call, or the provider's refusal."""
        from strands.types.exceptions import ContextWindowOverflowException

        run = self.run
        view = self.entries(messages)
        if run.billing.size(view) > self.window - RESERVED:
            run.compactions += 1
            raise ContextWindowOverflowException("the request is over the window")
        for need in self.needs.get((self.t, self.c), ()):
            fact = self.session.fact(need.fact).text
            where = locate(fact, self.session.system, view)
            run.results.append(NeedResult(need, where))
            if where == "missing" and self.offloaded:
                self.stored += self._named(fact, view)
        total = run.billing.request(view)
        run.over_window += total > self.window
        run.task_missing += not _has_task(self.task, view)
        reply = self.session.turns[self.t].replies[self.c]
        self.c += 1
        return reply

    def _named(self, fact: str, view: Sequence[Any]) -> bool:
        """Whether a result holding ``fact`` was offloaded under a reference ``view`` shows."""
        refs = [r for r, text in self.offloaded.items() if fact in text]
        return any(r in e.text() for r in refs for e in view)


def _recording(judge: _Judge) -> Any:
    """Strands' in-memory storage, noting each text it stores for the judge."""
    from strands.vended_plugins.context_offloader import InMemoryStorage

    class Recording(InMemoryStorage):
        async def store(self, key: str, content: bytes, content_type: str = "text/plain") -> str:
            ref = await super().store(key, content, content_type)
            judge.offloaded[ref] = content.decode("utf-8", errors="replace")
            return ref

    return Recording()


def _model(judge: _Judge) -> Any:
    """The benchmark's replay model as a Strands model."""
    return streaming_model(lambda messages: _events(judge.request(messages)))


def _tools(session: QualitySession, turn: list[Turn]) -> list[Any]:
    """The session's tools, answering with the current turn's recorded outputs by call id."""
    from strands.tools.tools import PythonAgentTool

    def answer(tool_use: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        rec = next(o for o in turn[0].outputs if o["tool_use_id"] == tool_use["toolUseId"])
        status = "error" if rec.get("is_error") else "success"
        return {
            "toolUseId": tool_use["toolUseId"],
            "status": status,
            "content": [{"text": str(rec["content"])}],
        }

    out = []
    for spec in session.tools:
        schema = {"json": spec.get("input_schema", {"type": "object"})}
        strands_spec = {
            "name": spec["name"],
            "description": spec.get("description", ""),
            "inputSchema": schema,
        }
        out.append(PythonAgentTool(spec["name"], strands_spec, answer))  # type: ignore[arg-type]
    return out


def replay_strands_loop(session: QualitySession, label: str, window: int, *, offload: bool) -> Run:
    """Replay ``session`` through a real Strands agent at ``window`` tokens, with
    ``ContextOffloader`` (over :data:`OFFLOAD_TOKENS`, previews of
    :data:`PREVIEW_SHARE` of it) when ``offload``."""
    from strands import Agent
    from strands.agent.conversation_manager import SlidingWindowConversationManager
    from strands.vended_plugins.context_offloader import ContextOffloader

    counter = get_counter(COUNTER)
    run = Run(session.name, label, window, False, Billing(counter, _fixed(counter, session, False)))
    judge = _Judge(session, run, window)
    current: list[Turn] = [session.turns[0]]
    plugins = []
    if offload:
        preview = int(PREVIEW_SHARE * OFFLOAD_TOKENS)
        storage = _recording(judge)
        plugins.append(ContextOffloader(storage, OFFLOAD_TOKENS, preview, evict_after_cycles=None))
    agent = Agent(
        model=_model(judge),
        system_prompt=session.system,
        tools=_tools(session, current),
        conversation_manager=SlidingWindowConversationManager(
            window_size=1_000_000, should_truncate_results=False
        ),
        plugins=plugins,
        callback_handler=None,
    )
    for t, turn in enumerate(session.turns):
        judge.t, judge.c, current[0] = t, 0, turn
        asyncio.run(agent.invoke_async(turn.user))
    if offload:  # beside the progress lines: the tables have no column for it
        print(
            f"  {session.name[:40]:40} {window:>7,} {label[:46]:46} missing facts in its "
            f"storage under a reference the request shows: {judge.stored}",
            file=sys.stderr,
        )
    return run
