"""The ``normandy`` command: ``plugins`` (and ``plugins show NAME``), ``compact`` and ``demo``.

Exit status: 0 success; 1 the compactor reported an error (nothing written) or an
internal error; 2 bad input or options (the message names the file and the line, or the
option, at fault); 3 a plugin error (unknown compactor with the installed names listed,
or a broken plugin named; ``normandy plugins`` when any plugin failed to load); 4 the
compactor compacted but the result is still over the window (written; meta
``target_missed`` says why).

Other distributions add subcommands through entry points in the group
``normandy_core.commands`` (``name = "module:register"``): ``register(subparsers)`` is
called with the argparse subparsers, adds its parsers and sets ``func`` (a callable taking
the parsed arguments and returning the exit status) with ``set_defaults``. The allow- and
deny-lists apply to them as to every plugin. A failing extension is reported on stderr
and skipped; it never breaks the other commands.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from normandy_core import __version__

if TYPE_CHECKING:
    from normandy_core.contract.compactor import Compactor
    from normandy_core.transcripts.jsonio import JsonSource
    from normandy_core.transcripts.result import CompactResult

__all__ = ["EXIT_COMPACTOR", "EXIT_INPUT", "EXIT_OK", "EXIT_OVER_WINDOW", "EXIT_PLUGIN", "main"]

EXIT_OK = 0
#: The compactor reported an error (or an internal error).
EXIT_COMPACTOR = 1
#: Bad input or options.
EXIT_INPUT = 2
#: Plugin error: unknown compactor, broken plugin.
EXIT_PLUGIN = 3
#: The compactor compacted, but the result is still over the window (it is written).
EXIT_OVER_WINDOW = 4

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """An error reported as one message and an exit status (never a traceback)."""

    def __init__(self, message: str, status: int = EXIT_INPUT) -> None:
        super().__init__(message)
        self.status = status


# -- options -----------------------------------------------------------------------


def parse_opts(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs to a dict; values are JSON literals when they parse, else strings.

    ``trigger=0.9`` gives a float, ``keep_last_turns=3`` an int, ``x=true`` a bool,
    ``x=null`` ``None``, ``x=[1,2]`` a list, and ``strategy=summarize`` the string.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(f"option --opt {pair!r}: expected KEY=VALUE, such as trigger=0.9")
        if not key.isidentifier():
            raise CliError(f"option --opt {pair!r}: {key!r} is not an option name")
        if key in out:
            raise CliError(f"option --opt {key!r} is given twice")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out


# -- reading and writing transcripts -------------------------------------------------


def read_source(path: str) -> JsonSource:
    """The transcript at ``path`` (``-``: stdin), read as JSON or JSON Lines by
    :func:`normandy_core.transcripts.jsonio.read_source`; a refusal is a :class:`CliError`
    (exit 2) with the reader's message, which names the file and the line at fault."""
    from normandy_core.transcripts.formats import MAX_NESTING
    from normandy_core.transcripts.jsonio import JsonInputError, read_source as read_json

    try:
        return read_json(path, max_nesting=MAX_NESTING)
    except JsonInputError as exc:
        raise CliError(str(exc)) from exc


def _write(path: str | None, text: str) -> None:
    if path is None or path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def _json_default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return repr(obj)


# -- plugins ------------------------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    """``normandy plugins [--json]``: every plugin once, each problem once; exit 3 on any."""
    from normandy_core.contract.plugins import list_plugins

    # The listing reports every load failure itself: the loader's log line would repeat it.
    loader = logging.getLogger("normandy_core.plugins")
    silenced, loader.disabled = loader.disabled, True
    try:
        rows = list_plugins(load=True)
    finally:
        loader.disabled = silenced
    status = EXIT_PLUGIN if any(r.failed for r in rows) else EXIT_OK
    # One line per distinct problem (a conflict is one problem however many rows show it).
    problems = dict.fromkeys(
        f"{r.kind} {r.name!r} ({r.status}): {r.error}" for r in rows if r.error
    )
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        for line in problems:  # stdout is JSON: the problems go to stderr, once
            print(f"normandy plugins: {line}", file=sys.stderr)
        return status
    if not rows:
        print("no Normandy plugins installed")
        return EXIT_OK
    from normandy_core.app.console import format_table

    table = [[r.kind, r.name, r.distribution, r.version, r.module, r.status] for r in rows]
    print(format_table(table, ["KIND", "NAME", "DISTRIBUTION", "VERSION", "MODULE", "STATUS"]))
    if problems:
        print()
        for line in problems:
            print(line)
    return status


