"""What every framework adapter shares: a compactor chosen by name, prepared once, that
compacts a framework's history as a continuation of its last call.

The adapters (``normandy-langchain``, ``normandy-pydantic-ai``,
``normandy-openai-agents``, ``normandy-llamaindex``, ``normandy-strands``,
``normandy-adk``) each turn their framework's messages into one of the wire formats
:func:`normandy_core.compact` reads (or into entries) and back; :class:`NamedCompactor`
is the part in between: the settings resolved as :func:`~normandy_core.compact` resolves
them, the config prepared (options validated, errors naming the adapter), and the
compaction run through the same continuation memo, so a call that extends the list the
last call was given or returned reads and counts only what is new.
:class:`AdapterCompaction` is what a run returns, and :func:`map_back` (with
:func:`chat_origin` or :func:`map_entries_back`) turns the compacted output back into the
framework's own messages: kept ones as the very objects given, changed ones as copies,
created ones new.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from normandy_core.contract.config import AgentConfig
from normandy_core.contract.settings import current_settings
from normandy_core.conversation.entries import Entry
from normandy_core.transcripts.facade import FormatName, compact_continued, prepare_resolved
from normandy_core.transcripts.result import CompactResult

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

__all__ = [
    "AdapterCompaction",
    "AdapterSeam",
    "Compaction",
    "CompactorSettings",
    "Mapped",
    "NamedCompactor",
    "SeamOptions",
    "adapter_hint",
    "chat_origin",
    "map_back",
    "map_entries_back",
    "removed_from",
]


def adapter_hint(entry: str) -> str:
    """How to give an adapter a window, in its refusal when it has none."""
    return (
        f"pass window=<tokens> to {entry}, or model= a model the catalog knows (or set "
        "window or model in normandy.toml or pyproject.toml [tool.normandy])"
    )


class NamedCompactor:
    """A compactor chosen by name, prepared once, for an adapter's histories.

    ``compactor`` is an entry-point name (``default`` when neither given nor configured),
    ``opts`` its options, validated here: a bad option raises
    :class:`~normandy_core.OptionsError` naming ``entry`` and the compactor. ``window``
    pins the context window in tokens; otherwise the catalog gives ``model``'s. Values
    left out are taken from the configuration (``NORMANDY_COMPACTOR``, ``normandy.toml``,
    ``[tool.normandy]``), as :func:`normandy_core.compact` takes them. ``timeout`` bounds
    the compactor's time in seconds; ``client`` is a Normandy model client for a
    compactor that asks a model. ``entry`` defaults to the class's :attr:`default_entry`.
    """

    #: The entry point named in errors when none is given (a subclass's public function).
    default_entry: ClassVar[str | None] = None
    #: Compact every call in full, remembering nothing for the next (a :meth:`narrowed`
    #: copy's calls are not continuations of the seam's own).
    fresh: bool = False

    def __init__(
        self,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        *,
        model: str | None = None,
        window: int | None = None,
        timeout: float | None = None,
        client: Any = None,
        entry: str | None = None,
        default: str = "window_manager",
    ) -> None:
        entry = entry or self.default_entry
        if entry is None:
            raise TypeError(f"{type(self).__name__}() needs entry= (the name errors give)")
        settings = current_settings().resolve(
            default, compactor=compactor, opts=opts, model=model, window=window, timeout=timeout
        )
        self.entry = entry
        self.config: AgentConfig = prepare_resolved(
            settings, entry=entry, hint=adapter_hint(entry), client=client
        )
        self.compactor = settings.compactor
        self._settings = settings
        self._client = client
        self._start()

    def _start(self) -> None:
        """Set up what a subclass keeps between runs (called once, by ``__init__``)."""

    def compact(self, messages: list[Any], *, mid_round: bool, format: FormatName) -> CompactResult:
        """Compact ``messages`` (in ``format``) with the prepared config, as a continuation
        of the last call with this config when they extend the list it was given (or
        returned, its very objects first), as :func:`normandy_core.compact` does."""
        return compact_continued(
            self._settings,
            lambda: self.config,
            messages,
            mid_round=mid_round,
            format=format,
            client=self._client,
            fresh=self.fresh,
        )

    def narrowed(self, target: int) -> Self:
        """This compactor sizing for ``target`` tokens (:meth:`AgentConfig.narrowed
        <normandy_core.AgentConfig.narrowed>`), each call compacted in full: what a seam
        recovers from a provider's too-long refusal with. Itself when its config cannot be
        narrowed (a compactor without a window, or one already that small)."""
        config = self.config.narrowed(target, entry=self.entry)
        if config is self.config:
            return self
        other = copy.copy(self)
        other.config = config
        other.fresh = True
        other._start()
        return other

    def log(
        self, logger: logging.Logger, before: int, after: int, result: CompactResult, what: str
    ) -> None:
        """Log one compaction at INFO: how many ``what`` before and after, the tokens."""
        logger.info(
            "%s compacted %d %s to %d (%d tokens to %d) with %s",
            self.entry,
            before,
            what,
            after,
            result.tokens_before,
            result.tokens_after,
            self.compactor,
        )


class Compaction(Protocol):
    """What an adapter's compactor returns for one run: the core's result, and whether it
    compacted (each framework adds its own messages)."""

    @property
    def result(self) -> CompactResult:
        """The core's result (``meta``, ``dropped``, token figures, ``error``, ``notes``)."""
        ...

    @property
    def compacted(self) -> bool:
        """Whether the compactor compacted."""
        ...


