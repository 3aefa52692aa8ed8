"""Replaying a quality session and measuring what the model can see when it needs a fact.

Normandy's compactors run in the real turn loop: every recorded turn goes through
:func:`normandy_core.turn.run_turn` with a :class:`~normandy_core.clients.ScriptedClient`
whose replies are functions of the request they get. At a call that needs a fact, the
function looks for the fact in what the request carries (system prompt and messages):
found in an original message it is available *in context*, found only in a marker or
summary a compactor inserted it is available *in a summary*. When it is not there and
the agent has ``recall`` on, the model calls the ``recall`` tool with the need's query
(the loop answers it from the SQLite archive, bounded in tokens as for any model) and the
fact counts as available *by recall* when the result the next request carries holds it.
Then the recorded reply is given and the session goes on as it was recorded.

The peers (LangChain ``trim_messages``, Strands' ``SlidingWindowConversationManager``)
cannot run in Normandy's loop; they get the same session message by message, and before
each model call their own trimming decides what the request carries. No recall.

For every request the tokens are counted with cl100k (the compactors are pinned to it
too, so all subjects size in the same units), and billed with prompt caching: the
longest prefix of messages the previous request also had (tools and system included)
is a cache read (0.1x the input price), the rest a cache write (1.25x).
"""

from __future__ import annotations

import contextlib
import json
import random
import types
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from benchmarks.quality.sessions import Need, QualitySession, Turn
from normandy_core import (
    AgentConfig,
    Entry,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    get_counter,
)
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.clients.scripted import ScriptedRequest
from normandy_core.contract.preparation import pin_if_needed
from normandy_core.conversation.entries import Block
from normandy_core.conversation.survival import is_inserted
from normandy_core.conversation.tokens import TokenCounter
from normandy_core.turn import run_turn

__all__ = [
    "INPUT_PRICE",
    "MODEL",
    "RESERVED",
    "Billing",
    "NeedResult",
    "Run",
    "Subject",
    "Where",
    "recorded_tools",
    "replay",
    "reply_blocks",
    "subjects",
]

#: The model the agent claims to be (prices and thinking rules are Anthropic's).
MODEL = "claude-sonnet-4-5"
#: Dollars per million input tokens (Claude Sonnet 4.5); reads 0.1x, writes 1.25x.
INPUT_PRICE = 3.0
CACHE_READ = 0.1
CACHE_WRITE = 1.25
#: Room kept for the reply, as window_manager's default.
RESERVED = 4096
#: The counter every subject sizes and is measured with.
COUNTER = "cl100k_base"
_ENTRY = "benchmarks.quality"

Where = Literal["context", "summary", "recall", "missing"]


@dataclass(frozen=True)
class Subject:
    """What compacts: a Normandy compactor with its options, or a peer (``peer`` set)."""

    label: str
    compactor: str = ""
    opts: Mapping[str, Any] = field(default_factory=dict)
    peer: str | None = None

    def options(self, window: int) -> dict[str, Any]:
        """The compactor options for ``window``: counter and triggers in its units."""
        usable = window - RESERVED
        if self.compactor == "clear_tool_results":
            return {"counter": COUNTER, "trigger_tokens": int(0.8 * usable), **self.opts}
        if self.compactor == "pipeline":
            steps = [
                {
                    "compactor": "clear_tool_results",
                    "opts": {"counter": COUNTER, "trigger_tokens": int(0.8 * usable)},
                },
                {"compactor": "window_manager", "opts": {"counter": COUNTER}},
            ]
            return {"steps": steps, "counter": COUNTER, **self.opts}
        return {"counter": COUNTER, **self.opts}