def cmd_plugins_show(args: argparse.Namespace) -> int:
    """``normandy plugins show NAME [--json]``: a compactor's options, from its options model."""
    from normandy_core.contract.options import describe_options, model_description

    compactor = _compactor_to_show(args.name)
    model = compactor.options_model
    options = describe_options(model) if model is not None else None
    about = model_description(model) if model is not None else ""
    if args.json:
        data = {
            "name": compactor.name,
            "kind": "compactor",
            "distribution": compactor.distribution,
            "version": compactor.version,
            "module": compactor.module,
            "description": about,
            "options": options,
        }
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return EXIT_OK
    lines = [
        f"compactor {compactor.name!r} from {compactor.distribution} {compactor.version} "
        f"({compactor.module})"
    ]
    if about:
        lines += ["", *_plain(about).splitlines()]
    lines.append("")
    lines += _options_text(options)
    print("\n".join(lines))
    return EXIT_OK


def _compactor_to_show(name: str) -> Compactor:
    """The installed compactor ``name``; a :class:`CliError` (exit 3) when ``name`` is a
    plugin of another kind, since only compactors take options."""
    from normandy_core.contract.plugins import list_plugins, resolve_compactor
    from normandy_core.errors import UnknownCompactorError

    try:
        return resolve_compactor(name)
    except UnknownCompactorError as exc:
        kinds = {row.kind for row in list_plugins() if row.name == name}
        what = [text for kind, text in _KIND_NAMES if kind in kinds]
        if what:
            raise CliError(
                f"{name!r} is {' and '.join(what)}, not a compactor: only compactors "
                "take options. "
                f"Installed compactors: {', '.join(repr(n) for n in exc.installed)}",
                EXIT_PLUGIN,
            ) from None
        raise


def _options_text(options: list[dict[str, Any]] | None) -> list[str]:
    """The lines of ``plugins show`` that describe the options (``None``: no options model)."""
    import textwrap

    if options is None:
        return [
            "It declares no options model (no options_model hook): its options are given "
            "to it as a read-only mapping and checked by its validate_opts, if it has one."
        ]
    if not options:
        return ["It takes no options."]
    lines = textwrap.wrap(
        "Options (--opt KEY=VALUE on the command line, opts={...} for compact(), "
        "compactor_opts={...} for AgentConfig, NORMANDY_COMPACTOR_OPTS or the opts "
        "table of normandy.toml):",
        width=88,
    )
    for option in options:
        value = "(required)" if option["required"] else f"= {_python_literal(option['default'])}"
        lines += ["", f"  {option['name']}: {option['type']} {value}"]
        if option["description"]:
            for para in _plain(option["description"]).split("\n\n"):
                lines += textwrap.wrap(
                    " ".join(para.split()),
                    width=88,
                    initial_indent="      ",
                    subsequent_indent="      ",
                    break_on_hyphens=False,
                )
    return lines


#: How ``plugins show`` names what is not a compactor.
_KIND_NAMES = (("hook", "a hook plugin"), ("command", "a command"), ("adapter", "an adapter"))


def _plain(text: str) -> str:
    """Docstring text for a terminal: ``x`` (reStructuredText literals) as `x`."""
    return text.replace("``", "`")


def _python_literal(value: Any) -> str:
    """A JSON-ready default as Python writes it (``None``, ``True``, ``'text'``)."""
    return repr(value)


# -- compact ------------------------------------------------------------------------


#: How to give a window, in the command line's vocabulary.
_CLI_HINT = (
    "pass --window N, or --model M for a model the catalog knows (or set window or model "
    "in normandy.toml or pyproject.toml [tool.normandy])"
)


