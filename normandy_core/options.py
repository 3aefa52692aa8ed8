"""Validating compactor options against a pydantic model, with errors that name everything."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from normandy_core.errors import OptionsError
from normandy_core.tokens import get_counter

__all__ = ["CompactorOptions", "CounterSpec", "options_mapping", "validate_options"]

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


def options_mapping(opts: object, *, entry: str, compactor: str) -> Mapping[str, Any]:
    """``opts`` when it is a mapping (``None`` is no options); else :class:`OptionsError`."""
    if opts is None:
        return {}
    if not isinstance(opts, Mapping):
        raise OptionsError(
            f"{entry}: compactor {compactor!r} options must be a mapping of option names "
            f"to values, got {type(opts).__name__}"
        )
    return opts


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

    A rule across options (a model validator) names the options its message mentions::

          options 'target' and 'trigger': target (0.9) must not exceed trigger (0.5): ...
    """
    opts = options_mapping(opts, entry=entry, compactor=compactor)
    try:
        return model.model_validate(dict(opts))
    except ValidationError as exc:
        allowed = ", ".join(sorted(model.model_fields)) or "none"
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            text = _message(err)
            if err["type"] == "extra_forbidden":
                lines.append(f"  option {where!r}: unknown option; allowed options: {allowed}")
            elif not where:  # a rule across options
                names = _mentioned(text, model) or sorted(opts)
                lines.append(f"  {_options_label(names)}: {text}")
            else:
                lines.append(f"  option {where!r}: {text} (got {err.get('input')!r})")
        raise OptionsError(
            f"{entry}: compactor {compactor!r} refused its options:\n" + "\n".join(lines)
        ) from exc


#: Prefixes pydantic puts before the text of an exception raised by a validator.
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def _message(err: Any) -> str:
    """The error's text; a validator's own exception without pydantic's prefix."""
    text = str(err["msg"])
    if err["type"] in ("value_error", "assertion_error"):
        raised = (err.get("ctx") or {}).get("error")
        if raised is not None and str(raised):
            return str(raised)
    for prefix in _PYDANTIC_PREFIXES:
        text = text.removeprefix(prefix)
    return text


def _mentioned(text: str, model: type[BaseModel]) -> list[str]:
    """The options of ``model`` that ``text`` names (as whole words), in order of mention."""
    found = []
    for name in model.model_fields:
        m = re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text)
        if m is not None:
            found.append((m.start(), name))
    return [name for _, name in sorted(found)]


def _options_label(names: list[str]) -> str:
    """``option 'a'``, ``options 'a' and 'b'``, ``options 'a', 'b' and 'c'``, ``options``."""
    quoted = [repr(n) for n in names]
    if not quoted:
        return "options"
    if len(quoted) == 1:
        return f"option {quoted[0]}"
    return f"options {', '.join(quoted[:-1])} and {quoted[-1]}"
