"""``normandy archive list|show|search``, and ``python -m normandy_archive`` / ``normandy-archive``.

The core's ``normandy`` command adds the ``archive`` command by calling
:func:`register_cli` (the entry point ``archive-cli`` of ``normandy_core.commands``, a
name of its own so that ``NORMANDY_DISABLE_PLUGINS=archive`` stops only the hook) with
its argparse subparsers; each parsed namespace carries the function to run as
``args.func`` (it returns the exit status).

Both commands read the archive read-only and answer every problem the same way: one
line on stderr and exit status 2 (no archive at the path, a file that is not an
archive, a symbolic link, a full-text query FTS5 refuses, a limit out of range), or 1
for ``show`` of an id that is not archived.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from normandy_archive.backend import ArchiveBackend, open_archive
from normandy_archive.errors import ArchiveError
from normandy_archive.settings import (
    ENV_MAX_AGE_DAYS,
    ENV_MAX_BYTES,
    ENV_MAX_SESSIONS,
    ENV_PATH,
    current_settings,
    parse_size,
)
from normandy_archive.store import MAX_ROWS, Archive, ArchivedEntry

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "add_commands", "main", "register_cli", "run"]

#: Exit status of a bad query or option, a missing or unreadable archive.
EXIT_ERROR = 2
#: Exit status of ``show`` for an id that is not archived.
EXIT_NOT_FOUND = 1


class _Refused(Exception):
    """A problem reported as one line and :data:`EXIT_ERROR`."""


def _count(text: str, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_ROWS:
        raise _Refused(f"{option} must be a whole number from 0 to {MAX_ROWS}, got {text!r}")
    return value


def _preview(item: ArchivedEntry, width: int = 60) -> str:
    from normandy_archive.store import searchable_text

    text = " ".join(searchable_text(item.entry).split())
    return text if len(text) <= width else text[: width - 1] + "…"


#: The columns of ``list`` and ``search``: the archive's sequence number, when the entry
#: was archived, its session (the first 12 characters), the entry's id, role and turn,
#: the strategy (or compactor) that dropped it, and the start of its text.
HEADER = ("SEQ", "ARCHIVED", "SESSION", "ENTRY", "ROLE", "TURN", "DROPPED BY", "TEXT")


def _print_rows(items: Sequence[ArchivedEntry], as_json: bool, out: TextIO) -> None:
    if as_json:
        for item in items:
            out.write(json.dumps(item.as_dict(), ensure_ascii=False) + "\n")
        return
    if not items:
        return
    rows = [
        [
            str(item.seq),
            dt.datetime.fromtimestamp(item.archived_at).isoformat(timespec="seconds"),
            item.session_id[:12],
            item.entry.id,
            item.entry.role,
            item.entry.turn_id or "-",
            item.strategy or item.compactor or "-",
            _preview(item),
        ]
        for item in items
    ]
    widths = [max(len(row[i]) for row in [list(HEADER), *rows]) for i in range(len(HEADER))]
    for row in [list(HEADER), *rows]:
        first = row[0].rjust(max(widths[0], 6))
        rest = [cell.ljust(widths[i + 1]) for i, cell in enumerate(row[1:-1])]
        out.write("  ".join([first, *rest, row[-1]]) + "\n")


def _size(n: int) -> str:
    for unit, step in (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n >= step:
            return f"{n / step:.1f} {unit}"
    return f"{n} B"


def _prune(args: argparse.Namespace, archive: ArchiveBackend, out: TextIO, prog: str) -> int:
    settings = current_settings()
    try:
        max_bytes = parse_size(args.max_bytes) if args.max_bytes is not None else None
    except ValueError as exc:
        raise _Refused(f"--max-bytes: {exc}") from None
    if max_bytes is None:
        max_bytes = settings.max_bytes
    days = _number(args.max_age_days, "--max-age-days", settings.max_age_days)
    sessions = (
        _count(args.max_sessions, "--max-sessions")
        if args.max_sessions is not None
        else settings.max_sessions
    )
    if (max_bytes, days, sessions) == (None, None, None):
        raise _Refused(
            f"no limit: give --max-bytes, --max-age-days or --max-sessions (or set "
            f"{ENV_MAX_BYTES}, {ENV_MAX_AGE_DAYS} or {ENV_MAX_SESSIONS})"
        )
    age = None if days is None else days * 86_400
    verb = "would remove" if args.dry_run else "removed"
    plan = archive.prune_plan(max_bytes=max_bytes, max_age_seconds=age, max_sessions=sessions)
    for s in plan.sessions:
        when = dt.datetime.fromtimestamp(s.last).isoformat(timespec="seconds")
        out.write(f"{s.session_id}  last {when}  {s.entries:,} entries  ~{_size(s.bytes)}\n")
    entries = plan.entries
    if not args.dry_run:  # chosen again in the transaction that removes them
        entries = archive.prune(
            max_bytes=max_bytes,
            max_age_seconds=age,
            max_sessions=sessions,
            vacuum=args.vacuum,
        )
    out.write(
        f"{prog}: {verb} {len(plan.sessions):,} of {plan.total_sessions:,} sessions "
        f"({entries:,} entries, ~{_size(plan.bytes)}) from {archive.location}; "
        f"{_size(plan.used_bytes)} in use before\n"
    )
    return 0


def _number(text: str | None, option: str, default: float | None) -> float | None:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise _Refused(f"{option} must be a number >= 0, got {text!r}")
    return value


def _open(args: argparse.Namespace) -> ArchiveBackend:
    archive = open_archive(args.path) if args.path else open_archive()
    if isinstance(archive, Archive) and not archive.exists():
        raise _Refused(
            f"no archive at {str(archive.path)!r} (nothing archived there yet; name another "
            f"with --path or {ENV_PATH})"
        )
    return archive


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run a parsed ``archive`` command; return the exit status.

    Every problem is one line on stderr and :data:`EXIT_ERROR`, never a traceback.
    """
    out = out or sys.stdout
    prog = f"{getattr(args, 'archive_prog', 'normandy archive')} {args.archive_command}"
    try:
        return _run(args, out, prog)
    except (_Refused, ArchiveError, ValueError, OSError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        sys.stderr.write(f"{prog}: {text}\n")
        return EXIT_ERROR


def _run(args: argparse.Namespace, out: TextIO, prog: str) -> int:
    cmd = args.archive_command
    if cmd in ("list", "search"):
        limit = _count(args.limit, "--limit")
        offset = _count(args.offset, "--offset")
    archive = _open(args)
    if cmd == "prune":
        return _prune(args, archive, out, prog)
    if cmd == "list":
        listed = archive.list(args.session, limit, offset)
        _print_rows(listed, args.json, out)
        if not listed:
            _nothing(prog, "no archived entries", archive, args.session, offset)
        elif len(listed) == limit or offset:  # a page: say how much more there is
            _showing(prog, len(listed), offset, archive.count(args.session))
        return 0
    if cmd == "search":
        query = " ".join(args.query)
        found = archive.search(
            query,
            session_id=args.session,
            limit=limit,
            offset=offset,
            raw=args.raw,
            match="any" if args.any else "all",
        )
        _print_rows(found, args.json, out)  # no match: nothing on stdout, as grep does
        if not found:
            _nothing(prog, _no_match(args), archive, args.session, offset)
        return 0
    if cmd == "show":
        versions = archive.versions(args.entry_id, args.session)
        if not versions:  # a caller's id: a tool call's, say
            versions = archive.by_source_id(args.entry_id, args.session)
        if not versions:
            sys.stderr.write(f"{prog}: no archived entry {args.entry_id!r} in {archive.location}\n")
            return EXIT_NOT_FOUND
        chosen = versions if args.all else versions[:1]
        for item in chosen:
            if args.json:
                out.write(json.dumps(item.as_dict(), ensure_ascii=False) + "\n")
            else:
                out.write(item.entry_json + "\n")
        return 0
    raise AssertionError(cmd)  # pragma: no cover - argparse requires a command


def _nothing(
    prog: str, what: str, archive: ArchiveBackend, session: str | None, offset: int
) -> None:
    """Say on stderr that ``list`` found nothing (stdout stays empty: nothing to parse)."""
    scope = f" of session {session!r}" if session else ""
    skipped = f" past the first {offset:,}" if offset else ""
    sys.stderr.write(f"{prog}: {what}{scope}{skipped} in {archive.location}\n")


def _showing(prog: str, shown: int, offset: int, total: int) -> None:
    """Say on stderr which part of ``total`` entries ``list`` printed, when not all."""
    if shown + offset >= total and not offset:
        return
    first, last = offset + 1, offset + shown
    sys.stderr.write(
        f"{prog}: showing {shown:,} of {total:,} entries ({first:,} to {last:,}); "
        "--limit N and --offset N show others\n"
    )


def _no_match(args: argparse.Namespace) -> str:
    """Why ``search`` found nothing, and how to widen it when the words were ANDed."""
    words = " ".join(args.query).split()  # the search splits the query so
    if args.raw or args.any or len(words) < 2:
        return f"no archived entry matches {' '.join(args.query)!r}"
    return (
        f"no archived entry holds all of the words {', '.join(map(repr, words))} (the words "
        "are ANDed; --any finds entries holding any of them, --raw 'A OR B' writes the OR)"
    )


def _where(parser: argparse.ArgumentParser, default: Any) -> None:
    """``--path`` and ``--url`` (one or the other) on ``parser``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--path",
        default=default,
        help=f"archive file or postgresql:// URL (default: ${ENV_PATH} or the user data dir)",
    )
    where.add_argument(
        "--url",
        dest="path",
        default=default,
        metavar="URL",
        help="a postgresql:// URL (the same as --path URL; default: $NORMANDY_ARCHIVE_URL)",
    )


def _paging_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a command that prints a page of entries (``list``, ``search``)."""
    p.add_argument("--session", default=None, help="only this session id")
    p.add_argument("--limit", default="50", help="at most this many (default 50)")
    p.add_argument("--offset", default="0", help="skip this many first")
    p.add_argument("--json", action="store_true", help="one JSON object per line (no header)")


def _show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "entry_id", metavar="ID", help="an entry id, or a tool-call / tool-use id it holds"
    )
    p.add_argument("--session", default=None, help="the session the entry belongs to")
    p.add_argument("--all", action="store_true", help="every archived version")
    p.add_argument("--json", action="store_true", help="with archive details")


