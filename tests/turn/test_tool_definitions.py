"""Tool definitions derived from typed Python callables (issue 15).

``run_turn`` used to send ``tools == ()`` when given callables without definitions, so a
real model never called a tool and nothing said why. Now a callable that ``acc.tools``
does not define gets a definition from its signature and docstring, the request carries
it, and a callable left undefined beside defined tools is named in a warning.
"""

from __future__ import annotations

import asyncio
import functools
import warnings
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

from normandy_core import AgentConfig, TextBlock, ToolUseBlock
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.turn import (
    ToolDefinitionError,
    UndeclaredToolWarning,
    arun_turn,
    run_turn,
    tool_definition,
)


def search(
    query: str,
    limit: int = 10,
    path: str | None = None,
    kinds: list[str] | None = None,
    mode: Literal["fast", "exact"] = "fast",
) -> str:
    """Search the repository for a text.

    Returns the matching lines, one per line.

    Args:
        query: The text to look for.
        limit: How many matches at most;
            the rest is cut.
        path: Only under this directory.
        kinds (list[str]): File extensions to search, such as ``["py", "md"]``.
        mode: ``exact`` matches case and spacing.
    """
    return f"{mode} {query!r} in {path or '.'} ({', '.join(kinds or ['*'])}): {limit} max"


SEARCH = {
    "name": "search",
    "description": "Search the repository for a text.",
    "input_schema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "The text to look for."},
            "limit": {
                "type": "integer",
                "default": 10,
                "description": "How many matches at most; the rest is cut.",
            },
            "path": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "default": None,
                "description": "Only under this directory.",
            },
            "kinds": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
                "description": 'File extensions to search, such as ``["py", "md"]``.',
            },
            "mode": {
                "type": "string",
                "enum": ["fast", "exact"],
                "default": "fast",
                "description": "``exact`` matches case and spacing.",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
}

READ_FILE = {
    "name": "read_file",
    "description": "Read a file.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def read_file(path: str) -> str:
    return f"contents of {path}"


def sphinx_style(count: int, labels: list[str], verbose: bool = False) -> str:
    """Label things.

    :param count: How many.
    :param list[str] labels: The labels,
        in order.
    :returns: a report.
    """
    return f"{count} {labels} {verbose}"


def numpy_style(x: float, y: float = 0.0) -> float:
    """Add two numbers.

    Parameters
    ----------
    x : float
        The first.
    y : float, optional
        The second.

    Returns
    -------
    float
    """
    return x + y


def annotated(
    n: Annotated[int, Field(ge=0, description="A count, from the annotation.")],
    schema: str = "",
) -> str:
    return f"{n} {schema}"


class Opaque:
    pass


def takes_opaque(thing: Opaque) -> str:
    return "?"


def positional(a: int, /) -> int:
    return a


def test_the_schema_of_a_typed_function() -> None:
    assert tool_definition(search) == SEARCH


def test_docstring_styles_and_annotations_describe_parameters() -> None:
    sphinx = tool_definition(sphinx_style)
    assert sphinx["description"] == "Label things."
    props = sphinx["input_schema"]["properties"]
    assert props["count"] == {"type": "integer", "description": "How many."}
    assert props["labels"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "The labels, in order.",
    }
    assert props["verbose"] == {"type": "boolean", "default": False}
    assert sphinx["input_schema"]["required"] == ["count", "labels"]

    numpy = tool_definition(numpy_style)
    assert numpy["description"] == "Add two numbers."
    assert numpy["input_schema"]["properties"] == {
        "x": {"type": "number", "description": "The first."},
        "y": {"type": "number", "default": 0.0, "description": "The second."},
    }

    # Field(...) in Annotated; a parameter named like a pydantic attribute; no docstring
    plain = tool_definition(annotated, name="count_things")
    assert plain == {
        "name": "count_things",
        "input_schema": {
            "type": "object",
            "properties": {
                "n": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "A count, from the annotation.",
                },
                "schema": {"type": "string", "default": ""},
            },
            "required": ["n"],
            "additionalProperties": False,
        },
    }
    # a partial: the bound argument's default shows, the function's name and docstring
    part = tool_definition(functools.partial(numpy_style, y=2.0))
    assert part["name"] == "numpy_style"
    assert part["input_schema"]["properties"]["y"]["default"] == 2.0


