"""Build a tool-using conversation, compact it with a compactor chosen by name, print the meta."""

from __future__ import annotations

import argparse
import json

from normandy_core import AgentConfig, ToolResultBlock, ToolUseBlock, run_compaction


def build(acc: AgentConfig, batches: int) -> None:
    """Append ``batches`` tool rounds of realistic size to the conversation."""
    mem = acc.memory
    mem.add_message("user", "Find why the test suite fails and fix it.", turn_id="t1")
    for i in range(batches):
        use = ToolUseBlock(id=f"call_{i}", name="read_file", input={"path": f"src/mod_{i}.py"})
        mem.add_message("assistant", (use,), turn_id="t1")
        body = "\n".join(f"def f_{i}_{k}(x):\n    return x * {k}  # line {k}" for k in range(60))
        mem.add_message("user", (ToolResultBlock(tool_use_id=use.id, content=body),), turn_id="t1")


def main() -> None:
    """Compact a generated conversation and print what happened."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compactor", default="window_manager")
    parser.add_argument("--window", type=int, default=16_000)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    opts = {"context_window": args.window} if args.compactor != "noop" else {}
    acc = AgentConfig(model="claude-sonnet-4-5", compactor=args.compactor, compactor_opts=opts)
    build(acc, args.batches)
    new_acc, meta = run_compaction(acc, mid_round=True, turn_id="t1")
    shown = {k: v for k, v in meta.items() if k != "dropped"}
    shown["dropped"] = len(meta.get("dropped", []))
    print(f"compactor {args.compactor!r}: {len(acc.memory)} entries -> {len(new_acc.memory)}")
    print(json.dumps(shown, indent=2))


if __name__ == "__main__":
    main()
