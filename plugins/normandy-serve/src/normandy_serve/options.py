"""The proxy's settings, from the command line's options, checked before it serves.

A bad value raises :class:`ServeOptionsError` naming the option (``--upstream``,
``--opts``...); the compactor and its options are prepared once here, with the core's
own preparation, so an unknown compactor or a refused option stops ``normandy serve``
before the first request rather than at it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from normandy_core import ContinuationMemo
from normandy_core.transcripts.facade import prepare_config

__all__ = ["MAX_CONVERSATIONS", "ServeOptionsError", "ServeSettings", "settings_from"]

#: The entry point named in the compactor's option errors.
ENTRY = "normandy serve --opts"
#: The window the options are checked against when ``--window`` is not given (each
#: request is compacted with its model's window from the catalog).
_CHECK_WINDOW = 100_000
#: How many conversations the proxy continues at once by default (``--max-conversations``).
MAX_CONVERSATIONS = 256
#: The messages the continuation memo may hold per conversation it is sized to: a
#: 10,000-message history given plus what its compaction returned fits, with room. The
#: memo's total (this times ``--max-conversations``) is what bounds it, not each one.
MEMO_MESSAGES_PER_CONVERSATION = 25_000


class ServeOptionsError(ValueError):
    """A bad option of ``normandy serve``; the message names it."""


@dataclass(frozen=True)
class ServeSettings:
    """What the proxy runs with: the upstream's origin, the compactor and its options,
    the pinned window (``None``: the catalog's for each request's model) and the token
    its own clients present (``None``: none asked), and how many conversations it
    continues at once (the compaction memo's size: :meth:`memo`)."""

    upstream: str
    compactor: str = "window_manager"
    opts: dict[str, Any] = field(default_factory=dict)
    window: int | None = None
    token: str | None = None
    max_conversations: int = MAX_CONVERSATIONS

    def memo(self) -> ContinuationMemo:
        """A new continuation memo sized to :attr:`max_conversations`: one compaction
        remembered per conversation, and at most
        :data:`MEMO_MESSAGES_PER_CONVERSATION` messages per conversation in all."""
        return ContinuationMemo(
            max_states=self.max_conversations,
            max_messages=self.max_conversations * MEMO_MESSAGES_PER_CONVERSATION,
        )


def _upstream(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ServeOptionsError(
            f"--upstream must be an http:// or https:// URL such as https://api.openai.com, "
            f"got {text!r}"
        )
    if parts.query or parts.fragment:
        raise ServeOptionsError(f"--upstream takes no query or fragment, got {text!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        # The clients' paths carry /v1 already (their base_url ends in /v1 for OpenAI).
        raise ServeOptionsError(
            f"--upstream is the API's origin without /v1 (https://api.openai.com, "
            f"https://api.anthropic.com), got {text!r}"
        )
    return f"{parts.scheme}://{parts.netloc}{path}"


def _opts(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ServeOptionsError(f"--opts must be a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ServeOptionsError(f"--opts must be a JSON object, got {type(value).__name__}")
    return value


def settings_from(
    upstream: str,
    compactor: str = "window_manager",
    opts: str | None = None,
    window: int | None = None,
    token: str | None = None,
    max_conversations: int = MAX_CONVERSATIONS,
) -> ServeSettings:
    """The proxy's settings from the options' values, each checked (raises
    :class:`ServeOptionsError` naming the option at fault), and the compactor prepared once
    with its options (raises the core's ``OptionsError`` or ``PluginError``)."""
    if window is not None and window <= 0:
        raise ServeOptionsError(f"--window must be a positive number of tokens, got {window}")
    if isinstance(max_conversations, bool) or max_conversations < 1:
        raise ServeOptionsError(
            f"--max-conversations must be a positive number of conversations, "
            f"got {max_conversations}"
        )
    if token is not None and not token.strip():
        raise ServeOptionsError("--token must not be empty")
    if not compactor.strip():
        raise ServeOptionsError("--compactor must name a compactor")
    settings = ServeSettings(
        _upstream(upstream), compactor, _opts(opts), window, token, max_conversations
    )
    prepare_config(
        compactor=settings.compactor,
        opts=settings.opts,
        model=None,
        window=window or _CHECK_WINDOW,
        timeout=None,
        entry=ENTRY,
    )
    return settings
