"""The conversation: typed content blocks, immutable entries, and a parent-linked memory.

An :class:`AgentMemory` is a graph of :class:`Entry` objects linked by ``parent_id``;
branches share a parent and the *active branch* runs from the head back to the root.
Entries are frozen and keep their ``id`` for as long as the memory lives, through every
compaction. The memory itself is append-only: :meth:`AgentMemory.add_message` extends
the active branch in place, and compactors never call it on the memory they were given;
they build a new one (:meth:`AgentMemory.from_entries`, :func:`drop_thinking`).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from normandy_core.conversation.entries import (
    BLOCK_TYPES,
    EMPTY_METADATA,
    Content,
    Entry,
    FrozenDict,
    Role,
    new_id,
)

if TYPE_CHECKING:
    from normandy_core.conversation.tokens import TokenCounter

__all__ = ["AgentMemory", "drop_thinking"]

MEMORY_FORMAT = "normandy.memory"
MEMORY_VERSION = 1

#: Every field set: ``add_message`` copies it with every field replaced (pydantic's
#: ``model_copy``, unvalidated), the same entry ``Entry.model_construct`` makes from the same
#: fields (all of them set), for about two thirds of the cost: ``model_construct`` walks
#: every field's aliases and defaults, at each of the two appends of a tool batch.
_TEMPLATE = Entry.model_construct(
    id="-",
    parent_id=None,
    turn_id=None,
    role="user",
    content="",
    pinned=False,
    metadata=EMPTY_METADATA,
)


#: An entry's fields, in order, and their values read in one call: what a memory keeps of
#: each entry when it joins (:meth:`AgentMemory.undo_changes_in_place`).
_FIELDS = tuple(Entry.model_fields)
_fields_of = operator.attrgetter(*_FIELDS)


@functools.cache
def _entry_list() -> TypeAdapter[list[Entry]]:
    """The validator of a dump's entries, built at the first :meth:`AgentMemory.load`."""
    return TypeAdapter(list[Entry])


_ROLES = frozenset(("system", "user", "assistant", "tool"))
#: The block types, compared by identity: ``isinstance`` against a pydantic model class
#: that an object is not an instance of goes through ``ABCMeta.__instancecheck__``, and a
#: tool result would be checked against four other types first.
_BLOCK_SET = frozenset(BLOCK_TYPES)
#: Token counts kept per entry id and counter (content variants of one id).
_COUNT_VARIANTS = 4


