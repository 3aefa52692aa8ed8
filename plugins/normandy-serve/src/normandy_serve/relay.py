"""The upstream leg: a request sent on as the client made it, the answer relayed back.

Headers go both ways as they came, less the hop-by-hop ones (RFC 9110 7.6.1: they
describe one connection, not the message) and, on the way up, the proxy's own
``X-Normandy-*`` headers and the ``Host`` and ``Content-Length`` the new connection
and body set. The answer is relayed as its raw bytes, still compressed if it was, chunk
by chunk as they arrive (server-sent events reach the client as the upstream sends
them). Credentials pass through untouched and are never logged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any, cast

import anthropic
import httpx
import openai
from starlette.responses import StreamingResponse

from normandy_core.clients import ContextOverflow, context_overflow

__all__ = [
    "HOP_BY_HOP",
    "SESSION_HEADER",
    "TOKEN_HEADER",
    "overflow_in",
    "read_raw",
    "relay",
    "upstream_headers",
]

#: The header a client names its conversation's session with.
SESSION_HEADER = "x-normandy-session"
#: The header the proxy's own clients present its ``--token`` in.
TOKEN_HEADER = "x-normandy-token"
#: Headers that belong to one connection, never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_UP = HOP_BY_HOP | {"host", "content-length", SESSION_HEADER, TOKEN_HEADER}


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> set[str]:
    """The headers a ``Connection`` header names, hop-by-hop too."""
    return {
        name.strip().lower()
        for key, value in headers
        if key.lower() == b"connection"
        for name in value.decode("latin-1").split(",")
    }


def upstream_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers to send upstream, in order, repeated ones kept."""
    dropped = _NOT_UP | _connection_named(raw)
    return [(k, v) for k, v in raw if k.decode("latin-1").lower() not in dropped]


def _client_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    dropped = HOP_BY_HOP | _connection_named(raw)
    return [(k.lower(), v) for k, v in raw if k.decode("latin-1").lower() not in dropped]


async def read_raw(upstream: httpx.Response) -> bytes:
    """The upstream's whole body as it came on the wire (still compressed if it was)."""
    return b"".join([chunk async for chunk in upstream.aiter_raw()])


async def _chunks(upstream: httpx.Response, read: bytes | None) -> AsyncIterator[bytes]:
    try:
        if read is not None:
            yield read
        else:
            async for chunk in upstream.aiter_raw():
                yield chunk
    finally:  # also when the client goes away mid-stream
        await upstream.aclose()


def relay(upstream: httpx.Response, read: bytes | None = None) -> StreamingResponse:
    """The upstream's answer for the client: its status, headers and raw body (``read``:
    the body already read with :func:`read_raw`), streamed as it arrives."""
    response = StreamingResponse(_chunks(upstream, read), status_code=upstream.status_code)
    response.raw_headers = _client_headers(upstream.headers.raw)
    return response


def overflow_in(fmt: str, upstream: httpx.Response, raw: bytes) -> ContextOverflow | None:
    """The upstream's answer (status and ``raw`` body) read as a refusal of the request as
    too long, by the core's reader of the provider SDK's errors, else ``None``."""
    if upstream.status_code not in (400, 413):
        return None
    decoded = httpx.Response(
        upstream.status_code, headers=upstream.headers, content=raw, request=upstream.request
    )
    try:
        body: Any = json.loads(decoded.read())
    except (UnicodeDecodeError, json.JSONDecodeError, httpx.DecodingError):
        return None
    if not isinstance(body, dict):
        return None
    # The SDKs' own error types, as each SDK raises them for this answer (the Anthropic SDK
    # keeps the whole body, the OpenAI SDK the ``error`` object).
    response = cast(Any, decoded)
    error: Exception
    if fmt == "anthropic":
        error = anthropic.APIStatusError("refused", response=response, body=body)
    elif upstream.status_code == 400:
        error = openai.BadRequestError("refused", response=response, body=body.get("error", body))
    else:
        return None
    return context_overflow(error)
