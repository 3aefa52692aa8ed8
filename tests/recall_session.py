"""A short agent session whose model needs a tool output after compaction dropped it.

Shared by the recall tests of the core, the archive (SQLite and PostgreSQL) and the
real clients: the first tool output holds :data:`FACT`; five more reads push it out of
a small window; the model then calls ``recall`` and answers with whether the fact came
back. Importable from every test module (``tests`` is on pytest's ``pythonpath``).
"""

from __future__ import annotations

from typing import Any

from normandy_core import AgentConfig, TextBlock, ToolUseBlock
from normandy_core.clients import ModelReply, ScriptedRequest

__all__ = [
    "FACT",
    "READ_FILE",
    "WINDOW",
    "agent",
    "calls",
    "read_file",
    "script_actions",
    "scripted_replies",
]

#: A fact only the first tool output holds.
FACT = "ERR-7731: ledger rounding drifts by 0.004 per invoice in billing/ledger.py"
READ_FILE = {
    "name": "read_file",
    "description": "Read a file.",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
#: window_manager's options: a window the session outgrows after a few reads.
WINDOW = {"context_window": 2600, "reserved_tokens": 300, "target": 0.5}
#: How many files the session reads after the ledger.
READS = 5


def read_file(path: str) -> str:
    """The ledger holds the fact; every other file is filler of about 700 tokens."""
    if path == "billing/ledger.py":
        return f"# {FACT}\ndef post(invoice):\n    return round(invoice.total, 2)\n"
    return "\n".join(f"def helper_{k}(x):\n    return x * {k}  # {path}" for k in range(60))


def calls(n: int, *pairs: tuple[str, dict[str, Any]]) -> ModelReply:
    """A reply calling tools ``pairs`` (name, input), with ids ``call_<n>_<k>``."""
    return ModelReply(
        content=tuple(
            ToolUseBlock(id=f"call_{n}_{k}", name=name, input=args)
            for k, (name, args) in enumerate(pairs)
        )
    )


def agent(**changes: Any) -> AgentConfig:
    """The session's agent: window_manager on a small window, recall on."""
    base: dict[str, Any] = {
        "model": "gpt-4o",
        "system_prompt": "You are a careful coding agent.",
        "tools": [READ_FILE],
        "compactor": "window_manager",
        "compactor_opts": WINDOW,
        "recall": True,
    }
    base.update(changes)
    return AgentConfig(**base)


def scripted_replies(query: str) -> list[Any]:
    """The scripted client's replies: read, read until the fact is dropped, recall it with
    ``query``, answer ``found the fact: yes`` when the recall result holds it."""

    def recall_call(req: ScriptedRequest) -> ModelReply:
        seen = "\n".join(e.text() for e in req.messages)
        assert FACT not in seen, "the fact must have been dropped before the model recalls it"
        markers = [e for e in req.messages if e.metadata.get("normandy.compaction_marker")]
        assert markers and "`recall` tool brings them back" in markers[-1].text()
        return calls(9, ("recall", {"query": query}))

    def answer(req: ScriptedRequest) -> ModelReply:
        result = req.messages[-1].tool_results[0]
        found = "yes" if FACT in result.text() else "no"
        return ModelReply(content=(TextBlock(text=f"found the fact: {found}"),))

    return [
        calls(1, ("read_file", {"path": "billing/ledger.py"})),
        *[calls(n, ("read_file", {"path": f"src/mod_{n}.py"})) for n in range(2, 2 + READS)],
        recall_call,
        answer,
    ]


def script_actions(query: str) -> list[dict[str, Any]]:
    """The same session as actions of the loopback providers (tests/clients/servers.py)."""
    return [
        {"tools": [("read_file", {"path": "billing/ledger.py"})]},
        *[{"tools": [("read_file", {"path": f"src/mod_{n}.py"})]} for n in range(2, 2 + READS)],
        {"tools": [("recall", {"query": query})]},
        {"text": "Done."},
    ]
