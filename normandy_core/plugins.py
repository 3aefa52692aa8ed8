"""Finding, loading and isolating plugins: compactors by entry-point name, hook plugins.

Entry points are read with :mod:`importlib.metadata` once per process and cached
(:func:`reload_plugins` forgets them). A compactor is imported only when something
resolves its name, so a broken one that nobody selected cannot stop start-up. Hook
plugins are loaded together the first time a hook is needed; one that fails is logged,
named and skipped, and the others still load.

``NORMANDY_LOAD_PLUGINS`` (comma-separated entry-point names; set but empty means none)
is an allow-list and ``NORMANDY_DISABLE_PLUGINS`` a deny-list. Both apply to entry points
of both groups; plugins registered in code are the application's own choice and are not
filtered. Entry points are never discovered from the current directory implicitly.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata as md
import inspect
import logging
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from normandy_core import hookspecs
from normandy_core.errors import (
    OptionsError,
    PluginConflictError,
    PluginDisabledError,
    PluginLoadError,
    UnknownCompactorError,
)

if TYPE_CHECKING:
    from normandy_core.boundary import CompactionContext
    from normandy_core.config import AgentConfig

__all__ = [
    "COMMAND_GROUP",
    "COMPACTOR_GROUP",
    "ENV_DISABLE",
    "ENV_LOAD",
    "HOOK_GROUP",
    "Compactor",
    "PluginRow",
    "command_registrars",
    "describe_hook",
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
#: Allow-list of entry-point names (comma-separated; set but empty: none).
ENV_LOAD = "NORMANDY_LOAD_PLUGINS"
#: Deny-list of entry-point names (comma-separated).
ENV_DISABLE = "NORMANDY_DISABLE_PLUGINS"

#: Entry-point group of command-line extensions: ``name = "module:register"``, where
#: ``register(subparsers)`` adds ``normandy <name> ...`` subcommands.
COMMAND_GROUP = "normandy_core.commands"

_GROUPS = (COMPACTOR_GROUP, HOOK_GROUP, COMMAND_GROUP)
_KINDS = {COMPACTOR_GROUP: "compactor", HOOK_GROUP: "hook", COMMAND_GROUP: "command"}
_IN_CODE = "<registered in code>"


@dataclass(frozen=True)
class _EP:
    name: str
    group: str
    value: str
    dist: str
    version: str

    def load(self) -> Any:
        """Import the entry point's object; any failure is a :class:`PluginLoadError`
        naming the entry point, group, distribution and version, the cause chained."""
        try:
            return md.EntryPoint(self.name, self.value, self.group).load()
        except Exception as exc:
            raise PluginLoadError(
                f"{self.describe()} failed to import: {type(exc).__name__}: {exc}"
            ) from exc

    def describe(self) -> str:
        kind = {HOOK_GROUP: "hook plugin", COMMAND_GROUP: "command"}.get(self.group, "compactor")
        return f"{kind} {self.name!r} (group {self.group}) from {self.dist} {self.version}"


@dataclass(frozen=True)
class PluginRow:
    """One entry point (or in-code plugin) as :func:`list_plugins` reports it.

    ``status`` is ``"loaded"``, ``"not loaded"`` (a compactor nobody resolved yet),
    ``"disabled"`` (excluded by the environment), ``"conflict"`` (another distribution
    registers the same name) or ``"error"`` (``error`` says why).
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
        """``"compactor"``, ``"hook"`` or ``"command"``."""
        return _KINDS.get(self.group, "hook")

    def as_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (with ``kind``)."""
        return {**asdict(self), "kind": self.kind}


@dataclass
class Compactor:
    """A resolved compactor: its name, where it comes from, and a typed facade to its hooks.

    The plugin is registered in a plugin manager of its own, so ``maybe_compact`` is
    called on the selected compactor only, with pluggy's calling conventions.
    """

    name: str
    distribution: str
    version: str
    plugin: Any
    module: str
    group: str = COMPACTOR_GROUP
    _pm: pluggy.PluginManager = field(repr=False, default_factory=lambda: _new_pm())

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

    def maybe_compact(self, acc: AgentConfig, ctx: CompactionContext, opts: dict[str, Any]) -> Any:
        """Call the compactor's ``maybe_compact``; the result is checked by the boundary."""
        return self._pm.hook.maybe_compact(acc=acc, ctx=ctx, opts=opts)

    def needs_window(self, opts: dict[str, Any]) -> bool:
        """The compactor's ``needs_window(opts)``; ``True`` when it does not implement it."""
        if not self.has_needs_window:
            return True
        result = self._pm.hook.needs_window(opts=opts)
        return True if result is None else bool(result)

    def validate_opts(self, opts: dict[str, Any], entry: str) -> None:
        """Call the compactor's ``validate_opts(opts, entry)`` when it has one.

        Any refusal surfaces as :class:`~normandy_core.OptionsError` beginning with
        ``entry`` and naming the compactor: an implementation that raises something else,
        or an ``OptionsError`` that does not begin with ``entry``, is wrapped (the original
        exception is chained), so every bad option names the call that made the config.
        """
        if not self.has_validate_opts:
            return
        try:
            self._pm.hook.validate_opts(opts=opts, entry=entry)
        except OptionsError as exc:
            if str(exc).startswith(entry):
                raise
            raise OptionsError(
                f"{entry}: compactor {self.name!r} refused its options: {exc}"
            ) from exc
        except Exception as exc:
            raise OptionsError(
                f"{entry}: compactor {self.name!r} refused its options: {type(exc).__name__}: {exc}"
            ) from exc


