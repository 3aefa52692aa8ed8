"""Sessions for the tiered recall benchmark (issue 35 item 4): facts beside distractors.

A :class:`TieredSession` is a generated coding-agent session (the quality benchmark's
filler) into which facts are planted next to lines that differ from them only in what
distinguishes them:

- **error**: an error line of a job in a region, beside the same line for other jobs and
  regions (``ERROR job=ingest-nightly region=eu-west-2: ...``);
- **path**: a file path, beside its siblings in the same directory and a file of the
  same name in a sibling directory;
- **setting**: a value the user set and then changed twice: only the latest is right, the
  earlier two are *stale*;
- **batch**: one line of one result of a tool batch of many results whose other results
  hold the same words (each result a few hundred tokens, the batch more than a recall
  result's bound);
- **task**: a constraint in the task message, beside notes about other modules' APIs.

Each fact is needed early (one to six calls after it was planted) and late (half to 95 % of
the rest of the session on); the task's constraint at 35, 70 and 95 % of
the session. A need is asked in three query tiers (:data:`TIERS`):

- ``exact``: the distinguishing words exactly (job and region, directory and file name,
  the setting's key), with words the distractors share; never a token found only in the
  fact (:func:`unique_tokens` checks it);
- ``paraphrase``: the shared words plus a paraphrase of what distinguishes the fact;
- ``meaning``: no word in common with the fact but stop words (:func:`meaning_overlap`).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from benchmarks.quality.sessions import QualitySession, Turn, from_memory
from normandy_core.app.workload import generate_session

__all__ = [
    "STOPWORDS",
    "TIERS",
    "Kind",
    "Tier",
    "TieredFact",
    "TieredNeed",
    "TieredSession",
    "Timing",
    "build",
    "default_sessions",
    "meaning_overlap",
    "session_text",
    "unique_tokens",
    "words",
]

Tier = Literal["exact", "paraphrase", "meaning"]
TIERS: tuple[Tier, ...] = ("exact", "paraphrase", "meaning")
Timing = Literal["early", "late", "task"]
Kind = Literal["error", "path", "setting", "batch", "task"]

#: Words a meaning-only query may share with its fact.
STOPWORDS = frozenset((
    "a", "an", "and", "are", "at", "be", "by", "did", "do", "does", "for", "from", "how",
    "i", "in", "is", "it", "its", "me", "my", "of", "on", "or", "that", "the", "this", "to",
    "was", "we", "what", "when", "where", "which", "who", "why", "with",
))  # fmt: skip


@dataclass(frozen=True)
class TieredFact:
    """A planted fact: its exact ``text``, the lines it must be told from, its queries.

    ``turn``/``output`` is where it was planted (``output`` None: the turn's user
    message); ``distractors`` are near-identical lines, ``stale`` the superseded values of
    a setting; ``queries`` maps each tier to the words the model searches with.
    """

    id: str
    kind: Kind
    text: str
    turn: int
    output: int | None
    distractors: tuple[str, ...]
    stale: tuple[str, ...]
    queries: Mapping[Tier, str]


@dataclass(frozen=True)
class TieredNeed:
    """Call ``call`` of turn ``turn`` needs fact ``fact``; ``timing`` says how soon."""

    fact: str
    turn: int
    call: int
    timing: Timing


@dataclass(frozen=True)
class TieredSession:
    """A session to replay (``base``: its turns) with its facts and needs."""

    base: QualitySession
    facts: tuple[TieredFact, ...]
    needs: tuple[TieredNeed, ...]

    @property
    def name(self) -> str:
        """The session's name."""
        return self.base.name

    def fact(self, fact_id: str) -> TieredFact:
        """The fact named ``fact_id``."""
        for f in self.facts:
            if f.id == fact_id:
                return f
        raise KeyError(f"{self.name}: no fact {fact_id!r}")

    def check(self) -> None:
        """Raise ``ValueError`` when a fact or rival is not planted, or a need precedes it."""
        text = session_text(self.base)
        for f in self.facts:
            turn = self.base.turns[f.turn]
            where = turn.user if f.output is None else str(turn.outputs[f.output]["content"])
            if f.text not in where:
                raise ValueError(f"{self.name}: fact {f.id} is not in turn {f.turn}")
            for rival in (*f.distractors, *f.stale):
                if rival not in text:
                    raise ValueError(f"{self.name}: {f.id}'s rival {rival!r} is not planted")
        for n in self.needs:
            if (n.turn, n.call) <= self.plant_call(self.fact(n.fact)):
                raise ValueError(f"{self.name}: need for {n.fact} at {n.turn}/{n.call} too early")

    def plant_call(self, fact: TieredFact) -> tuple[int, int]:
        """The first call that can see ``fact``: ``(turn, call)``."""
        if fact.output is None:
            return fact.turn, 0
        return fact.turn, self.base.turns[fact.turn].batch_of_output()[fact.output] + 1


