"""The archive's settings: the ``archive`` section of Normandy's configuration, set in code
for the process, or per call.

Each setting is resolved at every compaction (remembered while nothing it is read from
changes), the first source that sets it winning:

1. per call: ``with archive_settings(path=..., required=...): compact(...)`` (a context
   variable, so it holds for the code run inside the ``with`` block, threads the
   boundary starts included);
2. in code, for the process: :func:`configure` (``configure(path=None)`` forgets a
   value set there);
3. the environment (:data:`ENV_PATH`, :data:`ENV_URL`, :data:`ENV_REQUIRED`,
   :data:`ENV_BUSY_TIMEOUT`, :data:`ENV_SESSION`, :data:`ENV_MAX_BYTES`,
   :data:`ENV_MAX_AGE_DAYS`, :data:`ENV_MAX_SESSIONS`, :data:`ENV_SYNC`);
4. the ``[archive]`` table of ``normandy.toml``, then the ``[tool.normandy.archive]``
   table of ``pyproject.toml``, the files the core finds and reads for its own keys
   (:mod:`normandy_core.contract.settings`, which checks them with :data:`SECTION`);
5. the defaults: the user data directory, required, a 5 s busy wait, the agent
   config's ``session_id`` as the session key, no limit.

The archive is one setting made of two keys: the highest source that sets ``path`` or
``url`` names it, and within that source ``path = "off"`` wins, then the ``url``, then
the ``path``. ``path`` is an SQLite file (relative to the settings file's directory when
set in a file), a ``postgresql://`` URL, or :data:`OFF` (``"off"``) for no archive.
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
from typing import Any, NamedTuple

from normandy_archive.errors import ArchiveConfigError
from normandy_core.contract.settings import (
    Layer,
    SettingKey,
    Settings,
    SettingsSection,
    current_settings as current_core_settings,
    highest,
    load_settings,
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
    "archive_settings",
    "configure",
    "current_settings",
    "default_archive_path",
    "is_url",
    "parse_size",
]

#: Environment variable naming the archive file (or ``off``).
ENV_PATH = "NORMANDY_ARCHIVE_PATH"
#: Environment variable naming a PostgreSQL archive (``postgresql://...``).
ENV_URL = "NORMANDY_ARCHIVE_URL"
#: Environment variable: ``0``/``false``/``no``/``off`` makes the archive best-effort.
ENV_REQUIRED = "NORMANDY_ARCHIVE_REQUIRED"
#: Environment variable: seconds a write waits for another writer's lock (default 5).
ENV_BUSY_TIMEOUT = "NORMANDY_ARCHIVE_BUSY_TIMEOUT"
#: Environment variable: the session key archived rows carry (default: the config's
#: ``session_id``, a fresh one for each ``compact()`` call).
ENV_SESSION = "NORMANDY_ARCHIVE_SESSION"
#: Environment variable: the archive's size limit (``500MB``, ``2GiB``, bytes); the
#: oldest sessions are pruned past it.
ENV_MAX_BYTES = "NORMANDY_ARCHIVE_MAX_BYTES"
#: Environment variable: sessions whose last compaction is older than this many days are
#: pruned.
ENV_MAX_AGE_DAYS = "NORMANDY_ARCHIVE_MAX_AGE_DAYS"
#: Environment variable: at most this many sessions are kept, the most recent ones.
ENV_MAX_SESSIONS = "NORMANDY_ARCHIVE_MAX_SESSIONS"
#: Environment variable: ``normal`` (the default) or ``full``, how a commit reaches the
#: disk (see :attr:`ArchiveSettings.sync`).
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
    """``normal``: a commit is written to the operating system before the compaction goes
    on (it survives the process being killed; SQLite's WAL ``synchronous=NORMAL``), and
    the write-ahead log is flushed to the disk at checkpoints, in the background;
    ``full``: every commit is also flushed to the disk before the compaction goes on
    (it survives a power loss too, at the cost of an fsync per compaction)."""

    @property
    def limited(self) -> bool:
        """Whether any retention limit is set."""
        return (self.max_bytes, self.max_age_days, self.max_sessions) != (None, None, None)

    source: str = "default"
    """Where ``path`` came from (for messages): ``per call``, ``configure()``, an
    environment variable, a settings file's line and key, or ``default``."""

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


def _non_negative(unit: str) -> Callable[[Any], float]:
    """The check of a number of ``unit`` (seconds, days) that may be 0, not infinite."""

    def check(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not (0 <= number < math.inf):
            raise ValueError(f"must be a number of {unit} >= 0, got {value!r}")
        return number

    return check


def _check_session(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError(f"must be a non-empty string, got {value!r}")


def _check_max_sessions(value: Any) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = -1
    if isinstance(value, (bool, float)) or count < 0:
        raise ValueError(f"must be a whole number >= 0, got {value!r}")
    return count


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
        SettingKey("max_sessions", _check_max_sessions, ENV_MAX_SESSIONS),
        SettingKey("sync", _check_sync, ENV_SYNC),
    ),
    error=ArchiveConfigError,
)

#: The variables the settings are read from: the section's, and those the default path
#: is made of (``HOME`` also expands a ``~`` in a path).
_WATCHED = (
    *(key.env for key in SECTION.keys if key.env is not None),
    "XDG_DATA_HOME",
    "HOME",
    *(("LOCALAPPDATA",) if sys.platform == "win32" else ()),
)

#: The per-call settings of :func:`archive_settings`, checked.
_per_call: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "normandy_archive_settings", default=None
)