def survival_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The survival rules the command line sets (``--keep-tool``, ``--no-keep-first-user``,
    ``--no-keep-current-request``, ``--summary-instructions``), as a mapping; empty when it
    sets none."""
    rules: dict[str, Any] = {}
    if getattr(args, "no_keep_first_user", False):
        rules["keep_first_user"] = False
    if getattr(args, "no_keep_current_request", False):
        rules["keep_current_request"] = False
    if getattr(args, "keep_tool", None):
        rules["keep_tools"] = list(args.keep_tool)
    if getattr(args, "summary_instructions", None) is not None:
        rules["summary_instructions"] = args.summary_instructions
    return rules


def _settings(
    args: argparse.Namespace, opts: dict[str, Any], keys: tuple[str, ...] | None = None
) -> Any:
    """The command's settings: its options over the configuration (environment,
    normandy.toml, pyproject.toml [tool.normandy]) over ``window_manager``.

    ``--opt`` pairs, when given, are the options as a whole (as ``opts=`` of
    :func:`normandy_core.compact`).
    """
    from normandy_core.contract.settings import KEYS, current_settings

    return current_settings().resolve(
        "window_manager",
        compactor=args.compactor,
        opts=opts or None,
        model=getattr(args, "model", None),
        window=args.window,
        timeout=getattr(args, "timeout", None),
        keys=KEYS if keys is None else keys,
        survival=survival_from_args(args) or None,
    )


def _prepare(settings: Any, entry: str, client: Any = None) -> Any:
    """The prepared config (compactor resolved, options and survival rules validated,
    window found), up front."""
    from normandy_core.transcripts.facade import prepare_resolved

    return prepare_resolved(settings, entry=entry, hint=_CLI_HINT, client=client)


#: ``--client`` choices: the provider SDK reads its key and URL from these variables.
_CLIENT_ENV = {
    "anthropic": "ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL",
    "openai": "OPENAI_API_KEY, OPENAI_BASE_URL",
}


def _client(provider: str | None, model: str | None) -> Any:
    """The model client ``--client`` asks for (``None`` without it), for ``--model``."""
    if provider is None:
        return None
    if not model:
        raise CliError(f"--client {provider} needs --model (the model that writes summaries)")
    from normandy_core.clients import ModelClientError

    try:
        if provider == "anthropic":
            from normandy_core.clients.anthropic import AnthropicClient

            return AnthropicClient(model)
        from normandy_core.clients.openai import OpenAIClient

        return OpenAIClient(model)
    except ModelClientError as exc:  # the SDK is not installed
        raise CliError(f"--client {provider}: {exc}") from exc


def cmd_compact(args: argparse.Namespace) -> int:
    """``normandy compact INPUT ...``."""
    from normandy_core.contract.boundary import check_focus
    from normandy_core.transcripts.facade import compact_with
    from normandy_core.transcripts.formats import TranscriptError

    settings = _settings(args, parse_opts(args.opt))
    client = _client(args.client, settings.model)
    acc = _prepare(settings, "normandy compact", client)
    if settings.configured:  # say where what the command line did not give came from
        print(f"normandy compact: {settings.note()}", file=sys.stderr)
    src = read_source(args.input)
    try:
        check_focus(args.force, args.focus, entry="normandy compact --focus")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    try:
        result = compact_with(
            acc,
            src.data,
            mid_round=args.mid_round,
            format=args.format,
            force=args.force,
            focus=args.focus,
        )
    except TranscriptError as exc:
        field = f", field {exc.field!r}" if exc.field else ""
        raise CliError(f"{src.where(exc.index)}{field}: {exc.problem}") from exc
    meta, fmt = result.meta, result.format
    if args.meta:
        _write(args.meta, json.dumps(_meta_for_file(meta), indent=2, default=_json_default) + "\n")
    if result.error is not None:
        print(
            f"normandy compact: compactor {settings.compactor!r} failed: {result.error}; "
            "nothing written",
            file=sys.stderr,
        )
        return EXIT_COMPACTOR
    _write(args.output, src.render(result.messages))
    msg = _outcome_line(result, settings.model)
    given = _given(src.data, fmt)
    print(f"normandy compact: {src.name} ({fmt}, {given}): {msg}", file=sys.stderr)
    return _report_written(result, settings.compactor)


def _outcome_line(result: CompactResult, model: str | None) -> str:
    """What ``normandy compact`` says of its result: the token figures of a compaction,
    else the transcript's size (and why a forced compaction was declined)."""
    from normandy_core.conversation.tokens import (
        counter_description,
        default_counter_for,
        get_counter,
    )

    meta = result.meta
    if meta.get("compacted"):
        before, after = meta.get("tokens_before"), meta.get("tokens_after")
        tokens = (
            f"{before:,} -> {after:,} tokens"
            if isinstance(before, int) and isinstance(after, int)
            else "compacted"
        )
        strategy = f" (strategy {meta['strategy']})" if meta.get("strategy") else ""
        return f"{tokens}{strategy}, {len(result.dropped)} entries dropped"
    counter = get_counter(default_counter_for(model))
    size = result.memory.tokens(counter)
    msg = (
        f"not compacted: {size:,} tokens (counted by {counter_description(counter)}), "
        "0 entries dropped"
    )
    if meta.get("declined"):
        msg += f"; --force declined: {meta['declined']}"
    return msg


