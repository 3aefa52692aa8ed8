"""Calibrated token counting: correct a counter with what a provider reports.

A local counter is exact only for OpenAI's own encodings; for other models the
character estimate can be off either way (it under-counts code and JSON). Each model
reply reports the input tokens the provider counted; the turn shells feed that back
with :meth:`Calibration.observe`, comparing it with the counter's raw count of the same
request. :class:`CalibratedCounter` then scales the raw counts by the factor learned.

Factors are kept per client endpoint, model and counter: a ratio learned against one
counter means nothing for another, and what one provider reports (a proxy that
under-reports, a server that counts its own way) says nothing about another. The
shells observe under their client's endpoint (:meth:`Calibration.for_endpoint`); a
config without a client (``compact()``, ``run_compaction``, the framework adapters)
uses the calibration unbound, which holds only what was observed without an endpoint
(by code of your own: the shells never do), and that evidence also stands for every
endpoint without evidence of its own for the model and counter.

The rule, conservative on purpose, over the last ``window`` observations (requests of
at least ``min_tokens`` estimated tokens):

- a count is raised as far as any recent request showed it was low: when one ratio
  ``reported / estimated`` is 1 or more, the factor is the largest, rounded up to a
  hundredth, but never above ``ceiling`` (4.0: a provider's figure that far above the
  counter's says more about the provider, or a proxy, than about the counter);
- it is lowered only by repeated, consistent evidence: at least ``agree``
  observations, every one an over-count no larger than ``1 / floor`` (a ratio below
  ``floor`` is taken for a provider that under-reports, not for a counter that
  over-counts, and blocks lowering while it is among them), all within ``spread`` of
  each other; then the factor is the largest of them, so never below ``floor``;
- otherwise, and before any evidence, 1.0.

And the boundary never skips on a factor below 1 (:meth:`CalibratedCounter.at_most`):
whatever was observed, a conversation the counter's own count puts over a compactor's
level is never taken for one under it.
"""

from __future__ import annotations

import copy
import math
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from normandy_core.conversation.entries import Entry
    from normandy_core.conversation.memory import AgentMemory
    from normandy_core.conversation.tokens import TokenCounter

__all__ = ["CalibratedCounter", "Calibration", "calibrated_counter", "default_calibration"]

#: What evidence is kept under: (endpoint, model, counter).
_Key = tuple["str | None", str, str]


