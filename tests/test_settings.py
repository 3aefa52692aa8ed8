"""Configuration without code: NORMANDY_COMPACTOR(_OPTS), normandy.toml, [tool.normandy].

Every test runs in a temporary working directory with ``NORMANDY_CONFIG`` unset (the
root conftest sets it to ``off`` for the rest of the suite), against the real installed
compactors.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import AgentConfig, compact, hookimpl
from normandy_core.app.workload import generate_session
from normandy_core.contract.settings import (
    ENV_COMPACTOR,
    ENV_CONFIG,
    ENV_OPTS,
    Settings,
    current_settings,
    read_settings_file,
    reload_settings,
)
from normandy_core.errors import (
    OptionsError,
    PluginDisabledError,
    SettingsError,
    UnknownCompactorError,
    WindowUnknownError,
)
from normandy_core.transcripts import continuation
from normandy_core.transcripts.chat import to_openai


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary working directory, nothing configured, settings read afresh."""
    for var in (ENV_CONFIG, ENV_COMPACTOR, ENV_OPTS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    reload_settings()
    yield tmp_path
    reload_settings()
    continuation.clear()


@pytest.fixture(scope="module")
def messages() -> list[dict[str, Any]]:
    """An OpenAI transcript of about 100k tokens: it needs compacting at a 32k window."""
    return to_openai(generate_session(3, messages=120))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


# -- nothing configured -------------------------------------------------------------------


def test_nothing_configured_keeps_the_defaults(here: Path, messages: Any) -> None:
    assert current_settings().layers == ()
    result = compact(messages, window=32_000)
    assert "compactor 'window_manager'" in str(result.compactor)
    assert result.compacted and result.tokens_after <= 32_000
    agent = AgentConfig.from_env(system_prompt="be brief")
    assert agent.compactor == "noop" and agent.compactor_opts == {}
    assert agent.system_prompt == "be brief"


# -- the environment -----------------------------------------------------------------------


def test_environment_chooses_compactor_and_options(
    here: Path, messages: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_COMPACTOR, "noop")
    result = compact(messages, window=32_000)
    assert not result.compacted and "compactor 'noop'" in str(result.compactor)

    monkeypatch.setenv(ENV_COMPACTOR, "window_manager")
    monkeypatch.setenv(ENV_OPTS, '{"strategy": "sliding_window", "keep_last_turns": 1}')
    result = compact(messages, window=32_000)
    assert result.compacted and result.meta["strategy"] == "sliding_window"
    # set but empty is unset
    monkeypatch.setenv(ENV_COMPACTOR, " ")
    monkeypatch.setenv(ENV_OPTS, "")
    assert current_settings().layers == ()


def test_options_alone_tune_the_default_compactor(
    here: Path, messages: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_OPTS, json.dumps({"strategy": "summarize"}))
    result = compact(messages, window=32_000)
    assert result.meta["strategy"] == "summarize"
    # AgentConfig's default is noop, which takes no options: the variable is named
    with pytest.raises(OptionsError, match=f"^{ENV_OPTS}: compactor 'noop' takes no options"):
        AgentConfig.from_env()


# -- the files -----------------------------------------------------------------------------


NORMANDY_TOML = """
    compactor = "window_manager"
    model = "gpt-4o"
    window = 30000
    timeout = 5.5

    [opts]
    strategy = "sliding_window"
    keep_last_turns = 2
"""

PYPROJECT_TOML = """
    [project]
    name = "app"

    [tool.normandy]
    compactor = "window_manager"
    model = "claude-sonnet-4-5"
    window = 24000

    [tool.normandy.opts]
    strategy = "summarize"
"""


def test_normandy_toml_sets_every_key(here: Path, messages: Any) -> None:
    path = write(here / "normandy.toml", NORMANDY_TOML)
    s = current_settings()
    assert s.files == (path,)
    r = s.resolve("window_manager")
    assert (r.compactor, r.opts, r.model, r.window, r.timeout) == (
        "window_manager",
        {"strategy": "sliding_window", "keep_last_turns": 2},
        "gpt-4o",
        30000,
        5.5,
    )
    assert r.origins["opts"] == f"{path}: line 6: key 'opts'"
    result = compact(messages)
    assert result.meta["strategy"] == "sliding_window"
    assert result.tokens_after <= 30_000
    agent = AgentConfig.from_env()
    assert (agent.compactor, agent.model, agent.compaction_timeout) == (
        "window_manager",
        "gpt-4o",
        5.5,
    )
    assert agent.prepared.window == 30_000
    assert agent.compactor_opts["context_window"] == 30_000


def test_pyproject_table_found_from_a_subdirectory(
    here: Path, messages: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(here / "pyproject.toml", PYPROJECT_TOML)
    # a nearer pyproject.toml without the table does not stop the look-up
    write(here / "pkg" / "pyproject.toml", '[project]\nname = "normandy-app"\n')
    (here / "pkg" / "src").mkdir()
    monkeypatch.chdir(here / "pkg" / "src")
    s = current_settings()
    assert s.files == (path,)
    assert s.layers[0].name == f"{path} [tool.normandy]"
    r = s.resolve("window_manager")
    assert (r.model, r.window, r.opts) == ("claude-sonnet-4-5", 24000, {"strategy": "summarize"})
    assert r.origins["window"] == f"{path}: line 7: [tool.normandy] key 'window'"
    assert compact(messages).meta["strategy"] == "summarize"


def test_first_directory_found_wins(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(here / "normandy.toml", 'compactor = "noop"\n')
    # clear_tool_results sizes against the window by default: the file gives one
    inner = write(
        here / "a" / "b" / "normandy.toml", 'compactor = "clear_tool_results"\nwindow = 24000\n'
    )
    monkeypatch.chdir(here / "a" / "b")
    assert current_settings().files == (inner,)
    assert AgentConfig.from_env().compactor == "clear_tool_results"
    monkeypatch.chdir(here / "a")
    assert AgentConfig.from_env().compactor == "noop"


def test_one_directory_with_both_files_reads_both(here: Path) -> None:
    own = write(here / "normandy.toml", 'compactor = "clear_tool_results"\n')
    project = write(here / "pyproject.toml", PYPROJECT_TOML)
    s = current_settings()
    assert s.files == (own, project)
    r = s.resolve("window_manager")
    # compactor from normandy.toml; the pyproject's options were for window_manager
    assert (r.compactor, r.opts, r.model, r.window) == (
        "clear_tool_results",
        None,
        "claude-sonnet-4-5",
        24000,
    )


def test_normandy_config_names_one_file_or_none(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(here / "normandy.toml", 'compactor = "noop"\n')
    chosen = write(
        here / "conf" / "prod.toml", 'compactor = "clear_tool_results"\nwindow = 24000\n'
    )
    monkeypatch.setenv(ENV_CONFIG, "conf/prod.toml")
    assert current_settings().files == (chosen.resolve(),)
    assert AgentConfig.from_env().compactor == "clear_tool_results"
    monkeypatch.setenv(ENV_CONFIG, "off")
    assert current_settings().layers == ()
    monkeypatch.setenv(ENV_CONFIG, "missing.toml")
    with pytest.raises(SettingsError, match=f"^{ENV_CONFIG}: 'missing.toml': no such"):
        current_settings()
    write(here / "other" / "pyproject.toml", '[project]\nname = "x"\n')
    monkeypatch.setenv(ENV_CONFIG, str(here / "other" / "pyproject.toml"))
    with pytest.raises(SettingsError, match=r"pyproject.toml: has no \[tool.normandy\] table"):
        current_settings()


# -- precedence ----------------------------------------------------------------------------


def test_precedence_arguments_environment_normandy_toml_pyproject_default(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        here / "pyproject.toml",
        """
        [tool.normandy]
        compactor = "window_manager"
        model = "from-pyproject"
        window = 1000
        timeout = 1
        """,
    )
    write(here / "normandy.toml", 'model = "from-normandy-toml"\nwindow = 2000\n')
    monkeypatch.setenv(ENV_OPTS, '{"strategy": "summarize"}')

    r = current_settings().resolve("noop")
    assert (r.compactor, r.model, r.window, r.timeout, r.opts) == (
        "window_manager",  # pyproject over the default
        "from-normandy-toml",  # normandy.toml over pyproject
        2000,
        1,  # only pyproject sets it
        {"strategy": "summarize"},  # the environment, for the file's compactor
    )
    r = current_settings().resolve(
        "noop", model="argument", window=3000, opts={"strategy": "oldest_first"}
    )
    assert (r.model, r.window, r.opts) == ("argument", 3000, {"strategy": "oldest_first"})
    assert set(r.origins) == {"compactor", "timeout"}  # the rest came from the arguments

    monkeypatch.setenv(ENV_COMPACTOR, "clear_tool_results")
    # the environment's options configure its own compactor now that it names one
    with pytest.raises(OptionsError, match=f"^{ENV_OPTS}: compactor 'clear_tool_results'"):
        current_settings().resolve("noop")
    monkeypatch.setenv(ENV_OPTS, '{"keep": 2}')
    r = current_settings().resolve("noop")
    assert r.compactor == "clear_tool_results" and r.origins["compactor"] == ENV_COMPACTOR
    assert r.opts == {"keep": 2}


def test_options_belong_to_their_compactor(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(here / "normandy.toml", 'compactor = "window_manager"\n[opts]\nstrategy = "summarize"\n')
    s = current_settings()
    # an argument naming another compactor sets the file's options aside
    assert s.resolve("window_manager", compactor="noop").opts is None
    # naming the same one keeps them
    assert s.resolve("window_manager", compactor="window_manager").opts == {"strategy": "summarize"}
    monkeypatch.setenv(ENV_COMPACTOR, "noop")
    assert current_settings().resolve("window_manager").opts is None
    monkeypatch.setenv(ENV_COMPACTOR, "window_manager")
    assert current_settings().resolve("window_manager").opts == {"strategy": "summarize"}
    # options given as arguments replace the configured ones whole
    r = current_settings().resolve("window_manager", opts={"target": 0.5})
    assert r.opts == {"target": 0.5}


def test_window_and_context_window_the_higher_source_wins(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(here / "normandy.toml", "window = 20000\n")
    monkeypatch.setenv(ENV_OPTS, '{"context_window": 50000}')
    r = current_settings().resolve("window_manager")
    assert (r.window, r.opts) == (None, {"context_window": 50000})
    assert "window" not in r.origins
    assert AgentConfig.from_env(compactor="window_manager").prepared.window == 50_000
    # an argument window is higher than the environment's pinned one
    r = current_settings().resolve("window_manager", window=10_000)
    assert (r.window, r.opts) == (10_000, {})
    assert AgentConfig.from_env(compactor="window_manager", window=10_000).prepared.window == (
        10_000
    )


def test_explicit_arguments_win_in_compact(
    here: Path, messages: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(here / "normandy.toml", NORMANDY_TOML)
    monkeypatch.setenv(ENV_COMPACTOR, "noop")
    assert not compact(messages).compacted  # the environment over the file
    result = compact(
        messages, compactor="window_manager", opts={"strategy": "summarize"}, window=26_000
    )
    assert result.meta["strategy"] == "summarize" and result.tokens_after <= 26_000


# -- what from_env() and from_file() make ---------------------------------------------------


def test_from_env_fields_win_and_others_pass_through(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(here / "normandy.toml", NORMANDY_TOML)
    agent = AgentConfig.from_env(
        model="gpt-4o-mini",
        compaction_timeout=2.0,
        system_prompt="hi",
        session_id="s-1",
    )
    assert agent.model == "gpt-4o-mini" and agent.compaction_timeout == 2.0
    assert (agent.system_prompt, agent.session_id) == ("hi", "s-1")
    assert agent.compactor_opts["strategy"] == "sliding_window"
    plain = AgentConfig.from_env(compactor="noop")
    assert plain.compactor == "noop" and plain.compactor_opts == {}


def test_from_file_reads_only_that_file(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = write(here / "elsewhere" / "pyproject.toml", PYPROJECT_TOML)
    monkeypatch.setenv(ENV_COMPACTOR, "noop")  # not read by from_file
    agent = AgentConfig.from_file(project)
    assert (agent.compactor, agent.model) == ("window_manager", "claude-sonnet-4-5")
    assert agent.prepared.window == 24_000
    with pytest.raises(SettingsError, match=r"nope\.toml: no such settings file"):
        AgentConfig.from_file(here / "nope.toml")
    assert isinstance(read_settings_file(project), Settings)


def test_a_refusal_at_prepare_names_the_configured_sources(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_COMPACTOR, "window_manager")
    with pytest.raises(WindowUnknownError) as info:
        AgentConfig.from_env()  # no model, no window: nothing to size against
    assert f"(settings: compactor from {ENV_COMPACTOR})" in str(info.value)
    assert "set window or model in the configuration (normandy.toml" in str(info.value)
    monkeypatch.setenv(ENV_OPTS, '{"reserved_tokens": 9000}')
    with pytest.raises(OptionsError) as refused:
        compact([{"role": "user", "content": "hi"}], window=8000)
    text = str(refused.value)
    assert text.startswith("normandy_core.compact(): compactor 'window_manager'")
    assert f"settings: compactor from {ENV_COMPACTOR}; opts from {ENV_OPTS}" in text


# -- errors name the file, the line and the key, or the variable ----------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('compactor = "window_manager\n', r"normandy.toml: line 1, column \d+: not valid TOML: "),
        (
            'compactor = "noop"\ncompacter = "x"\n',
            r"normandy.toml: line 2: key 'compacter': unknown key; did you mean 'compactor'\? "
            r"allowed keys: compactor, model, opts, survival, timeout, window",
        ),
        ("compactor = 3\n", r"line 1: key 'compactor': must be a non-empty string, got 3"),
        ('model = ""\n', r"line 1: key 'model': must be a non-empty string"),
        ('opts = "fast"\n', r"line 1: key 'opts': must be a table of option names"),
        ("window = 0\n", r"line 1: key 'window': must be a positive whole number of tokens"),
        ("window = 1.5\n", r"key 'window': must be a positive whole number"),
        ("timeout = -1\n", r"line 1: key 'timeout': must be a positive number of seconds"),
        ("timeout = true\n", r"key 'timeout': must be a positive number of seconds"),
        (
            "window = 1000\n[opts]\ncontext_window = 2000\n",
            r"line 1: key 'window': window = 1000 contradicts the option context_window = 2000",
        ),
    ],
)
def test_bad_normandy_toml(here: Path, text: str, expected: str) -> None:
    path = here / "normandy.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SettingsError, match=f"^{path}: ") as info:
        compact([])
    assert __import__("re").search(expected, str(info.value)), str(info.value)


def test_bad_pyproject_table(here: Path) -> None:
    path = write(here / "pyproject.toml", '[tool]\nnormandy = "window_manager"\n')
    with pytest.raises(SettingsError, match=rf"^{path}: line 2: \[tool.normandy\] must be a "):
        AgentConfig.from_env()
    write(path, '[tool.normandy]\ncompactor = "noop"\nwindows = 3\n')
    reload_settings()
    with pytest.raises(
        SettingsError, match=rf"^{path}: line 3: \[tool.normandy\] key 'windows': unknown key"
    ):
        AgentConfig.from_env()
    # a broken pyproject.toml that mentions normandy cannot be skipped: it is named
    write(path, "[tool.normandy\n")
    reload_settings()
    with pytest.raises(SettingsError, match=rf"^{path}: line 1, column \d+: not valid TOML"):
        AgentConfig.from_env()


def test_not_utf8(here: Path) -> None:
    path = here / "normandy.toml"
    path.write_bytes(b'compactor = "noop"\nmodel = "\xff"\n')
    with pytest.raises(SettingsError, match=rf"^{path}: line 2: not UTF-8 text"):
        current_settings()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"strategy": ', r"not valid JSON: Expecting value \(line 1, column 13\)"),
        ("[1, 2]", r"expected a JSON object of option names to values, .*got an array"),
        ('"summarize"', r"expected a JSON object .*got a string"),
        ("null", r"expected a JSON object .*got null"),
    ],
)
def test_bad_options_variable(
    here: Path, monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv(ENV_OPTS, value)
    with pytest.raises(SettingsError, match=f"^{ENV_OPTS}: {expected}"):
        compact([])


def test_unknown_compactor_names_its_source(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_COMPACTOR, "window_manger")
    with pytest.raises(UnknownCompactorError) as info:
        compact([])
    assert str(info.value).startswith(f"{ENV_COMPACTOR}: unknown compactor 'window_manger'; ")
    assert info.value.source == ENV_COMPACTOR and info.value.suggestion == "window_manager"
    monkeypatch.delenv(ENV_COMPACTOR)
    path = write(here / "normandy.toml", '# settings\ncompactor = "zstd"\n')
    with pytest.raises(UnknownCompactorError, match=rf"^{path}: line 2: key 'compactor': "):
        AgentConfig.from_env()


def test_disabled_compactor_names_its_source(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from normandy_core.contract import plugins

    monkeypatch.setenv(plugins.ENV_DISABLE, "clear_tool_results")
    plugins.reload_plugins()
    monkeypatch.setenv(ENV_COMPACTOR, "clear_tool_results")
    with pytest.raises(PluginDisabledError, match=f"^{ENV_COMPACTOR}: compactor "):
        compact([])


def test_refused_options_name_the_file_key_and_option(here: Path) -> None:
    path = write(
        here / "pyproject.toml",
        """
        [tool.normandy]
        compactor = "window_manager"

        [tool.normandy.opts]
        trigger = 1.5
        """,
    )
    with pytest.raises(OptionsError) as info:
        compact([])
    text = str(info.value)
    assert text.startswith(
        f"{path}: line 4: [tool.normandy] key 'opts': compactor 'window_manager' refused its "
        "options:\n  option 'trigger': "
    )
    assert not isinstance(info.value, SettingsError)


def test_overridden_sources_are_checked_too(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad setting is refused wherever it is, even under an argument that would win."""
    write(here / "normandy.toml", 'compactor = "window_manager"\n[opts]\nstrategy = "fastest"\n')
    with pytest.raises(OptionsError, match="option 'strategy'"):
        compact([], compactor="noop")


def test_an_error_is_raised_on_every_call_until_fixed(here: Path) -> None:
    path = write(here / "normandy.toml", "compactor = \n")
    for _ in range(2):
        with pytest.raises(SettingsError):
            current_settings()
    write(path, 'compactor = "noop"\n')
    assert AgentConfig.from_env().compactor == "noop"


# -- reading once ---------------------------------------------------------------------------


def test_read_once_per_directory_and_environment(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(here / "normandy.toml", 'compactor = "noop"\n')
    first = current_settings()
    assert current_settings() is first
    path.unlink()  # the cached settings are not read again...
    assert current_settings() is first
    reload_settings()  # ...until reload_settings()
    assert current_settings().layers == ()
    write(path, 'compactor = "noop"\n')
    reload_settings()
    before = current_settings()
    monkeypatch.setenv(ENV_OPTS, "{}")  # a changed variable is seen at once
    assert current_settings() is not before
    assert current_settings().layers[0].name == "environment"
    (here / "sub").mkdir()
    monkeypatch.chdir(here / "sub")  # so is another working directory
    assert current_settings().files == (path,)


def test_continuation_memo_keys_on_the_resolved_settings(
    here: Path, messages: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lists cut before an assistant message: every tool batch before the cut is answered
    cuts = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= 150]
    monkeypatch.setenv(ENV_OPTS, '{"strategy": "sliding_window", "keep_last_turns": 2}')
    first = compact(messages[: cuts[0]], window=32_000)
    assert first.compacted and first.meta["strategy"] == "sliding_window"
    again = compact(messages[: cuts[2]], window=32_000)
    assert again.continued
    # other configured options: another config, so not a continuation of the first
    monkeypatch.setenv(ENV_OPTS, '{"strategy": "oldest_first"}')
    other = compact(messages[: cuts[4]], window=32_000)
    assert not other.continued and other.meta["strategy"] == "oldest_first"


# -- precedence as a property ---------------------------------------------------------------


class _TakesAnything:
    """A compactor without an options model or a window: any options are its own."""

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
        return acc, {"compacted": False}

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False


_NAMES = st.sampled_from(["alpha", "beta"])


@st.composite
def _level(draw: st.DrawFn) -> dict[str, Any]:
    """The keys one source (or a call) sets: each key present about half the time."""
    pools: dict[str, st.SearchStrategy[Any]] = {
        "compactor": _NAMES,
        "opts": st.builds(
            lambda tag, pinned: {"tag": tag, **({"context_window": pinned} if pinned else {})},
            st.integers(0, 9),
            st.sampled_from([None, 1000, 2000]),
        ),
        "model": st.sampled_from(["m1", "m2"]),
        "window": st.sampled_from([1000, 3000]),
        "timeout": st.sampled_from([1.0, 2.5]),
    }
    return {key: draw(pool) for key, pool in pools.items() if draw(st.booleans())}


_LEVEL = _level()


def _reference(levels: list[dict[str, Any]], default: str) -> tuple[Any, ...]:
    """Precedence as docs/configuration.md states it, written out level by level."""
    compactor = next((lv["compactor"] for lv in levels if "compactor" in lv), default)

    def configures(i: int) -> str:  # the compactor the options of level i belong to
        return next((lv["compactor"] for lv in levels[i:] if "compactor" in lv), compactor)

    found = {
        key: next((i for i, lv in enumerate(levels) if key in lv), None)
        for key in ("model", "window", "timeout")
    }
    found["opts"] = next(
        (i for i, lv in enumerate(levels) if "opts" in lv and configures(i) == compactor), None
    )
    value = {k: (None if i is None else levels[i][k]) for k, i in found.items()}
    opts, window = value["opts"], value["window"]
    if opts is not None and window is not None and "context_window" in opts:
        if found["window"] < found["opts"]:
            opts = {k: v for k, v in opts.items() if k != "context_window"}
        elif found["window"] > found["opts"]:
            window = None
    return compactor, opts, value["model"], window, value["timeout"]


@settings(max_examples=60)
@given(
    sources=st.lists(_LEVEL, min_size=3, max_size=3),
    calls=st.lists(_LEVEL, min_size=1, max_size=4),
    default=_NAMES,
)
def test_resolve_follows_the_stated_precedence(
    sources: list[dict[str, Any]], calls: list[dict[str, Any]], default: str
) -> None:
    from normandy_core.contract import plugins
    from normandy_core.contract.settings import Layer

    for name in ("alpha", "beta"):
        if name not in plugins._REG.in_code:
            plugins.register_compactor(name, _TakesAnything())
    layers = tuple(
        Layer(f"source {i}", values, {k: f"source {i} key {k}" for k in values})
        for i, values in enumerate(sources)
    )
    configured = Settings(layers)
    for call in calls:  # one Settings object: its plans must not leak between calls
        r = configured.resolve(default, **call)
        assert tuple(r[:5]) == _reference([call, *sources], default)
        assert tuple(Settings(layers).resolve(default, **call)) == tuple(r)
        for key, origin in r.origins.items():
            level = int(origin.split()[1])
            assert origin == f"source {level} key {key}" and key not in call


# -- the documentation's examples ------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _blocks(doc: str, lang: str) -> list[str]:
    import re

    text = (ROOT / doc).read_text(encoding="utf-8")
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("doc", ["docs/configuration.md", "README.md"])
def test_documented_settings_files_are_valid(doc: str, here: Path) -> None:
    blocks = [b for b in _blocks(doc, "toml") if "compactor" in b]
    assert blocks
    for i, block in enumerate(blocks):
        name = "pyproject.toml" if "[tool.normandy]" in block else "normandy.toml"
        path = write(here / str(i) / name, block)
        s = read_settings_file(path)
        r = s.resolve("window_manager")
        assert r.compactor == "window_manager" and r.opts and r.window == 128_000


def test_documented_python_examples_run(here: Path) -> None:
    write(
        here / "normandy.toml",
        'compactor = "window_manager"\nwindow = 32000\n[opts]\ntarget = 0.6\n',
    )
    blocks = _blocks("docs/configuration.md", "python")
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/configuration.md", "exec"), {})
    agent = AgentConfig.from_env(system_prompt="You are a careful engineer.")
    assert agent.compactor == "window_manager" and agent.prepared.window == 32_000
    assert agent.compactor_opts == {"target": 0.6, "context_window": 32_000}