def subjects(peers: bool = True, frameworks: bool = False, offload: bool = False) -> list[Subject]:
    """Every strategy of window_manager, clear_tool_results, the pipeline, then the peers
    and (``frameworks``) the Strands, LlamaIndex and ADK subjects of
    :mod:`benchmarks.quality.frameworks`: Normandy's adapters and the frameworks' own
    managers; (``offload``) offload at arrival, ``clear_tool_results``' and Strands'
    ``ContextOffloader`` in Strands' own loop (:mod:`benchmarks.quality.strands_loop`)."""
    out = [
        Subject("window_manager oldest_first", "window_manager", {"strategy": "oldest_first"}),
        Subject("window_manager sliding_window", "window_manager", {"strategy": "sliding_window"}),
        Subject(
            "window_manager summarize (extractive)",
            "window_manager",
            {"strategy": "summarize", "summarizer": "extractive"},
        ),
        Subject("clear_tool_results", "clear_tool_results"),
        Subject("pipeline clear_tool_results -> window_manager", "pipeline"),
    ]
    if peers:
        out += [
            Subject("LangChain trim_messages (last)", peer="langchain"),
            Subject("Strands SlidingWindowConversationManager", peer="strands"),
        ]
    if frameworks:
        from benchmarks.quality.frameworks import FRAMEWORK_PEERS

        out += [Subject(label, peer=peer) for peer, label in FRAMEWORK_PEERS.items()]
    if offload:
        from benchmarks.quality.strands_loop import OFFLOAD_SUBJECTS

        out += OFFLOAD_SUBJECTS
    return out


@dataclass(frozen=True)
class NeedResult:
    """Where a needed fact was found at its call (``missing``: nowhere the model could see)."""

    need: Need
    where: Where

    @property
    def available(self) -> bool:
        """Whether the model had the fact when it needed it."""
        return self.where != "missing"


class Billing:
    """Tokens sent and their billed cost with prompt caching, request by request."""

    def __init__(self, counter: TokenCounter, fixed: int) -> None:
        self.counter = counter
        self.fixed = fixed  # system prompt and tool definitions
        self.prev: Sequence[Entry] = ()
        self.requests = 0
        self.sent = 0
        self.read = 0
        self.write = 0
        self.peak = 0
        self._tokens: dict[int, tuple[Entry, int]] = {}

    def tokens(self, e: Entry) -> int:
        """The tokens of one message (cached per object)."""
        hit = self._tokens.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        n = self.counter.count_entry(e)
        self._tokens[id(e)] = (e, n)
        return n

    def size(self, messages: Sequence[Entry]) -> int:
        """The tokens a request with ``messages`` carries (system and tools included)."""
        return self.fixed + sum(self.tokens(e) for e in messages)

    def request(self, messages: Sequence[Entry]) -> int:
        """Bill one request; returns its tokens."""
        prev = self.prev
        k = 0
        while (
            k < len(prev)
            and k < len(messages)
            and (messages[k] is prev[k] or messages[k] == prev[k])
        ):
            k += 1
        sizes = [self.tokens(e) for e in messages]
        total = self.fixed + sum(sizes)
        cached = (self.fixed + sum(sizes[:k])) if self.requests else 0
        self.requests += 1
        self.sent += total
        self.read += cached
        self.write += total - cached
        self.peak = max(self.peak, total)
        self.prev = tuple(messages)
        return total

    @property
    def cost(self) -> float:
        """Dollars billed for the input of every request, with caching."""
        return (self.read * CACHE_READ + self.write * CACHE_WRITE) * INPUT_PRICE / 1e6

    @property
    def uncached_cost(self) -> float:
        """Dollars the same input costs without caching."""
        return self.sent * INPUT_PRICE / 1e6


@dataclass
class Run:
    """One replay of one session by one subject at one window, with recall on or off."""

    session: str
    subject: str
    window: int
    recall: bool
    billing: Billing
    results: list[NeedResult] = field(default_factory=list)
    compactions: int = 0
    task_missing: int = 0  # requests that did not carry the task message
    over_window: int = 0  # requests larger than the window
    recall_calls: int = 0
    #: Requests the turn loop sent with thinking disabled (a mid-round compaction stripped
    #: the round's thinking); ``None`` for a peer, which runs no turn loop.
    thinking_disabled: int | None = None

    @property
    def available(self) -> int:
        """Needs whose fact the model had."""
        return sum(r.available for r in self.results)

    def count(self, where: Where) -> int:
        """Needs satisfied (or not) in the way ``where``."""
        return sum(r.where == where for r in self.results)


