"""The proxy's metrics, through the OpenTelemetry API.

- ``normandy.proxy.requests`` (counter): requests relayed, by ``normandy.proxy.api``
  (``chat``, ``responses``, ``messages``, ``other``), ``normandy.proxy.outcome``
  (``compacted``, ``kept``: read and nothing removed, ``unchanged``: forwarded as it came
  without being read) and ``http.response.status_code`` (the upstream's; the proxy's own
  answers are not counted);
- ``normandy.proxy.tokens_removed`` (counter, tokens): what compaction took out, by API;
- ``normandy.proxy.added_duration`` (histogram, seconds): the time the proxy spent on a
  request before sending it upstream (reading, compacting, archiving), by API;
- ``normandy.proxy.overflow_retries`` (counter): requests sent again after the upstream
  refused them as too long, by API.

The meter comes from the global provider unless one is given (:func:`create_app`'s
``meter_provider``): nothing is recorded until an OpenTelemetry SDK is set up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import metrics

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

__all__ = ["SCOPE", "ProxyMetrics"]

#: The instrumentation scope: the meter's name.
SCOPE = "normandy_serve"
#: The API of each compacted path, as the metrics name it.
_APIS = {"openai": "chat", "responses": "responses", "anthropic": "messages"}
#: Bucket boundaries of the added time, in seconds: from a tenth of a millisecond.
_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ProxyMetrics:
    """The instruments of one proxy."""

    def __init__(self, provider: MeterProvider | None = None) -> None:
        meter = (provider or metrics.get_meter_provider()).get_meter(SCOPE)
        self._requests = meter.create_counter(
            "normandy.proxy.requests", "{request}", "Requests relayed, by API, outcome, status."
        )
        self._removed = meter.create_counter(
            "normandy.proxy.tokens_removed", "{token}", "Tokens compaction removed, by API."
        )
        self._added = meter.create_histogram(
            "normandy.proxy.added_duration",
            "s",
            "Time the proxy spent on a request before sending it upstream.",
            explicit_bucket_boundaries_advisory=list(_BUCKETS),
        )
        self._retries = meter.create_counter(
            "normandy.proxy.overflow_retries",
            "{request}",
            "Requests sent again after the upstream refused them as too long.",
        )

    @staticmethod
    def api(fmt: str | None) -> str:
        """The API a compacted format (or ``None``: another path) is counted under."""
        return "other" if fmt is None else _APIS[fmt]

    def relayed(self, fmt: str | None, outcome: str, status: int) -> None:
        """One request relayed with the upstream's ``status``."""
        attributes: dict[str, str | int] = {
            "normandy.proxy.api": self.api(fmt),
            "normandy.proxy.outcome": outcome,
            "http.response.status_code": status,
        }
        self._requests.add(1, attributes)

    def compacted(self, fmt: str, tokens_removed: int, added: float) -> None:
        """A request of format ``fmt`` prepared in ``added`` seconds, ``tokens_removed``
        taken out of it."""
        attributes = {"normandy.proxy.api": self.api(fmt)}
        if tokens_removed:
            self._removed.add(tokens_removed, attributes)
        self._added.record(added, attributes)

    def retried(self, fmt: str) -> None:
        """A request sent again after a refusal as too long."""
        self._retries.add(1, {"normandy.proxy.api": self.api(fmt)})
