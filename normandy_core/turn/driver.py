"""The turn's one effect driver, shared by the sync and the async shell.

:class:`TurnRun` holds a turn in progress (the running ``acc``, events, usage, counting)
and runs the pure core (:mod:`.core`): :meth:`TurnRun.steps` applies the effects that
need no I/O itself and yields the ones that do, an exchange
(:mod:`normandy_core.clients.exchange`) that each shell answers in its own way:

- :class:`~.core.MaybeCompact`: resolve the boundary, :meth:`TurnRun.compact` (blocking);
- :class:`~.core.CallModel`: call the model client with :meth:`TurnRun.request`;
- :class:`~.core.DispatchTools`: run its calls with :attr:`TurnRun.tools` as one batch,
  their results in call order.

A model call that fails is raised in :meth:`TurnRun.steps`, which turns it into
:class:`~normandy_core.turn.TurnAborted`; anything else a request raises goes up as it is.
A :class:`~normandy_core.clients.ContextOverflow` (the provider refused the request as
too long) is recovered from once per call (:meth:`TurnRun.overflowed`): calibrated from
the provider's figure, compacted at an overflow boundary, called again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from normandy_core.clients.base import (
    ContextOverflow,
    ModelReply,
    Usage,
    holds_provider_compaction,
)
from normandy_core.contract.boundary import run_compaction
from normandy_core.contract.check import CompactionResult
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.recall import recall_tools
from normandy_core.conversation.calibration import (
    CalibratedCounter,
    Calibration,
    default_calibration,
)
from normandy_core.conversation.entries import (
    Content,
    Entry,
    Role,
    ToolResultBlock,
    new_id,
)
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.conversation.tokens import TokenCounter, get_counter
from normandy_core.turn.compact_tool import CompactLimits, compact_tool
from normandy_core.turn.core import (
    AppendMessage,
    CallModel,
    CompactionDone,
    ContextOverflowed,
    DispatchTools,
    Emit,
    Event,
    Fail,
    Finish,
    FinishReason,
    MaybeCompact,
    ModelReplied,
    ToolResults,
    UserInput,
    start,
    step,
)
from normandy_core.turn.result import TurnAborted, TurnResult
from normandy_core.turn.tools import Tool, declare_tools, tool_map

__all__ = ["TurnIO", "TurnRun", "client_endpoint"]
#: What the overflow boundary's config is made by, in its errors.
_OVERFLOW_ENTRY = "normandy_core.turn (overflow recovery)"


#: The effects of the core a shell answers (the others need no I/O).
TurnIO = MaybeCompact | CallModel | DispatchTools


def client_endpoint(client: Any) -> str:
    """What identifies ``client``'s provider for calibration: its ``endpoint`` (the SDK
    clients': provider and base URL), else its class (``module.QualName``)."""
    endpoint = getattr(client, "endpoint", None)
    if isinstance(endpoint, str) and endpoint:
        return endpoint
    kind = type(client)
    return f"{kind.__module__}.{kind.__qualname__}"


def _check_edits(client: Any, acc: AgentConfig, entry: str) -> None:
    """Refuse, before the first call, a client that cannot send the config's edits."""
    if acc.edits is not None:
        from normandy_core.contract.edits import client_edits

        client_edits(client, acc.edits, entry=entry)


