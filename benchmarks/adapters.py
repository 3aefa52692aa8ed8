"""Section 12: the framework adapters per call, against each framework's own trimming (issue 18).

One generated tool-using session (OpenAI Chat Completions dicts, as sections 6 and 8 use)
is converted once into each framework's own objects: LangChain ``BaseMessage`` objects,
Pydantic AI ``ModelMessage`` objects, OpenAI Agents SDK Responses input items. An agent
loop is replayed on it: before every model request (after each tool batch) each subject
prepares what the model would receive, under a window of :data:`WINDOW` tokens.

* **The adapters** keep what the framework keeps: LangChain's middleware and Pydantic AI's
  history processor replace the history with the compacted list, so the next call sees the
  compacted list plus the new messages; the Agents SDK's input filter is given the whole
  input each call (it remembers its last cut). ``window_manager``, exact cl100k counter,
  no reserve.
* **The frameworks' own trimming**, given the whole history each call (none of them
  persists its cut): LangChain ``trim_messages`` (``strategy="last"``, its approximate
  counter, with and without the ``start_on="human"`` setting its docs give for valid
  histories); for Pydantic AI, which ships none (users write it), the usual hand-written
  processor keeping the newest messages within the window by an approximate count; for
  the Agents SDK its ``ToolOutputTrimmer`` filter and the item-count cut of
  ``SessionSettings(limit=...)``.

Subjects run in alternating order at each call. Each output is judged outside the timers:
requests with an orphaned tool result or an unanswered call (each framework's own pairing
rule, the adapters' tests' checks), and requests over the window by an exact cl100k count
of the original messages they keep (what a compactor creates, a marker, is not counted).

``python -m benchmarks.adapters [--quick]`` prints the section.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.adapters_adk import adk_problems, adk_subjects, to_adk
from benchmarks.common import clock, fmt_time, median, raw_encoding, settle
from normandy_core.app.workload import generate_session
from normandy_core.conversation.tokens import MESSAGE_OVERHEAD
from normandy_core.transcripts.chat import to_openai

TITLE = "12. The framework adapters per call, against the frameworks' own trimming"
WINDOW = 32_000
OPTS: dict[str, Any] = {"counter": "cl100k_base", "reserved_tokens": 0}
SEED = 18
#: Items kept by the ``SessionSettings(limit=...)`` arm.
LIMIT = 60

_ROOT = Path(__file__).resolve().parents[1]
for _helpers in ("normandy-langchain", "normandy-pydantic-ai", "normandy-openai-agents"):
    # each framework's pairing check, as the adapter's own tests apply it
    sys.path.insert(0, str(_ROOT / "plugins" / _helpers / "tests"))

Message = Mapping[str, Any]


@dataclass
class Converted:
    """A session in one framework's objects: ``objects[k]`` stands for the original dicts
    ``sources[k]``; ``cut_after[j]`` is the object count once dict ``j`` is in."""

    objects: list[Any]
    sources: list[list[int]]
    count_at: dict[int, int] = field(default_factory=dict)


def _exact_tokens(messages: Sequence[Message]) -> list[int]:
    enc = raw_encoding()
    out: list[int] = []
    for m in messages:
        texts = [m.get("content") or ""]
        for c in m.get("tool_calls") or []:
            texts += [c["function"]["name"], c["function"]["arguments"]]
        out.append(MESSAGE_OVERHEAD + sum(len(enc.encode_ordinary(t)) for t in texts if t))
    return out


def _boundaries(messages: Sequence[Message]) -> list[int]:
    last = len(messages) - 1
    return [
        i + 1
        for i, m in enumerate(messages)
        if m["role"] == "tool" and (i == last or messages[i + 1]["role"] != "tool")
    ]


# -- conversions, once per session -----------------------------------------------------------


def to_langchain(messages: Sequence[Message]) -> Converted:
    from langchain_core.messages import convert_to_messages

    objs = convert_to_messages([dict(m) for m in messages])
    for i, o in enumerate(objs):
        o.id = f"m{i}"
    conv = Converted(list(objs), [[i] for i in range(len(objs))])
    conv.count_at = {i + 1: i + 1 for i in range(len(objs))}
    return conv


def to_pydantic_ai(messages: Sequence[Message]) -> Converted:
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    conv = Converted([], [])
    names: dict[str, str] = {}
    pending_system: list[int] = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            pending_system.append(i)
            continue
        if role == "tool":
            part = ToolReturnPart(names[m["tool_call_id"]], m["content"], m["tool_call_id"])
            last = conv.objects[-1] if conv.objects else None
            if isinstance(last, ModelRequest) and isinstance(last.parts[-1], ToolReturnPart):
                last.parts.append(part)
                conv.sources[-1].append(i)
            else:
                conv.objects.append(ModelRequest(parts=[part]))
                conv.sources.append([i])
        elif role == "user":
            parts: list[Any] = [SystemPromptPart(messages[j]["content"]) for j in pending_system]
            parts.append(UserPromptPart(m["content"]))
            conv.objects.append(ModelRequest(parts=parts))
            conv.sources.append([*pending_system, i])
            pending_system = []
        else:
            rparts: list[Any] = [TextPart(m["content"])] if m.get("content") else []
            for c in m.get("tool_calls") or []:
                names[c["id"]] = c["function"]["name"]
                rparts.append(
                    ToolCallPart(c["function"]["name"], c["function"]["arguments"], c["id"])
                )
            conv.objects.append(ModelResponse(parts=rparts, provider_response_id=f"r{i}"))
            conv.sources.append([i])
        conv.count_at[i + 1] = len(conv.objects)
    return conv


def to_agents(messages: Sequence[Message]) -> Converted:
    conv = Converted([], [])
    for i, m in enumerate(messages):
        role = m["role"]
        if role in ("system", "user"):
            conv.objects.append({"role": role, "content": m["content"]})
            conv.sources.append([i])
        elif role == "tool":
            conv.objects.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
            conv.sources.append([i])
        else:
            if m.get("content"):
                conv.objects.append(
                    {
                        "type": "message",
                        "id": f"msg_{i}",
                        "role": "assistant",
                        "content": [
                            {"type": "output_text", "text": m["content"], "annotations": []}
                        ],
                    }
                )
                conv.sources.append([i])
            for c in m.get("tool_calls") or []:
                conv.objects.append(
                    {
                        "type": "function_call",
                        "id": f"fc_{c['id']}",
                        "call_id": c["id"],
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"],
                    }
                )
                conv.sources.append([i] if not m.get("content") else [])
        conv.count_at[i + 1] = len(conv.objects)
    return conv


# -- the subjects ------------------------------------------------------------------------------


@dataclass
class Subject:
    """One way of preparing the model's input: ``step(history, new)`` returns it."""

    name: str
    step: Callable[[list[Any], list[Any]], list[Any]]
    times: list[float] = field(default_factory=list)
    orphans: int = 0
    over: int = 0
    sizes: list[int] = field(default_factory=list)
    #: The exact tokens of an output whose messages a framework rewrote (an offloaded
    #: result's preview), for the over-window judge; else the originals kept are counted.
    count: Callable[[list[Any]], int] | None = None