class _Evidence:
    """The observations and factors that a calibration and its endpoint views share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ratios: dict[_Key, deque[float]] = {}
        self.seen: dict[_Key, int] = {}
        # The factor of each key, recomputed when evidence arrives, so reading it (once per
        # counted entry on a compaction) is a dict look-up without the lock.
        self.factors: dict[_Key, float] = {}
        # The (endpoint, model) pairs with a factor, so a counter without evidence for its
        # model is scaled by 1.0 without naming its base (naming may load a tokenizer).
        self.evidence: frozenset[tuple[str | None, str]] = frozenset()
        # Bumped (under the lock) whenever the evidence changes: what a kept snapshot is
        # checked against.
        self.version = 0
        self.snapshots: dict[_Key, tuple[int, dict[str, Any]]] = {}
        self.views: dict[str | None, Calibration] = {}


class Calibration:
    """Correction factors per client endpoint, model and counter, learned from the input
    tokens providers report.

    Thread-safe. ``window`` observations are kept per key; requests estimated under
    ``min_tokens`` are ignored (fixed overheads dominate them). A factor below 1 needs
    ``agree`` consistent observations (the smallest at least ``1 - spread`` of the
    largest) and is never below ``floor`` (0.75: the default counters count at most four
    characters of prose as the three of ``conservative``); a factor above 1 is never
    above ``ceiling``. This object observes and reads
    the evidence of one :attr:`endpoint`; :meth:`for_endpoint` gives the view of another,
    with the same rules and sharing the same evidence.
    """

    def __init__(
        self,
        *,
        window: int = 8,
        min_tokens: int = 200,
        floor: float = 0.75,
        agree: int = 3,
        spread: float = 0.1,
        ceiling: float = 4.0,
    ) -> None:
        if window < 1 or min_tokens < 1 or agree < 1 or not 0 < floor <= 1:
            raise ValueError("window, min_tokens and agree must be positive and 0 < floor <= 1")
        if not ceiling >= 1:
            raise ValueError("ceiling must be at least 1")
        if not 0 <= spread < 1:
            raise ValueError("spread must be at least 0 and below 1")
        self.window = window
        self.min_tokens = min_tokens
        self.floor = floor
        self.agree = agree
        self.spread = spread
        self.ceiling = ceiling
        #: The client endpoint this object observes for and reads (``None``: none known).
        self.endpoint: str | None = None
        self._evidence = _Evidence()
        self._evidence.views[None] = self

    def for_endpoint(self, endpoint: str | None) -> Calibration:
        """The view of this calibration's evidence for client ``endpoint`` (one object per
        endpoint, so it can be compared by identity; ``None``: no endpoint known)."""
        evidence = self._evidence
        view = evidence.views.get(endpoint)
        if view is None:
            with evidence.lock:
                view = evidence.views.get(endpoint)
                if view is None:
                    view = copy.copy(self)  # the same rules, sharing the evidence
                    view.endpoint = endpoint
                    evidence.views[endpoint] = view
        return view

    def observe(self, model: str, counter: str, estimated: int, reported: int) -> float:
        """Record that ``counter`` estimated a request to this endpoint at ``estimated``
        and the provider reported ``reported``.

        Returns the factor afterwards. Ignored when either number is not positive or the
        request is smaller than ``min_tokens``.
        """
        evidence = self._evidence
        if estimated >= self.min_tokens and reported > 0:
            key = (self.endpoint, model, counter)
            with evidence.lock:
                ratios = evidence.ratios.setdefault(key, deque(maxlen=self.window))
                ratios.append(reported / estimated)
                evidence.seen[key] = evidence.seen.get(key, 0) + 1
                evidence.factors[key] = self._factor_of(ratios)
                if (self.endpoint, model) not in evidence.evidence:
                    evidence.evidence = evidence.evidence | {(self.endpoint, model)}
                evidence.version += 1
        return self.factor(model, counter)

    def _factor_of(self, ratios: deque[float]) -> float:
        """The factor the recent ``ratios`` support (the rule of the module docstring)."""
        top = max(ratios)
        if top < 1.0 and not (
            len(ratios) >= self.agree and min(ratios) >= max(self.floor, top * (1.0 - self.spread))
        ):
            return 1.0
        return min(self.ceiling, max(self.floor, math.ceil(top * 100 - 1e-9) / 100))

    def factor(self, model: str | None, counter: str) -> float:
        """The correction factor of ``counter``'s counts for ``model`` at this endpoint:
        its own evidence's, else that observed without an endpoint, else 1.0."""
        if model is None:
            return 1.0
        factors = self._evidence.factors
        found = factors.get((self.endpoint, model, counter))
        return found if found is not None else factors.get((None, model, counter), 1.0)

    def has_evidence(self, model: str | None) -> bool:
        """Whether any counter has a factor for ``model`` at this endpoint or without one
        (else every factor is 1.0)."""
        if model is None:
            return False
        known = self._evidence.evidence
        return (self.endpoint, model) in known or (None, model) in known

    def snapshot(self, model: str | None, counter: str) -> dict[str, Any]:
        """What the factor rests on, for meta and events (JSON-ready; a new dict each call).

        Made again only when evidence arrived or was reset since the last snapshot of the
        same ``(model, counter)`` at this endpoint (the turn shells take one at every
        boundary); otherwise a copy of that one, equal to what making it again gives.
        """
        evidence = self._evidence
        slot = (self.endpoint, model or "", counter)
        kept = evidence.snapshots.get(slot)
        if kept is None or kept[0] != evidence.version:
            kept = self._snapshot(model, counter)
            evidence.snapshots[slot] = kept
        snap = kept[1]
        return {**snap, "recent_ratios": list(snap["recent_ratios"])}

    def _snapshot(self, model: str | None, counter: str) -> tuple[int, dict[str, Any]]:
        """The snapshot made afresh, with the version of the evidence it rests on."""
        evidence = self._evidence
        key = (self.endpoint, model or "", counter)
        with evidence.lock:
            version = evidence.version
            ratios = list(evidence.ratios.get(key, ())) if model is not None else []
            seen = evidence.seen.get(key, 0) if model is not None else 0
            factor = self.factor(model, counter)
        return version, {
            "endpoint": self.endpoint,
            "model": model,
            "counter": counter,
            "factor": factor,
            "observations": seen,
            "recent_ratios": [round(r, 4) for r in ratios],
        }

    def reset(self, model: str | None = None) -> None:
        """Forget the evidence for ``model`` (every model when ``None``), at every endpoint."""
        evidence = self._evidence
        with evidence.lock:
            if model is None:
                evidence.ratios.clear()
                evidence.seen.clear()
                evidence.factors.clear()
            else:
                for key in [k for k in evidence.ratios if k[1] == model]:
                    del evidence.ratios[key]
                    evidence.seen.pop(key, None)
                    evidence.factors.pop(key, None)
            evidence.evidence = frozenset((e, m) for e, m, _ in evidence.factors)
            evidence.version += 1


