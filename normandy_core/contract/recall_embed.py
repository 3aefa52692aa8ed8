"""Recall by meaning: which embedder recall uses, configured by name, made once.

Recall ranks by keywords alone unless an embedder is configured:

- in code, ``RecallSettings(embedder="bert", embedder_options={...})`` or the ``embedder``
  argument of :func:`normandy_core.recall`;
- else ``NORMANDY_RECALL_EMBEDDER`` (and ``NORMANDY_RECALL_EMBEDDER_OPTS``, a JSON
  object), or the ``[recall]`` table of ``normandy.toml`` (``[tool.normandy.recall]`` of
  a ``pyproject.toml``): ``embedder = "bert"``, ``embedder_options = {...}``.

``"off"`` in code turns it off whatever is configured. The embedder is resolved from the
``normandy_core.embedders`` entry-point group the first time a recall needs it and kept
for the process (loading a model takes a second); an unknown name, or one whose model
cannot be loaded, raises :class:`~normandy_core.contract.recall_settings.RecallError`
naming it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from normandy_core.contract.embedders import Embedder, resolve_embedder
from normandy_core.contract.recall_settings import RecallError
from normandy_core.contract.settings import (
    SettingKey,
    SettingsSection,
    current_settings,
    highest,
)
from normandy_core.errors import PluginError

__all__ = [
    "ENV_EMBEDDER",
    "ENV_EMBEDDER_OPTS",
    "OFF",
    "SECTION",
    "configured_embedder",
    "embedder_for",
]

#: Environment variable naming the embedder recall fuses with the keyword ranking.
ENV_EMBEDDER = "NORMANDY_RECALL_EMBEDDER"
#: Environment variable holding the embedder's options, a JSON object.
ENV_EMBEDDER_OPTS = "NORMANDY_RECALL_EMBEDDER_OPTS"
#: The embedder name that means none (keywords only), whatever is configured.
OFF = "off"


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"embedder must be an embedder's name (a string), got {value!r}")
    return value.strip()


def _options(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"embedder_options must be a JSON object: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"embedder_options must be a table (an object), got {value!r}")
    return dict(value)


#: The ``[recall]`` table of the settings files and its variables.
SECTION = SettingsSection(
    "recall",
    (
        SettingKey("embedder", _name, ENV_EMBEDDER),
        SettingKey("embedder_options", _options, ENV_EMBEDDER_OPTS),
    ),
)


def configured_embedder() -> tuple[str | None, dict[str, Any]]:
    """The embedder the settings name (``None``: none) and its options."""
    layers = current_settings().section(SECTION)
    named = highest(layers, "embedder")
    name = None if named is None else named.values["embedder"]
    given = highest(layers, "embedder_options")
    return name, dict(given.values["embedder_options"]) if given is not None else {}


_LOCK = threading.Lock()
_MADE: dict[tuple[str, str], Embedder] = {}


def embedder_for(
    name: str | Embedder | None, options: Mapping[str, Any] | None = None
) -> Embedder | None:
    """The embedder recall uses: ``name`` made with ``options`` (an :class:`Embedder`
    is used as it is), the configured one when ``name`` is ``None``, none for ``"off"``
    or when nothing is configured. Made once per name and options.

    :raises RecallError: the embedder is not installed, failed to load, or refused its
        options; the message names it.
    """
    if name is not None and not isinstance(name, str):
        return name
    if name is None:
        name, configured = configured_embedder()
        if name is None:
            return None
        options = configured if options is None else options
    if name == OFF:
        return None
    opts = dict(options or {})
    key = (name, json.dumps(opts, sort_keys=True, default=str))
    with _LOCK:
        made = _MADE.get(key)
        if made is None:
            try:
                made = resolve_embedder(name, opts)
            except PluginError as exc:
                raise RecallError(f"recall's embedder {name!r}: {exc}") from exc
            _MADE[key] = made
        return made
