"""Exchanges: code that is written once and run either blocking or on an event loop.

An exchange is a generator that yields each piece of I/O it needs (a request) and is
resumed with its answer; it returns its result. :func:`drive` answers the requests by
calling a function, :func:`adrive` by awaiting one: the model clients and the turn loop
write their logic once as an exchange, and their sync and async forms differ only in
how the I/O is done. A request that fails is raised inside the exchange, at the
``yield`` that asked for it, as if the exchange had made the call itself (whatever it
does not catch, ``KeyboardInterrupt`` and cancellation included, goes up unchanged).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

__all__ = ["Exchange", "adrive", "drive"]

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


class Exchange(Generic[RequestT, ResultT]):
    """A running exchange: the request it waits on, or its result once it is ``done``."""

    __slots__ = ("_send", "_throw", "done", "request", "result")

    def __init__(self, steps: Generator[RequestT, Any, ResultT]) -> None:
        self._send = steps.send
        self._throw = steps.throw
        self.done = False
        self.request: RequestT
        self.result: ResultT
        self.resume(None)

    def resume(self, answer: Any, error: BaseException | None = None) -> None:
        """Resume the exchange with the answer to its request, or, given an ``error``, by
        raising it where the exchange asked for the request."""
        try:
            self.request = self._send(answer) if error is None else self._throw(error)
        except StopIteration as finished:
            self.done = True
            self.result = finished.value


def drive(steps: Generator[RequestT, Any, ResultT], resolve: Callable[[RequestT], Any]) -> ResultT:
    """Run the exchange ``steps`` to its end, answering each request with ``resolve``."""
    exchange = Exchange(steps)
    while not exchange.done:
        try:
            answer = resolve(exchange.request)
        except BaseException as error:  # raised in the exchange: it decides what escapes
            exchange.resume(None, error)
        else:
            exchange.resume(answer)
    return exchange.result


async def adrive(
    steps: Generator[RequestT, Any, ResultT], resolve: Callable[[RequestT], Awaitable[Any]]
) -> ResultT:
    """Run the exchange ``steps`` to its end, answering each request by awaiting ``resolve``."""
    exchange = Exchange(steps)
    while not exchange.done:
        try:
            answer = await resolve(exchange.request)
        except BaseException as error:  # raised in the exchange: it decides what escapes
            exchange.resume(None, error)
        else:
            exchange.resume(answer)
    return exchange.result
