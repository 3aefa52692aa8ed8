"""The names normandy-otel records under: spans, metrics, the instrumentation scope.

Importing this module does not import OpenTelemetry.
"""

from __future__ import annotations

__all__ = [
    "BOUNDARY_SPAN",
    "COMPACTION_SPAN",
    "DURATION_BUCKETS",
    "METRIC_BOUNDARIES",
    "METRIC_COMPACTIONS",
    "METRIC_DURATION",
    "METRIC_THINKING_DISABLED",
    "METRIC_THINKING_STRIPPED",
    "METRIC_TOKENS_REMOVED",
    "SCOPE",
    "VERSION",
    "provider_name",
]

#: The instrumentation scope (tracer and meter name).
SCOPE = "normandy_otel"
#: The version the scope reports.
VERSION = "0.1.0"

#: The span of every boundary.
BOUNDARY_SPAN = "normandy.boundary"
#: The span of the compactor's call, at a boundary that compacted or failed after it.
COMPACTION_SPAN = "normandy.compaction"

#: Counter of boundaries, by ``normandy.outcome``.
METRIC_BOUNDARIES = "normandy.boundaries"
#: Counter of compactions that took effect.
METRIC_COMPACTIONS = "normandy.compactions"
#: Counter of the tokens compactions took out of the context (``tokens_before - tokens_after``).
METRIC_TOKENS_REMOVED = "normandy.compaction.tokens_removed"
#: Histogram of how long boundaries that compacted or failed took, in seconds.
METRIC_DURATION = "normandy.compaction.duration"
#: Counter of compactions that stripped the thinking of messages they kept.
METRIC_THINKING_STRIPPED = "normandy.compaction.thinking_stripped"
#: Counter of the turn loop's model calls sent with thinking disabled (the rest of a tool
#: round whose thinking a mid-round compaction stripped), one per boundary before such a call.
METRIC_THINKING_DISABLED = "normandy.thinking_disabled_calls"

#: Bucket boundaries (seconds) advised for the duration histogram: a cut takes
#: milliseconds, a summary by the model seconds.
DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)

#: ``gen_ai.provider.name`` of the core's model clients, by the module defining them.
_PROVIDERS = {
    "normandy_core.clients.anthropic": "anthropic",
    "normandy_core.clients.openai": "openai",
}


def provider_name(client: object) -> str | None:
    """``gen_ai.provider.name`` for an agent's model client, or ``None`` when unknown."""
    if client is None:
        return None
    return _PROVIDERS.get(type(client).__module__)
