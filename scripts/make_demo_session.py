"""Generate the demo session bundled with normandy_core (run once; the output is committed).

    uv run python scripts/make_demo_session.py [--seed 7] [--messages 1000]

Writes ``normandy_core/data/demo_session.jsonl.gz``: a header line, then one line per
turn with the user's message, the assistant replies in order (Anthropic-shaped blocks)
and the recorded tool outputs in call order. ``normandy demo`` replays it through the
real turn loop. The file is deterministic for a given seed (gzip mtime is fixed).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
from normandy_core.transcripts.anthropic import block_to_anthropic

OUT = Path(__file__).resolve().parent.parent / "normandy_core" / "data" / "demo_session.jsonl.gz"


def build(seed: int, messages: int) -> list[dict[str, Any]]:
    """The session as JSON-ready lines: a header, then one record per turn."""
    memory = generate_session(seed, messages=messages)
    lines: list[dict[str, Any]] = [
        {
            "format": "normandy.demo-session",
            "version": 1,
            "seed": seed,
            "system": SYSTEM_PROMPT,
            "tools": list(TOOLS),
        }
    ]
    turn: dict[str, Any] | None = None
    for entry in memory.entries():
        if entry.role == "system":
            continue
        if entry.role == "user" and isinstance(entry.content, str):
            turn = {"turn_id": entry.turn_id, "user": entry.content, "replies": [], "outputs": []}
            lines.append(turn)
            continue
        assert turn is not None, "a session starts with a user message"
        if entry.role == "assistant":
            turn["replies"].append([block_to_anthropic(b) for b in entry.blocks])
        else:
            for r in entry.tool_results:
                turn["outputs"].append(
                    {"tool_use_id": r.tool_use_id, "content": r.text(), "is_error": r.is_error}
                )
    return lines


def main() -> None:
    """Write the demo session file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    lines = build(args.seed, args.messages)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    with (
        open(args.out, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
    ):
        gz.write(payload.encode("utf-8"))
    turns = len(lines) - 1
    batches = sum(len(t["replies"]) - 1 for t in lines[1:])
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes): {turns} turns, {batches} batches")


if __name__ == "__main__":
    main()
