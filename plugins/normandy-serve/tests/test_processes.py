"""``normandy serve`` in processes of its own, as a deployment runs it: two proxies sharing
one PostgreSQL archive, each agent's dropped entries landing in the one database under its
own session; one proxy with several worker processes on one port; SIGTERM stops each
cleanly (uvicorn's graceful shutdown, exit status 0)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import openai
import pytest
from serve_agents import KEY, OPTS, WINDOW, chat_agent, reads
from serve_support import root_of, servers

from normandy_archive import open_archive

pytestmark = pytest.mark.slow

NORMANDY = Path(sys.executable).with_name("normandy")
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
_WORKER = re.compile(r"Started server process \[(\d+)\]")
_COMPACTED = re.compile(r"normandy serve \[(\d+)\]: compacted openai request of session ([\w-]+)")


@contextmanager
def serve_process(
    upstream: str, archive: tuple[str, str], *options: str
) -> Iterator[tuple[str, subprocess.Popen[str], list[str]]]:
    """``normandy serve`` with ``options`` in a process of its own on a free port,
    archiving to ``archive`` (the environment variable and its value); yields its origin,
    the process (stopped by SIGTERM at the end) and the lines of its log so far."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NORMANDY_ARCHIVE_")}
    env[archive[0]] = archive[1]
    command = [str(NORMANDY), "serve", "--upstream", upstream, "--port", "0"]
    command += ["--window", str(WINDOW), "--opts", OPTS, *options]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    port: list[str] = []
    started: list[bool] = []
    ready = threading.Event()

    def read() -> None:  # drains stderr, so the process never blocks on its logs
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if (found := _LISTENING.search(line)) is not None:
                port.append(found[1])
            started.append("Application startup complete" in line)
            # One process listens, then says where; with --workers the parent says where
            # it bound the port, and a worker listens on it later.
            if port and any(started):
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(60) and port, "".join(lines)
        yield f"http://127.0.0.1:{port[0]}", proc, lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        reader.join(timeout=5)


def test_two_proxy_processes_archive_into_one_postgresql_database(pg_url):
    with ExitStack() as stack:
        up = stack.enter_context(servers.FakeProvider("openai", reads(24), max_requests=200))
        archive = ("NORMANDY_ARCHIVE_URL", pg_url)
        first, one, one_log = stack.enter_context(serve_process(root_of(up), archive))
        second, two, two_log = stack.enter_context(serve_process(root_of(up), archive))
        for origin, session in ((first, "agent-a"), (second, "agent-b")):
            client = openai.OpenAI(
                base_url=origin + "/v1",
                api_key=KEY,
                max_retries=0,
                default_headers={"X-Normandy-Session": session},
            )
            chat_agent(client, 12)
        for proc, log in ((one, one_log), (two, two_log)):
            proc.send_signal(signal.SIGTERM)
            # uvicorn shuts down, then ends the process by the signal it was sent
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
            text = "".join(log)
            assert "Application shutdown complete" in text
            assert "compacted openai request of session agent-" in text
            assert "Traceback" not in text
    archive = open_archive(pg_url)
    try:
        found = {a.session_id for a in archive.list(limit=1000)}
        assert found == {"agent-a", "agent-b"}
        # the upstream's one script: agent-a read f0..f11, agent-b f12..f23
        assert archive.search("line 3 of f0.py", session_id="agent-a")
        assert archive.search("line 3 of f12.py", session_id="agent-b")
    finally:
        archive.close()


def test_several_worker_processes_serve_one_port_and_archive_once(tmp_path):
    path = tmp_path / "workers.sqlite3"
    agents = [f"agent-{k}" for k in range(4)]
    with ExitStack() as stack:
        up = stack.enter_context(servers.FakeProvider("openai", reads(48), max_requests=400))
        archive = ("NORMANDY_ARCHIVE_PATH", str(path))
        origin, proc, log = stack.enter_context(
            serve_process(root_of(up), archive, "--workers", "2")
        )
        for session in agents:
            # A connection per request, so the kernel hands each to either worker and a
            # conversation may continue on the other one (compacted from scratch there).
            client = openai.OpenAI(
                base_url=origin + "/v1",
                api_key=KEY,
                max_retries=0,
                default_headers={"X-Normandy-Session": session, "Connection": "close"},
            )
            chat_agent(client, 12)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    text = "".join(log)
    workers = set(_WORKER.findall(text))
    assert len(workers) == 2, text
    assert text.count("Application shutdown complete") == 2
    assert "Traceback" not in text
    served = {(pid, session) for pid, session in _COMPACTED.findall(text)}
    assert {pid for pid, _ in served} <= workers
    assert {session for _, session in served} == set(agents)
    assert up.refusals == []  # every request whole: no orphaned pair reached the upstream
    found = open_archive(path)
    try:
        entries = found.list(limit=5000)
        assert {a.session_id for a in entries} == set(agents)
        # A file's read is stored once, whichever worker dropped it and however often.
        for session, start in zip(agents, range(0, 48, 12), strict=True):
            line = f"line 3 of f{start}.py:"
            rows = [a for a in entries if a.session_id == session and line in a.entry_json]
            assert len(rows) == 1
    finally:
        found.close()
