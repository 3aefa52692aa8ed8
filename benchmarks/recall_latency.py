"""Recall latency with and without an embedder, at N archived entries (issue 35 item 2).

``python -m benchmarks.recall_latency [--entries N ...] [--embedder NAME] [--queries Q]
[--url postgresql://...]``

An archive of N entries in one session (user requests, assistant notes, tool outputs of
a few hundred words, from a seeded vocabulary) is written in a temporary directory (with
``--url``: in that PostgreSQL database, which must hold no archive yet); then
Q recalls (``normandy_core.recall``, the archive's ``recall_entries`` and, with the
embedder, ``recall_similar``) are timed, keywords only and fused with the embedder.

Vectors: a recall embeds the entries that have none, once; that cost is the embedder's
throughput (measured here on a sample of the entries and reported apart). To time the
recall itself at N entries without embedding all N first, every entry is given one of
the sample's real vectors (cycled): reading, comparing and ranking them costs the same
whatever their values. The query is embedded for real at every recall.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from normandy_archive.base import ArchiveBackend

_WORDS = (
    "build",
    "failed",
    "nightly",
    "job",
    "region",
    "deploy",
    "cache",
    "token",
    "ledger",
    "invoice",
    "payroll",
    "socket",
    "timeout",
    "retry",
    "config",
    "parser",
    "schema",
    "migration",
    "index",
    "cursor",
    "handler",
    "worker",
    "queue",
    "thread",
    "lock",
    "commit",
    "branch",
    "merge",
    "review",
    "release",
    "version",
    "module",
    "import",
    "export",
    "request",
    "response",
    "header",
    "payload",
    "client",
    "server",
    "proxy",
    "route",
    "session",
    "cookie",
    "user",
    "admin",
    "role",
    "policy",
    "audit",
    "metric",
    "alert",
    "trace",
    "span",
    "log",
    "level",
    "warning",
    "error",
    "panic",
)


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _entries(n: int, seed: int = 7) -> list[object]:
    from normandy_core import Entry, ToolResultBlock, ToolUseBlock

    rng = random.Random(seed)
    out: list[object] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(Entry(id=f"u{i}", role="user", content=_text(rng, 20)))
        elif kind == 1:
            call = ToolUseBlock(id=f"t{i}", name="run", input={"cmd": _text(rng, 4)})
            out.append(Entry(id=f"a{i}", role="assistant", content=[call]))
        elif kind == 2:
            result = ToolResultBlock(tool_use_id=f"t{i - 1}", content=_text(rng, 200))
            out.append(Entry(id=f"r{i}", role="user", content=[result]))
        else:
            out.append(Entry(id=f"a{i}", role="assistant", content=_text(rng, 40)))
    return out


def measure(
    entries: int, embedder: str | None, queries: int, sample: int, url: str | None = None
) -> dict[str, float]:
    """Median and p95 recall milliseconds at ``entries``, keywords only and fused (in the
    PostgreSQL database at ``url``, else in an SQLite file)."""
    import normandy_archive
    from normandy_archive import Archive, open_archive
    from normandy_archive.base import searchable_parts, searchable_text
    from normandy_core import recall
    from normandy_core.contract.recall_embed import embedder_for
    from normandy_core.contract.recall_parts import parts_key

    rng = random.Random(11)
    asked = [_text(rng, 4) for _ in range(queries)]
    found: dict[str, float] = {"entries": float(entries)}
    with tempfile.TemporaryDirectory(prefix="normandy-latency-") as tmp:
        path = Path(tmp) / "a.sqlite3"
        archive = open_archive(url or path)
        if not _empty(archive):
            raise SystemExit(f"{archive.location} holds an archive already: give an empty one")
        made = _entries(entries)
        for start in range(0, len(made), 500):
            archive.record(made[start : start + 500], session_id="s1")  # type: ignore[arg-type]
        if isinstance(archive, Archive):  # PostgreSQL indexed as it wrote
            archive.index(batch=500)
        where = {"url": url} if url else {"path": str(path)}
        with normandy_archive.archive_settings(**where):
            recall(asked[0], session="s1", embedder="off")  # warm: connections, stems
            found.update(
                _timed(lambda q: recall(q, session="s1", embedder="off"), asked, "lexical")
            )
            if embedder is not None:
                emb = embedder_for(embedder)
                assert emb is not None
                key = parts_key(emb.key)
                rows = archive.unembedded(key, "s1")
                texts = [searchable_text(a.entry) for a in rows[:sample]]
                t0 = time.perf_counter()
                vectors = emb.embed(texts)
                found["embed_per_s"] = len(texts) / (time.perf_counter() - t0)
                # each entry as many vectors as it has parts, the sample's cycled
                cycle = itertools.cycle(vectors)
                for start in range(0, len(rows), 1000):
                    archive.store_vectors(
                        key,
                        {
                            a.seq: [next(cycle) for _ in searchable_parts(a.entry)]
                            for a in rows[start : start + 1000]
                        },
                    )
                recall(asked[0], session="s1", embedder=embedder)  # warm: the model
                found.update(
                    _timed(lambda q: recall(q, session="s1", embedder=embedder), asked, "fused")
                )
        archive.close()
    return found


def _empty(archive: ArchiveBackend) -> bool:
    """Whether ``archive`` holds nothing yet (a PostgreSQL database without its schema)."""
    from normandy_archive import ArchiveError

    try:
        return archive.count() == 0
    except ArchiveError:  # no archive schema: the first write makes it
        return True


def _timed(run: object, queries: Sequence[str], name: str) -> dict[str, float]:
    times = []
    for q in queries:
        t0 = time.perf_counter()
        run(q)  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        f"{name}_median_ms": statistics.median(times),
        f"{name}_p95_ms": times[max(0, int(len(times) * 0.95) - 1)],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recall_latency")
    parser.add_argument("--entries", type=int, nargs="+", default=[10_000])
    parser.add_argument("--embedder", metavar="NAME")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--sample", type=int, default=128, help="entries embedded for real")
    parser.add_argument(
        "--url", help="an empty PostgreSQL database to archive into (default: an SQLite file)"
    )
    args = parser.parse_args(argv)
    if args.url and len(args.entries) > 1:
        parser.error("--url takes one --entries value (the database must start empty)")
    print("| entries | keywords only, median / p95 ms | fused, median / p95 ms | embedded per s |")
    print("|---:|---:|---:|---:|")
    for n in args.entries:
        r = measure(n, args.embedder, args.queries, args.sample, args.url)
        fused = (
            f"{r['fused_median_ms']:.0f} / {r['fused_p95_ms']:.0f}"
            if "fused_median_ms" in r
            else "-"
        )
        rate = f"{r['embed_per_s']:.1f}" if "embed_per_s" in r else "-"
        lexical = f"{r['lexical_median_ms']:.0f} / {r['lexical_p95_ms']:.0f}"
        print(f"| {n:,} | {lexical} | {fused} | {rate} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
