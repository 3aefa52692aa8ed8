"""The compactor conformance kit: an opt-in pytest plugin (the ``testing`` extra).

Enable it in a test module or the root ``conftest.py`` of a plugin's tests::

    pytest_plugins = ["normandy_core.testing"]

It is never loaded automatically (there is no ``pytest11`` entry point). Then check a
compactor, selected by its installed name, in a few lines, either by subclassing::

    from normandy_core.testing import CompactorContract

    class TestMyCompactor(CompactorContract):
        compactor = "my_compactor"
        opts = {"threshold": 2_000}
        roomy_opts = {"threshold": 10**9}        # options under which nothing is over
        bad_opts = [{"threshold": -1}, {"nope": 1}]

or with the ``compactor_contract`` fixture (which is :func:`check_compactor`)::

    def test_contract(compactor_contract):
        compactor_contract("my_compactor", {"threshold": 2_000}, bad_opts=[{"nope": 1}])

The per-call rules are exactly the runtime's: every call goes through
:func:`normandy_core.call_compactor` and :func:`normandy_core.check_compaction`, the
check the boundary and the ``pipeline`` apply, with ``ctx`` built by
:func:`normandy_core.build_context` from the config's prepared compactor, so a compactor
that passes the kit is accepted at run time and one the runtime refuses fails here, with
the same message. Over conversations drawn by
:func:`normandy_core.testing.strategies.conversations` (and over the compactor's own
output, compacted again), a call fails when:

* the input ``acc`` or its memory is mutated;
* the result is not ``(AgentConfig, dict)`` with a boolean ``compacted``, an ``error``
  comes with ``compacted`` true or is not text, or token figures are not non-negative
  integers;
* the model, system prompt, tools or compactor settings come back changed;
* ``dropped`` is present on the skip or error path, or is not a list of entries of the
  input's active branch, each once, oldest first, equal to the entry it was;
* an entry is listed in ``dropped`` but kept unchanged, or removed or rewritten (other
  than stripping thinking) without being listed (lost silently);
* an entry a survival rule keeps (``ctx.rules``: pinned entries, the first user
  message, which every config keeps by default, ``keep_tools``, ``keep_if``) is dropped
  or rewritten other than losing its thinking;
* a tool use and its result are separated, or the kept history starts with an assistant
  message;
* it compacts at a mid-round boundary and keeps thinking.

The kit adds rules the runtime cannot check at a single call:

* at a mid-round boundary under the window (a window of 10⁹ tokens, or ``roomy_opts``
  for a compactor that needs no window) the same ``acc`` and memory come back;
* a compactor that declares a level (its ``compaction_threshold`` hook) returns exactly
  ``(acc, {"compacted": False})`` whenever the conversation plus the prompt is at or
  below it, since the boundary does not call it there (checked at every call);
* good options are accepted and every ``bad_opts`` example is refused where the config
  is made, with an :class:`~normandy_core.OptionsError` naming the entry point and the
  compactor;
* under survival rules drawn by
  :func:`normandy_core.testing.strategies.survival_rules` (the first user message on or
  off, ``keep_tools``, a ``keep_if`` predicate), every entry they keep survives each
  compaction, unless the config is refused where it is made (an
  :class:`~normandy_core.OptionsError` from ``validate_opts``, which receives the
  rules) or the compactor returns the error path (:func:`check_survival`).

It sits at the top of the core with the application (:mod:`normandy_core.app`): it
may import every layer below it, and nothing imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NoReturn

try:
    import pytest
    from hypothesis import HealthCheck, given, reject, settings
except ImportError as exc:  # ModuleNotFoundError included
    raise ImportError(
        "normandy_core.testing (the compactor conformance kit) needs pytest and hypothesis, "
        f"which the 'testing' extra installs: pip install 'normandy-core[testing]' ({exc})",
        name=exc.name,
    ) from exc

from normandy_core.contract.check import build_context, call_compactor
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.plugins import resolve_compactor
from normandy_core.contract.types import CompactionContext, ContractViolation
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.survival import SurvivalRules
from normandy_core.errors import OptionsError
from normandy_core.testing.strategies import (
    Case,
    Conversation,
    cases,
    conversations,
    survival_rules,
)

__all__ = [
    "ROOMY_WINDOW",
    "CompactorContract",
    "check_call",
    "check_compactor",
    "check_generated",
    "check_options",
    "check_roomy_mid_round",
    "check_survival",
    "compactor_contract",
    "context_for",
]

#: The window used for the "fits the window" rule: nothing generated comes close.
ROOMY_WINDOW = 10**9
_ENTRY = "normandy_core.AgentConfig()"


def _fail(name: str, rule: str, detail: str = "") -> NoReturn:
    raise AssertionError(
        f"compactor {name!r} breaks the contract: {rule}" + (f"\n{detail}" if detail else "")
    )


def context_for(acc: AgentConfig, *, mid_round: bool) -> CompactionContext:
    """The ``ctx`` the boundary would build for ``acc`` (window and counter as prepared)."""
    return build_context(
        acc.prepared, model=acc.model, prompt_tokens=acc.prompt_tokens, mid_round=mid_round
    )


def check_call(
    name: str, acc: AgentConfig, ctx: CompactionContext | None = None, opts: Any = None
) -> tuple[AgentConfig, dict[str, Any]]:
    """Call compactor ``name``'s ``maybe_compact`` once and apply the runtime's check.

    ``acc`` must be a config of compactor ``name`` (its prepared options are used unless
    ``opts`` is given); ``ctx`` defaults to the boundary's at a turn start. Returns the
    checked ``(acc, meta)``; raises ``AssertionError`` with the check's message.
    """
    comp = resolve_compactor(name)
    if ctx is None:
        ctx = context_for(acc, mid_round=False)
    options = acc.prepared.options if opts is None else opts
    memory = acc.memory
    dump = memory.dump()
    try:
        new_acc, meta = call_compactor(comp, acc, ctx, options)
    except ContractViolation as exc:
        _fail(name, str(exc))
    if memory.dump() != dump:
        _fail(name, "it mutated its input memory")
    level = acc.prepared.thresholds[ctx.mid_round] if opts is None else None
    if level is not None and ctx.window == acc.prepared.window:
        size = ctx.counter.memory_tokens(memory) + ctx.prompt_tokens
        if size <= level and (new_acc is not acc or dict(meta) != {"compacted": False}):
            _fail(
                name,
                f"at {size:,} tokens, at or below the {level:,} its compaction_threshold "
                "declared, it did not return the plain skip (acc, {'compacted': False}); "
                "the boundary does not call it there",
                f"meta: {dict(meta)!r:.300}",
            )
    return new_acc, dict(meta)


def check_options(
    name: str,
    opts: Mapping[str, Any] | None = None,
    bad_opts: Sequence[Mapping[str, Any]] = (),
    *,
    model: str = "claude-sonnet-4-5",
) -> None:
    """``opts`` are accepted where a config is made; each ``bad_opts`` example is refused there.

    A refusal must be an :class:`~normandy_core.OptionsError` whose message begins with the
    entry point and names the compactor.
    """
    AgentConfig(model=model, compactor=name, compactor_opts=dict(opts or {}))
    for bad in bad_opts:
        try:
            AgentConfig(model=model, compactor=name, compactor_opts=dict(bad))
        except OptionsError as exc:
            text = str(exc)
            if not text.startswith(_ENTRY) or name not in text:
                _fail(name, "an options error must begin with the entry point and name it", text)
            continue
        except Exception as exc:
            _fail(
                name,
                f"bad options {dict(bad)!r} raised {type(exc).__name__}, not OptionsError",
                str(exc),
            )
        _fail(name, f"bad options {dict(bad)!r} were accepted at config time")


def _settings(max_examples: int | None) -> Callable[[Any], Any]:
    extra: dict[str, Any] = {} if max_examples is None else {"max_examples": max_examples}
    return settings(
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **extra,
    )


def _config(
    name: str,
    opts: Mapping[str, Any],
    model: str,
    memory: AgentMemory,
    window: int,
    rules: SurvivalRules | None = None,
    client: Any = None,
) -> AgentConfig:
    """A config of compactor ``name`` holding ``memory``, its window pinned to ``window``
    when it sizes against one and ``opts`` pin none, under survival ``rules``, with the
    model ``client`` (``None``: none)."""
    from normandy_core.contract.preparation import pin_if_needed

    options = dict(opts)
    if "context_window" not in options:
        options = pin_if_needed(name, options, window, entry=_ENTRY)
    acc = AgentConfig(
        model=model, compactor=name, compactor_opts=options, survival=rules, client=client
    )
    return acc.with_memory(memory)


def check_generated(
    name: str,
    opts: Mapping[str, Any] | None = None,
    *,
    model: str = "claude-sonnet-4-5",
    windows: tuple[int, int] = (1_000, 10_000),
    max_examples: int | None = None,
    client: Any = None,
) -> None:
    """:func:`check_call` over generated conversations, then again over each result.

    A compactor that needs a window gets one drawn from ``windows`` (both ends included);
    ``ctx.mid_round`` is true when the conversation ends after a tool batch. ``client``
    is the configs' model client (for a compactor that calls the model through it).
    """
    options = dict(opts or {})

    @_settings(max_examples)
    @given(case=cases(windows=windows))
    def run(case: Case) -> None:
        conv = case.conversation
        try:
            acc = _config(name, options, model, conv.memory, case.window, client=client)
        except OptionsError:
            reject()  # a window these options refuse where the config is made
        ctx = context_for(acc, mid_round=conv.ends_mid_round)
        new_acc, meta = check_call(name, acc, ctx)
        if meta["compacted"]:
            check_call(name, new_acc, ctx)

    run()


def check_roomy_mid_round(
    name: str,
    opts: Mapping[str, Any] | None = None,
    *,
    model: str = "claude-sonnet-4-5",
    max_examples: int | None = None,
    client: Any = None,
) -> None:
    """Mid-round, with everything fitting, the same ``acc`` and memory come back.

    The window is :data:`ROOMY_WINDOW`; a compactor that needs no window must be given
    ``opts`` under which no generated conversation is over its trigger.
    """
    options = dict(opts or {})

    @_settings(max_examples)
    @given(conv=conversations(mid_round=True))
    def run(conv: Conversation) -> None:
        acc = _config(name, options, model, conv.memory, ROOMY_WINDOW, client=client)
        ctx = context_for(acc, mid_round=True)
        new_acc, meta = check_call(name, acc, ctx)
        if new_acc is not acc or new_acc.memory is not acc.memory or meta["compacted"]:
            _fail(
                name,
                "mid-round, while the conversation fits the window, the memory must be left "
                "unchanged (the same acc and memory object)",
                repr(meta)[:300],
            )

    run()


def _check_kept(name: str, acc: AgentConfig, new_acc: AgentConfig, meta: Mapping[str, Any]) -> None:
    """Every entry ``acc``'s rules keep is in ``new_acc``, unchanged but for its thinking."""
    if not meta.get("compacted"):
        return
    rules = acc.rules
    now = {e.id: e for e in new_acc.memory.entries()}
    protected = rules.protected(acc.memory.entries())
    for e in acc.memory.entries():
        if e.id not in protected:
            continue
        kept = now.get(e.id)
        if kept is None or kept.without_thinking().content != e.without_thinking().content:
            _fail(
                name,
                f"survival rule {rules.describe(protected[e.id])} keeps entry {e.id!r}, "
                f"which the compaction {'dropped' if kept is None else 'rewrote'}",
                repr(rules)[:300],
            )


