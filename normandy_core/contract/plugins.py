"""Finding, loading and isolating plugins: compactors by entry-point name, hook plugins.

Entry points are read with :mod:`importlib.metadata` once per process and cached
(:func:`reload_plugins` forgets them). A compactor is imported only when something
resolves its name, so a broken one that nobody selected cannot stop start-up. Hook
plugins are loaded together the first time a hook is needed; one that fails is logged,
named and skipped, and the others still load.

Compactors are registered against :class:`~normandy_core.contract.hookspecs.CompactorSpec` and hook
plugins against :class:`~normandy_core.contract.hookspecs.HookSpec`, each kind in plugin managers
of its own; pluggy's ``check_pending`` refuses a hook the kind does not define, naming the
kind that may implement it.

``NORMANDY_LOAD_PLUGINS`` (comma-separated names; set but empty means none) is an
allow-list and ``NORMANDY_DISABLE_PLUGINS`` a deny-list. A name may be qualified by its
group (``compactors:window_manager``, ``hooks:archive``, ``commands:archive-cli``, or the
full group name, ``normandy_core.hooks:archive``). A bare name in the deny-list disables
that name in every group; in the allow-list it allows it in every group only while all
the entry points of that name come from one distribution, so it never reaches into an
unrelated distribution's plugin of another kind by accident (an ambiguous bare name
allows nothing, and the listing says how to qualify it). Plugins registered in code are
the application's own choice and are not filtered. Entry points are never discovered
from the current directory implicitly.

Any exception a plugin raises while it is imported, instantiated or called, ``SystemExit``
and ``KeyboardInterrupt`` included, is contained and named like any other fault; only a
genuine Ctrl-C of the user's own process still stops it (see :func:`call_plugin`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import pluggy

from normandy_core.contract import hookspecs
from normandy_core.contract.faults import PluginFault, call_plugin
from normandy_core.errors import (
    OptionsError,
    PluginConflictError,
    PluginDisabledError,
    PluginLoadError,
    UnknownCompactorError,
)

if TYPE_CHECKING:
    from normandy_core.contract.types import AgentConfigView, CompactionContext

__all__ = [
    "ADAPTER_GROUP",
    "COMMAND_GROUP",
    "COMPACTOR_GROUP",
    "ENV_DISABLE",
    "ENV_LOAD",
    "HOOK_GROUP",
    "Compactor",
    "PluginRow",
    "command_registrars",
    "HookCaller",
    "describe_hook",
    "generation",
    "registered_in_code",
    "hook_callers",
    "hook_manager",
    "list_plugins",
    "register_compactor",
    "register_hook",
    "reload_plugins",
    "resolve_compactor",
    "unregister_compactor",
    "unregister_hook",
]

log = logging.getLogger("normandy_core.plugins")

#: Entry-point group of compactors; the entry-point name is the name users configure.
COMPACTOR_GROUP = "normandy_core.compactors"
#: Entry-point group of hook plugins, all loaded automatically.
HOOK_GROUP = "normandy_core.hooks"
#: Allow-list of plugin names, bare or group-qualified (comma-separated; set but empty: none).
ENV_LOAD = "NORMANDY_LOAD_PLUGINS"
#: Deny-list of plugin names, bare or group-qualified (comma-separated).
ENV_DISABLE = "NORMANDY_DISABLE_PLUGINS"

#: Entry-point group of command-line extensions: ``name = "module:register"``, where
#: ``register(subparsers)`` adds ``normandy <name> ...`` subcommands.
COMMAND_GROUP = "normandy_core.commands"

#: Entry-point group of framework adapters (``normandy-langchain``...): listed by
#: ``normandy plugins`` so users see them; the core never loads them, the framework
#: imports them itself. ``name = "module"``, the module the user imports.
ADAPTER_GROUP = "normandy_core.adapters"

_GROUPS = (COMPACTOR_GROUP, HOOK_GROUP, COMMAND_GROUP, ADAPTER_GROUP)
_KINDS = {
    COMPACTOR_GROUP: "compactor",
    HOOK_GROUP: "hook",
    COMMAND_GROUP: "command",
    ADAPTER_GROUP: "adapter",
}
#: The short group names accepted as qualifiers in the allow- and deny-lists.
_SHORT = {
    COMPACTOR_GROUP: "compactors",
    HOOK_GROUP: "hooks",
    COMMAND_GROUP: "commands",
    ADAPTER_GROUP: "adapters",
}
_IN_CODE = "<registered in code>"
#: Which kind of plugin implements each hook, for the refusal of a misplaced one.
_WHO = {COMPACTOR_GROUP: "compactor", HOOK_GROUP: "hook plugin"}


@dataclass(frozen=True)
class _EP:
    name: str
    group: str
    value: str
    dist: str
    version: str

    def load(self) -> Any:
        """Import the entry point's object; any failure (``SystemExit`` at import
        included) is a :class:`PluginLoadError` naming the entry point, group,
        distribution and version, the cause chained."""
        try:
            return call_plugin(md.EntryPoint(self.name, self.value, self.group).load)
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, PluginFault) else exc
            raise PluginLoadError(
                f"{self.describe()} failed to import: {type(cause).__name__}: {cause}"
            ) from cause

    def describe(self) -> str:
        kind = {HOOK_GROUP: "hook plugin", COMMAND_GROUP: "command", ADAPTER_GROUP: "adapter"}.get(
            self.group, "compactor"
        )
        return f"{kind} {self.name!r} (group {self.group}) from {self.dist} {self.version}"


@dataclass(frozen=True)
class PluginRow:
    """One entry point (or in-code plugin) as :func:`list_plugins` reports it.

    ``status`` is ``"loaded"``, ``"not loaded"`` (a compactor nobody resolved yet),
    ``"disabled"`` (excluded by the environment), ``"conflict"`` (another distribution
    registers the same name: an error) or ``"error"`` (``error`` says why).
    """

    name: str
    group: str
    module: str
    distribution: str
    version: str
    status: str
    error: str | None = None

    @property
    def kind(self) -> str:
        """``"compactor"``, ``"hook"``, ``"command"`` or ``"adapter"``."""
        return _KINDS.get(self.group, "hook")

    @property
    def failed(self) -> bool:
        """Whether the row is an error (failed to load, or a name conflict)."""
        return self.status in ("error", "conflict")

    def as_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (with ``kind``)."""
        return {**asdict(self), "kind": self.kind}