# -- the vocabularies: (exact word, paraphrase) pairs --------------------------------------

_VERBS = {
    "ingest": "loading of incoming records",
    "export": "outbound data dump",
    "reindex": "catalogue rebuild",
    "backup": "snapshot copying",
    "rollup": "aggregation of counters",
}
_CADENCES = {"nightly": "overnight", "hourly": "every sixty minutes", "weekly": "once a week"}
_REGIONS = {
    "eu-west-2": "London",
    "eu-west-1": "Ireland",
    "us-east-1": "Virginia",
    "us-west-2": "Oregon",
    "ap-south-1": "Mumbai",
    "eu-central-1": "Frankfurt",
}
#: (error text shared by the family, its key words, what it means in other words)
_ERRORS = (
    (
        "upload to object storage failed: connection reset by peer after 3 retries",
        "upload failed connection reset",
        "pushing blobs into the bucket broke because the link dropped",
    ),
    (
        "disk quota exceeded while writing the staging table",
        "disk quota exceeded staging table",
        "ran out of space during the temporary load",
    ),
    (
        "TLS handshake timed out contacting the metrics gateway",
        "TLS handshake timed out gateway",
        "secure negotiation hung when reaching the telemetry endpoint",
    ),
    (
        "schema validation rejected 214 rows of the input",
        "schema validation rejected rows",
        "records refused by format checks",
    ),
)
_AREAS = {
    "billing": ("charging customers", {"invoices": "bills", "payments": "money received"}),
    "auth": ("sign-in", {"sessions": "logged-in state", "tokens": "access credentials"}),
    "search": ("lookup", {"indexer": "building lookup tables", "ranking": "ordering hits"}),
    "storage": ("persistence", {"buckets": "blob containers", "snapshots": "point-in-time copies"}),
}
_FILES = {
    "rounding": "rounds amounts to cents",
    "totals": "adds up sums",
    "currency": "converts money units",
    "retries": "tries again after failures",
    "limits": "caps usage",
    "cleanup": "removes leftovers",
}
#: (key, shared word plus paraphrase, meaning only)
_SETTINGS = (
    (
        "payments.retry_limit",
        "payments how many retries",
        "how many times checkout should try again",
    ),
    (
        "search.batch_size",
        "search how many documents per chunk",
        "how many documents the lookup service handles per chunk",
    ),
    ("uploads.max_file_mb", "uploads largest attachment", "biggest attachment a person may send"),
    (
        "cache.ttl_seconds",
        "cache how long entries stay valid",
        "how long stored answers stay fresh",
    ),
    ("worker.pool_size", "worker how many parallel threads", "how many things run at once"),
)
_SERVICES = {
    "checkout": "completing purchases",
    "catalog": "product listings",
    "notifier": "sending emails and texts",
    "gateway": "front door for incoming traffic",
    "scheduler": "timed jobs",
    "thumbnailer": "shrinking images",
    "recommender": "suggesting products",
    "geocoder": "turning addresses into coordinates",
}
#: (file prefix, the fact line's format, its key words, what it means in other words)
_BATCHES = (
    (
        "deploy",
        "{svc} deploy: replicas={a} memory={b}Mi",
        "deploy replicas memory",
        "how many copies of {para} run and how much RAM each gets",
    ),
    (
        "alerts",
        "{svc} alert: p99 latency above {b} ms for {a} minutes pages oncall",
        "alert latency pages oncall",
        "when someone gets woken up about slow responses from {para}",
    ),
    (
        "quotas",
        "{svc} quota: {a} requests per second, burst {b}",
        "quota requests burst",
        "how much traffic {para} may accept",
    ),
)


# -- planting ----------------------------------------------------------------------------------


def _insert(content: str, line: str, rng: random.Random) -> str:
    """``content`` with ``line`` inserted between two of its lines, seeded."""
    lines = content.split("\n")
    at = rng.randint(1, max(len(lines) - 1, 1))
    return "\n".join([*lines[:at], line, *lines[at:]])


