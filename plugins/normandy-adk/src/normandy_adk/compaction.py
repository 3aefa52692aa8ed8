"""Compact a Google ADK request's contents with a Normandy compactor, continuing each
session's last compaction.

ADK builds a request's ``contents`` anew from the session's events before every model
call, so a list it gives holds again everything an earlier call cut. A
:class:`ContentsCompactor` remembers, per session, the contents it was last given and
the ones it returned: a list that extends the last one given (the same contents first,
compared by value, then new ones) is compacted as the list returned plus the new
contents. Earlier cuts are kept, only new contents are read and counted, and each
dropped content reaches the ``after_compact`` hooks once. Any other list is compacted
whole.

The memory is compacted by the core's own path
(:func:`normandy_core.transcripts.facade.compact_with`): the boundary checks the result,
the hooks receive what was dropped, broken tool pairs are refused. Every content the
compactor kept comes back as the very object it was given; one it changed (a shortened
tool result, stripped thinking) is the original with new parts; one it created (a
summary, a marker) is a new ``Content``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.genai import types

from normandy_adk.contents import (
    Digests,
    Read,
    changed_content,
    created_content,
    open_round,
    read,
)
from normandy_core.contract.config import AgentConfig
from normandy_core.conversation.entries import Entry
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.structure import pairing_problems
from normandy_core.transcripts.adapter import (
    AdapterCompaction,
    NamedCompactor,
    map_entries_back,
)
from normandy_core.transcripts.facade import compact_with
from normandy_core.transcripts.formats import TranscriptError

__all__ = ["COMPACTOR_ENTRY", "MAX_SESSIONS", "ADKCompaction", "ContentsCompactor", "Prompt"]

logger = logging.getLogger("normandy_adk")

#: The entry point named in the option errors of :class:`ContentsCompactor`.
COMPACTOR_ENTRY = "normandy_adk.ContentsCompactor()"
#: How many sessions a compactor remembers (the most recently used are kept).
MAX_SESSIONS = 256


class ADKCompaction(AdapterCompaction[types.Content]):
    """What :meth:`ContentsCompactor.run` returns: the core's
    :class:`~normandy_core.transcripts.adapter.AdapterCompaction` of ADK contents
    (``removed``, ``result``, ``compacted``), under this adapter's name, with what the
    model receives as :attr:`contents`. ``removed`` holds only what this call took out:
    what earlier calls of the session cut is not repeated; ``compacted`` says whether
    this call compacted."""

    @property
    def contents(self) -> list[types.Content]:
        """What the model receives (the given objects where kept, unchanged): ``messages``."""
        return self.messages


@dataclass(frozen=True)
class Prompt:
    """What a request sends beside its contents, which shares the window with them: the
    system instruction's text and the tools' declarations (name, description, schema)."""

    system: str = ""
    tools: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, config: types.GenerateContentConfig | None) -> Prompt:
        """The system instruction and function declarations of a request's config."""
        if config is None:
            return cls()
        system = config.system_instruction
        if isinstance(system, types.Content):
            text = "\n".join(p.text or "" for p in system.parts or [])
        else:
            text = system if isinstance(system, str) else json.dumps(system, default=str)
        tools: list[Mapping[str, Any]] = []
        for tool in config.tools or []:
            if not isinstance(tool, types.Tool):
                continue
            for d in tool.function_declarations or []:
                schema = d.model_dump(mode="json", exclude_none=True)
                tools.append(
                    {
                        "name": d.name or "",
                        "description": d.description or "",
                        "input_schema": schema,
                    }
                )
        return cls(text, tuple(tools))


@dataclass
class _Last:
    """What one session's last compaction left: the contents given and returned, the
    compacted memory (its token counts carry over) and the digests read."""

    given: list[types.Content]
    returned: list[types.Content]
    memory: AgentMemory | None
    digests: Digests
    #: the contents the compactor created (markers, summaries) with their entries
    created: dict[int, tuple[types.Content, Entry]] = field(default_factory=dict)

    def base(self, contents: list[types.Content]) -> list[types.Content] | None:
        """The returned list plus the contents new since, when ``contents`` extends the
        list given last (compared by value: ADK hands over fresh copies); else ``None``.

        A content returned as it was given is taken from ``contents`` (the equal copy at
        its place), so kept contents are always the caller's own objects; its digest
        carries over to the copy (equal contents, equal digests), so it is not
        serialized again."""
        k = len(self.given)
        if k == 0 or len(contents) < k or contents[:k] != self.given:
            return None
        given_at = {id(c): i for i, c in enumerate(self.given)}
        out: list[types.Content] = []
        digests: Digests = {}
        for c in self.returned:
            i = given_at.get(id(c), -1)
            if i < 0:  # the compactor's: a note, or a content it changed
                out.append(c)
                continue
            copy = contents[i]
            out.append(copy)
            known = self.digests.get(id(c))
            if known is not None and known[0] is c:
                digests[id(copy)] = (copy, known[1])
        self.digests.update(digests)
        return out + contents[k:]


