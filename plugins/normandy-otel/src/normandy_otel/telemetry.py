"""Spans and metrics of Normandy boundaries, through the OpenTelemetry API.

:func:`record` turns one boundary (what the ``on_boundary`` hook receives) into

- a span ``normandy.boundary`` for every boundary, from the moment the boundary began to
  the moment its result was final (hooks included), and, when the compactor compacted or
  the boundary failed after calling it, a child span ``normandy.compaction`` covering the
  compactor's own call; both of kind ``INTERNAL``, in the caller's current context (a
  turn's boundary nests under the application's span), with status ``ERROR`` and the
  error's text when the boundary failed;
- the metrics ``normandy.boundaries`` (counter), ``normandy.compactions`` (counter),
  ``normandy.compaction.tokens_removed`` (counter, tokens),
  ``normandy.compaction.duration`` (histogram, seconds),
  ``normandy.compaction.thinking_stripped`` (counter: compactions that stripped the
  thinking of messages they kept) and ``normandy.thinking_disabled_calls`` (counter: the
  turn loop's model calls sent with thinking disabled, counted at the boundary before
  each; ``BoundaryInfo.thinking_disabled``).

Attributes follow the OpenTelemetry GenAI semantic conventions where one exists
(``gen_ai.request.model``, ``gen_ai.provider.name`` and the older ``gen_ai.system`` when
the agent's client says which provider it calls, ``gen_ai.conversation.id``,
``error.type``) and are ``normandy.*`` otherwise.

The tracer and meter come from the global providers (``opentelemetry.trace`` and
``opentelemetry.metrics``), so nothing is recorded or exported unless the application
configured an SDK; then they follow it, even when it is set after this module was
imported. :func:`configure` points them at providers of your own instead.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from normandy_otel import names
from normandy_otel.names import provider_name

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

    from normandy_core import AgentConfig, BoundaryInfo, CompactionContext

__all__ = ["configure", "provider_name", "record"]


#: The counters of :class:`_Instruments`, in order: metric, unit, description.
_COUNTERS = (
    (
        names.METRIC_BOUNDARIES,
        "{boundary}",
        "Compaction boundaries, by outcome (compacted, skipped, failed).",
    ),
    (names.METRIC_COMPACTIONS, "{compaction}", "Compactions that took effect."),
    (
        names.METRIC_TOKENS_REMOVED,
        "{token}",
        "Tokens compactions took out of the context (before - after).",
    ),
    (
        names.METRIC_THINKING_STRIPPED,
        "{compaction}",
        "Compactions that stripped the thinking of messages they kept.",
    ),
    (
        names.METRIC_THINKING_DISABLED,
        "{call}",
        "Model calls sent with thinking disabled after a mid-round compaction stripped it.",
    ),
)


class _Instruments:
    """The tracer and the instruments, from the given providers or the global ones."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(names.SCOPE, names.VERSION, tracer_provider)
        meter = metrics.get_meter(names.SCOPE, names.VERSION, meter_provider)
        (
            self.boundaries,
            self.compactions,
            self.tokens_removed,
            self.thinking_stripped,
            self.thinking_disabled,
        ) = (
            meter.create_counter(metric, unit=unit, description=description)
            for metric, unit, description in _COUNTERS
        )
        self.duration = meter.create_histogram(
            names.METRIC_DURATION,
            unit="s",
            description="How long boundaries that compacted or failed took, hooks included.",
            explicit_bucket_boundaries_advisory=names.DURATION_BUCKETS,
        )