def _new_pm() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def _instantiate(obj: Any, what: str) -> Any:
    """The plugin object: a class is instantiated (without arguments), anything else kept.

    A constructor that raises is a load failure of the plugin, named like an import error.
    """
    if not inspect.isclass(obj):
        return obj
    try:
        return obj()
    except Exception as exc:
        raise PluginLoadError(
            f"{what} could not be instantiated: {type(exc).__name__}: {exc}"
        ) from exc


def _register_checked(pm: pluggy.PluginManager, plugin: Any, name: str, what: str) -> None:
    """Register with pluggy's signature validation, refusing unknown hooks too."""
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(f"{what} has a hook that does not match its hookspec: {exc}") from exc
    except ValueError as exc:
        raise PluginLoadError(f"{what} could not be registered: {exc}") from exc
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.spec is None:
            pm.unregister(plugin)
            raise PluginLoadError(
                f"{what} implements {caller.name!r}, which is not a Normandy hook "
                "(known: maybe_compact, needs_window, validate_opts, after_compact)"
            )
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and (impl.wrapper or impl.hookwrapper):
                # Each implementation is called on its own (hooks are isolated from each
                # other), so a wrapper would be a generator that silently never runs.
                pm.unregister(plugin)
                raise PluginLoadError(
                    f"{what} declares {caller.name!r} as a hook wrapper; Normandy calls every "
                    "hook implementation on its own, so declare it without wrapper=True or "
                    "hookwrapper=True"
                )


def _make_compactor(
    name: str, plugin: Any, dist: str, version: str, module: str, what: str
) -> Compactor:
    obj = _instantiate(plugin, what)
    comp = Compactor(name=name, distribution=dist, version=version, plugin=obj, module=module)
    _register_checked(comp._pm, obj, f"{COMPACTOR_GROUP}:{name}", what)
    if not comp._pm.hook.maybe_compact.get_hookimpls():
        raise PluginLoadError(f"{what} does not implement the required hook 'maybe_compact'")
    for impl in comp._pm.hook.validate_opts.get_hookimpls():
        if "entry" not in impl.argnames:
            raise PluginLoadError(
                f"{what} implements validate_opts without the 'entry' argument; it is refused "
                "because its errors could not name the public entry point that made the bad "
                "config. Declare it as validate_opts(opts, entry) and pass entry to "
                "normandy_core.validate_options()."
            )
    return comp


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _search_path() -> list[str]:
    cwd = os.getcwd()
    return [p for p in sys.path if p and os.path.abspath(p) != cwd]


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
                dname = dist.metadata["Name"] or "<unknown>"
                key = dname.lower().replace("_", "-").replace(".", "-")
                if key in seen:  # the first on sys.path wins, as it does for imports
                    continue
                seen.add(key)
                for ep in dist.entry_points:
                    if ep.group in found:
                        found[ep.group].setdefault(ep.name, []).append(
                            _EP(ep.name, ep.group, ep.value, dname, dist.version or "?")
                        )
            self.allow = _env_list(ENV_LOAD)
            self.deny = _env_list(ENV_DISABLE) or set()
            self.eps = found
            return found

    def excluded(self, name: str) -> str | None:
        self.scan()
        if name in self.deny:
            return f"disabled by {ENV_DISABLE}"
        if self.allow is not None and name not in self.allow:
            return f"not in {ENV_LOAD}"
        return None


