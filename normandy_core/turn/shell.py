"""The shells that run a turn: :func:`run_turn` (sync) and :func:`arun_turn` (async).

Both run the turn's one effect driver (:class:`~normandy_core.turn.driver.TurnRun`) and
differ only in how they answer the effects it yields: the boundary, the model client and
the tools. Every boundary is resolved through the core's one boundary function,
:func:`normandy_core.run_compaction` (``mid_round=False`` at the start of the turn,
``True`` after each tool batch). The async shell runs compaction and synchronous tools
in worker threads, so it never blocks the event loop. A tool that raises, or is
unknown, answers with an error tool result (``is_error=True``): a tool use is never left
without its result.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from normandy_core.clients.base import ModelClient
from normandy_core.clients.exchange import adrive, drive
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.conversation.calibration import Calibration
from normandy_core.conversation.entries import Content, ToolResultBlock, ToolUseBlock
from normandy_core.conversation.tokens import TokenCounter
from normandy_core.turn.core import CallModel, MaybeCompact
from normandy_core.turn.driver import TurnIO, TurnRun
from normandy_core.turn.result import TurnResult
from normandy_core.turn.tools import (
    Tool,
    failed_tool_result,
    tool_result,
    unknown_tool_result,
)

__all__ = ["arun_turn", "run_turn"]


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
    recover_overflow: bool = True,
) -> TurnResult:
    """Run one agent turn synchronously and return its :class:`TurnResult`.

    ``acc`` is the agent; it is never changed (configs are frozen, and the turn works on
    a copy of its memory): the agent after the turn, with the turn's messages, is the
    result's ``acc``. ``tools`` maps tool names to callables
    taking the tool input as keyword arguments (an async tool is run with
    :func:`asyncio.run`); the definitions the model sees are ``acc.tools`` (see below), and
    with ``acc.recall`` on, the ``recall`` tool's, and with ``acc.compact_tool`` on, the
    ``compact_context`` tool's (an accepted call makes the boundary after its batch
    forced, :mod:`normandy_core.turn.compact_tool`), answered by the loop itself. The calls
    of one reply run in order as one batch and their results are appended together.
    ``max_iterations`` caps the model calls with tools; ``budget`` is the optional task
    budget in tokens; ``thinking`` the extended-thinking budget asked of the client.
    ``counter`` counts for the budget and for calibration (default: the compactor's
    ``counter`` option, else the one that does not under-count for ``acc.model``, so
    the compactor sees the calibrated factor), calibrated per model with ``calibration``.
    ``on_event`` sees each event as it happens. Raises :class:`TurnAborted` when the
    model client fails.

    With ``recover_overflow`` (the default), a call the provider refuses as too long
    (:class:`~normandy_core.clients.ContextOverflow`) is recovered from once: the
    calibration learns the provider's count, an overflow boundary (``trigger=
    "overflow"``, the ``mid_round`` of the boundary it follows) compacts below the
    refused request by the overshoot and a margin, and the call is made again; a second
    refusal, or an overflow boundary that compacts nothing, raises :class:`TurnAborted`
    giving the provider's figures and Normandy's counts. Each refusal is reported as a
    ``context_overflow`` event.

    ``tools`` may also be a list of functions, each named by its ``__name__``. A tool
    that ``acc.tools`` does not define gets a definition derived from its signature and
    docstring (:func:`~normandy_core.turn.tool_definition`), sent with the others and
    kept in the result's ``acc``; when ``acc.tools`` defines other tools, each such tool
    is also named in an :class:`~normandy_core.turn.UndeclaredToolWarning`. Raises
    :class:`~normandy_core.turn.ToolDefinitionError` (naming the tool and parameter)
    when a definition cannot be derived.
    """
    run = TurnRun(
        acc,
        client=client,
        tools=tools,
        entry="normandy_core.turn.run_turn()",
        turn_id=turn_id,
        max_iterations=max_iterations,
        budget=budget,
        thinking=thinking,
        max_tokens=max_tokens,
        counter=counter,
        calibration=calibration,
        on_event=on_event,
        recover_overflow=recover_overflow,
    )
    return drive(run.steps(user_input), functools.partial(_answer, client, run))


def _answer(client: ModelClient, run: TurnRun, effect: TurnIO) -> Any:
    """Answer one effect of a turn, blocking."""
    if isinstance(effect, MaybeCompact):
        return run.compact(effect)
    if isinstance(effect, CallModel):
        return client.complete(**run.request(effect))
    return [_call_tool(run.tools, call) for call in effect.calls]


def _call_tool(tools: Mapping[str, Tool], call: ToolUseBlock) -> ToolResultBlock:
    """Run one tool call; an async tool runs on an event loop of its own."""
    fn = tools.get(call.name)
    if fn is None:
        return unknown_tool_result(call, tools)
    try:
        out = fn(**call.input)
        if not isinstance(out, str) and inspect.isawaitable(out):
            out = asyncio.run(_await(out))
    except Exception as exc:
        return failed_tool_result(call, exc)
    return tool_result(call, out)


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


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
    recover_overflow: bool = True,
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
    run = TurnRun(
        acc,
        client=client,
        tools=tools,
        entry="normandy_core.turn.arun_turn()",
        turn_id=turn_id,
        max_iterations=max_iterations,
        budget=budget,
        thinking=thinking,
        max_tokens=max_tokens,
        counter=counter,
        calibration=calibration,
        on_event=on_event,
        recover_overflow=recover_overflow,
    )
    return await adrive(run.steps(user_input), functools.partial(_aanswer, client, run))


async def _aanswer(client: Any, run: TurnRun, effect: TurnIO) -> Any:
    """Answer one effect of a turn on the event loop."""
    if isinstance(effect, MaybeCompact):
        # the worker thread sees this loop as its turn_loop(): an async model summary
        # runs here, where the client's connections live, not on a loop of its own
        with bind_turn_loop(asyncio.get_running_loop()):
            return await asyncio.to_thread(run.compact, effect)
    if isinstance(effect, CallModel):
        if hasattr(client, "acomplete"):
            return await client.acomplete(**run.request(effect))
        return await asyncio.to_thread(functools.partial(client.complete, **run.request(effect)))
    return await asyncio.gather(*(_acall_tool(run.tools, call) for call in effect.calls))


async def _acall_tool(tools: Mapping[str, Tool], call: ToolUseBlock) -> ToolResultBlock:
    """Run one tool call: an async tool awaited, a sync one in a worker thread."""
    fn = tools.get(call.name)
    if fn is None:
        return unknown_tool_result(call, tools)
    try:
        if inspect.iscoroutinefunction(fn):
            out = await fn(**call.input)
        else:
            out = await asyncio.to_thread(fn, **call.input)
            if inspect.isawaitable(out):
                out = await out
    except Exception as exc:
        return failed_tool_result(call, exc)
    return tool_result(call, out)
