"""What a compaction costs with prompt caching: the billing model and the horizon estimate.

Providers cache the prefix of a request. The next call reads what the previous call sent
from the cache (Anthropic: 0.1x the input price) and writes the rest to it (1.25x). A
compaction changes the conversation from its *first changed message* on: everything after
that point is written again instead of read. This module holds that model, used by the
``cost`` schedule of the compactors and by the figures every compaction reports
(:func:`next_call_estimate`, the meta keys ``billed_next_with`` and
``billed_next_without``).

The model, stated once:

* The previous model call sent the system prompt, the tool definitions and every entry
  before the newest assistant entry (that entry and what follows it came after the call).
  All of it is in the cache (a cache that expired is not modelled). Before the first
  assistant entry nothing is cached.
* A call is billed ``read x cached + write x (sent - cached)`` in *billed tokens* (input
  tokens at the input price; multiply by ``Prices.input / 1e6`` for dollars), where
  ``cached`` is the longest prefix of what it sends that the previous call sent unchanged.
  A change of thinking blocks alone is no change (providers drop earlier turns' thinking
  from the prompt).
* Over the next calls the conversation grows by ``growth`` tokens per call, estimated
  from the session so far (:func:`growth_per_call`); when it would pass the limit it is
  compacted like the compaction being weighed (same size after, same tokens rewritten);
  the horizon is charged the share of the next such rewrite it has grown toward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from normandy_core.conversation.catalog import catalog_prices
from normandy_core.conversation.keys import is_compacted

if TYPE_CHECKING:
    from normandy_core.conversation.calibration import CalibratedCounter
    from normandy_core.conversation.entries import Entry
    from normandy_core.conversation.memory import AgentMemory

__all__ = [
    "DEFAULT_RATES",
    "CacheRates",
    "NextCall",
    "billed",
    "cached_until",
    "first_change",
    "growth_per_call",
    "horizon_cost",
    "next_call_estimate",
    "rates_for",
]


@dataclass(frozen=True, slots=True)
class CacheRates:
    """Cache prices as multiples of the input price: ``read`` (0.1) and ``write`` (1.25)."""

    read: float = 0.1
    write: float = 1.25


#: Anthropic's 5-minute cache: reads 0.1x, writes 1.25x the input price. Used for a model
#: the catalog has no prices for.
DEFAULT_RATES = CacheRates()


def rates_for(catalog: object, model: str | None) -> CacheRates:
    """The cache rates of ``model`` from ``catalog``'s prices, else :data:`DEFAULT_RATES`."""
    prices = catalog_prices(catalog, model)
    if prices is None:
        return DEFAULT_RATES
    return CacheRates(read=prices.read_ratio, write=prices.write_ratio)


def billed(cached: int, sent: int, rates: CacheRates) -> float:
    """Billed tokens of a call that sends ``sent`` tokens, ``cached`` of them read from cache."""
    cached = max(min(cached, sent), 0)
    return rates.read * cached + rates.write * (sent - cached)


def cached_until(entries: Sequence[Entry]) -> int | None:
    """How many leading entries the previous call sent: those before the newest assistant
    entry. ``None`` when there is no assistant entry (no call was made: nothing cached)."""
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].role == "assistant":
            return i
    return None


def first_change(old: Sequence[Entry], new: Sequence[Entry]) -> int:
    """The index of the first entry of ``new`` that differs from ``old`` at the same place
    (another id, or other content once thinking is set aside); ``min(len)`` when one is a
    prefix of the other."""
    n = min(len(old), len(new))
    for i in range(n):
        a, b = old[i], new[i]
        if a is b:
            continue
        if a.id != b.id or a.role != b.role:
            return i
        if a.content is b.content or a.content == b.content:
            continue
        if a.without_thinking().content != b.without_thinking().content:
            return i
    return n


def growth_per_call(entries: Sequence[Entry], sizes: Sequence[int], *, calls: int = 8) -> float:
    """Tokens the conversation grows per model call: what followed the ``calls``-th newest
    assistant entry (that entry included), per assistant entry, over the intact newest
    part of the session. 0.0 when there is no assistant entry."""
    seen = 0
    total = 0
    for i in range(len(entries) - 1, -1, -1):
        if is_compacted(entries[i]):
            break  # made or changed by a compaction: not how the session grows
        total += sizes[i]
        if entries[i].role == "assistant":
            seen += 1
            if seen == calls:
                break
    return total / seen if seen else 0.0


def horizon_cost(
    *,
    sent: int,
    cached: int,
    after_size: int,
    rewrite: int,
    growth: float,
    limit: int | None,
    calls: int,
    rates: CacheRates,
) -> float:
    """Billed tokens of the next ``calls`` calls under the model above.

    The first call sends ``sent`` tokens with ``cached`` read from cache. Each later call
    adds ``growth`` tokens, written once and read after; a call that would send more than
    ``limit`` (``None``: no limit) is preceded by a compaction to ``after_size`` tokens that
    rewrites ``rewrite`` of them. With a limit, the rewrite of the compaction after the
    horizon is charged for the share of the way to it the horizon has grown.
    """
    cost = billed(cached, sent, rates)
    size = float(sent)
    for _ in range(max(calls - 1, 0)):
        if limit is not None and size + growth > limit:
            kept = max(after_size - rewrite, 0)
            cost += rates.read * kept + rates.write * (after_size - kept)
            size = float(after_size)
        else:
            cost += rates.read * size + rates.write * growth
            size += growth
    if limit is not None and limit > after_size:
        # The horizon ends part of the way to the next compaction: charge that part of its
        # rewrite, so a plan is not favoured for leaving a rewrite just past the horizon.
        share = min(max((size - after_size) / (limit - after_size), 0.0), 1.0)
        cost += (rates.write - rates.read) * max(rewrite, 0) * share
    return cost


@dataclass(frozen=True, slots=True)
class NextCall:
    """The next call's estimated billed input with and without a compaction (meta keys)."""

    without: int
    with_: int
    kept: int

    def as_meta(self) -> dict[str, int]:
        """The meta keys: ``billed_next_without``, ``billed_next_with``,
        ``cache_kept_tokens``."""
        return {
            "billed_next_without": self.without,
            "billed_next_with": self.with_,
            "cache_kept_tokens": self.kept,
        }


def next_call_estimate(
    before: AgentMemory,
    after: AgentMemory,
    counter: CalibratedCounter,
    prompt_tokens: int,
    rates: CacheRates,
) -> NextCall:
    """The billed input of the next call without the compaction (``before`` sent as it is)
    and with it (``after`` sent), and how many cached tokens the compaction keeps."""
    old = before.entries()
    new = after.entries()
    until = cached_until(old)
    # the totals are kept incrementally: only the short tail after the newest assistant
    # entry and the prefix before the first change are counted here
    sent_old = prompt_tokens + counter.memory_tokens(before)
    cached_old = 0
    if until is not None:
        tail = sum(counter.entry_tokens(before, e) for e in old[until:])
        cached_old = max(sent_old - tail, 0)
    sent_new = prompt_tokens + counter.memory_tokens(after)
    kept = 0
    if until is not None:
        change = min(first_change(old, new), until)
        kept = prompt_tokens + sum(counter.entry_tokens(after, e) for e in new[:change])
        kept = min(kept, cached_old)
    return NextCall(
        without=round(billed(cached_old, sent_old, rates)),
        with_=round(billed(kept, sent_new, rates)),
        kept=kept,
    )
