"""Calibrated token counting: correct a counter per model with what the provider reports.

A local counter is exact only for OpenAI's own encodings; for other models the
character estimate can be off either way (it under-counts code and JSON). Each model
reply reports the input tokens the provider counted; the turn shells feed that back
with :meth:`Calibration.observe`, comparing it with the counter's raw count of the same
request. :class:`CalibratedCounter` then scales the raw counts by the model's factor.

Factors are kept per model *and* counter (a ratio learned against one counter means
nothing for another), so a compactor and the shell share evidence when they count with
the same counter: the shells count with the compactor's ``counter`` option when it has
one, else with :func:`~normandy_core.default_counter_for` the model, which is also the
documented default of the window-sized compactors.

The rule, conservative on purpose: the factor is the **largest** ratio
``reported / estimated`` among the last ``window`` observations (requests of at least
``min_tokens`` estimated tokens), rounded up to a hundredth, and 1.0 before any
evidence. So a count is raised as far as any recent request showed it was low, and it
is lowered below the raw count only when *every* recent request showed an over-count,
and only by the smallest over-count seen, never below ``floor`` times the raw count.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from normandy_core.conversation.entries import Entry
    from normandy_core.conversation.memory import AgentMemory
    from normandy_core.conversation.tokens import TokenCounter

__all__ = ["CalibratedCounter", "Calibration", "calibrated_counter", "default_calibration"]


class Calibration:
    """Correction factors per model, learned from provider-reported input tokens.

    Thread-safe. ``window`` observations are kept per model; requests estimated under
    ``min_tokens`` are ignored (fixed overheads dominate them); the factor never goes
    below ``floor``.
    """

    def __init__(self, *, window: int = 8, min_tokens: int = 200, floor: float = 0.5) -> None:
        if window < 1 or min_tokens < 1 or not 0 < floor <= 1:
            raise ValueError("window and min_tokens must be positive and 0 < floor <= 1")
        self.window = window
        self.min_tokens = min_tokens
        self.floor = floor
        self._ratios: dict[tuple[str, str], deque[float]] = {}
        self._seen: dict[tuple[str, str], int] = {}
        # The factor of each key, recomputed when evidence arrives, so reading it (once per
        # counted entry on a compaction) is a dict look-up without the lock.
        self._factors: dict[tuple[str, str], float] = {}
        # The models with a factor, so a counter without evidence for its model is scaled
        # by 1.0 without naming its base (naming may load a tokenizer).
        self._evidence: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        # Bumped (under the lock) whenever the evidence changes: what a kept snapshot
        # of ``snapshot`` is checked against.
        self._version = 0
        self._snapshots: dict[tuple[str | None, str], tuple[int, dict[str, Any]]] = {}

    def observe(self, model: str, counter: str, estimated: int, reported: int) -> float:
        """Record that ``counter`` estimated a request at ``estimated``, billed ``reported``.

        Returns the factor afterwards. Ignored when either number is not positive or the
        request is smaller than ``min_tokens``.
        """
        if estimated >= self.min_tokens and reported > 0:
            key = (model, counter)
            with self._lock:
                ratios = self._ratios.setdefault(key, deque(maxlen=self.window))
                ratios.append(reported / estimated)
                self._seen[key] = self._seen.get(key, 0) + 1
                top = max(ratios)
                self._factors[key] = max(self.floor, math.ceil(top * 100 - 1e-9) / 100)
                if model not in self._evidence:
                    self._evidence = self._evidence | {model}
                self._version += 1
        return self.factor(model, counter)

    def factor(self, model: str | None, counter: str) -> float:
        """The correction factor of ``counter``'s counts for ``model`` (1.0 without evidence)."""
        if model is None:
            return 1.0
        return self._factors.get((model, counter), 1.0)

    def has_evidence(self, model: str | None) -> bool:
        """Whether any counter has a factor for ``model`` (else every factor is 1.0)."""
        return model is not None and model in self._evidence

    def snapshot(self, model: str | None, counter: str) -> dict[str, Any]:
        """What the factor rests on, for meta and events (JSON-ready; a new dict each call).

        Made again only when evidence arrived or was reset since the last snapshot of the
        same ``(model, counter)`` (the turn shells take one at every boundary); otherwise
        a copy of that one, equal to what making it again gives.
        """
        kept = self._snapshots.get((model, counter))
        if kept is None or kept[0] != self._version:
            kept = self._snapshot(model, counter)
            self._snapshots[(model, counter)] = kept
        snap = kept[1]
        return {**snap, "recent_ratios": list(snap["recent_ratios"])}

    def _snapshot(self, model: str | None, counter: str) -> tuple[int, dict[str, Any]]:
        """The snapshot made afresh, with the version of the evidence it rests on."""
        key = (model or "", counter)
        with self._lock:
            version = self._version
            ratios = list(self._ratios.get(key, ())) if model is not None else []
            seen = self._seen.get(key, 0) if model is not None else 0
            factor = self.factor(model, counter)
        return version, {
            "model": model,
            "counter": counter,
            "factor": factor,
            "observations": seen,
            "recent_ratios": [round(r, 4) for r in ratios],
        }

    def reset(self, model: str | None = None) -> None:
        """Forget the evidence for ``model`` (every model when ``None``)."""
        with self._lock:
            if model is None:
                self._ratios.clear()
                self._seen.clear()
                self._factors.clear()
            else:
                for key in [k for k in self._ratios if k[0] == model]:
                    del self._ratios[key]
                    self._seen.pop(key, None)
                    self._factors.pop(key, None)
            self._evidence = frozenset(m for m, _ in self._factors)
            self._version += 1


_DEFAULT = Calibration()


def default_calibration() -> Calibration:
    """The process-wide calibration the shells use unless given another."""
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
        """Whether :meth:`memory_tokens` of ``memory`` is at most ``tokens``: the cheap
        upper bound is asked first (:meth:`memory_bound`), so a memory well below needs no
        tokenizer."""
        bound = self.memory_bound(memory)
        if bound is not None and bound <= tokens:
            return True
        return self.memory_tokens(memory) <= tokens

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
        if self._unbounded:
            return None
        base = self.base
        upper = getattr(base, "upper_bound", None)
        bound = upper() if callable(upper) else None
        if bound is None:
            # Counting exactly is cheap now (a tokenizer, once loaded, stays loaded): the
            # boundaries that follow do not ask again.
            self._unbounded = True
            return None
        return math.ceil(memory.tokens(bound) * self.factor)

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
