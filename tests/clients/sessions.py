"""Conversations and tools shared by the client tests (loaded by ``conftest.py`` as
``normandy_client_test_sessions``)."""

from __future__ import annotations

from typing import Any

from normandy_core import AgentMemory

#: The one tool the client tests' agents declare.
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def read_file(path: str) -> str:
    """The tool: sixty numbered lines of ``path``."""
    return "".join(f"line {k} of {path}: value = {k * 3}\n" for k in range(60))


def reads(n: int, final: str = "Done.") -> list[dict[str, Any]]:
    """A provider script: ``n`` replies each reading a file, then ``final``."""
    return [{"tools": [("read_file", {"path": f"f{k}.py"})]} for k in range(n)] + [{"text": final}]


def big_history(rounds: int, chars: int) -> AgentMemory:
    """A finished exchange of ``rounds`` long answers (about ``chars`` characters each)."""
    mem = AgentMemory()
    mem.add_message("user", "Audit the billing module.", id="task", turn_id="t0")
    for r in range(rounds):
        body = "".join(
            f"[{r}] invoice {i} rounds to {i * 7 % 100} cents\n" for i in range(chars // 40)
        )
        mem.add_message("assistant", f"Finding {r}:\n{body}", id=f"f{r}", turn_id="t0")
        mem.add_message("user", f"Go on after finding {r}.", id=f"g{r}", turn_id="t0")
    mem.add_message("assistant", "That is all of it.", id="end", turn_id="t0")
    return mem
