"""Configuration without code: the environment, ``normandy.toml`` and ``pyproject.toml``.

The compactor and its settings can be chosen outside the program:

- ``NORMANDY_COMPACTOR``: the compactor's name; ``NORMANDY_COMPACTOR_OPTS``: its options,
  a JSON object (``{"strategy": "summarize", "target": 0.6}``). Set but empty is unset.
- ``normandy.toml``, or the ``[tool.normandy]`` table of a ``pyproject.toml``, found from
  the current directory upward: the first directory holding either is used (a
  ``pyproject.toml`` without the table does not count); when it holds both, both are read,
  ``normandy.toml`` over ``pyproject.toml``. Keys (:data:`KEYS`): ``compactor``, ``opts``
  (a table of the compactor's options), ``model``, ``window`` (tokens; pins the
  ``context_window`` option of a compactor that sizes against a window), ``timeout``
  (seconds; ``compaction_timeout``) and ``survival`` (a table of the declarative survival
  rules: ``keep_first_user``, ``keep_current_request``, ``keep_tools``,
  ``summary_instructions``; a ``keep_if``
  predicate is code only), named as :func:`normandy_core.compact` names its arguments.
- ``NORMANDY_CONFIG``: the path of the one file to read instead of looking (a
  ``pyproject.toml`` is read for its ``[tool.normandy]`` table, any other name as a
  ``normandy.toml``), or ``off`` to read no file.

Precedence, highest first: explicit arguments, the environment, ``normandy.toml``,
``pyproject.toml``'s ``[tool.normandy]``, the caller's defaults (``compact()`` and the
command line default to ``window_manager``, :class:`~normandy_core.AgentConfig` to
``noop``). Each key is taken from the highest source that sets it, except the options,
which belong to a compactor: a source's ``opts`` configure the compactor that source names,
or, when it names none, the one the nearest source below it names, or else whichever
compactor is in use; the options used are those of the highest source whose compactor
is the compactor in use, taken whole (options are not merged key by key). So
``NORMANDY_COMPACTOR_OPTS`` alone tunes the file's compactor, and ``NORMANDY_COMPACTOR``
naming another compactor sets the file's options aside. A ``window`` and a
``context_window`` option from different sources: the higher source wins.

Everything is checked where it is loaded: a file that is not TOML (with its line), an
unknown key, a value of the wrong type, ``NORMANDY_COMPACTOR_OPTS`` that is not a JSON
object raise :class:`~normandy_core.SettingsError`; an unknown or broken compactor the
usual :class:`~normandy_core.PluginError`; options the compactor's options model refuses
an :class:`~normandy_core.OptionsError`. Each message begins with the file (and line) or
the variable, and names the key.

A plugin's own settings are a section of the same files: the ``[archive]`` table of a
``normandy.toml``, ``[tool.normandy.archive]`` of a ``pyproject.toml``. The plugin
describes the section (:class:`SettingsSection`: its keys, each with its environment
variable and its check) and declares it with an entry point in the group
``normandy_core.settings``; a table no installed distribution declares is refused like an
unknown key. The plugin reads its section with :meth:`Settings.section` (the environment,
then the files, each value checked by the section, errors naming the variable or the file,
line and key) and puts whatever it sets in code above it; ``normandy config`` shows it with
:meth:`Settings.describe` (:func:`settings_sections` lists the declared sections).

Settings are read once per process for a given working directory and values of the three
variables (:func:`current_settings`, a few microseconds per call once read); a file
created or edited while the process runs is read after :func:`reload_settings`.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from normandy_core.contract import plugins
from normandy_core.errors import (
    PluginError,
    PluginLoadError,
    SettingsError,
    UnknownCompactorError,
    unknown_name,
)

__all__ = [
    "ENV_COMPACTOR",
    "ENV_CONFIG",
    "ENV_OPTS",
    "FILE_NAME",
    "KEYS",
    "PYPROJECT",
    "Layer",
    "Resolved",
    "SectionValue",
    "SettingKey",
    "Settings",
    "SettingsSection",
    "current_settings",
    "highest",
    "load_settings",
    "read_settings_file",
    "reload_settings",
    "settings_sections",
    "working_directory",
]

#: The compactor's name.
ENV_COMPACTOR = "NORMANDY_COMPACTOR"
#: The compactor's options, a JSON object.
ENV_OPTS = "NORMANDY_COMPACTOR_OPTS"
#: The one settings file to read instead of looking for one, or ``off`` for none.
ENV_CONFIG = "NORMANDY_CONFIG"
#: The settings file looked up from the current directory upward.
FILE_NAME = "normandy.toml"
#: The project file whose ``[tool.normandy]`` table is read.
PYPROJECT = "pyproject.toml"
#: The keys a settings file may hold.
KEYS = ("compactor", "opts", "model", "window", "timeout", "survival")

_TABLE = ("tool", "normandy")


#: A layer without sections (the environment's, a file without any).
_NO_SECTIONS: Mapping[str, Layer] = MappingProxyType({})


@dataclass(frozen=True)
class SettingKey:
    """One key of a plugin's settings section.

    ``check`` turns a value as given (a TOML value, the text of the variable, a value set
    in code) into the value the plugin uses, or raises ``ValueError`` saying what is
    allowed (the reader puts the source in front); ``env`` is the environment variable
    that sets the key, if any.
    """

    name: str
    check: Callable[[Any], Any]
    env: str | None = None


@dataclass(frozen=True)
class SettingsSection:
    """A plugin's own settings: the ``[name]`` table of a ``normandy.toml``, the
    ``[tool.normandy.name]`` table of a ``pyproject.toml``, and its keys' variables.

    The plugin declares it with an entry point in the group
    :data:`~normandy_core.contract.plugins.SETTINGS_GROUP` (``name = "module:SECTION"``),
    so a file's ``[name]`` table is known without importing the plugin, and reads it with
    :meth:`Settings.section`. A bad value or key raises ``error`` (a subclass of
    :class:`SettingsError` the plugin may choose) naming the variable, or the file, the
    line and the key.
    """

    name: str
    keys: tuple[SettingKey, ...]
    error: type[SettingsError] = SettingsError

    @property
    def names(self) -> tuple[str, ...]:
        """The keys' names, in their order."""
        return tuple(key.name for key in self.keys)

    def check(self, key: str, value: Any, origin: str) -> Any:
        """``value`` of ``key`` in its checked form; ``error`` beginning with ``origin``
        when the key is unknown or the value is refused."""
        spec = next((k for k in self.keys if k.name == key), None)
        if spec is None:
            raise self.error(f"{origin}: {unknown_name(key, self.names)}")
        try:
            return spec.check(value)
        except (TypeError, ValueError) as exc:
            raise self.error(f"{origin}: {exc}") from None

    def from_environment(self, environ: Mapping[str, str]) -> Layer | None:
        """The layer of the keys' variables set in ``environ`` (set but empty is unset),
        checked; ``None`` when none is set."""
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        for key in self.keys:
            if key.env is None:
                continue
            raw = (environ.get(key.env) or "").strip()
            if raw:
                values[key.name] = self.check(key.name, raw, key.env)
                origins[key.name] = key.env
        return Layer("environment", values, origins) if values else None

    def checked(self, table: Layer) -> Layer:
        """A file's table of this section, as read, with every key and value checked."""
        values = {k: self.check(k, v, table.origins[k]) for k, v in table.values.items()}
        return Layer(table.name, values, table.origins, table.path)


