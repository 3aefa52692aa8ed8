"""Options that need a model client are refused where the config is made when it has none
(issue 33 item 7): ``summarizer="model"`` used to be accepted and then fail at every
boundary ("needs a model client")."""

from __future__ import annotations

from typing import Any

import pytest

from normandy_core import AgentConfig, OptionsError, compact
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.conversation.entries import TextBlock

OPTS = {"strategy": "summarize", "summarizer": "model", "reserved_tokens": 500}
WINDOW = 5_000
MODEL_SUMMARY = {**OPTS, "context_window": WINDOW}


def _client() -> ScriptedClient:
    return ScriptedClient([ModelReply(content=(TextBlock(text="A summary."),))])


def test_agent_config_refuses_the_model_summarizer_without_a_client() -> None:
    with pytest.raises(OptionsError) as refused:
        AgentConfig(model="gpt-4o", compactor="window_manager", compactor_opts=MODEL_SUMMARY)
    text = str(refused.value)
    assert text.startswith("normandy_core.AgentConfig(): compactor 'window_manager'"), text
    assert "option 'summarizer' is 'model'" in text and "client=" in text, text
    assert "--client" in text, text
    given = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts=MODEL_SUMMARY,
        client=_client(),
    )
    assert given.client is not None


@pytest.mark.parametrize("summarizer", ["auto", "extractive"])
def test_summarizers_that_work_offline_need_no_client(summarizer: str) -> None:
    opts = {**MODEL_SUMMARY, "summarizer": summarizer}
    acc = AgentConfig(model="gpt-4o", compactor="window_manager", compactor_opts=opts)
    assert acc.client is None


def test_compact_refuses_before_reading_anything() -> None:
    with pytest.raises(OptionsError, match=r"^normandy_core\.compact\(\): .*'summarizer'"):
        compact(
            [{"role": "user", "content": "Go."}],
            model="gpt-4o",
            window=WINDOW,
            opts=OPTS,
            fresh=True,
        )


def test_every_copy_that_prepares_again_is_checked() -> None:
    acc = AgentConfig(model="gpt-4o", compactor="window_manager", client=_client())
    with pytest.raises(OptionsError, match=r"with_compactor.*'summarizer' is 'model'"):
        acc.replace(client=None).with_compactor("window_manager", MODEL_SUMMARY)
    assert acc.with_compactor("window_manager", MODEL_SUMMARY).client is not None


@pytest.mark.parametrize(
    ("compactor", "opts", "says"),
    [
        (
            "pipeline",
            {
                "steps": [
                    {"compactor": "clear_tool_results"},
                    {"compactor": "window_manager", "opts": OPTS},
                ]
            },
            "pipeline steps[1] ('window_manager'): option 'summarizer' is 'model'",
        ),
        (
            "openai_native",
            {"fallback_opts": {"strategy": "summarize", "summarizer": "model"}},
            "option 'fallback' ('window_manager'): option 'summarizer' is 'model'",
        ),
    ],
)
def test_compactors_that_run_window_manager_say_which_part_needs_the_client(
    compactor: str, opts: dict[str, Any], says: str
) -> None:
    options = {**opts, "context_window": WINDOW}
    with pytest.raises(OptionsError) as refused:
        AgentConfig(model="gpt-4o", compactor=compactor, compactor_opts=options)
    assert says in str(refused.value), refused.value
