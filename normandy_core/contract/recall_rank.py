"""How recall orders what its sources found: coverage of the query, recency among
near-equal matches, values a later message superseded, near-identical hits once.

The sources rank by their full-text score (bm25, ``ts_rank``), which weighs a long
entry down and knows nothing of time. :func:`rank` orders their hits for the agent:

1. **coverage weighted by rarity**: the hits holding the query's terms that weigh most
   first (a term is matched by its word stems, as the sources match it, :class:`Terms`;
   it weighs its inverse document frequency among the hits found, :func:`rarity`, so a
   word most of them hold, ``how`` or ``file``, counts for little beside one few hold;
   two neighbouring terms a hit holds side by side count as one more, their *pair*);
2. **superseded last**: among hits of equal weighted coverage, one whose setting a later
   message changed (:func:`supersede`) comes after the others;
3. **the sources' order**, except that **near-equal** hits, those matching the *same
   set* of the query's terms (nothing the query asked tells them apart), trade places
   among the places they hold so that the one archived later comes first.

:func:`dedupe` keeps one of near-identical hits (:func:`near_identical`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence

from normandy_core.contract.types import RecallHit
from normandy_core.conversation.entries import Entry, TextBlock
from normandy_core.conversation.stems import stem_text, stem_words, words

__all__ = [
    "MIN_FUZZY_WORDS",
    "NEAR_IDENTICAL",
    "Terms",
    "assignments",
    "RRF_K",
    "dedupe",
    "fuse",
    "held_share",
    "near_identical",
    "rank",
    "rarity",
    "standout",
    "successors_first",
    "supersede",
]

#: Entries of fewer words than this are near-identical only when their words are equal:
#: short lines that differ by a word or two (a job, a region) are different facts.
MIN_FUZZY_WORDS = 24
#: The share of word trigrams two longer entries must have in common (Jaccard) to be
#: near-identical: the same file read twice with a line changed, the same output again.
NEAR_IDENTICAL = 0.9

#: ``set timeout to 30``, ``change the timeout to 30`` (the key: a word with ``_ . -``).
_SET_TO = re.compile(
    r"\b(?:set|change|switch|make)\s+(?:the\s+)?([A-Za-z][\w.-]*)\s+to\s+([^\s,;]+)",
    re.IGNORECASE,
)
#: ``timeout=30``, ``timeout = 30``, ``timeout := 30``.
_EQUALS = re.compile(r"\b([A-Za-z][\w.-]*)\s*:?=\s*([^\s,;]+)")


#: Decimal places a coverage is compared at: two hits whose weights differ by rounding
#: alone (different sets of equal rarity) are equal, and the sources' order decides.
_PLACES = 9

#: Reciprocal rank fusion's constant: a hit's score from one ranking is 1/(RRF_K + rank),
#: so the first few places of either ranking weigh about alike (the usual 60).
RRF_K = 60


def fuse(
    *rankings: Sequence[int],
    k: int = RRF_K,
    weights: Sequence[Mapping[int, float] | None] = (),
) -> list[int]:
    """Reciprocal rank fusion of ``rankings`` (each a best-first list of distinct items):
    every item of any of them, by the sum of ``w / (k + place)`` over the rankings that
    hold it (places from 1; ``w`` the item's weight in that ranking, ``weights[j]`` for
    the ``j``-th, 1 where none is given), ties in the order of first appearance (the
    first ranking first). With one ranking and no weights, it is returned unchanged."""
    score: dict[int, float] = {}
    for j, ranking in enumerate(rankings):
        weight = weights[j] if j < len(weights) else None
        for place, item in enumerate(ranking, 1):
            w = 1.0 if weight is None else weight.get(item, 1.0)
            score[item] = score.get(item, 0.0) + w / (k + place)
    seen = list(dict.fromkeys(i for r in rankings for i in r))
    first = {item: at for at, item in enumerate(seen)}
    return sorted(seen, key=lambda i: (-score[i], first[i]))


def rarity(holding: int, searched: int) -> float:
    """How much a term that ``holding`` of ``searched`` texts hold tells them apart: its
    inverse document frequency ``log(searched / holding)`` (0 when every text holds it,
    and for a term none holds, which matches nothing anyway).

    Recall counts it among the hits its sources found for the query, not over the whole
    archive: those hits are what the ranking must tell apart, they are at hand without
    asking every source for statistics of its index (a hook no source has), and a word
    that fills a source's answer (``how`` in every docstring of a batch of file reads)
    is common there whether or not it is common in the archive."""
    if holding <= 0 or searched <= holding:
        return 0.0
    return math.log(searched / holding)


class Terms:
    """The query's terms as their word stems: which of them a text holds, and what each
    weighs (1 each, until :meth:`weighed` by their rarity among what was searched).

    With ``adjacent``, each two neighbouring terms of the query are a term too (their
    *pair*), which a text holds where it has them side by side, in either order: words
    the query puts together and a text also puts together (``auth sessions`` in
    ``src/auth/sessions/totals.py``) are stronger evidence than the same words far apart
    in a long output. A pair weighs its own rarity, so one that every hit holds adds
    nothing, and one that no hit holds counts for nothing in :func:`held_share`."""

    def __init__(self, terms: Iterable[str], *, adjacent: bool = False) -> None:
        stems = tuple(dict.fromkeys(p for p in (stem_text(t) for t in terms) if p))
        paired = itertools.pairwise(stems) if adjacent else ()
        self.pairs: dict[str, str] = {  # a pair's phrase -> the same words swapped
            f"{a} {b}": f"{b} {a}" for a, b in paired if f"{a} {b}" not in stems
        }
        self.phrases: tuple[str, ...] = (*stems, *self.pairs)
        self.weights: dict[str, float] = dict.fromkeys(self.phrases, 1.0)

    def weighed(self, matched: Sequence[frozenset[str]]) -> Terms:
        """These terms weighted by their :func:`rarity` among texts that hold the sets
        ``matched`` (:meth:`matched` of each): the hits a search found, so a word most
        of them hold (``how``, ``file``) counts for little beside one few hold."""
        n = len(matched)
        return self.reweighed({p: rarity(sum(p in m for m in matched), n) for p in self.phrases})

    def reweighed(self, weights: Mapping[str, float]) -> Terms:
        """These terms weighing as ``weights`` says (keyed by stem phrase; 1 for a term
        it does not name, 0 for a pair: a pair is evidence by its rarity alone): another
        query's weights carried over to its terms."""
        out = copy.copy(self)
        out.weights = {p: weights.get(p, 0.0 if p in self.pairs else 1.0) for p in self.phrases}
        return out

    def weight(self, matched: Iterable[str]) -> float:
        """The summed weight of the terms ``matched`` (exactly rounded, so equal sets
        weigh exactly alike whatever their order)."""
        return math.fsum(self.weights[p] for p in matched)

    def matched(self, text: str) -> frozenset[str]:
        """The terms (their stem phrases) ``text`` holds, each as a whole word or phrase."""
        return self.matched_stems(stem_text(text))

    def matched_stems(self, stems: str) -> frozenset[str]:
        """:meth:`matched` of a text already stemmed (:func:`stem_text`)."""
        padded = f" {stems} "
        return frozenset(
            p
            for p in self.phrases
            if f" {p} " in padded or (p in self.pairs and f" {self.pairs[p]} " in padded)
        )

    def stems(self) -> frozenset[str]:
        """Every stem of every term."""
        return frozenset(s for p in self.phrases for s in p.split())


