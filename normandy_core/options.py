"""Validating compactor options against a pydantic model, with errors that name everything."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from normandy_core.errors import OptionsError
from normandy_core.tokens import get_counter

__all__ = ["CompactorOptions", "CounterSpec", "parse_options", "validate_options"]

M = TypeVar("M", bound=BaseModel)


def _known_counter(spec: str) -> str:
    get_counter(spec)  # raises ValueError naming the known choices
    return spec


#: A compactor option naming a token counter (``estimate``, ``conservative``, a tiktoken
#: encoding or model name), refused at config time when :func:`get_counter` refuses it.
CounterSpec = Annotated[str, AfterValidator(_known_counter)]


class CompactorOptions(BaseModel):
    """Base class for compactor option models: unknown options are refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def validate_options(
    model: type[M],
    opts: Mapping[str, Any] | None,
    *,
    entry: str,
    compactor: str,
) -> M:
    """Validate ``opts`` with ``model`` or raise :class:`OptionsError`.

    The message begins with ``entry`` (the public entry point that made the config), then
    names the compactor, each option at fault and what is allowed, for example::

        normandy_core.AgentConfig(): compactor 'window_manager' refused its options:
          option 'trigger': Input should be less than or equal to 1 (got 1.5)
    """
    if opts is None:
        opts = {}
    if not isinstance(opts, Mapping):
        raise OptionsError(
            f"{entry}: compactor {compactor!r} options must be a mapping of option names "
            f"to values, got {type(opts).__name__}"
        )
    try:
        return model.model_validate(dict(opts))
    except ValidationError as exc:
        allowed = ", ".join(sorted(model.model_fields)) or "none"
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(options)"
            if err["type"] == "extra_forbidden":
                lines.append(f"  option {where!r}: unknown option; allowed options: {allowed}")
            else:
                lines.append(f"  option {where!r}: {err['msg']} (got {err.get('input')!r})")
        raise OptionsError(
            f"{entry}: compactor {compactor!r} refused its options:\n" + "\n".join(lines)
        ) from exc


_parsed: dict[tuple[type[BaseModel], str], BaseModel] = {}
_parsed_lock = threading.Lock()
_PARSED_MAX = 512


def parse_options(
    model: type[M],
    opts: Mapping[str, Any] | None,
    *,
    compactor: str,
    entry: str | None = None,
) -> M:
    """:func:`validate_options`, memoised per model and options, for ``maybe_compact``.

    A compactor parses its options at every boundary; this makes the repeat cost a JSON
    dump and a dict look-up. Only accepted options are remembered, so a refusal is raised
    every time; options that are not JSON-serialisable are simply validated each call.
    ``entry`` defaults to ``"<compactor>.maybe_compact()"``.
    """
    try:
        key: str | None = json.dumps(opts or {}, sort_keys=True)
    except (TypeError, ValueError):
        key = None
    if key is not None:
        hit = _parsed.get((model, key))
        if hit is not None:
            return hit  # type: ignore[return-value]
    parsed = validate_options(
        model, opts, entry=entry or f"{compactor}.maybe_compact()", compactor=compactor
    )
    if key is not None:
        with _parsed_lock:
            if len(_parsed) >= _PARSED_MAX:
                _parsed.clear()
            _parsed[(model, key)] = parsed
    return parsed
