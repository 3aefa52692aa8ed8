"""The one prepare step: where a config is made, everything a boundary needs is decided once.

:func:`prepare` resolves the compactor by name, parses its options into its options model
(or freezes them), resolves the window (pinned or from the catalog), runs the compactor's
``validate_opts`` with that window, and chooses the counter. The result, a
:class:`Prepared`, travels on the :class:`~normandy_core.AgentConfig` and every boundary
builds ``ctx`` from it (:func:`normandy_core.build_context`) without validating again.
:class:`~normandy_core.AgentConfig`, :func:`normandy_core.compact`, the ``normandy``
command and the ``pipeline`` (for each of its steps) all prepare through here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from normandy_core.contract.types import CompactionContext
from normandy_core.errors import OptionsError, WindowUnknownError

if TYPE_CHECKING:
    from normandy_core.contract.compactor import Compactor
    from normandy_core.contract.recall_settings import RecallSettings
    from normandy_core.conversation.calibration import CalibratedCounter, Calibration
    from normandy_core.conversation.catalog import ModelCatalog
    from normandy_core.conversation.survival import SurvivalRules

__all__ = [
    "Prepared",
    "check_client",
    "check_recall",
    "pin_if_needed",
    "pin_window",
    "prepare",
    "whole_positive",
]


def whole_positive(value: Any) -> int | None:
    """``value`` as a positive int when it is one (``8000``, ``8000.0``, ``"8000"``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    try:
        number = int(value)
        whole = float(value) == number
    except (TypeError, ValueError, OverflowError):
        return None
    return number if whole and number > 0 else None


@dataclass(frozen=True)
class Prepared:
    """A compactor made ready for one config: resolved, options parsed, window and counter set.

    ``options`` is what ``maybe_compact`` receives (the options model's instance, or a
    read-only mapping); ``raw`` the options as configured; ``window`` the window it is
    given (``None`` when it needs none); ``counter_spec`` the counter it sizes with
    (``None``: the model's default, :func:`~normandy_core.default_counter_for`);
    ``calibration`` the agent's (``None``: the process-wide default); ``rules`` the
    config's survival rules (:class:`~normandy_core.SurvivalRules`), which every ``ctx``
    built from it carries; ``thresholds`` the levels the compactor's
    ``compaction_threshold`` hook declared for a turn start and a mid-round boundary
    (``None``: the boundary always calls ``maybe_compact``).
    """

    compactor: Compactor
    options: Any
    raw: Mapping[str, Any]
    window: int | None
    counter_spec: str | None
    calibration: Calibration | None = None
    rules: SurvivalRules = None  # type: ignore[assignment]  # filled in __post_init__
    thresholds: tuple[int | None, int | None] = (None, None)
    _counters: dict[tuple[str | None, int], CalibratedCounter] = field(
        default_factory=dict, repr=False, compare=False
    )
    #: Per kind of boundary (indexed by ``mid_round``): the last ctx and what it was asked with.
    _last_ctx: list[Any] = field(default_factory=lambda: [None, None], repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rules is None:
            from normandy_core.conversation.survival import DEFAULT_RULES

            object.__setattr__(self, "rules", DEFAULT_RULES)

    @property
    def name(self) -> str:
        """The compactor's configured name."""
        return self.compactor.name

    def counter_for(
        self, model: str | None, calibration: Calibration | None = None
    ) -> CalibratedCounter:
        """The calibrated counter of this config for ``model`` (one object per model).

        The base counter is resolved on first use, so a compactor that never counts (the
        default ``noop``) never loads a tokenizer.
        """
        cal = calibration or self.calibration
        key = (model, id(cal))
        hit = self._counters.get(key)
        if hit is None or (cal is not None and hit.calibration is not cal):
            from normandy_core.conversation.calibration import CalibratedCounter

            hit = CalibratedCounter(self.counter_spec, model, cal)
            self._counters[key] = hit
        return hit

    def context(
        self,
        *,
        mid_round: bool,
        model: str | None,
        prompt_tokens: int,
        turn_id: str | None = None,
        calibration: Calibration | None = None,
        rules: SurvivalRules | None = None,
        force: bool = False,
        focus: str | None = None,
    ) -> CompactionContext:
        """The ``ctx`` of one call of this compactor (see :func:`~normandy_core.build_context`).

        A boundary of the same kind asked the same way gets the same (immutable) ctx
        again: building one is most of what a boundary that does not compact costs beyond
        counting. One slot per kind, so a turn start between tool batches does not evict
        theirs. The calibration and rules are compared by identity (the slot holds them,
        so their ids cannot be reused). A forced boundary (rare, asked for) is never
        memoised, so the slots hold only scheduled ones.
        """
        slot = 1 if mid_round else 0
        last = None if force else self._last_ctx[slot]
        if last is not None:
            ctx, was = last
            if (
                was[3] is calibration
                and was[4] is rules
                and was[0] == model
                and was[1] == prompt_tokens
                and was[2] == turn_id
            ):
                return ctx  # type: ignore[no-any-return]
        counter = self.counter_for(model, calibration)
        # The request's own cost (the reply's priming) shares the window, once per request.
        tokens = prompt_tokens + counter.request_tokens if self.window is not None else 0
        ctx = CompactionContext(
            model=model,
            window=self.window,
            prompt_tokens=tokens,
            mid_round=mid_round,
            turn_id=turn_id,
            counter=counter,
            rules=self.rules if rules is None else rules,
            force=force,
            focus=focus if force else None,
        )
        if not force:
            self._last_ctx[slot] = (ctx, (model, prompt_tokens, turn_id, calibration, rules))
        return ctx


def pin_window(
    opts: Mapping[str, Any], window: int | None, *, entry: str, compactor: str
) -> dict[str, Any]:
    """``opts`` with ``context_window`` pinned to ``window`` (the ``window=`` argument of
    :func:`normandy_core.compact` and ``--window`` of the command line).

    Refused when ``window`` is not a positive int or contradicts a pinned
    ``context_window``. ``None`` leaves ``opts`` as they are (a copy).
    """
    out = dict(opts)
    if window is None:
        return out
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise OptionsError(f"{entry}: window must be a positive int, got {window!r}")
    pinned = out.get("context_window")
    if pinned is not None and pinned != window:
        raise OptionsError(
            f"{entry}: compactor {compactor!r}: window={window} contradicts the option "
            f"context_window={pinned}"
        )
    out["context_window"] = window
    return out


def pin_if_needed(
    compactor: str, opts: Mapping[str, Any], window: int | None, *, entry: str
) -> dict[str, Any]:
    """``opts`` with ``window`` pinned when compactor ``compactor`` sizes against a window.

    :func:`pin_window`'s checks apply either way; a compactor that needs no window gets
    ``opts`` unchanged (a copy).
    """
    from normandy_core.contract.plugins import resolve_compactor

    pinned = pin_window(opts, window, entry=entry, compactor=compactor)
    if window is None:
        return pinned
    comp = resolve_compactor(compactor)
    return pinned if comp.needs_window(comp.parse_options(opts, entry)) else dict(opts)


def _window(
    name: str,
    raw: Mapping[str, Any],
    *,
    entry: str,
    model: str | None,
    catalog: ModelCatalog | None,
    fallback: int | None,
    hint: str,
    memo: dict[str, int] | None,
) -> int:
    pinned = raw.get("context_window")
    if pinned is not None:
        window = whole_positive(pinned)
        if window is None:
            # The core reads this option itself, so it checks it for every compactor,
            # including one without an options model.
            raise OptionsError(
                f"{entry}: compactor {name!r} refused its options: option 'context_window': "
                f"the pinned context window must be a positive whole number of tokens "
                f"(got {pinned!r})"
            )
        return window
    if fallback is not None:
        return fallback
    if model is None:
        # The config's own hint says how to pin a window; a caller's (compact(), the
        # command line) names its model argument too.
        lead = "set model=... or " if hint == CONFIG_HINT else ""
        raise WindowUnknownError(
            f"{entry}: compactor {name!r} sizes against the model's context window, but the "
            f"config names no model; {lead}{hint}"
        )
    if catalog is None:
        raise WindowUnknownError(
            f"{entry}: compactor {name!r} sizes against the model's context window, but "
            f"there is no model catalog; {hint}"
        )
    if memo is not None and model in memo:
        return memo[model]
    window = catalog.window(model)
    if window is not None and memo is not None:
        memo[model] = window
    if window is None:
        raise WindowUnknownError(
            f"{entry}: compactor {name!r} needs the context window of model {model!r}, which "
            f"the model catalog does not know; {hint}"
        )
    return window


#: How to pin a window, in the vocabulary of :class:`~normandy_core.AgentConfig`.
CONFIG_HINT = (
    "pin it with compactor_opts={'context_window': <tokens>} or add the model to the "
    "catalog: StaticCatalog(overrides={'<model>': <tokens>})"
)


def prepare(
    compactor: str,
    opts: Mapping[str, Any] | None,
    *,
    entry: str,
    model: str | None = None,
    catalog: ModelCatalog | None = None,
    window: int | None = None,
    prompt_tokens: int = 0,
    calibration: Calibration | None = None,
    hint: str = CONFIG_HINT,
    memo: dict[str, int] | None = None,
    rules: SurvivalRules | Mapping[str, Any] | None = None,
) -> Prepared:
    """Resolve compactor ``compactor``, validate ``opts`` once, and fix its window and counter.

    :param entry: the public entry point that makes the config; every refusal begins with
        it and names the compactor.
    :param window: the window to give when the compactor needs one and pins none (a
        pipeline passes its own); otherwise ``catalog`` gives ``model``'s.
    :param prompt_tokens: the system prompt and tool definitions' estimate; a window they
        fill alone is refused.
    :param hint: how to pin a window, in the caller's vocabulary, for the error message.
    :param memo: catalog windows already resolved, per model (filled here): an agent's
        copies share one, so the catalog is asked once per agent and model.
    :param rules: the config's survival rules (``None``: the defaults), validated here and
        given to the compactor's ``validate_opts``, which refuses rules it cannot honour.
    :raises OptionsError: bad options or rules, or a window the options make unusable.
    :raises WindowUnknownError: the compactor needs a window and none can be found.
    :raises normandy_core.PluginError: the compactor is unknown, disabled or broken.
    """
    from normandy_core.contract.options import options_mapping
    from normandy_core.contract.plugins import resolve_compactor
    from normandy_core.conversation.survival import survival_rules

    survival = survival_rules(rules, entry=entry)
    comp = resolve_compactor(compactor)
    raw = MappingProxyType(dict(options_mapping(opts, entry=entry, compactor=compactor)))
    options = comp.parse_options(raw, entry)
    resolved: int | None = None
    if comp.needs_window(options):
        resolved = _window(
            compactor,
            raw,
            entry=entry,
            model=model,
            catalog=catalog,
            fallback=window,
            hint=hint,
            memo=memo,
        )
        if prompt_tokens >= resolved:
            raise OptionsError(
                f"{entry}: compactor {compactor!r}: the system prompt and tool definitions "
                f"alone take about {prompt_tokens:,} tokens of the {resolved:,}-token context "
                "window; pin a larger window (option 'context_window')"
            )
    comp.validate_opts(options, entry, resolved, survival)
    # Asked once here, for each kind of boundary (indexed by ``mid_round``): a boundary
    # then compares its running total with the level instead of calling the compactor.
    thresholds = (
        comp.compaction_threshold(options, resolved, False),
        comp.compaction_threshold(options, resolved, True),
    )
    spec = raw.get("counter")
    return Prepared(
        compactor=comp,
        options=options,
        raw=raw,
        window=resolved,
        counter_spec=spec if isinstance(spec, str) else None,
        calibration=calibration,
        rules=survival,
        thresholds=thresholds,
    )


#: How a config is given a model client, in the words of every entry point that makes one.
CLIENT_HINT = (
    "give the client where the config is made: client=... of AgentConfig(), compact() or "
    "the framework adapter, or --client (with --model) on the command line"
)


def check_client(prepared: Prepared, client: Any, *, entry: str) -> None:
    """Refuse, where the config is made, options that need a model client (the
    compactor's ``requires_client`` hook says which) when ``client`` is ``None``.

    :raises OptionsError: beginning with ``entry``, naming the compactor and the option.
    """
    if client is not None:
        return
    reason = prepared.compactor.requires_client(prepared.options)
    if reason is not None:
        raise OptionsError(
            f"{entry}: compactor {prepared.name!r} refused its options: {reason}; it "
            f"needs a model client and the config has none: {CLIENT_HINT}"
        )


def check_recall(
    settings: RecallSettings, tools: Sequence[Mapping[str, Any]], *, entry: str
) -> None:
    """Refuse a recall tool whose name a tool of ``tools`` has, or that has no source (no
    hook plugin implements ``recall_entries``)."""
    from normandy_core.contract.plugins import hook_callers
    from normandy_core.contract.recall_settings import HOOK

    for tool in tools:
        fn = tool.get("function")
        name = tool.get("name") or (fn.get("name") if isinstance(fn, Mapping) else None)
        if name == settings.tool_name:
            raise ValueError(
                f"{entry}: recall: tools already has a tool named {name!r}; rename it, or "
                "name the recall tool otherwise (RecallSettings(tool_name=...))"
            )
    if not hook_callers(HOOK):
        raise ValueError(
            f"{entry}: recall is on, but no hook plugin implements {HOOK} to search "
            "what compaction dropped: install normandy-archive (pip install "
            "normandy-archive), or check `normandy plugins` for why its archive hook "
            "did not load"
        )