def held_share(terms: Terms, matched: Sequence[frozenset[str]]) -> list[float]:
    """How much of the query each of the texts that hold the sets ``matched`` holds, from
    0 to 1: the weight of its terms over the weight of all the query's terms, where a term
    no text holds weighs as much as one a single text of one more would hold. A question
    asked in other words is made of such terms: a text holding its one common word holds
    little of it."""
    n = len(matched)
    unheld = rarity(1, n + 1)
    held_by_any = frozenset().union(*matched) if matched else frozenset()
    # a pair no text holds is the query's words apart, counted already as its terms
    total = math.fsum(
        terms.weights[p] if p in held_by_any else 0.0 if p in terms.pairs else unheld
        for p in terms.phrases
    )
    if not total:  # every hit holds every term it can: by how many of the terms it holds
        asked = [p for p in terms.phrases if p not in terms.pairs]
        return [len(m - terms.pairs.keys()) / max(len(asked), 1) for m in matched]
    return [terms.weight(m) / total for m in matched]


def standout(similarities: Sequence[float | None]) -> list[float]:
    """What each hit of a ranking by meaning weighs in the fusion (:func:`fuse`), given
    how close each is to the query (a cosine, ``None`` where its source gave none): how
    much closer than the median of them it is, 0 at or below it.

    A cosine's level differs by model and by query (a small sentence model gives 0.4 to
    texts that share nothing with a query but its topic), so its value alone is no
    evidence; a hit that stands out from the others the query drew is. A ranking whose
    hits are all about as close tells little, and then the keyword ranking decides. When
    a source gave no similarity, every hit weighs 1: its place alone speaks."""
    if any(s is None for s in similarities):
        return [1.0] * len(similarities)
    given = [s for s in similarities if s is not None]  # all of them (for the type checker)
    median = statistics.median(given) if given else 0.0
    return [max(s - median, 0.0) for s in given]


