"""The agent's configuration: the ``acc`` that compactors receive and return."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from normandy_core.contract.compact_tool_settings import CompactToolSettings, check_compact_tool
from normandy_core.contract.edits import ContextManagement, context_management
from normandy_core.contract.preparation import (
    CONFIG_HINT,
    Prepared,
    check_client,
    check_recall,
    pin_if_needed,
    prepare,
)
from normandy_core.contract.recall_settings import RecallSettings
from normandy_core.contract.settings import Settings, current_settings, read_settings_file
from normandy_core.conversation.catalog import ModelCatalog, default_catalog
from normandy_core.conversation.entries import new_id
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.survival import SurvivalRules, survival_rules
from normandy_core.errors import OptionsError, WindowUnknownError

if TYPE_CHECKING:
    from normandy_core.contract.compactor import Compactor
    from normandy_core.conversation.calibration import Calibration

__all__ = ["AgentConfig"]

_CREATE = "normandy_core.AgentConfig()"


def _tool_setting(value: Any, kind: type[Any], field: str, entry: str) -> Any:
    """A tool-switch field (``recall``, ``compact_tool``) in its one form: its settings
    (``True``: the defaults) or ``None`` (off)."""
    if value is True:
        return kind()
    if value is False or value is None:
        return None
    if not isinstance(value, kind):
        raise TypeError(
            f"{entry}: {field} must be True, False, None or a {kind.__name__}, "
            f"got {type(value).__name__}"
        )
    return value


#: How :meth:`AgentConfig.from_env` and :meth:`AgentConfig.from_file` are given a window.
_CONFIGURED_HINT = (
    "pass window=<tokens> or model= a model the catalog knows, or set window or model in "
    "the configuration (normandy.toml or pyproject.toml [tool.normandy])"
)


@dataclass
class Derived:
    """What is worked out from a config's settings, once: the prepared compactor, the
    catalog's windows per model, the prompt's token estimate. It travels beside the
    config's data, shared by its copies that keep the settings (:meth:`AgentConfig.with_memory`)."""

    prepared: Prepared | None = None
    windows: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int | None = None


