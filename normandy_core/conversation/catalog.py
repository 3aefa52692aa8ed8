"""Model catalog: context windows and input prices by model id.

Compactors that size against a window read :meth:`StaticCatalog.window`; the ``cost``
schedule and the billed-input figures of every compaction read :meth:`StaticCatalog.prices`
(input, cache-write and cache-read prices, each entry dated with the day its source
published it). Both tables are overridable per catalog, as windows are.

Window resolution follows the contract: the compactor options' ``context_window`` when
pinned, otherwise the agent's catalog, memoised per agent and model
(:meth:`normandy_core.AgentConfig.resolve_window`).
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

__all__ = [
    "CATALOG_CHECKED",
    "DEFAULT_PRICES",
    "DEFAULT_WINDOWS",
    "ModelCatalog",
    "Prices",
    "StaticCatalog",
    "catalog_prices",
    "default_catalog",
]

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


@dataclass(frozen=True, slots=True)
class Prices:
    """Input prices of one model in US dollars per million tokens, dated.

    ``input`` is uncached input, ``cache_write`` input written to the prompt cache (for
    Anthropic the 5-minute cache, 1.25x input; OpenAI bills no write, so it equals
    ``input``), ``cache_read`` input read from the cache. ``as_of`` is the ISO date of the
    price list the figures were taken from. Refused when a price is negative or not a
    number, or the date is not an ISO date.
    """

    input: float
    cache_write: float
    cache_read: float
    as_of: str

    def __post_init__(self) -> None:
        for name in ("input", "cache_write", "cache_read"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"price {name!r} must be a non-negative number, got {value!r}")
        if self.input <= 0:
            raise ValueError(f"price 'input' must be positive, got {self.input!r}")
        try:
            datetime.date.fromisoformat(self.as_of)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"price date 'as_of' must be an ISO date (YYYY-MM-DD), got {self.as_of!r}"
            ) from exc

    @property
    def read_ratio(self) -> float:
        """Cache-read price as a fraction of the input price (Anthropic: 0.1)."""
        return self.cache_read / self.input

    @property
    def write_ratio(self) -> float:
        """Cache-write price as a multiple of the input price (Anthropic: 1.25)."""
        return self.cache_write / self.input


_V = TypeVar("_V")

_ANTHROPIC = "2025-11-24"  # Anthropic's pricing page on the day Claude Opus 4.5 was published
_OPENAI = "2025-08-07"  # OpenAI's pricing page on the day GPT-5 was published


def _anthropic(base: float) -> Prices:
    # 5-minute cache writes cost 1.25x input, cache reads 0.1x (Anthropic's published rule).
    return Prices(base, round(base * 1.25, 6), round(base * 0.1, 6), _ANTHROPIC)


#: Input prices by model id or id prefix (longest prefix wins, as for windows), each dated.
#: Figures change: check the provider's page before relying on them, and override them
#: with ``StaticCatalog(prices={...})``.
DEFAULT_PRICES: Mapping[str, Prices] = {
    # Anthropic
    "claude-opus-4-5": _anthropic(5.0),
    "claude-opus-4-1": _anthropic(15.0),
    "claude-opus-4": _anthropic(15.0),
    "claude-sonnet-4-5": _anthropic(3.0),
    "claude-sonnet-4": _anthropic(3.0),
    "claude-haiku-4-5": _anthropic(1.0),
    "claude-3-7-sonnet": _anthropic(3.0),
    "claude-3-5-sonnet": _anthropic(3.0),
    "claude-3-5-haiku": _anthropic(0.8),
    "claude-3-opus": _anthropic(15.0),
    "claude-3-haiku": _anthropic(0.25),
    # OpenAI (no charge for writing the cache: cache_write equals input)
    "gpt-5": Prices(1.25, 1.25, 0.125, _OPENAI),
    "gpt-5-mini": Prices(0.25, 0.25, 0.025, _OPENAI),
    "gpt-5-nano": Prices(0.05, 0.05, 0.005, _OPENAI),
    "gpt-4.1": Prices(2.0, 2.0, 0.5, _OPENAI),
    "gpt-4.1-mini": Prices(0.4, 0.4, 0.1, _OPENAI),
    "gpt-4.1-nano": Prices(0.1, 0.1, 0.025, _OPENAI),
    "gpt-4o": Prices(2.5, 2.5, 1.25, _OPENAI),
    "gpt-4o-mini": Prices(0.15, 0.15, 0.075, _OPENAI),
    "o3": Prices(2.0, 2.0, 0.5, _OPENAI),
    "o4-mini": Prices(1.1, 1.1, 0.275, _OPENAI),
}


@runtime_checkable
class ModelCatalog(Protocol):
    """Knows context windows. ``window(model)`` returns ``None`` for an unknown model.

    A catalog may also know prices (``prices(model) -> Prices | None``, as
    :class:`StaticCatalog` does); one without that method is taken to know none, and the
    cost figures then use Anthropic's cache ratios (read 0.1x, write 1.25x of input).
    """

    def window(self, model: str) -> int | None:
        """The model's context window in tokens, or ``None`` when unknown."""
        ...


