"""``NormandyMiddleware`` recovers from the provider's too-long refusal around the model
call (``wrap_model_call``): LangChain's own fake chat model raises the Anthropic SDK's
error exactly as the SDK raises it from the API's 400, or LangChain's
``ContextOverflowError``; the call is made again once, compacted, and the state keeps
the compacted messages. A second refusal raises a ``ContextOverflow`` giving both."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from langchain.agents import create_agent
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from pydantic import Field

from normandy_core.clients import ContextOverflow
from normandy_langchain import NormandyMiddleware

anthropic = pytest.importorskip("anthropic", reason="the provider error of the tests")

LIMIT = 2_000
_REQUEST = httpx.Request("POST", "https://api.anthropic.com/v1/messages")


def _too_long(size: int, limit: int) -> Exception:
    """The error the Anthropic SDK raises for the Messages API's refusal."""
    message = f"prompt is too long: {size} tokens > {limit} maximum"
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    response = httpx.Response(400, json=body, request=_REQUEST)
    error: Exception = anthropic.BadRequestError(
        f"Error code: 400 - {body}", response=response, body=body
    )
    return error


class SmallWindowModel(GenericFakeChatModel):
    """LangChain's fake chat model behind a provider that allows ``limit`` tokens (three
    characters each): a longer request is refused as the provider refuses it."""

    limit: int = LIMIT
    langchain_error: bool = False
    refuse_all: bool = False
    sizes: list[int] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        size = sum(len(str(m.content)) for m in messages) // 3
        self.sizes.append(size)
        if self.refuse_all:  # whatever the size, as a provider over its window says
            raise _too_long(size, int(size * 0.9))
        if size > self.limit:
            if self.langchain_error:
                raise ContextOverflowError(f"prompt is too long: {size} tokens")
            raise _too_long(size, self.limit)
        return super()._generate(messages, *args, **kwargs)


def _history() -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for n in range(30):
        out.append(HumanMessage(f"step {n}: what did the deploy say? " * 4, id=f"h{n}"))
        out.append(AIMessage(f"step {n}: the deploy of service {n} went fine. " * 4, id=f"a{n}"))
    return out


def _agent(model: SmallWindowModel) -> Any:
    # The middleware believes the window is 50,000 tokens: only the refusal tells.
    middleware = NormandyMiddleware("window_manager", window=50_000, opts={"reserved_tokens": 0})
    return create_agent(model, [], system_prompt="Answer briefly.", middleware=[middleware])


@pytest.mark.parametrize("langchain_error", [False, True])
def test_a_refused_call_is_compacted_and_made_again(langchain_error: bool) -> None:
    model = SmallWindowModel(
        messages=iter([AIMessage("All services are up.")]), langchain_error=langchain_error
    )
    history = _history()
    state = _agent(model).invoke({"messages": [*history, HumanMessage("Status?")]})
    assert state["messages"][-1].content == "All services are up."
    assert len(model.sizes) == 2 and model.sizes[0] > LIMIT >= model.sizes[1]
    assert len(state["messages"]) < len(history) + 2  # the state took the compaction
    assert state["messages"][-2].content == "Status?"


def test_the_async_agent_recovers_the_same_way() -> None:
    model = SmallWindowModel(messages=iter([AIMessage("All services are up.")]))
    agent = _agent(model)
    state = asyncio.run(agent.ainvoke({"messages": [*_history(), HumanMessage("Status?")]}))
    assert state["messages"][-1].content == "All services are up."
    assert len(model.sizes) == 2


def test_a_second_refusal_raises_with_both_figures() -> None:
    model = SmallWindowModel(messages=iter([AIMessage("never")]), refuse_all=True)
    with pytest.raises(ContextOverflow, match="refused as too long again") as caught:
        _agent(model).invoke({"messages": [*_history(), HumanMessage("Status?")]})
    first, second = model.sizes
    figures = [f"{n:,} tokens > {int(n * 0.9):,} maximum" for n in (first, second)]
    assert ", then ".join(figures) in str(caught.value)
    assert isinstance(caught.value.__cause__, anthropic.BadRequestError)


def test_other_errors_go_up_untouched() -> None:
    class Broken(SmallWindowModel):
        def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            raise RuntimeError("provider down")

    with pytest.raises(RuntimeError, match="provider down"):
        _agent(Broken(messages=iter([]))).invoke({"messages": [HumanMessage("Status?")]})
