"""Containing what plugin code raises, and the threads abandoned under a time limit.

A plugin that calls ``sys.exit()`` or ``argparse``'s ``parse_args()`` at import, or raises
``KeyboardInterrupt`` from a hook, must not take the agent down: :func:`call_plugin` turns
every ``BaseException`` of plugin code into a :class:`PluginFault` (an ``Exception``),
except a genuine Ctrl-C of the user's own process. On the main thread SIGINTs are counted
by a wrapper around the application's own handler (installed once), so a
``KeyboardInterrupt`` is let through only when a SIGINT arrived during the call; on other
threads signals never arrive, so a ``KeyboardInterrupt`` there always comes from the
plugin.

Work the library runs in a thread of its own under a time limit (compactors under
``compaction_timeout``, hooks, recall sources, model summaries, provider compactions)
runs through :func:`run_bounded`. Abandoned past its limit, it keeps running in its
daemon thread: one cap holds for all of them (:data:`MAX_ABANDONED`) and
:func:`abandoned_threads` counts them. The limit travels with the work
(:func:`time_left`), so a provider request made under it is sent with the time left as
its own timeout and ends with it.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, NoReturn, TypeVar

__all__ = [
    "FAULT_FLOOD",
    "FAULT_LOG_INTERVAL",
    "MAX_ABANDONED",
    "AbandonedLimitError",
    "FaultFlood",
    "PluginFault",
    "PluginTimeoutError",
    "StillRunningError",
    "abandoned_threads",
    "call_gate",
    "call_plugin",
    "fault_cause",
    "run_bounded",
    "still_running",
    "time_left",
]

T = TypeVar("T")

#: How many abandoned threads (plugin code, provider calls) may be alive at once; past it
#: no new bounded call starts (:func:`run_bounded`).
MAX_ABANDONED = 16


class PluginFault(Exception):
    """Plugin code raised a ``BaseException`` that is not an ``Exception`` (chained)."""


def fault_cause(exc: BaseException) -> BaseException:
    """What plugin code raised: the ``BaseException`` a :class:`PluginFault` carries as
    its cause, else ``exc`` itself."""
    if isinstance(exc, PluginFault) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


class AbandonedLimitError(RuntimeError):
    """:data:`MAX_ABANDONED` abandoned threads are still running."""


class StillRunningError(RuntimeError):
    """An earlier call of the same plugin code, abandoned after its time limit, is still
    running, so this one is not started (:func:`run_bounded` with ``exclusive``)."""


class PluginTimeoutError(TimeoutError):
    """Plugin code did not return within its time limit (its thread was abandoned), or
    returned after it (its late result refused).

    A ``TimeoutError`` of its own kind, so a plugin that raises ``TimeoutError`` itself
    (a model call that timed out) is not taken for the limit. ``limit`` is the time limit
    in seconds; ``took`` how long the call ran when it returned late (``None``: it was
    still running, abandoned).
    """

    def __init__(self, message: str, limit: float, took: float | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.took = took


_MAIN = threading.main_thread().ident


class _Sigints:
    """The SIGINTs the process received since the watch was installed (:func:`_watch`)."""

    seen = 0


_SIGINTS = _Sigints()


def _noting(previous: Any) -> Any:
    """A SIGINT handler that counts the signal, then does what ``previous`` did."""

    def noted(signum: int, frame: Any) -> Any:
        _SIGINTS.seen += 1
        return previous(signum, frame)

    noted.__normandy_noted__ = True  # type: ignore[attr-defined]
    return noted


#: What :func:`_watch` tells of a ``KeyboardInterrupt`` raised where it is called.
_COUNTED, _NEVER_CTRL_C, _UNKNOWN = "counted", "never", "unknown"


def _watch() -> str:
    """Make sure SIGINTs are counted, and say what a ``KeyboardInterrupt`` here can be.

    ``_COUNTED``: SIGINTs are counted (the main thread, a Python handler), so a Ctrl-C is
    told from a plugin's own ``KeyboardInterrupt`` by the count. ``_NEVER_CTRL_C``: a
    Ctrl-C cannot raise one here (another thread: Python raises it in the main thread
    only; ``SIG_IGN`` or ``SIG_DFL`` in place: it is ignored or ends the process), so one
    raised here is the plugin's. ``_UNKNOWN``: signals cannot be inspected.

    The handler in place is wrapped once (and again only when the application installs
    another), so the hot path costs one C-level ``getsignal``, no system call. The wrapper
    calls the application's handler unchanged.
    """
    if threading.get_ident() != _MAIN:
        return _NEVER_CTRL_C
    try:
        current = _signal.getsignal(_signal.SIGINT)
        if getattr(current, "__normandy_noted__", False):
            return _COUNTED
        if not callable(current):
            return _NEVER_CTRL_C  # SIG_IGN or SIG_DFL
        _signal.signal(_signal.SIGINT, _noting(current))
    except (ValueError, OSError):  # pragma: no cover - no signal support here
        return _UNKNOWN
    return _COUNTED


def call_plugin(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, with any non-``Exception`` it raises turned into a
    :class:`PluginFault` naming it, unless it is the user's own Ctrl-C.
    """
    watched = _watch()
    seen = _SIGINTS.seen
    try:
        return fn(*args, **kwargs)
    except Exception:
        raise
    except BaseException as exc:
        _contain(exc, watched, seen)


