"""The archive's settings: the ``archive`` section of Normandy's configuration, set in code
for the process, or per call.

Each setting is resolved at every compaction, the first source that sets it winning: per
call (:func:`archive_settings`, a context variable), :func:`configure`, the environment
(the ``ENV_*`` variables), the ``[archive]`` table of ``normandy.toml`` then
``[tool.normandy.archive]`` of ``pyproject.toml`` (read by the core,
:mod:`normandy_core.contract.settings`, checked with :data:`SECTION`), the defaults.
``path`` and ``url`` are one setting, where the archive is: the highest source that sets
either decides (docs/plugins/archive.md, Settings).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from normandy_archive.errors import ArchiveConfigError, ArchiveError
from normandy_core.contract.settings import (
    Layer,
    SettingKey,
    SettingsSection,
    current_settings as current_core_settings,
    highest,
    load_settings,
    working_directory,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "ENV_BUSY_TIMEOUT",
    "ENV_MAX_AGE_DAYS",
    "ENV_MAX_BYTES",
    "ENV_MAX_SESSIONS",
    "ENV_PATH",
    "ENV_REQUIRED",
    "ENV_SESSION",
    "ENV_SYNC",
    "ENV_URL",
    "OFF",
    "SECTION",
    "ArchiveSettings",
    "archive_path",
    "archive_settings",
    "configure",
    "current_settings",
    "default_archive_path",
    "is_url",
    "parse_size",
    "set_archive_path",
]

#: Environment variable naming the archive file (or ``off``).
ENV_PATH = "NORMANDY_ARCHIVE_PATH"
#: Environment variable naming a PostgreSQL archive (``postgresql://...``).
ENV_URL = "NORMANDY_ARCHIVE_URL"
#: Environment variable: ``0``/``false``/``no``/``off`` makes the archive best-effort.
ENV_REQUIRED = "NORMANDY_ARCHIVE_REQUIRED"
#: Environment variable: seconds a write waits for another writer's lock (default 5).
ENV_BUSY_TIMEOUT = "NORMANDY_ARCHIVE_BUSY_TIMEOUT"
#: Environment variable: the session key archived rows carry (default: the config's).
ENV_SESSION = "NORMANDY_ARCHIVE_SESSION"
#: Environment variable: the size (``500MB``, ``2GiB``, bytes) past which sessions are pruned.
ENV_MAX_BYTES = "NORMANDY_ARCHIVE_MAX_BYTES"
#: Environment variable: the age in days past which sessions are pruned.
ENV_MAX_AGE_DAYS = "NORMANDY_ARCHIVE_MAX_AGE_DAYS"
#: Environment variable: at most this many sessions are kept, the most recent ones.
ENV_MAX_SESSIONS = "NORMANDY_ARCHIVE_MAX_SESSIONS"
#: Environment variable: ``normal`` (the default) or ``full`` (:attr:`ArchiveSettings.sync`).
ENV_SYNC = "NORMANDY_ARCHIVE_SYNC"

#: The value of ``path`` (and of :data:`ENV_PATH`) that turns the archive off.
OFF = "off"
#: Seconds a write waits for the lock of another writer before it fails.
DEFAULT_BUSY_TIMEOUT = 5.0

#: Bytes per unit of a size: decimal (``kb``, ``mb``...) and binary (``kib``, ``mib``...).
_UNITS = {"": 1, "b": 1} | {
    unit: base**power
    for power, prefix in enumerate("kmgt", 1)
    for unit, base in ((prefix, 1000), (f"{prefix}b", 1000), (f"{prefix}ib", 1024))
}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class ArchiveSettings:
    """The settings in force: where to write, and what to do when it cannot be written."""

    path: Path | None
    """The SQLite archive file (``None`` for a URL, or when the archive is off)."""
    url: str | None = None
    """The PostgreSQL archive's ``postgresql://`` URL, when that is the archive."""
    required: bool = True
    """Refuse a compaction whose dropped entries cannot be recorded durably (default);
    false: record after the fact, best effort, and report a loss in ``hook_errors``."""
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    """Seconds a write waits for another writer's lock before it fails."""
    session: str | None = None
    """The session key archived rows carry; ``None``: the agent config's ``session_id``."""
    max_bytes: int | None = None
    """Size limit of the archive: past it the oldest sessions are pruned (``None``: none)."""
    max_age_days: float | None = None
    """Sessions whose last compaction is older than this are pruned (``None``: none)."""
    max_sessions: int | None = None
    """At most this many sessions are kept, the most recent (``None``: no limit)."""
    sync: str = "normal"
    """``normal``: a commit reaches the operating system before the compaction goes on (it
    survives the process being killed), the disk at checkpoints; ``full``: every commit
    is flushed to the disk first (it survives a power loss too, an fsync per compaction)."""
    source: str = "default"
    """Where ``path`` came from (for messages): ``per call``, ``configure()``, an
    environment variable, a settings file's line and key, or ``default``."""

    @property
    def limited(self) -> bool:
        """Whether any retention limit is set."""
        return (self.max_bytes, self.max_age_days, self.max_sessions) != (None, None, None)

    @property
    def off(self) -> bool:
        """Whether the archive is off."""
        return self.path is None and self.url is None

    @property
    def target(self) -> Path | str | None:
        """The URL or the file path; ``None`` when the archive is off."""
        return self.url if self.url is not None else self.path


