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
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import pluggy

from normandy_core.contract import hookspecs
from normandy_core.contract.compactor import Compactor
from normandy_core.contract.faults import PluginFault, call_plugin
from normandy_core.contract.registration import (
    COMPACTOR_GROUP,
    HOOK_GROUP,
    instantiate,
    new_manager,
    register_checked,
)
from normandy_core.errors import (
    PluginConflictError,
    PluginDisabledError,
    PluginLoadError,
    UnknownCompactorError,
    closest_name,
)

__all__ = [
    "ADAPTER_GROUP",
    "COMMAND_GROUP",
    "ENV_DISABLE",
    "ENV_LOAD",
    "SETTINGS_GROUP",
    "HookCaller",
    "PluginRow",
    "command_registrars",
    "describe_hook",
    "generation",
    "hook_callers",
    "hook_manager",
    "list_plugins",
    "register_compactor",
    "register_hook",
    "registered_in_code",
    "reload_plugins",
    "resolve_compactor",
    "settings_section_entries",
    "unregister_compactor",
    "unregister_hook",
]

log = logging.getLogger("normandy_core.plugins")

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

#: Entry-point group of settings sections: ``name = "module:SECTION"``, the
#: :class:`~normandy_core.contract.settings.SettingsSection` a plugin reads from the
#: ``[name]`` table of ``normandy.toml`` (``[tool.normandy.name]``). Not a plugin to load
#: or disable: it tells the settings reader which tables exist.
SETTINGS_GROUP = "normandy_core.settings"

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
        kind = {
            HOOK_GROUP: "hook plugin",
            COMMAND_GROUP: "command",
            ADAPTER_GROUP: "adapter",
            SETTINGS_GROUP: "settings section",
        }.get(self.group, "compactor")
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
            found: dict[str, dict[str, list[_EP]]] = {g: {} for g in (*_GROUPS, SETTINGS_GROUP)}
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
            close = closest_name(name, installed, cutoff=0.5)
            raise UnknownCompactorError(name, installed, close)
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
            comp = Compactor.load(name, ep.load(), ep.dist, ep.version, ep.value, ep.describe())
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
        comp = Compactor.load(name, plugin, _IN_CODE, "-", str(module), what)
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
        pm = new_manager(hookspecs.HookSpec)
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
                    obj = instantiate(ep.load(), ep.describe())
                    register_checked(pm, obj, reg_name, ep.describe(), HOOK_GROUP)
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
            register_checked(
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
    obj = instantiate(plugin, f"hook plugin {name or getattr(plugin, '__name__', '?')!r}")
    base = name or getattr(obj, "__name__", None) or type(obj).__name__
    qname = f"code:{base}"
    pm = hook_manager()
    with _REG.lock:
        if qname in _REG.code_hooks:
            raise ValueError(f"a hook plugin named {base!r} is already registered in code")
        register_checked(pm, obj, qname, f"hook plugin {base!r} ({_IN_CODE})", HOOK_GROUP)
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


def settings_section_entries() -> dict[str, Callable[[], Any]]:
    """The settings sections the installed distributions declare (group
    :data:`SETTINGS_GROUP`), by name, each with the loader of its declaration (which
    raises :class:`PluginLoadError` naming the entry point). Read from the entry points
    once, with the other groups; nothing is imported until a loader is called."""
    return {name: found[0].load for name, found in sorted(_REG.scan()[SETTINGS_GROUP].items())}
