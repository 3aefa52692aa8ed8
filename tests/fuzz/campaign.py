"""One fuzz case: draw a session and a compactor config, run ``compact()``, check the result.

A case is reproducible from ``(seed, index)`` alone (:func:`case_rng`); :func:`run_indexed`
runs it and returns a :class:`CaseReport`, :func:`run_case` only its findings.

Checks (the ``check`` of a :class:`Finding`):

- ``validity``: the output passes the independent validator of its format
  (:mod:`fuzz.validators`); a ``CompactionError`` (the core refusing a compactor's broken
  tool pairs) counts here too;
- ``fit``: a window-sized compactor (``window_manager``, ``pipeline``) that compacted
  reports ``tokens_after`` within the usable window (window minus ``reserved_tokens``)
  plus a tolerance;
- ``skipped_over_window``: a window-sized compactor skipped (no error) while the
  conversation is over the usable window;
- ``mid_round_compacted_fitting``: it compacted at a mid-round boundary while the
  conversation fit the usable window (the contract's mid-round rule);
- ``error_path``: on the error or skip path the transcript did not come back unchanged,
  or ``dropped`` is not empty;
- ``unexpected_error``: an error other than "cannot fit the context window" or a failed
  summary (``clear_tool_results`` and ``noop`` have no reason to fail at all);
- ``needless_error``: ``window_manager`` (alone or in the pipeline) reported that nothing
  fits although its system, pinned and newest entries plus a marker fit the usable
  window; ``needless_error_thinking``: they fit only without their thinking blocks,
  which a compaction strips anyway;
- ``loss``: an input message (by id, tool-call id or text) is neither in the output nor
  reported in ``dropped`` (thinking blocks may go: the contract strips them);
  ``offbranch_loss``: entries of a dump's abandoned branches are gone from the output
  dump;
- ``pinned``: a system or pinned message was not kept as it was;
- ``mutation``: ``compact()`` changed the caller's input;
- ``keep``: ``clear_tool_results`` cleared one of the newest ``keep`` tool uses;
- ``marker_count``: the cut marker's "[N earlier messages removed ...]" is not the number
  of the caller's messages it replaced;
- ``idempotence_marker``: compacting the output again with the same settings reports a
  marker or summary the first pass inserted as dropped;
- ``idempotence``: compacting the output again changes it (or fails);
- ``summarize_vs_oldest_first``: ``window_manager`` with ``oldest_first`` succeeds where
  ``summarize`` (extractive) with the same options reports an error;
- ``rejected``: ``compact()`` refused a transcript the validators accept;
- ``exception``: ``compact()`` raised anything else; ``harness``: the campaign itself
  produced an invalid transcript or options (a bug here, not in the project).
"""

from __future__ import annotations

import copy
import json
import random
import re
import time
import traceback
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fuzz.generators import FORMATS, Session, draw_session, render
from fuzz.validators import validate
from normandy_core import (
    AgentMemory,
    Entry,
    ImageBlock,
    OptionsError,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    TranscriptError,
    compact,
    get_counter,
)
from normandy_core.facade import CompactionError, CompactResult, parse_transcript
from normandy_core.memory import DocumentBlock
from normandy_core.tokens import REPLY_PRIMING as REQUEST_TOKENS
from normandy_core.tokens import default_counter_for

__all__ = [
    "COMPACTORS",
    "CaseReport",
    "Finding",
    "case_rng",
    "run_case",
    "run_indexed",
]

#: Labels of what a case runs: compactor, or compactor/strategy.
COMPACTORS = (
    "window_manager/oldest_first",
    "window_manager/sliding_window",
    "window_manager/summarize",
    "clear_tool_results",
    "pipeline",
    "noop",
)
_WEIGHTS = (17, 14, 17, 20, 22, 10)
_MODELS = (None, "gpt-4o", "claude-sonnet-4-5")
_COUNTERS = (None, None, "estimate", "conservative", "cl100k_base")
_TOOLS = ("read_file", "grep", "run_tests", "bash", "fetch_url", "list_dir", "edit_file")
_MARKER_KEY = "normandy.compaction_marker"
_SUMMARY_KEY = "normandy.summary"
_MARKER_COUNT = re.compile(r"^\[(\d+) earlier messages? removed")
#: Tokens allowed for the cut marker when judging whether a fit was possible.
_MARKER_ALLOWANCE = 40
#: The errors a window-sized compactor may report for a valid transcript.
_EXPECTED_ERRORS = ("cannot fit the context window", "window_manager summarize:")