#: A framework's message type (what an adapter is given and returns).
M = TypeVar("M")
#: The form the core hands back for one message (a wire-format dict, an entry).
Out = TypeVar("Out")


@dataclass(frozen=True)
class AdapterCompaction(Generic[M]):
    """What an adapter's compactor returns for one run (a :class:`Compaction`).

    ``messages``: the compacted list (the input's objects where kept, unchanged).
    ``removed``: the input messages that are not in ``messages`` (dropped, or replaced
    by a changed copy), oldest first. ``result``: the core's
    :class:`~normandy_core.CompactResult` (``meta``, ``dropped`` entries, token figures,
    ``error``, the hooks' ``notes``). Each adapter exports a thin subclass under its own
    name (``LangChainCompaction``...).
    """

    messages: list[M]
    result: CompactResult = field(repr=False)
    removed: list[M] = field(default_factory=list, repr=False)

    @property
    def compacted(self) -> bool:
        """Whether the compactor compacted (``messages`` then differs from the input)."""
        return self.result.compacted

    @classmethod
    def of(cls, given: Sequence[M], messages: list[M], result: CompactResult) -> Self:
        """The compaction of ``given`` into ``messages``, ``removed`` found by identity."""
        return cls(messages, result, removed_from(given, messages))


def removed_from(given: Sequence[M], kept: Sequence[M]) -> list[M]:
    """The messages of ``given`` that are not (as the same objects) in ``kept``, in order."""
    still = {id(m) for m in kept}
    return [m for m in given if id(m) not in still]


#: A message of the compacted list and the given message it is or was changed from
#: (``None`` for one the compactor created).
Mapped = tuple[M, M | None]


def map_back(
    outputs: Iterable[Out],
    origin: Callable[[Out], tuple[M, bool] | None],
    changed: Callable[[M, Out], M],
    created: Callable[[Out], M],
) -> list[Mapped[M]]:
    """The framework's messages for the core's ``outputs``, each with its source.

    ``origin`` tells where an output came from: the given message and whether the output
    is that message unchanged, or ``None`` for one the compactor created (a marker, a
    summary). An unchanged output is its given message, the very object; a changed one
    is ``changed(given, output)``; a created one is ``created(output)``.
    """
    out: list[Mapped[M]] = []
    for o in outputs:
        found = origin(o)
        if found is None:
            out.append((created(o), None))
        elif found[1]:
            out.append((found[0], found[0]))
        else:
            out.append((changed(found[0], o), found[0]))
    return out


