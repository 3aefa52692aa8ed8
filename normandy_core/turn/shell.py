"""The shells that run the pure turn core: :func:`run_turn` (sync) and :func:`arun_turn` (async).

They interpret the core's effects with a model client and a tool registry. Every
boundary is resolved through the core's one boundary function,
:func:`normandy_core.run_compaction` (``mid_round=False`` at the start of the turn,
``True`` after each tool batch); the returned ``acc`` replaces the running one and its
meta goes back to the core as :class:`~normandy_core.turn.CompactionDone`. The async
shell runs compaction and synchronous tools in worker threads, so it never blocks the
event loop. A tool that raises, or is unknown, answers with an error tool result
(``is_error=True``): a tool use is never left without its result.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from normandy_core.clients.base import (
    ModelClient,
    ModelReply,
    Usage,
    holds_provider_compaction,
)
from normandy_core.contract.boundary import run_compaction
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.contract.recall import recall_tools
from normandy_core.conversation.calibration import (
    CalibratedCounter,
    Calibration,
    default_calibration,
)
from normandy_core.conversation.entries import (
    Content,
    DocumentBlock,
    Entry,
    ImageBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    new_id,
)
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.conversation.tokens import TokenCounter, get_counter
from normandy_core.turn.core import (
    AppendMessage,
    Budget,
    CallModel,
    CompactionDone,
    DispatchTools,
    Effect,
    Emit,
    Event,
    Finish,
    FinishReason,
    MaybeCompact,
    ModelReplied,
    ToolResults,
    TurnError,
    TurnState,
    UserInput,
    start,
    step,
)
from normandy_core.turn.tools import declare_tools, tool_map

__all__ = ["Tool", "TurnAborted", "TurnResult", "arun_turn", "run_turn", "tool_result"]

#: A tool: called with the tool use's input as keyword arguments, sync or async.
Tool = Callable[..., Any]


class TurnAborted(TurnError):
    """The model client failed mid-turn. ``acc`` and ``events`` hold the turn so far (the
    config given to the turn is unchanged)."""

    def __init__(self, message: str, acc: AgentConfig, events: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.acc = acc
        self.events = events


@dataclass
class TurnResult:
    """What a turn produced.

    ``text`` is the final answer; ``acc`` the agent config after the turn (its memory
    holds the turn's messages, compacted where a boundary compacted; the config given
    to the turn is never changed); ``events`` everything the turn reported, in order;
    ``usage`` the provider-reported tokens summed over the turn's calls; ``budget`` the
    task budget at the end (``None`` without one); ``reason`` why the turn ended;
    ``boundaries`` the meta of each of the turn's boundaries, in order (with the dropped
    entries in full, and ``tokens_before`` and ``tokens_after`` on every one).

    The typed fields sum up the turn's boundaries and are always there, as on
    :class:`~normandy_core.CompactResult`: :attr:`compacted`, :attr:`tokens_before`,
    :attr:`tokens_after`, :attr:`tokens_removed`, :attr:`dropped`, :attr:`error`,
    :attr:`archive`.
    """

    text: str
    acc: AgentConfig
    turn_id: str
    reason: FinishReason
    events: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    budget: Budget | None = None
    state: TurnState | None = None
    boundaries: list[Mapping[str, Any]] = field(default_factory=list)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events whose ``type`` is ``kind``."""
        return [e for e in self.events if e.get("type") == kind]

    @property
    def compacted(self) -> bool:
        """Whether any boundary of the turn compacted."""
        return any(bool(m.get("compacted")) for m in self.boundaries)

    @property
    def tokens_before(self) -> int:
        """Tokens of the conversation at the turn's first boundary, before it compacted (the
        history and the user's message), counted with the compactor's counter."""
        return int(self.boundaries[0].get("tokens_before") or 0) if self.boundaries else 0

    @property
    def tokens_after(self) -> int:
        """Tokens of the conversation after the turn's last boundary: what its last model
        call was sent (without the system prompt and tools), before the final reply."""
        return int(self.boundaries[-1].get("tokens_after") or 0) if self.boundaries else 0

    @property
    def tokens_removed(self) -> int:
        """Tokens of this turn's messages its compactions removed, summed (they stay
        counted as spent in the task budget)."""
        return sum(int(m.get("tokens_removed") or 0) for m in self.boundaries)

    @property
    def dropped(self) -> list[Entry]:
        """Every entry the turn's compactions removed, in the order they were dropped."""
        return [e for m in self.boundaries for e in (m.get("dropped") or ())]

    @property
    def error(self) -> str | None:
        """The first error a boundary of the turn reported (that boundary left the
        conversation as it was), else ``None``."""
        for m in self.boundaries:
            if m.get("error") is not None:
                return str(m["error"])
        return None

    @property
    def archive(self) -> Mapping[str, Any] | None:
        """The ``archive`` hook plugin's note of the turn's last compaction it recorded
        (where the dropped entries went), else ``None``."""
        found = None
        for m in self.boundaries:
            for item in m.get("hook_notes") or ():
                name = str(item.get("hook", ""))
                if name.rsplit(":", 1)[-1].split("@", 1)[0] == "archive":
                    found = item.get("note")
        return found