def _persisting(
    run: Callable[[list[Any]], list[Any]],
) -> Callable[[list[Any], list[Any]], list[Any]]:
    """An adapter whose framework keeps the compacted list: last output plus what is new."""
    state: list[Any] = []

    def step(history: list[Any], new: list[Any]) -> list[Any]:
        nonlocal state
        state = run([*state, *new])
        return state

    return step


def _whole(trim: Callable[[list[Any]], list[Any]]) -> Callable[[list[Any], list[Any]], list[Any]]:
    """A trimming given the whole history each call (nothing persisted)."""
    return lambda history, new: trim(history)


def langchain_subjects() -> list[Subject]:
    from langchain_core.messages import trim_messages
    from langchain_core.messages.utils import count_tokens_approximately

    from normandy_langchain import MessageCompactor

    lc = MessageCompactor("window_manager", OPTS, window=WINDOW)

    def safe(history: list[Any]) -> list[Any]:
        return trim_messages(
            history,
            strategy="last",
            token_counter=count_tokens_approximately,
            max_tokens=WINDOW,
            start_on="human",
            end_on=("human", "tool"),
            include_system=True,
        )

    def plain(history: list[Any]) -> list[Any]:
        return trim_messages(
            history,
            strategy="last",
            token_counter=count_tokens_approximately,
            max_tokens=WINDOW,
            include_system=True,
        )

    return [
        Subject(
            "normandy-langchain (MessageCompactor, as the middleware)",
            _persisting(lambda s: lc.run(s).messages),
        ),
        Subject('trim_messages (start_on="human")', _whole(safe)),
        Subject("trim_messages (no start_on)", _whole(plain)),
    ]


def pydantic_ai_subjects() -> list[Subject]:
    from normandy_pydantic_ai import HistoryCompactor

    hc = HistoryCompactor("window_manager", OPTS, window=WINDOW)

    def approx(m: Any) -> int:
        return (
            sum(len(str(getattr(p, "content", "")) + str(getattr(p, "args", ""))) for p in m.parts)
            // 4
            + 4
        )

    def newest_within(history: list[Any]) -> list[Any]:
        total, k = approx(history[0]), len(history)
        while k > 1 and total + approx(history[k - 1]) <= WINDOW:
            k -= 1
            total += approx(history[k])
        return [history[0], *history[k:]]

    return [
        Subject(
            "normandy-pydantic-ai (HistoryCompactor, as the processor)",
            _persisting(lambda s: hc.run(s).messages),
        ),
        Subject(
            "hand-written processor (newest within the window, approx. count)",
            _whole(newest_within),
        ),
    ]


