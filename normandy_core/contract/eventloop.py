"""The event loop of the async turn shell, for a compactor that must await the agent's client.

:func:`~normandy_core.turn.arun_turn` resolves each boundary in a worker thread, so a slow
compactor never blocks its event loop. A compactor that needs the agent's asynchronous
model client there (the ``summarize`` strategy's model summary) must not start a second
event loop in that thread (``asyncio.run``): a client built on a shared connection pool
(one ``httpx.AsyncClient`` for the application) is bound to the turn's loop and fails on
any other. It runs the coroutine on :func:`turn_loop` instead::

    loop = turn_loop()
    if loop is not None:
        reply = asyncio.run_coroutine_threadsafe(client.acomplete(...), loop).result(timeout)

The loop travels in a :mod:`contextvars` variable, which :func:`asyncio.to_thread` copies
into the worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["bind_turn_loop", "turn_loop"]

_LOOP: ContextVar[asyncio.AbstractEventLoop | None] = ContextVar("normandy_turn_loop", default=None)


def turn_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of the ``arun_turn`` whose boundary this thread resolves.

    ``None`` outside one (``run_turn``, ``compact()``, a direct ``run_compaction``), when
    that loop no longer runs, or when called on the loop's own thread (it could not wait
    for itself there).
    """
    loop = _LOOP.get()
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    return None if running is loop else loop


@contextmanager
def bind_turn_loop(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Make ``loop`` the :func:`turn_loop` of this context (and of threads that copy it)."""
    token = _LOOP.set(loop)
    try:
        yield
    finally:
        _LOOP.reset(token)
