"""A seeded crash campaign of the archive: agents compacting into one SQLite archive,
some killed (SIGKILL) at random moments of a compaction, then every committed
compaction checked recallable byte for byte.

    uv run python scripts/archive_soak.py --seed 1 --duration 600
    make archive-soak SEED=1 DURATION=600

Each round draws (from ``--seed`` and the round's number, so round ``r`` of seed ``s`` is
the same on every machine) how many agents run, which are killed, after how many
completed compactions and how long after the next one began (0 to 15 ms: before, during
or after its transaction), and the ``sync`` setting. The agents are real processes
running ``window_manager`` through the boundary with the ``archive`` hook installed (one
transaction into the tables in the boundary, the indexing in the background writer).
After the round, with every agent ended:

* ``PRAGMA integrity_check`` is ``ok`` and no compaction row lacks its entries;
* every compaction an agent reported done is recallable: each dropped content is stored,
  its JSON byte for byte an entry's that was dropped with it (or, when agents dropped the
  same content, a killed agent's whose last compaction committed it first);
* content no agent reported is only a killed agent's (committed before it could say so);
* no file but SQLite's is left beside the archive, and ``index()`` then indexes every
  row;
* no agent logged a failure (an index that failed and was tried again later).

Prints a line per round and a summary; exits 1 on the first round that fails a check,
naming it (``--seed s --start r --rounds 1`` replays it). Archives live in a temporary
directory, never in the user's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "normandy-archive" / "tests"))

from archive_helpers import CRASH_AGENT, follow, unsound  # noqa: E402  (the crash tests' own)


@dataclass
class Agent:
    """One agent process of a round and what it printed."""

    tag: str
    proc: subprocess.Popen[str]
    kill_after: int | None  # completed compactions before the one it is killed in
    delay: float
    lines: list[str] = field(default_factory=list)

    def follow(self) -> None:
        """Read its lines; kill it ``delay`` s after the compaction it is to die in began."""
        follow(self.proc, self.lines, self.kill_after, self.delay, timeout=300)


def _round(seed: int, number: int, scratch: Path) -> tuple[int, int]:
    """Run round ``number``; (agents killed, compactions checked). Raises AssertionError."""
    rng = random.Random(f"{seed}-{number}")
    path = scratch / f"round-{number}" / "archive.sqlite3"
    sync = rng.choice(["normal", "normal", "full"])
    env = {**os.environ, "NORMANDY_ARCHIVE_PATH": str(path), "NORMANDY_ARCHIVE_SYNC": sync}
    env.pop("NORMANDY_DISABLE_PLUGINS", None)
    agents: list[Agent] = []
    for k in range(rng.randint(2, 4)):
        killed = k == 0 or rng.random() < 0.5
        tag = f"{'killed' if killed else 'alive'}-{number}-{k}"
        window = rng.choice([12_000, 20_000, 40_000])
        messages = rng.randint(150, 420)
        err = (scratch / f"round-{number}-{k}.err").open("w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CRASH_AGENT,
                tag,
                str(rng.randrange(10**6)),
                str(messages),
                str(window),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
        err.close()  # the agent has its own descriptor of it
        agents.append(
            Agent(tag, proc, rng.randint(0, 4) if killed else None, rng.uniform(0, 0.015))
        )
    threads = [threading.Thread(target=a.follow) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    killed = [a for a in agents if a.proc.returncode == -signal.SIGKILL]
    for k, a in enumerate(agents):
        said = (scratch / f"round-{number}-{k}.err").read_text().strip()
        if a not in killed:  # a survivor, or one whose session ended before its kill came
            assert a.proc.returncode == 0, f"{a.tag} exited with {a.proc.returncode}: {said}"
            assert a.lines and a.lines[-1] == "end", f"{a.tag} did not finish: {said}"
        # the archive logs what it could not do (an index tried again later)
        assert "failed" not in said, f"{a.tag} logged: {said}"
    return len(killed), _check(path, agents, killed)


def _schemaless(path: Path) -> bool:
    """Whether the archive file holds no table yet."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    finally:
        conn.close()