def _search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "query", nargs="+", metavar="WORDS", help="words to find (all of them), taken literally"
    )
    p.add_argument("--raw", action="store_true", help="the query is FTS5 syntax")
    p.add_argument(
        "--any",
        action="store_true",
        help="any of the words, more of them ranking higher (as the recall tool searches)",
    )
    _paging_arguments(p)


def _prune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-bytes",
        metavar="SIZE",
        help=f"keep the archive under SIZE, such as 500MB (default: ${ENV_MAX_BYTES})",
    )
    p.add_argument(
        "--max-age-days",
        metavar="D",
        help=f"remove sessions last compacted more than D days ago (default: ${ENV_MAX_AGE_DAYS})",
    )
    p.add_argument(
        "--max-sessions",
        metavar="N",
        help=f"keep only the N most recent sessions (default: ${ENV_MAX_SESSIONS})",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    p.add_argument(
        "--vacuum", action="store_true", help="then give the space back to the file system"
    )


#: The commands: name, one-line help, description, and what adds their arguments.
_COMMANDS: tuple[tuple[str, str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    (
        "list",
        "list archived entries, oldest first",
        "List archived entries, oldest first, one per line under a header: sequence "
        "number, when archived, session, entry id, role, turn, the strategy or compactor "
        "that dropped it, and the start of its text.",
        _paging_arguments,
    ),
    (
        "show",
        "print an archived entry as JSON, as it was dropped (by entry id, or by a "
        "tool-call / tool-use id it holds)",
        "Print an archived entry as JSON, exactly as it was dropped. Exit 1 when it is "
        "not archived.",
        _show_arguments,
    ),
    (
        "search",
        "full-text search (FTS5), best match first",
        "Search the archived text (SQLite FTS5; PostgreSQL full-text search for a "
        "postgresql:// archive), best match first, in the columns of 'list'.",
        _search_arguments,
    ),
    (
        "prune",
        "remove whole sessions, oldest first, past a size, age or count limit",
        "Remove whole sessions, oldest first (a session's age is that of its "
        "latest compaction), past the limits given or set in the environment. The most "
        "recent session is never removed for size.",
        _prune_arguments,
    ),
)


def add_commands(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--path`` and the ``list``, ``show``, ``search`` and ``prune`` commands to
    ``parser``; ``--path`` (or ``--url``) is accepted before or after the command."""
    _where(parser, None)
    sub = parser.add_subparsers(
        dest="archive_command", required=True, metavar="COMMAND", help="what to do"
    )
    for name, summary, description, add_arguments in _COMMANDS:
        command: argparse.ArgumentParser = sub.add_parser(
            name, help=summary, description=description
        )
        # after the command too; not given there, it leaves the one before it in place
        _where(command, argparse.SUPPRESS)
        add_arguments(command)
    parser.set_defaults(func=run, archive_prog=parser.prog)
    return parser


def register_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``archive`` command to an argparse ``subparsers`` object (the core CLI's)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "archive",
        help="list, show and search what compaction removed",
        description="List, show, search and prune the archive of entries compaction "
        "dropped (normandy-archive). Every problem is one line on stderr and exit 2.",
    )
    return add_commands(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m normandy_archive COMMAND ...``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="normandy-archive", description="List, show and search what compaction removed."
    )
    add_commands(parser)
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:
        sys.stderr.write("normandy-archive: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    return status