def _checked(settings: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The settings given in code to ``where`` (``configure``...), checked; a value of
    ``None`` is left out (it means: not set here)."""
    checked: dict[str, Any] = {}
    for key, value in settings.items():
        if value is not None or key not in SECTION.names:
            checked[key] = SECTION.check(key, value, f"normandy_archive.{where}({key}=...)")
    return checked


def _resolve(levels: Sequence[Layer]) -> ArchiveSettings:
    """The settings of ``levels``, highest first: each key from the highest level that
    sets it (the defaults are :class:`ArchiveSettings`'), the archive from :func:`_target`."""
    chosen: dict[str, Any] = {}
    for key in SECTION.names:
        level = highest(levels, key)
        if level is not None and key not in ("path", "url"):
            chosen[key] = level.values[key]
    target, source = _target(levels)
    path = target if isinstance(target, Path) else None
    url = target if isinstance(target, str) else None
    return ArchiveSettings(path=path, url=url, source=source, **chosen)


def _target(levels: Sequence[Layer]) -> tuple[Path | str | None, str]:
    """The archive (a path, a URL, or ``None``: off) and where it was set: the highest
    level setting ``path`` or ``url`` gives it; in that level ``off`` wins, then the URL,
    then the path (a relative one set in a file is relative to the file's directory)."""
    for level in levels:
        values = level.values
        if "path" in values and values["path"] is None:
            return None, level.origins["path"]
        if "url" in values:
            return values["url"], level.origins["url"]
        if "path" in values:
            path = values["path"]
            if isinstance(path, Path) and level.path is not None and not path.is_absolute():
                path = level.path.parent / path
            return path, level.origins["path"]
    return default_archive_path(), "default"


def _code_level(name: str, values: Mapping[str, Any]) -> Layer:
    """The level of the settings given in code (``per call``, ``configure()``)."""
    return Layer(name, values, dict.fromkeys(values, name))


class _Remembered(NamedTuple):
    """The settings last resolved, and what they were resolved from."""

    call: Mapping[str, Any]
    configured: Layer
    files: Settings
    #: The values of :data:`_WATCHED`.
    seen: tuple[str | None, ...]
    settings: ArchiveSettings


class _ProcessSettings:
    """What :func:`configure` set for the process, and the settings last resolved (so a
    compaction that changes nothing reuses them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Replaced whole by :meth:`configure`: the level of what it set.
        self._configured = _code_level("configure()", {})
        #: Replaced whole, so a thread reads one consistent record.
        self._last: _Remembered | None = None

    def configure(self, settings: Mapping[str, Any]) -> None:
        """Set (or, for ``None``, forget) the given settings for the process."""
        changes = _checked(settings, "configure")
        with self._lock:
            kept = {k: v for k, v in self._configured.values.items() if k not in settings}
            self._configured = _code_level("configure()", {**kept, **changes})

    def current(self, env: Mapping[str, str] | None) -> ArchiveSettings:
        """The settings in force (see :func:`current_settings`)."""
        call = _per_call.get() or {}
        configured = self._configured
        if env is not None:  # from scratch
            try:
                cwd: str | None = os.getcwd()
            except OSError:  # the working directory was removed: no file is found
                cwd = None
            files = load_settings(env, cwd).section(SECTION, env)
            return _resolve((_code_level("per call", call), configured, *files))
        found = current_core_settings()
        seen = tuple([os.environ.get(name) for name in _WATCHED])
        last = self._last
        if (
            last is not None
            and last.configured is configured
            and last.files is found
            and last.seen == seen
            and last.call == call
        ):
            return last.settings
        sources = found.section(SECTION, os.environ)
        settings = _resolve((_code_level("per call", call), configured, *sources))
        self._last = _Remembered(call, configured, found, seen, settings)
        return settings


_PROCESS = _ProcessSettings()


def configure(**settings: Any) -> None:
    """Set archive settings for this process (``path``, ``url``, ``required``,
    ``busy_timeout``, ``session``, ``max_bytes``, ``max_age_days``, ``max_sessions``,
    ``sync``), over the environment and the settings files.

    ``path`` is a file or :data:`OFF`; a value of ``None`` forgets what was set here, so
    the environment, the files and the defaults apply again. Values are checked now.
    """
    _PROCESS.configure(settings)


@contextlib.contextmanager
def archive_settings(**settings: Any) -> Iterator[ArchiveSettings]:
    """Override archive settings for the code run inside the ``with`` block (per call),
    over every other source.

    ``with archive_settings(path="off"): compact(messages)`` compacts without archiving;
    ``with archive_settings(path=p, required=False): ...`` writes to ``p``, best effort.
    A value of ``None`` leaves that setting as it is. Yields the settings in force
    inside the block.
    """
    changes = _checked(settings, "archive_settings")
    token = _per_call.set({**(_per_call.get() or {}), **changes})
    try:
        yield current_settings()
    finally:
        _per_call.reset(token)


def current_settings(env: Mapping[str, str] | None = None) -> ArchiveSettings:
    """The settings in force now: per call, then :func:`configure`, then the environment,
    then ``normandy.toml``'s ``[archive]``, then ``pyproject.toml``'s
    ``[tool.normandy.archive]``, then the defaults.

    Resolved again only when the per-call settings, :func:`configure`, one of the
    variables read or the settings files found changed (the hook asks at every
    compaction). With ``env``, resolved from scratch from that environment.

    :raises ArchiveConfigError: a bad value, naming the variable, or the file, line and key.
    :raises SettingsError: a settings file cannot be read or holds an unknown section.
    """
    return _PROCESS.current(env)