def tool_result(call: ToolUseBlock, output: Any) -> ToolResultBlock:
    """A tool's return value as the result of ``call``.

    Text stays text; a :class:`ToolResultBlock` is re-addressed to ``call``; text, image
    and document blocks (or a list of them) become the result's parts; anything else
    is JSON-encoded.
    """
    if isinstance(output, ToolResultBlock):
        return output.model_copy(update={"tool_use_id": call.id})
    if isinstance(output, str):
        return ToolResultBlock(tool_use_id=call.id, content=output)
    parts_types = (TextBlock, ImageBlock, DocumentBlock)
    if isinstance(output, parts_types):
        return ToolResultBlock(tool_use_id=call.id, content=(output,))
    if (
        isinstance(output, (list, tuple))
        and output
        and all(isinstance(p, parts_types) for p in output)
    ):
        return ToolResultBlock(tool_use_id=call.id, content=tuple(output))
    return ToolResultBlock(
        tool_use_id=call.id, content=json.dumps(output, ensure_ascii=False, default=str)
    )


def _error_result(call: ToolUseBlock, text: str) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=call.id, content=text, is_error=True)


class _Runner:
    """The state both shells share: the running acc, events, usage and counting."""

    def __init__(
        self,
        acc: AgentConfig,
        *,
        tools: Mapping[str, Tool],
        turn_id: str | None,
        max_iterations: int,
        budget: int | None,
        thinking: int | None,
        max_tokens: int,
        counter: TokenCounter | str | None,
        calibration: Calibration | None,
        on_event: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        # The turn runs on a config of its own: the caller's config and memory are never
        # changed (the memory is copied; its entries are frozen and shared).
        self.acc = acc.with_memory(acc.memory.copy())
        self.tools = dict(tools)
        self.turn_id = turn_id or new_id()
        self.state = start(self.turn_id, max_iterations=max_iterations, budget=budget)
        self.thinking = thinking
        self.max_tokens = max_tokens
        self.calibration = calibration or acc.calibration or default_calibration()
        if counter is None:
            # The compactor's own prepared counter, so a message is counted once, through
            # the memory's cache, for the budget, calibration and the compactor alike.
            self.counter = acc.prepared.counter_for(acc.model, self.calibration)
        else:
            self.counter = CalibratedCounter(get_counter(counter), acc.model, self.calibration)
        # The compactor's counter for this turn (ctx.counter): what a boundary that reports
        # no token figures is sized with. Every acc of the turn shares the prepared one.
        self.sizer = acc.prepared.counter_for(acc.model, self.calibration)
        # the recall tool (AgentConfig(recall=...)); a tool the caller gives under its name wins
        for name, fn in recall_tools(acc, self.counter, lambda: self.acc.memory).items():
            self.tools.setdefault(name, fn)
        self.budgeted = budget is not None
        self._pending: tuple[Content, str] | None = None
        self.on_event = on_event
        self.events: list[dict[str, Any]] = []
        self.boundaries: list[Mapping[str, Any]] = []
        self.usage = Usage()
        self.result: tuple[str, FinishReason] | None = None

    # -- small effects ------------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        """Record an event and pass it to ``on_event``."""
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    @property
    def base(self) -> TokenCounter:
        """The uncalibrated counter (calibration compares its counts with the provider's)."""
        return self.counter.base

    def tokens(self, role: Role, content: Content) -> int:
        """Calibrated tokens of a message about to be appended, for the task budget.

        Without a budget nothing is counted. With one, the message is counted under the id
        it is then appended with, through the memory's cache, so the compactor never
        counts it again.
        """
        if not self.budgeted:
            return 0
        entry = Entry(id=new_id(), role=role, content=content, turn_id=self.turn_id)
        self._pending = (content, entry.id)
        return self.counter.entry_tokens(self.acc.memory, entry)

    def apply(self, event: Event) -> list[Effect]:
        """Step the core; run the local effects, return the ones that need I/O."""
        self.state, effects = step(self.state, event)
        out: list[Effect] = []
        for eff in effects:
            if isinstance(eff, AppendMessage):
                pending, self._pending = self._pending, None
                same = pending is not None and (
                    pending[0] is eff.content or pending[0] == eff.content
                )
                eid = pending[1] if same and pending is not None else None
                if eff.role == "assistant" and holds_provider_compaction(eff.content):
                    self.append_compaction(eff.content, eid)
                else:
                    self.acc.memory.add_message(eff.role, eff.content, id=eid, turn_id=self.turn_id)
            elif isinstance(eff, Emit):
                self.emit(eff.event)
            elif isinstance(eff, Finish):
                self.result = (eff.text, eff.reason)
            else:
                out.append(eff)
        return out

    def append_compaction(self, content: Content, eid: str | None) -> None:
        """Append a reply holding a provider's compaction as a pinned entry.

        The provider summarized everything before it, and its clients send nothing
        before it again, so no compactor may drop it; an earlier provider compaction
        it supersedes is unpinned (a compactor may then drop it, reporting it).
        """
        memory = self.acc.memory
        entries = memory.entries()
        if any(e.pinned and e.metadata.get(PROVIDER_COMPACTION_KEY) for e in entries):
            unpinned = [
                e.model_copy(update={"pinned": False})
                if e.pinned and e.metadata.get(PROVIDER_COMPACTION_KEY)
                else e
                for e in entries
            ]
            memory = memory.derive(unpinned)
            self.acc = self.acc.with_memory(memory)
        memory.add_message(
            "assistant",
            content,
            id=eid,
            turn_id=self.turn_id,
            pinned=True,
            metadata={PROVIDER_COMPACTION_KEY: True},
        )

    def compacted(self, acc: AgentConfig, meta: Mapping[str, Any]) -> Event:
        """Put the boundary's acc in place; the event that reports it to the core.

        A boundary that reports no ``tokens_before`` or ``tokens_after`` (nothing was
        compacted) gets them here, counted with the compactor's counter (``ctx.counter``)
        from the memory's cached counts: the conversation as it was given.
        """
        if "tokens_before" not in meta or "tokens_after" not in meta:
            counter = self.sizer
            before = counter.memory_tokens(self.acc.memory)
            changed = acc is not self.acc and bool(meta.get("compacted"))
            after = counter.memory_tokens(acc.memory) if changed else before
            meta = {
                **meta,
                "tokens_before": meta.get("tokens_before", before),
                "tokens_after": meta.get("tokens_after", after),
            }
        self.boundaries.append(meta)
        self.acc = acc
        event = dict(meta)  # the core's own copy (one copy per boundary)
        if acc.model is not None and "calibration" not in event:
            event["calibration"] = self.calibration.snapshot(acc.model, self.base.name)
        return CompactionDone(event)

    def request(self, eff: CallModel) -> dict[str, Any]:
        """The client arguments for a model call (the config's server-side edits only when
        it asks for some, so a client without the argument is called as before)."""
        acc = self.acc
        kwargs: dict[str, Any] = {
            "system": acc.system_prompt,
            "messages": acc.memory.entries(),
            "tools": list(acc.tool_definitions) or None,
            "tool_choice": "none" if eff.final else "auto",
            "thinking": self.thinking,
            "max_tokens": self.max_tokens,
            "model": acc.model,
        }
        if acc.edits is not None:
            kwargs["context_management"] = acc.edits
        return kwargs

    def estimate(self) -> int:
        """Raw (uncalibrated) tokens of the request about to be sent (its priming included)."""
        return (
            self.acc.prompt_tokens + self.counter.request_tokens + self.acc.memory.tokens(self.base)
        )

    def replied(self, eff: CallModel, reply: ModelReply, estimated: int) -> Event:
        """Account for a reply (usage, calibration, client events); its core event."""
        self.usage = self.usage + reply.usage
        model = self.acc.model
        # A provider that edited or compacted the context counted less than was sent, and
        # a request after a provider compaction leaves out what it summarized: then the
        # count says nothing about how Normandy's counter sizes the conversation.
        edited = any(
            e.get("type") in ("context_management", "provider_compaction") for e in reply.events
        ) or self.acc.memory.any_marked(PROVIDER_COMPACTION_KEY)
        if model is not None and reply.usage.input_tokens > 0 and not edited:
            self.calibration.observe(model, self.base.name, estimated, reply.usage.input_tokens)
        for note in reply.events:
            self.emit({**note, "turn_id": self.turn_id})
        self.emit(
            {
                "type": "model_reply",
                "turn_id": self.turn_id,
                "final": eff.final,
                "stop_reason": reply.stop_reason,
                "usage": {
                    "input_tokens": reply.usage.input_tokens,
                    "output_tokens": reply.usage.output_tokens,
                },
                "estimated_input_tokens": estimated,
            }
        )
        return ModelReplied(reply.content, tokens=self.tokens("assistant", reply.content))

    def results(self, results: Sequence[ToolResultBlock]) -> Event:
        """The core event for a finished tool batch."""
        content = tuple(results)
        return ToolResults(content, tokens=self.tokens("user", content))

    def finish(self) -> TurnResult:
        """The result of the finished turn."""
        assert self.result is not None
        text, reason = self.result
        return TurnResult(
            text=text,
            acc=self.acc,
            turn_id=self.turn_id,
            reason=reason,
            events=self.events,
            usage=self.usage,
            budget=self.state.budget,
            state=self.state,
            boundaries=self.boundaries,
        )

    def abort(self, exc: BaseException) -> TurnAborted:
        """The error to raise when the client failed."""
        self.emit({"type": "turn_aborted", "turn_id": self.turn_id, "error": str(exc)})
        return TurnAborted(
            f"turn {self.turn_id!r} aborted: {type(exc).__name__}: {exc}", self.acc, self.events
        )

    def unknown(self, call: ToolUseBlock) -> ToolResultBlock:
        """The error result for a call of a tool the registry lacks."""
        known = ", ".join(sorted(self.tools)) or "none"
        return _error_result(call, f"unknown tool {call.name!r}; available tools: {known}")


def _failed(call: ToolUseBlock, exc: BaseException) -> ToolResultBlock:
    return _error_result(call, f"tool {call.name!r} raised {type(exc).__name__}: {exc}")


def run_turn(
    acc: AgentConfig,
    user_input: Content,
    *,
    client: ModelClient,
    tools: Mapping[str, Tool] | Sequence[Tool] | None = None,
    turn_id: str | None = None,
    max_iterations: int = 25,
    budget: int | None = None,
    thinking: int | None = None,
    max_tokens: int = 4096,
    counter: TokenCounter | str | None = None,
    calibration: Calibration | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> TurnResult:
    """Run one agent turn synchronously and return its :class:`TurnResult`.

    ``acc`` is the agent; it is never changed (configs are frozen, and the turn works on
    a copy of its memory): the agent after the turn, with the turn's messages, is the
    result's ``acc``. ``tools`` maps tool names to callables
    taking the tool input as keyword arguments (an async tool is run with
    :func:`asyncio.run`); the definitions the model sees are ``acc.tools`` (see below), and
    with ``acc.recall`` on, the ``recall`` tool's, answered by the loop itself. The calls
    of one reply run in order as one batch and their results are appended together.
    ``max_iterations`` caps the model calls with tools; ``budget`` is the optional task
    budget in tokens; ``thinking`` the extended-thinking budget asked of the client.
    ``counter`` counts for the budget and for calibration (default: the compactor's
    ``counter`` option, else the one that does not under-count for ``acc.model``, so
    the compactor sees the calibrated factor), calibrated per model with ``calibration``.
    ``on_event`` sees each event as it happens. Raises :class:`TurnAborted` when the
    model client fails.

    ``tools`` may also be a list of functions, each named by its ``__name__``. A tool
    that ``acc.tools`` does not define gets a definition derived from its signature and
    docstring (:func:`~normandy_core.turn.tool_definition`), sent with the others and
    kept in the result's ``acc``; when ``acc.tools`` defines other tools, each such tool
    is also named in an :class:`~normandy_core.turn.UndeclaredToolWarning`. Raises
    :class:`~normandy_core.turn.ToolDefinitionError` (naming the tool and parameter)
    when a definition cannot be derived.
    """
    table = tool_map(tools)
    acc = declare_tools(acc, table, entry="normandy_core.turn.run_turn()", stacklevel=2)
    _check_edits(client, acc, "normandy_core.turn.run_turn()")
    run = _Runner(
        acc,
        tools=table,
        turn_id=turn_id,
        max_iterations=max_iterations,
        budget=budget,
        thinking=thinking,
        max_tokens=max_tokens,
        counter=counter,
        calibration=calibration,
        on_event=on_event,
    )
    event: Event | None = UserInput(user_input, tokens=run.tokens("user", user_input))
    while event is not None:
        effects = run.apply(event)
        event = None
        for eff in effects:
            if isinstance(eff, MaybeCompact):
                new_acc, meta = run_compaction(
                    run.acc,
                    mid_round=eff.mid_round,
                    turn_id=run.turn_id,
                    calibration=run.calibration,
                )
                event = run.compacted(new_acc, meta)
            elif isinstance(eff, CallModel):
                estimated = run.estimate()
                try:
                    reply = client.complete(**run.request(eff))
                except Exception as exc:
                    raise run.abort(exc) from exc
                event = run.replied(eff, reply, estimated)
            elif isinstance(eff, DispatchTools):
                event = run.results([_call_sync(run, c) for c in eff.calls])
    return run.finish()


def _check_edits(client: Any, acc: AgentConfig, entry: str) -> None:
    """Refuse, before the first call, a client that cannot send the config's edits."""
    if acc.edits is not None:
        from normandy_core.contract.edits import client_edits

        client_edits(client, acc.edits, entry=entry)


def _call_sync(run: _Runner, call: ToolUseBlock) -> ToolResultBlock:
    fn = run.tools.get(call.name)
    if fn is None:
        return run.unknown(call)
    try:
        out = fn(**call.input)
        if not isinstance(out, str) and inspect.isawaitable(out):
            out = asyncio.run(_await(out))
    except Exception as exc:
        return _failed(call, exc)
    return tool_result(call, out)


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


async def _call_async(run: _Runner, call: ToolUseBlock) -> ToolResultBlock:
    fn = run.tools.get(call.name)
    if fn is None:
        return run.unknown(call)
    try:
        if inspect.iscoroutinefunction(fn):
            out = await fn(**call.input)
        else:
            out = await asyncio.to_thread(fn, **call.input)
            if inspect.isawaitable(out):
                out = await out
    except Exception as exc:
        return _failed(call, exc)
    return tool_result(call, out)


async def arun_turn(
    acc: AgentConfig,
    user_input: Content,
    *,
    client: Any,
    tools: Mapping[str, Tool] | Sequence[Tool] | None = None,
    turn_id: str | None = None,
    max_iterations: int = 25,
    budget: int | None = None,
    thinking: int | None = None,
    max_tokens: int = 4096,
    counter: TokenCounter | str | None = None,
    calibration: Calibration | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> TurnResult:
    """Run one agent turn on the event loop; the arguments are those of :func:`run_turn`.

    ``client`` is an :class:`~normandy_core.clients.AsyncModelClient` (awaited) or a
    :class:`~normandy_core.clients.ModelClient` (run in a worker thread). Compaction runs
    in a worker thread (:func:`asyncio.to_thread`), so a slow compactor never blocks the
    loop; a coroutine the compactor needs (an async client's model summary) runs on this
    loop (:func:`normandy_core.contract.eventloop.turn_loop`). The calls of one reply run
    concurrently as one batch (async tools awaited, sync tools in threads) and their
    results are appended together in tool-use order.
    """
    table = tool_map(tools)
    acc = declare_tools(acc, table, entry="normandy_core.turn.arun_turn()", stacklevel=2)
    _check_edits(client, acc, "normandy_core.turn.arun_turn()")
    run = _Runner(
        acc,
        tools=table,
        turn_id=turn_id,
        max_iterations=max_iterations,
        budget=budget,
        thinking=thinking,
        max_tokens=max_tokens,
        counter=counter,
        calibration=calibration,
        on_event=on_event,
    )
    event: Event | None = UserInput(user_input, tokens=run.tokens("user", user_input))
    while event is not None:
        effects = run.apply(event)
        event = None
        for eff in effects:
            if isinstance(eff, MaybeCompact):
                # the worker thread sees this loop as its turn_loop(): an async model summary
                # runs here, where the client's connections live, not on a loop of its own
                with bind_turn_loop(asyncio.get_running_loop()):
                    new_acc, meta = await asyncio.to_thread(
                        functools.partial(
                            run_compaction,
                            run.acc,
                            mid_round=eff.mid_round,
                            turn_id=run.turn_id,
                            calibration=run.calibration,
                        )
                    )
                event = run.compacted(new_acc, meta)
            elif isinstance(eff, CallModel):
                estimated = run.estimate()
                try:
                    if hasattr(client, "acomplete"):
                        reply = await client.acomplete(**run.request(eff))
                    else:
                        call = functools.partial(client.complete, **run.request(eff))
                        reply = await asyncio.to_thread(call)
                except Exception as exc:
                    raise run.abort(exc) from exc
                event = run.replied(eff, reply, estimated)
            elif isinstance(eff, DispatchTools):
                results = await asyncio.gather(*(_call_async(run, c) for c in eff.calls))
                event = run.results(results)
    return run.finish()
