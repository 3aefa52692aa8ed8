"""Error messages say what the caller can do, in the caller's vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from normandy_core import (
    AgentConfig,
    OptionsError,
    PluginLoadError,
    WindowUnknownError,
    compact,
    register_compactor,
)

CHAT = [{"role": "user", "content": "Hello."}]


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [({}, "no model"), ({"model": "mystery-9000"}, "'mystery-9000'")],
)
def test_window_unknown_from_compact_names_what_compact_accepts(
    kwargs: dict[str, str], why: str
) -> None:
    with pytest.raises(WindowUnknownError) as info:
        compact(CHAT, fresh=True, **kwargs)
    msg = str(info.value)
    assert msg.startswith("normandy_core.compact(): ") and why in msg
    assert "window=" in msg and "model" in msg
    # compact() takes neither of these
    assert "compactor_opts" not in msg and "StaticCatalog" not in msg


def test_window_unknown_from_agent_config_keeps_its_own_hints() -> None:
    with pytest.raises(WindowUnknownError) as info:
        AgentConfig(model="mystery-9000", compactor="window_manager")
    msg = str(info.value)
    assert "compactor_opts={'context_window'" in msg and "StaticCatalog(" in msg


def test_a_cross_field_option_error_names_the_options() -> None:
    with pytest.raises(OptionsError) as info:
        compact(CHAT, window=9000, opts={"target": 0.9, "trigger": 0.5}, fresh=True)
    msg = str(info.value)
    assert "(options)" not in msg and "Value error" not in msg
    assert "options 'target' and 'trigger': target (0.9) must not exceed trigger (0.5)" in msg
    with pytest.raises(OptionsError) as info:
        AgentConfig(
            compactor="window_manager",
            compactor_opts={"context_window": 9000, "keep_last_turns": 2},
        )
    msg = str(info.value)
    assert "options 'keep_last_turns' and 'strategy': keep_last_turns applies only" in msg


def test_a_field_validator_error_has_no_pydantic_prefix() -> None:
    with pytest.raises(OptionsError) as info:
        AgentConfig(compactor="clear_tool_results", compactor_opts={"exclude_tools": "bash"})
    msg = str(info.value)
    assert "option 'exclude_tools': exclude_tools must be a list of tool names" in msg
    assert "Value error" not in msg


def test_maybe_compact_without_hookimpl_names_the_decorator() -> None:
    module = types.ModuleType("undecorated_compactor")
    exec(
        "def maybe_compact(acc, ctx, opts):\n    return acc, {'compacted': False}\n",
        module.__dict__,
    )
    for plugin in (module, type("Plain", (), {"maybe_compact": lambda self, a, c, o: None})()):
        with pytest.raises(PluginLoadError, match=r"@normandy_core\.hookimpl"):
            register_compactor("undecorated_hint", plugin)

    def maybe_compact(acc, ctx, opts):  # a function given where a plugin object goes
        return acc, {"compacted": False}

    with pytest.raises(PluginLoadError) as info:
        register_compactor("function_hint", maybe_compact)
    msg = str(info.value)
    assert "@normandy_core.hookimpl" in msg and "module or class" in msg


def test_maybe_compact_marked_by_another_project_names_ours() -> None:
    import pluggy

    other = pluggy.HookimplMarker("pytest")

    class Other:
        @other
        def maybe_compact(self, acc, ctx, opts):
            return acc, {"compacted": False}

    with pytest.raises(PluginLoadError) as info:
        register_compactor("other_marker_hint", Other())
    msg = str(info.value)
    assert "marked by the hookimpl of 'pytest'" in msg and "normandy_core.hookimpl" in msg


def test_a_hook_plugin_without_hookimpl_names_the_decorator() -> None:
    from normandy_core import register_hook

    class Recorder:
        def after_compact(self, acc, ctx, meta):
            return None

    with pytest.raises(PluginLoadError, match=r"after_compact.*@normandy_core\.hookimpl"):
        register_hook(Recorder(), name="undecorated-hook-hint")


@pytest.mark.slow
def test_the_testing_kit_without_hypothesis_says_what_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["hypothesis"] = None  # as if it were not installed
        try:
            import normandy_core.testing
        except ImportError as exc:
            print(type(exc).__name__, exc)
        else:
            print("imported")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "pip install 'normandy-core[testing]'" in out, out
    assert "hypothesis" in out


@pytest.mark.slow
def test_the_testing_strategies_without_hypothesis_say_what_to_install() -> None:
    code = (
        "import sys\nsys.modules['hypothesis'] = None\n"
        "try:\n    import normandy_core.testing.strategies\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "pip install 'normandy-core[testing]'" in out, out


def test_an_unknown_option_in_code_suggests_the_option_meant() -> None:
    """``opts={"stratgy": ...}``: the suggestion compactor names and settings keys get."""
    with pytest.raises(OptionsError) as info:
        AgentConfig(
            model="gpt-4o",
            compactor="window_manager",
            compactor_opts={"stratgy": "summarize", "context_window": 8_000},
        )
    line = "  option 'stratgy': unknown option; did you mean 'strategy'? allowed options: "
    assert line in str(info.value), info.value
    # nothing close: no suggestion, the allowed options still listed
    with pytest.raises(OptionsError, match=r"option 'zzz': unknown option; allowed options: "):
        AgentConfig(compactor="window_manager", compactor_opts={"zzz": 1, "context_window": 8_000})


def test_an_unknown_opt_on_the_command_line_suggests_the_option_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from normandy_core.app.cli import EXIT_INPUT, main

    src = tmp_path / "in.json"
    src.write_text(json.dumps(CHAT))
    status = main(["compact", str(src), "--window", "9000", "--opt", "stratgy=summarize"])
    err = capsys.readouterr().err
    assert status == EXIT_INPUT, err
    assert "option 'stratgy': unknown option; did you mean 'strategy'?" in err, err
    assert not (tmp_path / "in.compacted.json").exists()