class TurnRun:
    """A turn in progress: the running acc, events, usage and counting.

    Made by a shell (named by ``entry``) with that shell's arguments; :meth:`steps` is
    the turn itself.
    """

    def __init__(
        self,
        acc: AgentConfig,
        *,
        client: Any,
        tools: Mapping[str, Tool] | Sequence[Tool] | None,
        entry: str,
        turn_id: str | None,
        max_iterations: int,
        budget: int | None,
        thinking: int | None,
        max_tokens: int,
        counter: TokenCounter | str | None,
        calibration: Calibration | None,
        on_event: Callable[[dict[str, Any]], None] | None,
        recover_overflow: bool = True,
    ) -> None:
        table = tool_map(tools)
        # stacklevel 3: a warning points at the code that called the shell
        acc = declare_tools(acc, table, entry=entry, stacklevel=3)
        _check_edits(client, acc, entry)
        # The turn runs on a config of its own: the caller's config and memory are never
        # changed (the memory is copied; its entries are frozen and shared).
        self.acc = acc.with_memory(acc.memory.copy())
        self.tools = dict(table)
        self.turn_id = turn_id or new_id()
        self.state = start(self.turn_id, max_iterations=max_iterations, budget=budget)
        self.thinking = thinking
        self.max_tokens = max_tokens
        # Evidence is kept per client endpoint: what one provider reports never scales
        # another's counts. A calibration already bound to an endpoint is kept as given.
        given = calibration or acc.calibration or default_calibration()
        self.calibration = (
            given if given.endpoint is not None else given.for_endpoint(client_endpoint(client))
        )
        if counter is None:
            # The compactor's own prepared counter, so a message is counted once, through
            # the memory's cache, for the budget, calibration and the compactor alike.
            self.counter = acc.prepared.counter_for(acc.model, self.calibration)
        else:
            self.counter = CalibratedCounter(get_counter(counter), acc.model, self.calibration)
        # The compactor's counter for this turn (ctx.counter): what a boundary that reports
        # no token figures is sized with. Every acc of the turn shares the prepared one.
        self.sizer = acc.prepared.counter_for(acc.model, self.calibration)
        self.compact_limits = self._add_loop_tools(acc)
        self.budgeted = budget is not None
        self.recover_overflow = recover_overflow
        # The too-long refusals of the current call, each with the count it was sent at.
        self.refusals: list[tuple[ContextOverflow, int]] = []
        self._pending: tuple[Content, str] | None = None
        self.on_event = on_event
        self.events: list[dict[str, Any]] = []
        self.boundaries: list[Mapping[str, Any]] = []
        self.usage = Usage()
        self.result: tuple[str, FinishReason] | None = None

    def _add_loop_tools(self, acc: AgentConfig) -> CompactLimits | None:
        """Add the tools the loop answers itself (a tool the caller gives under the same
        name wins): the recall tool (``AgentConfig(recall=...)``) and the
        ``compact_context`` tool (``AgentConfig(compact_tool=...)``); the latter's limits
        for this turn, ``None`` when it is off."""
        for name, fn in recall_tools(acc, self.counter, lambda: self.acc.memory).items():
            self.tools.setdefault(name, fn)
        settings = acc.compact_tool_settings
        if settings is None:
            return None
        limits = CompactLimits(settings.min_calls_between)
        self.tools.setdefault(settings.tool_name, compact_tool(settings, limits))
        return limits

    def steps(self, user_input: Content) -> Generator[TurnIO, Any, TurnResult]:
        """The turn, from the user's message to its :class:`TurnResult`, as an exchange.

        Steps the core and runs its effects in order: those that need no I/O here, and
        each one a shell answers (a boundary's ``(acc, meta)``, a model call's
        :class:`~normandy_core.clients.ModelReply`, a tool batch's results) yielded, its
        answer fed back to the core.
        """
        event: Event | None = UserInput(user_input, tokens=self.tokens("user", user_input))
        while event is not None:
            self.state, effects = step(self.state, event)
            event = None
            for effect in effects:
                if isinstance(effect, AppendMessage):
                    self.append(effect)
                elif isinstance(effect, Emit):
                    self.emit(effect.event)
                elif isinstance(effect, MaybeCompact):
                    new_acc, meta = yield effect
                    event = self.compacted(new_acc, meta)
                elif isinstance(effect, CallModel):
                    event = yield from self.call(effect)
                elif isinstance(effect, DispatchTools):
                    event = self.results((yield effect), effect)
                elif isinstance(effect, Finish):
                    self.result = (effect.text, effect.reason)
                elif isinstance(effect, Fail):
                    raise self.overflow_failed(effect)
        return self.finish()

    def call(self, effect: CallModel) -> Generator[TurnIO, Any, Event]:
        """One model call: the core event for its reply, or for its refusal as too long."""
        estimated = self.estimate()
        try:
            reply = yield effect
        except ContextOverflow as exc:
            if not self.recover_overflow:
                raise self.abort(exc) from exc
            return self.overflowed(exc, estimated)
        except Exception as exc:
            raise self.abort(exc) from exc
        self.refusals.clear()
        return self.replied(effect, reply, estimated)

    def compact(self, effect: MaybeCompact) -> Any:
        """Resolve the boundary ``effect`` asks for (blocking): ``(acc, meta)`` from
        :func:`run_compaction` on the running acc (an overflow boundary's with its window
        pinned for ``effect.target``, :meth:`AgentConfig.narrowed`; its compacted memory put
        back in the running acc; a forced one, the model's ``compact_context`` call, with
        ``force`` and its focus)."""
        acc = self.acc
        if effect.target is not None:
            acc = acc.narrowed(effect.target, entry=_OVERFLOW_ENTRY)
        forced = effect.trigger == "forced"
        result = run_compaction(
            acc,
            mid_round=effect.mid_round,
            turn_id=self.turn_id,
            calibration=self.calibration,
            thinking=self.thinking is not None,
            trigger=effect.trigger,
            force=forced,
            focus=effect.focus if forced else None,
        )
        if acc is self.acc:
            return result
        kept = self.acc.with_memory(result.acc.memory) if result.meta.compacted else self.acc
        return CompactionResult(kept, result.meta)

    def overflowed(self, exc: ContextOverflow, estimated: int) -> Event:
        """A call refused as too long: calibrate from the provider's figure (bounded, as
        every observation), and the target of the overflow boundary: the request's
        calibrated count less the overshoot and a margin (:meth:`ContextOverflow.target`)."""
        model = self.acc.model
        before = self.counter.factor
        if model is not None and exc.size:
            self.calibration.observe(model, self.base.name, estimated, exc.size)
        counted = math.ceil(estimated * self.counter.factor)
        self.refusals.append((exc, counted))
        target = exc.target(counted)
        info = {
            **exc.as_dict(),
            "estimated_input_tokens": estimated,
            "counted": counted,
            "target": target,
            "factor_before": before,
            "factor_after": self.counter.factor,
        }
        return ContextOverflowed(info, target)

    # -- the effects that need no I/O ---------------------------------------------

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

    def append(self, effect: AppendMessage) -> None:
        """Append a message of the turn, under the id it was counted with (if it was)."""
        pending, self._pending = self._pending, None
        same = pending is not None and (
            pending[0] is effect.content or pending[0] == effect.content
        )
        entry_id = pending[1] if same and pending is not None else None
        if effect.role == "assistant" and holds_provider_compaction(effect.content):
            self.append_compaction(effect.content, entry_id)
        else:
            self.acc.memory.add_message(
                effect.role, effect.content, id=entry_id, turn_id=self.turn_id
            )

    def append_compaction(self, content: Content, entry_id: str | None) -> None:
        """Append a reply holding a provider's compaction as a pinned entry.

        The provider summarized everything before it, and its clients send nothing
        before it again, so no compactor may drop it; an earlier provider compaction
        it supersedes is unpinned (a compactor may then drop it, reporting it).
        """
        memory = self.acc.memory
        entries = memory.entries()
        if any(entry.pinned and entry.metadata.get(PROVIDER_COMPACTION_KEY) for entry in entries):
            unpinned = [
                entry.model_copy(update={"pinned": False})
                if entry.pinned and entry.metadata.get(PROVIDER_COMPACTION_KEY)
                else entry
                for entry in entries
            ]
            memory = memory.derive(unpinned)
            self.acc = self.acc.with_memory(memory)
        memory.add_message(
            "assistant",
            content,
            id=entry_id,
            turn_id=self.turn_id,
            pinned=True,
            metadata={PROVIDER_COMPACTION_KEY: True},
        )

    # -- what the answers to the requests become ----------------------------------

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

    def request(self, call: CallModel) -> dict[str, Any]:
        """The client arguments for a model call (the config's server-side edits only when
        it asks for some, so a client without the argument is called as before)."""
        acc = self.acc
        kwargs: dict[str, Any] = {
            "system": acc.system_prompt,
            "messages": acc.memory.entries(),
            "tools": list(acc.tool_definitions) or None,
            "tool_choice": "none" if call.final else "auto",
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

    def replied(self, call: CallModel, reply: ModelReply, estimated: int) -> Event:
        """Account for a reply (usage, calibration, client events); its core event."""
        self.usage = self.usage + reply.usage
        model = self.acc.model
        # A provider that edited or compacted the context counted less than was sent, and
        # a request after a provider compaction leaves out what it summarized: then the
        # count says nothing about how Normandy's counter sizes the conversation.
        edited = any(
            note.get("type") in ("context_management", "provider_compaction")
            for note in reply.events
        ) or self.acc.memory.any_marked(PROVIDER_COMPACTION_KEY)
        if model is not None and reply.usage.input_tokens > 0 and not edited:
            self.calibration.observe(model, self.base.name, estimated, reply.usage.input_tokens)
        if self.compact_limits is not None:
            self.compact_limits.model_called()
        for note in reply.events:
            self.emit({**note, "turn_id": self.turn_id})
        self.emit(
            {
                "type": "model_reply",
                "turn_id": self.turn_id,
                "final": call.final,
                "stop_reason": reply.stop_reason,
                "usage": {
                    "input_tokens": reply.usage.input_tokens,
                    "output_tokens": reply.usage.output_tokens,
                },
                "estimated_input_tokens": estimated,
            }
        )
        return ModelReplied(reply.content, tokens=self.tokens("assistant", reply.content))

    def results(self, results: Sequence[ToolResultBlock], batch: DispatchTools) -> Event:
        """The core event for a finished tool batch (asking for a forced boundary when the
        ``compact_context`` tool accepted a call of it; each of its answers reported in a
        ``compact_tool`` event)."""
        content = tuple(results)
        tokens = self.tokens("user", content)
        limits = self.compact_limits
        if limits is None:
            return ToolResults(content, tokens=tokens)
        settings = self.acc.compact_tool_settings
        name = None if settings is None else settings.tool_name
        if any(call.name != name for call in batch.calls):
            limits.content_arrived()
        for answer in limits.answers:
            self.emit({"type": "compact_tool", "turn_id": self.turn_id, **answer})
        limits.answers.clear()
        asked, focus = limits.take()
        return ToolResults(content, tokens=tokens, compact=asked, focus=focus)

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

    def overflow_failed(self, fail: Fail) -> TurnAborted:
        """The error that ends a turn whose too-long refusal the one recovery did not
        help; it gives the provider's figures of each refusal and Normandy's counts."""
        last = self.refusals[-1][0]
        tried = " then ".join(f"{exc.figures} (Normandy counted {n:,})" for exc, n in self.refusals)
        error = TurnAborted(
            f"turn {self.turn_id!r} aborted: {last.provider} refused the request as too long "
            f"for the model's context window, and {fail.why}: {tried}",
            self.acc,
            self.events,
        )
        error.__cause__ = last
        self.emit({"type": "turn_aborted", "turn_id": self.turn_id, "error": str(error)})
        return error

    def abort(self, exc: BaseException) -> TurnAborted:
        """The error to raise when the client failed."""
        self.emit({"type": "turn_aborted", "turn_id": self.turn_id, "error": str(exc)})
        return TurnAborted(
            f"turn {self.turn_id!r} aborted: {type(exc).__name__}: {exc}", self.acc, self.events
        )
