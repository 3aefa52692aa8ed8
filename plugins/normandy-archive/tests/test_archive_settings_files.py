"""The archive's settings as a section of Normandy's configuration: ``[archive]`` in a
``normandy.toml``, ``[tool.normandy.archive]`` in a ``pyproject.toml``, found and read as
the core's own keys are, under the environment, :func:`configure` and the per-call
:func:`archive_settings`. Every test runs in a temporary working directory with
``NORMANDY_CONFIG`` and the archive's variables unset."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from normandy_archive import ArchiveConfigError, archive_settings, configure, current_settings
from normandy_archive.settings import ENV_PATH
from normandy_core import AgentConfig, compact, run_compaction
from normandy_core.app.workload import generate_session
from normandy_core.contract.settings import ENV_CONFIG, reload_settings
from normandy_core.errors import SettingsError

#: The archive's variables: unset in these tests, so only the files speak.
ARCHIVE_VARIABLES = (
    ENV_PATH,
    "NORMANDY_ARCHIVE_URL",
    "NORMANDY_ARCHIVE_REQUIRED",
    "NORMANDY_ARCHIVE_BUSY_TIMEOUT",
    "NORMANDY_ARCHIVE_SESSION",
    "NORMANDY_ARCHIVE_MAX_BYTES",
    "NORMANDY_ARCHIVE_MAX_AGE_DAYS",
    "NORMANDY_ARCHIVE_MAX_SESSIONS",
    "NORMANDY_ARCHIVE_SYNC",
)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary working directory, no variable set, the user data directory in it."""
    for name in (ENV_CONFIG, *ARCHIVE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    reload_settings()
    yield tmp_path
    reload_settings()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def test_an_archive_table_in_normandy_toml_sets_every_key(here: Path) -> None:
    toml = write(
        here / "normandy.toml",
        """
        compactor = "window_manager"

        [archive]
        path = "kept/archive.sqlite3"
        required = false
        busy_timeout = 2.5
        session = "agent-7"
        max_bytes = "2MB"
        max_age_days = 30
        max_sessions = 100
        sync = "full"
        """,
    )
    s = current_settings()
    assert s.path == here / "kept" / "archive.sqlite3"  # relative to the file's directory
    assert (s.required, s.busy_timeout, s.session, s.sync) == (False, 2.5, "agent-7", "full")
    assert (s.max_bytes, s.max_age_days, s.max_sessions) == (2_000_000, 30.0, 100)
    assert s.source == f"{toml}: line 4: [archive] key 'path'"


def test_a_pyproject_table_sets_the_archive_below_normandy_toml(here: Path) -> None:
    write(
        here / "pyproject.toml",
        """
        [project]
        name = "agent"

        [tool.normandy.archive]
        path = "/srv/agent/archive.sqlite3"
        max_bytes = 1000000
        session = "from-pyproject"
        """,
    )
    nested = here / "src" / "agent"
    nested.mkdir(parents=True)
    s = current_settings()
    assert (s.path, s.max_bytes, s.session) == (
        Path("/srv/agent/archive.sqlite3"),
        1_000_000,
        "from-pyproject",
    )
    write(here / "normandy.toml", '[archive]\nsession = "from-normandy-toml"\n')
    reload_settings()
    s = current_settings()
    assert (s.session, s.max_bytes) == ("from-normandy-toml", 1_000_000)  # key by key
    # found from a subdirectory too, the look-up the core's own keys use
    import os

    os.chdir(nested)
    assert current_settings().session == "from-normandy-toml"


def test_a_url_in_the_file_selects_postgresql_and_off_turns_the_archive_off(
    here: Path,
) -> None:
    write(here / "normandy.toml", '[archive]\nurl = "postgresql://agent@db.example/archive"\n')
    assert current_settings().url == "postgresql://agent@db.example/archive"
    write(here / "normandy.toml", '[archive]\npath = "off"\n')
    reload_settings()
    assert current_settings().off


def test_the_environment_beats_the_file_and_code_beats_the_environment(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = write(
        here / "normandy.toml",
        '[archive]\npath = "from-file.sqlite3"\nmax_bytes = "1MB"\nsession = "file"\n',
    )
    monkeypatch.setenv(ENV_PATH, str(here / "from-env.sqlite3"))
    monkeypatch.setenv("NORMANDY_ARCHIVE_MAX_BYTES", "5MB")
    s = current_settings()
    assert (s.path, s.source, s.max_bytes) == (here / "from-env.sqlite3", ENV_PATH, 5_000_000)
    assert s.session == "file"  # the file still gives what the environment does not
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", "postgresql://agent@db.example/archive")
    assert current_settings().url == "postgresql://agent@db.example/archive"
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL")
    configure(path=here / "in-code.sqlite3", session="code")
    try:
        s = current_settings()
        assert (s.path, s.source, s.session) == (here / "in-code.sqlite3", "configure()", "code")
        with archive_settings(path="off", session="per-call") as inside:
            assert inside.off and inside.source == "per call" and inside.session == "per-call"
            assert current_settings().max_bytes == 5_000_000
    finally:
        configure(path=None, session=None)
    monkeypatch.delenv(ENV_PATH)
    monkeypatch.delenv("NORMANDY_ARCHIVE_MAX_BYTES")
    s = current_settings()
    assert (s.path, s.max_bytes) == (here / "from-file.sqlite3", 1_000_000)
    assert s.source == f"{toml}: line 2: [archive] key 'path'"


def test_per_call_settings_beat_every_source(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(here / "normandy.toml", '[archive]\npath = "off"\nrequired = false\n')
    monkeypatch.setenv("NORMANDY_ARCHIVE_REQUIRED", "1")
    configure(required=False)
    try:
        target = here / "per-call.sqlite3"
        with archive_settings(path=target, required=True) as inside:
            assert (inside.path, inside.required, inside.source) == (target, True, "per call")
        assert current_settings().off and not current_settings().required
    finally:
        configure(required=None)
    assert current_settings().required  # the environment over the file


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ("busy_timeout = -1", r"line 2: \[archive\] key 'busy_timeout': .*>= 0, got -1"),
        ('required = "maybe"', r"line 2: \[archive\] key 'required': .*true or false"),
        ('max_bytes = "lots"', r"line 2: \[archive\] key 'max_bytes': .*'lots'"),
        ("max_sessions = 2.5", r"line 2: \[archive\] key 'max_sessions': .*whole number"),
        ("max_sessions = inf", r"line 2: \[archive\] key 'max_sessions': .*whole number"),
        ('sync = "sometimes"', r"line 2: \[archive\] key 'sync': .*'normal' or 'full'"),
        ('url = "mysql://x"', r"line 2: \[archive\] key 'url': .*postgresql://"),
        ("session = 7", r"line 2: \[archive\] key 'session': .*non-empty string"),
        (
            "max_byte = 1",
            r"line 2: \[archive\] key 'max_byte': unknown key; did you mean 'max_bytes'\?",
        ),
    ],
)
def test_a_bad_archive_setting_names_the_file_the_line_and_the_key(
    here: Path, table: str, expected: str
) -> None:
    toml = write(here / "normandy.toml", f"[archive]\n{table}\n")
    with pytest.raises(ArchiveConfigError) as info:
        current_settings()
    assert isinstance(info.value, SettingsError)  # the core's error, the archive's kind
    assert str(info.value).startswith(f"{toml}: line 2: "), str(info.value)
    assert re.search(expected, str(info.value)), str(info.value)


def test_a_bad_pyproject_archive_setting_names_its_table(here: Path) -> None:
    pyproject = write(here / "pyproject.toml", "[tool.normandy.archive]\nmax_age_days = -3\n")
    with pytest.raises(ArchiveConfigError, match=re.escape(f"{pyproject}: line 2: ")) as info:
        current_settings()
    assert "[tool.normandy.archive] key 'max_age_days'" in str(info.value)


def test_an_unknown_section_is_refused_naming_the_file_and_line(here: Path) -> None:
    text = '[tool.normandy]\ncompactor = "window_manager"\n\n[tool.normandy.archve]\npath = "off"\n'
    pyproject = write(here / "pyproject.toml", text)
    pattern = (
        rf"^{re.escape(str(pyproject))}: line 4: \[tool.normandy\] key 'archve': unknown "
        r"section; did you mean 'archive'\?"
    )
    with pytest.raises(SettingsError, match=pattern):
        current_settings()
    with pytest.raises(SettingsError, match=pattern):
        compact([{"role": "user", "content": "hi"}], window=32_000)
    write(here / "pyproject.toml", "")
    write(here / "normandy.toml", "[archives]\npath = 'off'\n")
    reload_settings()
    with pytest.raises(SettingsError, match=r"normandy.toml: line 1: key 'archives': unknown"):
        current_settings()


def test_a_bad_archive_setting_in_the_file_refuses_the_compaction(here: Path) -> None:
    toml = write(here / "normandy.toml", '[archive]\nrequired = "perhaps"\n')
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts={"context_window": 20_000},
    ).with_memory(generate_session(4, 150, end_mid_round=True))
    out, meta = run_compaction(acc, mid_round=True)  # a bad setting fails closed
    assert out is acc and not meta["compacted"]
    assert f"{toml}: line 2: [archive] key 'required'" in meta["error"]


