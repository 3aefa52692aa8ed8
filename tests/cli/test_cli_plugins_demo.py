"""``normandy plugins``, ``normandy demo``, broken plugins and CLI extensions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import run_cli

# Slow: every test runs the installed console script in a subprocess.
pytestmark = pytest.mark.slow


def _install_fake_dist(
    root: Path, dist: str, group: str, name: str, module: str, body: str, attr: str = ""
) -> None:
    """A really discoverable distribution: a module and its .dist-info on PYTHONPATH."""
    (root / f"{module}.py").write_text(body, encoding="utf-8")
    info = root / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n", encoding="utf-8"
    )
    value = f"{module}:{attr}" if attr else module
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {value}\n", encoding="utf-8")


def test_plugins_table_and_json() -> None:
    r = run_cli("plugins")
    assert r.code == 0, r
    header = r.out.splitlines()[0].split()
    assert header == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "MODULE", "STATUS"]
    assert "normandy-window-manager" in r.out and "loaded" in r.out
    r = run_cli("plugins", "--json")
    assert r.code == 0, r
    rows = {row["name"]: row for row in json.loads(r.out)}
    assert rows["window_manager"]["status"] == "loaded"
    assert rows["noop"]["distribution"] == "normandy-core"
    assert {"kind", "group", "module", "version", "error"} <= set(rows["noop"])


def test_broken_plugin_is_listed_and_named(tmp_path: Path) -> None:
    _install_fake_dist(
        tmp_path,
        "normandy-broken",
        "normandy_core.compactors",
        "broken",
        "normandy_broken_cx",
        "raise ImportError('needs the zstandard package')\n",
    )
    env = {"PYTHONPATH": str(tmp_path)}
    r = run_cli("plugins", "--json", env=env)
    assert r.code == 3, r  # something failed to load: the listing says so by its status
    rows = {row["name"]: row for row in json.loads(r.out)}
    assert rows["broken"]["status"] == "error"
    assert "zstandard" in rows["broken"]["error"]
    assert rows["window_manager"]["status"] == "loaded"  # the others still load
    r = run_cli("plugins", env=env)
    assert r.code == 3, r
    assert r.out.count("compactor 'broken' (error)") == 1 and "normandy-broken 0.0.1" in r.out
    r = run_cli("compact", "-", "--compactor", "broken", stdin="[]", env=env)
    assert r.code == 3, r
    assert "normandy-broken 0.0.1 failed to import" in r.err and "zstandard" in r.err


def test_cli_extension_registered_and_isolated(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    _install_fake_dist(
        good,
        "normandy-hello",
        "normandy_core.commands",
        "hello",
        "normandy_hello_cli",
        "def register(subparsers):\n"
        "    p = subparsers.add_parser('hello', help='say hello')\n"
        "    p.set_defaults(func=lambda args: print('hello ok') or 0)\n",
        attr="register",
    )
    r = run_cli("hello", env={"PYTHONPATH": str(good)})
    assert r.code == 0 and r.out.strip() == "hello ok", r
    r = run_cli("hello", env={"PYTHONPATH": str(good), "NORMANDY_DISABLE_PLUGINS": "hello"})
    assert r.code == 2 and "invalid choice" in r.err, r
    _install_fake_dist(
        bad,
        "normandy-hello",
        "normandy_core.commands",
        "hello",
        "normandy_hello_cli",
        "def register(subparsers):\n    raise RuntimeError('boom')\n",
        attr="register",
    )
    r = run_cli("plugins", "--json", env={"PYTHONPATH": str(bad)})
    assert r.code == 3, r
    assert "command extension 'hello' failed to register" in r.err and "boom" in r.err
    rows = {(row["kind"], row["name"]): row for row in json.loads(r.out)}
    assert rows[("command", "hello")]["status"] == "error"
    assert rows[("compactor", "window_manager")]["status"] == "loaded"  # the others still work


def test_no_command_and_bad_command() -> None:
    assert run_cli().code == 2
    r = run_cli("frobnicate")
    assert r.code == 2 and "invalid choice" in r.err


def test_demo_smoke(tmp_path: Path) -> None:
    r = run_cli("demo", "--turns", "6", "--window", "12000", "--no-progress")
    assert r.code == 0, r
    assert "compaction turn" in r.out
    for label in (
        "boundaries",
        "compactions",
        "entries dropped",
        "peak context sent",
        "time compacting",
    ):
        assert label in r.out
    assert "12,000-token window" in r.out
    assert "replaying |" not in r.err  # no progress bar when stderr is not a terminal


def test_demo_progress_forced_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "chart.png"
    r = run_cli(
        "demo",
        "--turns",
        "3",
        "--window",
        "12000",
        "--progress",
        "--quiet",
        "--plot",
        str(png),
        "--opt",
        "strategy=sliding_window",
    )
    assert r.code == 0, r
    assert "replaying |" in r.err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sliding_window" in r.out


def test_demo_bad_option_and_compactor() -> None:
    r = run_cli("demo", "--opt", "strategy=newest_first")
    assert r.code == 2 and "option 'strategy'" in r.err and "normandy demo" in r.err
    r = run_cli("demo", "--window", "20000", "--opt", "context_window=30000")
    assert r.code == 2 and "contradicts" in r.err
    r = run_cli("demo", "--compactor", "nope")
    assert r.code == 3 and "Installed compactors" in r.err


def test_demo_noop_never_compacts() -> None:
    r = run_cli("demo", "--turns", "4", "--compactor", "noop", "--window", "8000", "--no-progress")
    assert r.code == 0, r
    assert "compaction turn" not in r.out
    assert "8,000-token window: the request would be refused" in r.out