def test_what_cannot_be_derived_is_refused_naming_the_tool_and_parameter() -> None:
    with pytest.raises(ToolDefinitionError, match=r"tool 'takes_opaque': parameter 'thing'"):
        tool_definition(takes_opaque)
    with pytest.raises(
        ToolDefinitionError, match=r"tool 'positional': parameter 'a' is positional-only"
    ):
        tool_definition(positional)
    # ...before the turn sends anything
    client = ScriptedClient([])
    with pytest.raises(ToolDefinitionError, match="takes_opaque"):
        run_turn(AgentConfig(), "Go.", client=client, tools=[takes_opaque])
    assert client.requests == []


def calls(*uses: ToolUseBlock) -> ModelReply:
    return ModelReply(content=uses)


def answer(text: str) -> ModelReply:
    return ModelReply(content=(TextBlock(text=text),))


def test_run_turn_sends_the_derived_definitions_and_keeps_them_in_its_result() -> None:
    use = ToolUseBlock(id="s1", name="search", input={"query": "round(", "kinds": ["py"]})
    client = ScriptedClient([calls(use), answer("Found it.")])
    agent = AgentConfig(model="gpt-4o", system_prompt="You are a coding agent.")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndeclaredToolWarning)  # only callables: no warning
        result = run_turn(agent, "Where is round used?", client=client, tools=[search])
    assert [list(r.tools) for r in client.requests] == [[SEARCH], [SEARCH]]
    output = result.acc.memory.entries()[2].tool_results[0].text()
    assert output == "fast 'round(' in . (py): 10 max"  # the model could call it
    assert result.acc.tools == (SEARCH,)
    assert agent.tools == ()  # the caller's config is unchanged
    assert result.acc.prompt_tokens > agent.prompt_tokens  # the compactor counts them

    # the next turn finds them defined: nothing derived again, no warning
    client2 = ScriptedClient([answer("Done.")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndeclaredToolWarning)
        again = run_turn(result.acc, "Thanks.", client=client2, tools={"search": search})
    assert again.acc.tools == (SEARCH,)
    assert client2.requests[0].tools == (SEARCH,)


def test_a_callable_left_undefined_beside_defined_tools_is_named_in_a_warning() -> None:
    client = ScriptedClient([answer("Nothing to do.")])
    agent = AgentConfig(model="gpt-4o", tools=[READ_FILE])
    with pytest.warns(UndeclaredToolWarning) as caught:
        result = run_turn(
            agent,
            "Look.",
            client=client,
            tools={"read_file": read_file, "grep": search, "add": numpy_style},
        )
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "tool 'grep' has a callable but no definition" in messages[0]
    assert "tool 'add'" in messages[1] and "'read_file'" in messages[1]
    assert all(w.filename == __file__ for w in caught)  # points at the caller
    # the mapping's key names the tool: that is what the model calls and the turn looks up
    names = [t["name"] for t in client.requests[0].tools]
    assert names == ["read_file", "grep", "add"]
    assert client.requests[0].tools[1] == {**SEARCH, "name": "grep"}
    assert result.acc.tools[0] is agent.tools[0]


async def aread(path: str, lines: int = 3) -> str:
    """Read the start of a file.

    Args:
        path: The file.
        lines: How many lines.
    """
    await asyncio.sleep(0)
    return f"{lines} lines of {path}"


def test_arun_turn_derives_definitions_of_async_tools() -> None:
    use = ToolUseBlock(id="a1", name="aread", input={"path": "x.py"})
    client = ScriptedClient([calls(use), answer("Read.")])
    result = asyncio.run(arun_turn(AgentConfig(), "Read x.py.", client=client, tools=[aread]))
    (tool,) = client.requests[0].tools
    assert tool == {
        "name": "aread",
        "description": "Read the start of a file.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file."},
                "lines": {"type": "integer", "default": 3, "description": "How many lines."},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    }
    assert result.acc.memory.entries()[2].tool_results[0].text() == "3 lines of x.py"


def test_a_list_of_tools_needs_distinct_names() -> None:
    with pytest.raises(ToolDefinitionError, match="two tools are named 'search'"):
        run_turn(AgentConfig(), "Go.", client=ScriptedClient([]), tools=[search, search])
    with pytest.raises(ToolDefinitionError, match="not a named callable"):
        run_turn(AgentConfig(), "Go.", client=ScriptedClient([]), tools=[object()])


def _unused(**kwargs: Any) -> None:
    """Takes anything."""


def test_keyword_arguments_allow_other_properties() -> None:
    schema = tool_definition(_unused)["input_schema"]
    assert schema == {"type": "object", "properties": {}, "additionalProperties": True}
