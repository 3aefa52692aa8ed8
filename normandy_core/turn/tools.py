"""Tools: definitions derived from typed Python callables, and their results.

A model calls only the tools its request defines. :func:`tool_definition` builds a
definition from a function's signature and docstring: the name, the first paragraph of
the docstring as the description, and the parameters as a JSON schema made by pydantic
from their annotations and defaults (each described by its entry in the docstring's
``Args:``/``Parameters`` section or ``:param name:`` line, or by an
``Annotated[..., Field(description=...)]``). The definition is in Normandy's
(Anthropic-shaped) form, ``{"name", "description", "input_schema"}``, which every client
renders in its provider's format.

:func:`declare_tools` is what the turn shells run: callables that ``AgentConfig.tools``
does not define get a derived definition; when the config defines others, each such tool
is also named in an :class:`UndeclaredToolWarning` (a forgotten definition, most likely).
:func:`tool_result` turns what a tool returned into the result of its call.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from normandy_core.conversation.entries import (
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.errors import NormandyError

if TYPE_CHECKING:
    from normandy_core.contract.config import AgentConfig

__all__ = [
    "Tool",
    "ToolDefinitionError",
    "UndeclaredToolWarning",
    "declare_tools",
    "tool_definition",
    "tool_result",
]

#: A tool: called with the tool use's input as keyword arguments, sync or async.
Tool = Callable[..., Any]


class ToolDefinitionError(NormandyError, TypeError):
    """A tool's definition cannot be derived from its callable; the message names the tool
    and the parameter at fault. Give the tool a definition in ``AgentConfig.tools``."""


class UndeclaredToolWarning(UserWarning):
    """A tool has a callable but no definition while ``AgentConfig.tools`` defines others;
    its definition was derived from the callable."""


_SECTION = re.compile(
    r"^(?:Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters)"
    r":\s*$"
)
_ANY_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_GOOGLE_ITEM = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ITEM = re.compile(r"^:param\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:\s*(.*)$")
_NUMPY_ITEM = re.compile(r"^\*{0,2}(\w+)\s*(?::.*)?$")
_RULE = re.compile(r"^-{3,}\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(parts: list[str]) -> str:
    return " ".join(part.strip() for part in parts if part.strip())


def _starts_section(lines: list[str], i: int) -> bool:
    """Whether line ``i`` opens a docstring section (Google, Sphinx field or NumPy)."""
    text = lines[i].strip()
    if _ANY_SECTION.match(text) or text.startswith(":"):
        return True
    return i + 1 < len(lines) and bool(text) and bool(_RULE.match(lines[i + 1].strip()))


def summary(doc: str) -> str:
    """The first paragraph of ``doc`` (a cleaned docstring) on one line."""
    lines = doc.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        if not line.strip() or _starts_section(lines, i):
            break
        out.append(line)
    return _join(out)


def param_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions of ``doc``: Google ``Args:``, Sphinx ``:param x:``, NumPy
    ``Parameters`` sections (continuation lines joined)."""
    lines = doc.splitlines()
    found: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        text = line.strip()
        if item := _SPHINX_ITEM.match(text):
            parts, j = [item.group(2)], i + 1
            while j < len(lines) and lines[j].strip() and _indent(lines[j]) > _indent(line):
                parts.append(lines[j])
                j += 1
            found.setdefault(item.group(1), _join(parts))
            i = j
            continue
        if _SECTION.match(text):
            i = _google(lines, i, found)
            continue
        numpy = text in ("Parameters", "Other Parameters") and i + 1 < len(lines)
        if numpy and _RULE.match(lines[i + 1].strip()):
            i = _numpy(lines, i, found)
            continue
        i += 1
    return {name: text for name, text in found.items() if text}


class _Items:
    """The items of a docstring section, read line by line into ``found``: the item being
    read (its name and lines) is added when the next one starts, or the section ends."""

    def __init__(self, found: dict[str, str]) -> None:
        self.found = found
        self.name: str | None = None
        self.parts: list[str] = []

    def begin(self, name: str, first: list[str]) -> None:
        """Start the item ``name`` with the lines ``first``."""
        self.end()
        self.name, self.parts = name, first

    def extend(self, line: str) -> None:
        """Add a line to the item being read (none before the first item)."""
        if self.name is not None:
            self.parts.append(line)

    def end(self) -> None:
        """Add the item being read to ``found`` (an earlier description of it wins)."""
        if self.name is not None:
            self.found.setdefault(self.name, _join(self.parts))


def _google(lines: list[str], i: int, found: dict[str, str]) -> int:
    head = _indent(lines[i])
    j = i + 1
    item_indent: int | None = None
    items = _Items(found)
    while j < len(lines):
        line = lines[j]
        if not line.strip():
            j += 1
            if j < len(lines) and lines[j].strip() and _indent(lines[j]) <= head:
                break
            continue
        indent = _indent(line)
        if indent <= head:
            break
        if item_indent is None:
            item_indent = indent
        item = _GOOGLE_ITEM.match(line.strip()) if indent <= item_indent else None
        if item:
            items.begin(item.group(1), [item.group(2)])
        else:
            items.extend(line)
        j += 1
    items.end()
    return j


