"""What both archive backends share: the public API, its records and rules, the read queries.

:class:`ArchiveBackend` is implemented once here over a small :class:`Dialect`; the SQLite
:class:`~normandy_archive.Archive` and ``PostgresArchive`` (``normandy-archive-postgres``)
provide the connections, the write transaction, full-text search and pruning.
"""

from __future__ import annotations

import abc
import builtins
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from normandy_archive.errors import ArchiveError, ArchiveQueryError
from normandy_archive.schema import content_hash, source_ids
from normandy_core import Entry, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock

#: An entry's row as a compaction writes it: entry id, content hash, turn id, role, the
#: entry's JSON, its caller's ids as a JSON array (``None``: none).
EntryRow = tuple[str, str, "str | None", str, str, "str | None"]

__all__ = [
    "MAX_ROWS",
    "ArchiveBackend",
    "ArchivedEntry",
    "CompactionRecord",
    "Dialect",
    "Limits",
    "Prepared",
    "PrunePlan",
    "Recorded",
    "Search",
    "SessionUsage",
    "entry_row",
    "page",
    "prepare",
    "searchable_parts",
    "searchable_text",
]

T = TypeVar("T")
#: Runs one statement on the connection at hand: ``run(sql, params)`` returns its rows.
Run = Callable[[str, Sequence[Any]], builtins.list[tuple[Any, ...]]]
#: The largest LIMIT or OFFSET either database takes (a signed 64-bit integer).
MAX_ROWS = 2**63 - 1


@dataclass(frozen=True)
class ArchivedEntry:
    """One archived version of a dropped entry and where it came from."""

    seq: int
    """Archive order (grows with every version written)."""
    session_id: str
    entry: Entry
    """The entry exactly as it was dropped."""
    entry_json: str
    """The stored JSON; ``entry.model_dump_json()`` gives the same string."""
    content_hash: str
    compaction_id: str
    compactor: str | None
    strategy: str | None
    archived_at: float
    """Unix time of the compaction that archived it."""
    source_ids: tuple[str, ...] = ()
    """The caller's ids found in the entry: its tool-use ids and those its results answer."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the entry as JSON data)."""
        e = self.entry
        return {
            "seq": self.seq,
            "session_id": self.session_id,
            "entry_id": e.id,
            "turn_id": e.turn_id,
            "role": e.role,
            "content_hash": self.content_hash,
            "compaction_id": self.compaction_id,
            "compactor": self.compactor,
            "strategy": self.strategy,
            "archived_at": self.archived_at,
            "source_ids": list(self.source_ids),
            "entry": json.loads(self.entry_json),
        }


@dataclass(frozen=True)
class CompactionRecord:
    """One archived compaction."""

    compaction_id: str
    session_id: str
    compactor: str | None
    strategy: str | None
    model: str | None
    mid_round: bool | None
    created_at: float
    entry_count: int
    """Entries this compaction stored (content the archive did not hold yet)."""
    tokens_before: int | None
    tokens_after: int | None
    dropped_count: int | None = None
    """Entries the compaction dropped (stored now or already in the archive)."""


@dataclass(frozen=True)
class SessionUsage:
    """One session: when it last dropped content, and what it holds (content two sessions
    share is counted, and kept, with the one that dropped it last)."""

    session_id: str
    last: float
    """Unix time it last dropped content (refreshed at most hourly for the same content)."""
    entries: int
    bytes: int
    """Bytes of the file it takes, estimated (its share of the stored JSON)."""


@dataclass(frozen=True)
class PrunePlan:
    """The sessions a retention limit removes (oldest first), and the archive's size."""

    sessions: tuple[SessionUsage, ...]
    used_bytes: int
    """Bytes of the archive in use now."""
    total_sessions: int

    @property
    def entries(self) -> int:
        """Entries the removed sessions hold."""
        return sum(s.entries for s in self.sessions)

    @property
    def bytes(self) -> int:
        """Bytes the removed sessions take (estimated)."""
        return sum(s.bytes for s in self.sessions)