class ContentsCompactor(NamedCompactor):
    """A compactor chosen by name, prepared once, for ADK request contents.

    The arguments are :class:`normandy_core.transcripts.adapter.NamedCompactor`'s (errors
    name ``entry``, by default ``normandy_adk.ContentsCompactor()``). It remembers the last
    compaction of up to :data:`MAX_SESSIONS` sessions (see the module's docstring);
    calls are serialised, so one compactor serves concurrent sessions.
    """

    default_entry = COMPACTOR_ENTRY

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._sessions: OrderedDict[Hashable, _Last] = OrderedDict()
        # The config with the last prompt seen (prepared again only when it changes).
        self._prompted: tuple[Prompt, AgentConfig] | None = None

    def _config(self, prompt: Prompt | None) -> AgentConfig:
        """The prepared config, sizing for ``prompt`` beside the contents."""
        if prompt is None or prompt == Prompt():
            return self.config
        if self._prompted is None or self._prompted[0] != prompt:
            config = self.config.replace(
                entry=self.entry, system_prompt=prompt.system, tools=prompt.tools
            )
            self._prompted = (prompt, config)
        return self._prompted[1]

    def run(
        self,
        contents: Sequence[types.Content],
        *,
        session: Hashable | None = None,
        prompt: Prompt | None = None,
        mid_round: bool | None = None,
    ) -> ADKCompaction:
        """Compact ``contents`` once; as the continuation of the last call for ``session``
        when they extend what it was given.

        ``prompt`` is what the request sends beside the contents (counted against the
        window); ``mid_round`` says the tool round is still open (left out: the last
        content holds function responses). Raises :class:`~normandy_core.TranscriptError`
        for contents whose pairs do not hold (a response answering no call of the
        content before it, a call left without its response anywhere but last).
        """
        given = list(contents)
        with self._lock:
            last = self._sessions.get(session) if session is not None else None
            base = last.base(given) if last is not None else None
            done, state = self._compact(
                given if base is None else base,
                None if base is None or last is None else last,
                self._config(prompt),
                open_round(given) if mid_round is None else mid_round,
            )
            if session is not None:
                state.given = given
                self._sessions[session] = state
                self._sessions.move_to_end(session)
                while len(self._sessions) > MAX_SESSIONS:
                    self._sessions.popitem(last=False)
        return done

    def _compact(
        self, contents: list[types.Content], last: _Last | None, config: AgentConfig, mid: bool
    ) -> tuple[ADKCompaction, _Last]:
        """Compact ``contents`` (continuing ``last``'s memory); the compaction and what
        the next call continues."""
        got = read(
            contents,
            last.digests if last is not None else None,
            last.created if last is not None else None,
        )
        problems = pairing_problems(got.entries, allow_pending=True)
        if problems:
            raise TranscriptError(None, "parts", _named("; ".join(problems), got))
        memory = (
            last.memory.derive(got.entries)
            if last is not None and last.memory is not None
            else AgentMemory.from_entries(got.entries)
        )
        result = compact_with(config, memory, mid_round=mid, format="normandy")
        notes = last.created if last is not None else {}
        state = _Last([], contents, result.memory, got.digests)
        if not result.compacted:
            state.created = notes  # the notes still in the list stay notes
            return ADKCompaction(contents, result), state
        out = _written(result.memory, got, notes, state.created)
        self.log(logger, len(contents), len(out), result, "contents")
        state.returned = out
        return ADKCompaction.of(contents, out, result), state


def _named(problem: str, got: Read) -> str:
    """``problem`` with each entry id replaced by the content's position."""
    for i, e in enumerate(got.entries):
        problem = problem.replace(e.id, f"content {i}")
    return problem


def _written(
    memory: AgentMemory,
    got: Read,
    notes: Mapping[int, tuple[types.Content, Entry]],
    created: dict[int, tuple[types.Content, Entry]],
) -> list[types.Content]:
    """The contents of a compacted ``memory``: the very objects read where an entry is
    unchanged, the original with new parts where it changed, a new content for an entry
    the compactor made. ``created`` receives the notes of the result (``notes``: those
    of the last call) with their entries."""

    def made(e: Entry) -> types.Content:
        content = created_content(e)
        created[id(content)] = (content, e)
        return content

    mapped = map_entries_back(
        memory,
        got.by_entry,
        lambda source, before, after: changed_content(
            source, before, after, got.call_ids[after.id]
        ),
        made,
    )
    for content, source in mapped:
        if content is source and id(content) in notes:
            created[id(content)] = notes[id(content)]
    return [c for c, _ in mapped]
