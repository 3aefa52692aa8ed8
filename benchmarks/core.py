"""Benchmarks of Normandy itself: hot path, compaction, counting, import, resolve, memory."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import (
    BUDGET,
    append,
    clock,
    entry_texts,
    median,
    raw_encoding,
    raw_entry_tokens,
    settle,
    time_call,
    time_per_call,
    workload,
)
from normandy_core import AgentConfig, AgentMemory, get_counter, run_compaction
from normandy_core.app.workload import generate_session

COUNTER = "cl100k_base"


@dataclass
class Row:
    """One line of a result table."""

    cells: list[str]
    data: dict[str, Any] = field(default_factory=dict)


def _config(memory: AgentMemory, **opts: Any) -> AgentConfig:
    base: dict[str, Any] = {"counter": COUNTER}
    base.update(opts)
    return AgentConfig(compactor="window_manager", compactor_opts=base, memory=memory)


def hot_path(
    sizes: list[int], boundaries: int, repeat: int, keep: dict[int, AgentMemory] | None = None
) -> list[dict[str, Any]]:
    """A boundary that does not compact, per size, against the incremental exact floor.

    The agent loop appends one tool batch, then calls ``run_compaction(mid_round=True)``
    under a window the history never reaches. The floor encodes only the appended
    messages with raw tiktoken and adds them to a running total. Both are timed on the
    same batches, in alternating order, and each figure is the median over ``boundaries``
    boundaries and then over ``repeat`` runs.
    """
    enc = raw_encoding()
    counter = get_counter(COUNTER)
    out: list[dict[str, Any]] = []
    for size in sizes:
        wl = workload(size, extra=boundaries * repeat * 4 + 64)
        memory = AgentMemory.from_entries(wl.history)
        t0 = clock()
        floor_total = memory.tokens(counter)  # the agent counted its history as it grew
        first = clock() - t0
        acc = _config(memory, context_window=10**12, reserved_tokens=0)
        batches = wl.batches()
        ours_runs: list[float] = []
        floor_runs: list[float] = []
        for _ in range(repeat):
            ours: list[float] = []
            floor: list[float] = []
            settle()
            for n in range(boundaries):
                batch = next(batches)
                # Alternating order: the floor first on even boundaries, ours first on odd
                # ones, so neither always warms the caches the other then uses.
                if n % 2 == 0:
                    t0 = clock()
                    for e in batch:
                        floor_total += raw_entry_tokens(enc, e)
                    floor.append(clock() - t0)
                append(memory, batch)
                t0 = clock()
                acc, meta = run_compaction(acc, mid_round=True)
                ours.append(clock() - t0)
                assert not meta["compacted"] and "error" not in meta, meta
                if n % 2 == 1:
                    t0 = clock()
                    for e in batch:
                        floor_total += raw_entry_tokens(enc, e)
                    floor.append(clock() - t0)
            ours_runs.append(median(ours))
            floor_runs.append(median(floor))
        assert memory.tokens(counter) == floor_total, "our total differs from the floor's"
        if keep is not None:
            keep[size] = memory
        o, f = median(ours_runs), median(floor_runs)
        out.append(
            {"size": len(wl.history), "ours": o, "floor": f, "ratio": o / f, "first_count": first}
        )
    return out


def compaction(
    sizes: list[int], repeat: int, sessions: dict[int, AgentMemory]
) -> list[dict[str, Any]]:
    """One compaction per strategy of a history of each size down to a 128k-token window.

    The history's counts are cached (as in a running agent), so this measures the plan
    and the new memory, not the first count. ``summarize`` uses the extractive summarizer.
    """
    counter = get_counter(COUNTER)
    out: list[dict[str, Any]] = []
    for size in sizes:
        memory = sessions.get(size) or AgentMemory.from_entries(workload(size, extra=8).history)
        memory.tokens(counter)
        row: dict[str, Any] = {"size": len(memory), "tokens": memory.tokens(counter)}
        for strategy in ("oldest_first", "sliding_window", "summarize"):
            acc = _config(memory, context_window=BUDGET, strategy=strategy)
            _, meta = run_compaction(acc, mid_round=True)  # warm: kept entries counted once
            assert meta.get("compacted"), meta
            settle()
            row[strategy] = time_call(lambda acc=acc: run_compaction(acc, mid_round=True), repeat)
            row[f"{strategy}_after"] = meta["tokens_after"]
        out.append(row)
    return out


def counting(size: int, repeat: int) -> dict[str, Any]:
    """Our counter against raw tiktoken on the same texts; the cached re-count."""
    enc = raw_encoding()
    counter = get_counter(COUNTER)
    entries = generate_session(11, size).entries()
    texts = [t for e in entries for t in entry_texts(e)]

    def raw_loop() -> int:
        return sum(len(enc.encode_ordinary(t)) for t in texts)

    def raw_batch_threads() -> int:
        return sum(len(x) for x in enc.encode_ordinary_batch(texts))

    def raw_batch_one() -> int:
        return sum(len(x) for x in enc.encode_ordinary_batch(texts, num_threads=1))

    def ours_entries() -> int:
        return sum(counter.count_entry(e) for e in entries)

    def ours_memory_first() -> int:
        return AgentMemory.from_entries(entries).tokens(counter)

    raw_loop()  # warm the encoder
    settle()
    r: dict[str, Any] = {"messages": len(entries), "texts": len(texts)}
    # Interleave the contenders in each round so machine noise hits them alike.
    names = ("raw_loop", "raw_batch_threads", "raw_batch_one", "ours_entries", "ours_memory_first")
    fns = (raw_loop, raw_batch_threads, raw_batch_one, ours_entries, ours_memory_first)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(repeat):
        for n, fn in zip(names, fns, strict=True):
            t0 = clock()
            fn()
            samples[n].append(clock() - t0)
    for n in names:
        r[n] = median(samples[n])
    memory = AgentMemory.from_entries(entries)
    memory.tokens(counter)
    r["recount_same"] = time_per_call(lambda: memory.tokens(counter), 1000, repeat)
    r["recount_derived"] = time_call(lambda: memory.derive(entries).tokens(counter), repeat)
    return r


_IMPORTS = {
    "empty interpreter": "pass",
    "import pluggy": "import pluggy",
    "import importlib.metadata": "import importlib.metadata",
    "import normandy_core": "import normandy_core",
    "import normandy_core + resolve 'window_manager'": (
        "import normandy_core; normandy_core.resolve_compactor('window_manager')"
    ),
}


def imports(repeat: int) -> dict[str, Any]:
    """Wall time of fresh interpreters running each statement, and the in-process import time."""
    walls: dict[str, list[float]] = {k: [] for k in _IMPORTS}
    inner: list[float] = []
    first_resolve: list[float] = []
    probe = (
        "import time; t=time.perf_counter(); import normandy_core; t1=time.perf_counter(); "
        "normandy_core.resolve_compactor('window_manager'); t2=time.perf_counter(); "
        "print(t1-t, t2-t1)"
    )
    # Measure with bytecode cached, as an installed package runs (pip and uv compile on
    # request only; a shell with PYTHONDONTWRITEBYTECODE=1 would charge compilation to
    # every import). One warm-up run per statement writes the caches.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for stmt in [*_IMPORTS.values(), probe]:
        subprocess.run([sys.executable, "-c", stmt], check=True, env=env, capture_output=True)
    for _ in range(repeat):
        for name, stmt in _IMPORTS.items():
            t0 = clock()
            subprocess.run([sys.executable, "-c", stmt], check=True, env=env)
            walls[name].append(clock() - t0)
        res = subprocess.run(
            [sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=env
        )
        a, b = res.stdout.split()
        inner.append(float(a))
        first_resolve.append(float(b))
    out: dict[str, Any] = {k: median(v) for k, v in walls.items()}
    out["in_process_import"] = median(inner)
    out["first_resolve"] = median(first_resolve)
    from normandy_core import resolve_compactor

    resolve_compactor("window_manager")
    out["resolve_again"] = time_per_call(
        lambda: resolve_compactor("window_manager"), 10_000, repeat
    )
    return out


def memory_per_message(size: int) -> dict[str, Any]:
    """Bytes held per message by an ``AgentMemory`` of a generated session (tracemalloc)."""
    counter = get_counter(COUNTER)
    settle()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    mem = generate_session(5, size)
    settle()
    held = tracemalloc.get_traced_memory()[0] - base
    mem.tokens(counter)
    settle()
    with_counts = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    n = len(mem)
    text_bytes = sum(len(t) for e in mem for t in entry_texts(e))
    return {
        "messages": n,
        "per_message": held / n,
        "counts_per_message": (with_counts - held) / n,
        "text_chars_per_message": text_bytes / n,
    }
