"""Registering a plugin: its hooks checked against the hookspecs of its kind.

A compactor and a hook plugin each implement their own set of hooks
(:class:`~normandy_core.contract.hookspecs.CompactorSpec`,
:class:`~normandy_core.contract.hookspecs.HookSpec`); pluggy checks the signatures, and
here a hook of the other kind, a hook wrapper or a function named like a hook but left
unmarked is refused when the plugin is registered, naming the plugin and the hook.
"""

from __future__ import annotations

import inspect
from typing import Any

import pluggy

from normandy_core.contract import hookspecs
from normandy_core.contract.faults import PluginFault, call_plugin
from normandy_core.errors import PluginLoadError

__all__ = ["COMPACTOR_GROUP", "HOOK_GROUP", "instantiate", "new_manager", "register_checked"]

#: Entry-point group of compactors; the entry-point name is the name users configure.
COMPACTOR_GROUP = "normandy_core.compactors"
#: Entry-point group of hook plugins, all loaded automatically.
HOOK_GROUP = "normandy_core.hooks"
#: Which kind of plugin implements each hook, for the refusal of a misplaced one.
_WHO = {COMPACTOR_GROUP: "compactor", HOOK_GROUP: "hook plugin"}


def new_manager(specs: type) -> pluggy.PluginManager:
    """A plugin manager that knows the hooks of ``specs`` (one kind of plugin)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(specs)
    return pm


def instantiate(obj: Any, what: str) -> Any:
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


def register_checked(
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