def _report_written(result: CompactResult, compactor: str) -> int:
    """Print what the hook plugins did with the dropped entries and whether the written
    transcript is still over the window; the exit status."""
    for item in result.notes:
        message = item.get("note", {}).get("message")
        if message:
            print(f"normandy compact: {' '.join(str(message).split())}", file=sys.stderr)
    if result.target_missed is not None:
        print(
            f"normandy compact: compactor {compactor!r} could not bring the transcript "
            f"under the window (target_met false): {result.target_missed}",
            file=sys.stderr,
        )
        return EXIT_OVER_WINDOW
    return EXIT_OK


def _given(data: Any, fmt: str) -> str:
    """How much the input held, in its own terms: its messages (or a Normandy dump's
    entries on the active branch), whatever the compactor did with them."""
    if fmt == "normandy" and isinstance(data, dict):
        parents = {
            e.get("id"): e.get("parent_id")
            for e in data.get("entries") or []
            if isinstance(e, dict)
        }
        count, node, seen = 0, data.get("head"), set()
        while node is not None and node in parents and node not in seen:
            seen.add(node)
            count += 1
            node = parents[node]
        return f"{count:,} entr{'y' if count == 1 else 'ies'}"
    items = data.get("messages", data.get("input")) if isinstance(data, dict) else data
    count = len(items) if isinstance(items, list) else 0
    return f"{count:,} message{'' if count == 1 else 's'}"


def _meta_for_file(meta: dict[str, Any]) -> dict[str, Any]:
    out = dict(meta)
    dropped = meta.get("dropped")
    if dropped:
        out["dropped_ids"] = [getattr(e, "id", None) for e in dropped]
    return out


# -- demo ---------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """``normandy demo``: replay the bundled session and report."""
    from normandy_core.app.cli_demo import run_demo
    from normandy_core.app.demo import DEMO_WINDOW

    settings = _settings(args, parse_opts(args.opt), keys=("compactor", "opts", "survival"))
    args.compactor = settings.compactor
    args.survival = settings.survival
    opts = dict(settings.opts or {})
    if args.plot:  # checked first: the chart is written only after the whole replay
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise CliError(
                f"--plot needs matplotlib ({exc}): pip install 'normandy-core[plot]'"
            ) from exc
    if args.window is None and "context_window" not in opts:
        args.window = DEMO_WINDOW
    _prepare(
        settings._replace(opts=opts, model=args.model, window=args.window),
        "normandy demo",
    )
    if settings.configured:
        print(f"normandy demo: {settings.note()}")
    return run_demo(args, opts)


# -- config -------------------------------------------------------------------------


