"""The proxy served by uvicorn on loopback, in front of the client tests' loopback providers.

The providers are tests/clients/servers.py's (loaded by path, under the name the client
tests' conftest gives it, so one module serves both). :func:`serving` runs the proxy's
uvicorn server in a thread on a free port and stops it through uvicorn's own
``should_exit`` (no signal involved).
"""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from normandy_serve import create_app, settings_from, uvicorn_config

TESTS = Path(__file__).resolve().parents[3] / "tests" / "clients"


def _load(name: str, path: Path) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


servers = _load("normandy_client_test_servers", TESTS / "servers.py")


def root_of(provider: Any) -> str:
    """The loopback provider's origin (what ``--upstream`` takes)."""
    host, port = provider.server.server_address[:2]
    return f"http://{host}:{port}"


@contextmanager
def served(
    upstream: str, meter_provider: Any = None, **options: Any
) -> Iterator[tuple[str, uvicorn.Server]]:
    """The proxy in front of ``upstream`` with ``options`` (those of
    :func:`normandy_serve.settings_from`) and its metrics to ``meter_provider``, served
    until the block ends (or its server's ``should_exit`` is set); yields its origin and
    its uvicorn server."""
    app = create_app(settings_from(upstream, **options), meter_provider=meter_provider)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, port=port, log_config=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive(), "the proxy stopped while starting"
        assert time.monotonic() < deadline, "the proxy did not start in 20 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


@contextmanager
def serving(upstream: str, meter_provider: Any = None, **options: Any) -> Iterator[str]:
    """:func:`served`, yielding the proxy's origin alone."""
    with served(upstream, meter_provider, **options) as (origin, _):
        yield origin
