"""A malformed pipeline step is refused in one error naming the step and showing the
accepted shape (issue 33 item 8): ``steps = ["clear_tool_results", "window_manager"]``
gave one error per step and pydantic's "Tuple should have at least 1 item after
validation, not 0"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import AgentConfig, OptionsError

STEP_SHAPE = '{"compactor": "<name>", "opts": {...}}'

GOOD = {"compactor": "clear_tool_results"}

malformed = st.one_of(
    st.sampled_from(["clear_tool_results", "window_manager", ""]),
    st.integers(),
    st.none(),
    st.tuples(st.just("window_manager")),
    st.just({"opts": {}}),
    st.just({"compactor": "window_manager", "optz": {}}),
    st.just({"compactor": "window_manager", "opts": 3}),
    st.just({"compactor": ""}),
)


def _refusal(steps: Any) -> str:
    with pytest.raises(OptionsError) as refused:
        AgentConfig(
            model="gpt-4o",
            compactor="pipeline",
            compactor_opts={"steps": steps, "context_window": 8_000},
        )
    return str(refused.value)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just(GOOD), malformed), min_size=1, max_size=4))
def test_one_error_names_every_malformed_step_and_the_shape(steps: list[Any]) -> None:
    bad = [i for i, step in enumerate(steps) if step is not GOOD]
    if not bad:
        return  # only good steps: accepted (checked below)
    text = _refusal(steps)
    header, *lines = text.splitlines()
    assert header == "normandy_core.AgentConfig(): compactor 'pipeline' refused its options:"
    assert len(lines) == 1 and lines[0].startswith("  option 'steps': "), text
    assert all(f"steps[{i}] " in text for i in bad), text
    assert all(f"steps[{i}] " not in text for i in set(range(len(steps))) - set(bad)), text
    assert STEP_SHAPE in text and "Tuple should" not in text, text


def test_steps_given_as_names_are_shown_as_steps() -> None:
    text = _refusal(["clear_tool_results", "window_manager"])
    assert "steps[0] 'clear_tool_results': a str, not a mapping" in text, text
    fixed = 'steps=[{"compactor": "clear_tool_results"}, {"compactor": "window_manager"}]'
    assert fixed in text, text
    AgentConfig(
        model="gpt-4o",
        compactor="pipeline",
        compactor_opts={"steps": [GOOD, {"compactor": "window_manager"}], "context_window": 8_000},
    )


@pytest.mark.parametrize("steps", [[], "window_manager", {"compactor": "window_manager"}])
def test_steps_that_are_not_a_list_of_steps(steps: Any) -> None:
    text = _refusal(steps)
    assert len(text.splitlines()) == 2 and STEP_SHAPE in text, text


def test_a_file_with_steps_as_names_names_the_file_and_the_step(tmp_path: Path) -> None:
    path = tmp_path / "normandy.toml"
    path.write_text(
        'compactor = "pipeline"\nmodel = "gpt-4o"\nwindow = 8000\n'
        '[opts]\nsteps = ["clear_tool_results", "window_manager"]\n'
    )
    with pytest.raises(OptionsError) as refused:
        AgentConfig.from_file(path)
    text = str(refused.value)
    assert str(path) in text and "steps[1] 'window_manager'" in text, text
    assert STEP_SHAPE in text and "Tuple should" not in text, text