def call_gate(gate: Callable[[], object]) -> bool:
    """``bool(gate())``, isolated as :func:`call_plugin` isolates a call: for the
    ``active_when`` gates asked at every boundary, without the argument tuple and keyword
    dict a call through :func:`call_plugin` builds."""
    watched = _watch()
    seen = _SIGINTS.seen
    try:
        return bool(gate())
    except Exception:
        raise
    except BaseException as exc:
        _contain(exc, watched, seen)


def _contain(exc: BaseException, watched: str, seen: int) -> NoReturn:
    """Raise ``exc`` (a non-``Exception`` raised where :func:`_watch` said ``watched``
    with ``seen`` SIGINTs counted) again when it is the user's own Ctrl-C (or one that
    cannot be told from it), else a :class:`PluginFault` naming it."""
    if isinstance(exc, KeyboardInterrupt) and (
        watched == _UNKNOWN or (watched == _COUNTED and _SIGINTS.seen != seen)
    ):
        raise exc
    raise PluginFault(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc


class _Abandoned:
    """The threads abandoned after their time limit, counted (in all and by thread name)
    until they end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.by_name: dict[str, int] = {}

    def add(self, name: str) -> None:
        """Count one more abandoned thread named ``name`` (the lock held)."""
        self.running += 1
        self.by_name[name] = self.by_name.get(name, 0) + 1

    def remove(self, name: str) -> None:
        """Count an abandoned thread named ``name`` as ended (the lock held)."""
        self.running -= 1
        left = self.by_name[name] - 1
        if left:
            self.by_name[name] = left
        else:
            del self.by_name[name]


_ABANDONED = _Abandoned()

#: The deadline (a :func:`time.monotonic` value) of the bounded call this code runs in:
#: :func:`run_bounded` sets it in the context its thread runs in, so a provider SDK
#: request made anywhere under it can be given the time that is left (:func:`time_left`).
_DEADLINE: ContextVar[float | None] = ContextVar("normandy_deadline", default=None)


def abandoned_threads() -> int:
    """How many threads the library started for plugin code or a provider call, and
    abandoned after their time limit, are still running (:func:`run_bounded`)."""
    return _ABANDONED.running


def still_running(name: str) -> int:
    """How many abandoned threads named ``name`` (:func:`run_bounded`) are still running."""
    return _ABANDONED.by_name.get(name, 0)


def time_left() -> float | None:
    """Seconds left before the deadline of the bounded call this code runs in (negative
    once it passed), or ``None`` outside one: what a request made here may wait."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


class _Call:
    """One call :func:`run_bounded` runs in a thread: what it returned or raised, when it
    finished, and whether its caller gave up waiting for it."""

    __slots__ = ("abandoned", "error", "finished", "name", "result")

    def __init__(self, name: str) -> None:
        self.name = name
        self.abandoned = False
        self.finished: float | None = None
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self, fn: Callable[[], Any]) -> None:
        """Call ``fn`` and keep its outcome (in the worker thread)."""
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc
        finally:
            with _ABANDONED.lock:
                self.finished = time.monotonic()
                if self.abandoned:
                    _ABANDONED.remove(self.name)

    def outcome(self) -> Any:
        """What ``fn`` returned, or what it raised (a ``BaseException`` as a
        :class:`PluginFault`)."""
        exc = self.error
        if exc is None:
            return self.result
        if isinstance(exc, Exception):
            raise exc
        raise PluginFault(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc


def run_bounded(fn: Callable[[], T], timeout: float, name: str, *, exclusive: bool = False) -> T:
    """``fn()`` in a daemon thread named ``name``, waited for ``timeout`` seconds.

    Every thread the library starts for someone else's code or a provider call runs
    here (compactors under ``compaction_timeout``, hooks, recall sources, the
    ``summarize`` strategy's model summary, the native compactors' provider calls), so
    one cap (:data:`MAX_ABANDONED`) and one count (:func:`abandoned_threads`) hold for
    them all. Nested calls share the earlier deadline: the limit is ``timeout`` or the
    time left to the bounded call this one runs in, whichever ends first; ``fn`` sees it
    through :func:`time_left` (the model clients send it as the request's ``timeout=``).

    Returns ``fn``'s result or re-raises what it raised (``BaseException`` as a
    :class:`PluginFault`). Past the limit the thread is abandoned, counted until it ends,
    and :class:`PluginTimeoutError` is raised; a result that arrives after the limit
    (``fn`` held the GIL in C code, so the wait could not end on time) is refused the
    same way.

    :raises StillRunningError: with ``exclusive``, an abandoned thread named ``name`` is
        still running (one hung plugin holds one thread, not the whole cap).
    :raises AbandonedLimitError: :data:`MAX_ABANDONED` abandoned threads are still
        running, so no new one is started.
    """
    if exclusive and still_running(name):
        raise StillRunningError(
            "its call at an earlier boundary, abandoned after its time limit, is still running"
        )
    start = time.monotonic()
    outer = _DEADLINE.get()
    limit = timeout if outer is None else min(timeout, outer - start)
    if limit <= 0:
        raise PluginTimeoutError("not started: the time limit it runs under has passed", 0.0)
    abandoned = _ABANDONED
    if abandoned.running >= MAX_ABANDONED:
        raise AbandonedLimitError(
            f"{abandoned.running} threads abandoned after their time limit are still "
            f"running (at most {MAX_ABANDONED}); not starting another"
        )
    deadline = start + limit
    call = _Call(name)
    # In the caller's context (contextvars copied): the work sees what the caller bound,
    # such as the turn's event loop for an async model summary, and its own deadline.
    context = contextvars.copy_context()
    context.run(_DEADLINE.set, deadline)
    worker = threading.Thread(target=context.run, args=(call.run, fn), name=name, daemon=True)
    worker.start()
    worker.join(deadline - time.monotonic())
    with abandoned.lock:
        finished = call.finished
        if finished is None:
            call.abandoned = True
            abandoned.add(name)
    if finished is None:
        raise PluginTimeoutError(f"did not return within {limit:g} s", limit)
    if finished > deadline:
        took = finished - start
        raise PluginTimeoutError(
            f"returned after {took:.2f} s, past its time limit of {limit:g} s; its late "
            "result is refused",
            limit,
            took,
        )
    result: T = call.outcome()
    return result


#: Seconds during which identical faults are logged once (:class:`FaultFlood`).
FAULT_LOG_INTERVAL = 60.0
#: How many faults :class:`FaultFlood` keeps apart before it forgets the quiet ones.
_FLOOD_KEYS = 256


class FaultFlood(logging.Filter):
    """Logs a flood of identical faults once per interval, with a count.

    Applies to the records that carry a ``normandy_fault`` attribute: the key of the
    fault (which boundary outcome or hook, which plugin, which kind of failure: the
    exception's type, ``timeout``, ``abandoned_limit``...). Records of the same logger,
    level and key are identical faults: the first is let through (its traceback
    included), those that follow within :attr:`interval` seconds are held back and
    counted, and the first let through after that says how many were held back (in its
    message, and as ``normandy_repeats``). Records without the attribute pass untouched.
    """

    def __init__(self, interval: float = FAULT_LOG_INTERVAL) -> None:
        super().__init__()
        #: Seconds during which identical faults are logged once.
        self.interval = interval
        self._lock = threading.Lock()
        # key -> [when it was last let through, how many were held back since]
        self._seen: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged (the first of its fault in the interval)."""
        fault = getattr(record, "normandy_fault", None)
        if fault is None:
            return True
        key = (record.name, record.levelno, str(fault))
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.interval:
                seen[1] += 1
                return False
            held = 0 if seen is None else int(seen[1])
            self._seen[key] = [now, 0]
            if len(self._seen) > _FLOOD_KEYS:
                self._forget_quiet(now)
        record.normandy_repeats = held
        if held:
            record.msg = f"{record.getMessage()} ({held:,} more like it since it was last logged)"
            record.args = None
        return True

    def _forget_quiet(self, now: float) -> None:
        """Forget the faults last logged more than an interval ago with none held back
        since (the lock held): a later one is the first of its key again either way."""
        for key, (since, held) in list(self._seen.items()):
            if not held and now - since >= self.interval:
                del self._seen[key]

    def reset(self) -> None:
        """Forget every fault seen, so the next of each is logged at once."""
        with self._lock:
            self._seen.clear()


#: The filter the core puts on its ``normandy_core.boundary`` logger (the boundary's
#: lines, hook faults): remove it to log every fault, or change its ``interval``.
FAULT_FLOOD = FaultFlood()
