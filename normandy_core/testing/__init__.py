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

The rules checked, over conversations drawn by
:func:`normandy_core.testing.strategies.conversations` (and over the compactor's own
output, compacted again), calling ``maybe_compact`` directly so nothing is hidden by the
boundary's safety net:

* the result is ``(AgentConfig, dict)`` and ``meta["compacted"]`` is a bool;
* the input ``acc`` and its memory are never mutated;
* skip and error paths return the same ``acc`` and carry no ``dropped``; an error is text;
* ``dropped``, when present, is a list of entries of the input's active branch, each
  once, oldest first, each equal to the entry it was (id and original content);
* nothing is lost silently: when a compactor reports ``dropped``, every entry it removed
  or rewrote (other than stripping thinking) is in it;
* no orphaned tool use or result (:func:`normandy_core.pairing_problems`);
* when it compacts at a mid-round boundary, no kept message has thinking;
* token figures in meta, when present, are non-negative integers;
* at a mid-round boundary under the window (a window of 10⁹ tokens, or ``roomy_opts``
  for a compactor that needs no window) the same ``acc`` and memory come back;
* good options are accepted and every ``bad_opts`` example is refused where the config
  is made, with an :class:`~normandy_core.OptionsError` naming the entry point and the
  compactor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings

from normandy_core.boundary import CompactionContext
from normandy_core.config import AgentConfig
from normandy_core.errors import OptionsError
from normandy_core.memory import AgentMemory, Entry
from normandy_core.plugins import Compactor, resolve_compactor
from normandy_core.structure import pairing_problems
from normandy_core.testing.strategies import Case, Conversation, cases, conversations

__all__ = [
    "ROOMY_WINDOW",
    "CompactorContract",
    "check_call",
    "check_compactor",
    "check_generated",
    "check_options",
    "check_roomy_mid_round",
    "compactor_contract",
]

#: The window used for the "fits the window" rule: nothing generated comes close.
ROOMY_WINDOW = 10**9
_ENTRY = "normandy_core.AgentConfig()"
_TOKEN_KEYS = ("tokens_before", "tokens_after", "tokens_removed")


def _fail(name: str, rule: str, detail: str = "") -> None:
    raise AssertionError(
        f"compactor {name!r} breaks the contract: {rule}" + (f"\n{detail}" if detail else "")
    )


def _context(
    comp: Compactor, acc: AgentConfig, opts: Mapping[str, Any], window: int, mid_round: bool
) -> CompactionContext:
    w = window if comp.needs_window(dict(opts)) else None
    return CompactionContext(
        model=acc.model,
        window=w,
        prompt_tokens=acc.prompt_tokens if w is not None else 0,
        mid_round=mid_round,
    )


def _same_content(a: Entry, b: Entry) -> bool:
    return a.without_thinking().content == b.without_thinking().content


def check_call(
    name: str, acc: AgentConfig, ctx: CompactionContext, opts: Mapping[str, Any] | None = None
) -> tuple[AgentConfig, dict[str, Any]]:
    """Call compactor ``name``'s ``maybe_compact`` once and check every per-call rule.

    ``opts`` defaults to ``acc.compactor_opts``. Returns the compactor's ``(acc, meta)``;
    raises ``AssertionError`` naming the rule that was broken.
    """
    comp = resolve_compactor(name)
    options = dict(acc.compactor_opts if opts is None else opts)
    memory = acc.memory
    dump, version, head = memory.dump(), memory.version, memory.head
    original = memory.entries()
    result = comp.maybe_compact(acc, ctx, dict(options))

    if acc.memory is not memory or memory.version != version or memory.head != head:
        _fail(name, "it mutated its input (acc.memory was replaced or appended to)")
    if memory.dump() != dump:
        _fail(name, "it mutated its input memory")
    if not (isinstance(result, tuple) and len(result) == 2):
        _fail(name, "maybe_compact must return (acc, meta)", repr(result)[:300])
    new_acc, meta = result
    if not isinstance(new_acc, AgentConfig):
        _fail(name, f"the returned acc is a {type(new_acc).__name__}, not an AgentConfig")
    if not isinstance(meta, dict) or not isinstance(meta.get("compacted"), bool):
        _fail(name, "meta must be a dict with a boolean 'compacted'", repr(meta)[:300])
    for key in _TOKEN_KEYS:
        if key in meta and not (
            isinstance(meta[key], int) and not isinstance(meta[key], bool) and meta[key] >= 0
        ):
            _fail(name, f"meta[{key!r}] must be a non-negative int", repr(meta[key]))

    if not meta["compacted"]:
        if "dropped" in meta:
            _fail(name, "'dropped' must be absent on the skip and error paths")
        if new_acc is not acc:
            _fail(name, "the skip and error paths must return the same acc")
        if "error" in meta and not isinstance(meta["error"], str):
            _fail(name, "meta['error'] must be text", repr(meta["error"]))
        return new_acc, meta
    if "error" in meta:
        _fail(name, "an error must come with compacted=False")

    kept = new_acc.memory.entries()
    if not pairing_problems(original) and (problems := pairing_problems(kept)):
        _fail(name, "it orphaned a tool use or result", "\n".join(problems[:5]))
    if ctx.mid_round and (thinking := [e.id for e in kept if e.has_thinking]):
        _fail(name, "compacting mid-round, it kept thinking blocks", f"entries: {thinking[:5]}")

    if "dropped" in meta:
        dropped = meta["dropped"]
        if not isinstance(dropped, list) or not all(isinstance(e, Entry) for e in dropped):
            _fail(name, "meta['dropped'] must be a list of Entry objects")
        position = {e.id: i for i, e in enumerate(original)}
        ids = [e.id for e in dropped]
        if len(set(ids)) != len(ids):
            _fail(name, "an entry is reported twice in 'dropped'", str(ids))
        if unknown := [i for i in ids if i not in position]:
            _fail(
                name, "'dropped' holds ids that were not in the input's active branch", str(unknown)
            )
        if ids != sorted(ids, key=position.__getitem__):
            _fail(name, "'dropped' must be oldest first")
        for e in dropped:
            if e != original[position[e.id]]:
                _fail(name, f"dropped entry {e.id!r} is not the original (id and content)")
        reported = set(ids)
        new_by_id = {e.id: e for e in kept}
        for e in original:
            now = new_by_id.get(e.id)
            if e.id not in reported and (now is None or not _same_content(e, now)):
                what = "removed" if now is None else "rewritten"
                _fail(name, f"entry {e.id!r} was {what} but is not in 'dropped' (lost silently)")
    return new_acc, meta


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


