"""Embedders: plugins that turn texts into vectors, for recall by meaning.

An embedder is an entry point of the group :data:`EMBEDDER_GROUP`
(``normandy_core.embedders``) whose object is a factory: called with the embedder's
options as keywords, it returns an :class:`Embedder`. It is chosen by name in
configuration (the archive's ``embedder`` setting), as compactors are, and resolved only
when something asks for it, so one nobody selected never loads.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from normandy_core.errors import PluginError, PluginLoadError, closest_name

__all__ = [
    "EMBEDDER_GROUP",
    "Embedder",
    "EmbedderError",
    "UnknownEmbedderError",
    "installed_embedders",
    "resolve_embedder",
]

#: The entry-point group of embedders: ``name = "module:factory"``.
EMBEDDER_GROUP = "normandy_core.embedders"


@runtime_checkable
class Embedder(Protocol):
    """What an embedder's factory returns."""

    #: What identifies its vectors (model and the settings that change them): vectors of
    #: two keys are never compared.
    key: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order, all of one length."""
        ...


class EmbedderError(PluginError, ValueError):
    """An embedder that could not be made: it failed to import, refused its options, or
    made something that is not an :class:`Embedder`. The message names it."""


class UnknownEmbedderError(PluginError, LookupError):
    """No installed embedder has the configured name; the message lists those installed
    and suggests the closest."""

    def __init__(self, name: str, installed: Sequence[str]) -> None:
        self.name = name
        self.installed = list(installed)
        close = closest_name(name, installed, cutoff=0.5)
        hint = f"; did you mean {close!r}?" if close else "."
        listed = ", ".join(repr(n) for n in installed) or "none"
        super().__init__(
            f"unknown embedder {name!r}{hint} Installed embedders: {listed}. An embedder is "
            f"an entry point in the {EMBEDDER_GROUP!r} group of an installed distribution "
            "(normandy-embed-bert provides 'bert')."
        )


def _entry_points() -> dict[str, md.EntryPoint]:
    return {ep.name: ep for ep in md.entry_points(group=EMBEDDER_GROUP)}


def installed_embedders() -> list[str]:
    """The names of the installed embedders."""
    return sorted(_entry_points())


def _describe(ep: md.EntryPoint) -> str:
    dist = ep.dist
    origin = f"{dist.name} {dist.version}" if dist is not None else ep.value
    return f"embedder {ep.name!r} (group {EMBEDDER_GROUP}) from {origin}"


def resolve_embedder(name: str, options: Mapping[str, Any] | None = None) -> Embedder:
    """The embedder registered under ``name``, made with ``options``.

    :raises UnknownEmbedderError: no installed embedder has that name.
    :raises PluginLoadError: it failed to import (the cause chained).
    :raises EmbedderError: it refused its options, or made no :class:`Embedder`.
    """
    ep = _entry_points().get(name)
    if ep is None:
        raise UnknownEmbedderError(name, installed_embedders())
    what = _describe(ep)
    try:
        factory = ep.load()
    except Exception as exc:
        raise PluginLoadError(f"{what} failed to import: {type(exc).__name__}: {exc}") from exc
    try:
        made = factory(**dict(options or {}))
    except (TypeError, ValueError) as exc:
        raise EmbedderError(f"{what} refused its options {dict(options or {})!r}: {exc}") from exc
    if not isinstance(made, Embedder):
        raise EmbedderError(f"{what} made a {type(made).__name__}, not an Embedder")
    return made