# -- what the model sees ------------------------------------------------------------------


_texts: dict[int, tuple[Entry, str]] = {}


def visible_text(e: Entry) -> str:
    """Every text of ``e`` a model reads: text, thinking, tool inputs, tool results."""
    hit = _texts.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    if isinstance(e.content, str):
        text = e.content
    else:
        parts: list[str] = []
        for b in e.content:
            if isinstance(b, TextBlock):
                parts.append(b.text)
            elif isinstance(b, ThinkingBlock):
                parts.append(b.thinking)
            elif isinstance(b, ToolUseBlock):
                parts.append(json.dumps(dict(b.input), ensure_ascii=False))
            elif isinstance(b, ToolResultBlock):
                parts.append(b.text())
        text = "\n".join(parts)
    if len(_texts) > 200_000:
        _texts.clear()
    _texts[id(e)] = (e, text)
    return text


def locate(fact: str, system: str, messages: Sequence[Entry]) -> Where:
    """Where ``fact`` is in a request: ``context``, ``summary`` (only in an inserted
    marker or summary) or ``missing``."""
    if fact in system:
        return "context"
    in_summary = False
    for e in messages:
        if fact in visible_text(e):
            if not is_inserted(e):
                return "context"
            in_summary = True
    return "summary" if in_summary else "missing"


def reply_blocks(records: Sequence[Mapping[str, Any]]) -> tuple[Block, ...]:
    """A recorded reply's block dicts as Normandy blocks."""
    return Entry.model_validate({"id": "r", "role": "assistant", "content": list(records)}).blocks


def _needs_by_call(session: QualitySession) -> dict[tuple[int, int], list[Need]]:
    out: dict[tuple[int, int], list[Need]] = {}
    for n in session.needs:
        out.setdefault((n.turn, n.call), []).append(n)
    return out


def _has_task(task: str, messages: Sequence[Entry]) -> bool:
    return any(e.role == "user" and e.text() == task for e in messages)


# -- Normandy in the turn loop ---------------------------------------------------------------


@contextlib.contextmanager
def seeded_ids(seed: int) -> Iterator[None]:
    """Entry ids and recall nonces drawn from a seeded generator inside the block.

    Both are random in the library; their token counts vary a little, and so would what
    fits a recall result's bound. Seeded, a replay gives the same figures at every run.
    """
    import normandy_core.contract.recall as retrieval
    import normandy_core.conversation.entries as entries

    rng = random.Random(seed)
    nonces = types.SimpleNamespace(
        token_hex=lambda n: rng.getrandbits(8 * n).to_bytes(n, "big").hex()
    )
    names = vars(entries), vars(retrieval)
    saved = names[0]["_random_bytes"], names[1]["secrets"]
    names[0]["_random_bytes"] = lambda n: rng.getrandbits(8 * n).to_bytes(n, "big")
    names[1]["secrets"] = nonces
    try:
        yield
    finally:
        names[0]["_random_bytes"], names[1]["secrets"] = saved


class _Model:
    """The scripted model of one turn: answers with the recorded replies, checking needs."""

    def __init__(
        self,
        run: Run,
        session: QualitySession,
        t: int,
        replies: Sequence[tuple[Block, ...]],
        needs: Mapping[tuple[int, int], list[Need]],
        recall_name: str | None,
    ) -> None:
        self.run = run
        self.session = session
        self.t = t
        self.replies = replies
        self.needs = needs
        self.recall_name = recall_name
        self.c = 0
        self.pending: dict[str, Need] = {}

    def __call__(self, req: ScriptedRequest) -> ModelReply:
        run = self.run
        if self.pending:
            results = {
                b.tool_use_id: b.text()
                for b in (req.messages[-1].blocks if req.messages else ())
                if isinstance(b, ToolResultBlock)
            }
            for call_id, need in self.pending.items():
                fact = self.session.fact(need.fact).text
                got = fact in results.get(call_id, "")
                run.results.append(NeedResult(need, "recall" if got else "missing"))
            self.pending = {}
            return self._reply()
        missing: list[Need] = []
        for need in self.needs.get((self.t, self.c), ()):
            where = locate(self.session.fact(need.fact).text, req.system, req.messages)
            if where == "missing":
                missing.append(need)
            else:
                run.results.append(NeedResult(need, where))
        if missing and self.recall_name is not None:
            uses = []
            for i, need in enumerate(missing):
                call_id = f"recall_{self.t}_{self.c}_{i}"
                self.pending[call_id] = need
                uses.append(
                    ToolUseBlock(id=call_id, name=self.recall_name, input={"query": need.query})
                )
            run.recall_calls += len(uses)
            thinking = ThinkingBlock(
                thinking="I need something from earlier that I can no longer see; recall it.",
                signature=f"sig-recall-{self.t}-{self.c}",
            )
            return ModelReply(content=(thinking, *uses))
        run.results += [NeedResult(n, "missing") for n in missing]
        return self._reply()

    def _reply(self) -> ModelReply:
        blocks = self.replies[self.c]
        self.c += 1
        return ModelReply(content=blocks)


