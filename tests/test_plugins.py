"""The plugin registry in process: the installed noop, compactors and hooks registered in code."""

from __future__ import annotations

import types
from typing import Any

import pytest

from normandy_core import (
    COMPACTOR_GROUP,
    HOOK_GROUP,
    AgentConfig,
    OptionsError,
    PluginLoadError,
    UnknownCompactorError,
    hook_manager,
    hookimpl,
    list_plugins,
    register_compactor,
    register_hook,
    resolve_compactor,
    run_compaction,
    unregister_compactor,
)


def test_noop_is_installed_for_real_and_changes_nothing():
    handle = resolve_compactor("noop")
    assert (handle.name, handle.distribution, handle.module) == (
        "noop",
        "normandy-core",
        "normandy_core.contract.noop",
    )
    assert handle.version  # read from the installed distribution's metadata
    assert handle.needs_window({}) is False
    acc = AgentConfig()
    assert acc.compactor == "noop"
    acc.memory.add_message("user", "hello")
    out, meta = run_compaction(acc, mid_round=False)
    assert out is acc
    assert meta == {"compacted": False}


def test_resolve_is_cached():
    assert resolve_compactor("noop") is resolve_compactor("noop")


def test_registration_names_are_qualified_by_group():
    comp = resolve_compactor("noop")
    assert comp._pm.get_name(comp.plugin) == f"{COMPACTOR_GROUP}:noop"

    class Hook:
        @hookimpl
        def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
            pass

    qname = register_hook(Hook(), name="noop")  # the same short name in the other group
    assert qname == "code:noop"
    names = [n for n, _ in hook_manager().list_name_plugin()]
    assert "code:noop" in names
    for name in names:
        assert name.startswith((f"{HOOK_GROUP}:", "code:"))


