"""``NormandyMiddleware``: a LangChain v1 agent middleware that compacts the agent's state.

Installed with one line, ``create_agent(model, tools, middleware=[NormandyMiddleware(
"window_manager", window=32_000)])``, it runs before every model call (``before_model``
and ``abefore_model``): the state's messages are compacted by the named compactor and,
when it compacted, the state is replaced as LangGraph's ``add_messages`` reducer
documents (``RemoveMessage(id=REMOVE_ALL_MESSAGES)`` followed by the new list, as
LangChain's own ``SummarizationMiddleware`` does). Kept messages are the state's own
objects, ids and metadata unchanged; dropped ones reach the ``after_compact`` hooks.

Around every model call (``wrap_model_call``, ``awrap_model_call``) it recovers from the
provider's refusal of the request as too long, once per call: the provider SDK's error
(or LangChain's ``ContextOverflowError``) is read as a
:class:`~normandy_core.clients.ContextOverflow`, the messages are compacted below the
refused request by the overshoot and a margin, the call is made again with them, and
the state takes the compacted messages; a second refusal raises a ``ContextOverflow``
giving both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import (
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.callbacks.manager import adispatch_custom_event, dispatch_custom_event
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import AIMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.runtime import Runtime
from langgraph.types import Command

from normandy_core.clients import ContextOverflow, context_overflow
from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.transcripts.adapter import AdapterSeam
from normandy_langchain.compaction import LangChainCompaction, MessageCompactor

__all__ = ["EVENT", "MIDDLEWARE_ENTRY", "NormandyMiddleware"]

logger = logging.getLogger("normandy_langchain")

#: The entry point named in the option errors of :class:`NormandyMiddleware`.
MIDDLEWARE_ENTRY = "normandy_langchain.NormandyMiddleware()"
#: Name of the LangChain custom event sent after each compaction (``on_custom_event``
#: of a callback handler, ``astream_events``), with the compaction's figures as data.
EVENT = "normandy_compaction"


#: What a wrapped model call returns.
Reply = ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]


def overflow_of(exc: BaseException) -> ContextOverflow | None:
    """``exc`` as a :class:`~normandy_core.clients.ContextOverflow` when it is a too-long
    refusal: a provider SDK's (read as Normandy's clients read it), or LangChain's own
    ``ContextOverflowError`` (an integration that raises it without the SDK's error:
    then without figures); else ``None``."""
    found = context_overflow(exc)
    if found is None and isinstance(exc, ContextOverflowError):
        found = ContextOverflow(str(exc), provider="langchain", status=0, code=type(exc).__name__)
    return found


def refused_again(first: ContextOverflow, second: ContextOverflow) -> ContextOverflow:
    """The error of a call refused as too long again after the recovery compacted it."""
    return ContextOverflow(
        f"{second.provider}: the request was refused as too long again after compacting: "
        f"{first.figures}, then {second.figures}",
        provider=second.provider,
        status=second.status,
        code=second.code,
        size=second.size,
        limit=second.limit,
    )


def event_data(done: LangChainCompaction) -> dict[str, Any]:
    """The JSON-ready figures of a compaction, as the custom event carries them."""
    figures = done.result.figures()
    notes = figures.pop("notes")  # last, as the events have always listed them
    return {
        **figures,
        "removed_message_ids": [m.id for m in done.removed],
        "messages_after": len(done.messages),
        "notes": notes,
    }


class NormandyMiddleware(
    AdapterSeam[LangChainCompaction], AgentMiddleware[AgentState[Any], Any, Any]
):
    """Compact the agent's messages before every model call with a named compactor.

    ``compactor`` is the entry-point name (``window_manager`` when neither given nor
    configured), ``opts`` its options: both validated here, when the middleware is
    built, so a bad option raises :class:`~normandy_core.OptionsError` naming
    ``normandy_langchain.NormandyMiddleware()`` and the compactor. ``window`` pins the
    context window in tokens (or ``model`` names a model the catalog knows);
    ``timeout`` bounds the compactor's time. ``on_compact`` is called with the
    :class:`~normandy_langchain.LangChainCompaction` of each compaction. Each
    compaction is also logged (logger ``normandy_langchain``, INFO) and sent as the
    LangChain custom event :data:`EVENT`. A compactor error (the conversation cannot
    fit) leaves the state unchanged and is logged as a warning; with
    ``raise_on_error=True`` it raises :class:`~normandy_core.CannotFitError` instead.
    """

    compactor_class = MessageCompactor
    entry = MIDDLEWARE_ENTRY
    compactor: MessageCompactor

    @property
    def name(self) -> str:
        """The middleware's node name in the agent's graph."""
        return f"NormandyMiddleware[{self.compactor.compactor}]"

    def _compact(self, state: AgentState[Any]) -> LangChainCompaction:
        return self._checked(self.compactor.run(state["messages"]))

    def _update(self, done: LangChainCompaction) -> dict[str, Any] | None:
        if not self._reported(done).compacted:
            return None
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *done.messages]}

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Compact the state's messages; the state update, or ``None`` when unchanged."""
        done = self._compact(state)
        if done.compacted:
            with contextlib.suppress(RuntimeError):  # not inside a run (called directly)
                dispatch_custom_event(EVENT, event_data(done))
        return self._update(done)

    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """:meth:`before_model` for async agents: the compactor runs in a worker thread,
        so the event loop keeps serving while it counts, summarizes or archives."""
        with bind_turn_loop(asyncio.get_running_loop()):
            done = await asyncio.to_thread(self._compact, state)
        if done.compacted:
            with contextlib.suppress(RuntimeError):
                await adispatch_custom_event(EVENT, event_data(done))
        return self._update(done)

    def _recovery(self, request: ModelRequest[Any], overflow: ContextOverflow) -> Any:
        """The request again with its messages compacted below the refused one by the
        overshoot and a margin (:meth:`ContextOverflow.target`), or ``None`` when the
        compactor cannot compact it further."""
        counted = self.compactor.run(request.messages).result.tokens_before
        deeper = self.compactor.narrowed(overflow.target(counted))
        if deeper is self.compactor:
            return None
        done = self._reported(deeper.run(request.messages))
        if not done.compacted:
            return None
        logger.info("%s recovered from a too-long refusal (%s)", self.entry, overflow.figures)
        return done

    @staticmethod
    def _with_state(reply: Reply, done: LangChainCompaction) -> Reply:
        """``reply``, with the compacted messages put in the state before it."""
        response = reply.model_response if isinstance(reply, ExtendedModelResponse) else reply
        if isinstance(response, AIMessage):
            response = ModelResponse(result=[response])
        messages = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *done.messages, *response.result]
        return ExtendedModelResponse(response, Command(update={"messages": messages}))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> Reply:
        """Call the model; recover once from its refusal of the request as too long."""
        try:
            return handler(request)
        except Exception as exc:
            overflow = overflow_of(exc)
            done = None if overflow is None else self._recovery(request, overflow)
            if overflow is None or done is None:
                raise
        try:
            reply = handler(request.override(messages=done.messages))
        except Exception as again:
            second = overflow_of(again)
            if second is None:
                raise
            raise refused_again(overflow, second) from again
        return self._with_state(reply, done)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> Reply:
        """:meth:`wrap_model_call` for async agents (compaction in a worker thread)."""
        try:
            return await handler(request)
        except Exception as exc:
            overflow = overflow_of(exc)
            if overflow is None:
                raise
            with bind_turn_loop(asyncio.get_running_loop()):
                done = await asyncio.to_thread(self._recovery, request, overflow)
            if done is None:
                raise
        try:
            reply = await handler(request.override(messages=done.messages))
        except Exception as again:
            second = overflow_of(again)
            if second is None:
                raise
            raise refused_again(overflow, second) from again
        return self._with_state(reply, done)