class _Planter:
    """The mutable state of one planting: the turns, the facts so far, the used turns."""

    def __init__(self, base: QualitySession, rng: random.Random) -> None:
        self.turns = list(base.turns)
        self.rng = rng
        self.facts: list[TieredFact] = []

    def into_output(self, near: int, line: str, avoid: set[int]) -> tuple[int, int]:
        """Put ``line`` into an output of a turn near ``near`` not in ``avoid``."""
        rng = self.rng
        choices = [
            t
            for t in range(max(near - 4, 1), min(near + 5, len(self.turns)))
            if t not in avoid and self.turns[t].outputs
        ]
        if near not in avoid and self.turns[near].outputs:
            t = near
        else:  # the nearest turns first; any turn with outputs if none is free near
            t = rng.choice(choices or [u for u, x in enumerate(self.turns) if x.outputs and u])
        outputs = list(self.turns[t].outputs)
        o = rng.randrange(len(outputs))
        rec = dict(outputs[o])
        rec["content"] = _insert(str(rec["content"]), line, rng)
        outputs[o] = rec
        self.turns[t] = replace(self.turns[t], outputs=tuple(outputs))
        avoid.add(t)
        return t, o

    def into_user(self, t: int, sentence: str) -> None:
        """Append ``sentence`` to turn ``t``'s user message."""
        self.turns[t] = replace(self.turns[t], user=f"{self.turns[t].user} {sentence}")

    def lines_beside(self, t: int, fact: str, others: Sequence[str]) -> tuple[int, int]:
        """Plant ``fact`` at turn ``t`` and each of ``others`` in another turn near it."""
        used: set[int] = set()
        where = self.into_output(t, fact, used)
        for d in others:
            self.into_output(t, d, used)
        return where