def _said(entry: Entry) -> str:
    """What the user or the assistant wrote in ``entry`` (not tool calls or results)."""
    if entry.role not in ("user", "assistant"):
        return ""
    if isinstance(entry.content, str):
        return entry.content
    return "\n".join(b.text for b in entry.content if isinstance(b, TextBlock))


def assignments(entry: Entry) -> dict[str, str]:
    """The settings ``entry``'s user or assistant text gives, ``key -> value`` (keys
    lower-cased, the last value of a key kept). Tool calls and results are left out:
    ``job=nightly`` in a log line is an observation, not a setting."""
    text = _said(entry)
    found: dict[str, str] = {}
    for pattern in (_EQUALS, _SET_TO):
        for m in pattern.finditer(text):
            found[m.group(1).lower()] = m.group(2).rstrip(".:!?)'\"")
    return found


def supersede(hits: Sequence[RecallHit], later: Sequence[Entry]) -> list[RecallHit]:
    """``hits`` with ``superseded`` set: the keys each sets that a later hit (by
    :func:`_recency`) or an entry of ``later`` (what the model still sees, taken as
    newer than anything archived) sets to another value, with that newest value."""
    newest: dict[str, tuple[tuple[float, int], str]] = {}
    top = (float("inf"), 0)
    for at, e in [*((_recency(h), h.entry) for h in hits), *((top, e) for e in later)]:
        for key, value in assignments(e).items():
            if key not in newest or newest[key][0] <= at:
                newest[key] = (at, value)
    out = []
    for h in hits:
        mine = assignments(h.entry)
        gone = {
            k: newest[k][1]
            for k, v in mine.items()
            if newest[k][1] != v and newest[k][0] > _recency(h)
        }
        out.append(dataclasses.replace(h, superseded=gone) if gone else h)
    return out


def _recency(hit: RecallHit) -> tuple[float, int]:
    """When ``hit`` was archived, then its place in the archive order."""
    return (hit.archived_at or 0.0, hit.order if hit.order is not None else 0)