def recorded_tools(turn: Turn) -> dict[str, Callable[..., ToolResultBlock]]:
    """Tools that answer ``turn``'s calls with its recorded outputs, in order."""
    outputs: Iterator[Mapping[str, Any]] = iter(turn.outputs)

    def make(name: str) -> Callable[..., ToolResultBlock]:
        def call(**_input: Any) -> ToolResultBlock:
            rec = next(outputs, None)
            if rec is None:
                raise RuntimeError(f"turn {turn.turn_id}: no recorded output left for {name!r}")
            return ToolResultBlock(
                tool_use_id=str(rec["tool_use_id"]),
                content=str(rec["content"]),
                is_error=bool(rec.get("is_error", False)),
            )

        return call

    names = {str(b["name"]) for r in turn.replies for b in r if b.get("type") == "tool_use"}
    return {n: make(n) for n in names}


def _fixed(counter: TokenCounter, session: QualitySession, recall: bool) -> int:
    tools = list(session.tools)
    if recall:
        from normandy_core import RecallSettings

        tools.append(RecallSettings().definition())
    return counter.count_text(session.system) + counter.count_text(json.dumps(tools))


def _replay_normandy(
    session: QualitySession, subject: Subject, window: int, recall: bool, archive_dir: Path
) -> Run:
    import normandy_archive

    counter = get_counter(COUNTER)
    run = Run(session.name, subject.label, window, recall, Billing(counter, 0))
    run.billing.fixed = _fixed(counter, session, recall)
    run.thinking_disabled = 0
    opts = pin_if_needed(subject.compactor, subject.options(window), window, entry=_ENTRY)
    needs = _needs_by_call(session)
    task = session.turns[0].user
    path = archive_dir / f"{uuid.uuid4().hex}.sqlite3"
    with normandy_archive.archive_settings(path=str(path)), seeded_ids(window):
        acc = AgentConfig(
            model=MODEL,
            system_prompt=session.system,
            tools=session.tools,
            compactor=subject.compactor,
            compactor_opts=opts,
            recall=recall or None,
            _entry=_ENTRY,
        )
        name = acc.recall_settings.tool_name if acc.recall_settings else None

        def on_event(event: dict[str, Any]) -> None:
            if event.get("type") == "boundary" and event["meta"].get("compacted"):
                run.compactions += 1

        for t, turn in enumerate(session.turns):
            replies = [reply_blocks(r) for r in turn.replies]
            model = _Model(run, session, t, replies, needs, name)
            script = [model] * (2 * len(turn.replies) + 1)
            client = ScriptedClient(script, model=MODEL)
            result = run_turn(
                acc,
                turn.user,
                client=client,
                tools=recorded_tools(turn),
                turn_id=turn.turn_id,
                thinking=2048,
                max_iterations=4 * len(turn.replies) + 4,
                on_event=on_event,
            )
            acc = result.acc
            run.thinking_disabled += result.thinking_disabled_calls
            for req in client.requests:
                total = run.billing.request(req.messages)
                run.over_window += total > window
                run.task_missing += not _has_task(task, req.messages)
    path.unlink(missing_ok=True)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return run