class SectionValue(NamedTuple):
    """One key of a plugin's section as :meth:`Settings.describe` shows it."""

    key: str
    value: Any
    #: Where it came from, or ``not set``.
    origin: str


@dataclass(frozen=True)
class Layer:
    """One source of settings: the environment, a ``normandy.toml`` or a ``[tool.normandy]``.

    ``values`` holds the keys it sets (of :data:`KEYS`), checked; ``origins`` says where
    each came from, for messages (``NORMANDY_COMPACTOR_OPTS``,
    ``/app/normandy.toml: line 4: key 'opts'``); ``path`` is the file, if any.
    """

    name: str
    values: Mapping[str, Any]
    origins: Mapping[str, str]
    path: Path | None = None
    #: The plugins' sections in the file (``[archive]``), by name, each a layer of the
    #: values as read: the plugin checks them (:meth:`Settings.section`).
    sections: Mapping[str, Layer] = field(default_factory=lambda: _NO_SECTIONS)


class Resolved(NamedTuple):
    """The settings a call runs with, after precedence: what it passes on to prepare.

    ``opts`` is ``None`` when no source gives options. ``origins`` maps each key whose
    value came from a configuration source to that source (keys given as arguments or
    left to the default are absent). ``survival`` holds the survival rules (a mapping of
    :class:`~normandy_core.SurvivalRules` fields, or the call's own rules), ``None`` when
    neither the call nor a source sets them.
    """

    compactor: str
    opts: Mapping[str, Any] | None
    model: str | None
    window: int | None
    timeout: float | None
    origins: Mapping[str, str] = MappingProxyType({})
    survival: Any = None

    @property
    def configured(self) -> bool:
        """Whether a configuration source gave any of the values."""
        return bool(self.origins)

    def note(self) -> str:
        """``settings: compactor from NORMANDY_COMPACTOR; opts from ...``, for messages."""
        return "settings: " + "; ".join(f"{k} from {v}" for k, v in self.origins.items())


