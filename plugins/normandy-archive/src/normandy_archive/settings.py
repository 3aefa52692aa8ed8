"""The archive's settings: per call, in code, from the environment, or the defaults.

Each setting is resolved at every compaction, first match wins:

1. per call: ``with archive_settings(path=..., required=...): compact(...)`` (a context
   variable, so it holds for the code run inside the ``with`` block, threads the
   boundary starts included);
2. in code, for the process: :func:`configure` (``configure(path=None)`` forgets a
   value set there);
3. the environment (:data:`ENV_URL`, :data:`ENV_PATH`, :data:`ENV_REQUIRED`,
   :data:`ENV_BUSY_TIMEOUT`, :data:`ENV_SESSION`, :data:`ENV_MAX_BYTES`,
   :data:`ENV_MAX_AGE_DAYS`, :data:`ENV_MAX_SESSIONS`, :data:`ENV_SYNC`);
4. the defaults: the user data directory, required, a 5 s busy wait, the agent
   config's ``session_id`` as the session key, no limit.

``path`` is an SQLite file, a ``postgresql://`` URL, or :data:`OFF` (``"off"``) for no
archive at all. In the environment ``NORMANDY_ARCHIVE_PATH=off`` wins over a URL.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normandy_archive.errors import ArchiveConfigError

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

_KEYS = (
    "path",
    "required",
    "busy_timeout",
    "session",
    "max_bytes",
    "max_age_days",
    "max_sessions",
    "sync",
)
_ENV = {
    "path": ENV_PATH,
    "required": ENV_REQUIRED,
    "busy_timeout": ENV_BUSY_TIMEOUT,
    "session": ENV_SESSION,
    "max_bytes": ENV_MAX_BYTES,
    "max_age_days": ENV_MAX_AGE_DAYS,
    "max_sessions": ENV_MAX_SESSIONS,
    "sync": ENV_SYNC,
}
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
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
    environment variable, or ``default``."""

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


_configured: dict[str, Any] = {}
_per_call: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "normandy_archive_settings", default=None
)


def _check(key: str, value: Any, where: str) -> Any:
    """``value`` of setting ``key`` in its resolved form, or raise naming ``where``."""
    if key == "path":
        if value is False or (isinstance(value, str) and value.strip().lower() == OFF):
            return None
        if is_url(value):
            return value
        if isinstance(value, str) and "://" in value:
            raise ArchiveConfigError(
                f"{where}: {value.split('://')[0]}:// archives are not supported; give a "
                "file path or a postgresql:// URL"
            )
        if isinstance(value, (str, os.PathLike)) and str(value):
            return Path(value).expanduser()
        raise ArchiveConfigError(
            f"{where}: path must be a file path, a postgresql:// URL or {OFF!r}, got {value!r}"
        )
    if key == "required":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ArchiveConfigError(
            f"{where}: required must be true or false (1/0, yes/no), got {value!r}"
        )
    if key == "busy_timeout":
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if isinstance(value, bool) or not (0 <= seconds < math.inf):
            raise ArchiveConfigError(
                f"{where}: busy_timeout must be a number of seconds >= 0, got {value!r}"
            )
        return seconds
    if key == "session":
        if isinstance(value, str) and value.strip():
            return value.strip()
        raise ArchiveConfigError(f"{where}: session must be a non-empty string, got {value!r}")
    if key == "sync":
        if isinstance(value, str) and value.strip().lower() in ("normal", "full"):
            return value.strip().lower()
        raise ArchiveConfigError(f"{where}: sync must be 'normal' or 'full', got {value!r}")
    if key == "max_bytes":
        try:
            return parse_size(value)
        except ValueError as exc:
            raise ArchiveConfigError(f"{where}: max_bytes: {exc}") from None
    if key == "max_age_days":
        try:
            days = float(value)
        except (TypeError, ValueError):
            days = math.nan
        if isinstance(value, bool) or not (0 <= days < math.inf):
            raise ArchiveConfigError(
                f"{where}: max_age_days must be a number of days >= 0, got {value!r}"
            )
        return days
    if key == "max_sessions":
        try:
            count = int(value)
        except (TypeError, ValueError):
            count = -1
        if isinstance(value, (bool, float)) or count < 0:
            raise ArchiveConfigError(
                f"{where}: max_sessions must be a whole number >= 0, got {value!r}"
            )
        return count
    raise ArchiveConfigError(f"{where}: unknown archive setting {key!r}")  # pragma: no cover


def _changes(kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(_KEYS))
    if unknown:
        raise ArchiveConfigError(
            f"{where}: unknown archive setting(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}"
        )
    return {k: (None if v is None else _check(k, v, where)) for k, v in kwargs.items()}


