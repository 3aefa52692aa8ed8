"""The agent's configuration: the ``acc`` that compactors receive and return."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from normandy_core.catalog import ModelCatalog, default_catalog
from normandy_core.errors import OptionsError, WindowUnknownError
from normandy_core.memory import AgentMemory, new_id
from normandy_core.plugins import Compactor, resolve_compactor

__all__ = ["AgentConfig"]

_CREATE = "normandy_core.AgentConfig()"


def _whole_positive(value: Any) -> int | None:
    """``value`` as a positive int when it is one (``8000``, ``8000.0``, ``"8000"``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    try:
        number = int(value)
        whole = float(value) == number
    except (TypeError, ValueError, OverflowError):
        return None
    return number if whole and number > 0 else None


@dataclass(frozen=True, eq=False)
class AgentConfig:
    """The running agent config: model, prompt, tools, conversation and compactor settings.

    ``compaction_timeout`` bounds each compactor call in seconds (``None``: unbounded);
    past it the boundary gives up on the compactor and keeps the conversation as it was.
    ``client`` is the agent's model client (see :mod:`normandy_core.clients`), used by the
    turn shells and by compactors that summarize with the model; ``session_id`` names the
    session in archives and logs.

    It is the ``acc`` of the contract: compactors receive it and return it, or a copy with
    a new memory (:meth:`with_memory`). Making one, and every copy that changes the
    compactor settings (:meth:`replace`, :meth:`with_compactor`), resolves the compactor
    by name and calls its ``validate_opts`` with the entry point that made the config, so
    a bad option raises here, never mid-turn. A compactor that needs a window must get one
    from the pinned ``context_window`` option or from ``catalog``, or the config is refused.
    The window is resolved once per agent and model and shared by every copy.
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
    _entry: dataclasses.InitVar[str] = _CREATE
    _validate: dataclasses.InitVar[bool] = True
    _windows: dict[str, int] = field(default_factory=dict, repr=False)
    _prompt_tokens: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self, _entry: str, _validate: bool) -> None:
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))
        # A copy: the options validated here cannot change behind the config's back when
        # the caller reuses its dict (they would reach maybe_compact unvalidated).
        object.__setattr__(self, "compactor_opts", dict(self.compactor_opts))
        if not isinstance(self.memory, AgentMemory):
            raise TypeError(
                f"{_entry}: memory must be an AgentMemory, got {type(self.memory).__name__}"
            )
        t = self.compaction_timeout
        if t is not None and not (isinstance(t, (int, float)) and 0 < t < float("inf")):
            raise ValueError(
                f"{_entry}: compaction_timeout must be a positive number of seconds, got {t!r}"
            )
        if _validate:
            self._check(_entry)

    def _check(self, entry: str) -> None:
        comp = resolve_compactor(self.compactor)
        opts = dict(self.compactor_opts)
        comp.validate_opts(opts, entry)
        self.resolve_window(comp, entry=entry)

    @property
    def compactor_handle(self) -> Compactor:
        """The resolved compactor (cached by the plugin registry)."""
        return resolve_compactor(self.compactor)

    def resolve_window(self, comp: Compactor | None = None, *, entry: str = _CREATE) -> int | None:
        """The window the compactor sizes against, or ``None`` when it needs none.

        The options' ``context_window`` when pinned, otherwise the catalog's window for
        ``model``, memoised per agent and model. Raises :class:`WindowUnknownError` naming
        the model and how to pin a window when neither gives one.
        """
        comp = comp or resolve_compactor(self.compactor)
        opts = self.compactor_opts
        if not comp.needs_window(dict(opts)):
            return None
        pinned = opts.get("context_window")
        if pinned is not None:
            window = _whole_positive(pinned)
            if window is None:
                # The core reads this option itself, so it checks it for every compactor,
                # including one without an options model.
                raise OptionsError(
                    f"{entry}: compactor {self.compactor!r} refused its options: option "
                    "'context_window': the pinned context window must be a positive whole "
                    f"number of tokens (got {pinned!r})"
                )
            return window
        model = self.model
        if model is None:
            raise WindowUnknownError(
                f"{entry}: compactor {self.compactor!r} sizes against the model's context "
                "window, but the config names no model; set model=... or pin the window with "
                "compactor_opts={'context_window': <tokens>}"
            )
        hit = self._windows.get(model)
        if hit is not None:
            return hit
        window = self.catalog.window(model)
        if window is None:
            raise WindowUnknownError(
                f"{entry}: compactor {self.compactor!r} needs the context window of model "
                f"{model!r}, which the model catalog does not know; pin it with "
                "compactor_opts={'context_window': <tokens>} or add the model to the catalog: "
                f"StaticCatalog(overrides={{{model!r}: <tokens>}})"
            )
        self._windows[model] = window
        return window

    @property
    def prompt_tokens(self) -> int:
        """Estimated tokens of the system prompt and tool definitions (four characters each)."""
        if not self._prompt_tokens:
            chars = len(self.system_prompt)
            if self.tools:
                chars += len(json.dumps(list(self.tools), ensure_ascii=False, default=str))
            self._prompt_tokens.append(math.ceil(chars / 4))
        return self._prompt_tokens[0]

    def with_memory(self, memory: AgentMemory) -> AgentConfig:
        """A copy holding ``memory``; compactor settings are unchanged, so not revalidated."""
        return dataclasses.replace(self, memory=memory, _validate=False)

    def replace(
        self, *, entry: str = "normandy_core.AgentConfig.replace()", **changes: Any
    ) -> AgentConfig:
        """A copy with ``changes``; compactor settings are validated again under ``entry``."""
        for key in ("model", "catalog", "system_prompt", "tools"):
            if key in changes:
                changes.setdefault("_windows", {} if key in ("model", "catalog") else self._windows)
                changes["_prompt_tokens"] = []
        return dataclasses.replace(self, _entry=entry, **changes)

    def with_compactor(self, name: str, opts: Mapping[str, Any] | None = None) -> AgentConfig:
        """A copy using compactor ``name`` with ``opts``, validated where it is made."""
        return self.replace(
            entry="normandy_core.AgentConfig.with_compactor()",
            compactor=name,
            compactor_opts=dict(opts or {}),
        )