_NO_ORIGINS: Mapping[str, str] = MappingProxyType({})
#: One level of precedence: the values it sets and where each came from.
_Level = tuple[Mapping[str, Any], Mapping[str, str]]
#: In a :class:`_Plan`: the call's own argument is used.
_ARG: Any = object()
#: How many plans a :class:`Settings` keeps (one per kind of call; beyond, it starts over).
_MAX_PLANS = 256


class _Plan(NamedTuple):
    """What a kind of call takes from the sources: per key a value or :data:`_ARG`."""

    compactor: str
    opts: Any
    model: Any
    window: Any
    timeout: Any
    origins: Mapping[str, str]
    #: The window comes from a source and the options are the call's: options that pin
    #: ``context_window`` win over it (an argument is higher than any source).
    window_yields: bool
    origins_without_window: Mapping[str, str]
    survival: Any


@dataclass(frozen=True, eq=False)
class Settings:
    """The configuration sources found, highest precedence first (each a :class:`Layer`).

    :meth:`resolve` merges them with a call's own arguments and defaults.
    """

    layers: tuple[Layer, ...] = ()
    #: What was checked against the plugins, per plugin registry: ``""`` the sources,
    #: a compactor's name the options no source ties to a compactor, against it.
    _checked: set[tuple[str, int]] = field(default_factory=set, repr=False)
    #: Per kind of call (default, keys, compactor argument, which arguments were given,
    #: plugin registry): what it takes from the sources.
    _plans: dict[tuple[Any, ...], _Plan] = field(default_factory=dict, repr=False)
    #: Per plugin section: its tables in the files, checked.
    _sections: dict[SettingsSection, tuple[Layer, ...]] = field(default_factory=dict, repr=False)

    @property
    def files(self) -> tuple[Path, ...]:
        """The files read, highest precedence first."""
        return tuple(layer.path for layer in self.layers if layer.path is not None)

    def resolve(
        self,
        default: str,
        *,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        model: str | None = None,
        window: int | None = None,
        timeout: float | None = None,
        keys: tuple[str, ...] = KEYS,
        survival: Any = None,
    ) -> Resolved:
        """The settings of a call: its arguments (``None``: not given) over the sources,
        over ``default`` (the caller's default compactor).

        ``survival`` (the call's survival rules) replaces a source's ``survival`` table
        whole, as ``opts`` do.

        ``keys`` are those the sources may supply (``normandy demo`` takes only the
        compactor and its options). The sources are checked against the installed
        plugins (:meth:`check`) the first time; what a kind of call takes from them is
        worked out once, so a call costs about a microsecond after the first.
        """
        if not self.layers:
            return Resolved(
                compactor or default, opts, model, window, timeout, _NO_ORIGINS, survival
            )
        token = (
            default,
            keys,
            compactor,
            opts is None,
            model is None,
            window is None,
            timeout is None,
            survival is None,
            plugins.generation(),
        )
        plan = self._plans.get(token)
        if plan is None:
            plan = self._plan(default, keys, compactor, opts, model, window, timeout, survival)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[token] = plan
        chosen = opts if plan.opts is _ARG else plan.opts
        if chosen is not None and plan.opts is not _ARG:
            chosen = dict(chosen)  # a copy: nobody changes the settings through it
        origins = plan.origins
        resolved_window = window if plan.window is _ARG else plan.window
        if plan.window_yields and isinstance(chosen, Mapping) and "context_window" in chosen:
            resolved_window, origins = None, plan.origins_without_window
        return Resolved(
            plan.compactor,
            chosen,
            model if plan.model is _ARG else plan.model,
            resolved_window,
            timeout if plan.timeout is _ARG else plan.timeout,
            origins,
            survival if plan.survival is _ARG else plan.survival,
        )

    def _plan(
        self,
        default: str,
        keys: tuple[str, ...],
        compactor: str | None,
        opts: Any,
        model: Any,
        window: Any,
        timeout: Any,
        survival: Any,
    ) -> _Plan:
        """Work out, once per kind of call, what it takes from the sources."""
        self.check()
        given = {"compactor": compactor, "opts": opts, "model": model, "window": window}
        given["timeout"] = timeout
        given["survival"] = survival
        levels: list[_Level] = [({k: v for k, v in given.items() if v is not None}, _NO_ORIGINS)]
        for layer in self.layers:
            levels.append(({k: v for k, v in layer.values.items() if k in keys}, layer.origins))
        final = next((v[0]["compactor"] for v in levels if "compactor" in v[0]), default)
        effective = _effective(levels, final)
        self._check_floating(final)
        out, rank, origins = _take_highest(levels)
        chosen: Any = None
        for i, (values, where) in enumerate(levels):
            if "opts" in values and effective[i] == final:
                chosen, rank["opts"] = (values["opts"] if i else _ARG), i
                if i:
                    origins["opts"] = where["opts"]
                break
        window_yields = False
        if "window" in rank and "opts" in rank:
            if rank["opts"] == 0:
                window_yields = rank["window"] > 0
            elif "context_window" in chosen:
                if rank["window"] < rank["opts"]:  # the window's source is higher
                    chosen = {k: v for k, v in chosen.items() if k != "context_window"}
                elif rank["window"] > rank["opts"]:  # the options' pinned window is higher
                    out["window"] = None
                    origins.pop("window", None)
        ordered = {k: origins[k] for k in KEYS if k in origins}
        return _Plan(
            final,
            MappingProxyType(dict(chosen)) if isinstance(chosen, Mapping) else chosen,
            out["model"],
            out["window"],
            out["timeout"],
            MappingProxyType(ordered),
            window_yields,
            MappingProxyType({k: v for k, v in ordered.items() if k != "window"}),
            out["survival"],
        )

    def check(self) -> None:
        """Check the sources against the installed plugins (once per plugin registry):
        each configured compactor resolves, and options given for a configured compactor
        pass its options model (and its ``validate_opts`` when it needs no window; one
        that does is given its window where the config is prepared). Options no source
        ties to a compactor are checked against the compactor in use, when it is known
        (:meth:`resolve`). Errors begin with the source."""
        token = ("", plugins.generation())
        if token in self._checked:
            return
        levels: list[_Level] = [(layer.values, layer.origins) for layer in self.layers]
        effective = _effective(levels, None)
        for i, (values, where) in enumerate(levels):
            if "compactor" in values:
                _resolve(values["compactor"], where["compactor"])
            name = effective[i]
            if "opts" in values and name is not None:
                _check_opts(name, values["opts"], where["opts"])
        self._checked.add(token)

    def section(
        self, section: SettingsSection, environ: Mapping[str, str] | None = None
    ) -> tuple[Layer, ...]:
        """The sources of a plugin's ``section`` that set any of its keys, highest first:
        the environment (its keys' variables, read now from ``environ``, by default
        ``os.environ``), then the files, each value checked (the files' once).

        :raises SettingsError: of the section's ``error`` type: a bad value or an unknown
            key, naming the variable, or the file, the line and the key.
        """
        files = self._sections.get(section)
        if files is None:
            files = tuple(
                section.checked(layer.sections[section.name])
                for layer in self.layers
                if section.name in layer.sections
            )
            self._sections[section] = files
        env = section.from_environment(os.environ if environ is None else environ)
        return files if env is None else (env, *files)

    def describe(
        self, section: SettingsSection, environ: Mapping[str, str] | None = None
    ) -> tuple[SectionValue, ...]:
        """Per key of ``section``, the value the highest source gives and that source
        (``not set`` when none does): what ``normandy config`` shows of a plugin."""
        layers = self.section(section, environ)
        rows: list[SectionValue] = []
        for key in section.names:
            layer = highest(layers, key)
            if layer is None:
                rows.append(SectionValue(key, None, "not set"))
            else:
                rows.append(SectionValue(key, layer.values[key], layer.origins[key]))
        return tuple(rows)

    def _check_floating(self, final: str) -> None:
        """Check the options that no source ties to a compactor against ``final``."""
        token = (final, plugins.generation())
        if token in self._checked:
            return
        levels: list[_Level] = [(layer.values, layer.origins) for layer in self.layers]
        for (values, where), name in zip(levels, _effective(levels, None), strict=True):
            if "opts" in values and name is None:
                _check_opts(final, values["opts"], where["opts"])
        self._checked.add(token)


