"""A griffe extension for the API reference (docs/api/): reST docstrings read as Markdown.

The docstrings of ``normandy_core`` are written for Python's own tools: Sphinx roles
(``:func:`compact```, ``:class:`~normandy_core.Entry```), double-backtick literals,
``::`` before a literal block and ``#:`` comments above attributes. mkdocstrings renders
docstrings as Markdown, so before it parses them this extension

- turns each role into a link to the object when it is in the package (a cross-reference
  mkdocs-autorefs resolves, or leaves as plain code when the object is not on any page),
  and into a code span otherwise; a leading ``~`` shows only the last name, as in Sphinx;
- turns ````x```` into ```x``` and a paragraph's closing ``::`` into ``:``;
- gives an attribute without a docstring the ``#:`` comment lines above it;
- leaves private parameters (``_name``, such as a dataclass's private fields) out of
  the signatures shown.

Enabled in mkdocs.yml (``extensions: [scripts/griffe_rst.py]``); the pages stay
readable and the docstrings stay reST for ``help()`` and the hook reference generator.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_BLOCK_START = re.compile(r"(?m)(\S)::$")


class ReSTDocstrings(griffe.Extension):
    """Rewrite the package's reST docstrings into Markdown once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Convert every docstring of ``pkg``, resolving roles against the loaded modules."""
        for obj in _walk(pkg):
            if obj.is_attribute and obj.docstring is None:
                comment = _comment_above(obj)
                if comment:
                    obj.docstring = griffe.Docstring(comment, parent=obj)
            if obj.docstring is not None:
                obj.docstring.value = _markdown(obj.docstring.value, obj, loader)
            if isinstance(obj, griffe.Function):
                for param in [p.name for p in obj.parameters if p.name.startswith("_")]:
                    del obj.parameters[param]


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in list(obj.members.values()):
        if not member.is_alias:
            found.extend(_walk(member))  # type: ignore[arg-type]
    return found


def _comment_above(obj: griffe.Object) -> str:
    """The ``#:`` comment lines right above an attribute's first line, as text."""
    if obj.lineno is None:
        return ""
    try:
        lines = obj.module.lines
    except (AttributeError, KeyError, ValueError):
        return ""
    taken: list[str] = []
    index = obj.lineno - 2
    while index >= 0 and lines[index].strip().startswith("#:"):
        taken.insert(0, lines[index].strip()[2:].strip())
        index -= 1
    return "\n".join(taken)


def _scopes(obj: griffe.Object) -> list[str]:
    """Where a bare name in ``obj``'s docstring may live, nearest first."""
    scopes: list[str] = []
    current: griffe.Object | None = obj
    while current is not None:
        scopes.append(current.path)
        current = current.parent
    return [*scopes, "normandy_core"]


def _resolve(target: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str | None:
    target = target.removesuffix("()")
    for scope in ["", *_scopes(obj)]:
        path = f"{scope}.{target}" if scope else target
        try:
            found = loader.modules_collection[path]
            return str(found.canonical_path if found.is_alias else found.path)
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
    return None


def _markdown(text: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
    def role(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2)
        shown = target.rsplit(".", 1)[-1] if short else target
        code = f"<code>{html.escape(shown)}</code>"
        path = _resolve(target, obj, loader)
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    text = _ROLE.sub(role, text)
    text = _LITERAL.sub(r"`\1`", text)
    return _BLOCK_START.sub(r"\1:", text)
