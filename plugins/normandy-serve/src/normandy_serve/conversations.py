"""Which conversation a request continues, so a growing list is compacted as one.

An agent sends its whole history with every request; ``compact()`` continues a list
that extends the one it was given last time (reading and counting only the new
messages, keeping the earlier cuts), but it knows a continued list by its very message
objects, and the proxy parses every request anew. So the proxy keeps, per session, the
message list it last handed to ``compact()``: a request whose list begins with that one
(equal by value) gets those same objects for the prefix, and the memo continues it.

The session is the client's ``X-Normandy-Session`` header, else one derived from what
opens the conversation (the API, the system prompt and the first user message), which
every later request of the conversation repeats. Two agents that open with the very same
system prompt and task share a derived session: such agents should name theirs.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from normandy_core.transcripts.transcript import request_keys

__all__ = ["Conversations"]

#: How many conversations are kept by default; beyond, the least recently used is
#: forgotten (its next request is compacted in full, as a new one, and continues from
#: there). The proxy keeps as many as its compaction memo (``--max-conversations``).
MAX_CONVERSATIONS = 4096


def _opening(messages: list[Any]) -> Any:
    """The first user message of ``messages`` (``None`` without one)."""
    return next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)


class Conversations:
    """The conversations one proxy has seen, least recently used first."""

    def __init__(self, limit: int = MAX_CONVERSATIONS) -> None:
        self.limit = limit
        self._lists: OrderedDict[str, list[Any]] = OrderedDict()

    @staticmethod
    def session_of(fmt: str, request: dict[str, Any], named: str | None) -> str:
        """The session of ``request`` (of format ``fmt``): ``named`` (the header), else
        one derived from the conversation's opening."""
        if named is not None:
            return named
        keys = request_keys(request)
        listed = request.get(keys[0]) if keys else None
        opening = listed if isinstance(listed, str) else _opening(listed or [])
        system = request.get(keys[1]) if keys else None
        canonical = json.dumps([fmt, system, opening], sort_keys=True, ensure_ascii=False)
        return "proxy-" + hashlib.sha256(canonical.encode()).hexdigest()[:24]

    def continued(self, session: str, messages: list[Any]) -> list[Any]:
        """``messages`` with the prefix it shares with the session's last list replaced by
        that list's own objects; remembered as the session's list."""
        last = self._lists.pop(session, None)
        if last is not None and len(last) <= len(messages) and messages[: len(last)] == last:
            messages = last + messages[len(last) :]
        self._lists[session] = messages
        while len(self._lists) > self.limit:
            self._lists.popitem(last=False)
        return messages
