"""The official SDKs through the proxy to the loopback providers: answers, streams, errors
and headers reach the client as the upstream sent them; what the proxy cannot read, or
does not compact, reaches the upstream byte for byte."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import anthropic
import httpx
import openai
import pytest
from serve_support import root_of, served, servers, serving

KEY = "sk-loopback-secret-0123456789"
HELLO = [{"role": "user", "content": "Say hello."}]


def _ids_out(events: bytes) -> bytes:
    return re.sub(rb"chatcmpl-\d+", b"chatcmpl-N", events)


def _openai(base: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, **kwargs)


def test_openai_sync_chat_reaches_the_upstream_and_its_answer_the_client():
    with (
        servers.FakeProvider("openai", [{"text": "Hello there."}]) as up,
        serving(root_of(up), window=8_000) as proxy,
    ):
        raw = _openai(proxy).chat.completions.with_raw_response.create(
            model="gpt-4o", messages=HELLO
        )
        reply = raw.parse()
    assert reply.choices[0].message.content == "Hello there."
    assert raw.headers["x-request-id"] == "req_loopback_1"
    assert up.paths == ["/v1/chat/completions"]
    assert up.requests[0]["messages"] == HELLO
    assert up.headers[0]["authorization"] == f"Bearer {KEY}"


def test_openai_async_chat_and_responses_through_the_proxy():
    async def run(proxy: str) -> tuple[str | None, str]:
        client = openai.AsyncOpenAI(base_url=proxy + "/v1", api_key=KEY, max_retries=0)
        async with client:
            chat = await client.chat.completions.create(model="gpt-4o", messages=HELLO)
            resp = await client.responses.create(
                model="gpt-4o", input="Say hello again.", store=False
            )
        return chat.choices[0].message.content, resp.output_text

    script = [{"text": "Hello."}, {"text": "Hello again."}]
    with servers.FakeProvider("openai", script) as up, serving(root_of(up), window=8_000) as p:
        chat, responses = asyncio.run(run(p))
    assert (chat, responses) == ("Hello.", "Hello again.")
    assert up.paths == ["/v1/chat/completions", "/v1/responses"]
    assert up.requests[1]["input"] == "Say hello again."


def test_openai_stream_arrives_as_the_upstream_sent_its_events():
    script = [{"text": "Streamed.", "tools": [("read_file", {"path": "a.py"})]}]
    with servers.FakeProvider("openai", script) as up, serving(root_of(up), window=8_000) as p:
        tools = [
            {
                "type": "function",
                "function": {"name": "read_file", "parameters": {"type": "object"}},
            }
        ]
        stream = _openai(p).chat.completions.create(
            model="gpt-4o", messages=HELLO, tools=tools, stream=True
        )
        chunks = list(stream)
        # The same request sent straight to the upstream streams the same bytes.
        with httpx.stream(
            "POST",
            up.base_url + "/chat/completions",
            content=up.raw_bodies[0],
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        ) as direct:
            direct_bytes = direct.read()
        with httpx.stream(
            "POST",
            p + "/v1/chat/completions",
            content=up.raw_bodies[0],
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        ) as proxied:
            assert proxied.headers["content-type"] == "text/event-stream"
            proxied_bytes = proxied.read()
    assert chunks[0].choices[0].delta.content == "Streamed."
    assert chunks[0].choices[0].delta.tool_calls[0].function.name == "read_file"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # Byte for byte but the completion's id, which the upstream counts on.
    assert _ids_out(proxied_bytes) == _ids_out(direct_bytes)
    assert proxied_bytes.endswith(b"data: [DONE]\n\n")


def test_anthropic_sync_and_stream_through_the_proxy():
    script = [{"text": "Hi."}, {"text": "Streamed hi."}]
    with servers.FakeProvider("anthropic", script) as up, serving(root_of(up), window=8_000) as p:
        client = anthropic.Anthropic(base_url=p, api_key=KEY, max_retries=0)
        sync = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=512, system="Be brief.", messages=HELLO
        )
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=512, messages=HELLO
        ) as stream:
            texts = list(stream.text_stream)
            final = stream.get_final_message()
    assert sync.content[0].text == "Hi."
    assert "".join(texts) == "Streamed hi." == final.content[0].text
    assert final.stop_reason == "end_turn"
    assert up.requests[0]["system"] == "Be brief."
    assert up.headers[0]["authorization"] == f"Bearer {KEY}"  # this SDK's way


ERRORS = [
    (400, openai.BadRequestError, {"error": {"message": "bad", "type": "invalid_request_error"}}),
    (401, openai.AuthenticationError, {"error": {"message": "no key", "type": "auth"}}),
    (429, openai.RateLimitError, {"error": {"message": "slow down", "type": "rate_limit"}}),
    (500, openai.InternalServerError, {"error": {"message": "oops", "type": "server_error"}}),
]


@pytest.mark.parametrize(("status", "kind", "body"), ERRORS, ids=[str(e[0]) for e in ERRORS])
def test_upstream_errors_and_their_headers_reach_the_client_unchanged(status, kind, body):
    extra = {"retry-after": "7", "x-ratelimit-remaining-requests": "0", "x-request-id": "req_e"}
    with (
        servers.FakeProvider("openai", answers=[(status, body, extra)]) as up,
        serving(root_of(up), window=8_000) as proxy,
        pytest.raises(kind) as info,
    ):
        _openai(proxy).chat.completions.create(model="gpt-4o", messages=HELLO)
    assert info.value.status_code == status
    assert info.value.body == body["error"]
    headers = info.value.response.headers
    assert {k: headers[k] for k in extra} == extra
    assert headers["server"].startswith("BaseHTTP")  # the upstream's, not uvicorn's


def test_an_unreadable_body_is_forwarded_unchanged_and_logged(caplog):
    caplog.set_level(logging.INFO, logger="normandy_serve")
    junk = b'{"model": "gpt-4o", "messages": [ \xff not json'
    with servers.FakeProvider("openai") as up, serving(root_of(up), window=8_000) as proxy:
        answer = httpx.post(
            proxy + "/v1/chat/completions",
            content=junk,
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        )
    assert up.raw_bodies == [junk]
    assert answer.status_code == 400
    assert answer.json() == servers.not_json("openai")
    assert "forwarded unchanged: the body is not JSON" in caplog.text


def test_a_request_nothing_is_removed_from_reaches_the_upstream_byte_for_byte():
    body = b'{"model":"gpt-4o",  "messages":[{"role":"user","content":"Hi \\u00e9"}],"x":1}'
    with servers.FakeProvider("openai") as up, serving(root_of(up), window=8_000) as proxy:
        httpx.post(proxy + "/v1/chat/completions", content=body, headers={"authorization": "k"})
    assert up.raw_bodies == [body]


def test_other_paths_and_methods_and_count_tokens_are_forwarded_unchanged():
    count = json.dumps({"model": "claude-sonnet-4-5", "messages": HELLO}).encode()
    with servers.FakeProvider("anthropic") as up, serving(root_of(up), window=8_000) as proxy:
        models = httpx.get(proxy + "/v1/models?limit=3", headers={"x-api-key": KEY})
        counted = httpx.post(
            proxy + "/v1/messages/count_tokens", content=count, headers={"x-api-key": KEY}
        )
    assert models.json()["path"] == "/v1/models?limit=3"
    assert counted.status_code == 404  # the loopback provider does not count tokens
    assert up.paths == ["/v1/models", "/v1/messages/count_tokens"]
    assert up.raw_bodies == [b"", count]
    assert up.headers[0]["x-api-key"] == KEY


def test_the_health_endpoint_and_the_proxys_own_token():
    with (
        servers.FakeProvider("openai", [{"text": "Let in."}]) as up,
        serving(root_of(up), window=8_000, token="proxy-token") as proxy,
    ):
        health = httpx.get(proxy + "/normandy/health")
        with pytest.raises(openai.AuthenticationError) as refused:
            _openai(proxy).chat.completions.create(model="gpt-4o", messages=HELLO)
        admitted = _openai(
            proxy, default_headers={"X-Normandy-Token": "proxy-token"}
        ).chat.completions.create(model="gpt-4o", messages=HELLO)
    assert health.json() == {"status": "ok"}
    assert "X-Normandy-Token" in refused.value.message or "x-normandy-token" in str(
        refused.value.body
    )
    assert admitted.choices[0].message.content == "Let in."
    assert len(up.requests) == 1
    assert "x-normandy-token" not in up.headers[0]


def test_shutdown_lets_a_stream_in_flight_finish():
    with (
        servers.FakeProvider("openai", [{"text": "Slowly."}], event_pause=0.4) as up,
        served(root_of(up), window=8_000) as (proxy, server),
    ):
        stream = _openai(proxy).chat.completions.create(model="gpt-4o", messages=HELLO, stream=True)
        first = next(stream)
        server.should_exit = True  # what uvicorn's SIGTERM handler sets
        rest = list(stream)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # then the proxy goes down
            try:
                httpx.get(proxy + "/normandy/health", timeout=1)
            except httpx.ConnectError:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the proxy still answers 10 s after its shutdown began")
    assert first.choices[0].delta.content == "Slowly."
    assert rest[-1].choices[0].finish_reason == "stop"
