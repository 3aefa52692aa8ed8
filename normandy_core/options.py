"""Validating compactor options against a pydantic model, with errors that name everything."""

from __future__ import annotations

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
    """
    opts = options_mapping(opts, entry=entry, compactor=compactor)
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
