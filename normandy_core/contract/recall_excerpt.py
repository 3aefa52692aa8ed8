"""Excerpts: the lines of a long entry that match the query best, with a line of context
each side, instead of the entry cut from its start.

A long tool output (a log, a batch of file reads) that matched a recall on one line
would otherwise take the whole bound from its first line on, and the matching line
would be cut off. :func:`excerpt` keeps the lines holding the query's terms that weigh
most (by their word stems and their rarity among the hits found,
:class:`~normandy_core.contract.recall_rank.Terms`), the earlier first among equals,
each with its neighbours, in their order, and says how many lines were left out between
them. A line too long to keep whole is cut to a window around its
first matching word.
"""

from __future__ import annotations

from normandy_core.contract.recall_rank import Terms
from normandy_core.conversation.stems import WORD, stem_words, words

__all__ = ["CONTEXT_LINES", "MIN_EXCERPT_CHARS", "Excerpts", "excerpt"]

#: Lines kept each side of a matching line.
CONTEXT_LINES = 1
#: The smallest bound :func:`excerpt` fills: a note of what was left out takes about 30
#: characters, and a line may need one before and one after it.
MIN_EXCERPT_CHARS = 160


def _gap(n: int) -> str:
    return f"[... {n:,} line{'s' if n != 1 else ''} not shown ...]"


def _window(line: str, stems: frozenset[str], size: int) -> str:
    """``line`` cut to about ``size`` characters around its first word with one of
    ``stems`` (its start when none)."""
    if len(line) <= size:
        return line
    hit = next(
        (m for m in WORD.finditer(line) if stem_words([m.group(0).lower()])[0] in stems), None
    )
    centre = hit.start() if hit else 0
    start = max(0, min(centre - size // 3, len(line) - size))
    lead = "..." if start else ""
    tail = "..." if start + size < len(line) else ""
    return lead + line[start + len(lead) : start + size - len(tail)] + tail


def _held(lines: list[str], terms: Terms) -> list[frozenset[str]]:
    """The terms each line holds (the words of every line stemmed at once)."""
    per_line = [words(line) for line in lines]
    stems = iter(stem_words(w for found in per_line for w in found))
    return [terms.matched_stems(" ".join(next(stems) for _ in found)) for found in per_line]


class Excerpts:
    """The excerpts of one text for one query, of any size (:meth:`within`): the text's
    lines are stemmed and scored once.

    A line's score is the weight of the terms it holds (:meth:`Terms.weight`: their
    rarity among the hits found, when ``terms`` were weighed), then how many it holds:
    a line holding one rare term comes before one holding two words most hits hold. The
    lines of ``near`` (a part of the text, the one closest to the query by meaning),
    where they stand in it, come right after the best lines (those of the highest
    score), before any other."""

    def __init__(self, text: str, terms: Terms, near: str | None = None) -> None:
        self.lines = text.split("\n")
        self.size = len(text)
        held = _held(self.lines, terms)
        self.scores = [(terms.weight(h), len(h)) for h in held]
        ranked = sorted(
            (i for i, h in enumerate(held) if h),
            key=lambda i: (-self.scores[i][0], -self.scores[i][1], i),
        )
        # the part closest by meaning comes right after the lines holding the most of
        # the query's terms (the strongest evidence) and before the rest
        part = [i for i in _where(self.lines, near) if self.lines[i].strip()]
        for i in part:  # kept like a matching line when the excerpt is trimmed
            self.scores[i] = (self.scores[i][0], max(self.scores[i][1], 1))
        top = [i for i in ranked if self.scores[i] == self.scores[ranked[0]]]
        self.best = list(dict.fromkeys([*top, *part, *ranked]))
        self.stems = terms.stems()

    def within(self, max_chars: int) -> str | None:
        """The lines holding the most of the terms, within ``max_chars`` characters (notes
        of the lines left out included); ``None`` when no line holds a term or
        ``max_chars`` is under :data:`MIN_EXCERPT_CHARS`. It always holds a matching
        word: the best line, cut around its match when it is too long."""
        lines, scores, best = self.lines, self.scores, self.best
        if max_chars < MIN_EXCERPT_CHARS or not best:
            return None
        gap = len(_gap(len(lines))) + 1
        used = gap  # the note of the lines left out, before any is chosen
        chosen: dict[int, str] = {}
        for i in best:
            near = range(max(0, i - CONTEXT_LINES), min(len(lines), i + CONTEXT_LINES + 1))
            new = {j: lines[j] for j in near if j not in chosen}
            cost = sum(len(v) + 1 for v in new.values()) + gap  # a window splits a note
            if used + cost <= max_chars:
                chosen.update(new)
                used += cost
            elif not chosen:  # the best line alone, between two notes, cut if need be
                chosen[i] = _window(lines[i], self.stems, max_chars - 2 * gap - 1)
                used += len(chosen[i]) + 1 + gap
        while len(_render(lines, chosen)) > max_chars and len(chosen) > 1:
            chosen.pop(max(chosen, key=lambda j: (scores[j][1] == 0, abs(j - best[0]))))
        return _render(lines, chosen)


def _where(lines: list[str], near: str | None) -> range:
    """Where the lines of ``near`` stand together in ``lines`` (their first place), or
    the line holding ``near`` when it is a piece of one long line; none when neither is
    found, or ``near`` is ``None``."""
    if near is None or not near.strip():
        return range(0)
    part = near.split("\n")
    k = len(part)
    for i in range(len(lines) - k + 1):
        if lines[i] == part[0] and lines[i : i + k] == part:
            return range(i, i + k)
    if k == 1:
        return next((range(i, i + 1) for i, line in enumerate(lines) if near in line), range(0))
    return range(0)


def excerpt(text: str, terms: Terms, max_chars: int) -> str | None:
    """:meth:`Excerpts.within` of ``text`` for ``terms``: its best-matching lines within
    ``max_chars`` characters, or ``None``."""
    return Excerpts(text, terms).within(max_chars)


def _render(lines: list[str], chosen: dict[int, str]) -> str:
    """The chosen lines in order, with a note for each run of lines left out."""
    out: list[str] = []
    at = 0
    for j in sorted(chosen):
        if j > at:
            out.append(_gap(j - at))
        out.append(chosen[j])
        at = j + 1
    if at < len(lines):
        out.append(_gap(len(lines) - at))
    return "\n".join(out)