def _take_highest(
    levels: Sequence[_Level],
) -> tuple[dict[str, Any], dict[str, int], dict[str, str]]:
    """Per key but the options, what the highest level setting it gives (:data:`_ARG` for
    the call's own argument, level 0; ``None`` when no level sets it); the rank of that
    level; and, for a source, where the value came from."""
    out: dict[str, Any] = {}
    rank: dict[str, int] = {}
    origins: dict[str, str] = {}
    for key in ("model", "window", "timeout", "compactor", "survival"):
        out[key] = None
        for i, (values, where) in enumerate(levels):
            if key in values:
                out[key], rank[key] = (values[key] if i else _ARG), i
                if i:
                    origins[key] = where[key]
                break
    return out, rank, origins


def _check_opts(name: str, opts: Mapping[str, Any], source: str) -> None:
    """Options ``opts`` from ``source`` through compactor ``name``'s options model (and its
    ``validate_opts`` when it needs no window); refusals begin with ``source``."""
    comp = _resolve(name, source)
    parsed = comp.parse_options(opts, source)
    if not comp.needs_window(parsed):
        # the window is known (none); a compactor that needs one is checked with its
        # window where a config is prepared
        comp.validate_opts(parsed, source, None)


def _effective(levels: Sequence[_Level], final: str | None) -> list[str | None]:
    """Per level, the compactor its options configure: its own, else the nearest one a
    level below names, else ``final`` (the compactor in use)."""
    below: str | None = None
    out: list[str | None] = [final] * len(levels)
    for i in range(len(levels) - 1, -1, -1):
        name = levels[i][0].get("compactor")
        if name is not None:
            below = name
        out[i] = below if below is not None else final
    return out


