"""``normandy serve``: run the proxy with uvicorn until it is stopped.

Added to the core's ``normandy`` command by the entry point ``serve`` of
``normandy_core.commands``. A bad option is one line on stderr and exit status 2
(naming the option), an unknown or broken compactor exit status 3. uvicorn serves until
SIGINT or SIGTERM, then stops accepting connections and lets the requests in flight,
streams included, finish (for at most ``--graceful-timeout`` seconds).

With ``--workers`` N > 1, uvicorn's supervisor runs N worker processes on one socket,
each building the app with :func:`app_from_environment` from the settings the parent
checked (passed in :data:`ENV_SETTINGS`). Each worker continues the conversations it
serves; a conversation whose next request reaches another worker is compacted from
scratch there, and the archive stores content it already holds once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette

from normandy_core import OptionsError, PluginError
from normandy_serve.app import create_app
from normandy_serve.options import (
    MAX_CONVERSATIONS,
    ServeOptionsError,
    ServeSettings,
    settings_from,
)

__all__ = [
    "ENV_SETTINGS",
    "EXIT_OPTIONS",
    "EXIT_PLUGIN",
    "app_from_environment",
    "register_cli",
    "serve",
    "uvicorn_config",
]

#: Exit status of a bad option.
EXIT_OPTIONS = 2
#: Exit status of an unknown or broken compactor (as the core's commands).
EXIT_PLUGIN = 3
#: The environment variable ``--token`` is read from when not given (so the token need
#: not appear in the process list).
ENV_TOKEN = "NORMANDY_SERVE_TOKEN"
#: The environment variable through which ``--workers`` hands the checked settings (JSON)
#: to the worker processes; set by ``normandy serve`` itself, not by users.
ENV_SETTINGS = "NORMANDY_SERVE_SETTINGS"


def register_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` command to an argparse ``subparsers`` object (the core CLI's)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="a proxy for the OpenAI and Anthropic APIs that compacts every request",
        description="Serve the OpenAI (Chat Completions, Responses) and Anthropic (Messages) "
        "APIs, compacting each request's conversation to the model's window before it is "
        "forwarded to --upstream (normandy-serve).",
    )
    parser.add_argument("--upstream", required=True, help="the API's origin, without /v1")
    parser.add_argument("--compactor", default="window_manager", help="default window_manager")
    parser.add_argument("--opts", default=None, help="the compactor's options as a JSON object")
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="default 8080")
    parser.add_argument(
        "--window", type=int, default=None, help="context window in tokens (default: catalog)"
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"a token clients must send in X-Normandy-Token (or set {ENV_TOKEN})",
    )
    parser.add_argument(
        "--max-conversations",
        type=int,
        default=MAX_CONVERSATIONS,
        help="conversations continued at once; beyond, the least recently used is "
        f"compacted from scratch at its next request (default {MAX_CONVERSATIONS})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes serving one port (default 1)",
    )
    parser.add_argument(
        "--graceful-timeout",
        type=int,
        default=30,
        help="seconds the requests in flight get to finish at shutdown (default 30)",
    )
    parser.set_defaults(func=serve)
    return parser


def _log_to_stderr() -> None:
    """The proxy's own lines (requests forwarded unchanged, compactions, retries) on
    stderr beside uvicorn's, from INFO on; the core's command line shows warnings only."""
    logger = logging.getLogger("normandy_serve")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    # The process id tells the --workers processes apart.
    line = "%(levelname)s:     normandy serve [%(process)d]: %(message)s"
    handler.setFormatter(logging.Formatter(line))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # not a second time through the root's handler


def serve(args: argparse.Namespace) -> int:
    """Run the proxy with the parsed ``args``; returns the exit status."""
    try:
        if not 0 <= args.port <= 65535:
            raise ServeOptionsError(f"--port must be from 0 to 65535, got {args.port}")
        if args.graceful_timeout < 0:
            raise ServeOptionsError("--graceful-timeout must not be negative")
        if args.workers < 1:
            raise ServeOptionsError(f"--workers must be at least 1, got {args.workers}")
        settings = settings_from(
            args.upstream,
            args.compactor,
            args.opts,
            args.window,
            args.token if args.token is not None else os.environ.get(ENV_TOKEN),
            args.max_conversations,
        )
    except (ServeOptionsError, OptionsError) as exc:
        sys.stderr.write(f"normandy serve: {exc}\n")
        return EXIT_OPTIONS
    except PluginError as exc:
        sys.stderr.write(f"normandy serve: {exc}\n")
        return EXIT_PLUGIN
    _log_to_stderr()
    if args.workers == 1:
        config = uvicorn_config(create_app(settings), args.host, args.port, args.graceful_timeout)
        uvicorn.Server(config).run()
        return 0
    os.environ[ENV_SETTINGS] = json.dumps(dataclasses.asdict(settings))
    uvicorn.run(
        f"{__name__}:{app_from_environment.__name__}",
        factory=True,
        workers=args.workers,
        **_server_options(args.host, args.port, args.graceful_timeout),
    )
    return 0


def app_from_environment() -> Starlette:
    """The proxy's app in a ``--workers`` process, from the settings ``normandy serve``
    checked and put in :data:`ENV_SETTINGS` (uvicorn calls this in each worker)."""
    _log_to_stderr()
    return create_app(ServeSettings(**json.loads(os.environ[ENV_SETTINGS])))


def _server_options(host: str, port: int, graceful_timeout: int) -> dict[str, Any]:
    """The uvicorn settings the proxy runs with, one worker or several."""
    return {
        "host": host,
        "port": port,
        "timeout_graceful_shutdown": graceful_timeout,
        # The upstream's own Server and Date headers reach the client, not uvicorn's.
        "server_header": False,
        "date_header": False,
    }


def uvicorn_config(
    app: Starlette,
    host: str = "127.0.0.1",
    port: int = 8080,
    graceful_timeout: int = 30,
    **kwargs: Any,
) -> uvicorn.Config:
    """The uvicorn configuration ``normandy serve`` runs the proxy ``app``
    (:func:`~normandy_serve.create_app`) with; ``kwargs`` are more of ``uvicorn.Config``'s,
    such as ``log_config``."""
    return uvicorn.Config(app, **_server_options(host, port, graceful_timeout), **kwargs)