class AgentMemory:
    """A parent-linked graph of entries with an active branch (head back to root).

    Iterating a memory yields the active branch oldest first; ``len()`` is its length.
    Token totals of the active branch are kept incrementally per counter and per-entry
    counts are cached, so a count is never computed twice (see :meth:`tokens`).
    """

    __slots__ = (
        "_branch",
        "_counts",
        "_entries",
        "_head",
        "_marks",
        "_seals",
        "_totals",
        "_version",
    )

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        # entry id -> the entry's fields when it joined: what a change in place is found by
        self._seals: dict[str, tuple[Any, ...]] = {}
        self._head: str | None = None
        self._branch: list[Entry] | None = []
        # counter name -> entry id -> ((content, role, count), ...); shared by derived memories.
        # A few variants per id: one entry id is counted with its thinking (the memory) and
        # without it (drop_thinking's memory), and neither may evict the other.
        self._counts: dict[str, dict[str, tuple[tuple[object, str, int], ...]]] = {}
        # counter name -> (entries of the branch counted so far, their total)
        self._totals: dict[str, tuple[int, int]] = {}
        # metadata key -> (entries of the branch looked at so far, whether one had it set)
        self._marks: dict[str, tuple[int, bool]] = {}
        self._version = 0

    # -- building -------------------------------------------------------------------

    def add_message(
        self,
        role: Role,
        content: Content | Sequence[Any],
        *,
        id: str | None = None,
        turn_id: str | None = None,
        pinned: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> Entry:
        """Append a message to the active branch and return its entry.

        ``id`` keeps a known id (a compactor re-adding a kept message passes it); it must not
        already be in the memory. ``content`` is text or blocks (dicts are validated).
        """
        eid = id if id is not None else new_id()
        if eid in self._entries:
            raise ValueError(f"entry id {eid!r} is already in this memory")
        if not isinstance(content, str) and not isinstance(content, tuple):
            content = tuple(content)
        fields: dict[str, Any] = {
            "id": eid,
            "parent_id": self._head,
            "turn_id": turn_id,
            "role": role,
            "content": content,
            "pinned": pinned,
            # read-only, like every entry's (frozen here once, not again by model_copy)
            "metadata": FrozenDict(metadata) if metadata else EMPTY_METADATA,
        }
        typed = (
            role in _ROLES
            and isinstance(eid, str)
            and eid
            and (turn_id is None or isinstance(turn_id, str))
            and isinstance(pinned, bool)
            # every block of a block type (exactly: a subclass's block is validated)
            and (isinstance(content, str) or _BLOCK_SET.issuperset(map(type, content)))
        )
        # Typed blocks (the turn loop's, a compactor's) are valid already: constructing
        # without re-validation keeps appending cheap on the hot path.
        entry = _TEMPLATE.model_copy(update=fields) if typed else Entry(**fields)
        self._append(entry)
        return entry

    def _append(self, entry: Entry) -> None:
        self._entries[entry.id] = entry
        self._seals[entry.id] = _fields_of(entry)
        self._head = entry.id
        if self._branch is not None:
            self._branch.append(entry)
        self._version += 1

    @classmethod
    def from_entries(cls, entries: Iterable[Entry]) -> AgentMemory:
        """A memory whose active branch is exactly ``entries``, in order, under their ids.

        Each entry is linked to the one before it; an entry whose ``parent_id`` already says
        so is kept as the same object, others are copied with the new parent.
        """
        mem = cls()
        prev: str | None = None
        for e in entries:
            if e.id in mem._entries:
                raise ValueError(f"duplicate entry id {e.id!r}")
            if e.parent_id != prev:
                e = e.model_copy(update={"parent_id": prev})
            mem._entries[e.id] = e
            mem._seals[e.id] = _fields_of(e)
            assert mem._branch is not None
            mem._branch.append(e)
            prev = e.id
        mem._head = prev
        return mem

    @classmethod
    def from_graph(cls, entries: Iterable[Entry], head: str | None) -> AgentMemory:
        """A memory holding ``entries`` with their own parent links, active at ``head``.

        Raises ``ValueError`` for a duplicate id, a parent that is not in the memory, a
        cycle, or an unknown head.
        """
        mem = cls()
        for e in entries:
            if e.id in mem._entries:
                raise ValueError(f"duplicate entry id {e.id!r}")
            mem._entries[e.id] = e
            mem._seals[e.id] = _fields_of(e)
        for e in mem._entries.values():
            if e.parent_id is not None and e.parent_id not in mem._entries:
                raise ValueError(f"entry {e.id!r} has parent {e.parent_id!r}, which is missing")
        if head is not None and head not in mem._entries:
            raise ValueError(f"head {head!r} is not an entry of the memory")
        mem._head = head
        mem._branch = None
        mem._active()  # checks for cycles
        return mem

    def fork(self, entry_id: str | None) -> AgentMemory:
        """A new memory sharing this graph, active at ``entry_id`` (``None``: empty branch).

        Messages added to the fork branch off after ``entry_id``; this memory is unchanged.
        """
        if entry_id is not None and entry_id not in self._entries:
            raise KeyError(f"no entry {entry_id!r} in this memory")
        mem = self._derive()
        mem._entries = dict(self._entries)
        mem._seals = dict(self._seals)
        mem._head = entry_id
        mem._branch = None
        return mem

    def copy(self) -> AgentMemory:
        """An independent memory with the same graph and head (entries are shared, frozen)."""
        mem = self._derive()
        mem._entries = dict(self._entries)
        mem._seals = dict(self._seals)
        mem._head = self._head
        mem._branch = list(self._branch) if self._branch is not None else None
        mem._totals = dict(self._totals)
        mem._marks = dict(self._marks)
        return mem

    def _derive(self) -> AgentMemory:
        mem = AgentMemory()
        mem._counts = self._counts
        return mem

    def derive(self, entries: Iterable[Entry]) -> AgentMemory:
        """Like :meth:`from_entries`, carrying over the cached counts of the kept entries.

        Compactors build their result with it so kept entries are not counted again. The
        new memory's cache holds only its own entries' counts (pruned), so a long session
        of compactions keeps the cache as large as the live conversation, not its history.
        """
        mem = AgentMemory.from_entries(entries)
        live = mem._entries
        mem._counts = {
            name: {eid: v for eid, v in cache.items() if eid in live}
            for name, cache in list(self._counts.items())
        }
        return mem

    def state(self) -> tuple[int, str | None, int]:
        """What identifies this memory's state: equal states, no change in between (the
        contract's check that a compactor did not append to the memory it was given)."""
        return (self._version, self._head, len(self._entries))

    def restore(self, state: tuple[int, str | None, int]) -> None:
        """Undo the appends made since :meth:`state` returned ``state`` (the memory is
        append-only, so this is exact)."""
        if self.state() == state:
            return
        _, head, n = state
        for eid in list(self._entries)[n:]:
            del self._entries[eid]
            self._seals.pop(eid, None)
        self._head = head
        self._branch = None
        self._totals = {}
        self._marks = {}
        self._version += 1

    def undo_changes_in_place(self) -> dict[str, tuple[str, ...]]:
        """Put back every entry of the graph changed in place since it joined this memory.

        Entries are frozen, but ``object.__setattr__`` gets past any frozen Python object:
        the memory keeps each entry's fields as they were when it joined, so a change is
        found here and undone. Returns the ids of the entries put back (in the order they
        joined), each with the names of the fields that had changed. Walks the whole
        graph: the contract's check calls it where a compactor's result is checked in
        full, not at every boundary.
        """
        changed: dict[str, tuple[str, ...]] = {}
        seals = self._seals
        for eid, entry in self._entries.items():
            sealed = seals.get(eid)
            now = _fields_of(entry)
            if sealed is None or now == sealed:  # the same objects, or equal ones
                continue
            names = tuple(n for n, a, b in zip(_FIELDS, now, sealed, strict=True) if a != b)
            for name, value in zip(_FIELDS, sealed, strict=True):
                object.__setattr__(entry, name, value)
            changed[eid] = names
        return changed

    # -- reading --------------------------------------------------------------------

    def _active(self) -> list[Entry]:
        if self._branch is None:
            branch: list[Entry] = []
            seen: set[str] = set()
            cur = self._head
            while cur is not None:
                if cur in seen:
                    raise ValueError(f"the parent links of entry {cur!r} form a cycle")
                seen.add(cur)
                e = self._entries[cur]
                branch.append(e)
                cur = e.parent_id
            branch.reverse()
            self._branch = branch
            self._totals = {}
            self._marks = {}
        return self._branch

    @property
    def head(self) -> str | None:
        """The id of the newest entry of the active branch."""
        return self._head

    @property
    def version(self) -> int:
        """A number that grows with every change; equal numbers mean an unchanged memory."""
        return self._version

    def entries(self) -> list[Entry]:
        """The active branch, oldest first (a new list)."""
        return list(self._active())

    def newest_first(self) -> Iterator[Entry]:
        """The active branch from the newest entry back, lazily (no copy: a caller that
        stops early reads only what it needed). Do not change the memory while iterating."""
        return reversed(self._active())

    def all_entries(self) -> list[Entry]:
        """Every entry of the graph, in the order it was added."""
        return list(self._entries.values())

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._active())

    def __len__(self) -> int:
        return len(self._active())

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._entries

    def __getitem__(self, entry_id: str) -> Entry:
        return self._entries[entry_id]

    def get(self, entry_id: str) -> Entry | None:
        """The entry with this id anywhere in the graph, or ``None``."""
        return self._entries.get(entry_id)

    def last(self) -> Entry | None:
        """The newest entry of the active branch."""
        return self._entries[self._head] if self._head is not None else None

    def __repr__(self) -> str:
        return f"<AgentMemory {len(self)} active / {len(self._entries)} entries head={self._head}>"

    # -- tokens ---------------------------------------------------------------------

    def entry_tokens(self, entry: Entry, counter: TokenCounter) -> int:
        """``counter``'s count of ``entry``, computed once per entry id and content."""
        cache = self._counts.get(counter.name)
        if cache is None:
            cache = self._counts[counter.name] = {}
        content, role = entry.content, entry.role
        variants = cache.get(entry.id, ())
        for seen, seen_role, n in variants:
            # Identity first (the common case, free); equality catches equal content in new
            # objects, such as the same entry stripped of its thinking twice.
            if seen_role == role and (seen is content or seen == content):
                return n
        n = counter.count_entry(entry)
        cache[entry.id] = (*variants[-(_COUNT_VARIANTS - 1) :], (content, role, n))
        return n

    def tokens(self, counter: TokenCounter) -> int:
        """Total tokens of the active branch; only entries added since the last call are counted.

        Safe under concurrent readers: the total stored is always the total of exactly
        the entries counted, whatever was appended meanwhile.
        """
        branch = self._branch
        if branch is None:
            branch = self._active()
        n = len(branch)
        name = counter.name
        done, total = self._totals.get(name, (0, 0))
        if done == n:
            return total
        if done > n:  # pragma: no cover - a branch only shrinks through _restore
            done, total = 0, 0
        cache = self._counts.get(name)
        if cache is None:
            cache = self._counts[name] = {}
        for e in branch[done:n]:
            # entry_tokens, written out (this runs for every new message of a turn)
            eid = e.id
            variants = cache.get(eid)
            if variants is None:  # never counted (a new message): its first variant
                count = counter.count_entry(e)
                cache[eid] = ((e.content, e.role, count),)
            else:
                content, role = e.content, e.role
                count = -1
                for seen, seen_role, known in variants:
                    if seen_role == role and (seen is content or seen == content):
                        count = known
                        break
                if count < 0:
                    count = counter.count_entry(e)
                    cache[eid] = (*variants[-(_COUNT_VARIANTS - 1) :], (content, role, count))
            total += count
        # No lock: the pair is one tuple, exact for the n entries it names, so whichever
        # reader stores last, the stored total is right. A slower reader may store a
        # shorter pair after a longer one; the next call then counts the entries since
        # again, from the cache.
        if self._totals.get(name, (0, 0))[0] < n and self._branch is branch:
            self._totals[name] = (n, total)
        return total

    def any_marked(self, key: str) -> bool:
        """Whether an entry of the active branch has a true ``metadata[key]``.

        Kept incrementally like :meth:`tokens`: only entries appended since the last call
        are looked at (the turn loop asks at every model reply, whatever the history's
        length), and safe under concurrent readers the same way.
        """
        branch = self._active()
        n = len(branch)
        done, found = self._marks.get(key, (0, False))
        if found or done == n:
            return found
        if done > n:  # pragma: no cover - a branch only shrinks through _restore
            done = 0
        found = any(e.metadata.get(key) for e in branch[done:n])
        # no lock, as in tokens: the pair is exact for the entries it names
        if self._marks.get(key, (0, False))[0] < n and self._branch is branch:
            self._marks[key] = (n, found)
        return found

    # -- persistence ----------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole graph and head; :meth:`load` restores it exactly."""
        return {
            "format": MEMORY_FORMAT,
            "version": MEMORY_VERSION,
            "head": self._head,
            "entries": [e.model_dump(mode="json") for e in self._entries.values()],
        }

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> AgentMemory:
        """Restore a memory from :meth:`dump`'s dict; raises ``ValueError`` naming the fault."""
        if data.get("format") != MEMORY_FORMAT:
            raise ValueError(f"not a Normandy memory dump: 'format' is {data.get('format')!r}")
        if data.get("version") != MEMORY_VERSION:
            raise ValueError(f"unsupported memory dump version {data.get('version')!r}")
        entries = _entry_list().validate_python(data.get("entries", []))
        return cls.from_graph(entries, data.get("head"))

    def to_json(self) -> str:
        """:meth:`dump` as a JSON string."""
        return json.dumps(self.dump(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> AgentMemory:
        """Restore a memory from :meth:`to_json`'s string."""
        return cls.load(json.loads(text))


def drop_thinking(memory: AgentMemory) -> AgentMemory:
    """A new memory without thinking or redacted-thinking blocks, and nothing else changed.

    Every entry of the graph keeps its id, parent and position; entries that had no
    thinking are the same objects. The result is always a new memory (a cheap copy when
    nothing had thinking), so adding to it never touches the input, which is never
    modified. It shares the input's token-count cache.
    """
    changed = False
    new_entries: list[Entry] = []
    for e in memory._entries.values():
        ne = e.without_thinking()
        changed |= ne is not e
        new_entries.append(ne)
    if not changed:
        return memory.copy()
    mem = memory._derive()
    mem._entries = {e.id: e for e in new_entries}
    # an entry kept as it was keeps the fields it joined with; a new one is sealed now
    mem._seals = {
        e.id: memory._seals[e.id] if e is memory._entries[e.id] else _fields_of(e)
        for e in new_entries
    }
    mem._head = memory._head
    mem._branch = None
    return mem
