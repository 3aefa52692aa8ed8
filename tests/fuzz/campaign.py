"""One fuzz case: draw a session and a compactor config, run ``compact()``, check the result.

A case is reproducible from ``(seed, index)`` alone (:func:`case_rng`); :func:`run_indexed`
runs it and returns a :class:`CaseReport`, :func:`run_case` only its findings.

A case is one call (``single``), or, for :data:`_SEQUENCES` of the provider-format cases,
a continuation sequence (:func:`_run_sequence`): the list an agent holds grown batch by
batch, ``compact()`` called at every model request, the agent keeping its full history
(``continue-full``) or replacing its list with ``result.messages`` (``continue-replace``).

A fifth of the Anthropic and Responses cases run that provider's native compactor
(``anthropic_native``, ``openai_native``) against :class:`fuzz.provider.FuzzProvider`, a
stand-in for the provider's compaction at the edge that compacts, refuses, is
unsupported or unreachable, answers garbage or raises; the compactor must compact, fall
back (the default ``window_manager`` summarize, another strategy) or, without a fallback,
report the error.

Checks (the ``check`` of a :class:`Finding`):

- ``validity``: the output passes the independent validator of its format
  (:mod:`fuzz.validators`) and, for the provider formats, the official SDK's typed params
  (``validate_sdk``); a ``CompactionError`` (the core refusing a compactor's broken tool
  pairs) counts here too;
- ``identity`` (provider formats): every output message that is not new is the very
  object given, in the input's order; a new object equal to a message given (other than
  a marker or summary put where an equal one was dropped, or a user message OpenAI's
  compaction returned, put before its compaction item) is a message rebuilt for nothing;
- ``accounting`` (provider formats): the entries of the input are the kept ones plus the
  dropped ones, an entry kept changed (``meta["shortened"]``, a cleared result) counted
  in both, each dropped one with its content, in order;
- ``provider_compaction``: the newest provider compaction (Anthropic's ``compaction``
  block, the Responses ``compaction`` item) is in the output, as the object given (or a
  native compactor's newer one, which summarizes it);
- ``not_continued``: a call of a sequence after the first was not compacted as a
  continuation (``result.continued``), though its batch brought no provider compaction;
- ``dropped_twice``: a call of a sequence reports an entry an earlier call reported
  dropped (and no longer kept);
- ``fit``: a window-sized compactor (``window_manager``, ``pipeline``, the native ones)
  that compacted
  reports ``tokens_after`` within the usable window (window minus ``reserved_tokens``,
  less what every request costs once: the reply's priming, ``counter.request_tokens``)
  plus a tolerance;
- ``skipped_over_window``: a window-sized compactor skipped (no error) while the
  conversation is over the usable window (in a sequence: counted afresh from the
  output, as ``fit`` is there);
- ``mid_round_compacted_fitting``: it compacted at a mid-round boundary while the
  conversation fit the usable window (the contract's mid-round rule);
- ``error_path``: on the error or skip path the transcript did not come back unchanged
  (in a sequence: as given, or continued, the last output plus the new messages, as the
  very objects), or ``dropped`` is not empty;
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
- ``keep``: ``clear_tool_results`` cleared one of the newest ``keep`` tool uses (offloading
  one at arrival is no finding: ``keep`` does not apply to it);
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

import contextlib
import copy
import json
import random
import re
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fuzz.generators import (
    FORMATS,
    PROVIDER_FORMATS,
    Session,
    draw_session,
    render,
    request_points,
)
from fuzz.provider import NATIVE, FuzzProvider
from fuzz.validators import validate, validate_sdk
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
    hookimpl,
    register_hook,
    unregister_hook,
)
from normandy_core.conversation.entries import DocumentBlock, OpaqueBlock
from normandy_core.conversation.keys import OFFLOADED_TAG
from normandy_core.conversation.tokens import default_counter_for
from normandy_core.transcripts.facade import parse_transcript
from normandy_core.transcripts.result import CompactionError, CompactResult

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
    "anthropic_native",
    "openai_native",
)
_WEIGHTS = (17, 14, 17, 20, 22, 10)  # of the portable ones; the native ones are drawn apart
#: The share of Anthropic and Responses cases run by their provider's native compactor,
#: drawn from a generator of their own, so every other case is the one it always was.
_NATIVE_SHARE = 0.2
#: The share of window_manager configurations (and pipelines' second steps) that take
#: ``schedule="cost"``, drawn apart too.
_COST_SHARE = 0.2
#: Metadata keys of what a native compactor adds: its compaction entry, and the user
#: messages OpenAI returns that are not the very entries it was sent.
_NATIVE_KEY = "normandy.native_compaction"
_REBUILT_KEY = "normandy.provider_rebuilt"
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
#: The share of provider-format cases run as continuation sequences.
_SEQUENCES = 0.3


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
    mode: str = "single"  # or a continuation sequence: continue-full, continue-replace

    def to_json(self) -> str:
        """The finding as one JSON line."""
        return json.dumps(asdict(self), ensure_ascii=False, default=str)

    def reproducer(self) -> str:
        """A one-line reproducer."""
        mode = "" if self.mode == "single" else f"{self.mode} "
        return (
            f"seed={self.seed} index={self.index} {mode}{self.compactor} {self.format} "
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
    mode: str = "single"  # single, or a continuation sequence: continue-full, continue-replace
    calls: int = 0  # compact() calls of a continuation sequence
    continued: int = 0  # of which compacted as the continuation of the one before
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
    usable: int | None  # window - reserved_tokens - request_tokens (window-sized compactors)
    memory: AgentMemory
    session_tokens: int
    report: CaseReport
    mode: str = "single"
    findings: list[Finding] = field(default_factory=list)
    client: FuzzProvider | None = None  # the provider of a native compactor's case

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
                self.mode,
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
        if self.client is not None:
            kwargs["client"] = self.client
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
    if rng.random() < 0.2:
        o["offload_tokens"] = rng.choice([64, rng.randint(64, 400), rng.randint(400, 3000)])
        if rng.random() < 0.4:
            o["offload_preview"] = round(rng.uniform(0.05, 0.5), 2)
    if counter is not None:
        o["counter"] = counter
    return o


def _native_opts(
    rng: random.Random, name: str, window: int, tokens: int, counter: str | None
) -> dict[str, Any]:
    """Options of a native compactor: a trigger (Anthropic's at least 50,000, so the usable
    window mostly decides), a reserve, the fallback (the default, another strategy, none)."""
    o: dict[str, Any] = {}
    if name == "openai_native" and rng.random() < 0.6:
        o["trigger_tokens"] = max(1, int(tokens * rng.uniform(0.05, 1.5)))
    elif rng.random() < 0.3:
        o["trigger_tokens"] = rng.choice([50_000, 80_000, 150_000])
    reserved = _reserved(rng, window)
    if reserved is not None:
        o["reserved_tokens"] = reserved
    r = rng.random()
    if r < 0.2:
        o["fallback"] = None
    elif r < 0.45:
        o["fallback_opts"] = {"strategy": rng.choice(["oldest_first", "sliding_window"])}
        if reserved is not None:
            o["fallback_opts"]["reserved_tokens"] = reserved
        if counter is not None:
            o["fallback_opts"]["counter"] = counter
    if counter is not None:
        o["counter"] = counter
    return o


def _draw_case(
    rng: random.Random, seed: int, index: int, report: CaseReport, compactor: str | None
) -> _Case:
    fmt = rng.choice(FORMATS)
    session = draw_session(rng, fmt)
    mode = "single"
    if fmt in PROVIDER_FORMATS and rng.random() < _SEQUENCES:
        # A continuation sequence: the list an agent holds, grown batch by batch (a list,
        # so an Anthropic system prompt is left out: a request dict is not continued).
        mode = rng.choice(("continue-full", "continue-replace"))
        session.shape["dict"] = False
        if fmt == "anthropic":
            session.system = None
    data = render(session)
    label = rng.choices(COMPACTORS[: len(_WEIGHTS)], weights=_WEIGHTS)[0]
    # A native compactor compacts its own provider's wire format (its compaction is
    # readable by that provider only).
    side = random.Random(f"native:{seed}:{index}")
    native = next((n for n, (_, f) in NATIVE.items() if f == fmt), None)
    if native is not None and side.random() < _NATIVE_SHARE:
        label = native
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
    # schedule="cost" in some window_manager configurations (alone or as the pipeline's
    # second step), drawn apart as the native compactors are
    wm = opts if compactor == "window_manager" else None
    if compactor == "pipeline":
        wm = opts["steps"][1]["opts"]
    cost_side = random.Random(f"cost:{seed}:{index}")
    if (
        wm is not None
        and cost_side.random() < _COST_SHARE
        and wm.get("strategy") != "sliding_window"  # refused with schedule="cost"
    ):
        wm["schedule"] = "cost"
        wm.pop("trigger", None)
        if cost_side.random() < 0.3:
            wm["horizon"] = cost_side.choice([1, 5, 20, 200])
        if cost_side.random() < 0.5:
            wm.pop("target", None)  # its own floor
    client: FuzzProvider | None = None
    if compactor in NATIVE:
        opts = _native_opts(side, compactor, window, tokens, counter_opt)
        client = FuzzProvider.draw(side, NATIVE[compactor][0])
    # What every request costs once whatever its messages (the reply's priming, documented
    # in normandy_core.conversation.tokens): the room left for the messages is the usable window
    # less it.
    fixed = int(getattr(get_counter(counter), "request_tokens", 3))
    if compactor == "window_manager" or compactor in NATIVE:
        usable = window - int(opts.get("reserved_tokens", 4096)) - fixed
    elif compactor == "pipeline":
        usable = window - int(opts["steps"][1]["opts"].get("reserved_tokens", 4096)) - fixed
    report.compactor = label
    report.format = fmt
    report.session_tokens = tokens
    report.mode = mode
    return _Case(
        seed, index, session, data, label, compactor, opts, window, mid_round, model,
        counter, usable, memory, tokens, report, mode, client=client,
    )  # fmt: skip


# -- atoms: what a transcript says, independent of its shape ------------------------------


@dataclass
class _Atoms:
    """Texts per role, tool uses and results by id, and media, of a transcript."""

    texts: dict[str, list[str]] = field(default_factory=dict)
    uses: dict[str, tuple[str, Any]] = field(default_factory=dict)
    results: dict[str, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)
    media: Counter[Any] = field(default_factory=Counter)
    opaque: Counter[str] = field(default_factory=Counter)  # carried blocks and items, as JSON

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
            str(p.get("text", p.get("refusal", "")))
            for p in content
            if isinstance(p, Mapping) and ("text" in p or "refusal" in p)
        )
    return ""


def _opaque_key(data: Any) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)


def _openai_atoms(data: Any) -> _Atoms:
    a = _Atoms()
    messages = data["messages"] if isinstance(data, Mapping) else data
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if role == "tool":
            a.results[m["tool_call_id"]] = (_oa_text(content), ())
        elif role == "assistant":
            for part in content if isinstance(content, list) else [content]:
                if isinstance(part, Mapping) and part.get("type") in (
                    "thinking",
                    "redacted_thinking",
                ):
                    continue  # thinking (a Claude conversation): a compaction may strip it
                a.text("assistant", _oa_text(part if isinstance(part, str) else [part]))
            if isinstance(m.get("refusal"), str):
                a.text("assistant", m["refusal"])
            for c in m.get("tool_calls") or []:
                if c.get("type") == "custom":
                    a.uses[c["id"]] = (c["custom"]["name"], {"input": c["custom"]["input"]})
                    continue
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
    # Parts other than text and media (search results) are carried as their JSON text.
    texts = [
        p["text"] if p.get("type") == "text" else json.dumps(p, ensure_ascii=False)
        for p in content
        if p.get("type") not in ("image", "document")
    ]
    media = tuple(
        _media_key(p["source"], p["type"])
        for p in content
        if p.get("type") in ("image", "document")
    )
    return "\n".join(texts), media


_AN_INTERPRETED = frozenset(
    ("text", "tool_use", "tool_result", "image", "document", "thinking", "redacted_thinking")
)


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
            elif kind not in _AN_INTERPRETED:
                a.opaque[_opaque_key(b)] += 1
    return a


def _rs_parts(role: str, parts: list[Any], a: _Atoms) -> None:
    for p in parts:
        kind = p.get("type")
        if kind in ("input_text", "output_text"):
            a.text(role, p["text"])
        elif kind == "refusal":
            a.text(role, p["refusal"])
        elif kind == "input_image":
            a.media[_url_key(p["image_url"])] += 1
        elif kind == "input_file":
            a.media[("document", str(p["file_data"]).partition(",")[2])] += 1


def _responses_atoms(data: Any) -> _Atoms:
    """Atoms of a Responses item list: reasoning items are thinking (a compaction strips
    them); every item the conversation does not interpret is an opaque atom."""
    a = _Atoms()
    for m in data:
        kind = m.get("type") or "message"
        if kind == "message":
            role = m.get("role")
            role = "system" if role in ("system", "developer") else role
            if isinstance(m["content"], str):
                a.text(role, m["content"])
            else:
                _rs_parts(role, m["content"], a)
        elif kind == "function_call":
            a.uses[m["call_id"]] = (m["name"], json.loads(m["arguments"] or "{}"))
        elif kind == "custom_tool_call":
            a.uses[m["call_id"]] = (m["name"], {"input": m["input"]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = m["output"]
            if isinstance(out, str):
                a.results[m["call_id"]] = (out, ())
            else:
                texts = [p["text"] for p in out if p.get("type") == "input_text"]
                media = tuple(_url_key(p["image_url"]) for p in out if p["type"] == "input_image")
                a.results[m["call_id"]] = ("\n".join(texts), media)
        elif kind != "reasoning":
            a.opaque[_opaque_key(m)] += 1
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
            elif isinstance(b, OpaqueBlock) and not b.reasoning:
                a.opaque[_opaque_key(b.data)] += 1
    return a


def _atoms(fmt: str, data: Any) -> _Atoms:
    if fmt == "responses":
        return _responses_atoms(data)
    return _openai_atoms(data) if fmt == "openai" else _anthropic_atoms(data)


def _message_atoms(fmt: str, data: Any) -> list[_Atoms]:
    """The atoms of each caller message (OpenAI, Anthropic, Responses), in order."""
    messages = data["messages"] if isinstance(data, Mapping) else data
    return [_atoms(fmt, [m]) for m in messages]


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
    for okey, n in src.opaque.items():
        if out.opaque[okey] + gone.opaque[okey] < n:
            problems.append(f"opaque {okey[:60]}")
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


def _user_indices(entries: list[Entry]) -> list[int]:
    """The user messages: the user entries that carry no answers (tool results, opaque
    outputs) and are not a marker or summary a compactor put there (by metadata, or by
    the tag opening its text in a provider format)."""
    return [
        i
        for i, e in enumerate(entries)
        if e.role == "user" and not _made_by_compactor(e) and not _answers(e)
    ]


def _task_index(entries: list[Entry]) -> int | None:
    """The first user message (the task the default survival rule keeps)."""
    users = _user_indices(entries)
    return users[0] if users else None


def _request_index(entries: list[Entry]) -> int | None:
    """The newest user message (the current request the default survival rule keeps)."""
    users = _user_indices(entries)
    return users[-1] if users else None


def _made_by_compactor(e: Entry) -> bool:
    if e.metadata.get(_MARKER_KEY) or e.metadata.get(_SUMMARY_KEY):
        return True
    text = e.content if isinstance(e.content, str) else e.text()
    return text.startswith(("[normandy:marker]", "[normandy:summary]"))


def _calls(e: Entry) -> bool:
    """Whether ``e`` calls something answered later: a tool use or an opaque call (the
    Responses API's ``shell_call``, ``computer_call``...)."""
    return bool(e.tool_uses) or any(
        isinstance(b, OpaqueBlock) and b.use_id is not None for b in e.blocks
    )


def _answers(e: Entry) -> bool:
    """Whether ``e`` carries answers: tool results or opaque outputs of a call."""
    return bool(e.tool_results) or any(
        isinstance(b, OpaqueBlock) and b.answers is not None for b in e.blocks
    )


def _minimal_tokens(c: _Case, *, thinking: bool) -> int:
    """Tokens of what no compaction may drop: system, pinned, the first user message and
    the current request (the survival rules every compaction of the campaign runs with,
    the defaults), the newest unit.

    The first user message is found by :func:`_task_index`, the current request by
    :func:`_request_index`. The newest unit is the last
    entry, with the entry whose calls it answers when it answers (tool results, or the
    opaque outputs of a Responses ``shell_call``, ``computer_call``...): a call never goes
    without its answer. A pinned entry that
    calls tools (the entry holding a provider compaction) keeps the entries carrying
    its answers. ``thinking``: counted with their thinking blocks (else without, as a
    compaction leaves them).
    """
    entries = c.memory.entries()
    counter = get_counter(c.counter)
    start = len(entries) - 1
    while start > 0 and entries[start].role in ("user", "tool") and _answers(entries[start]):
        start -= 1
    if start < len(entries) - 1 and not _calls(entries[start]):
        start = len(entries) - 1  # trailing answers without their assistant: not a unit
    kept_users = {_task_index(entries), _request_index(entries)}
    keep = [
        i >= start or i in kept_users or e.pinned or e.role == "system"
        for i, e in enumerate(entries)
    ]
    for i, e in enumerate(entries):
        if e.pinned and _calls(e):
            j = i + 1
            while j < len(entries) and _answers(entries[j]):
                keep[j] = True
                j += 1
    return sum(
        counter.count_entry(e if thinking else e.without_thinking())
        for e, k in zip(entries, keep, strict=True)
        if k
    )


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


def _native_error_expected(c: _Case, error: str) -> bool | None:
    """Whether a native compactor's error is expected: without a fallback, any the
    provider's failure (or nothing left to summarize) leaves (``True``); with one, the
    fallback's (``None``: judge it as the fallback's own)."""
    if c.opts.get("fallback", "window_manager") is None:
        return "no fallback is configured" in error or "after the provider's compaction" in error
    return None


def _check_native_error(c: _Case, error: str) -> None:
    """A native compactor's error: expected without a fallback when the provider could
    not compact, else only where its fallback could not fit either."""
    expected = _native_error_expected(c, error)
    if expected is not None:
        if not expected:
            c.find("unexpected_error", error)
        return
    fallback = c.opts.get("fallback_opts") or {"strategy": "summarize"}
    _check_error(c, error, fallback)


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
        if uid in out and out[uid].text().startswith(OFFLOADED_TAG):
            continue  # offloading at arrival takes the newest results by design
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
            if v.get("type") in ("image", "image_url", "input_image"):
                total += 1600
                continue
            if v.get("type") == "base64":
                continue
            stack.extend(x for k, x in v.items() if k not in _NOT_COUNTED)
            total += 4 if "role" in v else 0
        elif isinstance(v, list):
            stack.extend(v)
    return total


# -- provider formats: identity, accounting, the provider's compaction ----------------------


def _messages_of(data: Any) -> list[Any]:
    return list(data["messages"]) if isinstance(data, Mapping) else list(data)


def _made(e: Entry) -> bool:
    return bool(
        e.metadata.get(_MARKER_KEY)
        or e.metadata.get(_SUMMARY_KEY)
        or e.metadata.get(_NATIVE_KEY)
        or e.metadata.get(_REBUILT_KEY)
    )


def _check_identity(
    c: _Case, given: list[Any], out: list[Any], result: CompactResult, where: str = ""
) -> None:
    """Every output message that is not new is the very object given, in the input's order;
    a new object equal to a message given is a message rebuilt for nothing (the caller's
    SDK objects and unknown fields would not survive that), unless it is a marker or
    summary inserted in the place of an equal one this call dropped."""
    pos = {id(m): k for k, m in enumerate(given)}
    last = -1
    seen: set[int] = set()
    replaced = [d.text() for d in result.dropped if _made(d)]
    # The user messages OpenAI's compaction returns, put before it as copies of the
    # originals (reported dropped) where an entry the rules keep follows the compaction.
    # They are new objects, maybe equal to the originals as written: the user messages
    # before the compaction item the compactor made.
    returned = 0
    if c.compactor == "openai_native" and any(
        e.metadata.get(_REBUILT_KEY) for e in result.memory.entries()
    ):
        made = _newest_compaction(c.session.format, out)
        returned = next((j for j, m in enumerate(out) if m is made), 0)
    for j, m in enumerate(out):
        k = pos.get(id(m))
        if k is None:
            twin = next((i for i, g in enumerate(given) if g == m), None)
            if twin is not None and j < returned and m.get("role") == "user":
                continue
            if twin is not None and replaced:
                texts = _atoms(c.session.format, [m]).blob()
                if any(t and t in texts for t in replaced):
                    continue  # a marker or summary dropped, and an equal one inserted
            if twin is not None:
                c.find(
                    "identity",
                    f"{where}output message {j} equals input message {twin} but is a new "
                    f"object: {json.dumps(m, default=str)[:120]}",
                )
                return
            continue
        if k in seen:
            c.find("identity", f"{where}input message {k} comes back twice (output {j})")
            return
        if k < last:
            c.find("identity", f"{where}input message {k} comes back before message {last}")
            return
        seen.add(k)
        last = k


def _align(inputs: list[Entry], kept: list[Entry], dropped: list[Entry]) -> str | None:
    """Whether every input entry is kept (as it was, at most without thinking), or reported
    in ``dropped`` with its content (and then kept changed, under its id, or gone), in order.

    ``kept`` is the compacted conversation: entries inserted by the compaction (markers,
    summaries) may sit anywhere in it. Returns the first problem.
    """

    def same(k: Entry, e: Entry) -> bool:
        return k.role == e.role and k.content in (e.content, _strip_thinking(e))

    ki = di = 0
    for n, e in enumerate(inputs):
        d = dropped[di] if di < len(dropped) else None
        if d is not None and d.role == e.role and d.content == e.content:
            di += 1
            j = ki
            while j < len(kept) and _made(kept[j]) and kept[j].id != d.id:
                j += 1  # a marker or summary inserted before it
            if j < len(kept) and kept[j].id == d.id:
                ki = j
                if kept[ki].content in (d.content, _strip_thinking(d)):
                    return f"input entry {n} is reported dropped and kept unchanged"
                ki += 1  # kept changed (a shortened or cleared result), reported
            continue
        while ki < len(kept) and _made(kept[ki]) and not same(kept[ki], e):
            ki += 1
        if ki < len(kept) and same(kept[ki], e):
            ki += 1
            continue
        return (
            f"input entry {n} ({e.role}: {e.text()[:60]!r}) is neither kept nor reported in "
            f"dropped ({len(inputs)} input entries, {len(kept)} kept, {len(dropped)} dropped)"
        )
    rest = [k for k in kept[ki:] if not _made(k)]
    if rest:
        return f"{len(rest)} kept entries are no input entry: {rest[0].text()[:60]!r}"
    if di < len(dropped):
        d = dropped[di]
        return (
            f"{len(dropped) - di} dropped entries are no input entry (or out of order): "
            f"{d.role} {d.text()[:60]!r}"
        )
    return None


def _check_accounting(
    c: _Case, inputs: list[Entry], result: CompactResult, where: str = ""
) -> None:
    """Entries of the input = kept + dropped, counting the changed entries (reported in
    ``dropped`` and kept changed, as ``meta["shortened"]`` lists them) in both."""
    kept = result.memory.entries()
    dropped = list(result.dropped)
    problem = _align(inputs, kept, dropped)
    if problem:
        c.find("accounting", where + problem)
        return
    if c.compactor == "window_manager" and result.compacted:
        both = {e.id for e in kept} & {e.id for e in dropped}
        shortened = set(result.meta.get("shortened") or ())
        if both != shortened:
            c.find(
                "accounting",
                f"{where}{len(both)} entries are kept changed and reported dropped, "
                f"meta['shortened'] lists {len(shortened)}",
            )


def _newest_compaction(fmt: str, given: list[Any]) -> Any:
    """The newest provider compaction of ``given``: the block or item object, or ``None``."""
    for m in reversed(given):
        if fmt == "responses" and m.get("type") == "compaction":
            return m
        content = m.get("content") if fmt == "anthropic" else None
        if isinstance(content, list):
            for b in reversed(content):
                if isinstance(b, Mapping) and b.get("type") == "compaction":
                    return b
    return None


def _check_provider_compaction(c: _Case, given: list[Any], out: list[Any], where: str) -> None:
    newest = _newest_compaction(c.session.format, given)
    if newest is None:
        return
    if c.compactor in NATIVE:
        made = _newest_compaction(c.session.format, out)
        if made is not None and not any(made == g for g in _compactions(c.session.format, given)):
            return  # the provider summarized its older compaction into a new one
    if c.session.format == "responses":
        kept = any(m is newest for m in out)
    else:
        kept = any(
            isinstance(m.get("content"), list) and any(b is newest for b in m["content"])
            for m in out
        )
    if not kept:
        c.find(
            "provider_compaction",
            f"{where}the newest provider compaction is not in the output: "
            f"{json.dumps(newest, default=str)[:100]}",
        )


def _compactions(fmt: str, given: list[Any]) -> list[Any]:
    """Every provider compaction of ``given`` (blocks or items)."""
    out: list[Any] = []
    for m in given:
        if fmt == "responses" and m.get("type") == "compaction":
            out.append(m)
        content = m.get("content") if fmt == "anthropic" else None
        if isinstance(content, list):
            out.extend(
                b for b in content if isinstance(b, Mapping) and b.get("type") == "compaction"
            )
    return out


def _check_valid(c: _Case, out: Any, where: str = "") -> None:
    lc = bool(c.session.shape.get("lc_thinking"))
    problems = validate(c.session.format, out, thinking=lc)
    if c.session.format in PROVIDER_FORMATS:
        problems += validate_sdk(c.session.format, out, thinking=lc)
    if problems:
        c.find("validity", where + "; ".join(problems[:3]))


def _check_provider(c: _Case, result: CompactResult) -> None:
    """Checks (a), (b) and (d) of a single call in a provider format."""
    given = _messages_of(c.data)
    out = _messages_of(result.messages)
    _check_identity(c, given, out, result)
    if isinstance(c.data, Mapping) and isinstance(result.messages, Mapping):
        system = c.data.get("system")
        back = result.messages.get("system")
        if system is not None and back == system and back is not system:
            c.find("identity", "the request's system comes back as a new object")
    if result.error is None:
        _check_accounting(c, c.memory.entries(), result)
    _check_provider_compaction(c, given, out, "")


def _check_result(c: _Case, result: CompactResult) -> None:
    fmt = c.session.format
    meta = result.meta
    if fmt in PROVIDER_FORMATS:
        _check_provider(c, result)
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
        elif c.compactor in NATIVE:
            _check_native_error(c, result.error)
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
    _check_valid(c, result.messages)
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
    if second.compacted:
        _check_valid(c, second.messages, "second pass: ")
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


# -- continuation sequences -------------------------------------------------------------------


def _ekey(e: Entry) -> str:
    content: Any = e.content
    if not isinstance(content, str):
        content = [b.model_dump(mode="json") for b in content]
    return json.dumps([e.role, content], sort_keys=True, ensure_ascii=False)


def _fresh(c: _Case, messages: list[Any]) -> AgentMemory:
    """``messages`` read from scratch (``fresh=True`` is not needed: reading is not compacting)."""
    return parse_transcript(messages, c.session.format)[1]


def _has_compaction(fmt: str, batch: list[Any]) -> bool:
    return _newest_compaction(fmt, batch) is not None


def _check_window(c: _Case, r: CompactResult, out: list[Any], where: str) -> None:
    """The output within the usable window, by a fresh count of what is returned."""
    if c.usable is None or r.error is not None:
        return
    fresh = _fresh(c, out).tokens(get_counter(c.counter))
    tolerance = max(16, c.usable // 50)
    if fresh <= c.usable + tolerance:
        return
    if r.compacted:
        c.find(
            "fit",
            f"{where}the output counts {fresh} tokens afresh (tokens_after "
            f"{r.meta.get('tokens_after')}) over the usable window {c.usable} (+{tolerance}); "
            f"continued={r.continued} target_met={r.meta.get('target_met')}",
        )
    else:
        c.find(
            "skipped_over_window",
            f"{where}skipped at {fresh} tokens (counted afresh) against a usable window of "
            f"{c.usable}; continued={r.continued}",
        )


def _sequence_error(c: _Case, r: CompactResult, where: str) -> None:
    assert r.error is not None
    if c.compactor in (*NATIVE, "window_manager", "pipeline") and any(
        p in r.error for p in _EXPECTED_ERRORS
    ):
        return
    if c.compactor in NATIVE and _native_error_expected(c, r.error):
        return
    c.find("unexpected_error", where + r.error)


def _run_sequence(c: _Case) -> None:
    """Grow the case's list batch by batch, calling ``compact()`` at every model request.

    ``continue-full``: the agent keeps its full history and appends to it;
    ``continue-replace``: it replaces its list with ``result.messages`` (extended in
    place, or copied) and appends. Each result is checked like a single call (validity,
    identity, accounting, the provider's compaction) and, across the calls: compacted as a
    continuation after the first call (unless a batch brings a newer provider compaction,
    which the continuation sends down the full path), within the window by a fresh count,
    the skip and error paths returning the list continued, and no entry reported dropped
    twice.
    """
    fmt = c.session.format
    full = list(c.data)
    pristine = copy.deepcopy(full)
    points = request_points(fmt, full)
    rng = random.Random(f"normandy-fuzz-sequence:{c.seed}:{c.index}")
    hist: list[Any] = []
    cur: list[Any] = []
    prev: CompactResult | None = None
    prev_out: list[Any] = []
    gone: Counter[str] = Counter()  # entries reported dropped and no longer kept
    gone_ids: set[str] = set()
    outcomes: Counter[str] = Counter()
    start = 0
    for n, (end, mid) in enumerate(points):
        batch = full[start:end]
        start = end
        if c.mode == "continue-full":
            hist.extend(batch)
            holder = hist
        elif prev is None:
            cur = list(batch)
            holder = cur
        elif rng.random() < 0.5:
            holder = prev.messages  # extended in place, as an agent would
            holder.extend(batch)
        else:
            holder = [*prev.messages, *batch]
        given = list(holder)
        where = f"call {n + 1} of {len(points)} (mid_round={mid}): "
        try:
            r = c.call(holder, mid_round=mid)
        except CompactionError as exc:
            c.find("validity", f"{where}CompactionError: {exc}")
            outcomes["raised"] += 1
            break
        except TranscriptError as exc:
            c.find("rejected", f"{where}TranscriptError for a valid transcript: {exc}")
            outcomes["raised"] += 1
            break
        except OptionsError as exc:
            outcomes["refused" if "leave nothing of the" in str(exc) else "raised"] += 1
            if "leave nothing of the" not in str(exc):
                c.find("harness", f"OptionsError: {exc}")
            break
        c.report.calls += 1
        c.report.continued += int(r.continued)
        out = list(r.messages)
        outcomes["compacted" if r.compacted else "error" if r.error else "skipped"] += 1
        # (e) a continuation after the first call, unless a newer provider compaction came
        if n > 0 and not r.continued and not _has_compaction(fmt, batch):
            c.find("not_continued", f"{where}the call was not compacted as a continuation")
        if r.compacted:
            _check_valid(c, out, where)
        else:
            _check_hand(c, out, where)
        _check_identity(c, given, out, r, where)
        _check_provider_compaction(c, given, out, where)
        # (b) accounting, against the entries this call had: the ones the last call left
        # and the new ones (a continuation), or the list read afresh
        if r.continued and prev is not None:
            k = len(given) - len(batch)
            new = _fresh(c, given).entries()[len(_fresh(c, given[:k]).entries()) :]
            inputs = [*prev.memory.entries(), *new]
        else:
            inputs = _fresh(c, given).entries()
        _check_accounting(c, inputs, r, where)
        # no entry reported dropped twice: by id along a continuation (ids live on in the
        # remembered conversation); read afresh, by content, where every entry of the
        # list with that content was dropped before (only the full history holds those)
        dropped = [d for d in r.dropped if not _made(d)]
        if r.continued:
            twice = [d for d in dropped if d.id in gone_ids]
        elif c.mode == "continue-full":
            counts = Counter(_ekey(e) for e in inputs)
            twice = [d for d in dropped if gone[_ekey(d)] >= counts[_ekey(d)] > 0]
        else:
            twice = []
        if twice:
            c.find(
                "dropped_twice",
                f"{where}{len(twice)} entries reported dropped by an earlier call are reported "
                f"again (continued={r.continued}), the first {twice[0].role} "
                f"{twice[0].text()[:60]!r}",
            )
        kept_ids = {e.id for e in r.memory.entries()}
        for d in dropped:
            if d.id not in kept_ids:
                gone[_ekey(d)] += 1
                gone_ids.add(d.id)
        # the skip and error paths: the list comes back as given (continued: as returned
        # last time plus the new messages)
        if not r.compacted:
            expected = [*prev_out, *batch] if r.continued else given
            if len(out) != len(expected) or any(
                a is not b for a, b in zip(out, expected, strict=True)
            ):
                c.find(
                    "error_path",
                    f"{where}the {'error' if r.error else 'skip'} path did not return the "
                    f"{'continued' if r.continued else 'given'} list as it was",
                )
            if r.dropped:
                c.find("error_path", f"{where}{len(r.dropped)} entries dropped without compacting")
        if r.error is not None:
            _sequence_error(c, r, where)
        _check_window(c, r, out, where)
        prev = r
        prev_out = list(r.messages)
    if full != pristine:
        c.find("mutation", "compact() changed the caller's messages during the sequence")
    c.report.outcome = next(
        (k for k in ("raised", "compacted", "error", "refused") if outcomes[k]), "skipped"
    )


def _check_hand(c: _Case, out: Any, where: str) -> None:
    """The hand-written validator only (an output that was not compacted is the input)."""
    lc = bool(c.session.shape.get("lc_thinking"))
    problems = validate(c.session.format, out, thinking=lc)
    if problems:
        c.find("validity", where + "; ".join(problems[:3]))


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
    with _recall_source(c.opts):
        _run_drawn(c, report)
    report.seconds = time.perf_counter() - t0
    report.findings = c.findings
    return c.findings


def _run_drawn(c: _Case, report: CaseReport) -> None:
    """Run the drawn case ``c`` and its checks, its findings in ``c.findings``."""
    lc = bool(c.session.shape.get("lc_thinking"))
    problems = validate(c.session.format, c.data, thinking=lc)
    if c.session.format in PROVIDER_FORMATS:
        problems += validate_sdk(c.session.format, c.data, thinking=lc)
    if problems:
        c.find("harness", "the generator drew an invalid transcript: " + "; ".join(problems[:3]))
        return
    if c.mode != "single":
        try:
            _run_sequence(c)
        except Exception as exc:
            report.outcome = "raised"
            c.find("exception", f"{type(exc).__name__}: {exc}")
        return
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


class _RecallStandIn:
    """A recall source for the cases that offload: the campaign disables the archive, and
    ``clear_tool_results`` offloads only when a source could give a result back (the
    loss checks then find each original in ``dropped``, where the archive would take it)."""

    @hookimpl
    def recall_entries(self, query: str, session_id: str | None, limit: int) -> None:
        return None


def _offloads(opts: Mapping[str, Any]) -> bool:
    """Whether ``opts`` (or a pipeline step's) set ``offload_tokens``."""
    steps = opts.get("steps") or ()
    return "offload_tokens" in opts or any(_offloads(s.get("opts") or {}) for s in steps)


@contextlib.contextmanager
def _recall_source(opts: Mapping[str, Any]) -> Iterator[None]:
    """:class:`_RecallStandIn` registered while a case whose ``opts`` offload runs."""
    if not _offloads(opts):
        yield
        return
    name = register_hook(_RecallStandIn(), "fuzz-recall-stand-in")
    try:
        yield
    finally:
        unregister_hook(name)


def run_indexed(seed: int, index: int, compactor: str | None = None) -> CaseReport:
    """Run case ``index`` of campaign ``seed`` (with ``compactor`` instead of the drawn one)."""
    report = CaseReport(seed, index)
    run_case(case_rng(seed, index), seed=seed, index=index, report=report, compactor=compactor)
    return report