def _resolve(name: str, source: str) -> Any:
    """The compactor ``name``; a plugin error is raised again prefixed with ``source``."""
    try:
        return plugins.resolve_compactor(name)
    except UnknownCompactorError as exc:
        raise UnknownCompactorError(exc.name, exc.installed, exc.suggestion, source=source) from exc
    except PluginError as exc:
        try:
            again = type(exc)(f"{source}: {exc}")
        except TypeError:
            again = PluginError(f"{source}: {exc}")
        raise again from exc


# -- reading the sources ----------------------------------------------------------------


def _env_layer(environ: Mapping[str, str]) -> Layer | None:
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    name = (environ.get(ENV_COMPACTOR) or "").strip()
    if name:
        values["compactor"] = name
        origins["compactor"] = ENV_COMPACTOR
    raw = (environ.get(ENV_OPTS) or "").strip()
    if raw:
        example = '\'{"strategy": "summarize"}\''
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SettingsError(
                f"{ENV_OPTS}: not valid JSON: {exc.msg} (line {exc.lineno}, column "
                f"{exc.colno}); expected a JSON object of option names to values, such as "
                f"{example}"
            ) from None
        if not isinstance(data, dict):
            raise SettingsError(
                f"{ENV_OPTS}: expected a JSON object of option names to values, such as "
                f"{example}, got {_json_type(data)}"
            )
        values["opts"] = data
        origins["opts"] = ENV_OPTS
    if not values:
        return None
    return Layer("environment", values, origins)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else type(value).__name__


