"""Shared pytest set-up: hypothesis profiles (CI runs derandomized with bounded examples)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# The compactor conformance kit is opt-in; this repository opts in for its own tests.
pytest_plugins = ["normandy_core.testing"]

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The archive hook plugin (normandy-archive) is installed in the workspace and loaded
# automatically: keep test runs out of the user's real archive.
if not os.environ.get("NORMANDY_ARCHIVE_PATH"):
    import atexit
    import shutil
    import tempfile

    _archive_dir = tempfile.mkdtemp(prefix="normandy-test-archive-")
    atexit.register(shutil.rmtree, _archive_dir, ignore_errors=True)
    os.environ["NORMANDY_ARCHIVE_PATH"] = os.path.join(_archive_dir, "archive.sqlite3")

# The vocabulary cache (normandy_core.conversation.vocabcache) is off unless NORMANDY_CACHE_DIR
# names a directory: test runs, and the processes they start, use a throwaway one, so the cache's
# code runs in every test.
if not os.environ.get("NORMANDY_CACHE_DIR"):
    import atexit
    import shutil
    import tempfile

    _cache_dir = tempfile.mkdtemp(prefix="normandy-test-cache-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["NORMANDY_CACHE_DIR"] = _cache_dir

# Configuration without code (normandy_core.contract.settings): test runs never pick up the user's
# NORMANDY_COMPACTOR* variables or a normandy.toml / [tool.normandy] above the checkout.
# The settings tests unset NORMANDY_CONFIG themselves, in a temporary directory.
os.environ["NORMANDY_CONFIG"] = "off"
for _var in ("NORMANDY_COMPACTOR", "NORMANDY_COMPACTOR_OPTS"):
    os.environ.pop(_var, None)


@pytest.fixture(autouse=True)
def _faults_logged_afresh() -> None:
    """Each test sees the first of each fault logged: the core logs a flood of identical
    faults once a minute (normandy_core.contract.faults.FAULT_FLOOD), and what an earlier
    test logged would otherwise hold back the same fault in the next one."""
    from normandy_core.contract.faults import FAULT_FLOOD

    FAULT_FLOOD.reset()


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` for the test's duration, as in an interactive
    Python, whatever the runner set: ``nohup``, ``make test &`` and some CI runners start
    the tests with SIGINT ignored, and a test that sends itself a Ctrl-C would then see
    nothing. The runner's handler is put back after."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a SIGINT handler can be installed on the main thread only")
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        # None: a handler not installed from Python, which cannot be put back; the default
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