@dataclass
class Compactor:
    """A resolved compactor: its name, where it comes from, and a typed facade to its hooks.

    The plugin is registered in a plugin manager of its own that knows only the compactor
    hookspecs, so ``maybe_compact`` is called on the selected compactor only, with
    pluggy's calling conventions.
    """

    name: str
    distribution: str
    version: str
    plugin: Any
    module: str
    group: str = COMPACTOR_GROUP
    _pm: pluggy.PluginManager = field(
        repr=False, default_factory=lambda: _new_pm(hookspecs.CompactorSpec)
    )
    _model: Any = field(repr=False, default=None)
    _impl: Any = field(repr=False, default=None)

    def describe(self) -> str:
        """``compactor 'x' (group normandy_core.compactors) from normandy-x 1.0``."""
        return (
            f"compactor {self.name!r} (group {self.group}) from {self.distribution} {self.version}"
        )

    @property
    def has_validate_opts(self) -> bool:
        """Whether the compactor implements ``validate_opts``."""
        return bool(self._pm.hook.validate_opts.get_hookimpls())

    @property
    def has_needs_window(self) -> bool:
        """Whether the compactor implements ``needs_window``."""
        return bool(self._pm.hook.needs_window.get_hookimpls())

    @property
    def options_model(self) -> Any:
        """The compactor's options model (its ``options_model`` hook), or ``None``."""
        return self._model

    def maybe_compact(self, acc: AgentConfigView, ctx: CompactionContext, opts: Any) -> Any:
        """Call the compactor's ``maybe_compact``; the result is checked by the caller
        (:func:`normandy_core.call_compactor`).

        Its manager holds this one plugin, so the implementation pluggy validated at load
        is called directly, with the arguments it names (pluggy's convention): the hot
        path of every boundary does not pay for a hook dispatch it cannot need.
        """
        impl = self._impl
        if impl is None:
            return self._pm.hook.maybe_compact(acc=acc, ctx=ctx, opts=opts)
        fn, names = impl
        if names == ("acc", "ctx", "opts"):
            return fn(acc, ctx, opts)
        given = {"acc": acc, "ctx": ctx, "opts": opts}
        return fn(*[given[n] for n in names])

    def parse_options(self, raw: Mapping[str, Any], entry: str) -> Any:
        """The options ``maybe_compact`` receives: parsed with the options model, or
        ``raw`` as a read-only mapping when the compactor declares none.

        :raises OptionsError: beginning with ``entry``, naming the compactor and option.
        """
        if self._model is None:
            return raw if isinstance(raw, MappingProxyType) else MappingProxyType(dict(raw))
        from normandy_core.contract.options import validate_options

        return validate_options(self._model, raw, entry=entry, compactor=self.name)

    def needs_window(self, opts: Any) -> bool:
        """The compactor's ``needs_window(opts)``; ``True`` when it does not implement it
        or it fails (a failure is logged)."""
        if not self.has_needs_window:
            return True
        if self._model is not None and not isinstance(opts, self._model):
            try:
                opts = self.parse_options(opts, f"{self.name}.needs_window()")
            except OptionsError:
                return True  # refused where the config is made
        try:
            result = call_plugin(self._pm.hook.needs_window, opts=opts)
        except Exception as exc:
            log.error("needs_window of %s raised %s: %s", self.describe(), type(exc).__name__, exc)
            return True
        return True if result is None else bool(result)

    def compaction_threshold(self, opts: Any, window: int | None, mid_round: bool) -> int | None:
        """The compactor's ``compaction_threshold(opts, window, mid_round)``: the token level
        at or below which it promises the plain skip, or ``None`` (it does not implement
        the hook, returned ``None``, raised, or returned something that is not an ``int``;
        a failure is logged naming the compactor)."""
        caller = self._pm.hook.compaction_threshold
        if not caller.get_hookimpls():
            return None
        kind = "mid-round" if mid_round else "turn-start"
        try:
            level = call_plugin(caller, opts=opts, window=window, mid_round=mid_round)
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, PluginFault) and exc.__cause__ else exc
            log.error(
                "compaction_threshold of %s raised %s: %s; every %s boundary calls its "
                "maybe_compact",
                self.describe(),
                type(cause).__name__,
                cause,
                kind,
            )
            return None
        if level is None:
            return None
        if isinstance(level, bool) or not isinstance(level, int):
            log.error(
                "compaction_threshold of %s returned %r, not an int or None; every %s "
                "boundary calls its maybe_compact",
                self.describe(),
                level,
                kind,
            )
            return None
        return int(level)

    def validate_opts(
        self, opts: Any, entry: str, window: int | None = None, rules: Any = None
    ) -> None:
        """Call the compactor's ``validate_opts`` when it has one (``rules``: the config's
        :class:`~normandy_core.SurvivalRules`, the defaults when ``None``).

        Any refusal surfaces as :class:`~normandy_core.OptionsError` beginning with
        ``entry`` and naming the compactor: an implementation that raises something else
        (``SystemExit`` included), or an ``OptionsError`` that does not begin with
        ``entry``, is wrapped (the original exception is chained), so every bad option
        names the call that made the config.
        """
        if not self.has_validate_opts:
            return
        if rules is None:
            from normandy_core.conversation.survival import DEFAULT_RULES

            rules = DEFAULT_RULES
        try:
            call_plugin(
                self._pm.hook.validate_opts, opts=opts, entry=entry, window=window, rules=rules
            )
        except OptionsError as exc:
            if str(exc).startswith(entry):
                raise
            raise OptionsError(
                f"{entry}: compactor {self.name!r} refused its options: {exc}"
            ) from exc
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, PluginFault) else exc
            raise OptionsError(
                f"{entry}: compactor {self.name!r} refused its options: "
                f"{type(cause).__name__}: {cause}"
            ) from cause


