"""The conformance kit (normandy_core.testing, its hypothesis properties included) over
both native compactors, each config holding a real SDK client on a loopback provider,
so generated conversations go through the provider's compaction (and the fallback)."""

from __future__ import annotations

import pytest
from native_helpers import MODELS, NAMES, client, servers

from normandy_core.testing import check_compactor

pytest.importorskip("anthropic", reason="needs the anthropic extra")
pytest.importorskip("openai", reason="needs the openai extra")

BAD = {
    "anthropic": [
        {"trigger_tokens": 49_999},
        {"nope": 1},
        {"fallback": "anthropic_native"},
        {"fallback": None, "fallback_opts": {}},
    ],
    "openai": [{"trigger_tokens": -1}, {"instructions": "x"}, {"fallback_opts": {"x": 1}}],
}


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_the_kit_over_the_native_compactor(kind: str) -> None:
    script = [{"text": f"Summary {k}."} for k in range(2_000)]  # for the summarize fallback
    with servers.FakeProvider(kind, script, max_requests=20_000, lifetime=900) as provider:
        check_compactor(
            NAMES[kind],
            {"reserved_tokens": 200, "counter": "cl100k_base"},
            bad_opts=BAD[kind],
            model=MODELS[kind],
            client=client(kind, provider),
        )
    # the provider compacted many of the generated conversations itself (53 each under
    # the ci profile), and refused no request: every compaction sent back was as made
    assert len(provider.issued) >= 20
    assert provider.refusals == []