class StaticCatalog:
    """A catalog from a table: exact id first, then the longest matching id prefix.

    ``StaticCatalog(overrides={"my-model": 32_000})`` adds to (and overrides) the default
    table; ``StaticCatalog(windows, include_defaults=False)`` uses only ``windows``.
    ``prices={"my-model": Prices(...)}`` adds to (and overrides) the default prices the
    same way (a mapping ``{"input": .., "cache_write": .., "cache_read": .., "as_of": ..}``
    is accepted for a :class:`Prices`); ``include_defaults=False`` drops both defaults.
    """

    def __init__(
        self,
        overrides: Mapping[str, int] | None = None,
        *,
        include_defaults: bool = True,
        prices: Mapping[str, Prices | Mapping[str, object]] | None = None,
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
        price_table: dict[str, Prices] = dict(DEFAULT_PRICES) if include_defaults else {}
        for model, given in (prices or {}).items():
            if isinstance(given, Prices):
                price_table[model] = given
            elif isinstance(given, Mapping):
                try:
                    price_table[model] = Prices(**given)  # type: ignore[arg-type]
                except TypeError as exc:
                    raise ValueError(
                        f"catalog prices for {model!r}: give input, cache_write, cache_read "
                        f"and as_of ({exc})"
                    ) from exc
                except ValueError as exc:
                    raise ValueError(f"catalog prices for {model!r}: {exc}") from exc
            else:
                raise ValueError(
                    f"catalog prices for {model!r} must be a Prices or a mapping, got {given!r}"
                )
        self._prices = price_table
        self._price_prefixes = sorted(price_table, key=len, reverse=True)

    def window(self, model: str) -> int | None:
        """The window of ``model``: its exact id, else its longest known prefix."""
        return _lookup(self._table, self._prefixes, model)

    def prices(self, model: str) -> Prices | None:
        """The prices of ``model`` (exact id, else longest prefix), ``None`` when unknown."""
        return _lookup(self._prices, self._price_prefixes, model)

    def models(self) -> list[str]:
        """The ids and prefixes the table knows, sorted."""
        return sorted(self._table)


def _lookup(table: Mapping[str, _V], prefixes: list[str], model: str) -> _V | None:
    hit = table.get(model)
    if hit is not None:
        return hit
    base = model.rsplit("/", 1)[-1]  # "openrouter/anthropic/claude-..." style ids
    hit = table.get(base)
    if hit is not None:
        return hit
    for p in prefixes:
        if base.startswith(p) and base[len(p)] in "-@:.":
            return table[p]
    return None


def catalog_prices(catalog: object, model: str | None) -> Prices | None:
    """``catalog.prices(model)`` when the catalog knows prices and the model, else ``None``."""
    lookup = getattr(catalog, "prices", None)
    if model is None or not callable(lookup):
        return None
    found = lookup(model)
    return found if isinstance(found, Prices) else None


@functools.cache
def default_catalog() -> StaticCatalog:
    """The shared default catalog (the table above, as published on ``CATALOG_CHECKED``)."""
    return StaticCatalog()