# -- the peers ---------------------------------------------------------------------------------


def _session_entries(session: QualitySession) -> Iterator[tuple[int, int, list[Entry]]]:
    """Per call ``(turn, call, entries appended just before it)``, as the loop appends them."""
    new: list[Entry] = []  # the previous turn's final answer, before the next user message
    for t, turn in enumerate(session.turns):
        outputs = iter(turn.outputs)
        new.append(Entry(id=f"q{t}-u", role="user", content=turn.user, turn_id=turn.turn_id))
        for c, records in enumerate(turn.replies):
            yield t, c, new
            blocks = reply_blocks(records)
            new = [Entry(id=f"q{t}-{c}-a", role="assistant", content=blocks, turn_id=turn.turn_id)]
            uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
            if uses:
                results = []
                for _ in uses:
                    rec = next(outputs)
                    results.append(
                        ToolResultBlock(
                            tool_use_id=str(rec["tool_use_id"]),
                            content=str(rec["content"]),
                            is_error=bool(rec.get("is_error", False)),
                        )
                    )
                new.append(
                    Entry(
                        id=f"q{t}-{c}-r", role="user", content=tuple(results), turn_id=turn.turn_id
                    )
                )


def _langchain(
    budget: int, counter: TokenCounter
) -> Callable[[list[Entry]], tuple[list[Entry], int]]:
    """LangChain's ``trim_messages`` as an agent's pre-model hook: the full history stays
    in the agent's state, each request carries the newest messages that fit ``budget``."""
    from langchain_core.messages import trim_messages

    from benchmarks.peers import _lc_convert, group_kept

    history: list[Any] = []
    back: dict[int, tuple[Entry, str | None]] = {}
    tokens: dict[int, int] = {}

    def count(messages: Sequence[Any]) -> int:
        total = 0
        for m in messages:
            n = tokens.get(id(m))
            if n is None:
                e, rid = back[id(m)]
                if rid is None:
                    n = counter.count_entry(e)
                else:
                    part = e.model_copy(
                        update={
                            "content": tuple(
                                b
                                for b in e.blocks
                                if isinstance(b, ToolResultBlock) and b.tool_use_id == rid
                            )
                        }
                    )
                    n = counter.count_entry(part)
                tokens[id(m)] = n
            total += n
        return total

    def fit(new: list[Entry]) -> tuple[list[Entry], int]:
        per, more = _lc_convert(new)
        for msgs, e in zip(per, new, strict=True):
            for m in msgs:
                more.setdefault(id(m), (e, None))
            history.extend(msgs)
        back.update(more)
        view = trim_messages(
            history,
            max_tokens=budget,
            token_counter=count,
            strategy="last",
            start_on="human",
            end_on=("human", "tool"),
            include_system=False,
            allow_partial=False,
        )
        kept = group_kept([back[id(m)] for m in view])
        out: list[Entry] = []
        for e, part in kept:
            if part is None:
                out.append(e)
            else:
                blocks = tuple(
                    b
                    for b in e.blocks
                    if not isinstance(b, ToolResultBlock) or b.tool_use_id in part
                )
                out.append(e.model_copy(update={"content": blocks}))
        trimmed = len(view) < len(history)
        return out, int(trimmed)

    return fit


def from_strands(m: Mapping[str, Any]) -> Entry:
    """A Strands message as a Normandy entry (text, reasoning, tool uses and results)."""
    blocks: list[Block] = []
    for part in m["content"]:
        if "text" in part:
            blocks.append(TextBlock(text=part["text"]))
        elif "reasoningContent" in part:
            r = part["reasoningContent"]["reasoningText"]
            blocks.append(ThinkingBlock(thinking=r["text"], signature=r.get("signature", "")))
        elif "toolUse" in part:
            u = part["toolUse"]
            blocks.append(ToolUseBlock(id=u["toolUseId"], name=u["name"], input=u["input"]))
        elif "toolResult" in part:
            r = part["toolResult"]
            text = "\n".join(str(c.get("text", "")) for c in r["content"])
            blocks.append(
                ToolResultBlock(
                    tool_use_id=r["toolUseId"], content=text, is_error=r.get("status") == "error"
                )
            )
    return Entry(id="s", role=m["role"], content=tuple(blocks))


