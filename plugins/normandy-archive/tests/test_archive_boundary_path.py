"""The archive's boundary path made cheaper, checked against the plain way of doing it:
the settings remembered between compactions against settings resolved from scratch."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from normandy_archive import ArchiveConfigError, archive_settings, configure, current_settings

#: Values each environment variable the settings read takes (a bad one among them).
ENV_VALUES = {
    "NORMANDY_ARCHIVE_PATH": ["off", "/tmp/normandy-test/a.sqlite3", "~/b.sqlite3", "c.sqlite3"],
    "NORMANDY_ARCHIVE_URL": ["postgresql://agent@db.example/archive", "mysql://x"],
    "NORMANDY_ARCHIVE_REQUIRED": ["0", "yes"],
    "NORMANDY_ARCHIVE_BUSY_TIMEOUT": ["1.5", "soon"],
    "NORMANDY_ARCHIVE_SESSION": ["agent-1", "agent-2"],
    "NORMANDY_ARCHIVE_MAX_BYTES": ["1MB"],
    "NORMANDY_ARCHIVE_MAX_AGE_DAYS": ["2"],
    "NORMANDY_ARCHIVE_MAX_SESSIONS": ["3"],
    "NORMANDY_ARCHIVE_SYNC": ["full", "normal"],
    "XDG_DATA_HOME": ["/tmp/normandy-test/xdg", "relative"],
    "HOME": ["/tmp/normandy-test/home-1", "/tmp/normandy-test/home-2"],
}
#: Values each setting takes in code (configure() or per call).
CODE_VALUES: dict[str, list[Any]] = {
    "path": ["off", "/tmp/normandy-test/code.sqlite3", "postgresql://code@db.example/a"],
    "required": [True, False],
    "busy_timeout": [2.0],
    "session": ["in-code"],
    "max_bytes": [10_000],
    "sync": ["full"],
}

_env_step = st.tuples(
    st.just("env"),
    st.sampled_from(sorted(ENV_VALUES)).flatmap(
        lambda n: st.tuples(st.just(n), st.none() | st.sampled_from(ENV_VALUES[n]))
    ),
)
_code_setting = st.sampled_from(sorted(CODE_VALUES)).flatmap(
    lambda k: st.tuples(st.just(k), st.sampled_from(CODE_VALUES[k]))
)
_steps = st.lists(
    _env_step
    | st.tuples(st.just("configure"), st.tuples(st.sampled_from(sorted(CODE_VALUES)), st.none()))
    | st.tuples(st.just("configure"), _code_setting)
    | st.tuples(st.just("enter"), _code_setting)
    | st.tuples(st.just("exit"), st.none()),
    max_size=30,
)


def _outcome(resolve: Any) -> Any:
    try:
        return resolve()
    except ArchiveConfigError as exc:
        return ("refused", str(exc))


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_remembered_settings_are_those_resolved_from_scratch(steps):
    """At every step of a sequence of environment changes, configure() calls and per-call
    settings entered and left, current_settings() (which reuses what it resolved while
    nothing it reads changed) gives what resolving from scratch gives, or the same refusal."""
    saved = {name: os.environ.get(name) for name in ENV_VALUES}
    try:
        with contextlib.ExitStack() as calls:
            depth: list[contextlib.ExitStack] = []
            for kind, arg in steps:
                if kind == "env":
                    name, value = arg
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                elif kind == "configure":
                    key, value = arg
                    configure(**{key: value})
                elif kind == "enter":
                    inner = contextlib.ExitStack()
                    try:  # entering resolves the settings: a bad variable refuses it
                        inner.enter_context(archive_settings(**dict([arg])))
                    except ArchiveConfigError:
                        continue
                    depth.append(inner)
                    calls.callback(inner.close)
                elif depth:
                    depth.pop().close()
                expected = _outcome(lambda: current_settings(env=os.environ))
                assert _outcome(current_settings) == expected
                assert _outcome(current_settings) == expected  # remembered
    finally:
        configure(**dict.fromkeys(CODE_VALUES))
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