def _config(name: str, opts: Mapping[str, Any], model: str, memory: AgentMemory) -> AgentConfig:
    acc = AgentConfig(model=model, compactor=name, compactor_opts=dict(opts))
    return acc.with_memory(memory)


def check_generated(
    name: str,
    opts: Mapping[str, Any] | None = None,
    *,
    model: str = "claude-sonnet-4-5",
    windows: tuple[int, int] = (1_000, 10_000),
    max_examples: int | None = None,
) -> None:
    """:func:`check_call` over generated conversations, then again over each result.

    A compactor that needs a window gets one drawn from ``windows`` (both ends included);
    ``ctx.mid_round`` is true when the conversation ends after a tool batch.
    """
    options = dict(opts or {})
    comp = resolve_compactor(name)

    @_settings(max_examples)
    @given(case=cases(windows=windows))
    def run(case: Case) -> None:
        conv = case.conversation
        acc = _config(name, options, model, conv.memory)
        ctx = _context(comp, acc, options, case.window, conv.ends_mid_round)
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
) -> None:
    """Mid-round, with everything fitting, the same ``acc`` and memory come back.

    The window is :data:`ROOMY_WINDOW`; a compactor that needs no window must be given
    ``opts`` under which no generated conversation is over its trigger.
    """
    options = dict(opts or {})
    comp = resolve_compactor(name)

    @_settings(max_examples)
    @given(conv=conversations(mid_round=True))
    def run(conv: Conversation) -> None:
        acc = _config(name, options, model, conv.memory)
        ctx = _context(comp, acc, options, ROOMY_WINDOW, True)
        new_acc, meta = check_call(name, acc, ctx)
        if new_acc is not acc or new_acc.memory is not acc.memory or meta["compacted"]:
            _fail(
                name,
                "mid-round, while the conversation fits the window, the memory must be left "
                "unchanged (the same acc and memory object)",
                repr(meta)[:300],
            )

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
) -> None:
    """Run every rule of the kit against the compactor installed as ``name``.

    :param opts: options exercised over generated conversations (pick ones that make the
        compactor act on some of them).
    :param bad_opts: option sets that must be refused at config time.
    :param roomy_opts: options under which nothing is over the trigger, for the
        mid-round rule (default: ``opts``, with a window of :data:`ROOMY_WINDOW`).
    :param max_examples: hypothesis examples per property (default: the active profile's).
    """
    comp = resolve_compactor(name)
    if not isinstance(comp.needs_window(dict(opts or {})), bool):
        _fail(name, "needs_window must return a bool")
    check_options(name, opts, bad_opts, model=model)
    check_generated(name, opts, model=model, windows=windows, max_examples=max_examples)
    roomy = opts if roomy_opts is None else roomy_opts
    check_roomy_mid_round(name, roomy, model=model, max_examples=max_examples)


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

    def test_resolves_by_name(self) -> None:
        """The compactor is installed and loads under its name."""
        assert self.compactor, "set `compactor` to the name of the compactor under test"
        comp = resolve_compactor(self.compactor)
        assert isinstance(comp.needs_window(dict(self.opts)), bool)

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
        )

    def test_mid_round_under_the_window_keeps_the_same_memory(self) -> None:
        """Mid-round and fitting: the same acc and memory object come back."""
        roomy = self.opts if self.roomy_opts is None else self.roomy_opts
        check_roomy_mid_round(
            self.compactor, roomy, model=self.model, max_examples=self.max_examples
        )


@pytest.fixture
def compactor_contract() -> Callable[..., None]:
    """The kit's :func:`check_compactor`, as a fixture."""
    return check_compactor
