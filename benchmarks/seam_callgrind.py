"""Instructions of the non-compacting boundaries of ``benchmarks.seam`` (issue 11) and of
their exact floor, for callgrind: a noise-free before/after of the seam's overhead.

``PYTHONHASHSEED=0 valgrind --tool=callgrind --toggle-collect=sys_call_tracing python -m
benchmarks.seam_callgrind ARM [size] [count]`` (with ``NORMANDY_ARCHIVE_PATH`` set to a
scratch path or ``off``). Only what runs inside ``sys.call_tracing`` is counted; the
setup, the appends and the garbage collection before each measured call are not.

* ``turn_start`` / ``tool_batch``: as :func:`benchmarks.seam.boundaries`, ``size``
  messages of history counted once, then ``count`` rounds of a user message (a turn
  start) and a tool batch, each appended and followed by ``run_compaction``, after one
  such round unmeasured; the boundaries of the arm's kind are counted. ``floor`` /
  ``floor_tool``: the same rounds, counting the arm's new messages with raw tiktoken
  instead (nothing else counted).
* ``run_turn``: as :func:`benchmarks.seam.run_turn_boundaries`, ``count`` whole
  ``run_turn`` calls of ``size`` tool batches each (a warm-up turn first, not counted);
  ``floor_run_turn``: raw tiktoken over exactly the messages each turn appends.

Every arm prints ``measured N boundaries``: divide the instructions callgrind collected
by N, and subtract the floor arm's figure to get the overhead per boundary. Run each arm
as its own process (defaults: 1,000 messages and 150 rounds; 8 batches and 20 turns).
"""

from __future__ import annotations

import functools
import gc
import sys
from typing import Any

from benchmarks.common import raw_entry_tokens

ARMS = ("floor", "turn_start", "floor_tool", "tool_batch", "floor_run_turn", "run_turn")


def _traced(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` inside ``sys.call_tracing``, the only code callgrind counts
    (after a collection, so no garbage of the setup is collected inside it)."""
    gc.collect()
    return sys.call_tracing(functools.partial(fn, *args, **kwargs), ())


def _count_raw(enc: Any, entries: list[Any]) -> None:
    """The floor: each entry counted with raw tiktoken, as ``benchmarks.seam`` times it."""
    for e in entries:
        raw_entry_tokens(enc, e)


def boundaries(arm: str, size: int, count: int) -> int:
    """The boundaries (or their floor) of one kind; how many were counted."""
    from benchmarks.common import append, raw_encoding, workload
    from benchmarks.seam import _config
    from normandy_core import AgentMemory, Entry, get_counter, run_compaction

    enc = raw_encoding()
    counter = get_counter("cl100k_base")
    wl = workload(size, extra=(count + 1) * 6 + 64)
    memory = AgentMemory.from_entries(wl.history)
    memory.tokens(counter)
    acc = _config(memory, context_window=10**12, reserved_tokens=0)
    batches = wl.batches()
    kind = "start" if arm in ("floor", "turn_start") else "tool"
    floor = arm.startswith("floor")
    counted = 0
    for n in range(count + 1):  # the first round warms up (imports, first ctx), unmeasured
        batch = next(batches)
        user = Entry(id=f"u-{n}-{batch[0].id}", role="user", content=batch[-1].text()[:400])
        for this, entries, mid in (("start", [user], False), ("tool", batch, True)):
            measured = this == kind and n > 0
            if measured and floor:
                _traced(_count_raw, enc, entries)
            append(memory, entries)
            if measured and not floor:
                acc, meta = _traced(run_compaction, acc, mid_round=mid)
            else:
                acc, meta = run_compaction(acc, mid_round=mid)
            assert not meta["compacted"] and "error" not in meta, meta
            counted += measured
    return counted


def turns(arm: str, batches_per_turn: int, count: int) -> int:
    """Whole ``run_turn`` calls (or their floor); how many boundaries they had."""
    from benchmarks.common import raw_encoding
    from benchmarks.seam import turn_agent
    from normandy_core.clients.scripted import ScriptedClient
    from normandy_core.turn import run_turn

    enc = raw_encoding()
    scripts, outputs, tools, acc = turn_agent(count, batches_per_turn)
    counted = 0
    for n, script in enumerate(scripts):
        client = ScriptedClient(script.replies, model="gpt-4o")
        outputs.extend(script.outputs)
        call = functools.partial(
            run_turn, acc, script.user, client=client, tools=tools, turn_id=script.turn_id
        )
        warm = n == 0
        if arm == "floor_run_turn" and not warm:
            _traced(_count_raw, enc, script.expected)
        result = call() if warm or arm != "run_turn" else _traced(call)
        assert result.reason == "answer" and not outputs, (result.reason, len(outputs))
        acc = result.acc
        if not warm:
            counted += sum(1 for e in result.events if e.get("type") == "boundary")
    return counted


def main(argv: list[str] | None = None) -> int:
    """Run one arm; print how many boundaries were counted."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ARMS:
        raise SystemExit(f"usage: python -m benchmarks.seam_callgrind {'|'.join(ARMS)} [n] [m]")
    arm = args[0]
    if arm.endswith("run_turn"):
        per_turn = int(args[1]) if len(args) > 1 else 8
        n = turns(arm, per_turn, int(args[2]) if len(args) > 2 else 20)
    else:
        size = int(args[1]) if len(args) > 1 else 1_000
        n = boundaries(arm, size, int(args[2]) if len(args) > 2 else 150)
    print("measured", n, "boundaries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