def _new_pm(specs: type) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(specs)
    return pm


def _instantiate(obj: Any, what: str) -> Any:
    """The plugin object: a class is instantiated (without arguments), anything else kept.

    A constructor that raises (anything, ``SystemExit`` included) is a load failure of
    the plugin, named like an import error.
    """
    if not inspect.isclass(obj):
        return obj
    try:
        return call_plugin(obj)
    except Exception as exc:
        cause = exc.__cause__ if isinstance(exc, PluginFault) else exc
        raise PluginLoadError(
            f"{what} could not be instantiated: {type(cause).__name__}: {cause}"
        ) from cause


def _misplaced(pm: pluggy.PluginManager, plugin: Any) -> list[str]:
    """The hooks ``plugin`` implements that ``pm``'s hookspec set does not define."""
    names = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.spec is None:
            names.append(caller.name)
    return names


def _register_checked(
    pm: pluggy.PluginManager, plugin: Any, name: str, what: str, group: str
) -> None:
    """Register with pluggy's signature validation and ``check_pending``.

    A hook the plugin's kind does not define is refused naming the kind that may
    implement it; so is a hook wrapper (each implementation is called on its own).
    """
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(f"{what} has a hook that does not match its hookspec: {exc}") from exc
    except ValueError as exc:
        raise PluginLoadError(f"{what} could not be registered: {exc}") from exc
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        unknown = _misplaced(pm, plugin)
        pm.unregister(plugin)
        parts = []
        for hook in unknown:
            owner = hookspecs.SPEC_SETS.get(hook)
            if owner is None:
                parts.append(f"{hook!r}, which is not a Normandy hook")
            else:
                kind = "compactor" if owner is hookspecs.CompactorSpec else "hook plugin"
                other = COMPACTOR_GROUP if kind == "compactor" else HOOK_GROUP
                parts.append(
                    f"{hook!r}, which only a {kind} implements (entry-point group {other}); "
                    f"as a {_WHO[group]} it would never be called"
                )
        known = ", ".join(n for n, s in hookspecs.SPEC_SETS.items() if _group_of(s) == group)
        raise PluginLoadError(
            f"{what} implements "
            + "; ".join(parts or [str(exc)])
            + f". A {_WHO[group]} may implement: {known}"
        ) from exc
    for caller in pm.get_hookcallers(plugin) or []:
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and (impl.wrapper or impl.hookwrapper):
                pm.unregister(plugin)
                raise PluginLoadError(
                    f"{what} declares {caller.name!r} as a hook wrapper; Normandy calls every "
                    "hook implementation on its own, so declare it without wrapper=True or "
                    "hookwrapper=True"
                )
    unmarked = _unmarked(pm, plugin, group)
    if unmarked:
        pm.unregister(plugin)
        raise PluginLoadError(
            f"{what} has "
            + "; ".join(f"a {name} that {why}" for name, why in unmarked)
            + f": decorate {'it' if len(unmarked) == 1 else 'each'} with "
            "@normandy_core.hookimpl (from normandy_core import hookimpl), or it is never called"
        )