class _InUse:
    """The instruments :func:`record` uses: those :func:`configure` made, else the global
    providers' (made at the first boundary recorded)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instruments: _Instruments | None = None

    def set(self, instruments: _Instruments) -> None:
        """Record with ``instruments`` from now on."""
        with self._lock:
            self._instruments = instruments

    def get(self) -> _Instruments:
        """The instruments in use."""
        instruments = self._instruments
        if instruments is not None:
            return instruments
        with self._lock:
            if self._instruments is None:
                self._instruments = _Instruments()
            return self._instruments


_IN_USE = _InUse()


def configure(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> None:
    """Record with these providers from now on; ``None`` means the global one.

    Without a call, the global providers are used (the usual set-up: configure the SDK
    once in the application, ``trace.set_tracer_provider(...)`` and
    ``metrics.set_meter_provider(...)``). ``configure()`` with no arguments goes back
    to them.
    """
    _IN_USE.set(_Instruments(tracer_provider, meter_provider))


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def record(
    acc: AgentConfig,
    ctx: CompactionContext | None,
    meta: Mapping[str, Any],
    info: BoundaryInfo,
) -> None:
    """Emit the spans and metrics of one finished boundary (see the module docstring)."""
    ins = _IN_USE.get()
    model = ctx.model if ctx is not None else acc.model
    provider = provider_name(acc.client)
    measure: dict[str, Any] = {"normandy.compactor": info.compactor}
    if model:
        measure["gen_ai.request.model"] = model
    if provider:
        measure["gen_ai.provider.name"] = provider
    outcome = {**measure, "normandy.outcome": info.outcome}
    if info.error_type is not None:
        outcome["error.type"] = info.error_type
    ins.boundaries.add(1, outcome)
    if info.compacted:
        _count_compaction(ins, meta, measure)
    if info.thinking_disabled:
        ins.thinking_disabled.add(1, measure)
    if info.outcome != "skipped":
        ins.duration.record(info.duration, outcome)

    span = ins.tracer.start_span(
        names.BOUNDARY_SPAN, kind=SpanKind.INTERNAL, start_time=info.start_ns
    )
    if span.is_recording():
        attributes = _attributes(acc, ctx, meta, info, model, provider)
        span.set_attributes(attributes)
        _status(span, meta, info)
        if info.compactor_start is not None and info.outcome != "skipped":
            start = info.start_ns + _ns(info.compactor_start)
            child = ins.tracer.start_span(
                names.COMPACTION_SPAN,
                context=trace.set_span_in_context(span),
                kind=SpanKind.INTERNAL,
                start_time=start,
            )
            child.set_attributes(attributes)
            _status(child, meta, info)
            child.end(end_time=start + _ns(info.compactor_duration or 0.0))
    span.end(end_time=info.start_ns + _ns(info.duration))


def _count_compaction(ins: _Instruments, meta: Mapping[str, Any], measure: dict[str, Any]) -> None:
    """The counters of a compaction that took effect."""
    strategy = meta.get("strategy")
    done = {**measure, "normandy.strategy": strategy} if isinstance(strategy, str) else measure
    ins.compactions.add(1, done)
    before, after = meta.get("tokens_before"), meta.get("tokens_after")
    if isinstance(before, int) and isinstance(after, int) and before > after:
        ins.tokens_removed.add(before - after, done)
    if meta.get("thinking_stripped"):
        ins.thinking_stripped.add(1, done)


def _attributes(
    acc: AgentConfig,
    ctx: CompactionContext | None,
    meta: Mapping[str, Any],
    info: BoundaryInfo,
    model: str | None,
    provider: str | None,
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "normandy.compactor": info.compactor,
        "normandy.compactor.distribution": info.distribution,
        "normandy.compactor.version": info.version,
        "normandy.outcome": info.outcome,
        "normandy.compacted": info.compacted,
        "gen_ai.conversation.id": acc.session_id,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    if provider:
        attributes["gen_ai.provider.name"] = provider
        attributes["gen_ai.system"] = provider  # its name before semantic conventions 1.37
    if ctx is not None:
        attributes["normandy.mid_round"] = ctx.mid_round
        if ctx.window is not None:
            attributes["normandy.context_window"] = ctx.window
        if ctx.turn_id is not None:
            attributes["normandy.turn_id"] = ctx.turn_id
            # inside a turn, the boundary precedes one model call
            attributes["normandy.thinking_disabled"] = info.thinking_disabled
    if info.compacted:
        before, after = meta.get("tokens_before"), meta.get("tokens_after")
        if isinstance(before, int):
            attributes["normandy.tokens.before"] = before
        if isinstance(after, int):
            attributes["normandy.tokens.after"] = after
        if isinstance(before, int) and isinstance(after, int):
            attributes["normandy.tokens.removed"] = max(before - after, 0)
        turn = meta.get("tokens_removed")
        if isinstance(turn, int):
            attributes["normandy.tokens.turn_removed"] = turn
        strategy = meta.get("strategy")
        if isinstance(strategy, str):
            attributes["normandy.strategy"] = strategy
        attributes["normandy.dropped.count"] = len(meta.get("dropped") or ())
        attributes["normandy.thinking_stripped"] = bool(meta.get("thinking_stripped"))
        hook_errors = meta.get("hook_errors") or ()
        if hook_errors:
            attributes["normandy.hook_errors.count"] = len(hook_errors)
    error = meta.get("error")
    if info.failed:
        attributes["error.type"] = info.error_type or "_OTHER"
        if isinstance(error, str):
            attributes["normandy.error"] = error
    return attributes


def _status(span: Span, meta: Mapping[str, Any], info: BoundaryInfo) -> None:
    if info.failed:
        error = meta.get("error")
        span.set_status(Status(StatusCode.ERROR, error if isinstance(error, str) else None))
