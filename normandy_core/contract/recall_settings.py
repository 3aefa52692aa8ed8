"""The ``recall`` tool's settings and its definition in each provider's format.

:class:`RecallSettings` turn the tool on for an agent (``AgentConfig(recall=True)``);
:func:`recall_tool` gives its definition for a provider's ``tools`` list. The search
itself is :mod:`normandy_core.contract.recall`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from normandy_core.errors import NormandyError

__all__ = [
    "DEFAULT_LIMIT_TOKENS",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TIMEOUT",
    "HOOK",
    "MIN_LIMIT_TOKENS",
    "RecallError",
    "RecallSettings",
    "Scope",
    "recall_tool",
]

#: The hook the core calls to search (see :class:`~normandy_core.contract.hookspecs.HookSpec`).
HOOK = "recall_entries"
#: The default bound of one recall result, in tokens.
DEFAULT_LIMIT_TOKENS = 2000
#: The smallest bound accepted: room for the framing and some recalled text.
MIN_LIMIT_TOKENS = 200
#: The default number of entries asked of the sources per call.
DEFAULT_MAX_ENTRIES = 12
#: The default bound, in seconds, of one call's wait for the sources.
DEFAULT_TIMEOUT = 10.0
#: Tool names both providers accept.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

Scope = Literal["session", "all"]


class RecallError(NormandyError):
    """Nothing could be searched: no source is installed, or every source failed."""


def _tool_description() -> str:
    return (
        "Search the earlier part of this conversation that was removed to fit the context "
        "window, and get the best-matching messages back, quoted. Use it when you need "
        "something from earlier that you can no longer see: a file's content, a tool "
        "output, an error message, an id, a decision, or a constraint the user gave. The "
        "query is keywords (names, paths, identifiers, error text): entries matching any "
        "of them are found, those matching more rank first."
    )


_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "Keywords to search for, separated by spaces.",
        }
    },
    "required": ["query"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class RecallSettings:
    """The ``recall`` tool of an agent (``AgentConfig(recall=RecallSettings(...))``).

    ``limit_tokens`` bounds each result (counted with the agent's token counter, at
    least :data:`MIN_LIMIT_TOKENS`); ``max_entries`` is how many matching entries are
    asked of the sources per call; ``scope`` is ``"session"`` (what compaction dropped
    in this agent's session, the default) or ``"all"`` (every session of the archive:
    only for an archive that holds no one else's conversations); ``tool_name`` is the
    name the model calls it by; ``timeout`` bounds, in seconds, how long a call waits for
    each source (a source past it is abandoned and reported like a failed one; ``None``:
    no bound). ``embedder`` names the embedder (an entry point of the
    ``normandy_core.embedders`` group) whose ranking by meaning recall fuses with the
    keyword one, made with ``embedder_options``: ``None`` takes the configured one (the
    ``[recall]`` table's ``embedder``, ``NORMANDY_RECALL_EMBEDDER``; none configured:
    keywords only), ``"off"`` none whatever is configured.

    :raises ValueError: naming the setting and what is allowed.
    """

    limit_tokens: int = DEFAULT_LIMIT_TOKENS
    max_entries: int = DEFAULT_MAX_ENTRIES
    scope: Scope = "session"
    tool_name: str = "recall"
    timeout: float | None = DEFAULT_TIMEOUT
    embedder: str | None = None
    embedder_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.embedder is not None and (
            not isinstance(self.embedder, str) or not self.embedder.strip()
        ):
            raise ValueError(
                "RecallSettings: embedder must be an embedder's name, 'off' or None, got "
                f"{self.embedder!r}"
            )
        if self.embedder_options is not None and not isinstance(self.embedder_options, dict):
            raise ValueError(
                "RecallSettings: embedder_options must be a dict of the embedder's options, "
                f"got {type(self.embedder_options).__name__}"
            )
        to = self.timeout
        if to is not None and (
            isinstance(to, bool) or not isinstance(to, (int, float)) or not 0 < to < 1e6
        ):
            raise ValueError(
                f"RecallSettings: timeout must be a number of seconds above 0, or None, got {to!r}"
            )
        lt = self.limit_tokens
        if isinstance(lt, bool) or not isinstance(lt, int) or lt < MIN_LIMIT_TOKENS:
            raise ValueError(
                f"RecallSettings: limit_tokens must be a whole number of tokens >= "
                f"{MIN_LIMIT_TOKENS}, got {lt!r}"
            )
        me = self.max_entries
        if isinstance(me, bool) or not isinstance(me, int) or not 1 <= me <= 1000:
            raise ValueError(
                f"RecallSettings: max_entries must be a whole number from 1 to 1000, got {me!r}"
            )
        if self.scope not in ("session", "all"):
            raise ValueError(
                f"RecallSettings: scope must be 'session' or 'all', got {self.scope!r}"
            )
        if not isinstance(self.tool_name, str) or not _TOOL_NAME.match(self.tool_name):
            raise ValueError(
                "RecallSettings: tool_name must be 1 to 64 letters, digits, '_' or '-' "
                f"(what both providers accept), got {self.tool_name!r}"
            )

    def definition(self) -> dict[str, Any]:
        """The tool's definition in the form ``AgentConfig.tools`` holds (``name``,
        ``description``, ``input_schema``); the clients render it for their provider."""
        return recall_tool(self, format="anthropic")

    @property
    def note(self) -> str:
        """The sentence a compaction marker or summary adds when the tool is on."""
        return (
            f"The `{self.tool_name}` tool brings them back: call it with keywords (names, "
            "paths, ids, error text) when you need something from them."
        )


def recall_tool(
    settings: RecallSettings | None = None,
    *,
    format: Literal["anthropic", "openai", "responses"] = "anthropic",
) -> dict[str, Any]:
    """The recall tool's definition for a provider's ``tools`` list.

    ``format`` is ``"anthropic"`` (Messages API: ``name``, ``description``,
    ``input_schema``), ``"openai"`` (Chat Completions: a ``function`` tool) or
    ``"responses"`` (the Responses API's flat function tool). The model calls it with
    one argument, ``query``.
    """
    s = settings or RecallSettings()
    schema = json.loads(json.dumps(_SCHEMA))  # a copy the caller may change
    if format == "anthropic":
        return {"name": s.tool_name, "description": _tool_description(), "input_schema": schema}
    if format == "openai":
        return {
            "type": "function",
            "function": {
                "name": s.tool_name,
                "description": _tool_description(),
                "parameters": schema,
            },
        }
    if format == "responses":
        return {
            "type": "function",
            "name": s.tool_name,
            "description": _tool_description(),
            "parameters": schema,
            "strict": True,
        }
    raise ValueError(
        f"recall_tool: format must be 'anthropic', 'openai' or 'responses', got {format!r}"
    )