def _error(p: _Planter, k: int, t: int) -> TieredFact:
    rng = p.rng
    text, key, meaning = _ERRORS[k // 4 % len(_ERRORS)]
    verbs, cadences, regions = (rng.sample(list(d), 2) for d in (_VERBS, _CADENCES, _REGIONS))
    v, c, r = verbs[0], cadences[0], regions[0]
    # each distinguishing word of the fact is in a distractor: none is unique to it
    combos = [(v, cadences[1], r), (verbs[1], c, r), (v, c, regions[1]), (verbs[1], c, regions[1])]
    fact, *others = (f"ERROR job={a}-{b} region={z}: {text}" for a, b, z in [(v, c, r), *combos])
    turn, out = p.lines_beside(t, fact, others)
    para = f"{_VERBS[v]} {_CADENCES[c]} in {_REGIONS[r]}"
    queries: dict[Tier, str] = {
        "exact": f"{v}-{c} {r} {key}",
        "paraphrase": f"{key} {para}",
        "meaning": f"{meaning}, for the {para}",
    }
    return TieredFact(f"f{k:02d}", "error", fact, turn, out, tuple(others), (), queries)


def _path(p: _Planter, k: int, t: int) -> TieredFact:
    rng = p.rng
    area = list(_AREAS)[k // 4 % len(_AREAS)]
    area_para, modules = _AREAS[area]
    module, sibling = rng.sample(list(modules), 2)
    name, *names = rng.sample(list(_FILES), 4)
    path = f"src/{area}/{module}/{name}.py"
    others = [f"src/{area}/{module}/{n}.py" for n in names] + [f"src/{area}/{sibling}/{name}.py"]
    turn, out = p.lines_beside(t, f"M  {path}  (+12 -3)", [f"M  {o}  (+12 -3)" for o in others])
    queries: dict[Tier, str] = {
        "exact": f"{area} {module} {name}",
        "paraphrase": f"{area} {module} file that {_FILES[name]}",
        "meaning": f"code for {area_para} {modules[module]} that {_FILES[name]}",
    }
    return TieredFact(f"f{k:02d}", "path", path, turn, out, tuple(others), (), queries)


def _setting(p: _Planter, k: int, t: int) -> TieredFact:
    key, para, meaning = _SETTINGS[k // 4 % len(_SETTINGS)]
    values = p.rng.sample(range(10, 99), 3)  # two digits: none is a prefix of another
    said = (
        "Please set {} to {} for this work.",
        "Change of plan: set {} to {}.",
        "Now set {} to {}.",
    )
    for step, (template, value) in enumerate(zip(said, values, strict=True)):
        p.into_user(t - 6 + 3 * step, template.format(key, value))
    lines = [f"set {key} to {v}" for v in values]
    queries: dict[Tier, str] = {"exact": key, "paraphrase": para, "meaning": meaning}
    return TieredFact(f"f{k:02d}", "setting", lines[-1], t, None, (), tuple(lines[:2]), queries)


def _batch_turn(p: _Planter, k: int, t: int, lines: Sequence[str], prefix: str) -> None:
    """Insert after turn ``t`` a turn that reads one file per service in one batch."""
    rng = p.rng
    ids = [f"toolu_batch{k}_{i}" for i in range(len(lines))]
    svcs = [line.split(" ", 1)[0] for line in lines]
    uses = [
        {"type": "tool_use", "id": i, "name": "read_file", "input": {"path": f"{prefix}/{s}.yaml"}}
        for i, s in zip(ids, svcs, strict=True)
    ]
    thinking = {"type": "thinking", "thinking": "Read every service's file.", "signature": "s"}
    outputs = []
    for i, s, line in zip(ids, svcs, lines, strict=True):
        filler = [
            f"{s}: pod {s}-{rng.getrandbits(24):06x} ready after {rng.randint(80, 900)} ms"
            for _ in range(14)
        ]
        filler.insert(rng.randint(2, len(filler)), line)
        body = "\n".join([f"# {prefix}/{s}.yaml", f"service: {s}", *filler])
        outputs.append({"tool_use_id": i, "content": body, "is_error": False})
    done = ({"type": "text", "text": "I have read the files."},)
    user = f"Read the {prefix} files of every service."
    turn = Turn(f"t{t:04d}b{k}", user, ((thinking, *uses), done), tuple(outputs))
    p.turns.insert(t + 1, turn)


def _batch(p: _Planter, k: int, t: int) -> TieredFact:
    rng = p.rng
    prefix, form, key, meaning = _BATCHES[k // 4 % len(_BATCHES)]
    svcs = rng.sample(list(_SERVICES), len(_SERVICES))
    lines = [form.format(svc=s, a=rng.randint(2, 40), b=rng.randint(100, 999)) for s in svcs]
    pick = rng.randrange(len(svcs))
    _batch_turn(p, k, t, lines, prefix)
    svc, para = svcs[pick], _SERVICES[svcs[pick]]
    queries: dict[Tier, str] = {
        "exact": f"{svc} {key}",
        "paraphrase": f"{key} {para}",
        "meaning": meaning.format(para=para),
    }
    others = tuple(line for i, line in enumerate(lines) if i != pick)
    return TieredFact(f"f{k:02d}", "batch", lines[pick], t + 1, pick, others, (), queries)


def _task(p: _Planter) -> TieredFact:
    rng = p.rng
    area, other = rng.sample(list(_AREAS), 2)
    v = f"{rng.randint(2, 9)}.{rng.randint(0, 9)}"
    text = f"never edit the {area} migrations and keep the {area} API at version {v}"
    p.into_user(0, f"Constraint for this task: {text}.")
    notes = [
        f"note: the {other} API at version {rng.randint(2, 9)}.{rng.randint(0, 9)} is frozen",
        f"note: the {area} migrations ran; its client pins version 1.{rng.randint(0, 9)}",
    ]
    for n, note in enumerate(notes):
        p.into_output(3 + 4 * n, note, set())
    queries: dict[Tier, str] = {
        "exact": f"{area} API version migrations never edit",
        "paraphrase": f"{area} API version the user told me to preserve",
        "meaning": f"what my instructions forbade changing about {_AREAS[area][0]}",
    }
    return TieredFact("f00", "task", text, 0, None, tuple(notes), (), queries)


_PLANTERS = (_error, _path, _setting, _batch)


def _need_points(s: TieredSession, rng: random.Random) -> list[TieredNeed]:
    """An early and a late need per fact; the task's at 35, 70 and 95 % of the session."""
    calls = [(t, c) for t, turn in enumerate(s.base.turns) for c in range(len(turn.replies))]
    index = {tc: i for i, tc in enumerate(calls)}
    needs: list[TieredNeed] = []
    for f in s.facts:
        if f.kind == "task":
            for share in (0.35, 0.7, 0.95):
                needs.append(TieredNeed(f.id, *calls[int(share * (len(calls) - 1))], "task"))
            continue
        first = index[s.plant_call(f)]
        rest = len(calls) - first
        early = min(first + rng.randint(1, 6), len(calls) - 1)
        late = min(first + rng.randint(rest // 2, rest * 19 // 20), len(calls) - 1)
        needs += [TieredNeed(f.id, *calls[early], "early"), TieredNeed(f.id, *calls[late], "late")]
    return needs


def build(base: QualitySession, seed: int, facts: int = 12) -> TieredSession:
    """``base`` with the task's constraint and ``facts`` facts planted, each kind in turn.

    The facts go into the first 40 % of the session (so late needs come many
    compactions after them), batches first: their turns are inserted, which moves the
    later turns.
    """
    rng = random.Random(seed * 104_729 + 35)
    p = _Planter(base, rng)
    # facts go into turns 8 to 8 + facts at least, and each needs as many turns after it
    if len(base.turns) < 8 + 2 * facts:
        raise ValueError(
            f"{base.name}: {len(base.turns)} turns are too few to plant {facts} facts "
            f"(at least {8 + 2 * facts}; a generated session of 600 messages has about 40)"
        )
    top = max(int(0.4 * len(base.turns)), 8 + facts)
    turns = sorted(rng.sample(range(8, top), facts))
    plan = [(_PLANTERS[k % len(_PLANTERS)], k + 1, t) for k, t in enumerate(turns)]
    batches = [t for planter, _, t in plan if planter is _batch]
    out: list[TieredFact] = []
    for n, (_, k, t) in enumerate(x for x in plan if x[0] is _batch):
        out.append(_batch(p, k, t + n))
    for planter, k, t in plan:
        if planter is not _batch:
            out.append(planter(p, k, t + sum(b < t for b in batches)))
    task = _task(p)
    planted = QualitySession(base.name, base.system, base.tools, tuple(p.turns))
    session = TieredSession(planted, (task, *sorted(out, key=lambda f: f.id)), ())
    session = replace(session, needs=tuple(_need_points(session, rng)))
    session.check()
    return session


def default_sessions(quick: bool = False) -> list[TieredSession]:
    """The benchmark's sessions: generated coding-agent sessions, seeded."""
    seeds = (11,) if quick else (11, 12, 13)
    size = 600 if quick else 1_000
    return [
        build(from_memory(f"generated (seed {s}, {size:,} messages)", generate_session(s, size)), s)
        for s in seeds
    ]


# -- what a query may hold ---------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """The words of ``text``: runs of letters and digits, lowercased."""
    return _WORD.findall(text.lower())


def session_text(base: QualitySession) -> str:
    """Every text of the session a model reads: system, user messages, replies, outputs."""
    parts: list[str] = [base.system]
    for turn in base.turns:
        parts.append(turn.user)
        for reply in turn.replies:
            parts += [_block_text(b) for b in reply]
        parts += [str(o["content"]) for o in turn.outputs]
    return "\n".join(parts)


def _block_text(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    if kind == "tool_use":
        return " ".join(str(v) for v in dict(block.get("input", {})).values())
    return str(block.get("text", block.get("thinking", "")))


def unique_tokens(session: TieredSession) -> list[tuple[str, Tier, str]]:
    """``(fact id, tier, token)`` for every query token found in its own fact and nowhere
    else in the session: none should exist. Every line holding the fact is left out of
    "elsewhere", so a codename in the line that carries a fact counts as the fact's."""
    lines = session_text(session.base).split("\n")
    per_line = [set(words(x)) for x in lines]
    in_lines = Counter(w for ws in per_line for w in ws)  # how many lines hold each word
    found: list[tuple[str, Tier, str]] = []
    for f in session.facts:
        holding = Counter(
            w for x, ws in zip(lines, per_line, strict=True) if f.text in x for w in ws
        )
        own = {w for w in words(f.text) if in_lines[w] == holding[w]}
        for tier, query in f.queries.items():
            found += [(f.id, tier, w) for w in _ordered(words(query)) if w in own]
    return found


def meaning_overlap(session: TieredSession) -> list[tuple[str, str]]:
    """``(fact id, word)`` for every word a meaning-only query shares with its fact (stop
    words aside): none should exist."""
    found: list[tuple[str, str]] = []
    for f in session.facts:
        shared = set(words(f.queries["meaning"])) & set(words(f.text))
        found += [(f.id, w) for w in sorted(shared - STOPWORDS)]
    return found


def _ordered(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
