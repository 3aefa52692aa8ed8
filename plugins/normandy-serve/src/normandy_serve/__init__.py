"""``normandy serve``: a proxy for the OpenAI and Anthropic APIs that compacts every
request's conversation to the model's window, for agents in any language.

:func:`create_app` is the ASGI application (to run under any ASGI server),
:func:`settings_from` checks the options, :func:`register_cli` adds ``serve`` to the
``normandy`` command.
"""

from __future__ import annotations

from normandy_serve.app import HEALTH_PATH, create_app
from normandy_serve.cli import register_cli, uvicorn_config
from normandy_serve.options import ServeOptionsError, ServeSettings, settings_from
from normandy_serve.relay import SESSION_HEADER, TOKEN_HEADER

__all__ = [
    "HEALTH_PATH",
    "SESSION_HEADER",
    "TOKEN_HEADER",
    "ServeOptionsError",
    "ServeSettings",
    "create_app",
    "register_cli",
    "settings_from",
    "uvicorn_config",
]
