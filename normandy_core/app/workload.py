"""A deterministic generator of realistic agent sessions, for the demo, tests and benchmarks.

``generate_session(seed, messages=...)`` builds a coding agent's session: a system prompt,
user turns, assistant rounds of one to four parallel tool calls with thinking blocks, and
tool outputs of 200 to 4,000 characters of prose, source code, JSON, logs and test output.
The same seed always gives the same session, entry ids included.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from normandy_core.conversation.entries import (
    Block,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.memory import AgentMemory

__all__ = ["SYSTEM_PROMPT", "TOOLS", "SessionSpec", "generate_session"]

SYSTEM_PROMPT = (
    "You are a careful software engineering agent working in a Python repository. Use the "
    "tools to read files, search the code, run the tests and edit files. Explain what you "
    "change and why. Never invent file contents: read them first."
)

#: Tool definitions in the Anthropic shape (name, description, input_schema).
TOOLS: tuple[dict[str, object], ...] = (
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "search",
        "description": "Search the repository with a regular expression.",
        "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}},
    },
    {
        "name": "run_tests",
        "description": "Run the test suite, or the tests matching a selector.",
        "input_schema": {"type": "object", "properties": {"selector": {"type": "string"}}},
    },
    {
        "name": "edit_file",
        "description": "Replace a range of lines of a file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "patch": {"type": "string"}},
        },
    },
)

_MODULES = ["billing", "invoices", "auth", "sessions", "storage", "reports", "api", "cli", "sync"]
_NOUNS = ["invoice", "customer", "token", "ledger", "report", "session", "account", "cache"]
_VERBS = ["load", "save", "render", "validate", "merge", "refresh", "compute", "export"]
_PROSE = (
    "The function reads the configuration once at start-up and caches it for the process",
    "When the cache is stale the refresh path recomputes totals from the ledger",
    "That path is slow for large accounts and holds a lock while it runs",
    "The tests cover the happy path but not the currency rounding or the empty ledger",
    "Rounding happens twice: once when lines are added and again when rendering",
    "So totals can differ by a cent between the invoice and the ledger",
    "The fix is to keep amounts as integer cents and round exactly once at the end",
)


@dataclass(frozen=True)
class SessionSpec:
    """What :func:`generate_session` builds: sizes and proportions."""

    messages: int = 1_000
    min_output: int = 200
    max_output: int = 4_000
    thinking: bool = True
    max_parallel: int = 4
    rounds_per_turn: tuple[int, int] = (3, 12)


def _code(rng: random.Random, size: int) -> str:
    lines = [f'"""{rng.choice(_MODULES)} module."""', "", "from __future__ import annotations", ""]
    while sum(len(x) + 1 for x in lines) < size:
        verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
        lines += [
            f"def {verb}_{noun}(items: list[dict], *, strict: bool = False) -> int:",
            f'    """{verb.capitalize()} the {noun}s and return how many changed."""',
            "    changed = 0",
            "    for item in items:",
            f"        if strict and not item.get('{noun}_id'):",
            f"            raise ValueError('missing {noun}_id')",
            f"        item['total'] = round(item['amount'] * {rng.randint(2, 99)} / 100, 2)",
            "        changed += 1",
            "    return changed",
            "",
        ]
    return "\n".join(lines)[:size]


def _json(rng: random.Random, size: int) -> str:
    rows: list[dict[str, object]] = []
    while len(json.dumps(rows)) < size:
        rows.append(
            {
                "id": f"{rng.choice(_NOUNS)}_{rng.randint(1000, 99999)}",
                "amount": round(rng.uniform(1, 5000), 2),
                "currency": rng.choice(["EUR", "USD", "GBP"]),
                "status": rng.choice(["open", "paid", "void"]),
                "lines": rng.randint(1, 40),
            }
        )
    return json.dumps(rows, indent=1)[:size]


def _tests(rng: random.Random, size: int) -> str:
    out = ["============================= test session starts =============================="]
    number = 0
    while sum(len(x) + 1 for x in out) < size:
        number += 1
        mod, noun = rng.choice(_MODULES), rng.choice(_NOUNS)
        if rng.random() < 0.15:
            out += [
                f"FAILED tests/test_{mod}.py::test_{noun}_{number} - AssertionError: "
                f"assert {rng.randint(100, 999)}.{rng.randint(10, 99)} == "
                f"{rng.randint(100, 999)}.{rng.randint(10, 99)}",
                "Traceback (most recent call last):",
                f'  File "src/{mod}/{noun}.py", line {rng.randint(10, 400)}, in compute_{noun}',
                "    total = round(amount * rate, 2)",
            ]
        else:
            out.append(f"tests/test_{mod}.py::test_{noun}_{number} PASSED")
    return "\n".join(out)[:size]


def _prose(rng: random.Random, size: int) -> str:
    out: list[str] = []
    while sum(len(x) + 2 for x in out) < size:
        out.append(rng.choice(_PROSE).strip().rstrip(".") + ".")
    return " ".join(out)[:size]


def _tool_call(rng: random.Random) -> tuple[str, dict[str, str]]:
    mod, noun = rng.choice(_MODULES), rng.choice(_NOUNS)
    name = rng.choice(["read_file", "read_file", "search", "run_tests", "edit_file"])
    if name == "read_file":
        return name, {"path": f"src/{mod}/{noun}.py"}
    if name == "search":
        return name, {"pattern": f"def .*{noun}"}
    if name == "run_tests":
        return name, {"selector": f"tests/test_{mod}.py"}
    return name, {"path": f"src/{mod}/{noun}.py", "patch": f"@@ round once in {noun} @@"}


def _output(rng: random.Random, name: str, spec: SessionSpec) -> str:
    size = int(rng.uniform(spec.min_output, spec.max_output))
    if name == "read_file":
        return _code(rng, size)
    if name == "search":
        return _json(rng, size) if rng.random() < 0.5 else _code(rng, size)
    if name == "run_tests":
        return _tests(rng, size)
    return _prose(rng, size)


class _EntryIds:
    """The ids of a session's entries, in order: ``e{seed}-{n:07d}``, ``n`` from 1."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.issued = 0

    def new(self) -> str:
        """The next entry's id."""
        self.issued += 1
        return f"e{self.seed}-{self.issued:07d}"


