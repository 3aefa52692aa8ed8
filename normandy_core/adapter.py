"""What every framework adapter shares: a compactor chosen by name, prepared once, that
compacts a framework's history as a continuation of its last call.

The adapters (``normandy-langchain``, ``normandy-pydantic-ai``,
``normandy-openai-agents``) each turn their framework's messages into one of the wire
formats :func:`normandy_core.compact` reads and back; :class:`NamedCompactor` is the part
in between: the settings resolved as :func:`~normandy_core.compact` resolves them, the
config prepared (options validated, errors naming the adapter), and the compaction run
through the same continuation memo, so a call that extends the list the last call was
given or returned reads and counts only what is new.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from normandy_core.config import AgentConfig
from normandy_core.facade import CompactResult, _compact_read, prepare_resolved
from normandy_core.settings import current_settings
from normandy_core.transcript import Transcript

__all__ = ["NamedCompactor", "adapter_hint"]


def adapter_hint(entry: str) -> str:
    """How to give an adapter a window, in its refusal when it has none."""
    return (
        f"pass window=<tokens> to {entry}, or model= a model the catalog knows (or set "
        "window or model in normandy.toml or pyproject.toml [tool.normandy])"
    )


class NamedCompactor:
    """A compactor chosen by name, prepared once, for an adapter's histories.

    ``compactor`` is an entry-point name (``default`` when neither given nor configured),
    ``opts`` its options, validated here: a bad option raises
    :class:`~normandy_core.OptionsError` naming ``entry`` and the compactor. ``window``
    pins the context window in tokens; otherwise the catalog gives ``model``'s. Values
    left out are taken from the configuration (``NORMANDY_COMPACTOR``, ``normandy.toml``,
    ``[tool.normandy]``), as :func:`normandy_core.compact` takes them. ``timeout`` bounds
    the compactor's time in seconds; ``client`` is a Normandy model client for a
    compactor that asks a model.
    """

    def __init__(
        self,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        *,
        model: str | None = None,
        window: int | None = None,
        timeout: float | None = None,
        client: Any = None,
        entry: str,
        default: str = "window_manager",
    ) -> None:
        settings = current_settings().resolve(
            default, compactor=compactor, opts=opts, model=model, window=window, timeout=timeout
        )
        self.entry = entry
        self.config: AgentConfig = prepare_resolved(
            settings, entry=entry, hint=adapter_hint(entry), client=client
        )
        self.compactor = settings.compactor
        self._settings = settings
        self._client = client

    def compact(self, messages: list[Any], *, mid_round: bool, format: str) -> CompactResult:
        """Compact ``messages`` (in ``format``) with the prepared config, as a continuation
        of the last call with this config when they extend the list it was given (or
        returned, its very objects first), as :func:`normandy_core.compact` does."""
        from normandy_core import continuation

        s = self._settings
        key = continuation.config_key(
            s.compactor,
            s.opts,
            s.model,
            s.window,
            s.timeout,
            format,
            self._client,
            survival=s.survival,
        )
        hit = continuation.resume(key, messages, mid_round)
        if hit is not None:
            return cast("CompactResult", hit)
        result, t = _compact_read(
            self.config,
            messages,
            mid_round=mid_round,
            format=format,  # type: ignore[arg-type]
        )
        if key is not None and isinstance(t, Transcript):
            continuation.remember(key, self.config, t, result.memory, messages, result.messages)
        return result

    def log(
        self, logger: logging.Logger, before: int, after: int, result: CompactResult, what: str
    ) -> None:
        """Log one compaction at INFO: how many ``what`` before and after, the tokens."""
        logger.info(
            "%s compacted %d %s to %d (%d tokens to %d) with %s",
            self.entry,
            before,
            what,
            after,
            result.tokens_before,
            result.tokens_after,
            self.compactor,
        )