_REG = _Registry()


def reload_plugins() -> None:
    """Forget discovered entry points, loaded plugins and the environment lists.

    The next look-up reads the installed distributions and the environment again. Plugins
    registered in code are kept.
    """
    global _REG
    in_code = _REG.in_code
    code_hooks = _code_hooks.copy()
    _REG = _Registry()
    _REG.in_code = in_code
    _code_hooks.clear()
    _code_hooks.update(code_hooks)


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
    """Register a compactor in code (a module, a class or an instance with ``@hookimpl``\\ s).

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


_code_hooks: dict[str, Any] = {}


def hook_manager() -> pluggy.PluginManager:
    """The plugin manager of hook plugins, loading the ``normandy_core.hooks`` entry points once.

    Each is registered under ``normandy_core.hooks:<name>``; one that fails to import or
    to validate is logged, reported by :func:`list_plugins` and skipped.
    """
    pm = _REG.hook_pm
    if pm is not None:
        return pm
    reg = _REG
    with reg.lock:
        if reg.hook_pm is not None:
            return reg.hook_pm
        pm = _new_pm()
        for name, candidates in sorted(reg.scan()[HOOK_GROUP].items()):
            if len(candidates) > 1:
                msg = "registered by several distributions: " + ", ".join(
                    c.dist for c in candidates
                )
                reg.hook_status[name] = ("conflict", msg)
                log.error("hook plugin %r (group %s) %s", name, HOOK_GROUP, msg)
                continue
            ep = candidates[0]
            why = reg.excluded(name)
            if why is not None:
                reg.hook_status[name] = ("disabled", why)
                continue
            try:
                obj = _instantiate(ep.load(), ep.describe())
                _register_checked(pm, obj, f"{HOOK_GROUP}:{name}", ep.describe())
            except PluginLoadError as err:
                log.error("%s", err)
                reg.hook_status[name] = ("error", str(err))
                continue
            reg.hook_status[name] = ("loaded", None)
            reg.hook_described[f"{HOOK_GROUP}:{name}"] = ep.describe()
        for qname, obj in _code_hooks.items():
            _register_checked(pm, obj, qname, f"hook plugin {qname!r} ({_IN_CODE})")
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
    """Register a hook plugin in code (module, class or instance with ``@hookimpl``\\ s).

    Returns the qualified name to pass to :func:`unregister_hook`. Signatures are validated
    now: a mismatch raises :class:`~normandy_core.PluginLoadError`.
    """
    obj = _instantiate(plugin, f"hook plugin {name or getattr(plugin, '__name__', '?')!r}")
    base = name or getattr(obj, "__name__", None) or type(obj).__name__
    qname = f"code:{base}"
    pm = hook_manager()
    with _REG.lock:
        if qname in _code_hooks:
            raise ValueError(f"a hook plugin named {base!r} is already registered in code")
        _register_checked(pm, obj, qname, f"hook plugin {base!r} ({_IN_CODE})")
        _code_hooks[qname] = obj
    return qname


def unregister_hook(qualified_name: str) -> None:
    """Remove a hook plugin registered with :func:`register_hook`."""
    with _REG.lock:
        _code_hooks.pop(qualified_name, None)
        pm = hook_manager()
        if pm.get_plugin(qualified_name) is not None:
            pm.unregister(name=qualified_name)


def list_plugins(*, load: bool = False) -> list[PluginRow]:
    """One row per entry point of both groups (and per in-code plugin), with its status.

    Read from the entry points, not from what loaded, so a broken plugin is listed with its
    error. With ``load=True`` every allowed compactor is resolved first, so each row says
    whether it loads. Hook plugins are always loaded to report their status.
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
    for qname, obj in sorted(_code_hooks.items()):
        module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "?")
        rows.append(PluginRow(qname, HOOK_GROUP, str(module), _IN_CODE, "-", "loaded"))
    for name, candidates in sorted(eps[COMMAND_GROUP].items()):
        status, error = reg.command_status.get(name, ("not loaded", None))
        if (why := reg.excluded(name)) is not None:
            status, error = "disabled", why
        for ep in candidates:
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
        if reg.excluded(name) is not None:
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
