"""Containing what plugin code raises, and the threads abandoned under a time limit.

A plugin that calls ``sys.exit()`` or ``argparse``'s ``parse_args()`` at import, or raises
``KeyboardInterrupt`` from a hook, must not take the agent down: :func:`call_plugin` turns
every ``BaseException`` of plugin code into a :class:`PluginFault` (an ``Exception``),
except a genuine Ctrl-C of the user's own process. On the main thread SIGINTs are counted
by a wrapper around the application's own handler (installed once), so a
``KeyboardInterrupt`` is let through only when a SIGINT arrived during the call; on other
threads signals never arrive, so a ``KeyboardInterrupt`` there always comes from the
plugin.

Work abandoned after a time limit (``compaction_timeout``) keeps running in its daemon
thread; :func:`start_bounded` caps how many such threads may be alive at once
(:data:`MAX_ABANDONED`) and :func:`abandoned_threads` counts them.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import contextvars
import threading
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

__all__ = [
    "MAX_ABANDONED",
    "AbandonedLimitError",
    "PluginFault",
    "PluginTimeoutError",
    "abandoned_threads",
    "call_gate",
    "call_plugin",
    "run_bounded",
]

T = TypeVar("T")

#: How many abandoned plugin threads may be alive at once; past it no new timed call starts.
MAX_ABANDONED = 16


class PluginFault(Exception):
    """Plugin code raised a ``BaseException`` that is not an ``Exception`` (chained)."""


class AbandonedLimitError(RuntimeError):
    """:data:`MAX_ABANDONED` abandoned plugin threads are still running."""


class PluginTimeoutError(TimeoutError):
    """Plugin code did not return within its time limit; its thread was abandoned.

    A ``TimeoutError`` of its own kind, so a plugin that raises ``TimeoutError`` itself
    (a model call that timed out) is not taken for the limit.
    """


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
    """The plugin threads abandoned after their time limit, counted until they end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0


_ABANDONED = _Abandoned()


def abandoned_threads() -> int:
    """How many plugin threads abandoned after a time limit are still running."""
    return _ABANDONED.running


def run_bounded(fn: Callable[[], T], timeout: float, name: str) -> T:
    """``fn()`` in a daemon thread, waited for ``timeout`` seconds.

    Returns its result or re-raises what it raised (``BaseException`` as a
    :class:`PluginFault`). Past ``timeout`` the thread is abandoned, counted until it ends,
    and :class:`PluginTimeoutError` (a ``TimeoutError``) is raised; its late result is
    dropped.

    :raises AbandonedLimitError: :data:`MAX_ABANDONED` abandoned threads are still
        running, so no new one is started.
    """
    abandoned = _ABANDONED
    if abandoned.running >= MAX_ABANDONED:
        raise AbandonedLimitError(
            f"{abandoned.running} plugin threads abandoned after their time limit are still "
            f"running (at most {MAX_ABANDONED}); not starting another"
        )
    box: dict[str, Any] = {}
    state = {"abandoned": False}

    def work() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            with abandoned.lock:
                if state["abandoned"]:
                    abandoned.running -= 1
                state["done"] = True

    # In the caller's context (contextvars copied): the work sees what the caller bound,
    # such as the turn's event loop for an async model summary.
    worker = threading.Thread(
        target=contextvars.copy_context().run, args=(work,), name=name, daemon=True
    )
    worker.start()
    worker.join(timeout)
    with abandoned.lock:
        if not state.get("done"):
            state["abandoned"] = True
            abandoned.running += 1
            raise PluginTimeoutError(f"did not return within {timeout:g} s")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, Exception):
            raise exc
        raise PluginFault(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
    result: T = box["result"]
    return result
