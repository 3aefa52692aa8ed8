"""Validating compactor options against a pydantic model, with errors that name everything."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from normandy_core.conversation.tokens import get_counter
from normandy_core.errors import OptionsError, unknown_name

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
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            text = _message(err)
            if err["type"] == "extra_forbidden":
                known = model.model_fields
                lines.append(f"  option {where!r}: {unknown_name(where, known, 'option')}")
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


# -- describing an options model (``normandy plugins show``) ---------------------------------


def describe_options(model: type[BaseModel]) -> list[dict[str, Any]]:
    """One ``{"name", "type", "required", "default", "description"}`` per option of
    ``model``, in declaration order, JSON-ready.

    ``type`` is readable text (``int (>= 0)``, ``'a' | 'b'``, ``float (> 0.0, <= 1.0) |
    None``, ``list of Step (length >= 1)``) with the field's constraints; ``default`` is
    ``None`` for a required option; ``description`` is the field's ``description`` or,
    failing that, the docstring written under the field (the convention of this
    project's option models), else empty.
    """
    docs = _attribute_docstrings(model)
    out = []
    for name, info in model.model_fields.items():
        required = info.is_required()
        default = None if required else info.get_default(call_default_factory=True)
        out.append(
            {
                "name": name,
                "type": type_text(info.annotation, info.metadata),
                "required": required,
                "default": _json_ready(default),
                "description": info.description or docs.get(name, ""),
            }
        )
    return out


def model_description(model: type[BaseModel]) -> str:
    """The options model's own docstring (not one it inherits), cleaned, or empty."""
    import inspect

    doc = model.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def _json_ready(value: Any) -> Any:
    import json

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (tuple, list)):
        return [_json_ready(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _constraint(item: Any) -> str | None:
    """``>= 0`` for ``annotated_types.Ge(0)`` and its kin; ``None`` for other metadata."""
    for attr, text in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        value = getattr(item, attr, None)
        if value is not None and type(item).__name__.lower() == attr:
            return f"{text} {value}"
    if type(item).__name__ == "MinLen":
        return f"length >= {item.min_length}"
    if type(item).__name__ == "MaxLen":
        return f"length <= {item.max_length}"
    if type(item).__name__ == "MultipleOf":
        return f"a multiple of {item.multiple_of}"
    return None


def type_text(annotation: Any, metadata: Any = ()) -> str:
    """A readable type for an option's annotation, with the constraints in ``metadata``."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0], [*args[1:], *metadata])
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        members = [a for a in args if a is not type(None)]
        text = " | ".join(type_text(a, metadata) for a in members)
        return text + (" | None" if len(members) < len(args) else "")
    constraints = [c for c in (_constraint(m) for m in metadata) if c is not None]
    suffix = f" ({', '.join(constraints)})" if constraints else ""
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args) + suffix
    if origin in (tuple, list, set, frozenset) or (
        origin is not None and getattr(origin, "__name__", "") in ("Sequence", "Iterable")
    ):
        items = [a for a in args if a is not Ellipsis]
        inner = type_text(items[0]) if len(items) == 1 else ", ".join(map(type_text, items))
        return (f"list of {inner}" if inner else "list") + suffix
    if origin in (dict,) or (origin is not None and getattr(origin, "__name__", "") == "Mapping"):
        if len(args) == 2:
            return f"mapping of {type_text(args[0])} to {type_text(args[1])}" + suffix
        return "mapping" + suffix
    if annotation is Any:
        return "any" + suffix
    if isinstance(annotation, type):
        return annotation.__name__ + suffix
    return str(annotation).replace("typing.", "") + suffix


def _attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The docstrings written under the fields of ``model`` and its bases (read from the
    source; empty where the source cannot be read)."""
    import ast
    import inspect
    import itertools
    import textwrap

    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        node = tree.body[0] if tree.body else None
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for stmt, nxt in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs
