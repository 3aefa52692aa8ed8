"""OpenTelemetry for Normandy: a span per boundary and per compaction, and metrics.

Install ``normandy-otel`` and every boundary of every agent (the turn loop's,
``normandy_core.compact()``'s, the ``normandy compact`` command's) is traced and
measured through the global OpenTelemetry providers: spans ``normandy.boundary`` and
``normandy.compaction``, metrics ``normandy.boundaries``, ``normandy.compactions``,
``normandy.compaction.tokens_removed``, ``normandy.compaction.duration``,
``normandy.compaction.thinking_stripped`` and ``normandy.thinking_disabled_calls``. Nothing is
recorded until the application configures the OpenTelemetry SDK; :func:`configure`
chooses other providers. See :mod:`normandy_otel.telemetry` for the attributes.

OpenTelemetry itself is imported only once the application uses it (``configure`` and
``record`` import it when first accessed), so an agent that never sets up OpenTelemetry
does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_otel.names import (
    BOUNDARY_SPAN,
    COMPACTION_SPAN,
    DURATION_BUCKETS,
    METRIC_BOUNDARIES,
    METRIC_COMPACTIONS,
    METRIC_DURATION,
    METRIC_THINKING_DISABLED,
    METRIC_THINKING_STRIPPED,
    METRIC_TOKENS_REMOVED,
    SCOPE,
    provider_name,
)

if TYPE_CHECKING:
    from normandy_otel.telemetry import configure, record

__version__ = "0.1.0"

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
    "__version__",
    "configure",
    "provider_name",
    "record",
]


def __getattr__(name: str) -> Any:
    """``configure`` and ``record``, from :mod:`normandy_otel.telemetry`, which imports
    OpenTelemetry: only once the application asks for them."""
    if name in ("configure", "record"):
        from normandy_otel import telemetry

        return getattr(telemetry, name)
    raise AttributeError(f"module 'normandy_otel' has no attribute {name!r}")
