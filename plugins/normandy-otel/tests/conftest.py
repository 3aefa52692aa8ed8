"""An OpenTelemetry SDK per test: in-memory span exporter and metric reader.

``normandy_otel.configure`` points the installed plugin at this test's providers, and
back at the global ones afterwards, so no test leaks spans into another.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import normandy_otel


@dataclass
class Telemetry:
    """What the SDK recorded: finished spans, and metric points by name."""

    tracer_provider: TracerProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Finished spans, oldest first, optionally only those called ``name``."""
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        """The data points of ``metric`` (cumulative since the test began)."""
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                if sm.scope.name != normandy_otel.SCOPE:
                    continue
                for m in sm.metrics:
                    if m.name == metric:
                        out.extend(m.data.data_points)
        return out

    def value(self, metric: str, **attributes: Any) -> Any:
        """The sum of ``metric``'s points whose attributes include ``attributes``."""
        total = 0
        for p in self.points(metric):
            if all(p.attributes.get(k) == v for k, v in attributes.items()):
                total += p.value
        return total


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    normandy_otel.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Telemetry(tracer_provider, exporter, reader)
    finally:
        normandy_otel.configure()
        tracer_provider.shutdown()
        meter_provider.shutdown()