_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def _parse_toml(path: Path) -> tuple[dict[str, Any], str]:
    """The TOML document at ``path`` and its text; :class:`SettingsError` naming the line."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SettingsError(f"{path}: line {line}: not UTF-8 text (TOML is UTF-8)") from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _TOML_AT.search(msg)
        if m is not None:
            where = f"line {m.group(1)}, column {m.group(2)}: "
            msg = msg[: m.start()]
        else:
            where = ""
        raise SettingsError(f"{path}: {where}not valid TOML: {msg}") from None


def _key_line(text: str, table: tuple[str, ...], key: str) -> int | None:
    """The line where ``key`` of ``table`` is set (best effort: ``key = ...``, a dotted
    ``key.x = ...`` or a ``[table.key]`` header), or ``None``."""
    current: tuple[str, ...] = ()
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("["):
            m = re.match(r"\[\[?\s*([^\]]+?)\s*\]", s)
            name = tuple(p.strip().strip("\"'") for p in m.group(1).split(".")) if m else ()
            if name == (*table, key):
                return n
            current = name
            continue
        if current == table:
            m = re.match(r"""\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*[.=]""", line)
            if m is not None and next(g for g in m.groups() if g is not None) == key:
                return n
    return None


def _origin(path: Path, text: str, table: tuple[str, ...], key: str) -> str:
    """Where ``key`` of ``table`` is set in the file: ``/app/normandy.toml: line 4: key
    'opts'``, ``... [tool.normandy.archive] key 'path'`` (the line when it is found)."""
    label = f"[{'.'.join(table)}] " if table else ""
    line = _key_line(text, table, key)
    return f"{path}: " + (f"line {line}: " if line else "") + f"{label}key {key!r}"


def _table_layer(path: Path, text: str, table: tuple[str, ...], data: Any) -> Layer:
    """The :class:`Layer` of the settings table ``data`` (``table`` is its place in the
    file: ``()`` for a ``normandy.toml``, ``("tool", "normandy")`` in a pyproject); the
    plugins' sections in it are kept as read, for the plugin to check (:meth:`Settings.section`)."""
    if not isinstance(data, dict):
        line = _key_line(text, table[:-1], table[-1]) if table else None
        raise SettingsError(
            f"{path}: "
            + (f"line {line}: " if line else "")
            + f"[{'.'.join(table)}] must be a table, got {type(data).__name__}"
        )
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    sections: dict[str, Layer] = {}
    for key, value in data.items():
        origin = _origin(path, text, table, key)
        if key not in KEYS:
            sections[key] = _section_table(path, text, (*table, key), value, origin)
            continue
        problem = _value_problem(key, value)
        if problem is not None:
            raise SettingsError(f"{origin}: {problem}, got {value!r}")
        if key == "survival":
            _check_survival(value, origin)
        values[key], origins[key] = value, origin
    pinned = (values.get("opts") or {}).get("context_window")
    if "window" in values and pinned is not None and pinned != values["window"]:
        raise SettingsError(
            f"{origins['window']}: window = {values['window']} contradicts the option "
            f"context_window = {pinned!r} of key 'opts'; set one of them"
        )
    name = f"{path} [{'.'.join(table)}]" if table else str(path)
    return Layer(name, values, origins, path, MappingProxyType(sections))