def _strands(
    window: int, budget: int, counter: TokenCounter, fixed: int
) -> Callable[[list[Entry]], tuple[list[Entry], int]]:
    """Strands' ``SlidingWindowConversationManager`` with proactive compression (70 % of
    the window), and the reactive reduction its event loop runs when the provider refuses
    an oversized request (tool results truncated first, then the oldest messages)."""
    from strands.agent.conversation_manager import SlidingWindowConversationManager
    from strands.types.exceptions import ContextWindowOverflowException

    from benchmarks.peers import _strands_model, strands_convert

    agent = types.SimpleNamespace(messages=[], model=_strands_model(window))
    manager = SlidingWindowConversationManager(window_size=1_000_000, proactive_compression=True)
    cache: dict[int, tuple[str, Entry, int]] = {}

    def entries() -> list[Entry]:
        out = []
        for m in agent.messages:
            key = json.dumps(m["content"], sort_keys=True)
            hit = cache.get(id(m))
            if hit is None or hit[0] != key:
                e = from_strands(m)
                hit = (key, e, counter.count_entry(e))
                cache[id(m)] = hit
            out.append(hit[1])
        return out

    def size() -> int:
        return fixed + sum(cache[id(m)][2] for m in agent.messages)

    def fit(new: list[Entry]) -> tuple[list[Entry], int]:
        msgs, _ = strands_convert(new)
        agent.messages.extend(msgs)
        entries()
        reductions = 0
        count = len(agent.messages)
        event = types.SimpleNamespace(agent=agent, projected_input_tokens=size())
        manager._on_before_model_call_threshold(cast(Any, event))
        entries()
        reductions += len(agent.messages) != count
        # The provider refuses what does not fit; Strands reduces and retries.
        while size() > budget + fixed:
            was = size()
            try:
                manager.reduce_context(
                    cast(Any, agent), e=ContextWindowOverflowException("too long")
                )
            except ContextWindowOverflowException:
                break
            entries()
            if size() >= was:
                break
            reductions += 1
        return entries(), reductions

    return fit


def _replay_peer(session: QualitySession, subject: Subject, window: int) -> Run:
    if subject.peer in ("strands-loop", "strands-loop-offloader"):
        from benchmarks.quality.strands_loop import replay_strands_loop

        offload = subject.peer == "strands-loop-offloader"
        return replay_strands_loop(session, subject.label, window, offload=offload)
    counter = get_counter(COUNTER)
    fixed = _fixed(counter, session, False)
    run = Run(session.name, subject.label, window, False, Billing(counter, fixed))
    budget = window - RESERVED - fixed
    if subject.peer == "langchain":
        fit = _langchain(budget, counter)
    elif subject.peer == "strands":
        fit = _strands(window, budget, counter, fixed)
    else:
        from benchmarks.quality.frameworks import framework_fit

        fit = framework_fit(str(subject.peer), window, counter, fixed, budget)
    needs = _needs_by_call(session)
    task = session.turns[0].user
    for t, c, new in _session_entries(session):
        view, reductions = fit(new)
        run.compactions += reductions
        for need in needs.get((t, c), ()):
            run.results.append(
                NeedResult(need, locate(session.fact(need.fact).text, session.system, view))
            )
        total = run.billing.request(view)
        run.over_window += total > window
        run.task_missing += not _has_task(task, view)
    return run


def replay(
    session: QualitySession, subject: Subject, window: int, *, recall: bool, archive_dir: Path
) -> Run:
    """Replay ``session`` with ``subject`` at ``window`` tokens (``recall`` on or off).

    ``archive_dir`` receives the run's SQLite archive (removed after the run).
    """
    if subject.peer is not None:
        if recall:
            raise ValueError(f"{subject.label}: the peers have no recall")
        return _replay_peer(session, subject, window)
    return _replay_normandy(session, subject, window, recall, archive_dir)