def cmd_config(args: argparse.Namespace) -> int:
    """``normandy config [--json]``: the settings ``normandy compact`` and ``compact()``
    would use here, and where each comes from (checked, as they are when used), then the
    sections the installed plugins declare (``[archive]``)."""
    from normandy_core.contract.settings import KEYS, current_settings, settings_sections

    current = current_settings()
    settings = current.resolve("window_manager")
    files = [str(p) for p in current.files]
    rows = []
    for key in KEYS:
        value = getattr(settings, key)
        if key == "compactor" and "compactor" not in settings.origins:
            origin = "default"
        else:
            origin = settings.origins.get(key, "not set")
        rows.append({"key": key, "value": value, "from": origin})
    sections = {
        name: [{"key": r.key, "value": r.value, "from": r.origin} for r in current.describe(sec)]
        for name, sec in settings_sections().items()
    }
    if args.json:
        report = {"settings": rows, "sections": sections, "files": files}
        print(json.dumps(report, indent=2, default=_json_default))
        return EXIT_OK
    _print_settings(rows, sections, files)
    return EXIT_OK


def _print_settings(
    rows: list[dict[str, Any]], sections: dict[str, list[dict[str, Any]]], files: list[str]
) -> None:
    """``normandy config``'s tables: the core's keys, then each plugin's section."""
    from normandy_core.app.console import format_table
    from normandy_core.contract.settings import ENV_CONFIG

    def table(of: list[dict[str, Any]]) -> str:
        cells = [[r["key"], _shown(r["value"]), r["from"]] for r in of]
        return format_table(cells, ["KEY", "VALUE", "FROM"])

    print(table(rows))
    for name, section_rows in sections.items():
        print(f"\n[{name}]")
        print(table(section_rows))
    print()
    choice = os.environ.get(ENV_CONFIG, "").strip()
    if files:
        print("files read: " + ", ".join(files))
    elif choice.lower() == "off":
        print(f"no settings file read ({ENV_CONFIG}=off)")
    else:
        print(f"no normandy.toml or pyproject.toml with [tool.normandy] from {os.getcwd()} upward")


def _shown(value: Any) -> str:
    """A setting's value as ``normandy config`` prints it (``-`` when not set)."""
    if value is None:
        return "-"
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    return value if isinstance(value, str) else json.dumps(value, default=_json_default)


# -- the parser ---------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


class Subcommands(Protocol):
    """What ``add_subparsers()`` returns, as far as the commands use it."""

    def add_parser(
        self, name: str, *, help: str | None = ..., description: str | None = ...
    ) -> argparse.ArgumentParser:
        """A parser for the subcommand ``name``."""
        ...


def _add_subcommands(parser: argparse.ArgumentParser, dest: str, help: str) -> Subcommands:
    """The subcommands of ``parser``; the one given is stored as ``dest``."""
    return parser.add_subparsers(dest=dest, metavar="COMMAND", parser_class=_Parser, help=help)


def _add_compactor_args(
    parser: argparse.ArgumentParser, *, default_window: int | None, default_model: str | None
) -> None:
    """--compactor, --opt, --window, the survival rules and --model, which ``compact`` and
    ``demo`` share; ``default_window`` is only shown in the help (``None``: the configured
    one, as for ``default_model``)."""
    parser.add_argument(
        "--compactor",
        default=None,
        help="compactor name (default: the configured one, see 'normandy config', else "
        "window_manager)",
    )
    parser.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a compactor option; VALUE is a JSON literal (0.9, 3, true, [..]) or a string; "
        "repeatable; given, they replace the configured options",
    )
    parser.add_argument(
        "--window",
        type=_positive_int,
        default=None,
        metavar="N",
        help="context window in tokens (pins the context_window option)"
        + (f"; default {default_window:,}" if default_window else "; default: the configured one"),
    )
    parser.add_argument(
        "--keep-tool",
        action="append",
        default=[],
        metavar="NAME",
        help="survival rule: keep every call of tool NAME with its results; repeatable",
    )
    parser.add_argument(
        "--no-keep-first-user",
        action="store_true",
        help="survival rule off: let compaction drop the first user message (the task)",
    )
    parser.add_argument(
        "--no-keep-current-request",
        action="store_true",
        help="survival rule off: let compaction drop the user message that opened the current turn",
    )
    parser.add_argument(
        "--summary-instructions",
        metavar="TEXT",
        help="instructions the model summarizer gets with every summary it writes",
    )
    parser.add_argument(
        "--model",
        metavar="M",
        default=default_model,
        help=f"default {default_model}"
        if default_model
        else "model id (token counter, catalog window); default: the configured one",
    )