def _unmarked(pm: pluggy.PluginManager, plugin: Any, group: str) -> list[tuple[str, str]]:
    """``(hook, why)`` for each callable of ``plugin`` named like a hook of its kind that
    pluggy did not register: a function left without ``@hookimpl``, or marked with the
    ``hookimpl`` of another project (pytest's, say)."""
    implemented = {caller.name for caller in pm.get_hookcallers(plugin) or []}
    found = []
    for name, specs in hookspecs.SPEC_SETS.items():
        if _group_of(specs) != group or name in implemented:
            continue
        try:
            attr = getattr(plugin, name, None)
        except Exception:  # a property that raises: not a hook function
            continue
        if not callable(attr):
            continue
        ours = f"{hookspecs.PROJECT_NAME}_impl"
        others = sorted(a[: -len("_impl")] for a in dir(attr) if a.endswith("_impl") and a != ours)
        why = (
            f"is marked by the hookimpl of {others[0]!r}, not Normandy's"
            if others
            else "is not marked as a hook"
        )
        found.append((name, why))
    return found


def _group_of(specs: type) -> str:
    return COMPACTOR_GROUP if specs is hookspecs.CompactorSpec else HOOK_GROUP


def _make_compactor(
    name: str, plugin: Any, dist: str, version: str, module: str, what: str
) -> Compactor:
    obj = _instantiate(plugin, what)
    comp = Compactor(name=name, distribution=dist, version=version, plugin=obj, module=module)
    _register_checked(comp._pm, obj, f"{COMPACTOR_GROUP}:{name}", what, COMPACTOR_GROUP)
    impls = comp._pm.hook.maybe_compact.get_hookimpls()
    if len(impls) == 1:
        comp._impl = (impls[0].function, tuple(impls[0].argnames))
    if not impls:
        hint = ""
        if inspect.isroutine(obj):
            hint = (
                f"; it is a function ({getattr(obj, '__name__', '?')}), and a plugin is a "
                "module or class (or instance) holding functions decorated with "
                "@normandy_core.hookimpl: name the module or class instead"
            )
        raise PluginLoadError(f"{what} does not implement the required hook 'maybe_compact'{hint}")
    if comp._pm.hook.options_model.get_hookimpls():
        try:
            model = call_plugin(comp._pm.hook.options_model)
        except Exception as exc:
            raise PluginLoadError(
                f"{what}: options_model raised {type(exc).__name__}: {exc}"
            ) from exc
        from pydantic import BaseModel

        if not (inspect.isclass(model) and issubclass(model, BaseModel)):
            raise PluginLoadError(
                f"{what}: options_model returned {model!r}, not a pydantic model class"
            )
        comp._model = model
    return comp


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _search_path() -> list[str]:
    cwd = os.getcwd()
    return [p for p in sys.path if p and os.path.abspath(p) != cwd]


