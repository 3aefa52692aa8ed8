"""Word stems, so that full-text search finds a word in any of its inflections.

Recall's sources (the archive's SQLite and PostgreSQL indexes) index the stems of what
they store and search for the stems of the query's words; recall's excerpts look for
the same stems in the text they show. One definition of a word and one stemmer (the
Snowball English stemmer of PyStemmer) serve all of them, so they always agree.

A *word* is a run of letters and digits, lower-cased (as SQLite's ``unicode61``
tokenizer splits text: every other character separates words). ``timeouts=30`` holds
the words ``timeouts`` and ``30``, whose stems are ``timeout`` and ``30``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import Stemmer

__all__ = ["LANGUAGE", "WORD", "stem_text", "stem_words", "words"]

#: The Snowball algorithm used (English: agents' tool output and code are mostly English;
#: other languages' words pass through it mostly unchanged, and still match themselves).
LANGUAGE = "english"
#: A word: letters and digits (``_`` and every other character separate words).
WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """The words of ``text``, lower-cased, in order."""
    return WORD.findall(text.lower())


def stem_words(found: Iterable[str]) -> list[str]:
    """The stem of each of ``found`` (lower-cased words), in order.

    Each distinct word is stemmed once. A stemmer object is made per call: PyStemmer's
    are not safe to share between threads, and one costs well under a microsecond.
    """
    found = list(found)
    distinct = list(dict.fromkeys(found))
    stems = dict(zip(distinct, Stemmer.Stemmer(LANGUAGE).stemWords(distinct), strict=True))
    return [stems[w] for w in found]


def stem_text(text: str) -> str:
    """``text`` as the stems of its words, separated by single spaces: what is indexed."""
    return " ".join(stem_words(words(text)))
