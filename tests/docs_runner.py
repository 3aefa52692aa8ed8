"""Run the Python blocks of one documentation file, in order, in one namespace.

Started by tests/test_docs_examples.py as ``python docs_runner.py BLOCKS RESULT`` in a
scratch directory, with the archive, ``HOME`` and the providers' base URLs pointed at
temporary places. ``BLOCKS`` is a JSON list of ``{"where", "path", "line", "code",
"given", "needs"}``; each block is compiled under its Markdown file's name with its own
line numbers (so a traceback points at the page) and run with ``exec`` in a namespace
the blocks of the file share, as a reader runs them one after the other. ``RESULT``
receives ``{"ran": [where...], "failed": where or null, "error": traceback or null}``.

The names a block may take as the reader's own (``<!-- given: ... -->``) are ``GIVEN``.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any


def _messages(block: dict[str, Any]) -> Any:
    """A coding agent's session as Chat Completions dicts: 245 messages, about 92,000
    tokens, with parallel tool calls (``normandy_core.app.workload``, seed 7)."""
    from normandy_core.app.workload import generate_session
    from normandy_core.transcripts.chat import to_openai

    return to_openai(generate_session(seed=7, messages=150))


def _client(block: dict[str, Any]) -> Any:
    """The model client of the block's ``needs`` provider, made as a reader makes it: the
    SDK finds the (loopback) server and the key in ``*_BASE_URL`` and ``*_API_KEY``."""
    needs = block.get("needs")
    if needs == "anthropic":
        from normandy_core.clients import AnthropicClient

        return AnthropicClient("claude-sonnet-4-5")
    if needs == "openai":
        from normandy_core.clients import OpenAIClient

        return OpenAIClient("gpt-4o")
    raise ValueError(f"{block['where']}: 'given: client' needs a 'needs:' marker")


def _tools(block: dict[str, Any]) -> Any:
    """The reader's tools, as ``run_turn`` takes them: ``{"read_file": read_file}``."""

    def read_file(path: str) -> str:
        """Read a text file of the project."""
        with open(path, encoding="utf-8") as f:
            return f.read()

    return {"read_file": read_file}


_ARCHIVED: dict[str, str] = {}


def _archived(block: dict[str, Any]) -> dict[str, str]:
    """Compact the ``messages`` session once, so the archive holds what was dropped."""
    if not _ARCHIVED:
        from normandy_core import compact

        result = compact(_messages(block), window=32_000).check()
        assert result.archive is not None, "the archive hook recorded nothing"
        _ARCHIVED["entry_id"] = result.dropped[0].id
        _ARCHIVED["session_id"] = str(result.archive["session"])
    return _ARCHIVED


#: What each ``given`` name is bound to; the function's docstring says what it holds.
GIVEN: dict[str, Callable[[dict[str, Any]], Any]] = {
    "messages": _messages,
    "client": _client,
    "tools": _tools,
    "entry_id": lambda block: _archived(block)["entry_id"],  # an entry the archive holds
    "session_id": lambda block: _archived(block)["session_id"],  # that entry's session
}


def main(blocks_path: str, result_path: str) -> int:
    """Run every block; write what ran and the first failure to ``result_path``."""
    with open(blocks_path, encoding="utf-8") as f:
        blocks = json.load(f)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    report: dict[str, Any] = {"ran": [], "failed": None, "error": None}
    for block in blocks:
        try:
            for name in block["given"]:
                namespace[name] = GIVEN[name](block)
            # Line numbers as in the Markdown file: the code starts after the fence.
            source = "\n" * block["line"] + block["code"]
            exec(compile(source, block["path"], "exec"), namespace)
        except BaseException:
            report["failed"] = block["where"]
            report["error"] = traceback.format_exc()
            break
        report["ran"].append(block["where"])
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(report, f)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
