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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from normandy_core.contract.boundary import run_compaction
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.recall_settings import RecallSettings
from normandy_core.contract.settings import Resolved, current_settings
from normandy_core.contract.types import CompactionMeta
from normandy_core.conversation.entries import Entry
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.structure import pairing_problems
from normandy_core.conversation.survival import SurvivalRules
from normandy_core.errors import NormandyError, OptionsError, WindowUnknownError
from normandy_core.transcripts.formats import TranscriptError, as_mapping, value_problem
from normandy_core.transcripts.staging import Transcript
from normandy_core.transcripts.transcript import read, write

__all__ = [
    "ENTRY",
    "CannotFitError",
    "CompactResult",
    "CompactionError",
    "acompact",
    "compact",
    "parse_transcript",
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


class CompactionError(NormandyError):
    """:func:`compact` has no transcript fit to send.

    Raised itself when a compactor returned a conversation a provider would reject (tool
    pairs broken): it is refused, never returned; the message names the compactor and
    each problem. :class:`CannotFitError` is the compactor's own error, on request.
    """


class CannotFitError(CompactionError):
    """The compactor reported an error, so the transcript came back unchanged and may not
    fit the window (``window_manager``'s "cannot fit the context window", a compactor
    that raised or timed out, an archive that refused the compaction...).

    Raised by :meth:`CompactResult.check` and by ``compact(..., raise_on_error=True)``;
    the message names the compactor and its error. ``result`` is the
    :class:`CompactResult` (its ``messages`` are the input, unchanged).
    """

    def __init__(self, result: CompactResult) -> None:
        self.result = result
        who = result._compactor or "the compactor"
        super().__init__(
            f"{who} could not compact the transcript, which is returned unchanged and may "
            f"not fit the window: {result.error}"
        )


@dataclass(frozen=True)
class CompactResult:
    """What :func:`compact` returns.

    ``messages``: the transcript in the format and shape it was given (a list, or a dict
    with ``messages`` and, for Anthropic, ``system``). ``meta``: the compactor's meta as
    the boundary checked it (``compacted``, the token figures of a compaction,
    ``strategy``, ``dropped``...). ``memory``: the compacted conversation.
    ``continued``: the list extended one an earlier call compacted, and was compacted as
    its continuation (:mod:`normandy_core.transcripts.continuation`): earlier cuts are kept and
    ``meta`` reports only what this call did.

    The typed fields are always there, whatever happened: :attr:`compacted`,
    :attr:`tokens_before`, :attr:`tokens_after`, :attr:`tokens_removed` (ints),
    :attr:`dropped` (a list), :attr:`error` and :attr:`archive` (``None`` when there is
    none). :meth:`check` raises :class:`CannotFitError` for an error result.
    """

    messages: Any
    meta: CompactionMeta
    format: str
    memory: AgentMemory = field(repr=False)
    continued: bool = False
    #: The compactor's description (``compactor 'x' (group ...) from dist 1.0``).
    _compactor: str | None = field(default=None, repr=False, compare=False)
    #: The counter the boundary sized with (``ctx.counter``), for the figures of a result
    #: that did not compact.
    _counter: Any = field(default=None, repr=False, compare=False)
    _counted: list[int] = field(default_factory=list, repr=False, compare=False)

    @property
    def compacted(self) -> bool:
        """Whether the compactor compacted."""
        return bool(self.meta.get("compacted"))

    def _count(self) -> int:
        """Tokens of :attr:`memory`'s active branch, with the boundary's counter (cached:
        the memory keeps its counts, so this is free once the compactor has counted)."""
        if not self._counted:
            counter = self._counter
            if counter is None:
                from normandy_core.conversation.calibration import CalibratedCounter

                counter = CalibratedCounter(None, None)
            self._counted.append(int(counter.memory_tokens(self.memory)))
        return self._counted[0]

    @property
    def tokens_before(self) -> int:
        """Tokens of the conversation the compactor was given (the boundary's count with the
        compactor's counter, ``ctx.counter``). When nothing was compacted it equals
        :attr:`tokens_after`: the input's count."""
        value = self.meta.tokens_before
        return value if value is not None else self._count()

    @property
    def tokens_after(self) -> int:
        """Tokens of the conversation returned (:attr:`memory`), with the same counter."""
        value = self.meta.tokens_after
        return value if value is not None else self._count()

    @property
    def tokens_removed(self) -> int:
        """Tokens of the running turn's messages that compaction removed (the newest
        message's turn outside a turn loop); 0 when nothing was compacted."""
        value = self.meta.tokens_removed
        return value if value is not None else 0

    @property
    def dropped(self) -> list[Entry]:
        """The removed entries, oldest first (empty when nothing was removed)."""
        return list(self.meta.dropped)

    @property
    def error(self) -> str | None:
        """The compactor's error (the input is then returned unchanged), else ``None``."""
        err = self.meta.get("error")
        return None if err is None else str(err)

    @property
    def archive(self) -> Mapping[str, Any] | None:
        """The note of the ``archive`` hook plugin (``path``, ``session``, ``entries``,
        ``message``...): where the dropped entries went; ``None`` when nothing was
        archived (nothing dropped, or no archive installed)."""
        return self.note("archive")

    def check(self) -> CompactResult:
        """This result, or :class:`CannotFitError` when the compactor reported an error
        (the transcript is then the input, unchanged, and may not fit the window)."""
        if self.error is not None:
            raise CannotFitError(self)
        return self

    @property
    def notes(self) -> tuple[Mapping[str, Any], ...]:
        """What the hook plugins said they did with the dropped entries, in the order they
        ran: one ``{"hook", "plugin", "note"}`` per note (``meta["hook_notes"]``). An
        archive's note says where the dropped content went."""
        return self.meta.hook_notes

    def note(self, hook: str) -> Mapping[str, Any] | None:
        """The last note of the hook plugin ``hook`` (its name, bare or qualified, such as
        ``"archive"`` or ``"normandy_core.hooks:archive"``), or ``None``."""
        found = None
        for item in self.notes:
            name = str(item.get("hook", ""))
            if name == hook or name.rsplit(":", 1)[-1].split("@", 1)[0] == hook:
                found = item.get("note")
        return found


def _as_dict(obj: Any) -> Any:
    """``obj`` as a mapping where it is one (or an SDK object), else as it is (the value
    checks name what is wrong with it)."""
    try:
        return as_mapping(obj, None, None)
    except TranscriptError:
        return obj


def _check_values(messages: Sequence[Any], start: int = 0) -> None:
    """Refuse deep nesting and lone surrogates, naming the message (numbered from
    ``start``) and the field."""
    for i, raw in enumerate(messages, start):
        bad = value_problem(_as_dict(raw))
        if bad is not None:
            raise TranscriptError(i, bad[0] or None, bad[1])


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
            _check_values(entries)
        try:
            memory = AgentMemory.load(data)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise TranscriptError(None, "entries", str(exc)) from exc
        _check_memory(memory)
        return memory
    if format == "normandy":
        raise TranscriptError(None, None, "a Normandy transcript is a memory dump object")
    system: Any = None
    messages = data
    if isinstance(data, Mapping):
        if "messages" not in data:
            raise TranscriptError(
                None, None, "an object must be a Normandy dump or hold 'messages'"
            )
        messages = data["messages"]
        system = data.get("system")
        if system is not None and (bad := value_problem(system)) is not None:
            raise TranscriptError(None, "system" + (f" {bad[0]}" if bad[0] else ""), bad[1])
    if not isinstance(messages, (str, bytes, bytearray, Mapping, Sequence)) and isinstance(
        messages, Iterable
    ):
        messages = list(messages)  # a generator or another iterable, read once
    if isinstance(messages, Sequence) and not isinstance(messages, (str, bytes, bytearray)):
        _check_values(messages)
    t = read(messages, format, system=system)
    if isinstance(data, Mapping) or messages is not data:
        t.container = data if isinstance(data, Mapping) else messages
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


def render_transcript(memory: AgentMemory, fmt: str, like: Any) -> Any:
    """``memory`` in ``fmt``, in the container shape of ``like`` (a Normandy dump or memory).

    Provider formats are written by :func:`normandy_core.transcripts.transcript.write`, which needs
    the :class:`~normandy_core.transcripts.staging.Transcript` the input was read into.
    """
    if fmt == "normandy":
        return memory if isinstance(like, AgentMemory) else memory.dump()
    if isinstance(like, Transcript):
        return write(like, memory)
    raise ValueError(f"render_transcript: {fmt!r} needs the Transcript the input was read into")


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
) -> CompactResult:
    """Compact a transcript with the named compactor, once, and return it in its own format.

    ``messages`` is an OpenAI Chat Completions or Anthropic Messages list (dicts or SDK
    objects), a dict with ``messages`` (and ``system`` for Anthropic), or a Normandy memory
    dump; ``format`` says which, or ``"auto"`` detects it. ``compactor`` defaults to
    ``window_manager`` (calling this means you want compaction; the default of
    :class:`~normandy_core.AgentConfig` is ``noop``). ``opts`` are the compactor's
    options, validated before anything runs (errors name ``normandy_core.compact()``).
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

    Called before every request on a list that grew since the last call (the full
    history, or the list the last call returned plus new messages), only the new
    messages are read and counted, and the list is compacted as the continuation of the
    last call (:mod:`normandy_core.transcripts.continuation`, :attr:`CompactResult.continued`);
    ``fresh=True`` compacts from scratch.

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
    from normandy_core.transcripts import continuation

    s = current_settings().resolve(
        "window_manager",
        compactor=compactor,
        opts=opts,
        model=model,
        window=window,
        timeout=timeout,
        survival=survival,
    )
    key = (
        None
        if fresh
        else continuation.config_key(
            s.compactor,
            s.opts,
            s.model,
            s.window,
            s.timeout,
            format,
            client,
            survival=s.survival,
            recall=recall,
        )
    )
    hit = continuation.resume(key, messages, mid_round)
    if hit is not None:
        result = cast("CompactResult", hit)
    else:
        acc = prepare_resolved(s, entry=ENTRY, hint=COMPACT_HINT, client=client, recall=recall)
        result, t = _compact_read(acc, messages, mid_round=mid_round, format=format)
        if key is not None and isinstance(t, Transcript):
            continuation.remember(key, acc, t, result.memory, messages, result.messages)
    # The boundary logs the failure (WARNING, naming the compactor and its distribution).
    if result.error is not None and raise_on_error:
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
    return AgentConfig(
        model=model,
        compactor=compactor,
        compactor_opts=options,
        compaction_timeout=timeout,
        survival=survival,
        client=client,
        recall=recall,
        _entry=entry,
        _hint=hint or CONFIG_HINT,
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
    acc: AgentConfig, messages: Any, *, mid_round: bool = False, format: FormatName = "auto"
) -> CompactResult:
    """Compact ``messages`` once with the prepared config ``acc`` (see :func:`compact`)."""
    return _compact_read(acc, messages, mid_round=mid_round, format=format)[0]


def check_pairs(acc: AgentConfig, memory: AgentMemory) -> None:
    """Refuse a compacted conversation with broken tool pairs, naming the compactor.

    The boundary's contract check refuses broken pairs when the input had none; the input
    may hold an open round, which that check leaves to the transcript rules.
    """
    problems = pairing_problems(memory.entries(), allow_pending=True)
    if problems:
        raise CompactionError(
            f"{acc.compactor_handle.describe()} returned a conversation with broken tool "
            "pairs: " + "; ".join(problems)
        )


def _compact_read(
    acc: AgentConfig, messages: Any, *, mid_round: bool, format: FormatName
) -> tuple[CompactResult, Transcript | AgentMemory]:
    t = read_transcript(messages, format)
    memory = t if isinstance(t, AgentMemory) else t.memory
    fmt = "normandy" if isinstance(t, AgentMemory) else t.format
    new_acc, meta = run_compaction(acc.with_memory(memory), mid_round=mid_round)
    typed = result_fields(acc)
    if not meta.get("compacted"):
        return CompactResult(_unchanged(messages, t), meta, fmt, memory, **typed), t
    check_pairs(acc, new_acc.memory)
    out = new_acc.memory
    if isinstance(t, AgentMemory):
        out = keep_other_branches(memory, out)
        rendered = out if isinstance(messages, AgentMemory) else out.dump()
    else:
        rendered = write(t, out)
    return CompactResult(rendered, meta, fmt, out, **typed), t


def result_fields(acc: AgentConfig) -> dict[str, Any]:
    """The private fields of a :class:`CompactResult` made with the prepared ``acc``: the
    compactor's description and the counter its boundary sized with (``ctx.counter``)."""
    return {
        "_compactor": acc.compactor_handle.describe(),
        "_counter": acc.prepared.counter_for(acc.model),
    }