@dataclass(frozen=True)
class Finding:
    """One failed check of one case, reproducible from ``(seed, index)``."""

    seed: int
    index: int
    check: str
    message: str
    compactor: str
    format: str
    window: int
    mid_round: bool
    model: str | None
    options: dict[str, Any]

    def to_json(self) -> str:
        """The finding as one JSON line."""
        return json.dumps(asdict(self), ensure_ascii=False, default=str)

    def reproducer(self) -> str:
        """A one-line reproducer."""
        return (
            f"seed={self.seed} index={self.index} {self.compactor} {self.format} "
            f"window={self.window} mid_round={self.mid_round} model={self.model} "
            f"opts={json.dumps(self.options, default=str)}"
        )


@dataclass
class CaseReport:
    """What one case ran and found."""

    seed: int
    index: int
    compactor: str = ""
    format: str = ""
    outcome: str = ""  # compacted, skipped, error, raised
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    session_tokens: int = 0
    est_ratio: float | None = None  # own estimate of the output / usable window


@dataclass
class _Case:
    """The drawn configuration of one case."""

    seed: int
    index: int
    session: Session
    data: Any
    label: str
    compactor: str
    opts: dict[str, Any]
    window: int
    mid_round: bool
    model: str | None
    counter: str
    usable: int | None  # window minus reserved_tokens, for window-sized compactors
    memory: AgentMemory
    session_tokens: int
    report: CaseReport
    findings: list[Finding] = field(default_factory=list)

    def find(self, check: str, message: str, **extra: Any) -> None:
        opts = {**self.opts, **extra} if extra else self.opts
        self.findings.append(
            Finding(
                self.seed,
                self.index,
                check,
                message[:600],
                self.label,
                self.session.format,
                self.window,
                self.mid_round,
                self.model,
                opts,
            )
        )

    def call(self, data: Any, **changes: Any) -> CompactResult:
        kwargs: dict[str, Any] = {
            "compactor": self.compactor,
            "opts": self.opts,
            "model": self.model,
            "window": self.window,
            "mid_round": self.mid_round,
            "format": self.session.format,
        }
        kwargs.update(changes)
        return compact(data, **kwargs)


def case_rng(seed: int, index: int) -> random.Random:
    """The generator of case ``index`` of campaign ``seed`` (independent of other cases)."""
    return random.Random(f"normandy-fuzz:{seed}:{index}")


# -- options ----------------------------------------------------------------------------


def _reserved(rng: random.Random, window: int) -> int | None:
    r = rng.random()
    if r < 0.03:
        return int(window * rng.uniform(1.0, 1.3))  # nothing usable: the error path
    if r < 0.3:
        return 0
    if r < 0.45 and window > 6000:
        return None  # the default, 4096
    return int(window * rng.uniform(0.0, 0.6))


def _wm_opts(rng: random.Random, strategy: str, window: int, counter: str | None) -> dict[str, Any]:
    o: dict[str, Any] = {"strategy": strategy}
    r = rng.random()
    trigger = 1.0 if r < 0.45 else round(rng.uniform(0.05 if r < 0.55 else 0.4, 1.0), 2)
    if trigger < 1.0 or rng.random() < 0.2:
        o["trigger"] = trigger
    if trigger < 0.6 or rng.random() < 0.6:
        o["target"] = round(rng.uniform(0.05, trigger), 2) if rng.random() < 0.75 else trigger
    reserved = _reserved(rng, window)
    if reserved is not None:
        o["reserved_tokens"] = reserved
    if strategy == "sliding_window" and rng.random() < 0.6:
        o["keep_last_turns"] = rng.randint(1, 5)
    if strategy == "summarize":
        o["summarizer"] = "extractive"
        if rng.random() < 0.4:
            o["summary_max_tokens"] = rng.choice([64, 128, 512, 2048, 8192])
    if counter is not None:
        o["counter"] = counter
    return o


