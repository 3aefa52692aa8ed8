"""A request body compacted in its API's own format, before the proxy forwards it.

Each of the three APIs is compacted by the core's :func:`~normandy_core.acompact` on the
request as the client sent it (Chat Completions' ``messages``, the Responses API's
``input`` and ``instructions``, Anthropic's ``messages`` and ``system``): every key the
proxy does not compact is kept as given, and a request nothing was removed from is
forwarded as the very bytes the client sent. The window is ``--window`` or the catalog's
for the request's ``model``, less the request's tool definitions (counted with the
model's counter); the room for the reply is the compactor's to keep (``window_manager``'s
``reserved_tokens`` option).

A body that is not a JSON request of its API, a model without a known window, or a
compaction that fails, is forwarded unchanged and logged, never refused: the upstream
answers it as it would have without the proxy.
"""

from __future__ import annotations

import json
import logging
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
from normandy_core.transcripts.transcript import request_keys
from normandy_serve.conversations import Conversations
from normandy_serve.options import ServeSettings

__all__ = ["API_FORMATS", "Compacted", "RequestCompactor"]

log = logging.getLogger("normandy_serve")

#: The paths whose POST body is compacted, and the format ``compact()`` reads each in.
API_FORMATS = {
    "/v1/chat/completions": "openai",
    "/v1/responses": "responses",
    "/v1/messages": "anthropic",
}


@dataclass(frozen=True)
class Compacted:
    """What to forward: ``body`` (the client's own bytes ``given`` when nothing changed),
    and for a request that was compacted (or checked and kept), its parsed ``request``,
    the ``result``, the ``room`` (tokens) the conversation was sized to and its session."""

    body: bytes
    given: bytes
    request: dict[str, Any] | None = None
    result: CompactResult | None = None
    room: int = 0
    session: str = ""

    @property
    def outcome(self) -> str:
        """``compacted`` (something was removed), ``kept`` (read, nothing removed) or
        ``unchanged`` (forwarded without being read)."""
        if self.result is None:
            return "unchanged"
        return "compacted" if self.body is not self.given else "kept"

    @property
    def removed(self) -> int:
        """Tokens compaction removed from the request (0 when it removed nothing)."""
        if self.result is None or not self.result.compacted:
            return 0
        return max(self.result.tokens_before - self.result.tokens_after, 0)


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


def _tool_tokens(request: dict[str, Any], model: str) -> int:
    """Tokens of the request's tool definitions, which the window holds beside the
    conversation."""
    tools = request.get("tools")
    if not tools:
        return 0
    counter = get_counter(default_counter_for(model))
    return counter.count_text(json.dumps(tools, ensure_ascii=False))


class RequestCompactor:
    """Compacts request bodies with the proxy's settings; one per proxy."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.catalog = default_catalog()
        # Per model, the room an upstream's refusal as too long left: later requests are
        # sized to it too, rather than each being refused once.
        self.caps: dict[str, int] = {}
        # Sized to the conversations in flight: with the process-wide memo (8
        # compactions) a proxy serving more agents compacts every request from scratch.
        self.memo = settings.memo()
        self.conversations = Conversations(settings.max_conversations)

    def room(self, request: dict[str, Any]) -> int:
        """Tokens the request's conversation may take (raises :class:`Unreadable` when the
        window is unknown or the tool definitions fill it)."""
        model = request["model"]
        window = self.settings.window or self.catalog.window(model)
        if window is None:
            raise Unreadable(f"the catalog knows no window for model {model!r}; pass --window")
        room = min(window - _tool_tokens(request, model), self.caps.get(model, window))
        if room <= 0:
            raise Unreadable(f"its tool definitions fill the {window}-token window")
        return room

    async def compact(self, raw: bytes, fmt: str, named: str | None) -> Compacted:
        """``raw`` compacted as a request of format ``fmt`` in its session (``named`` by the
        client, else derived: :mod:`normandy_serve.conversations`); unchanged (and
        logged) when it cannot be read or compacted."""
        try:
            request = _parse(raw)
            room = self.room(request)
        except Unreadable as exc:
            log.warning("forwarded unchanged: %s", exc)
            return Compacted(raw, raw)
        session = self.conversations.session_of(fmt, request, named)
        keys = request_keys(request)
        if keys is not None and isinstance(request.get(keys[0]), list):
            request[keys[0]] = self.conversations.continued(session, request[keys[0]])
        return await self._run(raw, request, fmt, session, room, fresh=False)

    async def harder(self, done: Compacted, fmt: str, overflow: ContextOverflow) -> Compacted:
        """``done``'s request compacted again below the target the upstream's refusal
        ``overflow`` gives (:meth:`ContextOverflow.target`), from scratch and forced
        (``done`` itself when it was not read)."""
        if done.request is None or done.result is None:
            return done
        counted = done.result.tokens_after
        target = min(overflow.target(counted), done.room)
        self.caps[done.request["model"]] = target
        log.info("upstream refused the request as too long; compacting to %d tokens", target)
        return await self._run(done.given, done.request, fmt, done.session, target, fresh=True)

    async def _run(
        self,
        raw: bytes,
        request: dict[str, Any],
        fmt: str,
        session: str,
        room: int,
        *,
        fresh: bool,
    ) -> Compacted:
        try:
            # Dropped entries are archived under the conversation's session.
            with archive_settings(session=session):
                result = await acompact(
                    request,
                    compactor=self.settings.compactor,
                    opts=self.settings.opts,
                    model=request["model"],
                    window=room,
                    format=fmt,
                    fresh=fresh,
                    force=fresh,
                    memo=self.memo,
                )
        except Exception as exc:  # never refused: the upstream answers what it would have
            log.warning("forwarded unchanged: compaction failed: %s: %s", type(exc).__name__, exc)
            return Compacted(raw, raw)
        if result.messages == request:
            return Compacted(raw, raw, request, result, room, session)
        if result.compacted:
            log.info(
                "compacted %s request of session %s%s: %d -> %d tokens (room %d)",
                fmt,
                session,
                " (continued)" if result.continued else "",
                result.tokens_before,
                result.tokens_after,
                room,
            )
        body = json.dumps(result.messages, ensure_ascii=False).encode()
        return Compacted(body, raw, request, result, room, session)