def rank(
    hits: Sequence[RecallHit],
    terms: Terms,
    texts: Sequence[str],
    matched: Sequence[frozenset[str]] | None = None,
) -> list[int]:
    """The order recall shows ``hits`` in (the sources' order, each with its searchable
    text in ``texts``), as indexes: coverage weighted by rarity, superseded last, the
    sources' order; then near-equal hits (matching the same set of the query's terms,
    superseded alike) trade places so that the newer of them comes first.

    Coverage is the summed :func:`rarity` of the terms a hit holds, counted among these
    hits (``terms`` re-:meth:`~Terms.weighed` by ``matched``, the terms each text holds,
    computed when not given): the hits are what the search found for this very query,
    so a term they nearly all hold is the one that tells them apart least. A term every
    hit holds weighs nothing and leaves the order as it was."""
    held = list(matched) if matched is not None else [terms.matched(t) for t in texts]
    weighed = terms.weighed(held)
    score = [round(weighed.weight(m), _PLACES) for m in held]
    order = sorted(range(len(hits)), key=lambda i: (-score[i], bool(hits[i].superseded), i))
    groups: dict[tuple[frozenset[str], bool], list[int]] = {}
    for slot, i in enumerate(order):
        groups.setdefault((held[i], bool(hits[i].superseded)), []).append(slot)
    out = list(order)
    for slots in groups.values():
        members = sorted((order[s] for s in slots), key=lambda i: (_newer(hits[i]), i))
        for slot, i in zip(slots, members, strict=True):
            out[slot] = i
    return out


def successors_first(hits: Sequence[RecallHit], order: Sequence[int]) -> list[int]:
    """``order`` (indexes of ``hits``) with each superseded hit moved to right after the
    hit in it that gives one of its keys the newer value (after that one's own stale
    values, newest first): another ranking (by meaning) knows nothing of time, and a
    stale value must not be read before the value that replaced it."""
    gives = {  # index -> the (key, value) pairs it gives that nothing superseded
        i: {(k, v) for k, v in assignments(hits[i].entry).items() if k not in hits[i].superseded}
        for i in order
    }
    pos = {i: at for at, i in enumerate(order)}

    def anchor(i: int, seen: frozenset[int]) -> tuple[int, int]:
        """Where ``i`` goes: its successor's place (followed to the newest), and how
        many values stand between them."""
        wanted = set(hits[i].superseded.items())
        if not wanted:  # most hits: no pass over the others
            return pos[i], 0
        j = next((j for j in order if j not in seen and wanted & gives[j]), None)
        if j is None:
            return pos[i], 0
        at, depth = anchor(j, seen | {j})
        return at, depth + 1

    return sorted(order, key=lambda i: (*anchor(i, frozenset({i})), pos[i]))


def _newer(hit: RecallHit) -> tuple[float, int]:
    """A sort key putting the later archived first (unknown times: as the oldest)."""
    at, seq = _recency(hit)
    return (-at, -seq)


class _Said:
    """What :func:`near_identical` compares of one text, computed once."""

    def __init__(self, text: str) -> None:
        self.words = tuple(words(text))
        long = len(self.words) >= MIN_FUZZY_WORDS
        found = stem_words(self.words) if long else []
        self.shingles = {tuple(found[i : i + 3]) for i in range(len(found) - 2)} if long else None

    def like(self, other: _Said) -> bool:
        if self.words == other.words:
            return True
        if self.shingles is None or other.shingles is None:
            return False
        common = len(self.shingles & other.shingles)
        return common >= NEAR_IDENTICAL * (len(self.shingles) + len(other.shingles) - common)


def near_identical(a: str, b: str) -> bool:
    """Whether texts ``a`` and ``b`` say the same: the same words (case and punctuation
    aside), or, both of :data:`MIN_FUZZY_WORDS` words or more, at least
    :data:`NEAR_IDENTICAL` of their word trigrams in common."""
    return _Said(a).like(_Said(b))


def dedupe(
    hits: Sequence[RecallHit], texts: Sequence[str], most: int | None = None
) -> tuple[list[RecallHit], int]:
    """``hits`` without those near-identical to one kept before them (each with its text
    in ``texts``), at most ``most`` of them, and how many were left out on the way (none
    after the last kept is looked at). Applying it again changes nothing."""
    kept: list[RecallHit] = []
    said: list[_Said] = []
    seen: set[tuple[str, ...]] = set()
    left = 0
    for h, t in zip(hits, texts, strict=True):
        if most is not None and len(kept) >= most:
            break
        this = _Said(t)
        if this.words in seen or (
            this.shingles is not None and any(this.like(other) for other in said)
        ):
            left += 1
            continue
        seen.add(this.words)
        kept.append(h)
        if this.shingles is not None:
            said.append(this)
    return kept, left
