"""The archive's boundary path made cheaper, checked against the plain way of doing it:
the settings of the process against settings resolved from scratch, the
entries' JSON, content hashes and caller ids against ``model_dump_json()``,
``content_hash`` from the entry alone and ``json.dumps``, and the meta's JSON and the
compaction ids against ``json.dumps`` and ``uuid.uuid4()``."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import Any

from hypothesis import given, settings, strategies as st

from normandy_archive import ArchiveConfigError, archive_settings, base, configure, current_settings
from normandy_archive.schema import content_hash, source_ids
from normandy_core import Entry, OpaqueBlock
from strategies import (
    blocks,
    ids,
    json_objects,
    short_text,
    tool_result_blocks,
    tool_use_blocks,
    turn_ids,
)

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
def test_settings_are_those_resolved_from_scratch(steps):
    """At every step of a sequence of environment changes, configure() calls and per-call
    settings entered and left, current_settings() (from the core's settings of the
    process) gives what resolving from scratch gives, or the same refusal."""
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
                assert _outcome(current_settings) == expected  # and again
    finally:
        configure(**dict.fromkeys(CODE_VALUES))
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


#: Caller ids of any text (quotes, backslashes, control and non-ASCII characters).
any_ids = st.text(max_size=12)
opaque_blocks = st.builds(
    OpaqueBlock,
    format=st.sampled_from(["anthropic", "openai", "responses"]),
    kind=short_text,
    data=json_objects(),
    use_id=st.none() | any_ids,
    answers=st.none() | any_ids,
    reasoning=st.booleans(),
)
any_blocks = (
    blocks() | opaque_blocks | tool_use_blocks(id=any_ids) | tool_result_blocks(tool_use_id=any_ids)
)
any_entries = st.builds(
    Entry,
    id=ids,
    parent_id=st.none() | ids,
    turn_id=turn_ids,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=short_text | st.text() | st.lists(any_blocks, max_size=6).map(tuple),
    pinned=st.booleans(),
    metadata=st.just({}) | json_objects(),
)


@settings(max_examples=500, deadline=None)
@given(any_entries)
def test_an_entry_prepared_is_what_the_plain_calls_give(entry):
    """What a row stores of an entry, made the cheaper way, byte for byte what the plain
    calls give: ``model_dump_json()``, the content hash of the entry alone (not cut from
    the JSON), the caller ids and ``json.dumps`` of them, and the row of them a journal
    or a spooled frame stores."""
    prepared = base._prepare_one(entry)
    ids_found = tuple(source_ids(entry))
    assert prepared.entry is entry
    assert prepared.entry_json == entry.model_dump_json()
    assert prepared.content_hash == content_hash(entry)
    assert prepared.source_ids == ids_found
    ids_json = json.dumps(ids_found) if ids_found else None
    assert prepared.row == (
        entry.id,
        content_hash(entry),
        entry.turn_id,
        entry.role,
        entry.model_dump_json(),
        ids_json,
    )


def test_compaction_ids_are_random_version_4_uuids(tmp_path):
    """A compaction id is what ``uuid.uuid4().hex`` gives: 32 hex digits of a random
    version-4 UUID of the RFC 4122 variant, a new one each time."""
    from normandy_archive import Archive

    archive = Archive(tmp_path / "ids.sqlite3")
    made = [archive.record((), session_id="s") for _ in range(50)]
    archive.close()
    assert len(set(made)) == len(made)
    for cid in made:
        u = uuid.UUID(hex=cid)
        assert u.hex == cid and u.version == 4 and u.variant == uuid.RFC_4122


def test_the_archive_in_use_follows_the_settings(tmp_path):
    """The hooks' archive for the settings they resolved: the same one while the same
    settings come back (equal settings resolved again included), another when the target
    changes (the one no longer in use closed), and a fresh one when the first target
    comes back, never the one closed."""
    from normandy_archive import hooks
    from normandy_archive.settings import ArchiveSettings

    one = ArchiveSettings(path=tmp_path / "one.sqlite3")
    two = ArchiveSettings(path=tmp_path / "two.sqlite3")
    first = hooks._IN_USE.get(one)
    try:
        assert hooks._IN_USE.get(one) is first
        assert hooks._IN_USE.get(ArchiveSettings(path=tmp_path / "one.sqlite3")) is first
        other = hooks._IN_USE.get(two)
        assert other is not first and other.location == str(tmp_path / "two.sqlite3")
        again = hooks._IN_USE.get(one)
        assert again is not first and again.location == first.location
        assert hooks._IN_USE.get(one) is again and hooks._IN_USE.get(two) is not other
    finally:
        hooks._IN_USE.close()


def test_a_background_writer_whose_loop_ended_is_started_again(tmp_path, monkeypatch):
    """schedule() starts the writer thread when there is none, and again once its loop
    ended (an error it does not catch), so work scheduled afterwards is still done."""
    import threading

    from normandy_archive import Archive, maintenance

    raised: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_type))

    class NotAnArchive:
        """No ``index`` nor ``location``: serving it raises out of the writer's loop."""

    writer = maintenance._Writer()
    writer.hurry = False
    writer.schedule(NotAnArchive(), None, ())  # type: ignore[arg-type]
    first = writer.thread
    assert first is not None
    first.join(10)
    assert not first.is_alive() and writer.thread is None and raised == [AttributeError]
    archive = Archive(tmp_path / "a.sqlite3")
    try:
        writer.schedule(archive, None, ())
        second = writer.thread
        assert second is not None and second is not first and second.is_alive()
        assert writer.drain(10) and not writer.pending
    finally:
        archive.close()