class Recorded(str):
    """What :meth:`Archive.record` returns: the compaction id (a ``str``), with counts.

    ``entries`` were stored now; ``existing`` were in the archive already (dropped before,
    by this session or another); ``stored`` says whether the compaction was recorded.
    """

    entries: int
    existing: int

    def __new__(cls, compaction_id: str, entries: int = 0, existing: int = 0) -> Recorded:
        self = super().__new__(cls, compaction_id)
        self.entries = entries
        self.existing = existing
        return self

    @property
    def stored(self) -> bool:
        """Whether the compaction was recorded (it stored at least one entry)."""
        return self.entries > 0


@dataclass(frozen=True)
class Limits:
    """Retention limits (``None``: none), each a number >= 0 (bytes and sessions whole);
    ``now`` is the time ages are measured from (default: the current time).

    :raises ValueError: naming the limit and the value.
    """

    max_bytes: int | None = None
    max_age_seconds: float | None = None
    max_sessions: int | None = None
    now: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_age_seconds", "max_sessions"):
            value, whole = getattr(self, name), name != "max_age_seconds"
            kinds = (int,) if whole else (int, float)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, kinds) or not 0 <= value < math.inf
            ):
                what = "a whole number" if whole else "a number"
                raise ValueError(f"{name} must be {what} >= 0, got {value!r}")

    @property
    def none(self) -> bool:
        """Whether there is no limit at all (nothing is ever removed)."""
        return (self.max_bytes, self.max_age_seconds, self.max_sessions) == (None, None, None)

    def choose(self, rows: Sequence[Sequence[Any]], used: int) -> PrunePlan:
        """The sessions to remove, oldest first, from ``rows`` of ``(session, last, entries,
        stored JSON bytes)`` ordered by ``last``, with ``used`` bytes in use: those older
        than ``max_age_seconds``, all but the ``max_sessions`` most recent, and while the
        bytes exceed ``max_bytes`` the oldest others, never the most recent session."""
        stored = sum(r[3] for r in rows) or 1
        sessions = [SessionUsage(r[0], r[1], r[2], used * r[3] // stored) for r in rows]
        doomed: dict[str, SessionUsage] = {}
        if self.max_age_seconds is not None:
            cutoff = (time.time() if self.now is None else self.now) - self.max_age_seconds
            doomed.update((s.session_id, s) for s in sessions if s.last < cutoff)
        if self.max_sessions is not None:
            extra = max(len(sessions) - self.max_sessions, 0)
            doomed.update((s.session_id, s) for s in sessions[:extra])
        if self.max_bytes is not None:
            left = used - sum(s.bytes for s in doomed.values())
            for s in sessions[:-1]:  # never the newest session
                if left <= self.max_bytes:
                    break
                if s.session_id not in doomed:
                    doomed[s.session_id] = s
                    left -= s.bytes
        chosen = tuple(sorted(doomed.values(), key=lambda s: (s.last, s.session_id)))
        return PrunePlan(chosen, used, len(sessions))


def _block_texts(entry: Entry) -> list[str]:
    """The searchable text of each of ``entry``'s blocks (a string content: itself)."""
    if isinstance(entry.content, str):
        return [entry.content]
    texts: list[str] = []
    for b in entry.content:
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ThinkingBlock):
            texts.append(b.thinking)
        elif isinstance(b, ToolUseBlock):
            texts.append(f"{b.name} {json.dumps(b.input, ensure_ascii=False)}")
        elif isinstance(b, ToolResultBlock):
            texts.append(b.text())
    return texts


def searchable_text(entry: Entry) -> str:
    """What full-text search sees: texts, thinking, tool names and inputs, tool-result texts."""
    return "\n".join(_block_texts(entry))


def searchable_parts(entry: Entry) -> list[str]:
    """What recall by meaning embeds of ``entry``, a vector each: the
    :func:`~normandy_core.contract.recall_parts.parts` of each block's searchable text,
    so that no part runs across two tool results of a batch (at most
    :data:`~normandy_core.contract.recall_parts.MAX_PARTS`; an entry with no text: one
    empty part)."""
    from normandy_core.contract.recall_parts import MAX_PARTS, parts

    found = [p for text in _block_texts(entry) if text.strip() for p in parts(text)]
    return found[:MAX_PARTS] or [searchable_text(entry)]


class Prepared(NamedTuple):
    """One content a compaction dropped, ready to be written (the first entry with it)."""

    entry: Entry
    entry_json: str
    content_hash: str
    source_ids: tuple[str, ...]
    row: EntryRow
    """The row a compaction writes (:data:`EntryRow`)."""


def _prepare_one(entry: Entry) -> Prepared:
    """``entry`` serialized once, hashed, its caller's ids found, and its row made."""
    data = entry.model_dump_json()
    ids = tuple(source_ids(entry))
    row = entry_row(entry, data, ids)
    return Prepared(entry, data, row[1], ids, row)


def entry_row(entry: Entry, data: str, ids: Sequence[str]) -> EntryRow:
    """The row of ``entry`` whose JSON is ``data`` and whose caller's ids are ``ids``."""
    ids_json = json.dumps(list(ids)) if ids else None
    return (entry.id, content_hash(entry, data), entry.turn_id, entry.role, data, ids_json)


#: Entries serialized ahead by :func:`prepare`, by ``id(entry)`` (the entry is kept in its
#: :class:`Prepared`, so the id stays its own), at most :data:`PREPARED_MAX_BYTES` of JSON.
_prepared: dict[int, Prepared] = {}
_prepared_bytes = [0]
_prepared_lock = threading.Lock()
PREPARED_MAX_BYTES = 16 * 1024 * 1024


def prepare(entries: Sequence[Entry]) -> int:
    """Serialize, hash and find the caller's ids of ``entries`` ahead of the compaction that
    drops them (the background writer does it during the model call); how many were new."""
    done = 0
    for e in entries:
        if id(e) in _prepared:
            continue
        ready = _prepare_one(e)
        with _prepared_lock:
            if id(e) not in _prepared:
                _prepared[id(e)] = ready
                _prepared_bytes[0] += len(ready.entry_json)
            while _prepared_bytes[0] > PREPARED_MAX_BYTES and _prepared:  # the oldest go
                _prepared_bytes[0] -= len(_prepared.pop(next(iter(_prepared))).entry_json)
        done += 1
    return done


def _serialized(entries: Sequence[Entry]) -> builtins.list[Prepared]:
    """Each entry prepared: taken out of the cache when it is there, else now."""
    pop = _prepared.pop
    with _prepared_lock:
        hits = [pop(id(e), None) for e in entries]
        _prepared_bytes[0] -= sum([len(h.entry_json) for h in hits if h is not None])
    return [
        h if h is not None and h.entry is e else _prepare_one(e)
        for e, h in zip(entries, hits, strict=True)
    ]


def page(limit: int, offset: int) -> tuple[int, int]:
    """``(limit, offset)``, each a whole number from 0 to :data:`MAX_ROWS`.

    :raises ArchiveQueryError: naming the one that is not.
    """
    for name, value in (("limit", limit), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ROWS:
            raise ArchiveQueryError(
                f"{name} must be a whole number from 0 to {MAX_ROWS}, got {value!r}"
            )
    return limit, offset


def int_or_none(value: Any) -> int | None:
    """``value`` when it is an integer either database can store (64 bits), else ``None``."""
    ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_ROWS
    return value if ok else None


class Search(NamedTuple):
    """A full-text search as :meth:`ArchiveBackend.search` checked it, for the backend."""

    query: str
    session_id: str | None
    limit: int
    offset: int
    raw: bool
    any_term: bool
    seen: bool


class Dialect(abc.ABC):
    """The SQL the two backends write differently (the defaults are SQLite's)."""

    #: A statement's parameter.
    param = "?"
    #: The function giving a stored JSON's size, for retention by size.
    json_size = "length"
    #: The caller's ids of the row ``e`` as a JSON array (text), or NULL.
    source_ids = "e.source_ids"
    #: What orders compactions of the same time.
    compaction_order = "rowid"

    def table(self, name: str) -> str:
        """The table ``name`` as a statement names it."""
        return name

    @abc.abstractmethod
    def by_source_id(self, source_id: str, version: int) -> tuple[str, builtins.list[Any]]:
        """The condition (and parameters) on the row ``e`` holding the caller's id, in an
        archive of schema ``version``."""

    @abc.abstractmethod
    def seq_in(self, seqs: Sequence[int]) -> tuple[str, builtins.list[Any]]:
        """The condition (and parameters) on the row ``e`` being one of archive order ``seqs``."""

    @abc.abstractmethod
    def has_vectors(self) -> tuple[str, builtins.list[Any]]:
        """A statement (and parameters) giving a row when the ``vectors`` table exists."""


#: The columns of an :class:`ArchivedEntry`, in its fields' order.
_COLUMNS = (
    "e.seq, e.session_id, e.entry_json, e.content_hash, e.compaction_id, c.compactor, "
    "c.strategy, e.archived_at, {source_ids}"
)


class ArchiveBackend(abc.ABC):
    """The archive's public API, as the hook and the ``normandy archive`` commands use it.

    What both backends share is written here; each provides its connections, the write
    transaction, full-text search and pruning. Additions to the API are keyword arguments
    with defaults. Reading never creates or changes anything.
    """

    dialect: Dialect
    """The SQL this backend writes its own way."""

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the archive is, for messages (a file path, or a URL without password)."""

    @abc.abstractmethod
    def _read(self, work: Callable[[int, Run], T]) -> T | None:
        """``work(schema version, run)`` on a read connection; ``None``: no archive yet."""

    @abc.abstractmethod
    def _write(
        self, rows: Sequence[Prepared], compaction: CompactionRecord, meta_json: str, *, index: bool
    ) -> int:
        """Store the contents of ``rows`` the archive lacks, and the compaction when it
        stored some, in one committed transaction; how many it stored."""

    @abc.abstractmethod
    def _search(self, search: Search) -> builtins.list[ArchivedEntry]:
        """The entries ``search`` finds, best match first."""

    @abc.abstractmethod
    def _remove(self, limits: Limits, *, vacuum: bool) -> int:
        """Remove the sessions of :meth:`_plan`, chosen in the same transaction; how many
        entries went."""

    @abc.abstractmethod
    def _failure(self, message: str) -> ArchiveError:
        """The error to raise, its message naming the archive."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connections (the next call opens new ones)."""

    # -- vectors (recall by meaning) --------------------------------------------------

    @abc.abstractmethod
    def store_vectors(self, embedder: str, vectors: Mapping[int, Sequence[Sequence[float]]]) -> int:
        """Keep ``vectors`` (archive order ``seq`` -> the vectors of the entry's parts, in
        order) under the embedder key ``embedder``, in one transaction, replacing any it
        held; an entry removed meanwhile is skipped. How many entries it kept.

        :raises ArchiveError: they could not be written (PostgreSQL: the server lacks
            the ``vector`` extension, the message says what to install).
        """

    @abc.abstractmethod
    def nearest(
        self, embedder: str, session_id: str | None, query: Sequence[float], limit: int
    ) -> builtins.list[tuple[int, int, float]]:
        """The ``limit`` entries (of ``session_id``, as :meth:`unembedded` takes it) whose
        closest part, among the vectors of the embedder key ``embedder``, has the highest
        cosine with ``query``, closest first (the archive order among ties): ``(seq,
        part, cosine)``. Vectors of another length than ``query`` are never compared."""

    def unembedded(
        self, embedder: str, session_id: str | None = None, *, after: int = 0
    ) -> builtins.list[ArchivedEntry]:
        """The entries (of ``session_id``, as :meth:`search` with ``seen`` takes it; past
        archive order ``after``) that hold no vector of the embedder key ``embedder``
        yet, oldest first."""
        p = self.dialect.param
        cond, params = self._in_session(f"e.seq > {p}", [after], session_id, seen=True)
        # an archive no writer has given the vectors table yet has no vectors at all
        table = self._read(lambda version, run: bool(run(*self.dialect.has_vectors())))
        if table is None:
            return []
        if not table:
            return self._select(cond, params)
        lacking = (
            f" AND NOT EXISTS (SELECT 1 FROM {self.dialect.table('vectors')} v "
            f"WHERE v.embedder = {p} AND v.seq = e.seq)"
        )
        return self._select(cond + lacking, [*params, embedder])

    def by_seq(self, seqs: Sequence[int]) -> builtins.list[ArchivedEntry]:
        """The entries of archive order ``seqs``, in that order (those removed: left out)."""
        found = self._select(*self.dialect.seq_in(seqs))
        at = {a.seq: a for a in found}
        return [at[s] for s in seqs if s in at]

    def record(
        self,
        dropped: Sequence[Entry],
        *,
        session_id: str,
        compactor: str | None = None,
        strategy: str | None = None,
        model: str | None = None,
        mid_round: bool | None = None,
        meta: Mapping[str, Any] | None = None,
        compaction_id: str | None = None,
        at: float | None = None,
        index: bool = True,
    ) -> Recorded:
        """Archive one compaction's dropped entries in one commit, all or nothing.

        Content the archive already holds (dropped before by any session) is not stored
        again; the compaction is recorded only when it stored something. With ``index``
        false, SQLite leaves full-text indexing to a later ``index()`` (the hook's
        background writer); reads see the rows at once. PostgreSQL always indexes as it
        writes.

        :raises ArchiveError: it could not be written (disk full, locked past the busy
            timeout, permission, not an archive...), naming the archive and the cause;
            nothing of it was written.
        """
        cid = compaction_id or uuid.uuid4().hex
        rows: dict[str, Prepared] = {}
        for r in _serialized(dropped):
            rows.setdefault(r.content_hash, r)
        info = {k: v for k, v in (meta or {}).items() if k != "dropped"}
        compaction = CompactionRecord(
            compaction_id=cid,
            session_id=session_id,
            compactor=compactor,
            strategy=strategy,
            model=model,
            mid_round=mid_round,
            created_at=time.time() if at is None else at,
            entry_count=len(rows),  # at most; the row says what was stored
            tokens_before=int_or_none(info.get("tokens_before")),
            tokens_after=int_or_none(info.get("tokens_after")),
            dropped_count=len(dropped),
        )
        meta_json = json.dumps(info, ensure_ascii=False, default=str)
        stored = self._write(builtins.list(rows.values()), compaction, meta_json, index=index)
        return Recorded(cid, stored, len(rows) - stored)

    # -- retention --------------------------------------------------------------------

    def _used_bytes(self, run: Run, rows: Sequence[Sequence[Any]]) -> int:
        """The archive's bytes in use, for ``max_bytes``: here the stored JSON's."""
        return sum(int(r[3]) for r in rows)

    def _plan(self, run: Run, limits: Limits) -> PrunePlan:
        """The sessions ``limits`` remove, read with ``run`` (in the caller's transaction)."""
        e, s = self.dialect.table("entries"), self.dialect.table("seen")
        rows = run(
            "SELECT coalesce(s.session_id, e.session_id) AS sid, "
            "max(coalesce(s.at, e.archived_at)) AS last, count(*), "
            f"coalesce(sum({self.dialect.json_size}(e.entry_json)), 0) FROM {e} e "
            f"LEFT JOIN {s} s ON s.seq = e.seq GROUP BY sid ORDER BY last, sid",
            (),
        )
        return limits.choose(rows, self._used_bytes(run, rows))

    def prune_plan(
        self,
        *,
        max_bytes: int | None = None,
        max_age_seconds: float | None = None,
        max_sessions: int | None = None,
        now: float | None = None,
    ) -> PrunePlan:
        """What :meth:`prune` would remove with these limits (read-only).

        Whole sessions go, oldest first (a session's age is that of the last content it
        dropped): those older than ``max_age_seconds``, all but the ``max_sessions`` most
        recent, and while the bytes in use (SQLite: the file's; PostgreSQL: the stored
        JSON's) exceed ``max_bytes``, the oldest others, never the most recent session.
        """
        limits = Limits(max_bytes, max_age_seconds, max_sessions, now)

        def plan(version: int, run: Run) -> PrunePlan:
            if version == 1:
                raise self._failure(
                    "it is of version 1: it is moved to version 2 by the next write (prune "
                    "it, or archive a compaction, first)"
                )
            return self._plan(run, limits)

        return self._read(plan) or PrunePlan((), 0, 0)

    def prune(
        self,
        *,
        max_age_seconds: float | None = None,
        max_sessions: int | None = None,
        max_bytes: int | None = None,
        dry_run: bool = False,
        vacuum: bool = False,
        now: float | None = None,
    ) -> int:
        """Remove whole sessions, oldest first; how many entries went (or would go).

        The sessions of :meth:`prune_plan`, chosen and removed in one transaction. Content
        a removed session archived first but a kept one dropped since stays, under the
        kept session. With no limit nothing goes; ``dry_run`` removes nothing. ``vacuum``
        gives the space back to the file system (SQLite; PostgreSQL's autovacuum does it).
        """
        limits = Limits(max_bytes, max_age_seconds, max_sessions, now)
        if limits.none:
            return 0
        if dry_run:
            return self.prune_plan(**vars(limits)).entries
        return self._remove(limits, vacuum=vacuum)

    # -- reading ----------------------------------------------------------------------

    def _select(
        self,
        where: str,
        params: Sequence[Any],
        tail: str = "ORDER BY e.seq",
        *,
        source: str | None = None,
        v1: tuple[str, Sequence[Any]] | None = None,
    ) -> builtins.list[ArchivedEntry]:
        """The entries of ``source`` (default: the table, as ``e``) matching ``where``
        (``v1``: the condition in a version-1 archive instead)."""
        d = self.dialect

        def select(version: int, run: Run) -> builtins.list[tuple[Any, ...]]:
            cond, values = (where, params) if v1 is None or version != 1 else v1
            ids = "NULL" if version == 1 else d.source_ids
            return run(
                f"SELECT {_COLUMNS.format(source_ids=ids)} "
                f"FROM {source or d.table('entries') + ' e'} "
                f"LEFT JOIN {d.table('compactions')} c ON c.compaction_id = e.compaction_id "
                f"WHERE {cond} {tail}",
                values,
            )

        return [  # the caller's ids: the JSON array the row stores (NULL: none)
            ArchivedEntry(
                *(*r[:2], Entry.model_validate_json(r[2]), *r[2:8], (*json.loads(r[8] or "[]"),))
            )
            for r in self._read(select) or ()
        ]

    def _in_session(
        self, where: str, params: Sequence[Any], session_id: str | None, *, seen: bool = False
    ) -> tuple[str, builtins.list[Any]]:
        """``where`` and ``params``, limited to ``session_id`` when one is given: to what it
        archived, and with ``seen`` also to what it was the last to drop."""
        p = self.dialect.param
        if session_id is None:
            return where, builtins.list(params)
        if not seen:
            return f"{where} AND e.session_id = {p}", [*params, session_id]
        return (
            f"{where} AND (e.session_id = {p} OR e.seq IN "
            f"(SELECT seq FROM {self.dialect.table('seen')} WHERE session_id = {p}))",
            [*params, session_id, session_id],
        )

    def versions(
        self, entry_id: str, session_id: str | None = None
    ) -> builtins.list[ArchivedEntry]:
        """Every archived version of ``entry_id``, oldest first."""
        return self._select(
            *self._in_session(f"e.entry_id = {self.dialect.param}", [entry_id], session_id)
        )

    def recall(self, entry_id: str, session_id: str | None = None) -> Entry | None:
        """The entry as it was first dropped, or ``None``.

        Ids are unique within a session; pass ``session_id`` when sessions may share one.
        Content is stored once: an entry whose content was archived before under another
        id is found under that first id, by :meth:`by_source_id` or by :meth:`search`.
        """
        found = self.versions(entry_id, session_id)
        return found[0].entry if found else None

    def by_source_id(
        self, source_id: str, session_id: str | None = None
    ) -> builtins.list[ArchivedEntry]:
        """The archived entries holding the caller's id ``source_id`` (a tool-use id: the
        call and its result), oldest first."""
        return self._select(
            *self._in_session(*self.dialect.by_source_id(source_id, 2), session_id),
            v1=self._in_session(*self.dialect.by_source_id(source_id, 1), session_id),
        )

    def list(
        self, session_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> builtins.list[ArchivedEntry]:
        """Archived entries in archive order (oldest first), a page at a time."""
        p = self.dialect.param
        where, params = self._in_session("1 = 1", [], session_id)
        return self._select(
            where, [*params, *page(limit, offset)], f"ORDER BY e.seq LIMIT {p} OFFSET {p}"
        )

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
        raw: bool = False,
        match: str = "all",
        seen: bool = False,
    ) -> builtins.list[ArchivedEntry]:
        """Full-text search, best match first.

        Each whitespace-separated term must occur (``match="all"``), or any of them
        (``match="any"``: more of them rank higher), its punctuation taken literally; with
        ``raw`` the query is the backend's own syntax (SQLite's FTS5, PostgreSQL's web
        search) and ``match`` must stay ``"all"``. ``session_id`` limits it to what that
        session archived; with ``seen``, also to the content it was the last to drop
        though another session archived it first (the ``recall`` tool searches so).

        :raises ArchiveQueryError: a bad page, or a bad ``match`` (or ``"any"`` with ``raw``).
        """
        limit, offset = page(limit, offset)
        if match not in ("all", "any"):
            raise ArchiveQueryError(f"match must be 'all' or 'any', got {match!r}")
        if raw and match == "any":
            raise ArchiveQueryError("match='any' cannot be used with raw (write OR yourself)")
        return self._search(Search(query, session_id, limit, offset, raw, match == "any", seen))

    def compactions(
        self, session_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> builtins.list[CompactionRecord]:
        """Archived compactions, oldest first."""
        d = self.dialect
        where, params = (
            ("", []) if session_id is None else (f"WHERE session_id = {d.param}", [session_id])
        )
        limit, offset = page(limit, offset)

        def select(version: int, run: Run) -> builtins.list[tuple[Any, ...]]:
            dropped = "entry_count" if version == 1 else "dropped_count"
            return run(
                "SELECT compaction_id, session_id, compactor, strategy, model, mid_round, "
                f"created_at, entry_count, tokens_before, tokens_after, {dropped} "
                f"FROM {d.table('compactions')} {where} "
                f"ORDER BY created_at, {d.compaction_order} LIMIT {d.param} OFFSET {d.param}",
                [*params, limit, offset],
            )

        return [
            CompactionRecord(*(*r[:5], None if r[5] is None else bool(r[5]), *r[6:]))
            for r in self._read(select) or ()
        ]

    def count(self, session_id: str | None = None) -> int:
        """How many entries are archived (in ``session_id``, or in all sessions)."""
        where, params = self._in_session("1 = 1", [], session_id)
        rows = self._read(
            lambda version, run: run(
                f"SELECT count(*) FROM {self.dialect.table('entries')} e WHERE {where}", params
            )
        )
        return int(rows[0][0]) if rows else 0
