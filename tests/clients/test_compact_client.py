"""``compact(..., client=...)`` and ``acompact(..., client=...)``: ``summarizer="model"``
outside the turn loop (issue 15), with the scripted client and the real SDK clients on the
loopback providers; the continuation memo tells clients apart by identity."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from normandy_core import OptionsError, TextBlock, compact
from normandy_core.clients import AnthropicClient, ModelReply, OpenAIClient, ScriptedClient
from normandy_core.transcripts.continuation import config_key
from normandy_core.transcripts.facade import acompact
from normandy_window_manager.summarize import SUMMARY_SYSTEM_PROMPT

servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py

SUMMARY = "The agent read m0.py to m5.py; each adds its index to x. No bug found yet."
OPTS = {"strategy": "summarize", "summarizer": "model", "reserved_tokens": 500}
WINDOW = 5_000


def chat(turns: int = 8, start: int = 0) -> list[dict[str, Any]]:
    """An OpenAI Chat Completions transcript of tool-using turns, well over :data:`WINDOW`."""
    out: list[dict[str, Any]] = []
    if start == 0:
        out.append({"role": "system", "content": "You are a coding agent."})
    for t in range(start, start + turns):
        out.append({"role": "user", "content": f"Look at m{t}.py."})
        call = {
            "id": f"call_{t}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"m{t}.py"})},
        }
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = f"def f{t}(x):\n    return x + {t}\n" * 60
        out.append({"role": "tool", "tool_call_id": f"call_{t}", "content": body})
        out.append({"role": "assistant", "content": f"m{t}.py adds {t}."})
    return out


def summary_reply(text: str = SUMMARY) -> ModelReply:
    return ModelReply(content=(TextBlock(text=text),))


def summaries(n: int) -> ScriptedClient:
    return ScriptedClient([summary_reply() for _ in range(n)])


def summary_of(result: Any) -> str:
    texts = [m["content"] for m in result.messages if isinstance(m.get("content"), str)]
    found = [t for t in texts if "[normandy:summary]" in t]
    assert len(found) == 1, texts
    return found[0]


def test_summarizer_model_needs_the_client_compact_now_takes() -> None:
    with pytest.raises(OptionsError, match="needs a model client"):
        compact(chat(), model="gpt-4o", window=WINDOW, opts=OPTS, fresh=True)

    client = summaries(1)
    result = compact(chat(), model="gpt-4o", window=WINDOW, opts=OPTS, fresh=True, client=client)
    assert result.error is None and result.compacted
    assert result.meta["strategy"] == "summarize"
    assert result.tokens_after < result.tokens_before
    assert summary_of(result).endswith("\n" + SUMMARY)
    (request,) = client.requests
    assert request.system == SUMMARY_SYSTEM_PROMPT
    assert request.model == "gpt-4o"  # the config's model, as in the turn loop
    assert "m0.py" in request.messages[0].text()  # the dropped messages, as data


def test_the_continuation_memo_tells_clients_apart_by_identity() -> None:
    a, b = summaries(5), summaries(5)
    first = chat()
    one = compact(first, model="gpt-4o", window=WINDOW, opts=OPTS, client=a)
    assert one.compacted and one.continued is False
    grown = [*one.messages, *chat(1, start=8)]
    other = compact(grown, model="gpt-4o", window=WINDOW, opts=OPTS, client=b)
    assert other.continued is False  # another client: not the continuation of a's call
    again = compact(
        [*other.messages, *chat(1, start=9)], model="gpt-4o", window=WINDOW, opts=OPTS, client=b
    )
    assert again.continued is True  # the same client continues its own call
    same = compact(
        [*one.messages, *chat(1, start=8)], model="gpt-4o", window=WINDOW, opts=OPTS, client=a
    )
    assert same.continued is True

    # no client is not client a either (a call without one is refused for these options)
    args = ("window_manager", OPTS, "gpt-4o", WINDOW, None, "auto")
    assert config_key(*args, a) == config_key(*args, a)
    assert config_key(*args, a) != config_key(*args, b)
    assert config_key(*args, a) != config_key(*args)


def test_acompact_passes_the_client() -> None:
    client = summaries(1)
    result = asyncio.run(
        acompact(chat(), model="gpt-4o", window=WINDOW, opts=OPTS, fresh=True, client=client)
    )
    assert result.compacted and summary_of(result).endswith("\n" + SUMMARY)
    assert len(client.requests) == 1


def make_client(kind: str, provider: Any) -> Any:
    if kind == "anthropic":
        return AnthropicClient(
            "claude-sonnet-4-5", api_key="test-key", base_url=provider.base_url, max_retries=0
        )
    return OpenAIClient("gpt-4o", api_key="test-key", base_url=provider.base_url, max_retries=0)


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_a_real_client_on_a_loopback_provider_writes_the_summary(kind: str) -> None:
    pytest.importorskip(kind, reason=f"needs the {kind} extra")
    model = "claude-sonnet-4-5" if kind == "anthropic" else "gpt-4o"
    with servers.FakeProvider(kind, [{"text": SUMMARY}]) as provider:
        client = make_client(kind, provider)
        result = compact(chat(), model=model, window=WINDOW, opts=OPTS, fresh=True, client=client)
    assert provider.refusals == []
    assert len(provider.requests) == 1
    body = provider.requests[0]
    assert body["model"] == model
    sent = json.dumps(body)
    assert json.dumps(SUMMARY_SYSTEM_PROMPT)[1:-1] in sent
    assert "m0.py" in sent and "<transcript>" in sent
    assert result.error is None and result.compacted
    assert summary_of(result).endswith("\n" + SUMMARY)


def test_acompact_runs_an_async_clients_summary_on_the_callers_loop() -> None:
    """A client on a shared ``httpx.AsyncClient`` works only on the loop that owns it:
    ``acompact`` runs the summary there, as ``arun_turn`` does."""
    anthropic = pytest.importorskip("anthropic", reason="needs the anthropic extra")
    try:  # the HTTP client the SDK is built on (httpx2 in newer SDKs, httpx before)
        import httpx2 as httpx
    except ImportError:  # pragma: no cover
        httpx = pytest.importorskip("httpx")

    with servers.FakeProvider("anthropic", [{"text": SUMMARY}]) as provider:
        provider.server.RequestHandlerClass.protocol_version = "HTTP/1.1"

        async def main() -> Any:
            async with httpx.AsyncClient() as shared:
                sdk = anthropic.AsyncAnthropic(
                    api_key="test-key",
                    base_url=provider.base_url,
                    http_client=shared,
                    max_retries=0,
                )
                client = servers.AsyncOnly(AnthropicClient("claude-sonnet-4-5", async_client=sdk))
                return await asyncio.wait_for(
                    acompact(
                        chat(),
                        model="claude-sonnet-4-5",
                        window=WINDOW,
                        opts=OPTS,
                        fresh=True,
                        client=client,
                    ),
                    timeout=60,
                )

        result = asyncio.run(main())
    assert result.error is None, result.error
    assert result.compacted and summary_of(result).endswith("\n" + SUMMARY)
    assert provider.refusals == [] and len(provider.requests) == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_normandy_compact_client_asks_the_provider_its_sdk_is_pointed_at(
    kind: str, tmp_path: Any
) -> None:
    """``normandy compact --client KIND``: the SDK reads its key and URL from its own
    environment variables, here pointing at the loopback provider."""
    pytest.importorskip(kind, reason=f"needs the {kind} extra")
    from tests.cli.conftest import run_cli, write_json

    model = "claude-sonnet-4-5" if kind == "anthropic" else "gpt-4o"
    src = write_json(tmp_path / "in.json", chat())
    out = tmp_path / "out.json"
    args = ["compact", str(src), "-o", str(out), "--model", model, "--window", str(WINDOW)]
    args += [f"--opt={k}={v}" for k, v in OPTS.items()]
    prefix = kind.upper()
    with servers.FakeProvider(kind, [{"text": SUMMARY}]) as provider:
        env = {f"{prefix}_API_KEY": "test-key", f"{prefix}_BASE_URL": provider.base_url}
        r = run_cli(*args, "--client", kind, env=env)
    assert r.code == 0, r
    assert "(strategy summarize)" in r.err
    assert provider.refusals == [] and len(provider.requests) == 1
    assert provider.requests[0]["model"] == model
    written = json.loads(out.read_text())
    summary = [m["content"] for m in written if "[normandy:summary]" in str(m.get("content"))]
    assert len(summary) == 1 and summary[0].endswith("\n" + SUMMARY)

    # without --client the model summarizer has no client: refused up front, exit 2
    r = run_cli(*args[:3], str(tmp_path / "none.json"), *args[4:])
    assert r.code == 2 and "option 'summarizer' is 'model'" in r.err, r
    assert not (tmp_path / "none.json").exists()
    r = run_cli("compact", str(src), "--client", kind, "--opt=strategy=summarize")
    assert r.code == 2 and f"--client {kind} needs --model" in r.err, r
