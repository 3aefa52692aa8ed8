"""Model catalog: context windows by model id, for compactors that size against one.

Window resolution follows the contract: the compactor options' ``context_window`` when
pinned, otherwise the agent's catalog, memoised per agent and model
(:meth:`normandy_core.AgentConfig.resolve_window`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

__all__ = ["CATALOG_CHECKED", "DEFAULT_WINDOWS", "ModelCatalog", "StaticCatalog", "default_catalog"]

#: The date the default table was last compiled.
CATALOG_CHECKED = "2026-12-02"

#: Context windows in tokens, by model id or id prefix (longest prefix wins), as published
#: by the providers. Dated model ids (``claude-sonnet-4-5-20250929``) match their prefix.
DEFAULT_WINDOWS: Mapping[str, int] = {
    # Anthropic
    "claude-opus-4-5": 200_000,
    "claude-opus-4-1": 200_000,
    "claude-opus-4": 200_000,
    "claude-sonnet-4-5": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-5-haiku": 200_000,
    "claude-3-opus": 200_000,
    "claude-3-haiku": 200_000,
    # OpenAI
    "gpt-5": 400_000,
    "gpt-5-mini": 400_000,
    "gpt-5-nano": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1": 200_000,
    "o1-mini": 128_000,  # without these two, the "o1" prefix gave them 200,000: too large
    "o1-preview": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    # Google
    "gemini-2.5-pro": 1_048_576,
    "gemini-2.5-flash": 1_048_576,
    "gemini-2.0-flash": 1_048_576,
    "gemini-1.5-pro": 2_097_152,
    "gemini-1.5-flash": 1_048_576,
    # Open models (as commonly served)
    "llama-3.3-70b": 131_072,
    "llama-3.1-405b": 131_072,
    "llama-3.1-70b": 131_072,
    "llama-3.1-8b": 131_072,
    "llama-4-maverick": 1_048_576,
    "llama-4-scout": 10_485_760,
    "mistral-large": 131_072,
    "mistral-small": 32_768,
    "codestral": 262_144,
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "qwen2.5-72b-instruct": 131_072,
    "qwen3-coder": 262_144,
    "gpt-oss-120b": 131_072,
    "gpt-oss-20b": 131_072,
}


@runtime_checkable
class ModelCatalog(Protocol):
    """Knows context windows. ``window(model)`` returns ``None`` for an unknown model."""

    def window(self, model: str) -> int | None:
        """The model's context window in tokens, or ``None`` when unknown."""
        ...


class StaticCatalog:
    """A catalog from a table: exact id first, then the longest matching id prefix.

    ``StaticCatalog(overrides={"my-model": 32_000})`` adds to (and overrides) the default
    table; ``StaticCatalog(windows, include_defaults=False)`` uses only ``windows``.
    """

    def __init__(
        self,
        overrides: Mapping[str, int] | None = None,
        *,
        include_defaults: bool = True,
    ) -> None:
        table: dict[str, int] = dict(DEFAULT_WINDOWS) if include_defaults else {}
        for model, window in (overrides or {}).items():
            if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
                raise ValueError(
                    f"catalog window for {model!r} must be a positive int, got {window!r}"
                )
            table[model] = window
        self._table = table
        self._prefixes = sorted(table, key=len, reverse=True)

    def window(self, model: str) -> int | None:
        """The window of ``model``: its exact id, else its longest known prefix."""
        hit = self._table.get(model)
        if hit is not None:
            return hit
        base = model.rsplit("/", 1)[-1]  # "openrouter/anthropic/claude-..." style ids
        hit = self._table.get(base)
        if hit is not None:
            return hit
        for p in self._prefixes:
            if base.startswith(p) and base[len(p)] in "-@:.":
                return self._table[p]
        return None

    def models(self) -> list[str]:
        """The ids and prefixes the table knows, sorted."""
        return sorted(self._table)


_DEFAULT: StaticCatalog | None = None


def default_catalog() -> StaticCatalog:
    """The shared default catalog (the table above, as published on ``CATALOG_CHECKED``)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = StaticCatalog()
    return _DEFAULT