def chat_origin(
    given: Sequence[M], sent: Sequence[Any], by_key: Mapping[Any, M]
) -> Callable[[Any], tuple[M, bool] | None]:
    """The :func:`map_back` origin of the wire-format dicts (or items) the core returns
    for ``sent``, the dicts of ``given``: a dict it kept is one of ``sent`` (the very
    object); a changed one carries the ``"id"`` that ``by_key`` maps to its message."""
    by_sent = {id(d): m for d, m in zip(sent, given, strict=True)}

    def origin(d: Any) -> tuple[M, bool] | None:
        if id(d) in by_sent:
            return by_sent[id(d)], True
        key = d.get("id") if isinstance(d, Mapping) else None
        source = by_key.get(key) if isinstance(key, str) else None
        return None if source is None else (source, False)

    return origin


def map_entries_back(
    entries: Iterable[Entry],
    by_entry: Mapping[str, tuple[M, Entry]],
    changed: Callable[[M, Entry, Entry], M],
    created: Callable[[Entry], M],
) -> list[Mapped[M]]:
    """:func:`map_back` for a compacted memory's ``entries``, read from the messages
    ``by_entry`` holds (each with the entry read from it): an entry whose content is as
    read is its message; a changed one is ``changed(message, read, compacted)``."""

    def origin(e: Entry) -> tuple[M, bool] | None:
        known = by_entry.get(e.id)
        return None if known is None else (known[0], known[1].content == e.content)

    def rebuilt(message: M, e: Entry) -> M:
        return changed(message, by_entry[e.id][1], e)

    return map_back(entries, origin, rebuilt, created)


DoneT = TypeVar("DoneT", bound=Compaction)


class CompactorSettings(TypedDict, total=False):
    """What a seam hands its :class:`NamedCompactor` beside the compactor and its options."""

    model: str | None
    window: int | None
    timeout: float | None
    client: Any


class SeamOptions(CompactorSettings, total=False):
    """The keyword options every framework seam takes (see :class:`AdapterSeam`)."""

    raise_on_error: bool
    on_compact: Callable[[Any], None] | None


class AdapterSeam(Generic[DoneT]):
    """What every framework seam shares (LangChain's middleware, Pydantic AI's history
    processors, the Agents SDK's session and input filter): the compactor chosen by name
    and prepared once, and how a compaction is reported.

    ``compactor``, ``opts``, ``model``, ``window``, ``timeout`` and ``client`` are those of
    :class:`NamedCompactor` (its subclass :attr:`compactor_class`; errors name the
    seam's :attr:`entry`). ``on_compact`` is called with each compaction (the framework's
    :class:`Compaction`); a compactor error leaves the history unchanged (the core logs a
    warning), and with ``raise_on_error=True`` it raises instead
    (:meth:`~normandy_core.CompactResult.check`).
    """

    #: The framework's :class:`NamedCompactor`.
    compactor_class: ClassVar[type[NamedCompactor]]
    #: The seam named in option errors (``normandy_langchain.NormandyMiddleware()``...).
    entry: ClassVar[str]

    def __init__(
        self,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        *,
        raise_on_error: bool = False,
        on_compact: Callable[[DoneT], None] | None = None,
        **settings: Unpack[CompactorSettings],
    ) -> None:
        super().__init__()  # the framework's own base class, when it has one
        self.compactor = self.compactor_class(compactor, opts, entry=self.entry, **settings)
        self.raise_on_error = raise_on_error
        self.on_compact = on_compact
        self._start()

    def _start(self) -> None:
        """Set up what a subclass keeps between calls (called once, by ``__init__``)."""

    def _checked(self, done: DoneT) -> DoneT:
        """``done``, raised as an error with ``raise_on_error`` when it failed."""
        if self.raise_on_error:
            done.result.check()
        return done

    def _reported(self, done: DoneT) -> DoneT:
        """``done``, handed to ``on_compact`` when it compacted."""
        if done.compacted and self.on_compact is not None:
            self.on_compact(done)
        return done
