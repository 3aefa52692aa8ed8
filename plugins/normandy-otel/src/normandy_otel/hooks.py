"""The ``otel`` hook plugin (entry point in ``normandy_core.hooks``): every boundary traced.

Loaded automatically once ``normandy-otel`` is installed; exclude it with
``NORMANDY_DISABLE_PLUGINS=otel``. It records through the OpenTelemetry API only, so it
costs next to nothing until the application configures an SDK (see
:mod:`normandy_otel.telemetry`). Until the application has imported OpenTelemetry at
all (it must, to configure it), the hook does not import it either.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from normandy_core import active_when, hookimpl

if TYPE_CHECKING:
    from collections.abc import Mapping

    from normandy_core import AgentConfig, BoundaryInfo, CompactionContext

__all__ = ["on_boundary"]

#: What the application imports to set up OpenTelemetry; the SDK imports them too.
_API_MODULES = ("opentelemetry.trace", "opentelemetry.metrics")
#: Whether the environment names a provider the API loads by itself (read once, when
#: the plugin is loaded at the first boundary: reading the environment at every boundary
#: cost more than the rest of the check).
_PROVIDER_NAMED = any(
    os.environ.get(v) for v in ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
)


def in_use() -> bool:
    """Whether OpenTelemetry may have been configured: its API was imported (by the
    application, the SDK, ``opentelemetry-instrument`` or :func:`normandy_otel.configure`),
    or a provider was named in the environment. Otherwise every span and metric would be
    a no-op, and the boundary is left alone: it does not call the hook then, nor build
    what the hook would receive (the hook's :func:`~normandy_core.active_when` gate)."""
    modules = sys.modules
    return _PROVIDER_NAMED or _API_MODULES[0] in modules or _API_MODULES[1] in modules


@hookimpl
@active_when(in_use)  # not even called while OpenTelemetry cannot have been set up
def on_boundary(
    acc: AgentConfig,
    ctx: CompactionContext | None,
    meta: Mapping[str, Any],
    info: BoundaryInfo,
) -> None:
    """Emit the boundary's spans and metrics (:func:`normandy_otel.telemetry.record`)."""
    if not in_use():
        return
    from normandy_otel.telemetry import record

    record(acc, ctx, meta, info)
