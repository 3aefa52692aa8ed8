"""Exceptions raised by Normandy. Every message names what is at fault."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "NormandyError",
    "OptionsError",
    "PluginConflictError",
    "PluginDisabledError",
    "PluginError",
    "PluginLoadError",
    "SettingsError",
    "UnknownCompactorError",
    "WindowUnknownError",
]


class NormandyError(Exception):
    """Base class of every error Normandy raises on purpose."""


class PluginError(NormandyError):
    """A plugin could not be found, loaded or used."""


class UnknownCompactorError(PluginError, LookupError):
    """No installed compactor has the configured name.

    The message lists the installed names and suggests the closest one.
    """

    def __init__(
        self,
        name: str,
        installed: list[str],
        suggestion: str | None,
        *,
        source: str | None = None,
    ) -> None:
        self.name = name
        self.installed = installed
        self.suggestion = suggestion
        #: Where the name was configured (``NORMANDY_COMPACTOR``, a file and key), if not
        #: in code.
        self.source = source
        listed = ", ".join(repr(n) for n in installed) if installed else "none"
        hint = f"; did you mean {suggestion!r}?" if suggestion else "."
        where = f"{source}: " if source else ""
        super().__init__(
            f"{where}unknown compactor {name!r}{hint} Installed compactors: {listed}. "
            "A compactor is an entry point in the 'normandy_core.compactors' group of an "
            "installed distribution (pip install normandy-<name>)."
        )


class PluginLoadError(PluginError):
    """A plugin failed to import or its hook implementations do not match the hookspecs."""


class PluginConflictError(PluginError):
    """Two installed distributions register the same entry-point name in one group."""


class PluginDisabledError(PluginError, LookupError):
    """A plugin exists but NORMANDY_LOAD_PLUGINS or NORMANDY_DISABLE_PLUGINS excludes it."""


class OptionsError(NormandyError, ValueError):
    """A compactor refused its options where the config was made.

    The message begins with the public entry point that made the config, then names the
    compactor, the option and what is allowed.
    """


class SettingsError(OptionsError):
    """A configuration source is unreadable or holds a bad value.

    Raised where the settings are loaded (:mod:`normandy_core.contract.settings`): a
    ``normandy.toml`` or ``pyproject.toml`` that is not valid TOML, an unknown key, a value
    of the wrong type, a ``NORMANDY_COMPACTOR_OPTS`` that is not a JSON object. The message
    begins with the file (and the line, when it can be found) or the environment variable,
    and names the key. Options a compactor refuses raise :class:`OptionsError` naming the
    source the same way; an unknown or broken compactor raises the
    :class:`PluginError` it always raises, prefixed with the source.
    """


class WindowUnknownError(NormandyError, ValueError):
    """A compactor needs a context window that neither its options nor the catalog give."""


# -- "did you mean": the one suggestion every unknown name gets -----------------------------


def closest_name(name: str, known: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The name of ``known`` closest to ``name`` (a likely typo of it), or ``None``.

    Compactor names, settings keys and compactor options are all suggested through here.
    ``cutoff`` is how alike they must be (0 to 1; ``difflib``'s ratio).
    """
    import difflib  # for an error only: a first compaction does not import it

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def unknown_name(name: str, allowed: Iterable[str], what: str = "key") -> str:
    """``unknown key; did you mean 'window'? allowed keys: ...``, for a ``name`` not among
    ``allowed`` (``what`` names the kind: key, option, section)."""
    known = sorted(allowed)
    close = closest_name(name, known)
    hint = f"; did you mean {close!r}?" if close else ";"
    return f"unknown {what}{hint} allowed {what}s: {', '.join(known) or 'none'}"