def _check(path: Path, agents: list[Agent], killed: list[Agent]) -> int:
    """The checks of one round (see the module's docstring); compactions checked."""
    from normandy_archive import Archive
    from normandy_archive.schema import content_hash

    if not path.exists() or _schemaless(path):
        # every agent was killed before its first compaction's write (the file may exist:
        # WAL mode is set before the schema's transaction, and the archive opens such a
        # file as an empty one)
        assert not any(line.startswith("[") for a in agents for line in a.lines), "no archive"
        return 0
    wrong = unsound(path)
    assert wrong == [], "; ".join(wrong)
    sqlite_files = {path.name, path.name + "-wal", path.name + "-shm"}
    beside = [p.name for p in path.parent.iterdir() if p.name.startswith(path.name)]
    assert set(beside) <= sqlite_files, f"files beside the archive: {beside}"

    archive = Archive(path)
    try:
        stored = {item.content_hash: item for item in archive.list(limit=10**9)}
        seen: dict[str, set[str]] = {}
        checked = 0
        for a in agents:
            for line in a.lines:
                if line.startswith("["):
                    checked += 1
                    for content, whole in json.loads(line):
                        seen.setdefault(content, set()).add(whole)
        for content, wholes in seen.items():
            item = stored.get(content)
            assert item is not None, f"a committed compaction's content {content} is lost"
            assert item.entry.model_dump_json() == item.entry_json, f"{content} not as written"
            assert content_hash(item.entry) == content, f"{content} stored with other content"
            # the row is the first compaction's that dropped the content: an entry of an
            # agent that reported it, or of a killed one's last compaction (committed
            # before it could say so) when another agent dropped the same content
            digest = hashlib.sha256(item.entry_json.encode()).hexdigest()
            assert digest in wholes or item.session_id in {a.tag for a in killed}, (
                f"{content} stored with JSON no agent dropped (session {item.session_id})"
            )
        extra = {stored[c].session_id for c in set(stored) - set(seen)}
        assert extra <= {a.tag for a in killed}, f"content no agent reported: {extra}"
        archive.index()  # what the killed agents committed and did not index
    finally:
        archive.close()
    conn = sqlite3.connect(path)
    try:
        indexed = conn.execute(
            "SELECT value FROM archive_state WHERE key = 'indexed_seq'"
        ).fetchone()[0]
        top = conn.execute("SELECT max(seq) FROM entries").fetchone()[0]
        assert int(indexed) == int(top or 0), f"indexed up to {indexed} of {top}"
        conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('integrity-check')")
    finally:
        conn.close()
    return checked


def main(argv: list[str] | None = None) -> int:
    """``python scripts/archive_soak.py``: run rounds until the duration is spent."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--start", type=int, default=0, help="number of the first round")
    parser.add_argument("--rounds", type=int, default=None, help="at most this many rounds")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rounds = killed = checked = 0
    with tempfile.TemporaryDirectory(prefix="normandy-soak-") as scratch:
        number = args.start
        while time.monotonic() - started < args.duration and (
            args.rounds is None or rounds < args.rounds
        ):
            t0 = time.monotonic()
            try:
                k, c = _round(args.seed, number, Path(scratch))
            except AssertionError as exc:
                print(
                    f"round {number} FAILED: {exc} (replay: --seed {args.seed} --start {number} "
                    "--rounds 1)",
                    flush=True,
                )
                return 1
            rounds += 1
            killed += k
            checked += c
            print(
                f"round {number}: {k} killed, {c} compactions checked "
                f"({time.monotonic() - t0:.1f} s)",
                flush=True,
            )
            number += 1
    print(
        f"seed {args.seed}: {rounds} rounds, {killed} agents killed, {checked} compactions "
        f"checked in {time.monotonic() - started:.0f} s: nothing lost"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
