"""Strands Agents' arms of section 12 (:mod:`benchmarks.adapters`): the session in Strands'
own messages, Normandy's conversation manager against Strands' built-in managers.

* **normandy-strands**: ``NormandyConversationManager.compact_agent``, what the
  manager runs before every model call, on the messages the last call left plus what is
  new (it compacts ``agent.messages`` in place).
* **SlidingWindowConversationManager** as Strands ships it (``window_size=40``
  messages), applied before every call (``per_turn=True``): a message-count cut.
* **SlidingWindowConversationManager on overflow**: what Strands does when the provider
  refuses a request as too long, ``reduce_context(agent, e)`` and a retry, until the
  request fits (tool-result truncation off: it rewrites messages in place, which this
  harness cannot count). The refusal is stood in for by the exact cl100k count of the
  request, inside the timer.
* **ContextOffloader, SlidingWindowConversationManager on overflow**: Strands' offloader
  (results over :data:`OFFLOAD_TOKENS` stored in its ``InMemoryStorage``, a preview of
  :data:`OFFLOAD_PREVIEW` tokens left) on the agent: each new tool result goes through the
  agent's ``AfterToolCallEvent`` callbacks, as Strands' tool executor fires them, before
  it is appended; then the overflow path above. Its requests are judged over the window
  by the exact count of what they carry (the previews), not of the originals.
* **SummarizingConversationManager on overflow**, its model a scripted summarizer
  (:class:`ScriptedSummarizer`, no network; a real one adds a model call per
  summary), with the same refusal stand-in.

Each arm runs in a real ``strands.Agent`` (its model scripted) whose ``messages`` the
managers change, as in a run. The judge is the adapter tests' own check
(``strands_scripted.pairing_problems``): an orphaned ``toolResult``, an unanswered
``toolUse``, or two messages of one role in a row (Bedrock's Converse API refuses all
three).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.adapters import OPTS, WINDOW, Converted, Message, Subject
from benchmarks.common import raw_encoding
from normandy_core.conversation.tokens import MESSAGE_OVERHEAD

__all__ = ["strands_problems", "strands_subjects", "to_strands"]

_ROOT = Path(__file__).resolve().parents[1]
# the adapter tests' pairing check, as the adapter's own tests apply it
sys.path.insert(0, str(_ROOT / "plugins" / "normandy-strands" / "tests"))

#: Messages kept by Strands' default sliding window.
SLIDING_WINDOW = 40
#: The offloader's bound and preview (tokens), as the quality benchmark's (section 27).
OFFLOAD_TOKENS = 500
OFFLOAD_PREVIEW = 150


def to_strands(messages: Sequence[Message]) -> Converted:
    """The Chat Completions session as Strands messages: a tool batch's results in one
    user message (as Strands appends them), system prompts folded into the next user
    message's text (Strands keeps its system prompt outside the messages)."""
    conv = Converted([], [])
    pending: list[int] = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            pending.append(i)
            continue
        if role == "tool":
            block = {
                "toolResult": {
                    "toolUseId": m["tool_call_id"],
                    "status": "success",
                    "content": [{"text": m["content"]}],
                }
            }
            last = conv.objects[-1] if conv.objects else None
            if last is not None and last["role"] == "user" and "toolResult" in last["content"][-1]:
                last["content"].append(block)
                conv.sources[-1].append(i)
            else:
                conv.objects.append({"role": "user", "content": [block]})
                conv.sources.append([i])
        elif role == "user":
            texts = [{"text": messages[j]["content"]} for j in pending]
            conv.objects.append({"role": "user", "content": [*texts, {"text": m["content"]}]})
            conv.sources.append([*pending, i])
            pending = []
        else:
            content: list[dict[str, Any]] = [{"text": m["content"]}] if m.get("content") else []
            for c in m.get("tool_calls") or []:
                use = {
                    "toolUseId": c["id"],
                    "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"] or "{}"),
                }
                content.append({"toolUse": use})
            conv.objects.append({"role": "assistant", "content": content})
            conv.sources.append([i])
        conv.count_at[i + 1] = len(conv.objects)
    return conv


def streaming_model(events: Callable[[Any], Iterable[Mapping[str, Any]]]) -> Any:
    """A Strands model (the benchmarks' only fake) that streams ``events(messages)``, the
    Strands stream events of its answer, for every request."""
    from strands.models import Model

    class Streaming(Model):
        def update_config(self, **model_config: Any) -> None:
            pass

        def get_config(self) -> Any:
            return {}

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("not scripted")

        async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
            for event in events(messages):
                yield event

    return Streaming()


def _scripted_model(text: str) -> Any:
    """A Strands model that answers every request with ``text``."""
    reply: list[Mapping[str, Any]] = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"delta": {"text": text}}},
        {"contentBlockStop": {}},
        {"messageStop": {"stopReason": "end_turn"}},
    ]
    return streaming_model(lambda _messages: reply)


def scripted_agent(manager: Any) -> Any:
    """A real ``strands.Agent`` with ``manager``, its model the scripted summarizer."""
    from strands import Agent

    model = _scripted_model("Summary: files were read and their contents noted.")
    return Agent(model=model, conversation_manager=manager, callback_handler=None)


