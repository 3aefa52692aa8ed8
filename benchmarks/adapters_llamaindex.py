"""LlamaIndex's arms of section 12 (``benchmarks.adapters``): the session as LlamaIndex
``ChatMessage`` objects, Normandy's memory against LlamaIndex's own token-limited
memories, and the pairing judge.

Each subject is used as an agent uses its memory: the messages new since the last call
are put in it, then the agent reads it (``get``) before the model request.

* ``NormandyMemory`` (``window_manager``, the section's options and window): the stored
  history compacted, the compacted list kept for the next call.
* ``ChatMemoryBuffer`` (``token_limit`` = the window): the default memory of LlamaIndex's
  agents; ``get`` returns the newest messages within the limit by its tokenizer
  (tiktoken cl100k), dropping a leading assistant or tool message.
* ``Memory`` (``token_limit`` = the window, its default ``chat_history_token_ratio`` 0.7
  and flush size, no memory blocks): the newer memory, whose ``aput`` flushes the oldest
  messages out of its SQL-backed FIFO queue once it holds more than 70 % of the limit.
  It stores messages in SQLite (in memory) and hands back new objects, which the subject
  maps back to the session's own by a dict lookup (inside its timer: a few microseconds
  per message, against its SQL round trips) so the window is judged the same way.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.adapters import OPTS, WINDOW, Converted, Subject

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins/normandy-llamaindex/tests"))

__all__ = ["llamaindex_subjects", "problems", "to_llamaindex"]


def to_llamaindex(messages: Sequence[Mapping[str, Any]]) -> Converted:
    """The session's Chat dicts as LlamaIndex ``ChatMessage`` objects, one per dict: calls
    as ``ToolCallBlock`` blocks, results as ``tool`` messages naming their call."""
    from llama_index.core.base.llms.types import (
        ChatMessage,
        MessageRole,
        TextBlock,
        ToolCallBlock,
    )

    conv = Converted([], [])
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "tool":
            obj = ChatMessage(
                role=MessageRole.TOOL,
                content=m["content"],
                additional_kwargs={"tool_call_id": m["tool_call_id"]},
            )
        elif role == "assistant":
            blocks: list[Any] = [TextBlock(text=m["content"])] if m.get("content") else []
            blocks += [
                ToolCallBlock(
                    tool_call_id=c["id"],
                    tool_name=c["function"]["name"],
                    tool_kwargs=json.loads(c["function"]["arguments"] or "{}"),
                )
                for c in m.get("tool_calls") or []
            ]
            obj = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        else:
            obj = ChatMessage(role=MessageRole(role), content=m["content"])
        conv.objects.append(obj)
        conv.sources.append([i])
        conv.count_at[i + 1] = i + 1
    return conv


def message_key(m: Any) -> tuple[str, ...]:
    """What identifies a message of the session (for a copy handed back by a store): its
    role, text, the call it answers and the calls it makes."""
    calls = (getattr(b, "tool_call_id", None) or "" for b in m.blocks)
    return (
        m.role.value,
        m.content or "",
        str(m.additional_kwargs.get("tool_call_id", "")),
        *calls,
    )


def llamaindex_subjects() -> list[Subject]:
    """Normandy's memory, ``ChatMemoryBuffer`` and ``Memory``, each fed the new messages
    and read before every call."""
    from llama_index.core.memory import ChatMemoryBuffer, Memory

    from normandy_llamaindex import NormandyMemory

    ours = NormandyMemory.from_compactor("window_manager", OPTS, window=WINDOW)
    buffer = ChatMemoryBuffer.from_defaults(token_limit=WINDOW)
    loop = asyncio.new_event_loop()
    memory = Memory.from_defaults(token_limit=WINDOW)
    originals: dict[tuple[str, ...], Any] = {}

    def normandy(history: list[Any], new: list[Any]) -> list[Any]:
        ours.put_messages(new)
        return ours.get()

    def chat_buffer(history: list[Any], new: list[Any]) -> list[Any]:
        buffer.put_messages(new)
        return buffer.get()

    def fifo(history: list[Any], new: list[Any]) -> list[Any]:
        originals.update((message_key(m), m) for m in new)
        loop.run_until_complete(memory.aput_messages(new))
        got = loop.run_until_complete(memory.aget())
        return [originals.get(message_key(m), m) for m in got]

    return [
        Subject("normandy-llamaindex (NormandyMemory)", normandy),
        Subject(f"ChatMemoryBuffer (token_limit={WINDOW})", chat_buffer),
        Subject(f"Memory (token_limit={WINDOW}, the agents' newer memory)", fifo),
    ]


def problems(out: list[Any]) -> list[str]:
    """The adapter's tests' pairing check: a result answering no open call, or a call
    left without its results."""
    from li_scripted import pairing_problems

    return pairing_problems(out)