def test_a_module_with_both_kinds_of_hook_is_refused_naming_the_misplaced_one():
    """Compactors and hook plugins register against their own hookspec sets, so a hook
    of the other kind (which would never run there) is refused at load."""
    mod = types.ModuleType("dual_plugin")

    @hookimpl
    def maybe_compact(acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
        return acc, {"compacted": False}

    @hookimpl
    def after_compact(acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        pass

    mod.maybe_compact = maybe_compact  # type: ignore[attr-defined]
    mod.after_compact = after_compact  # type: ignore[attr-defined]
    with pytest.raises(PluginLoadError, match="'after_compact', which only a hook plugin"):
        register_compactor("dual", mod)
    with pytest.raises(PluginLoadError, match="'maybe_compact', which only a compactor"):
        register_hook(mod, name="dual")


def test_register_compactor_in_code_validates_like_an_entry_point():
    class NoCompact:
        @hookimpl
        def needs_window(self, opts: dict[str, Any]) -> bool:
            return False

    with pytest.raises(
        PluginLoadError, match="does not implement the required hook 'maybe_compact'"
    ):
        register_compactor("nc", NoCompact())

    class Typo:
        @hookimpl
        def maybe_compat(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return acc, {"compacted": False}

    with pytest.raises(PluginLoadError, match="'maybe_compat', which is not a Normandy hook"):
        register_compactor("typo", Typo())

    class ExtraArg:
        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any], budget: int) -> Any:
            return acc, {"compacted": False}

    with pytest.raises(PluginLoadError, match="does not match its hookspec") as info:
        register_compactor("extra", ExtraArg())
    assert "compactor 'extra'" in str(info.value)
    assert "budget" in str(info.value)

    class NoEntry:
        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return acc, {"compacted": False}

        @hookimpl
        def needs_window(self, opts: Any) -> bool:
            return False

        @hookimpl
        def validate_opts(self, opts: Any) -> None:
            if opts:
                raise ValueError("no options, please")

    # pluggy's convention: an implementation may take fewer arguments than its spec; the
    # core prefixes the entry point to the refusal itself.
    register_compactor("ne", NoEntry())
    with pytest.raises(OptionsError, match=r"^normandy_core.AgentConfig\(\): compactor 'ne'"):
        AgentConfig(compactor="ne", compactor_opts={"x": 1})

    class Undecorated:
        def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
            return acc, {"compacted": False}

    with pytest.raises(PluginLoadError, match=r"decorate it with @normandy_core.hookimpl"):
        register_compactor("undecorated", Undecorated())
    for name in ("nc", "typo", "extra", "undecorated"):
        with pytest.raises(UnknownCompactorError):
            resolve_compactor(name)


def test_register_compactor_refuses_a_taken_name_unless_replacing():
    class Skip:
        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return acc, {"compacted": False}

    with pytest.raises(ValueError, match="'noop' is already registered"):
        register_compactor("noop", Skip())
    register_compactor("mine", Skip)  # a class is instantiated
    with pytest.raises(ValueError, match="'mine' is already registered"):
        register_compactor("mine", Skip())
    replacement = Skip()
    register_compactor("mine", replacement, replace=True)
    assert resolve_compactor("mine").plugin is replacement
    unregister_compactor("mine")
    with pytest.raises(UnknownCompactorError):
        resolve_compactor("mine")


def test_in_code_compactors_are_listed():
    class Skip:
        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return acc, {"compacted": False}

    register_compactor("listed", Skip())
    rows = {(r.kind, r.name): r for r in list_plugins()}
    assert rows[("compactor", "listed")].status == "loaded"
    assert rows[("compactor", "listed")].distribution == "<registered in code>"
    assert rows[("compactor", "noop")].distribution == "normandy-core"
    assert rows[("compactor", "window_manager")].status == "not loaded"


def test_unknown_name_in_process_lists_installed_and_suggests():
    with pytest.raises(UnknownCompactorError) as info:
        AgentConfig(compactor="window_manger")
    err = info.value
    assert isinstance(err, LookupError)
    assert err.suggestion == "window_manager"
    assert {"noop", "window_manager"} <= set(err.installed)
    assert "did you mean 'window_manager'?" in str(err)


def test_unknown_name_without_a_close_match_reads_well():
    with pytest.raises(UnknownCompactorError) as info:
        resolve_compactor("zzzzzzzz")
    msg = str(info.value)
    assert info.value.suggestion is None
    assert msg.startswith("unknown compactor 'zzzzzzzz'. Installed compactors: ")
    assert "'noop'" in msg


def test_environment_lists_are_read_again_after_reload(monkeypatch):
    from normandy_core import PluginDisabledError, reload_plugins

    monkeypatch.setenv("NORMANDY_DISABLE_PLUGINS", "noop")
    reload_plugins()
    with pytest.raises(PluginDisabledError, match="disabled by NORMANDY_DISABLE_PLUGINS"):
        resolve_compactor("noop")
    monkeypatch.setenv("NORMANDY_DISABLE_PLUGINS", "")
    reload_plugins()
    assert resolve_compactor("noop").name == "noop"


def test_a_class_whose_constructor_raises_is_a_named_load_error():
    class Needy:
        def __init__(self) -> None:
            raise RuntimeError("no credentials")

        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return acc, {"compacted": False}

        @hookimpl
        def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
            pass

    with pytest.raises(PluginLoadError, match="could not be instantiated: RuntimeError"):
        register_compactor("needy", Needy)
    with pytest.raises(PluginLoadError, match="could not be instantiated: RuntimeError"):
        register_hook(Needy, name="needy")


@pytest.mark.parametrize("kind", ["wrapper", "hookwrapper"])
def test_hook_wrappers_are_refused_rather_than_silently_never_run(kind):
    class Wrapping:
        @hookimpl(**{kind: True})
        def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> Any:
            yield

    with pytest.raises(PluginLoadError, match="declares 'after_compact' as a hook wrapper"):
        register_hook(Wrapping(), name="wrapping")
    assert "code:wrapping" not in [n for n, _ in hook_manager().list_name_plugin()]

    class WrappedCompactor:
        @hookimpl(**{kind: True})
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return (yield)

    with pytest.raises(PluginLoadError, match="declares 'maybe_compact' as a hook wrapper"):
        register_compactor("wrapped", WrappedCompactor())


def test_an_entry_point_replaced_in_code_is_not_listed_as_loaded():
    class Skip:
        @hookimpl
        def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
            return acc, {"compacted": False}

    replacement = Skip()
    register_compactor("noop", replacement, replace=True)
    assert resolve_compactor("noop").plugin is replacement
    rows = {r.distribution: r.status for r in list_plugins() if r.name == "noop"}
    assert rows == {"normandy-core": "not loaded", "<registered in code>": "loaded"}
    unregister_compactor("noop")
    assert resolve_compactor("noop").distribution == "normandy-core"
    rows = {r.distribution: r.status for r in list_plugins() if r.name == "noop"}
    assert rows == {"normandy-core": "loaded"}