def _counter() -> Callable[[list[Any]], int]:
    """The exact cl100k count of a request, as section 12's judge counts the original
    messages (text, tool names and arguments, results, and the per-message overhead for
    each original message): what stands for the provider's refusal. Each message is
    counted once while its content list is the same (a provider counts every request;
    the arms are not charged for that)."""
    enc = raw_encoding()
    seen: dict[int, tuple[Any, Any, int]] = {}

    def one(m: Mapping[str, Any]) -> int:
        texts: list[str] = []
        originals = 0
        for b in m["content"]:
            if "text" in b:
                texts.append(b["text"])
                originals = 1
            elif "toolUse" in b:
                texts += [b["toolUse"]["name"], json.dumps(b["toolUse"]["input"])]
                originals = 1
            elif "toolResult" in b:
                texts += [str(c.get("text", "")) for c in b["toolResult"]["content"]]
                originals += 1
        body = sum(len(enc.encode_ordinary(t)) for t in texts if t)
        return body + MESSAGE_OVERHEAD * max(originals, 1)

    def count(messages: list[Any]) -> int:
        total = 0
        for m in messages:
            hit = seen.get(id(m))
            if hit is None or hit[0] is not m or hit[1] is not m["content"]:
                hit = seen[id(m)] = (m, m["content"], one(m))
            total += hit[2]
        return total

    return count


def _in_agent(
    manager: Any, manage: Callable[[Any], None]
) -> Callable[[list[Any], list[Any]], list[Any]]:
    """A step run in a real agent, which keeps its messages from call to call as a run
    does: what is new is appended, then ``manage(agent)`` changes them in place."""
    agent = scripted_agent(manager)

    def step(history: list[Any], new: list[Any]) -> list[Any]:
        agent.messages.extend(new)
        manage(agent)
        return list(agent.messages)

    return step


def _on_overflow(count: Callable[[list[Any]], int]) -> Callable[[Any], None]:
    """Strands' overflow path: ``reduce_context`` with the refusal, until the request fits
    (or the manager gives up, raising, and the request goes as it is)."""
    from strands.types.exceptions import ContextWindowOverflowException

    def manage(agent: Any) -> None:
        while count(agent.messages) > WINDOW:
            try:
                agent.conversation_manager.reduce_context(
                    agent, e=ContextWindowOverflowException("too long")
                )
            except ContextWindowOverflowException:  # "unable to trim": refused again
                break

    return manage


def _offloading(manage: Callable[[Any], None]) -> Callable[[list[Any], list[Any]], list[Any]]:
    """A real agent with Strands' ``ContextOffloader``: each new tool result goes through
    the agent's ``AfterToolCallEvent`` callbacks before it is appended, then ``manage``."""
    from strands import Agent
    from strands.agent.conversation_manager import SlidingWindowConversationManager
    from strands.hooks import AfterToolCallEvent
    from strands.vended_plugins.context_offloader import ContextOffloader, InMemoryStorage

    offloader = ContextOffloader(
        InMemoryStorage(), OFFLOAD_TOKENS, OFFLOAD_PREVIEW, evict_after_cycles=None
    )
    agent = Agent(
        model=_scripted_model("Summary: files were read and their contents noted."),
        conversation_manager=SlidingWindowConversationManager(should_truncate_results=False),
        plugins=[offloader],
        callback_handler=None,
    )
    loop = asyncio.new_event_loop()
    uses: dict[str, Any] = {}

    def arrived(block: Mapping[str, Any]) -> dict[str, Any]:
        if "toolUse" in block:
            uses[block["toolUse"]["toolUseId"]] = block["toolUse"]
        if "toolResult" not in block:
            return dict(block)
        result = block["toolResult"]
        event = AfterToolCallEvent(
            agent=agent,
            selected_tool=None,
            tool_use=uses[result["toolUseId"]],
            invocation_state={},
            result=result,
        )
        loop.run_until_complete(agent.hooks.invoke_callbacks_async(event))
        return {"toolResult": event.result}

    def step(history: list[Any], new: list[Any]) -> list[Any]:
        for m in new:
            agent.messages.append(
                {"role": m["role"], "content": [arrived(b) for b in m["content"]]}
            )
        manage(agent)
        return list(agent.messages)

    return step


def strands_subjects() -> list[Subject]:
    """Normandy's manager and Strands' own, each in a real agent."""
    from strands.agent.conversation_manager import (
        SlidingWindowConversationManager,
        SummarizingConversationManager,
    )

    from normandy_strands import NormandyConversationManager

    ours = NormandyConversationManager("window_manager", OPTS, window=WINDOW)
    sliding = SlidingWindowConversationManager(window_size=SLIDING_WINDOW, per_turn=True)
    count = _counter()
    return [
        Subject(
            "normandy-strands (NormandyConversationManager)",
            _in_agent(ours, lambda agent: ours.compact_agent(agent)),
        ),
        Subject(
            f"SlidingWindowConversationManager(window_size={SLIDING_WINDOW}, per_turn=True)",
            _in_agent(sliding, lambda agent: sliding.apply_management(agent)),
        ),
        Subject(
            "SlidingWindowConversationManager, reduce_context on overflow",
            _in_agent(
                SlidingWindowConversationManager(should_truncate_results=False),
                _on_overflow(count),
            ),
        ),
        Subject(
            f"ContextOffloader({OFFLOAD_TOKENS}, preview {OFFLOAD_PREVIEW}), "
            "SlidingWindowConversationManager on overflow",
            _offloading(_on_overflow(count)),
            count=count,
        ),
        Subject(
            "SummarizingConversationManager (scripted summarizer), reduce_context on overflow",
            _in_agent(SummarizingConversationManager(), _on_overflow(count)),
        ),
    ]


def strands_problems(out: list[Any]) -> list[str]:
    """The adapter tests' check of a Strands request."""
    from strands_scripted import pairing_problems

    return pairing_problems([dict(m) for m in out if isinstance(m, Mapping)])