def _numpy(lines: list[str], i: int, found: dict[str, str]) -> int:
    head = _indent(lines[i])
    j = i + 2
    items = _Items(found)
    while j < len(lines):
        line = lines[j]
        if line.strip() and j + 1 < len(lines) and _RULE.match(lines[j + 1].strip()):
            break  # the next section
        if line.strip() and _indent(line) <= head:
            item = _NUMPY_ITEM.match(line.strip())
            if not item:
                break
            items.begin(item.group(1), [])
        else:
            items.extend(line)
        j += 1
    items.end()
    return j


def _target(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What holds ``fn``'s annotations and docstring (a partial's function, a callable
    object's ``__call__``)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and callable(fn):
        call = type(fn).__call__
        if inspect.isfunction(call):
            return call
    return fn


def _doc(fn: Callable[..., Any]) -> str:
    """The docstring that describes ``fn``: its own, a partial's function's, or a callable
    object's class docstring (else its ``__call__``'s)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return inspect.getdoc(fn) or ""
    return inspect.getdoc(fn) or inspect.getdoc(type(fn).__call__) or ""


def _schema_generator() -> Any:
    from pydantic.json_schema import GenerateJsonSchema

    class _NoTitles(GenerateJsonSchema):
        """pydantic's JSON schema without the titles it makes up from names."""

        def field_title_should_be_set(self, schema: Any) -> bool:
            return False

        def generate(self, schema: Any, mode: Any = "validation") -> Any:
            out = super().generate(schema, mode)
            out.pop("title", None)
            return out

    return _NoTitles


def tool_definition(fn: Callable[..., Any], *, name: str | None = None) -> dict[str, Any]:
    """The definition of the tool ``fn``: ``{"name", "description", "input_schema"}``.

    ``name`` defaults to the function's ``__name__``; the description is the docstring's
    first paragraph (left out without a docstring). ``input_schema`` is the JSON schema
    pydantic makes for the parameters (types from the annotations, unannotated ones
    accept anything; a parameter with a default is optional and shows it), without
    pydantic's generated titles, each described by the docstring when it documents it.
    ``*args`` is left out (tools are called with keyword arguments); without ``**kwargs``
    no other property is allowed. Raises :class:`ToolDefinitionError` naming the tool and
    the parameter for a positional-only parameter or a type with no JSON schema.
    """
    tool = name or _name(fn)
    if not tool:
        raise ToolDefinitionError(f"tool {fn!r} has no __name__: pass name=...")
    what = f"tool {tool!r}"
    signature, hints = _annotated_signature(fn, what)
    doc = _doc(fn)
    fields, aliases, extra = _fields(signature, hints, what)
    schema = _input_schema(tool, what, fields, aliases, extra)
    described = param_docs(doc)
    for pname, prop in (schema.get("properties") or {}).items():
        text = described.get(pname)
        if text and isinstance(prop, dict) and "description" not in prop:
            prop["description"] = text
    if not schema.get("required"):
        schema.pop("required", None)
    schema.setdefault("properties", {})
    out: dict[str, Any] = {"name": tool}
    description = summary(doc)
    if description:
        out["description"] = description
    out["input_schema"] = schema
    return out


def _annotated_signature(
    fn: Callable[..., Any], what: str
) -> tuple[inspect.Signature, dict[str, Any]]:
    """``fn``'s signature and its resolved annotations (``what`` names the tool in errors)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"{what}: no signature to derive a definition from") from exc
    try:
        hints = typing.get_type_hints(_target(fn), include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(
            f"{what}: its annotations cannot be resolved ({type(exc).__name__}: {exc}); "
            "give it a definition in AgentConfig.tools"
        ) from exc
    return signature, hints


def _fields(
    signature: inspect.Signature, hints: Mapping[str, Any], what: str
) -> tuple[dict[str, Any], dict[str, str], bool]:
    """The pydantic fields of a tool's parameters, their parameter names by field key, and
    whether ``**kwargs`` lets the input hold other properties."""
    from pydantic import Field

    fields: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    extra = False
    for i, param in enumerate(signature.parameters.values()):
        if param.kind is param.VAR_POSITIONAL:
            continue  # never filled: a tool is called with keyword arguments
        if param.kind is param.VAR_KEYWORD:
            extra = True
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                f"{what}: parameter {param.name!r} is positional-only, but a tool is called "
                "with keyword arguments"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        key = f"p{i}"  # any parameter name, even one pydantic reserves, goes by alias
        fields[key] = (annotation, Field(default, alias=param.name))
        aliases[key] = param.name
    return fields, aliases, extra


def _input_schema(
    tool: str, what: str, fields: dict[str, Any], aliases: Mapping[str, str], extra: bool
) -> dict[str, Any]:
    """The JSON schema pydantic makes for the fields, without its generated titles."""
    from pydantic import ConfigDict, create_model

    try:
        model = create_model(
            f"{tool}_input",
            __config__=ConfigDict(extra="allow" if extra else "forbid"),
            **fields,
        )
        schema: dict[str, Any] = model.model_json_schema(
            by_alias=True, schema_generator=_schema_generator()
        )
    except Exception as exc:
        bad = _unschemable(fields, aliases)
        where = f" parameter {bad!r}:" if bad else ""
        reason = str(exc).splitlines()[0].split(". ")[0] if str(exc) else ""
        raise ToolDefinitionError(
            f"{what}:{where} no JSON schema for its type ({type(exc).__name__}: {reason}); "
            "give it a definition in AgentConfig.tools"
        ) from exc
    return schema


def _name(fn: Callable[..., Any]) -> str | None:
    """A function's (or a partial's function's) ``__name__``; ``None`` for other objects."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else None


def _unschemable(fields: Mapping[str, Any], aliases: Mapping[str, str]) -> str | None:
    """The first parameter whose type alone has no JSON schema (to name it in the error)."""
    from pydantic import TypeAdapter

    for key, (annotation, _) in fields.items():
        try:
            TypeAdapter(annotation).json_schema()
        except Exception:
            return aliases[key]
    return None


def _declared_name(definition: Mapping[str, Any]) -> str | None:
    name = definition.get("name")
    if name is None and isinstance(definition.get("function"), Mapping):
        name = definition["function"].get("name")  # an OpenAI-style definition
    return str(name) if name is not None else None


def tool_map(tools: Mapping[str, Any] | Sequence[Any] | None) -> dict[str, Any]:
    """``tools`` as a name-to-callable dict: a mapping as given, a sequence of callables
    under their ``__name__`` (a duplicate or missing name raises
    :class:`ToolDefinitionError`)."""
    if tools is None:
        return {}
    if isinstance(tools, Mapping):
        return dict(tools)
    out: dict[str, Any] = {}
    for fn in tools:
        name = _name(fn) if callable(fn) else None
        if not name:
            raise ToolDefinitionError(
                f"tools: {fn!r} is not a named callable; pass a mapping of names to tools"
            )
        if name in out:
            raise ToolDefinitionError(f"tools: two tools are named {name!r}; pass a mapping")
        out[name] = fn
    return out


def declare_tools(
    acc: AgentConfig, tools: Mapping[str, Any], *, entry: str, stacklevel: int = 2
) -> AgentConfig:
    """``acc``, or a copy whose ``tools`` also define every callable of ``tools`` it did
    not (derived with :func:`tool_definition`, under the callable's key).

    When ``acc`` defines other tools, each undefined one is named in an
    :class:`UndeclaredToolWarning`. ``acc`` itself is never changed; the copy is prepared
    again under ``entry`` (its prompt tokens count the new definitions).
    """
    if not tools:
        return acc
    declared = [name for name in map(_declared_name, acc.tools) if name is not None]
    known = set(declared)
    if acc.recall_settings is not None:  # the loop sends the recall tool's definition
        known.add(acc.recall_settings.tool_name)
    missing = [name for name in tools if name not in known]
    if not missing:
        return acc
    derived = [tool_definition(tools[name], name=name) for name in missing]
    if declared:
        listed = ", ".join(repr(name) for name in declared)
        for name in missing:
            warnings.warn(
                f"{entry}: tool {name!r} has a callable but no definition in "
                f"AgentConfig.tools (which defines {listed}); its definition was derived "
                "from its signature and docstring. Define it to silence this warning.",
                UndeclaredToolWarning,
                stacklevel=stacklevel + 1,
            )
    return acc.replace(tools=(*acc.tools, *derived), entry=entry)


def tool_result(call: ToolUseBlock, output: Any) -> ToolResultBlock:
    """A tool's return value as the result of ``call``.

    Text stays text; a :class:`ToolResultBlock` is re-addressed to ``call``; text, image
    and document blocks (or a list of them) become the result's parts; anything else
    is JSON-encoded.
    """
    if isinstance(output, ToolResultBlock):
        return output.model_copy(update={"tool_use_id": call.id})
    if isinstance(output, str):
        return ToolResultBlock(tool_use_id=call.id, content=output)
    parts_types = (TextBlock, ImageBlock, DocumentBlock)
    if isinstance(output, parts_types):
        return ToolResultBlock(tool_use_id=call.id, content=(output,))
    if (
        isinstance(output, (list, tuple))
        and output
        and all(isinstance(part, parts_types) for part in output)
    ):
        return ToolResultBlock(tool_use_id=call.id, content=tuple(output))
    return ToolResultBlock(
        tool_use_id=call.id, content=json.dumps(output, ensure_ascii=False, default=str)
    )


def failed_tool_result(call: ToolUseBlock, exc: BaseException) -> ToolResultBlock:
    """The error result of ``call`` when its tool raised ``exc``."""
    return _error_result(call, f"tool {call.name!r} raised {type(exc).__name__}: {exc}")


def unknown_tool_result(call: ToolUseBlock, tools: Mapping[str, Tool]) -> ToolResultBlock:
    """The error result of ``call`` when ``tools`` has no tool of its name."""
    known = ", ".join(sorted(tools)) or "none"
    return _error_result(call, f"unknown tool {call.name!r}; available tools: {known}")


def _error_result(call: ToolUseBlock, text: str) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=call.id, content=text, is_error=True)
