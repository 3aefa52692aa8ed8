"""The runner: ``python -m benchmarks --quick`` (under a minute) or ``--full``.

Prints markdown tables; ``--out FILE`` also writes them, with the machine's description.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks import (
    archive,
    archive_backends,
    canonical,
    cli_read,
    compact_calls,
    compact_shapes,
    core,
    peers,
    seam,
)
from benchmarks.common import BUDGET, fmt_time, machine, median


@dataclass
class Mode:
    """Sizes, repeats and caps of one run."""

    name: str
    sizes: list[int]
    boundaries: int
    repeat: int
    compaction_sizes: list[int]
    compaction_repeat: int
    counting_size: int
    import_repeat: int
    memory_size: int
    peer_messages: int
    peer_cap: float
    strides: dict[str, int] = field(default_factory=dict)
    seam_sizes: list[int] = field(default_factory=lambda: [1_000])
    turns: int = 4
    flat_boundaries: int = 2_000
    archive_compactions: int = 100
    archive_sizes: list[int] = field(default_factory=lambda: [10, 100])


_SLOW = (
    "LangChain trim_messages, overwrite (exact)",
    "LangChain trim_messages, keep full (exact)",
    "AutoGen TokenLimitedChatCompletionContext",
)

QUICK = Mode(
    name="quick",
    sizes=[300, 1_000, 3_000],
    boundaries=20,
    repeat=3,
    compaction_sizes=[1_000],
    compaction_repeat=3,
    counting_size=300,
    import_repeat=3,
    memory_size=500,
    peer_messages=600,
    peer_cap=1.5,
    strides=dict.fromkeys(_SLOW, 8),
    seam_sizes=[1_000],
    turns=4,
    flat_boundaries=1_000,
    archive_compactions=40,
)

FULL = Mode(
    name="full",
    sizes=[1_000, 10_000, 100_000],
    boundaries=50,
    repeat=5,
    compaction_sizes=[1_000, 10_000, 100_000],
    compaction_repeat=2,
    counting_size=2_000,
    import_repeat=9,
    memory_size=10_000,
    peer_messages=10_000,
    peer_cap=60.0,
    strides={
        "LangChain trim_messages, overwrite (exact)": 4,
        "LangChain trim_messages, keep full (exact)": 50,
        "AutoGen TokenLimitedChatCompletionContext": 50,
    },
    seam_sizes=[1_000, 10_000],
    turns=20,
    flat_boundaries=10_000,
    archive_compactions=500,
)


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:,.0f}x"


def run(mode: Mode, log: Any = print) -> str:
    """Run every benchmark of ``mode`` and return the markdown report."""
    started = time.perf_counter()
    parts: list[str] = []

    def section(title: str, text: str) -> None:
        block = f"## {title}\n\n{text}\n"
        parts.append(block)
        log(block)

    m = machine()
    section(
        "Machine",
        _table(["what", "value"], [[k, v] for k, v in m.items()])
        + f"\n\nMode: **{mode.name}**; budget {BUDGET:,} tokens; counter cl100k (tiktoken).",
    )

    memories: dict[int, Any] = {}
    hot = core.hot_path(mode.sizes, mode.boundaries, mode.repeat, memories)
    base = hot[0]["ours"]
    section(
        "1. A boundary that does not compact (per boundary, median)",
        _table(
            [
                "history (messages)",
                "window_manager",
                "incremental exact floor",
                "ratio to floor",
                f"vs {hot[0]['size']:,} messages",
                f"ratio to floor vs {hot[0]['size']:,} messages",
            ],
            [
                [
                    f"{r['size']:,}",
                    fmt_time(r["ours"]),
                    fmt_time(r["floor"]),
                    _x(r["ratio"]),
                    _x(r["ours"] / base),
                    _x(r["ratio"] / hot[0]["ratio"]),
                ]
                for r in hot
            ],
        )
        + "\n\nThe sizes append different batches, so the last column (each size's ratio to "
        "its own floor, against the smallest size's) is the fairer flatness figure.\n\n"
        "Targets: ratio to floor <= 1.2x; largest size <= 1.5x the smallest.",
    )

    section(*seam_section(mode))
    flat = seam.memory_flat(mode.flat_boundaries, 24_000, max(mode.flat_boundaries // 5, 1))
    section(
        f"1c. Memory over {mode.flat_boundaries:,} compacting boundaries",
        _table(
            ["boundary", "traced memory", "live entries", "cached counts"],
            [
                [
                    f"{x['boundary']:,}",
                    f"{x['bytes'] / 1e6:.2f} MB",
                    f"{x['live_entries']:,}",
                    f"{x['cached_counts']:,}",
                ]
                for x in flat["samples"]
            ],
        )
        + f"\n\n{flat['compactions']:,} compactions; last sample / first sample: "
        f"{flat['growth']:.2f}x. The per-memory count cache holds only live entries "
        "(pruned on every compaction), so memory stays flat. Target: flat (within 1.2x).",
    )

    comp = core.compaction(mode.compaction_sizes, mode.compaction_repeat, memories)
    memories.clear()
    section(
        "2. One compaction to a 128k window, per strategy (median)",
        _table(
            [
                "history (messages)",
                "history tokens",
                "oldest_first",
                "sliding_window",
                "summarize (extractive)",
            ],
            [
                [
                    f"{r['size']:,}",
                    f"{r['tokens']:,}",
                    fmt_time(r["oldest_first"]),
                    fmt_time(r["sliding_window"]),
                    fmt_time(r["summarize"]),
                ]
                for r in comp
            ],
        ),
    )

    cnt = core.counting(mode.counting_size, mode.repeat)
    loop = cnt["raw_loop"]
    section(
        f"3. Counting {cnt['messages']:,} messages ({cnt['texts']:,} texts), median",
        _table(
            ["what", "time", "ratio to raw encode_ordinary loop"],
            [
                ["raw encode_ordinary, loop (floor)", fmt_time(loop), "1.00x"],
                [
                    "raw encode_ordinary_batch, threads (default)",
                    fmt_time(cnt["raw_batch_threads"]),
                    _x(cnt["raw_batch_threads"] / loop),
                ],
                [
                    "raw encode_ordinary_batch, num_threads=1",
                    fmt_time(cnt["raw_batch_one"]),
                    _x(cnt["raw_batch_one"] / loop),
                ],
                [
                    "TiktokenCounter.count_entry per message",
                    fmt_time(cnt["ours_entries"]),
                    _x(cnt["ours_entries"] / loop),
                ],
                [
                    "AgentMemory.tokens() first count",
                    fmt_time(cnt["ours_memory_first"]),
                    _x(cnt["ours_memory_first"] / loop),
                ],
                [
                    "AgentMemory.tokens() again, unchanged",
                    fmt_time(cnt["recount_same"]),
                    f"{cnt['ours_memory_first'] / cnt['recount_same']:,.0f}x cheaper than first",
                ],
                [
                    "derived memory, per-entry cache hits",
                    fmt_time(cnt["recount_derived"]),
                    f"{cnt['ours_memory_first'] / cnt['recount_derived']:,.0f}x cheaper than first",
                ],
            ],
        )
        + "\n\nTargets: our counter <= 1.2x raw loop; re-count >= 1,000x cheaper.",
    )

    imp = core.imports(mode.import_repeat)
    empty = imp["empty interpreter"]
    rows = [[k, fmt_time(v), fmt_time(v - empty)] for k, v in imp.items() if k in core._IMPORTS]
    section(
        "4. Import and resolve (fresh processes, median)",
        _table(["statement", "process wall time", "over an empty interpreter"], rows)
        + f"\n\n`import normandy_core` measured inside the process: "
        f"{fmt_time(imp['in_process_import'])}. Resolving 'window_manager' the first time "
        f"(entry-point scan, plugin import, hook validation): {fmt_time(imp['first_resolve'])}; "
        f"again: {fmt_time(imp['resolve_again'])}.\n\nTargets: import < 150 ms; "
        "resolve again < 10 µs.",
    )

    mem = core.memory_per_message(mode.memory_size)
    section(
        "5. Memory held per message (tracemalloc)",
        _table(
            [
                "messages",
                "bytes per message",
                "of which text characters",
                "token-count cache per message",
            ],
            [
                [
                    f"{mem['messages']:,}",
                    f"{mem['per_message']:,.0f}",
                    f"{mem['text_chars_per_message']:,.0f}",
                    f"{mem['counts_per_message']:,.0f}",
                ]
            ],
        ),
    )

    section(*archive_section(mode))

    pr = peers.run_all(mode.peer_messages, mode.peer_cap, mode.strides)
    fl = pr["floor"]
    prow: list[list[str]] = []
    for o in pr["results"]:
        med = median(o.times)
        own_floor = median(o.floor_times)
        measured = f"{o.boundaries:,} of {o.total_boundaries:,}"
        if o.stride > 1:
            measured += f" (every {o.stride}th)"
        if o.capped:
            measured += f", capped at {mode.peer_cap:g} s, reached {o.messages_reached:,} msgs"
        prow.append(
            [
                o.name,
                fmt_time(med),
                fmt_time(own_floor),
                _x(med / own_floor),
                fmt_time(o.last_time),
                measured,
                str(o.overruns),
                str(o.orphaned),
                f"{max(o.kept_tokens, default=0):,}",
            ]
        )
    section(
        f"6. The peers: one session of {pr['messages']:,} messages, fitting {BUDGET:,} tokens "
        "at every tool-batch boundary",
        f"Floor (incremental exact count of the new messages), over the whole session: "
        f"{fmt_time(fl)} per boundary. Each library's ratio uses the floor timed on the same "
        'messages just before each of its calls ("its floor").\n\n'
        + _table(
            [
                "library",
                "per boundary (median)",
                "its floor (median)",
                "ratio to floor",
                "last boundary",
                "boundaries measured",
                "budget overruns",
                "orphaned tool results",
                "largest kept (exact tokens)",
            ],
            prow,
        ),
    )
    section(
        "7. The archive: a compacting boundary with it on and off, writes, re-compaction",
        archive.report(archive.run_in_subprocess(mode.name)),
    )
    for block in (
        compact_calls.run_mode(compact_calls.QUICK),  # titled "8. compact() before ..."
        compact_shapes.run(),  # "8b. ..., in every input shape" (progress on stderr)
    ):
        parts.append(block)
        log(block)
    section(
        "9. Counted as the provider counts: overruns judged by an independent canonical count",
        canonical.report(1_000 if mode.name == "quick" else 4_000),
    )
    section(
        "10. `normandy compact` reading a JSON array (linear)",
        cli_read.cli_read_scaling(repeat=1 if mode.name == "quick" else 3)["table"],
    )
    section("Run", f"Total wall time: {time.perf_counter() - started:,.0f} s.")
    return "\n".join(parts)


def seam_section(mode: Mode) -> tuple[str, str]:
    """Section 1b: both kinds of boundary, and a whole ``run_turn`` (title, markdown)."""
    rows = []
    for size in mode.seam_sizes:
        b = seam.boundaries(size, mode.boundaries, mode.repeat)
        for kind, label in (
            ("start", "turn start (a user message)"),
            ("tool", "after a tool batch"),
        ):
            r = b[kind]
            rows.append(
                [f"{b['size']:,}", label, fmt_time(r["ours"]), fmt_time(r["floor"]), _x(r["ratio"])]
            )
    rt = seam.run_turn_boundaries(mode.turns, 8)
    return (
        "1b. Both kinds of boundary, timed in alternating order; a whole run_turn",
        _table(["history (messages)", "boundary", "run_compaction", "exact floor", "ratio"], rows)
        + "\n\nThe floor and `run_compaction` are timed in alternating order (odd boundaries "
        "ours first, even ones the floor first). Targets: within 1.2x the floor at both "
        "kinds.\n\n"
        + _table(
            [
                "boundaries",
                "run_turn per boundary",
                "floor (each appended message counted once)",
                "ratio",
                "floor timed first / after",
            ],
            [
                [
                    f"{rt['boundaries']:,}",
                    fmt_time(rt["ours"]),
                    fmt_time(rt["floor"]),
                    _x(rt["ratio"]),
                    f"{_x(rt['ratio_floor_first'])} / {_x(rt['ratio_floor_after'])}",
                ]
            ],
        )
        + "\n\nA whole `run_turn` (scripted model, tools returning the recorded outputs, "
        "`window_manager` under a window never reached) per boundary, against raw tiktoken "
        "counting every message the turns appended, once (built from the script, checked "
        "to count exactly what each turn appended), timed in alternating order (odd turns "
        "the floor first, even ones after the turn; the last column gives each half's "
        "ratio). Target: within 1.3x.",
    )


def archive_section(mode: Mode) -> tuple[str, str]:
    """Section 5b: archive write throughput, SQLite and PostgreSQL (title, markdown)."""
    rows = archive_backends.write_throughput(mode.archive_compactions, mode.archive_sizes)
    body = [
        [r["backend"], f"{r['size']:,}", "no server here", "-", "-"]
        if r["skipped"]
        else [
            r["backend"],
            f"{r['size']:,}",
            f"{r['compactions_per_s']:,.0f}",
            f"{r['entries_per_s']:,.0f}",
            fmt_time(r["per_compaction"]),
        ]
        for r in rows
    ]
    return (
        f"5b. Archive write throughput, one writer, {mode.archive_compactions:,} compactions",
        _table(
            [
                "backend",
                "entries per compaction",
                "compactions/s",
                "entries/s",
                "per compaction",
            ],
            body,
        )
        + "\n\nEach compaction is one transaction of fresh workload entries (`record`, as the "
        "hook calls it), durable defaults on both; the PostgreSQL server runs on the same "
        "machine (Unix socket), so the network is not in these figures.",
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print (and write ``--out``)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="small sizes, under a minute (default)")
    g.add_argument("--full", action="store_true", help="1k, 10k and 100k messages")
    ap.add_argument("--out", help="also write the markdown report to this file")
    args = ap.parse_args(argv)
    report = run(FULL if args.full else QUICK)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write("# Benchmark results\n\n" + report)
    return 0
