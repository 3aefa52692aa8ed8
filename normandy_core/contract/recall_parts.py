"""The parts of an archived entry's text that recall by meaning embeds, one vector each.

One vector of a whole entry represents its start: an embedding model reads a few hundred
tokens at most, and a fact that is one line of a long tool output is lost in the rest of
it. So an entry's searchable text is cut into :func:`parts`, runs of whole lines of at
most :data:`PART_CHARS` characters (a line longer than that is cut into pieces of that
size), each embedded alone. The entry is as close to a query as its closest part, and
recall's excerpt of it is centred on that part (:attr:`~normandy_core.RecallHit.near`).

A source that keeps vectors cuts each block of an entry (each tool result of a batch
apart, so no part runs across two) with :func:`parts`, and cuts it the same way again to
name the part its ranking chose: the parts are a function of the text alone, never
stored (the SQLite archive's ``searchable_parts``).
"""

from __future__ import annotations

__all__ = ["MAX_PARTS", "PART_CHARS", "parts", "parts_key"]

#: The most characters of one part: about 150 tokens of prose or code, within what small
#: sentence models read whole (256 tokens for all-MiniLM-L6-v2).
PART_CHARS = 600
#: The most parts of one entry that are embedded: the rest of a very long output (past
#: about 19,000 characters) is found by its keywords only.
MAX_PARTS = 32


def parts(text: str) -> list[str]:
    """``text`` as runs of whole lines of at most :data:`PART_CHARS` characters (a longer
    line cut into pieces of that size), blank runs left out, at most :data:`MAX_PARTS`;
    a text with no other character than blanks is its own one part."""
    out: list[str] = []
    run: list[str] = []
    size = 0

    def close() -> None:
        nonlocal size
        if run and any(line.strip() for line in run):
            out.append("\n".join(run))
        run.clear()
        size = 0

    for line in text.split("\n"):
        while len(line) > PART_CHARS:
            close()
            out.append(line[:PART_CHARS])
            line = line[PART_CHARS:]
        if run and size + len(line) + 1 > PART_CHARS:
            close()
        run.append(line)
        size += len(line) + 1
        if len(out) >= MAX_PARTS:
            break
    close()
    return out[:MAX_PARTS] or [text]


def parts_key(embedder_key: str) -> str:
    """The key the vectors of an embedder (of key ``embedder_key``) are kept under: the
    embedder's key and how texts are cut into parts, so that vectors of other parts (an
    earlier rule) are never compared with these."""
    return f"{embedder_key} parts<={PART_CHARS}"