def _section_table(path: Path, text: str, table: tuple[str, ...], data: Any, origin: str) -> Layer:
    """The table ``data`` of a plugin's section at ``table`` in the file, as read (its
    keys and values are the plugin's to check); a key that is neither one of :data:`KEYS`
    nor a section an installed plugin declares is refused, naming ``origin``."""
    name = table[-1]
    declared = plugins.settings_section_entries()
    if not isinstance(data, dict):
        if name in declared:
            raise SettingsError(
                f"{origin}: must be a table of the {name!r} plugin's settings, "
                f"got {type(data).__name__}"
            )
        raise SettingsError(f"{origin}: {unknown_name(name, KEYS)}")
    if name not in declared:
        raise SettingsError(
            f"{origin}: {unknown_name(name, list(declared), 'section')} (a plugin declares "
            f"its section with an entry point in the group {plugins.SETTINGS_GROUP})"
        )
    origins = {key: _origin(path, text, table, key) for key in data}
    return Layer(f"{path} [{'.'.join(table)}]", dict(data), origins, path)


def _value_problem(key: str, value: Any) -> str | None:
    if key in ("compactor", "model"):
        if not isinstance(value, str) or not value.strip():
            return "must be a non-empty string"
        return None
    if key == "opts":
        return None if isinstance(value, dict) else "must be a table of option names to values"
    if key == "survival":
        return None if isinstance(value, dict) else "must be a table of survival rules"
    if key == "window":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return "must be a positive whole number of tokens"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        return "must be a positive number of seconds"
    return None


def _check_survival(value: Mapping[str, Any], source: str) -> None:
    """The survival rules of ``source`` through :class:`~normandy_core.SurvivalRules`; a
    refusal is a :class:`SettingsError` beginning with ``source`` (a ``keep_if`` there is
    refused: a predicate is code only)."""
    from normandy_core.conversation.survival import survival_rules
    from normandy_core.errors import OptionsError

    try:
        survival_rules(value, entry=source)
    except OptionsError as exc:
        raise SettingsError(str(exc)) from None


def _pyproject_table(path: Path, *, required: bool) -> Layer | None:
    """The ``[tool.normandy]`` layer of ``path``; ``None`` when it has none (an error when
    ``required``). A file that never mentions ``normandy`` is not parsed."""
    if not required:
        try:
            if b"normandy" not in path.read_bytes():
                return None
        except OSError:
            return None
    data, text = _parse_toml(path)
    tool = data.get("tool")
    if not isinstance(tool, dict) or "normandy" not in tool:
        if required:
            raise SettingsError(f"{path}: has no [tool.normandy] table (named by {ENV_CONFIG})")
        return None
    return _table_layer(path, text, _TABLE, tool["normandy"])


def _file_layers(path: Path, *, required: bool = True) -> list[Layer]:
    """The layer of one settings file: a pyproject's table, or a ``normandy.toml``."""
    if path.name == PYPROJECT:
        layer = _pyproject_table(path, required=required)
        return [] if layer is None else [layer]
    data, text = _parse_toml(path)
    return [_table_layer(path, text, (), data)]


def _look_up(start: Path) -> list[Layer]:
    """The layers of the first directory from ``start`` upward that holds a
    ``normandy.toml`` or a ``pyproject.toml`` with ``[tool.normandy]``."""
    for directory in (start, *start.parents):
        found: list[Layer] = []
        own = directory / FILE_NAME
        if own.is_file():
            found += _file_layers(own)
        project = directory / PYPROJECT
        if project.is_file():
            found += _file_layers(project, required=False)
        if found:
            return found
    return []