def _clear_opts(rng: random.Random, tokens: int, counter: str | None) -> dict[str, Any]:
    o: dict[str, Any] = {}
    keep = rng.randint(0, 5) if rng.random() < 0.7 else 3
    if keep != 3 or rng.random() < 0.3:
        o["keep"] = keep
    r = rng.random()
    if r < 0.75:
        o["trigger_tokens"] = max(1, int(tokens * rng.uniform(0.05, 1.5)))
    if r > 0.55:
        o["trigger_tool_uses"] = rng.randint(keep + 1, keep + 8)
    if rng.random() < 0.15:
        o["clear_at_least"] = rng.randint(1, 2000)
    if rng.random() < 0.2:
        o["clear_tool_inputs"] = True
    if rng.random() < 0.1:
        o["exclude_tools"] = [rng.choice(_TOOLS)]
    if counter is not None:
        o["counter"] = counter
    return o


def _draw_case(
    rng: random.Random, seed: int, index: int, report: CaseReport, compactor: str | None
) -> _Case:
    fmt = rng.choice(FORMATS)
    session = draw_session(rng, fmt)
    data = render(session)
    label = rng.choices(COMPACTORS, weights=_WEIGHTS)[0]
    if compactor is not None:
        label = compactor  # the rest of the case is drawn as it would be
    model = rng.choice(_MODELS)
    counter_opt = rng.choice(_COUNTERS)
    counter = counter_opt or default_counter_for(model)
    _, memory = parse_transcript(data, fmt)
    tokens = memory.tokens(get_counter(counter))
    window = max(1, int(tokens * rng.uniform(0.05, 1.5)))
    mid_round = rng.random() < (0.75 if session.open_round else 0.25)
    compactor = label.split("/")[0]
    opts: dict[str, Any] = {}
    usable: int | None = None
    if compactor == "window_manager":
        opts = _wm_opts(rng, label.split("/")[1], window, counter_opt)
    elif compactor == "clear_tool_results":
        opts = _clear_opts(rng, tokens, counter_opt)
    elif compactor == "pipeline":
        wm = _wm_opts(
            rng, rng.choice(["oldest_first", "sliding_window", "summarize"]), window, counter_opt
        )
        steps = [
            {"compactor": "clear_tool_results", "opts": _clear_opts(rng, tokens, counter_opt)},
            {"compactor": "window_manager", "opts": wm},
        ]
        opts = {"steps": steps}
        if counter_opt is not None:
            opts["counter"] = counter_opt
    # The request's own cost (the reply's priming, every counter's ``request_tokens``) is
    # part of the budget (contract: ``ctx.prompt_tokens``).
    if compactor == "window_manager":
        usable = window - int(opts.get("reserved_tokens", 4096)) - REQUEST_TOKENS
    elif compactor == "pipeline":
        reserved = int(opts["steps"][1]["opts"].get("reserved_tokens", 4096))
        usable = window - reserved - REQUEST_TOKENS
    report.compactor = label
    report.format = fmt
    report.session_tokens = tokens
    return _Case(
        seed, index, session, data, label, compactor, opts, window, mid_round, model,
        counter, usable, memory, tokens, report,
    )  # fmt: skip


# -- atoms: what a transcript says, independent of its shape ------------------------------


@dataclass
class _Atoms:
    """Texts per role, tool uses and results by id, and media, of a transcript."""

    texts: dict[str, list[str]] = field(default_factory=dict)
    uses: dict[str, tuple[str, Any]] = field(default_factory=dict)
    results: dict[str, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)
    media: Counter[Any] = field(default_factory=Counter)

    def text(self, role: str, text: str) -> None:
        if text:
            self.texts.setdefault(role, []).append(text)

    def blob(self, role: str | None = None) -> str:
        sep = "\u241e"
        if role is not None:
            return sep.join(self.texts.get(role, []))
        return sep.join(sep.join(v) for v in self.texts.values())