def check_survival(
    name: str,
    opts: Mapping[str, Any] | None = None,
    *,
    model: str = "claude-sonnet-4-5",
    windows: tuple[int, int] = (1_000, 10_000),
    max_examples: int | None = None,
    client: Any = None,
) -> None:
    """Over generated conversations and drawn survival rules, every entry the rules keep
    survives every compaction (and a second one, of the result).

    A config the compactor refuses where it is made (its ``validate_opts`` receives the
    rules) and the error path are allowed; any other way of not keeping a kept entry
    fails, with the rule and the entry named.
    """
    options = dict(opts or {})

    @_settings(max_examples)
    @given(case=cases(windows=windows), rules=survival_rules())
    def run(case: Case, rules: SurvivalRules) -> None:
        conv = case.conversation
        try:
            acc = _config(name, options, model, conv.memory, case.window, rules, client)
        except OptionsError:
            return  # the compactor refuses these rules (or this window) at config time
        ctx = context_for(acc, mid_round=conv.ends_mid_round)
        new_acc, meta = check_call(name, acc, ctx)
        _check_kept(name, acc, new_acc, meta)
        if meta["compacted"]:
            again_acc, again = check_call(name, new_acc, ctx)
            _check_kept(name, new_acc, again_acc, again)

    run()


def check_compactor(
    name: str,
    opts: Mapping[str, Any] | None = None,
    *,
    bad_opts: Sequence[Mapping[str, Any]] = (),
    roomy_opts: Mapping[str, Any] | None = None,
    model: str = "claude-sonnet-4-5",
    windows: tuple[int, int] = (1_000, 10_000),
    max_examples: int | None = None,
    client: Any = None,
) -> None:
    """Run every rule of the kit against the compactor installed as ``name``.

    :param opts: options exercised over generated conversations (pick ones that make the
        compactor act on some of them).
    :param bad_opts: option sets that must be refused at config time.
    :param roomy_opts: options under which nothing is over the trigger, for the
        mid-round rule (default: ``opts``, with a window of :data:`ROOMY_WINDOW`).
    :param max_examples: hypothesis examples per property (default: the active profile's).
    :param client: the model client every config gets (``AgentConfig(client=...)``), for a
        compactor that calls the model through it (a client of a local server speaking
        the provider's protocol, in tests).
    """
    comp = resolve_compactor(name)
    if not isinstance(comp.needs_window(comp.parse_options(dict(opts or {}), _ENTRY)), bool):
        _fail(name, "needs_window must return a bool")
    check_options(name, opts, bad_opts, model=model)
    kit = {"model": model, "max_examples": max_examples, "client": client}
    check_generated(name, opts, windows=windows, **kit)
    check_survival(name, opts, windows=windows, **kit)
    roomy = opts if roomy_opts is None else roomy_opts
    check_roomy_mid_round(name, roomy, **kit)


