"""``normandy archive list|show|search``, and ``python -m normandy_archive`` / ``normandy-archive``.

The core's ``normandy`` command adds the ``archive`` command by calling
:func:`register_cli` with its argparse subparsers; each parsed namespace carries the
function to run as ``args.func`` (it returns the exit status).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from normandy_archive import select
from normandy_archive.paths import ENV_PATH
from normandy_archive.store import Archive, ArchivedEntry

__all__ = ["add_commands", "main", "register_cli", "run"]


def _preview(item: ArchivedEntry, width: int = 60) -> str:
    from normandy_archive.store import searchable_text

    text = " ".join(searchable_text(item.entry).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _print_rows(items: Sequence[ArchivedEntry], as_json: bool, out: TextIO) -> None:
    if as_json:
        for item in items:
            out.write(json.dumps(item.as_dict(), ensure_ascii=False) + "\n")
        return
    for item in items:
        when = dt.datetime.fromtimestamp(item.archived_at).isoformat(timespec="seconds")
        out.write(
            f"{item.seq:>6}  {when}  {item.session_id[:12]:<12}  {item.entry.id}  "
            f"{item.entry.role:<9}  {item.entry.turn_id or '-'}  "
            f"{item.strategy or item.compactor or '-'}  {_preview(item)}\n"
        )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run a parsed ``archive`` command; return the exit status."""
    out = out or sys.stdout
    try:
        archive = select.archive_for(getattr(args, "url", None), args.path)
    except ValueError as exc:
        sys.stderr.write(f"normandy-archive: error: {exc}\n")
        return 2
    try:
        return _run(archive, args, out)
    except select.unavailable() as exc:
        sys.stderr.write(f"normandy-archive: error: {exc}\n")
        return 2


def _run(archive: select.AnyArchive, args: argparse.Namespace, out: TextIO) -> int:
    cmd = args.archive_command
    if cmd == "list":
        _print_rows(archive.list(args.session, args.limit, args.offset), args.json, out)
        return 0
    if cmd == "search":
        query = " ".join(args.query)
        found = archive.search(
            query, session_id=args.session, limit=args.limit, offset=args.offset, raw=args.raw
        )
        _print_rows(found, args.json, out)
        return 0
    if cmd == "show":
        versions = archive.versions(args.entry_id, args.session)
        if not versions:
            where = archive.path if isinstance(archive, Archive) else archive.location
            sys.stderr.write(f"no archived entry {args.entry_id!r} in {where}\n")
            return 1
        chosen = versions if args.all else versions[:1]
        for item in chosen:
            if args.json:
                out.write(json.dumps(item.as_dict(), ensure_ascii=False) + "\n")
            else:
                out.write(item.entry_json + "\n")
        return 0
    raise AssertionError(cmd)  # pragma: no cover - argparse requires a command


def add_commands(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--path``/``--url`` and the ``list``, ``show`` and ``search`` commands to ``parser``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--path", default=None, help=f"archive file (default: ${ENV_PATH} or the user data dir)"
    )
    where.add_argument(
        "--url",
        default=None,
        help=f"PostgreSQL archive, postgresql://... (default: ${select.ENV_URL} when set)",
    )
    sub = parser.add_subparsers(dest="archive_command", required=True, metavar="COMMAND")

    def paging(p: argparse.ArgumentParser) -> None:
        p.add_argument("--session", default=None, help="only this session id")
        p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
        p.add_argument("--offset", type=int, default=0, help="skip this many first")
        p.add_argument("--json", action="store_true", help="one JSON object per line")

    p_list = sub.add_parser("list", help="list archived entries, oldest first")
    paging(p_list)
    p_show = sub.add_parser("show", help="print an archived entry as JSON, as it was dropped")
    p_show.add_argument("entry_id")
    p_show.add_argument("--session", default=None, help="the session the entry belongs to")
    p_show.add_argument("--all", action="store_true", help="every archived version")
    p_show.add_argument("--json", action="store_true", help="with archive details")
    p_search = sub.add_parser("search", help="full-text search, best match first")
    p_search.add_argument("query", nargs="+")
    p_search.add_argument(
        "--raw",
        action="store_true",
        help="the query is FTS5 syntax (PostgreSQL: web-search syntax)",
    )
    paging(p_search)
    parser.set_defaults(func=run)
    return parser


def register_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``archive`` command to an argparse ``subparsers`` object (the core CLI's)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "archive", help="list, show and search what compaction removed"
    )
    return add_commands(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m normandy_archive COMMAND ...``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="normandy-archive", description="List, show and search what compaction removed."
    )
    add_commands(parser)
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status
