"""An earlier extractive digest read back into its items, so a new digest carries them over.

A digest folded whole into the next one nests (a summary of a summary of a summary), and
its items then compete with the new ones as one block of text. Read back, each item
joins the list it came from as an older item: the task stays the task, an error line
stays evidence, and thinning treats them as it treats the new ones.
"""

from __future__ import annotations

import json
import re

from normandy_window_manager.handoff import template_lines

__all__ = ["EARLIER_HEADING", "LABELS", "fold_items"]

#: The heading of an earlier summary the digest could not read back (kept whole).
EARLIER_HEADING = "Earlier summary:"
#: The label of each labelled item of the digest, and the list its items go to.
LABELS = {
    "error": "errors",
    "command": "commands",
    "paths": "paths",
    "ids": "ids",
    "URLs": "URLs",
    "still failing": "failing",
    "no result yet": "pending",
    "last note": "notes",
}
#: Labels whose items are JSON string literals (evidence, quoted).
QUOTED = frozenset({"error", "command", "paths", "ids", "URLs"})
#: The list an unlabelled item of each section goes to.
_UNLABELLED = {"task": "requests", "decisions": "notes", "done": "calls", "earlier": "earlier"}
_NOTE = re.compile(r"\(\d+ older items omitted\)|none found")


def fold_items(body: str, template: str) -> list[tuple[str, str]] | None:
    """``(list, text)`` for each item of ``body``, a digest's text after its header written
    in ``template``, in order; ``None`` when ``body`` is not one (it is then kept whole).
    Notes of the digest's own (items omitted, none found) are left out."""
    headings = _headings(template)
    where: str | None = None
    items: list[tuple[str, str]] = []
    for line in body.split("\n"):
        if line in headings:
            where = headings[line]
            continue
        if where is None or not line.startswith("- "):
            return None
        read = _item(where, line[2:])
        if read is None:
            return None
        items += read
    return items


def _headings(template: str) -> dict[str, str]:
    """Each heading of ``template`` (the line just before a placeholder) and its section."""
    headings = {EARLIER_HEADING: "earlier"}
    before: str | None = None
    for name, line in template_lines(template):
        if name is not None and before is not None:
            headings[before] = name
        before = line if name is None else None
    return headings


def _item(where: str, item: str) -> list[tuple[str, str]] | None:
    """Where an item of section ``where`` goes, with its text (a quoted list: each of its
    strings); ``None`` when it is not one the digest writes."""
    if _NOTE.fullmatch(item):
        return []
    if where in _UNLABELLED:
        return [(_UNLABELLED[where], item)]
    label, _, rest = item.partition(": ")
    if label not in LABELS:
        return None
    if label not in QUOTED:
        return [(LABELS[label], rest)]
    try:
        texts = json.loads(f"[{rest}]")
    except ValueError:
        return None
    if not all(isinstance(text, str) for text in texts):
        return None
    return [(LABELS[label], text) for text in texts]