class CompactorContract:
    """Subclass as ``TestX(CompactorContract)`` and set ``compactor`` (and options) to check it."""

    compactor: ClassVar[str] = ""
    """The installed name of the compactor under test."""
    opts: ClassVar[Mapping[str, Any]] = {}
    """Options exercised over generated conversations."""
    roomy_opts: ClassVar[Mapping[str, Any] | None] = None
    """Options under which nothing is over the trigger (default: ``opts``)."""
    bad_opts: ClassVar[Sequence[Mapping[str, Any]]] = ()
    """Option sets that must be refused at config time."""
    model: ClassVar[str] = "claude-sonnet-4-5"
    windows: ClassVar[tuple[int, int]] = (1_000, 10_000)
    max_examples: ClassVar[int | None] = None
    client: ClassVar[Any] = None
    """The model client of every config (for a compactor that calls the model)."""

    def test_resolves_by_name(self) -> None:
        """The compactor is installed and loads under its name."""
        assert self.compactor, "set `compactor` to the name of the compactor under test"
        comp = resolve_compactor(self.compactor)
        assert isinstance(comp.needs_window(comp.parse_options(dict(self.opts), _ENTRY)), bool)

    def test_options_accepted_and_bad_ones_refused(self) -> None:
        """Good options accepted, bad ones refused at config time naming entry and compactor."""
        check_options(self.compactor, self.opts, self.bad_opts, model=self.model)

    def test_contract_over_generated_conversations(self) -> None:
        """Meta shape, no mutation, dropped ids and order, pairing, thinking mid-round."""
        check_generated(
            self.compactor,
            self.opts,
            model=self.model,
            windows=self.windows,
            max_examples=self.max_examples,
            client=self.client,
        )

    def test_survival_rules_are_honoured(self) -> None:
        """Entries kept by drawn survival rules survive, unless the config is refused or
        the compactor returns the error path."""
        check_survival(
            self.compactor,
            self.opts,
            model=self.model,
            windows=self.windows,
            max_examples=self.max_examples,
            client=self.client,
        )

    def test_mid_round_under_the_window_keeps_the_same_memory(self) -> None:
        """Mid-round and fitting: the same acc and memory object come back."""
        roomy = self.opts if self.roomy_opts is None else self.roomy_opts
        check_roomy_mid_round(
            self.compactor,
            roomy,
            model=self.model,
            max_examples=self.max_examples,
            client=self.client,
        )


@pytest.fixture
def compactor_contract() -> Callable[..., None]:
    """The kit's :func:`check_compactor`, as a fixture."""
    return check_compactor
