"""Exchanges: code that is written once and run either blocking or on an event loop.

An exchange is a generator that yields each piece of I/O it needs (a request) and is
resumed with its answer; it returns its result. :func:`drive` answers the requests by
calling a function, :func:`adrive` by awaiting one: the model clients and the turn loop
write their logic once as an exchange, and their sync and async forms differ only in
how the I/O is done. A request that fails is raised inside the exchange, at the
``yield`` that asked for it, as if the exchange had made the call itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

__all__ = ["Exchange", "adrive", "drive"]

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


class Exchange(Generic[RequestT, ResultT]):
    """A running exchange: the request it waits on, or its result once it is done."""

    __slots__ = ("_steps", "done", "request", "result")

    def __init__(self, steps: Generator[RequestT, Any, ResultT]) -> None:
        self._steps = steps
        self.done = False
        self.request: RequestT
        self.result: ResultT
        self._resume(steps.send, None)

    def answer(self, value: Any) -> None:
        """Resume the exchange with the answer to its request."""
        self._resume(self._steps.send, value)

    def fail(self, error: BaseException) -> None:
        """Resume the exchange by raising ``error`` where it asked for its request."""
        self._resume(self._steps.throw, error)

    def _resume(self, how: Callable[[Any], RequestT], value: Any) -> None:
        try:
            self.request = how(value)
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
            exchange.fail(error)
        else:
            exchange.answer(answer)
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
            exchange.fail(error)
        else:
            exchange.answer(answer)
    return exchange.result
