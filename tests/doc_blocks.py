"""The fenced code blocks of README.md and docs/, with the markers the doc tests read.

A block may be preceded by HTML comments (invisible on the rendered page), each on its
own line right above the opening fence:

- ``<!-- needs: anthropic -->`` (or ``openai``): the block calls that provider; the test
  runs it against the loopback stand-in (tests/clients/servers.py), with the SDK's
  ``*_BASE_URL`` and ``*_API_KEY`` pointing there, and fails on any refused request.
- ``<!-- given: messages, client -->``: names the snippet uses as the reader's own
  (their transcript, their client...); the test binds each to a documented value
  (``tests/test_docs_examples.py``, ``GIVEN``) before running the block.
- ``<!-- skip: reason -->``: a deliberately partial block that is not run; the reason is
  required. Keep these few.

A Python or TOML block whose first line is ``# file: DIST/PATH`` is a file of an example
distribution (the plugin guide's): ``guide_files`` writes them out to be installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ROOT", "Block", "blocks", "guide_files", "write_guide_dists"]

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"^<!--\s*(needs|given|skip):\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code and its markers."""

    path: Path
    line: int
    lang: str
    code: str
    markers: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """``docs/x.md:12``, for messages."""
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def file(self) -> str | None:
        """The ``# file:`` path of an example distribution's file, else ``None``."""
        first = self.code.partition("\n")[0]
        return first.removeprefix("# file: ").strip() if first.startswith("# file: ") else None

    @property
    def given(self) -> list[str]:
        """The names of the ``given`` marker."""
        return [n.strip() for n in self.markers.get("given", "").split(",") if n.strip()]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the Markdown file ``path``, in order, with its markers."""
    text = path.read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        markers: dict[str, str] = {}
        above = text[: m.start()].splitlines()
        while above and (mk := _MARKER.match(above[-1].strip())):
            name, value = mk.group(1), mk.group(2)
            if name in markers:
                raise ValueError(f"{path}:{line}: the marker {name!r} is given twice")
            markers[name] = value
            above.pop()
        found.append(Block(path, line, m.group(1), m.group(2), markers))
    return found


def guide_files(path: Path | None = None) -> dict[str, dict[str, str]]:
    """The example distributions of docs/plugin-guide.md: directory -> {file: text}."""
    dists: dict[str, dict[str, str]] = {}
    for block in blocks(path or ROOT / "docs" / "plugin-guide.md"):
        if block.file is not None:
            dist, _, rel = block.file.partition("/")
            body = block.code.partition("\n")[2]
            dists.setdefault(dist, {})[rel] = body
    return dists


def write_guide_dists(root: Path) -> list[Path]:
    """Write the plugin guide's example distributions under ``root``; their directories."""
    written = []
    for dist, files in guide_files().items():
        for rel, body in files.items():
            target = root / dist / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body, encoding="utf-8")
        written.append(root / dist)
    return written
