"""Two ``normandy serve`` processes, as a deployment runs them, sharing one PostgreSQL
archive: each agent's dropped entries land in the one database under its own session;
SIGTERM stops each process cleanly (uvicorn's graceful shutdown, exit status 0)."""

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


@contextmanager
def serve_process(
    upstream: str, archive_url: str
) -> Iterator[tuple[str, subprocess.Popen[str], list[str]]]:
    """``normandy serve`` in a process of its own on a free port, archiving to
    ``archive_url``; yields its origin, the process (stopped by SIGTERM at the end) and
    the lines of its log so far."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NORMANDY_ARCHIVE_")}
    env["NORMANDY_ARCHIVE_URL"] = archive_url
    command = [str(NORMANDY), "serve", "--upstream", upstream, "--port", "0"]
    command += ["--window", str(WINDOW), "--opts", OPTS]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    port: list[str] = []
    ready = threading.Event()

    def read() -> None:  # drains stderr, so the process never blocks on its logs
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if (found := _LISTENING.search(line)) is not None:
                port.append(found[1])
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
        first, one, one_log = stack.enter_context(serve_process(root_of(up), pg_url))
        second, two, two_log = stack.enter_context(serve_process(root_of(up), pg_url))
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