@dataclass(frozen=True, eq=False)
class AgentConfig:
    """The running agent config: model, prompt, tools, conversation and compactor settings.

    ``tools`` are the tool definitions the model sees (``{"name", "description",
    "input_schema"}``, or OpenAI's ``function`` form); the turn shells add a definition
    derived from each tool callable they are given that has none
    (:func:`normandy_core.turn.tool_definition`) to the config they return, never to this
    one. ``compactor`` defaults to ``"noop"`` (default off: nothing changes, nothing is spent),
    which ships with ``normandy-core`` itself. ``compaction_timeout`` bounds each boundary
    in seconds, hooks included (``None``: unbounded); past it the boundary gives up and
    keeps the conversation as it was. ``client`` is the agent's model client (see
    :mod:`normandy_core.clients`), used by the turn shells and by compactors that
    summarize with the model; ``session_id`` names the session in archives and logs;
    ``calibration`` the token-count calibration its compactor sizes with (``None``: the
    process-wide one the shells feed). ``recall`` turns on the ``recall`` tool
    (``True``, or :class:`~normandy_core.RecallSettings`; default off): the turn loop
    offers it to the model and answers its calls from the archive, and compaction
    markers say it exists (see :mod:`normandy_core.contract.recall`); it is refused here when
    no hook plugin can search (``normandy-archive`` not installed) or a tool of
    ``tools`` has its name. ``compact_tool`` turns on the ``compact_context`` tool
    (``True``, or :class:`~normandy_core.CompactToolSettings`; default off): the model
    asks for a compaction, with a focus for the summary, and the turn loop compacts at
    the next boundary, forced, within the tool's limits (see
    :mod:`normandy_core.turn.compact_tool`); it is refused here when a tool of ``tools``
    (or the recall tool) has its name. ``survival`` holds the rules every compactor
    must honour (:class:`~normandy_core.SurvivalRules`, or a mapping of its fields;
    ``None``: the defaults, which keep pinned entries and the first user message); it
    is validated here and always reads back as a :class:`~normandy_core.SurvivalRules`.
    ``context_management`` asks the provider for server-side edits on every model call
    of the turn shells (a :class:`~normandy_core.contract.edits.ContextManagement` or its
    mapping: ``clear_tool_uses``, ``clear_thinking``, ``compact``; default none): it is
    checked here against the limits the API documents, and a turn refuses, before its
    first call, a client that cannot send the edits asked for (see
    :func:`~normandy_core.contract.edits.client_edits`).

    It is the ``acc`` of the contract: compactors receive it and return it, or a copy with
    a new memory (:meth:`with_memory`). Making one, and every copy that changes the model,
    prompt, tools, catalog or compactor settings (:meth:`replace`,
    :meth:`with_compactor`), *prepares* the compactor once
    (:func:`normandy_core.prepare`): resolves it by name, parses and validates its
    options with the entry point that made the config, resolves the window (pinned
    ``context_window`` option or ``catalog``) and chooses the counter, so a bad option
    or an unknown window raises here, never mid-turn; so do options that need a model
    client (the compactor's ``requires_client`` hook) in a config made without one. What
    was prepared (:attr:`prepared`) is shared by every copy made with :meth:`with_memory`.
    """

    model: str | None = None
    system_prompt: str = ""
    tools: Sequence[Mapping[str, Any]] = ()
    memory: AgentMemory = field(default_factory=AgentMemory)
    compactor: str = "noop"
    compactor_opts: Mapping[str, Any] = field(default_factory=dict)
    catalog: ModelCatalog = field(default_factory=default_catalog)
    session_id: str = field(default_factory=new_id)
    client: Any = None
    compaction_timeout: float | None = None
    calibration: Calibration | None = None
    recall: RecallSettings | bool | None = None
    compact_tool: CompactToolSettings | bool | None = None
    survival: SurvivalRules | Mapping[str, Any] | None = None
    context_management: ContextManagement | Mapping[str, Any] | None = None
    _entry: dataclasses.InitVar[str] = _CREATE
    _validate: dataclasses.InitVar[bool] = True
    _hint: dataclasses.InitVar[str] = CONFIG_HINT
    _derived: Derived = field(default_factory=lambda: Derived(), repr=False)

    def __post_init__(self, _entry: str, _validate: bool, _hint: str) -> None:
        self._normalise(_entry)
        if _validate or self._derived.prepared is None:
            # The contract's promise: a bad option is refused where the config is made.
            self._derived.prepared = self._prepare(_entry, _hint)

    def _normalise(self, entry: str) -> None:
        """Check the config's own data and bring each field to its one form."""
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))
        # A copy: the options prepared here cannot change behind the config's back when
        # the caller reuses its dict.
        object.__setattr__(self, "compactor_opts", dict(self.compactor_opts))
        if not isinstance(self.memory, AgentMemory):
            raise TypeError(
                f"{entry}: memory must be an AgentMemory, got {type(self.memory).__name__}"
            )
        if not isinstance(self.survival, SurvivalRules):
            object.__setattr__(self, "survival", survival_rules(self.survival, entry=entry))
        timeout = self.compaction_timeout
        if timeout is not None and not (
            isinstance(timeout, (int, float)) and 0 < timeout < float("inf")
        ):
            raise ValueError(
                f"{entry}: compaction_timeout must be a positive number of seconds, got {timeout!r}"
            )
        if self.context_management is not None:
            edits = context_management(self.context_management, entry=entry)
            object.__setattr__(self, "context_management", edits)
        object.__setattr__(
            self, "recall", _tool_setting(self.recall, RecallSettings, "recall", entry)
        )
        compact = _tool_setting(self.compact_tool, CompactToolSettings, "compact_tool", entry)
        object.__setattr__(self, "compact_tool", compact)

    @property
    def recall_settings(self) -> RecallSettings | None:
        """The recall tool's settings, ``None`` when it is off."""
        r = self.recall
        return r if isinstance(r, RecallSettings) else None

    @property
    def compact_tool_settings(self) -> CompactToolSettings | None:
        """The ``compact_context`` tool's settings, ``None`` when it is off."""
        c = self.compact_tool
        return c if isinstance(c, CompactToolSettings) else None

    @property
    def tool_definitions(self) -> tuple[Mapping[str, Any], ...]:
        """What a model call sends as tools: ``tools``, then the recall tool's and the
        ``compact_context`` tool's when they are on."""
        extra = [s.definition() for s in (self.recall_settings, self.compact_tool_settings) if s]
        return (*self.tools, *extra)

    def _prepare(self, entry: str, hint: str) -> Prepared:
        """The prepare step for this config: the compactor and recall, as configured, and
        a model client when the compactor's options need one."""
        if self.recall_settings is not None:
            check_recall(self.recall_settings, self.tools, entry=entry)
        if self.compact_tool_settings is not None:
            with_recall = [
                *self.tools,
                *([self.recall_settings.definition()] if self.recall_settings else []),
            ]
            check_compact_tool(self.compact_tool_settings, with_recall, entry=entry)
        prepared = prepare(
            self.compactor,
            self.compactor_opts,
            entry=entry,
            model=self.model,
            catalog=self.catalog,
            prompt_tokens=self.prompt_tokens,
            calibration=self.calibration,
            hint=hint,
            memo=self._derived.windows,
            rules=self.rules,
        )
        check_client(prepared, self.client, entry=entry)
        return prepared

    @property
    def prepared(self) -> Prepared:
        """What was prepared for this config's compactor where the config was made."""
        prepared = self._derived.prepared
        assert prepared is not None  # set in __post_init__
        return prepared

    @property
    def rules(self) -> SurvivalRules:
        """The config's survival rules (the ``survival`` field, validated)."""
        return self.survival  # type: ignore[return-value]  # normalised in __post_init__

    @property
    def edits(self) -> ContextManagement | None:
        """The server-side edits asked for (the ``context_management`` field, checked;
        ``None`` when none)."""
        return self.context_management  # type: ignore[return-value]  # checked in __post_init__

    @property
    def compactor_handle(self) -> Compactor:
        """The resolved compactor."""
        return self.prepared.compactor

    def resolve_window(self) -> int | None:
        """The window the compactor sizes against (``None`` when it needs none), as prepared."""
        return self.prepared.window

    @property
    def prompt_tokens(self) -> int:
        """Estimated tokens of the system prompt and tool definitions (four characters each),
        the recall tool's included when it is on."""
        derived = self._derived
        if derived.prompt_tokens is None:
            chars = len(self.system_prompt)
            tools = self.tool_definitions
            if tools:
                chars += len(json.dumps(list(tools), ensure_ascii=False, default=str))
            derived.prompt_tokens = math.ceil(chars / 4)
        return derived.prompt_tokens

    def with_memory(self, memory: AgentMemory) -> AgentConfig:
        """A copy holding ``memory``; compactor settings are unchanged, so not prepared again.

        Field for field the copy ``dataclasses.replace`` would make (its own options dict,
        the prepared compactor shared), without running ``__init__`` again: the turn loop
        makes one per turn and per compaction.
        """
        if not isinstance(memory, AgentMemory):
            raise TypeError(
                f"{_CREATE}: memory must be an AgentMemory, got {type(memory).__name__}"
            )
        new = copy.copy(self)
        object.__setattr__(new, "memory", memory)
        object.__setattr__(new, "compactor_opts", dict(self.compactor_opts))
        return new

    def with_client(self, client: Any) -> AgentConfig:
        """A copy whose model client is ``client`` (``None``: none); the compactor settings
        are unchanged, so not prepared again (a compactor that falls back to one that must
        not call the model gives it such a copy). Options that need a client
        (``summarizer="model"``) are refused where a config without one is made, so give
        the client there (``client=``), not through this copy."""
        new = copy.copy(self)
        object.__setattr__(new, "client", client)
        object.__setattr__(new, "compactor_opts", dict(self.compactor_opts))
        return new

    @classmethod
    def made_by(cls, entry: str, *, hint: str = CONFIG_HINT, **fields: Any) -> AgentConfig:
        """``AgentConfig(**fields)`` made on behalf of the public entry point ``entry``
        (``"normandy demo"``, ``"normandy_core.compact()"``), which every refusal names
        first; ``hint`` says how to pin a window in that entry point's words."""
        return cls(**fields, _entry=entry, _hint=hint)

    def replace(
        self, *, entry: str = "normandy_core.AgentConfig.replace()", **changes: Any
    ) -> AgentConfig:
        """A copy with ``changes``; the compactor is prepared again under ``entry`` (the
        survival rules included)."""
        kept = self._derived
        changes["_derived"] = Derived(
            windows={} if "model" in changes or "catalog" in changes else kept.windows,
            prompt_tokens=None
            if any(k in changes for k in ("system_prompt", "tools", "recall", "compact_tool"))
            else kept.prompt_tokens,
        )
        return dataclasses.replace(self, _entry=entry, **changes)

    @classmethod
    def from_env(cls, *, window: int | None = None, **fields: Any) -> AgentConfig:
        """A config whose compactor settings come from the configuration: the
        environment (``NORMANDY_COMPACTOR``, ``NORMANDY_COMPACTOR_OPTS``), then
        ``normandy.toml`` or ``pyproject.toml``'s ``[tool.normandy]`` found from the current
        directory upward (see :mod:`normandy_core.contract.settings`).

        ``fields`` are the config's fields; ``compactor``, ``compactor_opts``, ``model``,
        ``compaction_timeout`` and ``survival`` given here win over the configuration,
        and ``window`` (or the configured ``window``) pins the ``context_window`` option
        of a compactor that sizes against one. With nothing configured it is
        ``AgentConfig(**fields)`` (compactor ``noop``). Errors name the file or variable
        and the key at fault.
        """
        return cls._configured(
            current_settings(), "normandy_core.AgentConfig.from_env()", window, fields
        )

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, window: int | None = None, **fields: Any
    ) -> AgentConfig:
        """:meth:`from_env` with the settings of the one file ``path`` only (a
        ``normandy.toml``, or a ``pyproject.toml``'s ``[tool.normandy]`` table), without
        the environment or a look-up."""
        return cls._configured(
            read_settings_file(path), "normandy_core.AgentConfig.from_file()", window, fields
        )

    @classmethod
    def _configured(
        cls, settings: Settings, entry: str, window: int | None, fields: dict[str, Any]
    ) -> AgentConfig:
        s = settings.resolve(
            "noop",
            compactor=fields.pop("compactor", None),
            opts=fields.pop("compactor_opts", None),
            model=fields.pop("model", None),
            window=window,
            timeout=fields.pop("compaction_timeout", None),
            survival=fields.pop("survival", None),
        )
        try:
            options = pin_if_needed(s.compactor, s.opts or {}, s.window, entry=entry)
            return cls(
                model=s.model,
                compactor=s.compactor,
                compactor_opts=options,
                compaction_timeout=s.timeout,
                survival=s.survival,
                _entry=entry,
                _hint=_CONFIGURED_HINT,
                **fields,
            )
        except (OptionsError, WindowUnknownError) as exc:
            if not s.configured:
                raise
            raise type(exc)(f"{exc}\n  ({s.note()})") from exc

    def narrowed(self, target: int, *, entry: str) -> AgentConfig:
        """A copy whose compactor's window is pinned so that what the compactor lets a
        conversation reach (with the prompt) is ``target`` tokens: the room it keeps
        besides (its window less the mid-round level its ``compaction_threshold``
        declared, such as ``window_manager``'s ``reserved_tokens``) is kept. What a
        provider's too-long refusal is recovered with. The config itself when its
        compactor sizes against no window, already has one that small, or refuses the
        pinned one (prepared under ``entry``)."""
        current = self.prepared.window
        if current is None:
            return self
        level = self.prepared.thresholds[True]
        window = target + (current - level if level is not None and level < current else 0)
        if current <= window:
            return self
        pinned = {**self.compactor_opts, "context_window": window}
        try:
            return self.replace(entry=entry, compactor_opts=pinned)
        except (OptionsError, WindowUnknownError):
            return self

    def with_compactor(self, name: str, opts: Mapping[str, Any] | None = None) -> AgentConfig:
        """A copy using compactor ``name`` with ``opts``, prepared where it is made."""
        return self.replace(
            entry="normandy_core.AgentConfig.with_compactor()",
            compactor=name,
            compactor_opts=dict(opts or {}),
        )