def _dist_key(dist: md.Distribution) -> str:
    """The distribution's normalized name, without parsing its METADATA where possible.

    ``importlib.metadata`` reads it from the ``.dist-info`` directory's name (the
    ``_normalized_name`` it dedups ``entry_points()`` with, Python 3.10 to 3.13); parsing
    every installed distribution's METADATA cost a first compaction tens of milliseconds.
    """
    name = getattr(dist, "_normalized_name", None)
    if not isinstance(name, str) or not name:
        name = dist.metadata["Name"] or "<unknown>"
    return name.lower().replace("_", "-").replace(".", "-")


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.eps: dict[str, dict[str, list[_EP]]] | None = None
        self.allow: set[str] | None = None
        self.deny: set[str] = set()
        self.resolved: dict[str, Compactor] = {}
        self.failed: dict[str, PluginLoadError] = {}
        self.in_code: dict[str, Compactor] = {}
        self.hook_pm: pluggy.PluginManager | None = None
        self.hook_status: dict[str, tuple[str, str | None]] = {}
        self.command_status: dict[str, tuple[str, str | None]] = {}
        self.hook_described: dict[str, str] = {}
        #: Hook plugins registered in code, by qualified name (kept by :meth:`reset`).
        self.code_hooks: dict[str, Any] = {}
        #: How many times the plugins were reloaded: what was worked out from them before
        #: is stale once it changes.
        self.generation = 0
        #: Per hook: the manager and implementations its callers were made for, and them.
        self.callers: dict[str, tuple[Any, tuple[Any, ...], tuple[HookCaller, ...]]] = {}

    def reset(self) -> None:
        """Forget what was discovered and loaded; keep what was registered in code."""
        kept = self.in_code, self.code_hooks, self.generation + 1
        self.__init__()  # type: ignore[misc]
        self.in_code, self.code_hooks, self.generation = kept

    def hook_callers(self, pm: Any, hook: str, impls: list[Any]) -> tuple[HookCaller, ...]:
        """:func:`hook_callers`, made again only when ``pm`` or ``impls`` changed.

        Making subset callers is most of what an observed boundary would cost, so they
        are kept while the hook plugins stay the same.
        """
        cached = self.callers.get(hook)
        if (
            cached is not None
            and cached[0] is pm
            and len(cached[1]) == len(impls)
            and all(a is b for a, b in zip(cached[1], impls, strict=True))
        ):
            return cached[2]
        made = _make_callers(pm, hook, impls)
        self.callers[hook] = (pm, tuple(impls), made)
        return made

    def scan(self) -> dict[str, dict[str, list[_EP]]]:
        eps = self.eps
        if eps is not None:
            return eps
        with self.lock:
            if self.eps is not None:
                return self.eps
            found: dict[str, dict[str, list[_EP]]] = {g: {} for g in _GROUPS}
            seen: set[str] = set()
            for dist in md.distributions(path=_search_path()):
                key = _dist_key(dist)
                if key in seen:  # the first on sys.path wins, as it does for imports
                    continue
                seen.add(key)
                ours = [ep for ep in dist.entry_points if ep.group in found]
                if not ours:
                    continue
                # METADATA is parsed only for the few distributions that register here.
                dname = dist.metadata["Name"] or "<unknown>"
                version = dist.version or "?"
                for ep in ours:
                    found[ep.group].setdefault(ep.name, []).append(
                        _EP(ep.name, ep.group, ep.value, dname, version)
                    )
            self.allow = _env_list(ENV_LOAD)
            self.deny = _env_list(ENV_DISABLE) or set()
            self.eps = found
            return found

    def excluded(self, name: str, group: str = COMPACTOR_GROUP) -> str | None:
        """Why the entry point ``name`` of ``group`` is excluded by the environment, or None."""
        eps = self.scan()
        qualified = {f"{_SHORT[group]}:{name}", f"{group}:{name}"}
        if name in self.deny or qualified & self.deny:
            return f"disabled by {ENV_DISABLE}"
        if self.allow is None or qualified & self.allow:
            return None
        if name not in self.allow:
            return f"not in {ENV_LOAD}"
        dists = {ep.dist for g in _GROUPS for ep in eps[g].get(name, ())}
        if len(dists) > 1:
            kinds = ", ".join(
                f"{_SHORT[g]}:{name} ({', '.join(ep.dist for ep in eps[g][name])})"
                for g in _GROUPS
                if name in eps[g]
            )
            return (
                f"not loaded: {name!r} in {ENV_LOAD} is ambiguous, it names plugins of "
                f"several distributions ({kinds}); qualify it, for example "
                f"{_SHORT[group]}:{name}"
            )
        return None


