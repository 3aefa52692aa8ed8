"""Containing what plugin code raises, and the threads abandoned under a time limit.

A plugin that calls ``sys.exit()`` or ``argparse``'s ``parse_args()`` at import, or raises
``KeyboardInterrupt`` from a hook, must not take the agent down: :func:`call_plugin` turns
every ``BaseException`` of plugin code into a :class:`PluginFault` (an ``Exception``),
except a genuine Ctrl-C of the user's own process. On the main thread a SIGINT that
arrives during the call is seen by a temporary signal handler, so a ``KeyboardInterrupt``
is let through only when the user really pressed Ctrl-C; on other threads signals never
arrive, so a ``KeyboardInterrupt`` there always comes from the plugin.

Work abandoned after a time limit (``compaction_timeout``) keeps running in its daemon
thread; :func:`start_bounded` caps how many such threads may be alive at once
(:data:`MAX_ABANDONED`) and :func:`abandoned_threads` counts them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "MAX_ABANDONED",
    "AbandonedLimitError",
    "PluginFault",
    "abandoned_threads",
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


class _Watch:
    __slots__ = ("hit",)

    def __init__(self) -> None:
        self.hit = False


def call_plugin(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, with any non-``Exception`` it raises turned into a
    :class:`PluginFault` naming it, unless it is the user's own Ctrl-C.
    """
    watch = _Watch()
    previous = _install(watch)
    try:
        return fn(*args, **kwargs)
    except Exception:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) and watch.hit:
            raise
        raise PluginFault(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _install(watch: _Watch) -> Any:
    """Note SIGINTs in ``watch`` (then act as before); the handler to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        previous = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):  # pragma: no cover - no signal support here
        return None
    if not callable(previous):
        return None  # SIG_IGN or SIG_DFL: a Ctrl-C never becomes KeyboardInterrupt

    def noted(signum: int, frame: Any) -> Any:
        watch.hit = True
        return previous(signum, frame)

    try:
        signal.signal(signal.SIGINT, noted)
    except (ValueError, OSError):  # pragma: no cover
        return None
    return previous


_lock = threading.Lock()
_abandoned = 0


def abandoned_threads() -> int:
    """How many plugin threads abandoned after a time limit are still running."""
    return _abandoned


def run_bounded(fn: Callable[[], T], timeout: float, name: str) -> T:
    """``fn()`` in a daemon thread, waited for ``timeout`` seconds.

    Returns its result or re-raises what it raised (``BaseException`` as a
    :class:`PluginFault`). Past ``timeout`` the thread is abandoned, counted until it ends,
    and ``TimeoutError`` is raised; its late result is dropped.

    :raises AbandonedLimitError: :data:`MAX_ABANDONED` abandoned threads are still
        running, so no new one is started.
    """
    global _abandoned
    if _abandoned >= MAX_ABANDONED:
        raise AbandonedLimitError(
            f"{_abandoned} plugin threads abandoned after their time limit are still "
            f"running (at most {MAX_ABANDONED}); not starting another"
        )
    box: dict[str, Any] = {}
    state = {"abandoned": False}

    def work() -> None:
        global _abandoned
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            with _lock:
                if state["abandoned"]:
                    _abandoned -= 1
                state["done"] = True

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    worker.join(timeout)
    with _lock:
        if not state.get("done"):
            state["abandoned"] = True
            _abandoned += 1
            raise TimeoutError(f"did not return within {timeout:g} s")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, Exception):
            raise exc
        raise PluginFault(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
    result: T = box["result"]
    return result
