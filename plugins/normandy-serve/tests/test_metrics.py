"""The proxy's metrics, read from the OpenTelemetry SDK's in-memory reader: requests by
API, outcome and status, tokens removed, the time added before the upstream, and the
retries after a refusal as too long."""

from __future__ import annotations

from typing import Any

import httpx
import openai
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from serve_agents import KEY, OPTS, chat_agent, reads
from serve_support import root_of, servers, serving

from normandy_serve.metrics import SCOPE


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """The data points of the proxy's metric ``name``."""
    data = reader.get_metrics_data()
    return [
        point
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        if sm.scope.name == SCOPE
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def test_requests_compactions_added_time_and_retries_are_counted():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with (
        servers.FakeProvider("openai", reads(12), window=2_500, max_requests=200) as up,
        serving(root_of(up), provider, window=50_000, opts=OPTS) as proxy,
    ):
        chat_agent(openai.OpenAI(base_url=proxy + "/v1", api_key=KEY, max_retries=0), 13)
        httpx.get(proxy + "/v1/models", headers={"authorization": f"Bearer {KEY}"})
    requests = {
        (p.attributes["normandy.proxy.api"], p.attributes["normandy.proxy.outcome"],
         p.attributes["http.response.status_code"]): p.value
        for p in points(reader, "normandy.proxy.requests")
    }  # fmt: skip
    retries = sum(p.value for p in points(reader, "normandy.proxy.overflow_retries"))
    assert retries == len(up.refusals) >= 1
    assert requests[("other", "unchanged", 200)] == 1
    assert requests[("chat", "kept", 200)] >= 1  # the early requests fit
    assert requests[("chat", "compacted", 200)] >= retries
    assert sum(requests.values()) == len(up.requests) - retries  # each relayed once
    [removed] = points(reader, "normandy.proxy.tokens_removed")
    assert removed.value > 0
    [added] = points(reader, "normandy.proxy.added_duration")
    assert added.count == len(up.requests) - retries - 1  # every chat request, once
    assert 0 < added.sum < 30