class HookCaller(NamedTuple):
    """One implementation of a hook, with a caller through pluggy's call path that calls
    only it, and its :func:`~normandy_core.active_when` gate (``None``: always called)."""

    impl: Any
    call: Any
    gate: Callable[[], object] | None


def _make_callers(pm: Any, hook: str, impls: list[Any]) -> tuple[HookCaller, ...]:
    """A :class:`HookCaller` per implementation, in pluggy's order (the last registered
    first): a subset caller of one plugin each, or the hook's own caller when it has one."""
    if len(impls) == 1:
        calls = [getattr(pm.hook, hook)]
    else:
        impls = impls[::-1]
        plugins = [impl.plugin for impl in impls]
        calls = [
            pm.subset_hook_caller(hook, remove_plugins=[p for p in plugins if p is not impl.plugin])
            for impl in impls
        ]
    return tuple(
        HookCaller(impl, call, getattr(impl.function, hookspecs.ACTIVE_ATTR, None))
        for impl, call in zip(impls, calls, strict=True)
    )


_REG = _Registry()


def reload_plugins() -> None:
    """Forget discovered entry points, loaded plugins and the environment lists.

    The next look-up reads the installed distributions and the environment again. Plugins
    registered in code are kept.
    """
    with _REG.lock:
        _REG.reset()


def registered_in_code() -> tuple[list[str], list[str]]:
    """The compactors (names) and hook plugins (qualified names) registered in code."""
    return sorted(_REG.in_code), sorted(_REG.code_hooks)


def generation() -> int:
    """How many times :func:`reload_plugins` ran: a value to key what is worked out from
    the installed plugins by (it changes when they may have)."""
    return _REG.generation


def hook_callers(hook: str) -> tuple[HookCaller, ...]:
    """``hook``'s implementations in pluggy's call order, each with its own caller."""
    pm = hook_manager()
    return _REG.hook_callers(pm, hook, getattr(pm.hook, hook).get_hookimpls())


def installed_compactor_names() -> list[str]:
    """Names of the compactors that can be selected (installed and allowed, or in code)."""
    eps = _REG.scan()
    names = {n for n in eps[COMPACTOR_GROUP] if _REG.excluded(n) is None}
    return sorted(names | set(_REG.in_code))


def resolve_compactor(name: str) -> Compactor:
    """The compactor registered under ``name``, imported on first use and cached.

    :raises UnknownCompactorError: no such name; the message lists the installed names and
        suggests the closest one.
    :raises PluginDisabledError: the environment's allow- or deny-list excludes it.
    :raises PluginConflictError: two distributions register the name.
    :raises PluginLoadError: the plugin failed to import or its hooks do not match the
        hookspecs; the message names entry point, group, distribution, version and cause,
        and the original exception is chained.
    """
    hit = _REG.resolved.get(name)
    if hit is not None:
        return hit
    reg = _REG
    with reg.lock:
        hit = reg.in_code.get(name)
        if hit is not None:
            return hit
        failed = reg.failed.get(name)
        if failed is not None:
            raise failed
        eps = reg.scan()
        candidates = eps[COMPACTOR_GROUP].get(name)
        if not candidates:
            installed = installed_compactor_names()
            import difflib

            close = difflib.get_close_matches(name, installed, n=1, cutoff=0.5)
            raise UnknownCompactorError(name, installed, close[0] if close else None)
        if len(candidates) > 1:
            raise PluginConflictError(
                f"compactor {name!r} (group {COMPACTOR_GROUP}) is registered by several "
                "distributions: "
                + ", ".join(f"{c.dist} {c.version} ({c.value})" for c in candidates)
                + "; uninstall all but one"
            )
        ep = candidates[0]
        why = reg.excluded(name)
        if why is not None:
            raise PluginDisabledError(f"{ep.describe()} is {why}")
        try:
            comp = _make_compactor(name, ep.load(), ep.dist, ep.version, ep.value, ep.describe())
        except PluginLoadError as err:
            log.error("%s", err)
            reg.failed[name] = err
            raise
        reg.resolved[name] = comp
        return comp


