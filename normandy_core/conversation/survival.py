"""Survival rules: what no compaction may drop, set once per config and honoured by all.

A config's rules (:class:`SurvivalRules`, the ``survival`` field of
:class:`~normandy_core.AgentConfig` and argument of :func:`normandy_core.compact`) are
validated where the config is made and travel to every compactor in ``ctx.rules``. An
entry a rule *keeps* stays on the active branch, in its place, with its content
unchanged; only its thinking blocks may go, as every kept entry's do. The rules:

* ``pinned`` (always on): an entry with ``pinned=True``;
* ``keep_first_user`` (on by default): the first user message, the task; the first
  user entry of the active branch that carries no tool results and is not a marker,
  summary or provider-returned copy a compactor inserted;
* ``keep_current_request`` (on by default): the user message that opened the current
  turn, the request the model is answering; the newest such user entry;
* ``keep_tools``: every assistant entry calling a tool of that name, and every entry
  carrying a result of such a call, so the pair is kept together;
* ``keep_if``: every entry the predicate (a Python callable on an
  :class:`~normandy_core.Entry`, set in code only) returns true for.

A compactor keeps the unit of a kept entry whole (a tool use never loses its result),
refuses at config time rules it cannot honour (its ``validate_opts`` receives them), or
returns the error path. :func:`normandy_core.check_compaction`, which the boundary, the
``pipeline`` and the conformance kit all apply, refuses a result that dropped or
rewrote a kept entry. ``summary_instructions`` is not a keep rule: it is text a
compactor that writes a summary with the model passes to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from normandy_core.conversation.entries import Entry
from normandy_core.conversation.keys import INSERTED_KEYS, PROVIDER_REBUILT_KEY
from normandy_core.conversation.structure import carries_results, tool_result_ids
from normandy_core.errors import NormandyError, OptionsError

__all__ = [
    "PROVIDER_REBUILT_KEY",
    "RULE_CURRENT_REQUEST",
    "RULE_FIRST_USER",
    "RULE_PINNED",
    "RULE_PREDICATE",
    "RULE_TOOLS",
    "RULES",
    "SurvivalError",
    "SurvivalRules",
    "current_request_entry",
    "first_user_entry",
    "is_inserted",
    "is_user_message",
    "survival_rules",
]

#: The rule keeping entries with ``pinned=True`` (always on).
RULE_PINNED = "pinned"
#: The rule keeping the first user message (the task).
RULE_FIRST_USER = "keep_first_user"
#: The rule keeping the user message that opened the current turn (the request).
RULE_CURRENT_REQUEST = "keep_current_request"
#: The rule keeping the calls of the tools named in ``keep_tools`` and their results.
RULE_TOOLS = "keep_tools"
#: The rule keeping the entries the ``keep_if`` predicate accepts.
RULE_PREDICATE = "keep_if"
#: Every keep rule, in the order an entry is attributed to one (the first that keeps it).
RULES = (RULE_PINNED, RULE_FIRST_USER, RULE_CURRENT_REQUEST, RULE_TOOLS, RULE_PREDICATE)

#: The most characters ``summary_instructions`` may have.
MAX_INSTRUCTION_CHARS = 4000

#: Tags opening the text of such entries, in every transcript format.
_INSERTED_TAGS = ("[normandy:marker]", "[normandy:summary]")


class SurvivalError(NormandyError):
    """A survival rule could not be evaluated (the ``keep_if`` predicate raised)."""


class SurvivalRules(BaseModel):
    """What every compactor of a config must keep, and how a model summary is written.

    Unknown fields and bad values are refused where the config is made. ``keep_if`` is a
    Python callable and can be set in code only; a configuration read from a file or the
    command line gives the declarative rules (``keep_first_user``,
    ``keep_current_request``, ``keep_tools``, ``summary_instructions``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    keep_first_user: bool = True
    """Keep the first user message (the task) through every compaction."""
    keep_current_request: bool = True
    """Keep the user message that opened the current turn (the request the model is
    answering) through every compaction: the newest user entry that carries no tool
    results and is not a marker, summary or provider-returned copy."""
    keep_tools: tuple[str, ...] = ()
    """Tool names whose calls are kept with their results (``["read_file"]``)."""
    keep_if: Callable[[Entry], Any] | None = None
    """A predicate on an :class:`~normandy_core.Entry`: the entries it returns true for are
    kept. Code only; it must be a pure function of the entry (compactors and the contract
    check each call it)."""
    summary_instructions: str | None = Field(
        default=None, min_length=1, max_length=MAX_INSTRUCTION_CHARS
    )
    """Instructions the model summarizer is given with every summary it writes (what to
    keep, how to write it), such as ``"Keep every file path and error message verbatim."``"""

    @field_validator("keep_tools", mode="before")
    @classmethod
    def _tool_names(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("keep_tools must be a list of tool names, not one string")
        if isinstance(value, (list, tuple)):
            for name in value:
                if not isinstance(name, str) or not name.strip():
                    raise ValueError(
                        f"keep_tools must hold non-empty tool names, got {name!r} in {value!r}"
                    )
        return value

    @field_validator("keep_if", mode="before")
    @classmethod
    def _predicate(cls, value: object) -> object:
        if value is not None and not callable(value):
            raise ValueError(
                "keep_if must be a Python callable taking an Entry and returning true for "
                f"the entries to keep (got {type(value).__name__} {value!r:.80}); a predicate "
                "can be set in code only: from a configuration file or the command line use "
                "keep_tools, or pin the entries"
            )
        return value

    @field_validator("summary_instructions", mode="after")
    @classmethod
    def _instructions(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("summary_instructions must not be blank")
        return value

    @property
    def keeps_anything(self) -> bool:
        """Whether a rule other than ``pinned`` is on."""
        return (
            self.keep_first_user
            or self.keep_current_request
            or bool(self.keep_tools)
            or self.keep_if is not None
        )

    def describe(self, rule: str) -> str:
        """A rule as people read it in messages: ``keep_tools ['read_file']``."""
        if rule == RULE_FIRST_USER:
            return "keep_first_user (the first user message)"
        if rule == RULE_CURRENT_REQUEST:
            return "keep_current_request (the user message that opened the current turn)"
        if rule == RULE_TOOLS:
            return f"keep_tools {list(self.keep_tools)!r}"
        if rule == RULE_PREDICATE:
            name = getattr(self.keep_if, "__qualname__", None) or type(self.keep_if).__name__
            return f"keep_if ({name})"
        return "pinned entries"

    def active(self) -> tuple[str, ...]:
        """The keep rules that are on, in :data:`RULES` order (``pinned`` always)."""
        on = {
            RULE_PINNED: True,
            RULE_FIRST_USER: self.keep_first_user,
            RULE_CURRENT_REQUEST: self.keep_current_request,
            RULE_TOOLS: bool(self.keep_tools),
            RULE_PREDICATE: self.keep_if is not None,
        }
        return tuple(rule for rule in RULES if on[rule])

    def protected(self, entries: Sequence[Entry]) -> dict[str, str]:
        """The entries of ``entries`` (an active branch, in order) the rules keep.

        Maps each kept entry's id to the first rule (in :data:`RULES` order) that keeps
        it. Linear in the entries; calls ``keep_if`` once per entry no other rule keeps.

        :raises SurvivalError: ``keep_if`` raised, naming the entry and the error.
        """
        out: dict[str, str] = {e.id: RULE_PINNED for e in entries if e.pinned}
        if self.keep_first_user:
            task = first_user_entry(entries)
            if task is not None:
                out.setdefault(task.id, RULE_FIRST_USER)
        if self.keep_current_request:
            request = current_request_entry(entries)
            if request is not None:
                out.setdefault(request.id, RULE_CURRENT_REQUEST)
        if self.keep_tools:
            names = frozenset(self.keep_tools)
            calls: set[str] = set()
            for e in entries:
                if e.role == "assistant":
                    hit = [u.id for u in e.tool_uses if u.name in names]
                    if hit:
                        calls.update(hit)
                        out.setdefault(e.id, RULE_TOOLS)
                elif calls and any(r in calls for r in tool_result_ids(e)):
                    out.setdefault(e.id, RULE_TOOLS)
        predicate = self.keep_if
        if predicate is not None:
            for e in entries:
                if e.id in out:
                    continue
                try:
                    keep = predicate(e)
                except Exception as exc:
                    raise SurvivalError(
                        f"survival rule keep_if raised {type(exc).__name__} on entry "
                        f"{e.id!r}: {exc}"
                    ) from exc
                if keep:
                    out[e.id] = RULE_PREDICATE
        return out


def is_inserted(entry: Entry) -> bool:
    """Whether ``entry`` is a marker, summary or provider-returned copy a compactor
    inserted (metadata or tag)."""
    if any(entry.metadata.get(k) for k in INSERTED_KEYS):
        return True
    if entry.role != "user":
        return False
    return entry.text().startswith(_INSERTED_TAGS)


def is_user_message(entry: Entry) -> bool:
    """Whether ``entry`` is a message the user wrote: a user entry that carries no tool
    results and is not a marker, summary or provider-returned copy a compactor inserted
    (:func:`is_inserted`)."""
    return entry.role == "user" and not carries_results(entry) and not is_inserted(entry)


def first_user_entry(entries: Sequence[Entry]) -> Entry | None:
    """The first user message of ``entries`` (the task, :func:`is_user_message`);
    ``None`` if none."""
    return next((e for e in entries if is_user_message(e)), None)


def current_request_entry(entries: Sequence[Entry]) -> Entry | None:
    """The user message that opened the current turn of ``entries`` (the request the
    model is answering): the newest :func:`is_user_message`; ``None`` if none."""
    return next((e for e in reversed(entries) if is_user_message(e)), None)


#: The rules of a config that sets none: keep pinned entries, the first user message and
#: the one that opened the current turn.
DEFAULT_RULES = SurvivalRules()


def survival_rules(value: object, *, entry: str) -> SurvivalRules:
    """``value`` as :class:`SurvivalRules`: ``None`` gives the defaults, a mapping is
    validated, an instance is kept.

    :raises OptionsError: beginning with ``entry``, naming each rule at fault and what is
        allowed.
    """
    if value is None:
        return DEFAULT_RULES
    if isinstance(value, SurvivalRules):
        return value
    if not isinstance(value, Mapping):
        raise OptionsError(
            f"{entry}: survival must be SurvivalRules or a mapping of rule names to values, "
            f"got {type(value).__name__}"
        )
    try:
        return SurvivalRules.model_validate(dict(value))
    except ValidationError as exc:
        allowed = ", ".join(SurvivalRules.model_fields)
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"][:1])
            if err["type"] == "extra_forbidden":
                lines.append(f"  rule {where!r}: unknown rule; allowed: {allowed}")
                continue
            raised = (err.get("ctx") or {}).get("error")
            text = str(raised) if raised is not None and str(raised) else str(err["msg"])
            shown = "" if where == "keep_if" else f" (got {err.get('input')!r:.120})"
            lines.append(f"  rule {where!r}: {text}{shown}")
        raise OptionsError(f"{entry}: survival rules refused:\n" + "\n".join(lines)) from exc