def generate_session(
    seed: int = 0,
    messages: int = 1_000,
    spec: SessionSpec | None = None,
    *,
    end_mid_round: bool = False,
) -> AgentMemory:
    """A deterministic session of about ``messages`` entries (never fewer).

    With ``end_mid_round`` it stops right after a tool batch (an open round), as the
    conversation is at a mid-round boundary; otherwise it ends with a final answer.
    """
    spec = spec or SessionSpec(messages=messages)
    rng = random.Random(seed)
    ids = _EntryIds(seed)
    mem = AgentMemory()
    mem.add_message("system", SYSTEM_PROMPT, id=ids.new(), turn_id="t0000")
    turn = 0
    while len(mem) < spec.messages:
        turn += 1
        turn_id = f"t{turn:04d}"
        mem.add_message("user", _task(rng), id=ids.new(), turn_id=turn_id)
        for round_index in range(rng.randint(*spec.rounds_per_turn)):
            _add_tool_round(mem, rng, spec, ids, f"sig-{turn_id}-{round_index}", turn_id)
            if len(mem) >= spec.messages:
                if end_mid_round:
                    return mem
                break
        final: list[Block] = []
        if spec.thinking:
            final.append(ThinkingBlock(thinking=_prose(rng, 300), signature=f"sig-{turn_id}-final"))
        final.append(TextBlock(text=_prose(rng, rng.randint(200, 800))))
        mem.add_message("assistant", tuple(final), id=ids.new(), turn_id=turn_id)
    return mem


def _task(rng: random.Random) -> str:
    """A user's request that opens a turn."""
    module = rng.choice(_MODULES)
    return (
        f"In the {module} module, {rng.choice(_PROSE).lower().strip()}. Please investigate "
        "and fix it, then run the tests."
    )


def _add_tool_round(
    mem: AgentMemory,
    rng: random.Random,
    spec: SessionSpec,
    ids: _EntryIds,
    signature: str,
    turn_id: str,
) -> None:
    """Add one round: an assistant message (thinking signed ``signature``, maybe text,
    one to ``spec.max_parallel`` tool calls) and the user message of their results."""
    blocks: list[Block] = []
    if spec.thinking:
        blocks.append(
            ThinkingBlock(thinking=_prose(rng, rng.randint(120, 600)), signature=signature)
        )
    if rng.random() < 0.4:
        blocks.append(TextBlock(text=_prose(rng, rng.randint(60, 240))))
    uses: list[ToolUseBlock] = []
    for _ in range(rng.randint(1, spec.max_parallel)):
        name, args = _tool_call(rng)
        # unique in the session: the entries issued so far place the round, len(uses) the call
        use_id = f"toolu_{ids.seed}_{ids.issued:07d}_{len(uses)}"
        uses.append(ToolUseBlock(id=use_id, name=name, input=args))
    blocks.extend(uses)
    mem.add_message("assistant", tuple(blocks), id=ids.new(), turn_id=turn_id)
    results = tuple(
        ToolResultBlock(
            tool_use_id=use.id,
            content=_output(rng, use.name, spec),
            is_error=rng.random() < 0.05,
        )
        for use in uses
    )
    mem.add_message("user", results, id=ids.new(), turn_id=turn_id)