def configure(**settings: Any) -> None:
    """Set archive settings for this process (``path``, ``required``, ``busy_timeout``,
    ``session``, ``max_bytes``, ``max_age_days``, ``max_sessions``, ``sync``).

    ``path`` is a file or :data:`OFF`; a value of ``None`` forgets what was set here, so
    the environment and the defaults apply again. Values are checked now.
    """
    for key, value in _changes(settings, "normandy_archive.configure()").items():
        if settings[key] is None:
            _configured.pop(key, None)
        else:
            _configured[key] = value
    _generation[0] += 1


@contextlib.contextmanager
def archive_settings(**settings: Any) -> Iterator[ArchiveSettings]:
    """Override archive settings for the code run inside the ``with`` block (per call).

    ``with archive_settings(path="off"): compact(messages)`` compacts without archiving;
    ``with archive_settings(path=p, required=False): ...`` writes to ``p``, best effort.
    A value of ``None`` leaves that setting as it is. Yields the settings in force
    inside the block.
    """
    checked = _changes(settings, "normandy_archive.archive_settings()")
    changes = {k: v for k, v in checked.items() if settings[k] is not None}
    outer = _per_call.get() or {}
    token = _per_call.set({**outer, **changes})
    try:
        yield current_settings()
    finally:
        _per_call.reset(token)


def _from_env(key: str, env: Mapping[str, str]) -> tuple[Any, str] | None:
    name = _ENV[key]
    raw = env.get(name, "").strip()
    if key == "path" and raw.lower() != OFF:  # off wins; then a URL; then a path
        url = env.get(ENV_URL, "").strip()
        if url:
            if not is_url(url):
                raise ArchiveConfigError(f"{ENV_URL} must be a postgresql:// URL, got {url!r}")
            return url, ENV_URL
    if not raw:
        return None
    return _check(key, raw, name), name


#: The environment variables the default path is read from (``HOME`` also expands a
#: ``~`` in a path read from the environment).
_ENV_DEFAULT = ("XDG_DATA_HOME", "HOME", *(("LOCALAPPDATA",) if sys.platform == "win32" else ()))
#: The last settings :func:`current_settings` resolved from ``os.environ``, after what
#: they were resolved from: ``(per-call settings, configure()'s generation, the
#: environment variables read, their values, settings)``, replaced whole (a thread reads
#: one consistent tuple).
_last: list[tuple[Any, ...]] = [({}, -1, (), (), None)]
#: Bumped by :func:`configure`, so settings resolved before it are not reused.
_generation = [0]


def current_settings(env: Mapping[str, str] | None = None) -> ArchiveSettings:
    """The settings in force now (per call, then :func:`configure`, then the environment).

    Resolved again only when the per-call settings, :func:`configure` or one of the
    environment variables read changed (the hook asks at every compaction).

    :raises ArchiveConfigError: an environment variable has a bad value (named).
    """
    call = _per_call.get() or {}
    if env is not None:
        return _resolve(call, env)
    generation = _generation[0]
    last_call, last_generation, names, last_seen, last = _last[0]
    same = last is not None and last_generation == generation and last_call == call
    if not same:
        names = _env_read(call)
    get = os.environ.get
    seen = tuple([get(name) for name in names])
    if same and last_seen == seen:
        settings: ArchiveSettings = last
        return settings
    settings = _resolve(call, os.environ)
    _last[0] = (dict(call), generation, names, seen, settings)
    return settings


def _env_read(call: Mapping[str, Any]) -> tuple[str, ...]:
    """The environment variables that can change the settings under the per-call settings
    ``call`` and :func:`configure`'s: those of the settings neither sets (for ``path``,
    :data:`ENV_URL` and the default path's too)."""
    names: list[str] = []
    for key in _KEYS:
        if key not in call and key not in _configured:
            names.append(_ENV[key])
            if key == "path":
                names += (ENV_URL, *_ENV_DEFAULT)
    return tuple(names)


def _resolve(call: Mapping[str, Any], env: Mapping[str, str]) -> ArchiveSettings:
    """The settings of ``call`` (per-call), then :func:`configure`, then ``env``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in _KEYS:
        if key in call:
            values[key], sources[key] = call[key], "per call"
        elif key in _configured:
            values[key], sources[key] = _configured[key], "configure()"
        else:
            found = _from_env(key, env)
            if found is not None:
                values[key], sources[key] = found
    if "path" not in sources:
        values["path"], sources["path"] = default_archive_path(), "default"
    target = values["path"]
    return ArchiveSettings(
        path=target if isinstance(target, Path) else None,
        url=target if isinstance(target, str) else None,
        required=values.get("required", True),
        busy_timeout=values.get("busy_timeout", DEFAULT_BUSY_TIMEOUT),
        session=values.get("session"),
        max_bytes=values.get("max_bytes"),
        max_age_days=values.get("max_age_days"),
        max_sessions=values.get("max_sessions"),
        sync=values.get("sync", "normal"),
        source=sources["path"],
    )