def register_compactor(name: str, plugin: Any, *, replace: bool = False) -> Compactor:
    """Register a compactor in code: a module, class or instance whose hooks carry ``@hookimpl``.

    It is validated like an entry point and then selectable by ``name``. Raises
    ``ValueError`` when the name is taken and ``replace`` is false.
    """
    with _REG.lock:
        if not replace and (name in _REG.in_code or name in _REG.scan()[COMPACTOR_GROUP]):
            raise ValueError(f"compactor name {name!r} is already registered")
        module = getattr(plugin, "__module__", None) or getattr(plugin, "__name__", "?")
        what = f"compactor {name!r} ({_IN_CODE})"
        comp = _make_compactor(name, plugin, _IN_CODE, "-", str(module), what)
        _REG.in_code[name] = comp
        _REG.resolved[name] = comp
        return comp


def unregister_compactor(name: str) -> None:
    """Remove a compactor registered in code."""
    with _REG.lock:
        _REG.in_code.pop(name, None)
        _REG.resolved.pop(name, None)


def hook_manager() -> pluggy.PluginManager:
    """The plugin manager of hook plugins, loading the ``normandy_core.hooks`` entry points once.

    It knows only the hook-plugin hookspecs (:class:`~normandy_core.contract.hookspecs.HookSpec`).
    Each entry point is registered under ``normandy_core.hooks:<name>``; one excluded by
    the environment is blocked under that name (``pm.is_blocked``); one that fails to
    import or to validate is logged, reported by :func:`list_plugins` and skipped. When
    several distributions register one name, each is loaded under
    ``normandy_core.hooks:<name>@<distribution>`` (nothing is skipped silently) and every
    listing reports the conflict as an error.
    """
    pm = _REG.hook_pm
    if pm is not None:
        return pm
    reg = _REG
    with reg.lock:
        if reg.hook_pm is not None:
            return reg.hook_pm
        pm = _new_pm(hookspecs.HookSpec)
        for name, candidates in sorted(reg.scan()[HOOK_GROUP].items()):
            qname = f"{HOOK_GROUP}:{name}"
            why = reg.excluded(name, HOOK_GROUP)
            if why is not None:
                pm.set_blocked(qname)
                reg.hook_status[name] = ("disabled", why)
                continue
            conflict = len(candidates) > 1
            errors: list[str] = []
            for ep in candidates:
                reg_name = f"{qname}@{ep.dist}" if conflict else qname
                try:
                    obj = _instantiate(ep.load(), ep.describe())
                    _register_checked(pm, obj, reg_name, ep.describe(), HOOK_GROUP)
                except PluginLoadError as err:
                    log.error("%s", err)
                    errors.append(str(err))
                    continue
                reg.hook_described[reg_name] = ep.describe()
            if conflict:
                msg = (
                    f"hook plugin {name!r} (group {HOOK_GROUP}) is registered by several "
                    "distributions: "
                    + ", ".join(f"{c.dist} {c.version}" for c in candidates)
                    + "; each is loaded and run, but entry-point names must be unique in the "
                    "group: uninstall or rename all but one"
                )
                log.error("%s", msg)
                reg.hook_status[name] = ("conflict", "; ".join([msg, *errors]))
            elif errors:
                reg.hook_status[name] = ("error", errors[0])
            else:
                reg.hook_status[name] = ("loaded", None)
        for code_name, obj in _REG.code_hooks.items():
            _register_checked(
                pm, obj, code_name, f"hook plugin {code_name!r} ({_IN_CODE})", HOOK_GROUP
            )
        reg.hook_pm = pm
        return pm


def describe_hook(qualified_name: str) -> str:
    """``hook plugin 'x' (group normandy_core.hooks) from normandy-x 1.0`` for a loaded hook.

    A hook plugin registered in code is described as such.
    """
    found = _REG.hook_described.get(qualified_name)
    if found is not None:
        return found
    return f"hook plugin {qualified_name!r} ({_IN_CODE})"


def register_hook(plugin: Any, name: str | None = None) -> str:
    """Register a hook plugin in code: a module, class or instance whose hooks carry ``@hookimpl``.

    Returns the qualified name to pass to :func:`unregister_hook`. Signatures are validated
    now: a mismatch raises :class:`~normandy_core.PluginLoadError`.
    """
    obj = _instantiate(plugin, f"hook plugin {name or getattr(plugin, '__name__', '?')!r}")
    base = name or getattr(obj, "__name__", None) or type(obj).__name__
    qname = f"code:{base}"
    pm = hook_manager()
    with _REG.lock:
        if qname in _REG.code_hooks:
            raise ValueError(f"a hook plugin named {base!r} is already registered in code")
        _register_checked(pm, obj, qname, f"hook plugin {base!r} ({_IN_CODE})", HOOK_GROUP)
        _REG.code_hooks[qname] = obj
    return qname