def _media_key(source: Mapping[str, Any], kind: str = "image") -> tuple[str, str]:
    if source.get("type") == "base64":
        return (kind, str(source.get("data")))
    if source.get("type") == "text":
        return (kind, str(source.get("data")))
    return (kind, str(source.get("url")))


def _url_key(url: str) -> tuple[str, str]:
    if url.startswith("data:"):
        return ("image", url.partition(",")[2])
    return ("image", url)


def _oa_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


def _openai_atoms(data: Any) -> _Atoms:
    a = _Atoms()
    messages = data["messages"] if isinstance(data, Mapping) else data
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if role == "tool":
            a.results[m["tool_call_id"]] = (_oa_text(content), ())
        elif role == "assistant":
            a.text("assistant", _oa_text(content))
            for c in m.get("tool_calls") or []:
                a.uses[c["id"]] = (c["function"]["name"], json.loads(c["function"]["arguments"]))
        elif role == "user" and isinstance(content, list):
            for p in content:
                if p.get("type") == "text":
                    a.text("user", p["text"])
                elif p.get("type") == "image_url":
                    a.media[_url_key(p["image_url"]["url"])] += 1
        else:
            a.text("system" if role in ("system", "developer") else "user", _oa_text(content))
    return a


def _anthropic_result(b: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
    content = b.get("content", "")
    if isinstance(content, str):
        return content, ()
    texts = [p["text"] for p in content if p.get("type") == "text"]
    media = tuple(_media_key(p["source"], p["type"]) for p in content if p.get("type") != "text")
    return "\n".join(texts), media


def _anthropic_atoms(data: Any) -> _Atoms:
    a = _Atoms()
    messages = data
    if isinstance(data, Mapping):
        messages = data["messages"]
        system = data.get("system")
        if isinstance(system, str):
            a.text("system", system)
        elif isinstance(system, list):
            for b in system:
                a.text("system", b["text"])
    for m in messages:
        role = m["role"]
        if isinstance(m["content"], str):
            a.text(role, m["content"])
            continue
        for b in m["content"]:
            kind = b.get("type")
            if kind == "text":
                a.text(role, b["text"])
            elif kind == "tool_use":
                a.uses[b["id"]] = (b["name"], b["input"])
            elif kind == "tool_result":
                a.results[b["tool_use_id"]] = _anthropic_result(b)
            elif kind in ("image", "document"):
                a.media[_media_key(b["source"], kind)] += 1
    return a


def _entry_atoms(entries: list[Entry]) -> _Atoms:
    a = _Atoms()
    for e in entries:
        role = "user" if e.role == "tool" else e.role
        if isinstance(e.content, str):
            a.text(role, e.content)
            continue
        for b in e.content:
            if isinstance(b, TextBlock):
                a.text(role, b.text)
            elif isinstance(b, ToolUseBlock):
                a.uses[b.id] = (b.name, dict(b.input))
            elif isinstance(b, ToolResultBlock):
                media: tuple[Any, ...] = ()
                if not isinstance(b.content, str):
                    media = tuple(
                        _media_key(p.source, p.type)
                        for p in b.content
                        if isinstance(p, (ImageBlock, DocumentBlock))
                    )
                a.results[b.tool_use_id] = (b.text(), media)
            elif isinstance(b, (ImageBlock, DocumentBlock)):
                a.media[_media_key(b.source, b.type)] += 1
    return a


def _atoms(fmt: str, data: Any) -> _Atoms:
    return _openai_atoms(data) if fmt == "openai" else _anthropic_atoms(data)


def _message_atoms(fmt: str, data: Any) -> list[_Atoms]:
    """The atoms of each caller message (OpenAI and Anthropic), in order."""
    if fmt == "openai":
        messages = data["messages"] if isinstance(data, Mapping) else data
        return [_openai_atoms([m]) for m in messages]
    messages = data["messages"] if isinstance(data, Mapping) else data
    return [_anthropic_atoms([m]) for m in messages]


def _present(a: _Atoms, out: _Atoms) -> bool:
    """Whether anything of message ``a`` is still in the output."""
    blob = {r: out.blob(r) for r in out.texts}
    if any(t in blob.get(r, "") for r, ts in a.texts.items() for t in ts):
        return True
    if any(out.uses.get(k) is not None for k in a.uses):
        return True
    if any(out.results.get(k) is not None for k in a.results):
        return True
    return bool(a.media) and all(out.media[k] >= n for k, n in a.media.items())


# -- checks -------------------------------------------------------------------------------


def _strip_thinking(e: Entry) -> Any:
    return e.without_thinking().content


def _check_loss_ids(c: _Case, result: CompactResult) -> None:
    """Normandy dumps: every entry of the input's branch is kept, or reported dropped."""
    out = {e.id: e for e in result.memory.entries()}
    dropped = {e.id: e for e in result.dropped}
    for e in c.memory.entries():
        kept = out.get(e.id)
        if kept is not None and kept.content in (e.content, _strip_thinking(e)):
            continue
        report = dropped.get(e.id)
        if report is not None and report.content == e.content:
            continue
        what = "changed" if kept is not None else "removed"
        c.find("loss", f"entry {e.id} ({e.role}) was {what} and not reported in dropped")
        return
    out_dump = result.messages if isinstance(result.messages, Mapping) else {}
    out_ids = {e.get("id") for e in out_dump.get("entries", [])}
    branch = {e.id for e in c.memory.entries()}
    lost = [e["id"] for e in c.data["entries"] if e["id"] not in branch and e["id"] not in out_ids]
    if lost:
        c.find(
            "offbranch_loss",
            f"{len(lost)} entries of abandoned branches are gone from the output "
            "dump and are not reported",
        )


def _check_loss_atoms(c: _Case, result: CompactResult) -> None:
    fmt = c.session.format
    src = _atoms(fmt, c.data)
    out = _atoms(fmt, result.messages)
    gone = _entry_atoms(result.dropped)
    blobs = {r: out.blob(r) for r in ("system", "user", "assistant")}
    dropped_blob = gone.blob()
    problems: list[str] = []
    for role, texts in src.texts.items():
        for t in texts:
            if t not in blobs.get(role, "") and t not in dropped_blob:
                problems.append(f"{role} text {t[:60]!r}")
    for uid, use in src.uses.items():
        if out.uses.get(uid) != use and gone.uses.get(uid) != use:
            problems.append(f"tool use {uid}")
    for rid, res in src.results.items():
        if out.results.get(rid) != res and gone.results.get(rid) != res:
            problems.append(f"tool result {rid}")
    for key, n in src.media.items():
        if out.media[key] + gone.media[key] < n:
            problems.append(f"{key[0]} {key[1][:24]!r}")
    if problems:
        c.find(
            "loss",
            f"{len(problems)} input atoms neither kept nor reported dropped: "
            + "; ".join(problems[:4]),
        )


def _check_pinned(c: _Case, result: CompactResult) -> None:
    out = {e.id: e for e in result.memory.entries()}
    if c.session.format == "normandy":
        for e in c.memory.entries():
            if not (e.pinned or e.role == "system"):
                continue
            kept = out.get(e.id)
            if kept is None or kept.content not in (e.content, _strip_thinking(e)):
                c.find("pinned", f"{'pinned' if e.pinned else 'system'} entry {e.id} not kept")
                return
        return
    src = _atoms(c.session.format, c.data).texts.get("system", [])
    got = _atoms(c.session.format, result.messages).blob("system")
    for t in src:
        if t not in got:
            c.find("pinned", f"system prompt {t[:60]!r} not kept")
            return


def _minimal_tokens(c: _Case, *, thinking: bool) -> int:
    """Tokens of what no compaction may drop: system, pinned, the newest unit.

    ``thinking``: counted with their thinking blocks (else without, as a compaction
    leaves them).
    """
    entries = c.memory.entries()
    counter = get_counter(c.counter)
    start = len(entries) - 1
    while start > 0 and entries[start].role in ("user", "tool") and entries[start].tool_results:
        start -= 1
    if start < len(entries) - 1 and not entries[start].tool_uses:
        start = len(entries) - 1  # trailing results without their assistant: not a unit
    total = 0
    for i, e in enumerate(entries):
        if i >= start or e.pinned or e.role == "system":
            total += counter.count_entry(e if thinking else e.without_thinking())
    return total


def _check_error(c: _Case, error: str, opts: Mapping[str, Any]) -> None:
    """An error of a window-sized compactor: expected only when nothing could fit."""
    if not any(p in error for p in _EXPECTED_ERRORS):
        c.find("unexpected_error", error)
        return
    if c.usable is None:
        return
    strategy = opts.get("strategy", "oldest_first")
    full = _minimal_tokens(c, thinking=True) + _MARKER_ALLOWANCE
    bare = _minimal_tokens(c, thinking=False) + _MARKER_ALLOWANCE
    if full <= c.usable:
        c.find(
            "needless_error",
            f"{strategy}: error although system, pinned and newest entries plus a marker "
            f"take at most {full} of a usable {c.usable}: {error}",
        )
    elif bare <= c.usable:
        c.find(
            "needless_error_thinking",
            f"{strategy}: error although system, pinned and newest entries take at most "
            f"{bare} of a usable {c.usable} (with a marker) once their thinking is stripped, "
            f"as a compaction does ({full} with it): {error}",
        )


def _inserted(memory: AgentMemory) -> list[Entry]:
    return [
        e for e in memory.entries() if e.metadata.get(_MARKER_KEY) or e.metadata.get(_SUMMARY_KEY)
    ]


def _check_marker_count(c: _Case, result: CompactResult) -> None:
    markers = [e for e in _inserted(result.memory) if e.metadata.get(_MARKER_KEY)]
    if c.session.format == "normandy":
        new = [e for e in markers if e.id not in {x.id for x in c.memory.entries()}]
    else:
        new = markers
    if len(new) != 1:
        return
    m = _MARKER_COUNT.match(new[0].text())
    if m is None:
        return
    said = int(m.group(1))
    if c.session.format == "normandy":
        out_ids = {e.id for e in result.memory.entries()}
        removed = sum(1 for e in c.memory.entries() if e.id not in out_ids)
    else:
        out = _atoms(c.session.format, result.messages)
        removed = sum(1 for a in _message_atoms(c.session.format, c.data) if not _present(a, out))
    if said != removed:
        c.find(
            "marker_count",
            f"the marker says {said} earlier messages were removed; {removed} of the "
            "caller's messages are gone",
        )


def _check_keep(c: _Case, result: CompactResult) -> None:
    keep = int(c.opts.get("keep", 3))
    if keep == 0:
        return
    uses = [u.id for e in c.memory.entries() if e.role == "assistant" for u in e.tool_uses]
    src = {r.tool_use_id: r for e in c.memory.entries() for r in e.tool_results}
    out = {r.tool_use_id: r for e in result.memory.entries() for r in e.tool_results}
    for uid in uses[-keep:]:
        if uid in src and uid in out and out[uid].content != src[uid].content:
            c.find(
                "keep",
                f"tool use {uid} is among the newest {keep} of {len(uses)} and was cleared",
            )
            return


_NOT_COUNTED = frozenset((
    "signature", "id", "parent_id", "role", "type", "turn_id", "tool_call_id", "tool_use_id",
    "metadata", "format", "head", "media_type", "pinned", "version",
))  # fmt: skip


def _own_estimate(fmt: str, data: Any) -> int:
    """Our own size estimate of a transcript: 3 characters per token, 1,600 per image."""
    total = 0
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) // 3
        elif isinstance(v, Mapping):
            if v.get("type") in ("image", "image_url"):
                total += 1600
                continue
            if v.get("type") == "base64":
                continue
            stack.extend(x for k, x in v.items() if k not in _NOT_COUNTED)
            total += 4 if "role" in v else 0
        elif isinstance(v, list):
            stack.extend(v)
    return total