_DEFAULT = Calibration()


def default_calibration() -> Calibration:
    """The process-wide calibration the shells use unless given another (each turn
    observes under its client's endpoint, :meth:`Calibration.for_endpoint`)."""
    return _DEFAULT


class CalibratedCounter:
    """A :class:`~normandy_core.TokenCounter` that scales ``base`` by a model's factor.

    Each count is the raw count times the current factor, rounded up. ``name`` includes
    the factor (so a memory's per-counter cache never mixes factors) and is the base's
    own name while the factor is 1.0. On the hot path use :meth:`memory_tokens` and
    :meth:`entry_tokens`, which scale the memory's own cached counts for ``base`` and
    never recount when the factor moves.
    """

    def __init__(
        self,
        base: TokenCounter | str | None,
        model: str | None,
        calibration: Calibration | None = None,
    ) -> None:
        self._given = base
        self.model = model
        self.calibration = calibration or _DEFAULT
        self._unbounded = False  # base offers no upper bound (any more): see memory_bound

    @property
    def base(self) -> TokenCounter:
        """The counter being calibrated, resolved on first use.

        Given as a counter, a spec (:func:`~normandy_core.get_counter`) or ``None`` (the
        model's default, :func:`~normandy_core.default_counter_for`), so preparing a
        counter that is never used loads no tokenizer.
        """
        base = self._given
        if base is None or isinstance(base, str):
            from normandy_core.conversation.tokens import default_counter_for, get_counter

            base = get_counter(base if base is not None else default_counter_for(self.model))
            self._given = base
        return base

    @property
    def factor(self) -> float:
        """The current factor of ``base`` for the model (1.0 without evidence for the
        model, found without naming ``base``, so without loading its tokenizer)."""
        calibration = self.calibration
        if not calibration.has_evidence(self.model):
            return 1.0
        return calibration.factor(self.model, self.base.name)

    @property
    def name(self) -> str:
        """``base.name``, with ``*<factor>`` appended when the factor is not 1.0."""
        f = self.factor
        return self.base.name if f == 1.0 else f"{self.base.name}*{f:.2f}"

    @property
    def request_tokens(self) -> int:
        """What every request costs once besides its messages (the reply's priming), uncalibrated.

        The base counter's ``request_tokens``; for one not resolved yet (a spec, or the
        model's default), :data:`~normandy_core.conversation.tokens.REPLY_PRIMING`, which every
        built-in counter uses, so asking loads no tokenizer.
        """
        base = self._given
        if base is not None and not isinstance(base, str):
            value = getattr(base, "request_tokens", None)
            if isinstance(value, int) and value >= 0:
                return value  # the hot path: no import statement run at every boundary
        from normandy_core.conversation.tokens import REPLY_PRIMING

        return REPLY_PRIMING

    def raw_entry(self, entry: Entry) -> int:
        """The base counter's count of ``entry`` (not cached: entries of a memory are
        counted through :meth:`entry_tokens`, which uses the memory's cache)."""
        return self.base.count_entry(entry)

    def memory_tokens(self, memory: AgentMemory) -> int:
        """The calibrated total of ``memory``'s active branch.

        Scales the memory's incremental total for ``base``, so it costs what
        ``memory.tokens(base)`` costs: only entries added since the last call are
        counted, whatever the factor did meanwhile. Prefer it on the hot path.
        """
        base = self._given
        if base is None or isinstance(base, str):
            base = self.base
        n = memory.tokens(base)
        model, calibration = self.model, self.calibration
        if not calibration.has_evidence(model):
            return n  # the factor is 1.0 (as in ``factor``)
        f = calibration.factor(model, base.name)
        return n if f == 1.0 else math.ceil(n * f)

    def at_most(self, memory: AgentMemory, tokens: int) -> bool:
        """Whether ``memory`` is at most ``tokens``, counted as :meth:`memory_tokens`
        counts and as ``base`` counts alike: what the boundary skips on, so a factor below
        1 never makes a conversation that ``base`` puts over ``tokens`` look under it.

        The cheap upper bound is asked first (:meth:`memory_bound`), so a memory well
        below needs no tokenizer.
        """
        scale = max(self.factor, 1.0)
        bound = self._raw_bound(memory)
        if bound is not None and math.ceil(bound * scale) <= tokens:
            return True
        base = self._given
        if base is None or isinstance(base, str):
            base = self.base
        return math.ceil(memory.tokens(base) * scale) <= tokens

    def memory_bound(self, memory: AgentMemory) -> int | None:
        """An upper bound of :meth:`memory_tokens` that loads no tokenizer, or ``None``.

        While ``base`` offers one (:meth:`~normandy_core.TiktokenCounter.upper_bound`:
        UTF-8 bytes while its encoding is not loaded), the bound's total of the active
        branch (kept incrementally by the memory, like every count) scaled by the same
        factor; ``None`` when ``base`` has no bound or counts cheaply already (then it is
        not asked again: a tokenizer once loaded stays loaded). A window
        check that finds even the bound below its threshold can skip without counting;
        never report it as a token figure.
        """
        bound = self._raw_bound(memory)
        return None if bound is None else math.ceil(bound * self.factor)

    def _raw_bound(self, memory: AgentMemory) -> int | None:
        """:meth:`memory_bound` before the factor."""
        if self._unbounded:
            return None
        upper = getattr(self.base, "upper_bound", None)
        bound = upper() if callable(upper) else None
        if bound is None:
            # Counting exactly is cheap now (a tokenizer, once loaded, stays loaded): the
            # boundaries that follow do not ask again.
            self._unbounded = True
            return None
        return memory.tokens(bound)

    def entry_tokens(self, memory: AgentMemory, entry: Entry) -> int:
        """The calibrated count of ``entry``, from ``memory``'s cache for ``base``."""
        return math.ceil(memory.entry_tokens(entry, self.base) * self.factor)

    def count_text(self, text: str) -> int:
        """The calibrated count of ``text``."""
        return math.ceil(self.base.count_text(text) * self.factor)

    def count_entry(self, entry: Entry) -> int:
        """The calibrated count of one message."""
        return math.ceil(self.raw_entry(entry) * self.factor)

    def __repr__(self) -> str:
        return f"<CalibratedCounter {self.base.name} model={self.model} x{self.factor:.2f}>"


def calibrated_counter(
    base: TokenCounter, model: str | None, calibration: Calibration | None = None
) -> CalibratedCounter:
    """``base`` calibrated for ``model`` (the default calibration unless one is given).

    A compactor sizing against the window wraps its counter with this to use the counts
    the shells have calibrated: ``calibrated_counter(get_counter(spec), ctx.model)``,
    then sizes with ``memory_tokens(acc.memory)`` and ``entry_tokens(acc.memory, e)``.
    """
    return CalibratedCounter(base, model, calibration)