def test_the_archive_section_is_declared_for_the_core(here: Path) -> None:
    """The section the archive declares (entry point group normandy_core.settings) is the
    one it reads, and the core lists it with its values and their sources."""
    from normandy_archive.settings import SECTION
    from normandy_core.contract.settings import current_settings as core_settings, settings_sections

    assert settings_sections()["archive"] == SECTION
    toml = write(here / "normandy.toml", "[archive]\nmax_sessions = 3\n")
    rows = {row.key: row for row in core_settings().describe(SECTION, environ={})}
    assert set(rows) == {key.name for key in SECTION.keys}
    assert (rows["max_sessions"].value, rows["max_sessions"].origin) == (
        3,
        f"{toml}: line 2: [archive] key 'max_sessions'",
    )
    assert (rows["path"].value, rows["path"].origin) == (None, "not set")


@pytest.mark.parametrize("doc", ["docs/configuration.md", "docs/plugins/archive.md"])
def test_the_documented_archive_tables_are_read_as_documented(
    here: Path, monkeypatch: pytest.MonkeyPatch, doc: str
) -> None:
    text = (Path(__file__).resolve().parents[3] / doc).read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", text, flags=re.S) if "archive]" in b]
    assert blocks
    for i, block in enumerate(blocks):
        name = "pyproject.toml" if "[tool.normandy" in block else "normandy.toml"
        folder = write(here / str(i) / name, block).parent
        monkeypatch.chdir(folder)
        reload_settings()
        s = current_settings()
        if "path =" in block:
            assert s.path == folder / ".normandy" / "archive.sqlite3"
        if "max_bytes" in block:
            assert s.max_bytes == 500_000_000
        if "required = false" in block:
            assert s.required is False