def parse_size(value: object) -> int:
    """Bytes from ``500MB``, ``1.5GiB``, ``10k`` or a number (decimal and binary units).

    :raises ValueError: not a size.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        number, unit = float(value), ""
    else:
        text = str(value).strip().lower().replace("_", "").replace(",", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
        number, unit = float(digits) if digits else math.nan, text[len(digits) :].strip()
    if unit not in _UNITS or not (0 <= number < math.inf):
        raise ValueError(f"not a size (such as 500MB, 2GiB or a number of bytes): {value!r}")
    return int(number * _UNITS[unit])


def is_url(value: object) -> bool:
    """Whether ``value`` is a PostgreSQL URL (``postgresql://`` or ``postgres://``)."""
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def default_archive_path() -> Path:
    """``$XDG_DATA_HOME/normandy/archive.sqlite3`` (``~/.local/share`` when unset).

    On Windows, ``%LOCALAPPDATA%\\normandy\\archive.sqlite3``.
    """
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "normandy" / "archive.sqlite3"


# -- the checks: each turns a value as given into the one used, or says what is allowed --


def _check_path(value: Any) -> Path | str | None:
    """A file path, a PostgreSQL URL, or ``None`` for :data:`OFF` (or ``False``)."""
    if value is False or (isinstance(value, str) and value.strip().lower() == OFF):
        return None
    if is_url(value):
        return str(value)
    if isinstance(value, str) and "://" in value:
        raise ValueError(
            f"{value.split('://')[0]}:// archives are not supported; give a file path or a "
            "postgresql:// URL"
        )
    if isinstance(value, (str, os.PathLike)) and str(value):
        return Path(value).expanduser()
    raise ValueError(f"must be a file path, a postgresql:// URL or {OFF!r}, got {value!r}")


def _check_url(value: Any) -> str:
    if not is_url(value):
        raise ValueError(f"must be a postgresql:// URL, got {value!r}")
    return str(value)


def _check_required(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"must be true or false (1/0, yes/no), got {value!r}")


def _non_negative(unit: str | None) -> Callable[[Any], float]:
    """The check of a finite number >= 0 of ``unit`` (seconds, days), or whole (``None``)."""
    what = "a whole number" if unit is None else f"a number of {unit}"

    def check(value: Any) -> float:
        try:
            number = int(value) if unit is None else float(value)
        except (TypeError, ValueError, OverflowError):  # int(inf) overflows
            number = math.nan
        refused = (bool, float) if unit is None else bool
        if isinstance(value, refused) or not (0 <= number < math.inf):
            raise ValueError(f"must be {what} >= 0, got {value!r}")
        return number

    return check


def _check_session(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError(f"must be a non-empty string, got {value!r}")


def _check_sync(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() in ("normal", "full"):
        return value.strip().lower()
    raise ValueError(f"must be 'normal' or 'full', got {value!r}")


#: The ``archive`` section of Normandy's configuration: its keys, their variables and
#: checks (declared to the core by the entry point ``archive`` of the group
#: ``normandy_core.settings``).
SECTION = SettingsSection(
    "archive",
    (
        SettingKey("path", _check_path, ENV_PATH),
        SettingKey("url", _check_url, ENV_URL),
        SettingKey("required", _check_required, ENV_REQUIRED),
        SettingKey("busy_timeout", _non_negative("seconds"), ENV_BUSY_TIMEOUT),
        SettingKey("session", _check_session, ENV_SESSION),
        SettingKey("max_bytes", parse_size, ENV_MAX_BYTES),
        SettingKey("max_age_days", _non_negative("days"), ENV_MAX_AGE_DAYS),
        SettingKey("max_sessions", _non_negative(None), ENV_MAX_SESSIONS),
        SettingKey("sync", _check_sync, ENV_SYNC),
    ),
    error=ArchiveConfigError,
)

#: The per-call settings of :func:`archive_settings`, checked (none outside a block).
_NO_CALL = Layer("per call", MappingProxyType({}), MappingProxyType({}))
_per_call = contextvars.ContextVar("normandy_archive_settings", default=_NO_CALL)


def _code_layer(name: str, values: Mapping[str, Any]) -> Layer:
    """The layer of settings given in code (``per call``, ``configure()``)."""
    return Layer(name, values, dict.fromkeys(values, name))


def _checked(settings: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The settings given in code to ``where``, checked; ``None`` (not set here) left out."""
    return {
        key: SECTION.check(key, value, f"normandy_archive.{where}({key}=...)")
        for key, value in settings.items()
        if value is not None or key not in SECTION.names
    }


def _resolve(layers: Sequence[Layer]) -> ArchiveSettings:
    """The settings of ``layers``, highest first: each key from the highest layer that
    sets it; the archive from the highest setting ``path`` or ``url``, where ``off`` wins,
    then the URL, then the path (relative to the settings file that sets it)."""
    chosen: dict[str, Any] = {}
    for key in SECTION.names:
        layer = highest(layers, key)
        if layer is not None and key not in ("path", "url"):
            chosen[key] = layer.values[key]
    for layer in layers:
        values = layer.values
        off = "path" in values and values["path"] is None
        key = "url" if "url" in values and not off else "path"
        if key in values:
            target, source = values[key], layer.origins[key]
            if isinstance(target, Path) and layer.path is not None and not target.is_absolute():
                target = layer.path.parent / target
            break
    else:
        target, source = default_archive_path(), "default"
    path = target if isinstance(target, Path) else None
    url = target if isinstance(target, str) else None
    return ArchiveSettings(path=path, url=url, source=source, **chosen)


#: What :func:`configure` set for the process: a layer replaced whole under the lock, so
#: a reader sees one consistent state.
_CONFIGURED = {"layer": _code_layer("configure()", {})}
_CONFIGURE_LOCK = threading.Lock()


def configure(**settings: Any) -> None:
    """Set archive settings for this process (``path``, ``url``, ``required``,
    ``busy_timeout``, ``session``, ``max_bytes``, ``max_age_days``, ``max_sessions``,
    ``sync``), over the environment and the settings files; a value of ``None`` forgets
    what was set here. Values are checked now."""
    changes = _checked(settings, "configure")
    with _CONFIGURE_LOCK:
        kept = {k: v for k, v in _CONFIGURED["layer"].values.items() if k not in settings}
        _CONFIGURED["layer"] = _code_layer("configure()", {**kept, **changes})


@contextlib.contextmanager
def archive_settings(**settings: Any) -> Iterator[ArchiveSettings]:
    """Override archive settings inside the ``with`` block (per call), over every other
    source; a value of ``None`` leaves a setting as it is. Yields the settings in force.

    ``with archive_settings(path="off"): compact(messages)`` compacts without archiving.
    """
    changes = _checked(settings, "archive_settings")
    token = _per_call.set(_code_layer("per call", {**_per_call.get().values, **changes}))
    try:
        yield current_settings()
    finally:
        _per_call.reset(token)


def current_settings(env: Mapping[str, str] | None = None) -> ArchiveSettings:
    """The settings in force now: per call, then :func:`configure`, then the environment,
    then ``normandy.toml``'s ``[archive]``, then ``pyproject.toml``'s
    ``[tool.normandy.archive]``, then the defaults. With ``env``, the environment and the
    files it names are read from scratch instead of the core's settings of the process.

    :raises ArchiveConfigError: a bad value, naming the variable, or the file, line and key.
    :raises SettingsError: a settings file cannot be read or holds an unknown section.
    """
    if env is None:
        sources = current_core_settings().section(SECTION)
    else:
        sources = load_settings(env, working_directory()).section(SECTION, env)
    return _resolve((_per_call.get(), _CONFIGURED["layer"], *sources))


def set_archive_path(path: str | os.PathLike[str] | None) -> None:
    """Pin the archive file for this process (``"off"``: no archive; ``None`` goes back to
    the environment, the files and the default): ``configure(path=path)``."""
    configure(path=path)


def archive_path() -> Path:
    """The archive file in force (:func:`current_settings`).

    :raises ArchiveError: the archive is off (``NORMANDY_ARCHIVE_PATH=off``).
    """
    settings = current_settings()
    if settings.path is None:
        raise ArchiveError(
            f"the archive is off (path 'off', set by {settings.source}); name the archive "
            "file explicitly"
        )
    return settings.path
