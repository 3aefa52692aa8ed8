"""``normandy_core.compact()``: compact an OpenAI or Anthropic message list in one call.

For users of other agent frameworks: give the messages as your framework holds them, get
them back compacted in the same format, with the compactor's ``meta``.

Rules for odd input (each raises :class:`~normandy_core.transcripts.formats.TranscriptError`, a
``ValueError`` whose message names the message index and the field; nothing is guessed):

- a tool result that answers no tool use of the assistant message right before it;
- a tool use without a result in the next message (allowed only in the last message: a
  round still waiting for its tools, the mid-round case);
- a tool-use id used twice anywhere in the transcript (both places are named): results
  could not be paired, nor dropped entries reported, unambiguously;
- a role or content block the format does not define (``function_call``, unknown block
  types, an assistant message holding tool results...);
- a value nested deeper than :data:`~normandy_core.transcripts.formats.MAX_NESTING` (200) levels,
  or a string holding a lone surrogate (a ``\\ud800`` JSON escape without its pair):
  neither could be counted, written back as UTF-8 or sent to a provider.

Any other Unicode is kept as given: NUL, right-to-left marks, emoji and characters of
every plane come back unchanged. An empty list is a transcript with nothing to compact.

Nothing is regenerated: every message the compactor keeps comes back as the very object
it was given (the same dict, the same SDK object, every field and unknown block), and
only what compaction creates or changes (markers, summaries, shortened results,
stripped thinking) is rendered anew, in the input's format, keeping the fields of the
message it changes. The shapes read, and what happens to each field, are listed in
:mod:`normandy_core.transcripts.transcript` and docs/compact.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from normandy_core.contract.boundary import check_focus, run_compaction
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.recall_settings import RecallSettings
from normandy_core.contract.settings import Resolved, current_settings
from normandy_core.conversation.entries import Entry
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.structure import pairing_problems
from normandy_core.conversation.survival import SurvivalRules
from normandy_core.errors import OptionsError, WindowUnknownError
from normandy_core.transcripts import continuation
from normandy_core.transcripts.continuation import ContinuationMemo
from normandy_core.transcripts.formats import (
    TranscriptError,
    WireFormat,
    check_values,
    value_problem,
)
from normandy_core.transcripts.result import (
    CompactResult,
    check_pairs,
    compact_result,
)
from normandy_core.transcripts.staging import Transcript
from normandy_core.transcripts.transcript import read, request_keys, write

__all__ = [
    "ENTRY",
    "acompact",
    "compact",
    "compact_continued",
    "compact_read",
    "compact_with",
    "parse_transcript",
    "prepare_config",
    "prepare_resolved",
    "read_transcript",
]

#: The entry point named in option errors raised by :func:`compact`.
ENTRY = "normandy_core.compact()"
#: How :func:`compact` is given a window, for :class:`~normandy_core.WindowUnknownError`.
COMPACT_HINT = (
    "pass window=<tokens> to compact(), or model= a model the catalog knows (or set window "
    "or model in normandy.toml or pyproject.toml [tool.normandy])"
)


FormatName = Literal["auto", "openai", "anthropic", "responses", "normandy"]
_FORMATS = ("auto", "openai", "anthropic", "responses", "normandy")


def read_transcript(data: Any, format: FormatName = "auto") -> Transcript | AgentMemory:
    """The transcript ``data`` read under the rules of this module: a
    :class:`~normandy_core.transcripts.staging.Transcript` (with where each entry came from), or
    the memory of a Normandy dump or :class:`~normandy_core.AgentMemory`.
    """
    if format not in _FORMATS:
        raise ValueError(f"{ENTRY}: format must be one of {', '.join(_FORMATS)}, got {format!r}")
    if isinstance(data, AgentMemory):
        return data
    if isinstance(data, Mapping) and (
        format == "normandy" or (format == "auto" and data.get("format") == "normandy.memory")
    ):
        entries = data.get("entries")
        if isinstance(entries, list):
            check_values(entries)
        try:
            memory = AgentMemory.load(data)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise TranscriptError(None, "entries", str(exc)) from exc
        _check_memory(memory)
        return memory
    if format == "normandy":
        raise TranscriptError(None, None, "a Normandy transcript is a memory dump object")
    if isinstance(data, Mapping):
        return _read_request(data, format)
    messages = _checked_list(data)
    t = read(messages, format)
    t.container = messages
    return t


def _checked_list(messages: Any) -> Any:
    """``messages`` with a generator (or another iterable) read once into a list, after
    refusing the values no transcript may hold."""
    if not isinstance(messages, (str, bytes, bytearray, Mapping, Sequence)) and isinstance(
        messages, Iterable
    ):
        messages = list(messages)
    if isinstance(messages, Sequence) and not isinstance(messages, (str, bytes, bytearray)):
        check_values(messages)
    return messages


def _read_request(data: Mapping[str, Any], format: WireFormat | Literal["auto"]) -> Transcript:
    """A request (a dict with ``messages``, and ``system`` for Anthropic; or a Responses
    API request with ``input`` and ``instructions``) read, its container kept."""
    keys = request_keys(data)
    if keys is None:
        raise TranscriptError(
            None, None, "an object must be a Normandy dump or hold 'messages' (or 'input')"
        )
    list_key, system_key = keys
    messages = data[list_key]
    system = data.get(system_key)
    if system is not None and (bad := value_problem(system)) is not None:
        raise TranscriptError(None, system_key + (f" {bad[0]}" if bad[0] else ""), bad[1])
    if list_key == "input":
        if format not in ("auto", "responses"):
            raise TranscriptError(
                None, "input", f"a request with 'input' is a Responses API request, not {format}"
            )
        if isinstance(messages, str):  # the API reads a string as one user message
            messages = [{"role": "user", "content": messages}]
    messages = _checked_list(messages)
    if list_key == "input":
        t = read(messages, "responses", instructions=system)
    else:
        t = read(messages, format, system=system)
    t.container = data
    return t


def parse_transcript(data: Any, format: FormatName = "auto") -> tuple[str, AgentMemory]:
    """``(format, memory)`` for a transcript, under the rules of this module.

    ``data`` is a list of messages (or any iterable of them), a dict with ``messages``
    (and ``system`` for Anthropic), a Normandy memory dump (``AgentMemory.dump()``) or an
    :class:`~normandy_core.AgentMemory`. Raises :class:`TranscriptError` naming the
    message index and field at fault.
    """
    t = read_transcript(data, format)
    if isinstance(t, AgentMemory):
        return "normandy", t
    return t.format, t.memory


def _check_memory(memory: AgentMemory) -> None:
    entries = memory.entries()
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        for u in e.tool_uses:
            if u.id in seen:
                raise TranscriptError(
                    i,
                    "content.id",
                    f"tool-use id {u.id!r} is already used by entry {seen[u.id]}; "
                    "tool-use ids must be unique in a transcript",
                )
            seen[u.id] = i
    problems = pairing_problems(entries, allow_pending=True)
    if problems:
        raise TranscriptError(None, "entries", "; ".join(problems))


def keep_other_branches(original: AgentMemory, compacted: AgentMemory) -> AgentMemory:
    """``compacted`` with the branches of ``original`` that were not active grafted back.

    Compaction works on the active branch; a Normandy dump given to :func:`compact` may
    hold other (abandoned) branches, which must come back. Each keeps its parent links:
    an ancestor the compaction dropped from the active branch stays in the graph as an
    inactive entry (with its original content), so nothing of another branch is lost.
    """
    active = {e.id for e in original}
    others = [e for e in original.all_entries() if e.id not in active]
    if not others:
        return compacted
    present = {e.id for e in compacted.all_entries()} | {e.id for e in others}
    ancestors: list[Entry] = []
    for e in others:
        parent = e.parent_id
        while parent is not None and parent not in present:
            entry = original[parent]
            ancestors.append(entry)
            present.add(parent)
            parent = entry.parent_id
    graph = [*compacted.all_entries(), *reversed(ancestors), *others]
    return AgentMemory.from_graph(graph, compacted.head)


def _unchanged(data: Any, read: Transcript | AgentMemory) -> Any:
    if isinstance(data, AgentMemory):
        return data
    if isinstance(data, Mapping):
        return dict(data)
    if isinstance(read, Transcript) and isinstance(read.container, list):
        return list(read.container)
    return list(data)


def compact(
    messages: Any,
    *,
    compactor: str | None = None,
    opts: Mapping[str, Any] | None = None,
    model: str | None = None,
    window: int | None = None,
    mid_round: bool = False,
    format: FormatName = "auto",
    timeout: float | None = None,
    fresh: bool = False,
    raise_on_error: bool = False,
    survival: SurvivalRules | Mapping[str, Any] | None = None,
    client: Any = None,
    recall: RecallSettings | bool | None = None,
    force: bool = False,
    focus: str | None = None,
    memo: ContinuationMemo | None = None,
) -> CompactResult:
    """Compact a transcript with the named compactor, once, and return it in its own format.

    ``messages`` is an OpenAI Chat Completions, Anthropic Messages or Responses API list
    (dicts or SDK objects), a request holding one (a dict with ``messages``, and
    ``system`` for Anthropic; a Responses request with ``input`` and ``instructions``),
    or a Normandy memory dump; ``format`` says which, or ``"auto"`` detects it.
    ``compactor`` defaults to ``window_manager`` (calling this means you want compaction;
    the default of :class:`~normandy_core.AgentConfig` is ``noop``). ``opts`` are the
    compactor's options, validated before anything runs (errors name
    ``normandy_core.compact()``).
    ``window`` pins the context window (the ``context_window`` option) of a compactor
    that sizes against one; otherwise the model catalog gives the window of ``model``.
    ``mid_round`` says the last assistant message's tool round is still open.
    ``timeout`` bounds the compactor's time in seconds (``compaction_timeout``): past it
    the compactor is abandoned and the result is the error path. ``client`` is a model
    client (:mod:`normandy_core.clients`) for a compactor that asks the model, such as
    ``window_manager``'s ``summarizer="model"``: it becomes the config's ``client``, as
    the turn loop's compactor gets it from :class:`~normandy_core.AgentConfig`.

    ``compactor``, ``opts``, ``model``, ``window`` and ``timeout`` left out (``None``)
    are taken from the configuration when it sets them: ``NORMANDY_COMPACTOR``,
    ``NORMANDY_COMPACTOR_OPTS``, ``normandy.toml`` or ``pyproject.toml``'s
    ``[tool.normandy]`` (:mod:`normandy_core.contract.settings`; arguments given always win).
    ``survival`` sets the survival rules (:class:`~normandy_core.SurvivalRules` or a
    mapping of its fields), over a configured ``survival`` table; with neither, the
    defaults keep pinned entries and the first user message.
    ``recall`` (``True`` or :class:`~normandy_core.RecallSettings`) says your agent
    offers the ``recall`` tool (:func:`~normandy_core.recall_tool` gives its definition,
    :func:`~normandy_core.recall` answers its calls): a marker, summary or cleared
    result then tells the model that tool brings the dropped content back. It is refused,
    like ``AgentConfig(recall=...)``, when no installed plugin can search.

    ``force=True`` compacts now, whatever the compactor's trigger (an application's
    ``/compact`` command): the compactor gets ``ctx.force`` and may still decline, saying
    why in ``meta["declined"]`` (:attr:`CompactResult.meta`). ``focus`` (with ``force``
    only) is what the summary should keep: ``window_manager``'s model summarizer
    receives it as instructions. A bad ``focus`` raises :class:`ValueError` naming it.

    Called before every request on a list that grew since the last call (the full
    history, or the list the last call returned plus new messages; bare or in a request
    whose system prompt is unchanged), only the new messages are read and counted, and
    the list is compacted as the continuation of the last call
    (:mod:`normandy_core.transcripts.continuation`, :attr:`CompactResult.continued`);
    ``fresh=True`` compacts from scratch. The earlier calls are remembered in ``memo``
    (:class:`~normandy_core.ContinuationMemo`), by default the process-wide one, which
    keeps the last 8 compactions: a process compacting more conversations at once gives
    a memo sized to them, the same one to every call.

    When nothing is compacted by a call that does not continue an earlier one (or the
    compactor reports an error, see :attr:`CompactResult.error`) ``messages`` comes back
    unchanged. An error result is logged as a warning (logger ``normandy_core.contract.boundary``)
    naming the compactor; ``raise_on_error=True`` raises :class:`CannotFitError` for it
    instead of returning it (as :meth:`CompactResult.check` does). Raises
    :class:`~normandy_core.transcripts.formats.TranscriptError` for odd input (see the module
    docstring), :class:`~normandy_core.OptionsError` or
    :class:`~normandy_core.WindowUnknownError` for a bad config,
    :class:`~normandy_core.SettingsError` for a bad configuration source (naming the file
    or variable and the key), :class:`~normandy_core.PluginError` for an unknown or broken
    compactor, and :class:`CompactionError` when a compactor breaks the tool pairs.
    """
    settings = current_settings().resolve(
        "window_manager",
        compactor=compactor,
        opts=opts,
        model=model,
        window=window,
        timeout=timeout,
        survival=survival,
    )

    def prepared() -> AgentConfig:
        return prepare_resolved(
            settings, entry=ENTRY, hint=COMPACT_HINT, client=client, recall=recall
        )

    check_focus(force, focus, entry=ENTRY)
    result = compact_continued(
        settings,
        prepared,
        messages,
        mid_round=mid_round,
        format=format,
        client=client,
        recall=recall,
        fresh=fresh,
        force=force,
        focus=focus,
        memo=memo,
    )
    # The boundary logs the failure (WARNING, naming the compactor and its distribution).
    if raise_on_error:
        result.check()
    return result


async def acompact(messages: Any, **kwargs: Any) -> CompactResult:
    """:func:`compact` for async code: the same arguments (``raise_on_error`` and
    ``client`` included) and result.

    The work runs in a worker thread (with the caller's context variables, so per-call
    settings such as ``archive_settings`` apply), so the event loop keeps serving other
    tasks while a compactor counts, summarizes or the archive writes. A coroutine the
    compactor needs there (an async ``client``'s model summary) runs on the caller's
    event loop, where the client's connections live, as under
    :func:`~normandy_core.turn.arun_turn` (:func:`normandy_core.contract.eventloop.turn_loop`).
    """
    import asyncio

    from normandy_core.contract.eventloop import bind_turn_loop

    with bind_turn_loop(asyncio.get_running_loop()):
        return await asyncio.to_thread(compact, messages, **kwargs)


def prepare_config(
    *,
    compactor: str,
    opts: Mapping[str, Any] | None,
    model: str | None,
    window: int | None,
    timeout: float | None,
    entry: str,
    hint: str | None = None,
    survival: SurvivalRules | Mapping[str, Any] | None = None,
    client: Any = None,
    recall: RecallSettings | bool | None = None,
) -> AgentConfig:
    """The config :func:`compact` runs with, prepared once (empty memory).

    ``window`` pins ``context_window`` for a compactor that sizes against one (refused
    when it contradicts a pinned one). ``entry`` and ``hint`` phrase the errors for the
    caller (the ``normandy`` command passes its own). ``client`` is the config's model
    client (for a compactor that asks the model); ``recall`` its ``recall`` setting.
    """
    from normandy_core.contract.preparation import CONFIG_HINT, pin_if_needed

    if opts is not None and not isinstance(opts, Mapping):
        raise OptionsError(
            f"{entry}: opts must be a mapping of option names to values, got {type(opts).__name__}"
        )
    options = pin_if_needed(compactor, opts or {}, window, entry=entry)
    return AgentConfig.made_by(
        entry,
        hint=hint or CONFIG_HINT,
        model=model,
        compactor=compactor,
        compactor_opts=options,
        compaction_timeout=timeout,
        survival=survival,
        client=client,
        recall=recall,
    )


def prepare_resolved(
    settings: Resolved,
    *,
    entry: str,
    hint: str | None = None,
    client: Any = None,
    recall: RecallSettings | bool | None = None,
) -> AgentConfig:
    """:func:`prepare_config` with resolved ``settings`` (their survival rules included,
    and ``client`` and ``recall``); a refusal of
    values that came from a configuration source says which source gave each
    (``settings: opts from NORMANDY_COMPACTOR_OPTS``)."""
    try:
        return prepare_config(
            compactor=settings.compactor,
            opts=settings.opts,
            model=settings.model,
            window=settings.window,
            timeout=settings.timeout,
            entry=entry,
            hint=hint,
            client=client,
            survival=settings.survival,
            recall=recall,
        )
    except (OptionsError, WindowUnknownError) as exc:
        if not settings.configured:
            raise
        raise type(exc)(f"{exc}\n  ({settings.note()})") from exc


def compact_with(
    acc: AgentConfig,
    messages: Any,
    *,
    mid_round: bool = False,
    format: FormatName = "auto",
    force: bool = False,
    focus: str | None = None,
) -> CompactResult:
    """Compact ``messages`` once with the prepared config ``acc`` (see :func:`compact`)."""
    return compact_read(
        acc, messages, mid_round=mid_round, format=format, force=force, focus=focus
    )[0]


def compact_read(
    acc: AgentConfig,
    messages: Any,
    *,
    mid_round: bool,
    format: FormatName,
    force: bool = False,
    focus: str | None = None,
) -> tuple[CompactResult, Transcript | AgentMemory]:
    """:func:`compact_with`, and the transcript ``messages`` were read into (what a
    continuation of this call needs)."""
    t = read_transcript(messages, format)
    memory = t if isinstance(t, AgentMemory) else t.memory
    fmt = "normandy" if isinstance(t, AgentMemory) else t.format
    new_acc, meta = run_compaction(
        acc.with_memory(memory), mid_round=mid_round, force=force, focus=focus
    )
    if not meta.get("compacted"):
        return compact_result(acc, _unchanged(messages, t), meta, fmt, memory), t
    check_pairs(acc, new_acc.memory)
    out = new_acc.memory
    if isinstance(t, AgentMemory):
        out = keep_other_branches(memory, out)
        rendered = out if isinstance(messages, AgentMemory) else out.dump()
    else:
        rendered = write(t, out)
    return compact_result(acc, rendered, meta, fmt, out), t


def compact_continued(
    settings: Resolved,
    prepared: Callable[[], AgentConfig],
    messages: Any,
    *,
    mid_round: bool,
    format: FormatName,
    client: Any = None,
    recall: RecallSettings | bool | None = None,
    fresh: bool = False,
    force: bool = False,
    focus: str | None = None,
    memo: ContinuationMemo | None = None,
) -> CompactResult:
    """Compact ``messages`` as the continuation of an earlier call with the same
    ``settings``, ``format``, ``client`` and ``recall`` when they extend the list it was
    given or returned (:mod:`~normandy_core.transcripts.continuation`), else in full with
    the config ``prepared`` gives (called only then), remembered for the next call.
    ``fresh`` compacts in full and remembers nothing; ``force``, ``focus`` and ``memo``
    (``None``: the process-wide one) as :func:`compact` takes them.
    """
    key = None
    if not fresh:
        key = continuation.config_key(
            settings.compactor,
            settings.opts,
            settings.model,
            settings.window,
            settings.timeout,
            format,
            client,
            survival=settings.survival,
            recall=recall,
        )
    result = continuation.resume(key, messages, mid_round, force=force, focus=focus, memo=memo)
    if result is not None:
        return result
    acc = prepared()
    result, t = compact_read(
        acc, messages, mid_round=mid_round, format=format, force=force, focus=focus
    )
    if key is not None and isinstance(t, Transcript):
        continuation.remember(key, acc, t, result.memory, messages, result.messages, memo)
    return result