def unregister_hook(qualified_name: str) -> None:
    """Remove a hook plugin registered with :func:`register_hook`."""
    with _REG.lock:
        _REG.code_hooks.pop(qualified_name, None)
        pm = hook_manager()
        if pm.get_plugin(qualified_name) is not None:
            pm.unregister(name=qualified_name)


def list_plugins(*, load: bool = False) -> list[PluginRow]:
    """One row per entry point of every group (and per in-code plugin), with its status.

    Read from the entry points, not from what loaded, so a broken plugin is listed with its
    error. With ``load=True`` every allowed compactor is resolved first, so each row says
    whether it loads, and every adapter module is imported. Hook plugins are always loaded
    to report their status.
    """
    reg = _REG
    eps = reg.scan()
    if load:
        for name in eps[COMPACTOR_GROUP]:
            with contextlib.suppress(Exception):  # reported in the row below
                resolve_compactor(name)
    hook_manager()
    rows: list[PluginRow] = []
    for name, candidates in sorted(eps[COMPACTOR_GROUP].items()):
        for ep in candidates:
            status, error = "not loaded", None
            if len(candidates) > 1:
                status = "conflict"
                error = "registered by several distributions: " + ", ".join(
                    c.dist for c in candidates
                )
            elif (why := reg.excluded(name)) is not None:
                status, error = "disabled", why
            elif name in reg.resolved and reg.resolved[name].distribution == ep.dist:
                # (a compactor registered in code under this name is not this entry point)
                status = "loaded"
            elif name in reg.failed:
                status, error = "error", str(reg.failed[name])
            rows.append(PluginRow(name, ep.group, ep.value, ep.dist, ep.version, status, error))
    for name, comp in sorted(reg.in_code.items()):
        rows.append(PluginRow(name, COMPACTOR_GROUP, comp.module, _IN_CODE, "-", "loaded"))
    for name, candidates in sorted(eps[HOOK_GROUP].items()):
        status, error = reg.hook_status.get(name, ("not loaded", None))
        for ep in candidates:
            rows.append(PluginRow(name, ep.group, ep.value, ep.dist, ep.version, status, error))
    for qname, obj in sorted(_REG.code_hooks.items()):
        module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "?")
        rows.append(PluginRow(qname, HOOK_GROUP, str(module), _IN_CODE, "-", "loaded"))
    for name, candidates in sorted(eps[COMMAND_GROUP].items()):
        status, error = reg.command_status.get(name, ("not loaded", None))
        if (why := reg.excluded(name, COMMAND_GROUP)) is not None:
            status, error = "disabled", why
        for ep in candidates:
            rows.append(PluginRow(name, ep.group, ep.value, ep.dist, ep.version, status, error))
    for name, candidates in sorted(eps[ADAPTER_GROUP].items()):
        for ep in candidates:
            status, error = "not loaded", None
            if (why := reg.excluded(name, ADAPTER_GROUP)) is not None:
                status, error = "disabled", why  # listed as such; the framework imports it
            elif load:  # an adapter is a module its framework imports: say whether it does
                try:
                    ep.load()
                    status = "loaded"
                except PluginLoadError as err:
                    status, error = "error", str(err)
            rows.append(PluginRow(name, ep.group, ep.value, ep.dist, ep.version, status, error))
    return rows


def command_registrars() -> list[tuple[str, Any]]:
    """The command-line extensions: ``(name, register)`` per allowed ``normandy_core.commands``
    entry point, ``register`` being the loaded callable or the :class:`PluginLoadError`
    that stopped it (so the command line can report it and go on).
    """
    reg = _REG
    out: list[tuple[str, Any]] = []
    for name, candidates in sorted(reg.scan()[COMMAND_GROUP].items()):
        if reg.excluded(name, COMMAND_GROUP) is not None:
            continue
        ep = candidates[0]
        try:
            register = ep.load()
        except PluginLoadError as err:
            reg.command_status[name] = ("error", str(err))
            out.append((name, err))
            continue
        if not callable(register):
            refused = PluginLoadError(f"{ep.describe()} is not callable (register(subparsers))")
            reg.command_status[name] = ("error", str(refused))
            out.append((name, refused))
            continue
        reg.command_status[name] = ("loaded", None)
        out.append((name, register))
    return out


def mark_command_failed(name: str, error: str) -> None:
    """Record that command extension ``name`` failed while registering (for listings)."""
    _REG.command_status[name] = ("error", error)
