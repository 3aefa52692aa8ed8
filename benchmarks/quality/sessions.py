"""The sessions of the quality benchmark: agent sessions with planted facts and later needs.

A :class:`QualitySession` is a recorded (or generated) agent session in the shape the
turn loop replays (the demo's: per turn, the user's message, the model's replies in
order and the tool outputs in order), plus:

- **facts**: exact strings (a file path, an id, an error message, a user constraint)
  planted at a known point: in the user message of a turn, or in one tool output;
- **needs**: later model calls, at known points, that need a fact, with the keywords a
  model would search for it with (its ``query``; it names what the model knows about
  the fact, never the fact itself).

Points are *calls*: call ``c`` of turn ``t`` is the ``c``-th model request of that turn
(call 0 follows the user message, call ``c`` follows the tool batch of reply ``c - 1``).

The JSON form (:func:`dump` / :func:`load`) is one object::

    {"format": "normandy.quality-session", "version": 1, "name": "...",
     "system": "...", "tools": [...],
     "turns": [{"turn_id": "t0001", "user": "...", "replies": [[block, ...], ...],
                "outputs": [{"tool_use_id": "...", "content": "...", "is_error": false}]}],
     "facts": [{"id": "f01", "kind": "path", "text": "...", "turn": 3, "output": 5}],
     "needs": [{"fact": "f01", "turn": 9, "call": 2, "query": "kestrel hotfix file"}]}

``output`` is the index of the tool output holding the fact in its turn's ``outputs``,
or ``null`` when the fact is in the turn's user message. Blocks are Normandy's
(Anthropic-shaped) block dicts. :func:`generated` builds sessions from
:func:`normandy_core.app.workload.generate_session`; :func:`recorded` plants facts into the
demo's bundled recorded session; :func:`plant` does the planting for both, seeded.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
from normandy_core.conversation.entries import ToolResultBlock
from normandy_core.conversation.memory import AgentMemory

__all__ = [
    "FORMAT",
    "Fact",
    "FactKind",
    "Need",
    "QualitySession",
    "Turn",
    "default_sessions",
    "dump",
    "generated",
    "load",
    "plant",
    "recorded",
    "tiny",
]

FORMAT = "normandy.quality-session"

FactKind = Literal["path", "id", "error", "constraint"]


@dataclass(frozen=True)
class Turn:
    """One turn: the user's message, the model's replies in order, the tool outputs in order."""

    turn_id: str
    user: str
    replies: tuple[tuple[Mapping[str, Any], ...], ...]
    outputs: tuple[Mapping[str, Any], ...]

    def batch_of_output(self) -> list[int]:
        """For each output, the index of the reply whose tool call it answers."""
        out: list[int] = []
        for r, blocks in enumerate(self.replies):
            out += [r] * sum(1 for b in blocks if b.get("type") == "tool_use")
        return out


@dataclass(frozen=True)
class Fact:
    """A planted fact: its exact ``text``, in turn ``turn``'s user message (``output`` None)
    or in its output number ``output``."""

    id: str
    kind: FactKind
    text: str
    turn: int
    output: int | None


@dataclass(frozen=True)
class Need:
    """Call ``call`` of turn ``turn`` needs fact ``fact``; a model would search ``query``."""

    fact: str
    turn: int
    call: int
    query: str


@dataclass(frozen=True)
class QualitySession:
    """A session to replay, with its planted facts and the needs for them."""

    name: str
    system: str
    tools: tuple[Mapping[str, Any], ...]
    turns: tuple[Turn, ...]
    facts: tuple[Fact, ...] = ()
    needs: tuple[Need, ...] = ()

    @property
    def calls(self) -> int:
        """How many model calls the session makes (one per recorded reply)."""
        return sum(len(t.replies) for t in self.turns)

    def fact(self, fact_id: str) -> Fact:
        """The fact named ``fact_id``."""
        for f in self.facts:
            if f.id == fact_id:
                return f
        raise KeyError(f"{self.name}: no fact {fact_id!r}")

    def check(self) -> None:
        """Raise ``ValueError`` when a fact is not where it says or a need comes before it."""
        for f in self.facts:
            turn = self.turns[f.turn]
            where = turn.user if f.output is None else str(turn.outputs[f.output]["content"])
            if f.text not in where:
                raise ValueError(f"{self.name}: fact {f.id} is not in turn {f.turn}")
        for n in self.needs:
            f = self.fact(n.fact)
            first = (
                f.turn,
                0 if f.output is None else self.turns[f.turn].batch_of_output()[f.output] + 1,
            )
            if (n.turn, n.call) < first:
                raise ValueError(f"{self.name}: need for {f.id} at {n.turn}/{n.call} precedes it")
            if n.call >= len(self.turns[n.turn].replies):
                raise ValueError(f"{self.name}: turn {n.turn} has no call {n.call}")
            if f.text in n.query:
                raise ValueError(f"{self.name}: the query for {f.id} holds the fact itself")


# -- JSON --------------------------------------------------------------------------------


def dump(session: QualitySession, path: str | Path) -> Path:
    """Write ``session`` as JSON (the module's format) and return the path."""
    out = Path(path)
    doc = {
        "format": FORMAT,
        "version": 1,
        "name": session.name,
        "system": session.system,
        "tools": [dict(t) for t in session.tools],
        "turns": [
            {
                "turn_id": t.turn_id,
                "user": t.user,
                "replies": [[dict(b) for b in r] for r in t.replies],
                "outputs": [dict(o) for o in t.outputs],
            }
            for t in session.turns
        ],
        "facts": [asdict(f) for f in session.facts],
        "needs": [asdict(n) for n in session.needs],
    }
    out.write_text(json.dumps(doc, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def load(path: str | Path) -> QualitySession:
    """Read a session written by :func:`dump`; ``ValueError`` names the file and the fault."""
    source = Path(path)
    try:
        doc = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON: {exc.msg}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{source}: not a quality session (format {FORMAT!r})")
    try:
        session = QualitySession(
            name=str(doc["name"]),
            system=str(doc["system"]),
            tools=tuple(doc["tools"]),
            turns=tuple(
                Turn(
                    turn_id=str(t["turn_id"]),
                    user=str(t["user"]),
                    replies=tuple(tuple(r) for r in t["replies"]),
                    outputs=tuple(t["outputs"]),
                )
                for t in doc["turns"]
            ),
            facts=tuple(Fact(**f) for f in doc.get("facts", [])),
            needs=tuple(Need(**n) for n in doc.get("needs", [])),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{source}: malformed quality session: {exc!r}") from exc
    session.check()
    return session


# -- sources -------------------------------------------------------------------------------


def from_memory(name: str, memory: AgentMemory) -> QualitySession:
    """A session (no facts yet) from a generated conversation: system, then turns."""
    turns: list[Turn] = []
    user = ""
    turn_id = ""
    replies: list[tuple[Mapping[str, Any], ...]] = []
    outputs: list[Mapping[str, Any]] = []

    def close() -> None:
        if user:
            turns.append(Turn(turn_id, user, tuple(replies), tuple(outputs)))

    for e in memory.entries():
        if e.role == "system":
            continue
        if e.role == "user" and isinstance(e.content, str):
            close()
            user, turn_id, replies, outputs = e.content, str(e.turn_id), [], []
        elif e.role == "assistant":
            dumped = e.model_dump(mode="json")["content"]
            replies.append(tuple(dumped))
        else:
            for b in e.blocks:
                assert isinstance(b, ToolResultBlock)
                outputs.append(
                    {"tool_use_id": b.tool_use_id, "content": b.text(), "is_error": b.is_error}
                )
    close()
    return QualitySession(name, SYSTEM_PROMPT, TOOLS, tuple(turns))


def generated(seed: int, messages: int) -> QualitySession:
    """A generated coding-agent session of about ``messages`` entries, facts planted."""
    mem = generate_session(seed, messages)
    return plant(from_memory(f"generated (seed {seed}, {len(mem):,} messages)", mem), seed)


def recorded(turns: int | None = None, seed: int = 7) -> QualitySession:
    """The demo's bundled recorded session (its first ``turns`` turns), facts planted."""
    from normandy_core.app.demo import load_session

    demo = load_session()
    chosen = demo.turns if turns is None else demo.turns[:turns]
    base = QualitySession(
        f"recorded (the demo's session, {len(chosen)} turns)",
        demo.system,
        tuple(demo.tools),
        tuple(
            Turn(t.turn_id, t.user, tuple(tuple(r["content"]) for r in t.replies), t.outputs)
            for t in chosen
        ),
    )
    return plant(base, seed)


# -- planting --------------------------------------------------------------------------------

#: Names that occur nowhere in the generated or recorded sessions: what the model knows a
#: fact by (the project's codename for it), so its query can name it.
_TOPICS = (
    "kestrel", "ostrava", "quokka", "marlin", "juniper", "basalt", "tundra", "saffron",
    "orchid", "falcon", "zephyr", "nimbus", "cobalt", "garnet", "lichen", "mosaic",
    "obsidian", "pelican", "quasar", "raven", "sequoia", "topaz", "umber", "vortex",
    "walnut", "yarrow", "azalea", "bramble", "cedar", "dahlia", "ember", "fennel",
    "glacier", "heron", "indigo", "jasper", "krypton", "lotus", "magnolia", "nebula",
    "onyx", "peregrine", "quill", "rosemary", "sparrow", "thistle", "uplift", "verbena",
)  # fmt: skip
_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def _token(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(n))


def _fact(rng: random.Random, kind: FactKind, topic: str) -> tuple[str, str, str]:
    """``(fact text, the line that carries it, the query a model would search it by)``."""
    if kind == "path":
        path = (
            f"src/{topic}/{rng.choice(['shim', 'adapter', 'bridge'])}_{_token(rng, 4).lower()}.py"
        )
        return path, f"# NOTE: the {topic} hotfix lives in {path}", f"{topic} hotfix file"
    if kind == "id":
        value = f"{topic[:3]}_{_token(rng, 10)}"
        return (
            value,
            f'{{"note": "{topic} migration batch", "batch_id": "{value}"}}',
            f"{topic} migration batch id",
        )
    if kind == "error":
        name = topic.capitalize() + "Error"
        text = (
            f"{name}: checksum mismatch in segment {rng.randint(100, 999)} "
            f"(expected {_token(rng, 8)}, got {_token(rng, 8)})"
        )
        return text, f"E   {text}", f"{name} checksum mismatch"
    text = (
        f"never edit src/{topic}/schema_{_token(rng, 4).lower()}.sql and keep the {topic} "
        f"API at version {rng.randint(2, 9)}.{rng.randint(0, 20)}"
    )
    return text, f"Constraint for the {topic} work: {text}.", f"{topic} constraint API version"


def _with_line(content: str, line: str, rng: random.Random) -> str:
    lines = content.split("\n")
    at = rng.randint(len(lines) // 4, max(len(lines) * 3 // 4, len(lines) // 4))
    return "\n".join([*lines[:at], line, *lines[at:]])


def plant(base: QualitySession, seed: int, *, facts: int | None = None) -> QualitySession:
    """``base`` with facts planted and needs placed, deterministically from ``seed``.

    The task message (turn 0) gets a user constraint, needed again late in the session.
    Then about one fact per two turns (or ``facts``) is planted, in a tool output (a path,
    an id, an error) or a later turn's user message (a constraint), each needed twice:
    soon (within the next few calls) and much later (a quarter to two thirds of the
    session's calls on).
    """
    rng = random.Random(seed * 7919 + 1)
    turns = list(base.turns)
    calls = [(t, c) for t, turn in enumerate(turns) for c in range(len(turn.replies))]
    index = {tc: i for i, tc in enumerate(calls)}
    topics = list(_TOPICS)
    rng.shuffle(topics)
    out_facts: list[Fact] = []
    needs: list[Need] = []

    def need_at(fact: Fact, first: int, offset: int, query: str) -> None:
        at = first + offset
        if at < len(calls):
            t, c = calls[at]
            needs.append(Need(fact.id, t, c, query))

    # The task: a user constraint in the first user message, needed late.
    topic = topics.pop()
    text, line, query = _fact(rng, "constraint", topic)
    turns[0] = replace(turns[0], user=f"{turns[0].user} {line}")
    task = Fact("f00", "constraint", text, 0, None)
    out_facts.append(task)
    for share in (0.35, 0.7, 0.95):
        need_at(task, 0, int(share * (len(calls) - 1)), query)

    wanted = facts if facts is not None else max(len(turns) // 2, 2)
    wanted = min(wanted, len(topics))
    for k in range(1, wanted + 1):
        t = rng.randrange(0, max(len(turns) * 2 // 3, 1))
        turn = turns[t]
        kind: FactKind = rng.choice(("path", "id", "error", "path", "id", "error", "constraint"))
        topic = topics.pop()
        text, line, query = _fact(rng, kind, topic)
        if kind == "constraint" or not turn.outputs:
            kind = "constraint"
            text, line, query = _fact(rng, "constraint", topic)
            turns[t] = replace(turn, user=f"{turn.user} {line}")
            fact = Fact(f"f{k:02d}", kind, text, t, None)
            first = index[(t, 0)]
        else:
            o = rng.randrange(len(turn.outputs))
            outputs = list(turn.outputs)
            rec = dict(outputs[o])
            rec["content"] = _with_line(str(rec["content"]), line, rng)
            outputs[o] = rec
            turns[t] = replace(turn, outputs=tuple(outputs))
            fact = Fact(f"f{k:02d}", kind, text, t, o)
            first = index[(t, turn.batch_of_output()[o] + 1)]
        out_facts.append(fact)
        need_at(fact, first, rng.randint(1, 6), query)
        remaining = len(calls) - first
        need_at(fact, first, rng.randint(remaining // 4, max(remaining * 2 // 3, 1)), query)
    session = replace(base, turns=tuple(turns), facts=tuple(out_facts), needs=tuple(needs))
    session.check()
    return session


def tiny(seed: int = 5) -> QualitySession:
    """A small generated session with three facts: the benchmark's test case."""
    mem = generate_session(seed, 160)
    return plant(from_memory(f"tiny (seed {seed})", mem), seed, facts=3)


def default_sessions(quick: bool = False) -> list[QualitySession]:
    """The benchmark's sessions: two generated ones and the recorded demo session."""
    if quick:
        return [generated(11, 500), recorded(turns=20)]
    return [generated(11, 1_000), generated(12, 1_000), recorded()]