def _check_result(c: _Case, result: CompactResult) -> None:
    fmt = c.session.format
    meta = result.meta
    if result.error is not None or not result.compacted:
        if result.messages != c.data and not (
            fmt == "normandy" and isinstance(result.messages, AgentMemory)
        ):
            c.find("error_path", "the input did not come back unchanged on the skip or error path")
        if result.dropped:
            c.find(
                "error_path", f"{len(result.dropped)} entries reported dropped without compacting"
            )
    if result.error is not None:
        c.report.outcome = "error"
        if c.compactor == "window_manager":
            _check_error(c, result.error, c.opts)
        elif c.compactor == "pipeline":
            _check_error(c, result.error, c.opts["steps"][1]["opts"])
        else:
            c.find("unexpected_error", result.error)
        return
    if not result.compacted:
        c.report.outcome = "skipped"
        if c.usable is not None:
            now = c.memory.tokens(get_counter(c.counter))
            if now > c.usable:
                c.find(
                    "skipped_over_window",
                    f"skipped (mid_round={c.mid_round}) at {now} tokens against a usable "
                    f"window of {c.usable}",
                )
        return
    c.report.outcome = "compacted"
    problems = validate(fmt, result.messages)
    if problems:
        c.find("validity", "; ".join(problems[:3]))
    if c.usable is not None:
        after = int(meta.get("tokens_after", 0))
        before = int(meta.get("tokens_before", 0))
        tolerance = max(16, c.usable // 50)
        if after > c.usable + tolerance:
            c.find(
                "fit",
                f"tokens_after {after} over the usable window {c.usable} (+{tolerance}); "
                f"target_met={meta.get('target_met')}",
            )
        if c.mid_round and before <= c.usable:
            c.find(
                "mid_round_compacted_fitting",
                f"compacted mid-round at {before} tokens against a usable window of {c.usable}",
            )
        if c.usable > 0:
            c.report.est_ratio = _own_estimate(fmt, result.messages) / c.usable
    if fmt == "normandy":
        _check_loss_ids(c, result)
    else:
        _check_loss_atoms(c, result)
    _check_pinned(c, result)
    if c.compactor == "clear_tool_results":
        _check_keep(c, result)
    _check_marker_count(c, result)


def _check_idempotent(c: _Case, first: CompactResult) -> None:
    """Compact the output again with the same settings (the same boundary kind too: at the
    start of a turn ``trigger`` decides, mid-round only the usable window does, so a
    mid-round result between the two is compacted again at the next turn start, rightly)."""
    data = copy.deepcopy(first.messages)
    try:
        second = c.call(data, mid_round=c.mid_round)
    except Exception as exc:
        c.find("exception", f"second pass raised {type(exc).__name__}: {exc}")
        return
    inserted = _inserted(first.memory)
    ids = {e.id for e in inserted}
    texts = {e.text() for e in inserted}
    again = [e for e in second.dropped if e.id in ids or e.text() in texts]
    if again:
        c.find(
            "idempotence_marker",
            f"the second pass reports {len(again)} marker/summary entries of the first as "
            f"dropped: {again[0].text()[:80]!r}",
        )
        return
    if second.compacted and (problems := validate(c.session.format, second.messages)):
        c.find("validity", "second pass: " + "; ".join(problems[:3]))
    if second.error is not None:
        c.find("idempotence", f"the second pass failed: {second.error[:200]}")
    elif second.compacted and second.messages != first.messages:
        c.find(
            "idempotence",
            f"the second pass changed the output: {len(second.dropped)} dropped, "
            f"{second.meta.get('tokens_before')} -> {second.meta.get('tokens_after')} tokens, "
            f"first target_met={first.meta.get('target_met')}{_cleared_kept(c, first, second)}",
        )


def _cleared_kept(c: _Case, first: CompactResult, second: CompactResult) -> str:
    """A note when the second pass cleared results of the newest ``keep`` tool uses."""
    meta, opts = second.meta, c.opts
    if c.compactor == "pipeline":
        meta = next((s for s in meta.get("steps", []) if s.get("cleared")), {})
        opts = c.opts["steps"][0]["opts"]
    cleared = set(meta.get("cleared") or [])
    keep = int(opts.get("keep", 3))
    uses = [u.id for e in first.memory.entries() if e.role == "assistant" for u in e.tool_uses]
    hit = cleared & set(uses[-keep:]) if keep else set()
    if not hit:
        return ""
    return f"; it cleared {len(hit)} of the newest {keep} tool uses ({len(uses)} in all)"


def _check_summarize_vs_oldest(c: _Case, main: CompactResult) -> None:
    """``summarize`` (extractive) must succeed wherever ``oldest_first`` does."""
    base = {
        k: v
        for k, v in c.opts.items()
        if k not in ("strategy", "keep_last_turns", "summarizer", "summary_max_tokens")
    }
    strategy = c.opts.get("strategy")
    runs: dict[str, CompactResult] = {}
    if strategy in ("oldest_first", "summarize"):
        runs[str(strategy)] = main
    for name in ("oldest_first", "summarize"):
        if name in runs:
            continue
        opts = {**base, "strategy": name}
        if name == "summarize":
            opts["summarizer"] = "extractive"
            if "summary_max_tokens" in c.opts:
                opts["summary_max_tokens"] = c.opts["summary_max_tokens"]
        try:
            runs[name] = c.call(copy.deepcopy(c.data), opts=opts)
        except Exception as exc:
            c.find("exception", f"{name} raised {type(exc).__name__}: {exc}", strategy=name)
            return
        if runs[name].error is not None and name != strategy:
            _check_error(c, str(runs[name].error), opts)
    old, summ = runs["oldest_first"], runs["summarize"]
    if old.error is None and summ.error is not None:
        c.find(
            "summarize_vs_oldest_first",
            f"oldest_first {'compacted' if old.compacted else 'skipped'} "
            f"(tokens_after={old.meta.get('tokens_after')}); summarize failed: {summ.error}",
        )


def run_case(
    rng: random.Random,
    *,
    seed: int = 0,
    index: int = 0,
    report: CaseReport | None = None,
    compactor: str | None = None,
) -> list[Finding]:
    """Draw one case from ``rng``, run it and return what failed.

    ``compactor`` runs that registered compactor (without options) instead of the drawn
    one, on the same session, window and boundary.
    """
    report = report if report is not None else CaseReport(seed, index)
    t0 = time.perf_counter()
    try:
        c = _draw_case(rng, seed, index, report, compactor)
    except TranscriptError as exc:
        report.outcome = "rejected"
        report.findings.append(
            Finding(
                seed, index, "rejected", f"parse: {exc}", "?", report.format, 0, False, None, {}
            )
        )
        return report.findings
    problems = validate(c.session.format, c.data)
    if problems:
        c.find("harness", "the generator drew an invalid transcript: " + "; ".join(problems[:3]))
        report.findings = c.findings
        return c.findings
    original = copy.deepcopy(c.data)
    try:
        result = c.call(c.data)
    except CompactionError as exc:
        report.outcome = "raised"
        c.find("validity", f"CompactionError: {exc}")
    except TranscriptError as exc:
        report.outcome = "raised"
        c.find("rejected", f"TranscriptError for a valid transcript: {exc}")
    except OptionsError as exc:
        report.outcome = "raised"
        if "leave nothing of the" in str(exc):
            # A window the options leave no room in is refused where the config is made
            # (documented), not at every boundary: a drawn configuration, not a defect.
            report.outcome = "refused"
        else:
            c.find("harness", f"OptionsError: {exc}")
    except Exception as exc:
        report.outcome = "raised"
        c.find("exception", f"{type(exc).__name__}: {exc}")
    else:
        if c.data != original:
            c.find("mutation", "compact() changed the caller's input")
            c.data = original
        try:
            _check_result(c, result)
            if result.compacted and result.error is None:
                _check_idempotent(c, result)
            if c.compactor == "window_manager":
                _check_summarize_vs_oldest(c, result)
        except Exception as exc:  # a bug of the campaign, not of the project
            where = traceback.extract_tb(exc.__traceback__)[-1]
            c.find(
                "harness",
                f"a check raised {type(exc).__name__}: {exc} (line {where.lineno})",
            )
    report.seconds = time.perf_counter() - t0
    report.findings = c.findings
    return c.findings


def run_indexed(seed: int, index: int, compactor: str | None = None) -> CaseReport:
    """Run case ``index`` of campaign ``seed`` (with ``compactor`` instead of the drawn one)."""
    report = CaseReport(seed, index)
    run_case(case_rng(seed, index), seed=seed, index=index, report=report, compactor=compactor)
    return report
