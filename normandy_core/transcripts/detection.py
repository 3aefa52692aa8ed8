"""Which wire format a transcript is in, by evidence anywhere in it.

:func:`detect` judges a message list; :func:`detect_format` also recognises the
containers a transcript comes in (a dict with ``messages``, Normandy's own memory dump).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from normandy_core.transcripts.anthropic import ANTHROPIC_ONLY
from normandy_core.transcripts.chat import CHAT_THINKING
from normandy_core.transcripts.formats import (
    FORMAT_NAMES,
    Format,
    TranscriptError,
    WireFormat,
    as_mapping,
)
from normandy_core.transcripts.responses import RESPONSES_ITEMS

__all__ = ["detect", "detect_format"]


def _part_evidence(part: Mapping[str, Any], role: Any, where: str) -> tuple[str, str] | None:
    """``(format, field)`` one content part proves, or ``None``."""
    kind = part.get("type")
    if kind in CHAT_THINKING and role == "assistant":
        # Anthropic's, or a Claude conversation written as Chat Completions messages
        # (LangChain): Anthropic unless another message proves Chat.
        return "anthropic-or-openai", where
    if kind in ANTHROPIC_ONLY:
        return "anthropic", where
    if kind in ("input_text", "output_text", "input_image", "input_file"):
        return "responses", where
    if kind in ("image_url", "file"):
        return "openai", where
    return None


def _evidence(message: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(format, field)`` a message proves, or ``None`` when it reads the same in several."""
    kind = message.get("type")
    role = message.get("role")
    if isinstance(kind, str) and kind in RESPONSES_ITEMS:
        return "responses", "type"
    if role == "tool" or "tool_calls" in message or "tool_call_id" in message:
        return "openai", "role" if role == "tool" else "tool_calls"
    content = message.get("content")
    if isinstance(content, (list, tuple)):
        for j, raw in enumerate(content):
            part = raw if isinstance(raw, Mapping) else None
            if part is None:
                dump = getattr(raw, "model_dump", None)
                part = dump(mode="json", exclude_none=True) if callable(dump) else None
            if not isinstance(part, Mapping):
                continue
            found = _part_evidence(part, role, f"content[{j}].type")
            if found is not None:
                return found
    if kind == "message" and role in ("user", "assistant", "system", "developer"):
        if "id" in message and role == "assistant" and isinstance(content, list):
            return None  # an Anthropic Message object has type "message" too
        return "responses", "type"
    if role in ("system", "developer"):
        return "openai-or-responses", "role"
    return None


def _refuse_mixed(found: dict[str, tuple[int, str]], kinds: list[str]) -> None:
    """Refuse evidence of two formats, naming the first message of each."""
    (first_kind, (first_index, first_field)), (kind, (index, where)) = sorted(
        ((k, found[k]) for k in kinds), key=lambda item: item[1][0]
    )[:2]
    first = "the request's system" if first_index < 0 else f"message {first_index} ({first_field})"
    raise TranscriptError(
        index,
        where,
        f"reads as {FORMAT_NAMES[kind]}, but {first} reads as {FORMAT_NAMES[first_kind]}; "
        "one transcript holds one format (pass format= to choose)",
    )


def detect(
    messages: Sequence[Any], *, has_system: bool = False, prefer: str | None = None
) -> WireFormat:
    """The format of ``messages``, by evidence anywhere in the list.

    A message with a Responses item type (``function_call``, ``reasoning``...) or parts
    (``input_image``, ``output_text``) is Responses; a ``tool`` role, ``tool_calls`` or a
    Chat part (``image_url``, ``file``) is Chat Completions; a block type only Anthropic
    defines is Anthropic (so is a request with ``system`` beside ``messages``), except
    thinking blocks in an assistant's content: Anthropic unless another message proves
    Chat Completions (a Claude conversation as LangChain writes it). Lists that read the
    same in every format (plain text) are Chat Completions. Evidence of two formats is
    refused, naming the two messages. ``prefer="openai"`` reads thinking blocks alone as
    Chat Completions (new messages of a transcript read as Chat before).
    """
    found: dict[str, tuple[int, str]] = {}
    if has_system:
        found["anthropic"] = (-1, "system")
    for i, raw in enumerate(messages):
        evidence = _evidence(as_mapping(raw, i, None))
        if evidence is None:
            continue
        fmt, where = evidence
        if fmt == "openai-or-responses":
            found.setdefault("_system", (i, where))
        elif fmt == "anthropic-or-openai":
            found.setdefault("_thinking", (i, where))
        else:
            found.setdefault(fmt, (i, where))
    if "_thinking" in found and "openai" not in found:
        found.setdefault("openai" if prefer == "openai" else "anthropic", found["_thinking"])
    kinds = [k for k in found if not k.startswith("_")]
    if len(kinds) > 1:
        _refuse_mixed(found, kinds)
    if kinds:
        if kinds[0] == "anthropic" and "_system" in found:
            i, where = found["_system"]
            raise TranscriptError(
                i, where, "Anthropic Messages has no system role; put it in the request's system"
            )
        return cast("WireFormat", kinds[0])
    return "openai"


def detect_format(data: Any) -> Format:
    """Which format ``data`` is in: ``"normandy"`` (a memory dump), ``"openai"`` (Chat
    Completions), ``"anthropic"`` or ``"responses"`` (the OpenAI Responses API).

    A dict with ``format: normandy.memory`` is a Normandy dump; a dict with ``messages``
    is looked into (with ``system`` beside it, Anthropic). A list is judged by evidence
    anywhere in it (:func:`detect`); plain text-only lists read the same in every format
    and are reported as ``"openai"``. Raises
    :class:`~normandy_core.TranscriptError` otherwise.
    """
    if isinstance(data, Mapping):
        if data.get("format") == "normandy.memory":
            return "normandy"
        if "messages" in data:
            if "system" in data:
                return "anthropic"
            return detect_format(data["messages"])
        raise TranscriptError(None, None, "an object must be a Normandy dump or hold 'messages'")
    if isinstance(data, (str, bytes)) or not isinstance(data, (list, tuple)):
        raise TranscriptError(None, None, f"expected a list of messages, got {type(data).__name__}")
    return detect(data)