def build_parser(problems: list[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser, with extension subcommands registered.

    An extension that fails to load or register is skipped; its message is appended to
    ``problems`` when given (:func:`main` prints it, except for ``normandy plugins``,
    which lists it), else printed on stderr.
    """
    parser = _Parser(
        prog="normandy",
        description="Keep an LLM agent's conversation inside its model's context window.",
    )
    parser.add_argument("--version", action="version", version=f"normandy {__version__}")
    commands = _add_subcommands(parser, "command", "the command to run")
    _add_plugins_command(commands)
    _add_compact_command(commands)
    _add_demo_command(commands)
    _add_config_command(commands)
    _register_extensions(commands, problems)
    return parser


def _add_plugins_command(commands: Subcommands) -> None:
    """``normandy plugins [--json]`` and ``normandy plugins show NAME [--json]``."""
    parser = commands.add_parser(
        "plugins",
        help="list installed compactors and hook plugins; show a compactor's options",
        description="List every installed compactor, hook plugin and command extension "
        "(read from the entry points, so a broken one is listed with its error), or show "
        "one compactor's options with 'normandy plugins show NAME'. Exits 3 when any "
        "plugin failed to load.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=cmd_plugins)
    show = _add_subcommands(parser, "plugins_command", "what to show").add_parser(
        "show",
        help="a compactor's options: types, defaults and descriptions",
        description="Print a compactor's options from its options model: each option's "
        "type (with its constraints), default and description.",
    )
    show.add_argument("name", metavar="NAME", help="the compactor's name, as configured")
    show.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    show.set_defaults(func=cmd_plugins_show)


def _add_compact_command(commands: Subcommands) -> None:
    """``normandy compact INPUT ...``."""
    parser = commands.add_parser(
        "compact",
        help="compact a transcript (OpenAI, Anthropic or Normandy; JSON or JSON Lines)",
        description="Compact a transcript once and write it back in the same format.",
    )
    parser.add_argument("input", metavar="INPUT", help="transcript file, or - for stdin")
    parser.add_argument("-o", "--output", metavar="OUT", help="write here (default: stdout)")
    parser.add_argument(
        "--format",
        choices=["auto", "openai", "anthropic", "responses", "normandy"],
        default="auto",
        help="transcript format of INPUT (default: auto, detected from the messages)",
    )
    _add_compactor_args(parser, default_window=None, default_model=None)
    parser.add_argument(
        "--mid-round", action="store_true", help="the last tool round is still open"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="compact now, whatever the compactor's trigger (a compactor that cannot says "
        "why, and the transcript is written unchanged)",
    )
    parser.add_argument(
        "--focus",
        metavar="TEXT",
        help="with --force: what the summary should keep (the model summarizer receives it "
        "as instructions)",
    )
    parser.add_argument("--meta", metavar="PATH", help="write the compactor's meta as JSON here")
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="S",
        help="abandon a compactor that takes longer than S seconds (exit 1, nothing written); "
        "default: the configured timeout, else none",
    )
    parser.add_argument(
        "--client",
        choices=sorted(_CLIENT_ENV),
        help="a model client for a compactor that asks the model (--opt summarizer=model), "
        "calling --model; the provider's SDK (extra normandy-core[anthropic] or [openai]) "
        "reads its key and URL from "
        + "; ".join(f"{k}: {v}" for k, v in sorted(_CLIENT_ENV.items())),
    )
    parser.set_defaults(func=cmd_compact)


def _add_demo_command(commands: Subcommands) -> None:
    """``normandy demo ...``."""
    from normandy_core.app.demo import DEMO_MODEL, DEMO_WINDOW

    parser = commands.add_parser(
        "demo",
        help="replay a long bundled agent session through the turn loop",
        description="Replay the bundled tool-using session through run_turn and compact it.",
    )
    _add_compactor_args(parser, default_window=DEMO_WINDOW, default_model=DEMO_MODEL)
    parser.add_argument("--turns", type=_positive_int, metavar="N", help="replay only N turns")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG chart (needs the plot extra)")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        default=None,
        help="draw the progress bar even when stderr is not a terminal",
    )
    progress.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const=False,
        help="never draw the progress bar (default: drawn when stderr is a terminal)",
    )
    parser.add_argument("--quiet", action="store_true", help="no line per compaction")
    parser.set_defaults(func=cmd_demo)


def _add_config_command(commands: Subcommands) -> None:
    """``normandy config [--json]``."""
    parser = commands.add_parser(
        "config",
        help="show the settings compact uses here and where each comes from",
        description="Show the compactor settings that 'normandy compact' and compact() "
        "use in this directory: each key's value and its source (an argument of theirs "
        "wins; then NORMANDY_COMPACTOR and NORMANDY_COMPACTOR_OPTS, normandy.toml, "
        "pyproject.toml [tool.normandy], the default), checked as they are when used. "
        "Exits 2 on a bad setting, 3 on an unknown or broken compactor.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=cmd_config)


def _register_extensions(commands: Subcommands, problems: list[str] | None = None) -> None:
    """Let each command extension add its subcommands to ``commands``; report failures."""
    from normandy_core.contract.plugins import command_registrars, mark_command_failed

    def report(message: str) -> None:
        if problems is None:
            print(f"normandy: {message}", file=sys.stderr)
        else:
            problems.append(message)

    try:
        registrars = command_registrars()
    except Exception as exc:  # an unreadable installation must not break the core commands
        print(f"normandy: command extensions unavailable: {exc}", file=sys.stderr)
        return
    for name, register in registrars:
        if isinstance(register, Exception):
            report(str(register))
            continue
        try:
            register(commands)
        except Exception as exc:
            message = f"command extension {name!r} failed to register: {type(exc).__name__}: {exc}"
            mark_command_failed(name, message)
            report(message)


class _OneLineFormatter(logging.Formatter):
    """``normandy: message``, without the traceback unless ``NORMANDY_DEBUG`` is set.

    A faulty plugin is logged with its exception (the boundary keeps the traceback for
    applications that configure logging); on the command line it is one line on stderr.
    """

    def format(self, record: logging.LogRecord) -> str:
        if (record.exc_info or record.exc_text) and not os.environ.get("NORMANDY_DEBUG"):
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return super().format(record)


def _not_an_outcome(record: logging.LogRecord) -> bool:
    """Whether ``record`` is not a boundary's outcome line (the commands report those)."""
    return not hasattr(record, "normandy_outcome")


def _log_to_stderr() -> None:
    """Send warnings and errors to stderr as one line each (unless logging is configured).

    A boundary's own outcome line (a failed compaction is a warning) is left out: every
    command reports the outcome itself, in its own words, once.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter("normandy: %(message)s"))
    handler.setLevel(logging.WARNING)
    handler.addFilter(_not_an_outcome)
    root.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    from normandy_core.errors import OptionsError, PluginError, WindowUnknownError

    _log_to_stderr()
    problems: list[str] = []
    parser = build_parser(problems)

    def say_problems() -> None:
        for message in problems:
            print(f"normandy: {message}", file=sys.stderr)

    try:
        args = parser.parse_args(argv)
    except SystemExit:
        say_problems()  # with --help, or a command the broken extension would have added
        raise
    if args.command != "plugins":  # which lists them itself
        say_problems()
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_INPUT
    try:
        return func(args)
    except CliError as exc:
        print(f"normandy {args.command}: {exc}", file=sys.stderr)
        return exc.status
    except (OptionsError, WindowUnknownError) as exc:
        text = str(exc)
        prefix = f"normandy {args.command}"
        print(text if text.startswith(prefix) else f"{prefix}: {text}", file=sys.stderr)
        return EXIT_INPUT
    except PluginError as exc:
        print(f"normandy {args.command}: {exc}", file=sys.stderr)
        return EXIT_PLUGIN
    except KeyboardInterrupt:
        print("normandy: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("NORMANDY_DEBUG"):
            raise
        print(
            f"normandy {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(set NORMANDY_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_COMPACTOR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