def read_settings_file(path: str | os.PathLike[str]) -> Settings:
    """The settings of one file only: a ``pyproject.toml``'s ``[tool.normandy]`` table
    (required), or a file in the ``normandy.toml`` form (any other name).

    :raises SettingsError: the file cannot be read, is not TOML, or holds a bad key or
        value; the message names the file, the line where it is known, and the key.
    """
    p = Path(path)
    if not p.is_file():
        raise SettingsError(f"{p}: no such settings file")
    return Settings(tuple(_file_layers(p.resolve())))


def load_settings(environ: Mapping[str, str], cwd: str | None) -> Settings:
    """The settings of ``environ`` and the files found from ``cwd`` upward (not cached;
    :func:`current_settings` caches)."""
    layers: list[Layer] = []
    env = _env_layer(environ)
    if env is not None:
        layers.append(env)
    chosen = (environ.get(ENV_CONFIG) or "").strip()
    if chosen.lower() == "off":
        pass
    elif chosen:
        p = Path(chosen)
        if not p.is_absolute() and cwd is not None:
            p = Path(cwd) / p
        if not p.is_file():
            raise SettingsError(f"{ENV_CONFIG}: {chosen!r}: no such settings file")
        layers += _file_layers(p)
    elif cwd is not None:
        layers += _look_up(Path(cwd))
    return Settings(tuple(layers))


def working_directory() -> str | None:
    """The working directory, or ``None`` when it was removed (no file is then found)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def highest(layers: Sequence[Layer], key: str) -> Layer | None:
    """The first of ``layers`` (highest precedence first) that sets ``key``, if any."""
    return next((layer for layer in layers if key in layer.values), None)


def settings_sections() -> dict[str, SettingsSection]:
    """The sections the installed plugins declare (entry points in the group
    :data:`~normandy_core.contract.plugins.SETTINGS_GROUP`), by name, their declarations
    imported: what ``normandy config`` shows besides the core's keys.

    :raises PluginLoadError: a declaration fails to import, or is not a
        :class:`SettingsSection` of its entry point's name.
    """
    found: dict[str, SettingsSection] = {}
    for name, load in plugins.settings_section_entries().items():
        section = load()
        if not isinstance(section, SettingsSection) or section.name != name:
            raise PluginLoadError(
                f"settings section {name!r} (group {plugins.SETTINGS_GROUP}) is not a "
                f"SettingsSection named {name!r}: {section!r}"
            )
        found[name] = section
    return found


class _CurrentSettings:
    """The settings of this process's working directory and environment, read again
    only when the directory or one of the three variables changed."""

    def __init__(self) -> None:
        #: What the settings were read from, and them; replaced whole, so a thread reads
        #: one consistent pair.
        self._last: tuple[tuple[str | None, ...], Settings] | None = None

    def get(self) -> Settings:
        """The settings in force (see :func:`current_settings`)."""
        cwd = working_directory()
        environ = os.environ
        key = (cwd, environ.get(ENV_COMPACTOR), environ.get(ENV_OPTS), environ.get(ENV_CONFIG))
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        settings = load_settings(environ, cwd)
        self._last = (key, settings)
        return settings

    def forget(self) -> None:
        """Read the sources again at the next :meth:`get`."""
        self._last = None


_CURRENT = _CurrentSettings()


def current_settings() -> Settings:
    """The settings of this process's environment and working directory.

    Read on first use and again whenever the working directory or one of
    ``NORMANDY_COMPACTOR``, ``NORMANDY_COMPACTOR_OPTS`` and ``NORMANDY_CONFIG`` changes;
    otherwise a microsecond or two (files edited meanwhile: :func:`reload_settings`). A
    bad source raises (:class:`~normandy_core.SettingsError` and kin) on every call
    until it is fixed.
    """
    return _CURRENT.get()


def reload_settings() -> None:
    """Forget the settings read, so the next use reads the environment and files again."""
    _CURRENT.forget()
