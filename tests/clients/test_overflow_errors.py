"""Which SDK errors are a too-long refusal (``ContextOverflow``), read from the official
SDKs' own exception objects, made as the SDKs make them from a response."""

from __future__ import annotations

import httpx
import pytest

from normandy_core.clients.anthropic import anthropic_overflow
from normandy_core.clients.openai import openai_overflow

anthropic = pytest.importorskip("anthropic", reason="needs the anthropic extra")
openai = pytest.importorskip("openai", reason="needs the openai extra")

_REQUEST = httpx.Request("POST", "http://127.0.0.1/v1/messages")


def _anthropic(status: int, kind: str, message: str) -> Exception:
    """The error the Anthropic SDK raises for this response (it keeps the whole body)."""
    body = {"type": "error", "error": {"type": kind, "message": message}}
    response = httpx.Response(status, json=body, request=_REQUEST)
    kinds = {400: anthropic.BadRequestError, 413: anthropic.ContentTooLargeError}
    error: Exception = kinds.get(status, anthropic.RateLimitError)(
        message, response=response, body=body
    )
    return error


def _openai(status: int, code: str | None, message: str) -> Exception:
    """The error the OpenAI SDK raises for this response (it keeps the ``error`` object)."""
    error = {"message": message, "type": "invalid_request_error", "code": code}
    response = httpx.Response(status, json={"error": error}, request=_REQUEST)
    kind = openai.BadRequestError if status == 400 else openai.RateLimitError
    made: Exception = kind(message, response=response, body=error)
    return made


@pytest.mark.parametrize(
    ("status", "kind", "message", "figures"),
    [
        (
            400,
            "invalid_request_error",
            "prompt is too long: 210000 tokens > 200000 maximum",
            (210_000, 200_000),
        ),
        (
            400,
            "invalid_request_error",
            "input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, "
            "decrease input length or `max_tokens` and try again",
            (199_759, 191_808),
        ),
        (413, "request_too_large", "Request exceeds the maximum size", (None, None)),
    ],
)
def test_anthropic_refusals_as_too_long(status, kind, message, figures):
    overflow = anthropic_overflow(anthropic, _anthropic(status, kind, message))
    assert overflow is not None
    assert (overflow.status, overflow.code) == (status, kind)
    assert (overflow.size, overflow.limit) == figures


@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [
        (
            400,
            "invalid_request_error",
            "messages.1.content.0.text: text content blocks must be non-empty",
        ),
        (429, "rate_limit_error", "prompt is too long: 210000 tokens > 200000 maximum"),
        (413, "invalid_request_error", "Request exceeds the maximum size"),
    ],
)
def test_other_anthropic_errors_are_not(status, kind, message):
    assert anthropic_overflow(anthropic, _anthropic(status, kind, message)) is None


@pytest.mark.parametrize(
    ("message", "figures"),
    [
        (
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens. Please reduce the length of the messages.",
            (130_000, 128_000),
        ),
        (
            "This model's maximum context length is 8192 tokens. However, you requested 8334 "
            "tokens (338 in the messages, 7996 in the completion). Please reduce the length "
            "of the messages or completion.",
            (338, 196),
        ),
        (
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again.",
            (None, None),
        ),
    ],
)
def test_openai_context_length_exceeded(message, figures):
    overflow = openai_overflow(openai, _openai(400, "context_length_exceeded", message))
    assert overflow is not None
    assert (overflow.status, overflow.code) == (400, "context_length_exceeded")
    assert (overflow.size, overflow.limit) == figures


def test_openai_reads_the_code_not_the_message():
    """The same words without the code (a proxy's own refusal) are not taken for it."""
    message = (
        "This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in 9000 tokens."
    )
    assert openai_overflow(openai, _openai(400, None, message)) is None
    assert openai_overflow(openai, _openai(429, "context_length_exceeded", message)) is None
