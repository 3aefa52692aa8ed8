"""The proxy as an ASGI application (Starlette): every path and method is forwarded to the
upstream; ``POST`` to the three APIs' paths is compacted first (:mod:`normandy_serve.requests`).

``GET /normandy/health`` answers ``{"status": "ok"}`` (no token asked). With ``--token``
every other request must carry it in ``X-Normandy-Token``, else the proxy answers 401
itself (the upstream never sees it). An upstream's refusal of a compacted request as too
long is followed by one harder compaction and one retry, as the turn loop recovers.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from normandy_serve.metrics import ProxyMetrics
from normandy_serve.options import ServeSettings
from normandy_serve.relay import (
    SESSION_HEADER,
    TOKEN_HEADER,
    overflow_in,
    read_raw,
    relay,
    upstream_headers,
)
from normandy_serve.requests import API_FORMATS, Compacted, RequestCompactor

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

__all__ = ["HEALTH_PATH", "Proxy", "create_app"]

log = logging.getLogger("normandy_serve")

#: The proxy's own health endpoint.
HEALTH_PATH = "/normandy/health"
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
#: Upstream time limits, in seconds: a model's answer may take minutes to start.
_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


def _refused(status: int, message: str) -> JSONResponse:
    """An answer of the proxy's own (never the upstream's), in the providers' error shape."""
    return JSONResponse(
        {"error": {"type": "normandy_proxy_error", "message": message}}, status_code=status
    )


class Proxy:
    """The forwarding of one request: ``client`` is the upstream connection pool,
    ``metrics`` the instruments it records with."""

    def __init__(
        self, settings: ServeSettings, client: httpx.AsyncClient, metrics: ProxyMetrics
    ) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.compactor = RequestCompactor(settings)

    def _denied(self, request: Request) -> Response | None:
        token = self.settings.token
        if token is None:
            return None
        given = request.headers.get(TOKEN_HEADER, "")
        if hmac.compare_digest(given.encode(), token.encode()):
            return None
        return _refused(401, f"the proxy asks for its token in the {TOKEN_HEADER} header")

    async def _send(self, request: Request, body: bytes) -> httpx.Response:
        url = self.settings.upstream + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        sent = self.client.build_request(
            request.method, url, headers=upstream_headers(request.headers.raw), content=body
        )
        return await self.client.send(sent, stream=True)

    async def handle(self, request: Request) -> Response:
        """Forward ``request`` (compacted when it is one of the three APIs') and relay the
        upstream's answer."""
        denied = self._denied(request)
        if denied is not None:
            return denied
        body = await request.body()
        fmt = API_FORMATS.get(request.url.path) if request.method == "POST" else None
        if fmt is None:
            return self._relayed(None, "unchanged", await self._send_or_fail(request, body))
        session = request.headers.get(SESSION_HEADER)
        if session is not None:
            session = session.strip()
            if not session:
                return _refused(400, f"the {SESSION_HEADER} header must not be empty")
        started = time.perf_counter()
        done = await self.compactor.compact(body, fmt, session)
        if done.result is not None:
            self.metrics.compacted(fmt, done.removed, time.perf_counter() - started)
        upstream = await self._send_or_fail(request, done.body)
        if done.result is None or isinstance(upstream, Response):
            return self._relayed(fmt, done.outcome, upstream)
        if upstream.status_code not in (400, 413):
            return self._relayed(fmt, done.outcome, upstream)
        raw = await read_raw(upstream)
        overflow = overflow_in(fmt, upstream, raw)
        if overflow is None:
            return self._relayed(fmt, done.outcome, upstream, raw)
        await upstream.aclose()
        self.metrics.retried(fmt)
        retry: Compacted = await self.compactor.harder(done, fmt, overflow)
        again = await self._send_or_fail(request, retry.body)
        return self._relayed(fmt, retry.outcome, again)

    def _relayed(
        self,
        fmt: str | None,
        outcome: str,
        upstream: httpx.Response | Response,
        read: bytes | None = None,
    ) -> Response:
        """The answer for the client (the proxy's own as it is), counted."""
        if isinstance(upstream, Response):
            return upstream
        self.metrics.relayed(fmt, outcome, upstream.status_code)
        return relay(upstream, read)

    async def _send_or_fail(self, request: Request, body: bytes) -> httpx.Response | Response:
        """The upstream's answer, or the proxy's 502 when the upstream cannot be reached."""
        try:
            return await self._send(request, body)
        except httpx.HTTPError as exc:
            log.warning("upstream unreachable: %s: %s", type(exc).__name__, exc)
            return _refused(502, f"the upstream could not be reached: {type(exc).__name__}")


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def create_app(
    settings: ServeSettings,
    client: httpx.AsyncClient | None = None,
    meter_provider: MeterProvider | None = None,
) -> Starlette:
    """The proxy's ASGI application. ``client`` is the upstream connection pool (default:
    one made at startup and closed at shutdown); ``meter_provider`` the OpenTelemetry
    provider its metrics go to (default: the global one; :mod:`normandy_serve.metrics`)."""
    metrics = ProxyMetrics(meter_provider)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool = client or httpx.AsyncClient(timeout=_TIMEOUT)
        # Only the client's own headers go upstream: none of httpx's defaults
        # (Accept-Encoding, User-Agent...) are added to what the client sent.
        for name in list(pool.headers):
            del pool.headers[name]
        app.state.proxy = Proxy(settings, pool, metrics)
        try:
            yield
        finally:
            if client is None:
                await pool.aclose()

    async def handle(request: Request) -> Response:
        proxy: Proxy = request.app.state.proxy
        return await proxy.handle(request)

    routes = [
        Route(HEALTH_PATH, _health, methods=["GET"]),
        Route("/{path:path}", handle, methods=_METHODS),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
