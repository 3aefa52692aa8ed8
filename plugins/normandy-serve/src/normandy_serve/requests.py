"""A request body compacted in its API's own format, before the proxy forwards it.

Each of the three APIs is compacted by the core's :func:`~normandy_core.acompact` on the
request as the client sent it (Chat Completions' ``messages``, the Responses API's
``input`` and ``instructions``, Anthropic's ``messages`` and ``system``): every key the
proxy does not compact is kept as given, and a request nothing was removed from is
forwarded as the very bytes the client sent. The window is ``--window`` or the catalog's
for the request's ``model``, less what the request spends outside the conversation: its
tool definitions (counted with the model's counter) and the reply's ``max_tokens``.

A body that is not a JSON request of its API, a model without a known window, or a
compaction that fails, is forwarded unchanged and logged, never refused: the upstream
answers it as it would have without the proxy.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from normandy_archive import archive_settings
from normandy_core import (
    CompactResult,
    acompact,
    default_catalog,
    default_counter_for,
    get_counter,
)
from normandy_core.clients import ContextOverflow
from normandy_serve.options import ServeSettings

__all__ = ["API_FORMATS", "Compacted", "RequestCompactor"]

log = logging.getLogger("normandy_serve")

#: The paths whose POST body is compacted, and the format ``compact()`` reads each in.
API_FORMATS = {
    "/v1/chat/completions": "openai",
    "/v1/responses": "responses",
    "/v1/messages": "anthropic",
}
#: Where each format's request names the reply's token budget.
_REPLY_BUDGET = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True)
class Compacted:
    """What to forward: ``body`` (the client's own bytes ``given`` when nothing changed),
    and for a request that was compacted (or checked and kept), its parsed ``request``,
    the ``result`` and the ``room`` (tokens) the conversation was sized to."""

    body: bytes
    given: bytes
    request: dict[str, Any] | None = None
    result: CompactResult | None = None
    room: int = 0


class Unreadable(ValueError):
    """A body the proxy forwards unchanged: the message says why."""


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Unreadable(f"the body is not JSON ({exc})") from exc
    if not isinstance(request, dict):
        raise Unreadable(f"the body is a JSON {type(request).__name__}, not an object")
    if not isinstance(request.get("model"), str):
        raise Unreadable("the request names no model")
    return request


def _outside(request: dict[str, Any], model: str) -> int:
    """Tokens the request spends outside its conversation: its tool definitions and the
    reply's budget (the window holds both, as the providers count it)."""
    tools = request.get("tools")
    spent = 0
    if tools:
        counter = get_counter(default_counter_for(model))
        spent += counter.count_text(json.dumps(tools, ensure_ascii=False))
    budget = next((request[k] for k in _REPLY_BUDGET if isinstance(request.get(k), int)), 0)
    return spent + max(budget, 0)


@contextlib.contextmanager
def _session(session: str | None) -> Iterator[None]:
    """Dropped entries archived under ``session`` (the client's ``X-Normandy-Session``);
    without one, under the session the compaction memo keeps for the conversation."""
    if session is None:
        yield
    else:
        with archive_settings(session=session):
            yield


class RequestCompactor:
    """Compacts request bodies with the proxy's settings; one per proxy."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.catalog = default_catalog()

    def room(self, request: dict[str, Any]) -> int:
        """Tokens the request's conversation may take (raises :class:`Unreadable` when the
        window is unknown or the rest of the request fills it)."""
        model = request["model"]
        window = self.settings.window or self.catalog.window(model)
        if window is None:
            raise Unreadable(f"the catalog knows no window for model {model!r}; pass --window")
        room = window - _outside(request, model)
        if room <= 0:
            raise Unreadable(f"its tools and max_tokens fill the {window}-token window")
        return room

    async def compact(self, raw: bytes, fmt: str, session: str | None) -> Compacted:
        """``raw`` compacted as a request of format ``fmt``; unchanged (and logged) when it
        cannot be read or compacted."""
        try:
            request = _parse(raw)
            room = self.room(request)
        except Unreadable as exc:
            log.warning("forwarded unchanged: %s", exc)
            return Compacted(raw, raw)
        return await self._run(raw, request, fmt, session, room, fresh=False)

    async def harder(
        self, done: Compacted, fmt: str, session: str | None, overflow: ContextOverflow
    ) -> Compacted:
        """``done``'s request compacted again below the target the upstream's refusal
        ``overflow`` gives (:meth:`ContextOverflow.target`), from scratch and forced."""
        assert done.request is not None and done.result is not None
        counted = done.result.tokens_after
        target = min(overflow.target(counted), done.room)
        log.info("upstream refused the request as too long; compacting to %d tokens", target)
        return await self._run(done.given, done.request, fmt, session, target, fresh=True)

    async def _run(
        self,
        raw: bytes,
        request: dict[str, Any],
        fmt: str,
        session: str | None,
        room: int,
        *,
        fresh: bool,
    ) -> Compacted:
        try:
            with _session(session):
                result = await acompact(
                    request,
                    compactor=self.settings.compactor,
                    opts=self.settings.opts,
                    model=request["model"],
                    window=room,
                    format=fmt,
                    fresh=fresh,
                    force=fresh,
                )
        except Exception as exc:  # never refused: the upstream answers what it would have
            log.warning("forwarded unchanged: compaction failed: %s: %s", type(exc).__name__, exc)
            return Compacted(raw, raw)
        if result.messages == request:
            return Compacted(raw, raw, request, result, room)
        if result.compacted:
            log.info(
                "compacted %s request: %d -> %d tokens (room %d)",
                fmt,
                result.tokens_before,
                result.tokens_after,
                room,
            )
        body = json.dumps(result.messages, ensure_ascii=False).encode()
        return Compacted(body, raw, request, result, room)