def agents_subjects() -> list[Subject]:
    from agents.extensions import ToolOutputTrimmer
    from agents.run_config import CallModelData, ModelInputData

    from normandy_openai_agents import NormandyInputFilter

    loop = asyncio.new_event_loop()
    filt = NormandyInputFilter("window_manager", OPTS, window=WINDOW)
    trimmer = ToolOutputTrimmer()

    def data(items: list[Any]) -> Any:
        return CallModelData(
            model_data=ModelInputData(input=items, instructions=None), agent=None, context=None
        )  # type: ignore[arg-type]

    def ours(history: list[Any]) -> list[Any]:
        return loop.run_until_complete(filt(data(history))).input

    def trimmed(history: list[Any]) -> list[Any]:
        out = trimmer(data(history))
        return list(out.input)

    def limit(history: list[Any]) -> list[Any]:
        return history[-LIMIT:]

    return [
        Subject("normandy-openai-agents (NormandyInputFilter)", _whole(ours)),
        Subject("ToolOutputTrimmer (the SDK's filter)", _whole(trimmed)),
        Subject(f"SessionSettings(limit={LIMIT}) (item-count cut)", _whole(limit)),
    ]


# -- judging ---------------------------------------------------------------------------------------


def _problems(framework: str, out: list[Any]) -> list[str]:
    if framework == "LangChain":
        from lc_scripted import pairing_problems as lc

        return lc(out)
    if framework == "Strands Agents":
        from benchmarks.adapters_strands import strands_problems

        return strands_problems(out)
    if framework == "Pydantic AI":
        from pai_scripted import pairing_problems as pai

        return pai(out)
    if framework == "LlamaIndex":
        from benchmarks.adapters_llamaindex import problems

        return problems(out)
    if framework == "Google ADK":
        return adk_problems(out)
    from oa_scripted import pairing_problems as oa

    return oa([dict(o) for o in out])


def replay(
    framework: str,
    conv: Converted,
    subjects: list[Subject],
    tokens: list[int],
    bounds: list[int],
    log: Callable[[str], None],
) -> None:
    """Every subject at every boundary, in alternating order; outputs judged untimed."""
    index = {id(o): k for k, o in enumerate(conv.objects)}
    prev = 0
    for n, b in enumerate(bounds):
        upto = conv.count_at[b]
        history, new = conv.objects[:upto], conv.objects[prev:upto]
        prev = upto
        order = subjects if n % 2 == 0 else subjects[::-1]
        if n % 20 == 0:
            settle()  # outside the timers, not before each call: a full collection costs more
        for s in order:
            t0 = clock()
            out = s.step(history, new)
            s.times.append(clock() - t0)
            if _problems(framework, out):
                s.orphans += 1
            kept = (
                s.count(out)
                if s.count is not None
                else sum(
                    tokens[j] for o in out if id(o) in index for j in conv.sources[index[id(o)]]
                )
            )
            if kept > WINDOW:
                s.over += 1
            s.sizes.append(len(out))
    log(f"{framework}: {len(bounds)} calls replayed")


def run(quick: bool = False, log: Callable[[str], None] = lambda s: None) -> str:
    """Section 12 as Markdown."""
    os.environ.setdefault("NORMANDY_ARCHIVE_PATH", "off")
    entries = 300 if quick else 1_000
    messages = to_openai(generate_session(SEED, entries, end_mid_round=True))
    tokens = _exact_tokens(messages)
    bounds = [b for b in _boundaries(messages) if sum(tokens[:b]) > WINDOW // 2]
    lines = [
        f"## {TITLE}",
        "",
        f"One generated session of {len(messages):,} messages ({sum(tokens):,} tokens, "
        f"{len(bounds)} tool-batch boundaries measured, from half the window on), window "
        f"{WINDOW:,} tokens. Per call: median time to prepare the model's input; requests "
        "with an orphaned tool result or unanswered call; requests over the window (exact "
        "cl100k count of the original messages kept); median size of the input sent.",
        "",
        "| framework | subject | per call (median) | requests with orphans | over the window "
        "| items sent (median) |",
        "|---|---|---|---|---|---|",
    ]
    from benchmarks import adapters_llamaindex as li
    from benchmarks.adapters_strands import strands_subjects, to_strands

    for framework, convert, make in (
        ("LangChain", to_langchain, langchain_subjects),
        ("Pydantic AI", to_pydantic_ai, pydantic_ai_subjects),
        ("OpenAI Agents SDK", to_agents, agents_subjects),
        ("Strands Agents", to_strands, strands_subjects),
        ("LlamaIndex", li.to_llamaindex, li.llamaindex_subjects),
        ("Google ADK", to_adk, adk_subjects),
    ):
        conv = convert(messages)
        subjects = make()
        replay(framework, conv, subjects, tokens, bounds, log)
        for s in subjects:
            lines.append(
                f"| {framework} | {s.name} | {fmt_time(median(s.times))} | "
                f"{s.orphans} / {len(s.times)} | {s.over} / {len(s.times)} | "
                f"{int(median([float(x) for x in s.sizes]))} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m benchmarks.adapters [--quick]``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.adapters", description=TITLE)
    p.add_argument("--quick", action="store_true", help="a shorter session")
    args = p.parse_args(argv)
    # what the adapters drop is not archived, as ``python -m benchmarks`` runs
    os.environ["NORMANDY_ARCHIVE_PATH"] = "off"
    print(run(args.quick, log=lambda s: print(s, file=sys.stderr)))


if __name__ == "__main__":
    main()
