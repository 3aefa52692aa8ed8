"""``normandy archive list|show|search|prune``, also ``python -m normandy_archive``.

The core's ``normandy`` command adds ``archive`` with :func:`register_cli` (the entry point
``archive-cli`` of ``normandy_core.commands``); each parsed namespace carries the function
to run as ``args.func``, which returns the exit status. The commands read the archive
read-only; every problem is one line on stderr and :data:`EXIT_ERROR`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from normandy_archive.backend import ArchiveBackend, open_archive
from normandy_archive.errors import ArchiveError
from normandy_archive.settings import (
    ENV_MAX_AGE_DAYS,
    ENV_MAX_BYTES,
    ENV_MAX_SESSIONS,
    ENV_PATH,
    SECTION,
    current_settings,
)
from normandy_archive.store import MAX_ROWS, Archive, ArchivedEntry, searchable_text

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "add_commands", "main", "register_cli", "run"]

#: Exit status of a bad query or option, a missing or unreadable archive.
EXIT_ERROR = 2
#: Exit status of ``show`` for an id that is not archived.
EXIT_NOT_FOUND = 1


class _Refused(Exception):
    """A problem reported as one line and :data:`EXIT_ERROR`."""


def _whole(text: str, option: str) -> int:
    """``text`` given to ``option``: a whole number from 0 to ``MAX_ROWS``."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_ROWS:
        raise _Refused(f"{option} must be a whole number from 0 to {MAX_ROWS}, got {text!r}")
    return value


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp).isoformat(timespec="seconds")


#: The columns of ``list`` and ``search``: the archive's sequence number, when the entry
#: was archived, its session (the first 12 characters), the entry's id, role and turn,
#: the strategy (or compactor) that dropped it, and the start of its text.
HEADER = ("SEQ", "ARCHIVED", "SESSION", "ENTRY", "ROLE", "TURN", "DROPPED BY", "TEXT")


def _print_rows(items: Sequence[ArchivedEntry], as_json: bool, out: TextIO) -> None:
    if as_json or not items:
        out.writelines(json.dumps(item.as_dict(), ensure_ascii=False) + "\n" for item in items)
        return
    rows = []
    for item in items:
        text = " ".join(searchable_text(item.entry).split())
        rows.append(
            [
                str(item.seq),
                _when(item.archived_at),
                item.session_id[:12],
                item.entry.id,
                item.entry.role,
                item.entry.turn_id or "-",
                item.strategy or item.compactor or "-",
                text if len(text) <= 60 else text[:59] + "…",
            ]
        )
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


#: The limits of ``prune``: the setting each option overrides, its metavar and help.
_LIMITS = (
    ("max_bytes", "SIZE", "keep the archive under SIZE, such as 500MB"),
    ("max_age_days", "D", "remove sessions last compacted more than D days ago"),
    ("max_sessions", "N", "keep only the N most recent sessions"),
)


def _prune(args: argparse.Namespace, archive: ArchiveBackend, out: TextIO, prog: str) -> int:
    settings = current_settings()
    max_bytes, days, sessions = (  # each checked as the setting of the same name is
        getattr(settings, key)
        if getattr(args, key) is None
        else SECTION.check(key, getattr(args, key), "--" + key.replace("_", "-"))
        for key, _, _ in _LIMITS
    )
    if (max_bytes, days, sessions) == (None, None, None):
        raise _Refused(
            f"no limit: give --max-bytes, --max-age-days or --max-sessions (or set "
            f"{ENV_MAX_BYTES}, {ENV_MAX_AGE_DAYS} or {ENV_MAX_SESSIONS})"
        )
    age = None if days is None else days * 86_400
    limits = {"max_bytes": max_bytes, "max_age_seconds": age, "max_sessions": sessions}
    plan = archive.prune_plan(**limits)
    for s in plan.sessions:
        out.write(
            f"{s.session_id}  last {_when(s.last)}  {s.entries:,} entries  ~{_size(s.bytes)}\n"
        )
    entries = plan.entries
    if not args.dry_run:  # chosen again in the transaction that removes them
        entries = archive.prune(**limits, vacuum=args.vacuum)
    verb = "would remove" if args.dry_run else "removed"
    out.write(
        f"{prog}: {verb} {len(plan.sessions):,} of {plan.total_sessions:,} sessions "
        f"({entries:,} entries, ~{_size(plan.bytes)}) from {archive.location}; "
        f"{_size(plan.used_bytes)} in use before\n"
    )
    return 0


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
        limit, offset = _whole(args.limit, "--limit"), _whole(args.offset, "--offset")
    archive = _open(args)
    if cmd == "prune":
        return _prune(args, archive, out, prog)
    if cmd in ("list", "search"):
        if cmd == "list":
            found = archive.list(args.session, limit, offset)
        else:
            found = archive.search(
                " ".join(args.query),
                session_id=args.session,
                limit=limit,
                offset=offset,
                raw=args.raw,
                match="any" if args.any else "all",
            )
        _print_rows(found, args.json, out)  # nothing found: nothing on stdout, as grep does
        if not found:  # said on stderr: stdout stays empty, nothing to parse
            scope = f" of session {args.session!r}" if args.session else ""
            skipped = f" past the first {offset:,}" if offset else ""
            what = "no archived entries" if cmd == "list" else _no_match(args)
            sys.stderr.write(f"{prog}: {what}{scope}{skipped} in {archive.location}\n")
        elif cmd == "list" and (len(found) == limit or offset):  # say how much more there is
            total, last = archive.count(args.session), offset + len(found)
            if last < total or offset:
                sys.stderr.write(
                    f"{prog}: showing {len(found):,} of {total:,} entries ({offset + 1:,} to "
                    f"{last:,}); --limit N and --offset N show others\n"
                )
        return 0
    if cmd == "show":
        versions = archive.versions(args.entry_id, args.session)
        if not versions:  # a caller's id: a tool call's, say
            versions = archive.by_source_id(args.entry_id, args.session)
        if not versions:
            sys.stderr.write(f"{prog}: no archived entry {args.entry_id!r} in {archive.location}\n")
            return EXIT_NOT_FOUND
        chosen = versions if args.all else versions[:1]
        if args.json:
            _print_rows(chosen, True, out)
        else:
            out.writelines(item.entry_json + "\n" for item in chosen)
        return 0
    raise AssertionError(cmd)  # pragma: no cover - argparse requires a command


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


def _arguments(name: str, p: argparse.ArgumentParser) -> None:
    """Add the arguments of the command ``name`` to its parser ``p``."""
    if name == "show":
        p.add_argument(
            "entry_id", metavar="ID", help="an entry id, or a tool-call / tool-use id it holds"
        )
        p.add_argument("--session", default=None, help="the session the entry belongs to")
        p.add_argument("--all", action="store_true", help="every archived version")
        p.add_argument("--json", action="store_true", help="with archive details")
        return
    if name == "prune":
        for key, metavar, text in _LIMITS:
            env = next(k.env for k in SECTION.keys if k.name == key)
            p.add_argument(
                "--" + key.replace("_", "-"), metavar=metavar, help=f"{text} (default: ${env})"
            )
        p.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
        p.add_argument(
            "--vacuum", action="store_true", help="then give the space back to the file system"
        )
        return
    if name == "search":
        p.add_argument(
            "query", nargs="+", metavar="WORDS", help="words to find (all of them), taken literally"
        )
        p.add_argument("--raw", action="store_true", help="the query is FTS5 syntax")
        p.add_argument(
            "--any",
            action="store_true",
            help="any of the words, more of them ranking higher (as the recall tool searches)",
        )
    # list and search print a page of entries
    p.add_argument("--session", default=None, help="only this session id")
    p.add_argument("--limit", default="50", help="at most this many (default 50)")
    p.add_argument("--offset", default="0", help="skip this many first")
    p.add_argument("--json", action="store_true", help="one JSON object per line (no header)")


#: The commands: name, one-line help, description.
_COMMANDS = (
    (
        "list",
        "list archived entries, oldest first",
        "List archived entries, oldest first, one per line under a header: sequence "
        "number, when archived, session, entry id, role, turn, the strategy or compactor "
        "that dropped it, and the start of its text.",
    ),
    (
        "show",
        "print an archived entry as JSON, as it was dropped (by entry id, or by a "
        "tool-call / tool-use id it holds)",
        "Print an archived entry as JSON, exactly as it was dropped. Exit 1 when it is "
        "not archived.",
    ),
    (
        "search",
        "full-text search (FTS5), best match first",
        "Search the archived text (SQLite FTS5; PostgreSQL full-text search for a "
        "postgresql:// archive), best match first, in the columns of 'list'.",
    ),
    (
        "prune",
        "remove whole sessions, oldest first, past a size, age or count limit",
        "Remove whole sessions, oldest first (a session's age is that of its "
        "latest compaction), past the limits given or set in the environment. The most "
        "recent session is never removed for size.",
    ),
)


def add_commands(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--path`` and the ``list``, ``show``, ``search`` and ``prune`` commands to
    ``parser``; ``--path`` (or ``--url``) is accepted before or after the command."""
    _where(parser, None)
    sub = parser.add_subparsers(
        dest="archive_command", required=True, metavar="COMMAND", help="what to do"
    )
    for name, summary, description in _COMMANDS:
        command: argparse.ArgumentParser = sub.add_parser(
            name, help=summary, description=description
        )
        # after the command too; not given there, it leaves the one before it in place
        _where(command, argparse.SUPPRESS)
        _arguments(name, command)
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
