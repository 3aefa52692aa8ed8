"""Checks that keep the house in order (issue 30): short functions, no hand-tuned reaches.

* No function or method in ``normandy_core/`` or ``plugins/*/src/`` is longer than
  ``MAX_LINES`` lines, its docstring excluded (decorators are not counted: they are not
  part of ``lineno``..``end_lineno`` of the ``def``).
* ``normandy_core/`` has no ``global`` statement, no ``tuple.__new__`` and none of the
  private attributes the boundary's fast path reached into (``._prepared[``, ``._base``,
  ``._exact``, ``._models``, ``._hookimpls``): any attribute by those names counts, the
  owner's own ``self._base`` too, as the issue's ``grep`` does. Only code counts: strings
  (docstrings included) and comments are blanked before the search, so a docstring that
  explains why a reach is gone does not trip it; an f-string's ``{...}`` is code.

Both read the source files only (no import), so they run in well under a second.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "normandy_core"

#: The longest a function may be, in lines, without its docstring.
MAX_LINES = 60

#: What ``normandy_core/`` code may not contain, by name: a pattern over the code with its
#: strings and comments blanked. ``._base`` and the others are whole attribute names
#: (``._base_url`` is another attribute).
FORBIDDEN = {
    "global statement": re.compile(r"\bglobal\s"),
    "tuple.__new__": re.compile(r"\btuple\s*\.\s*__new__\b"),
    "._prepared[": re.compile(r"\._prepared\s*\["),
    "._base": re.compile(r"\._base\b"),
    "._exact": re.compile(r"\._exact\b"),
    "._models": re.compile(r"\._models\b"),
    "._hookimpls": re.compile(r"\._hookimpls\b"),
}

#: Tokens whose text is not code: strings and comments (and, from Python 3.12, the literal
#: parts of an f-string; its ``{...}`` expressions stay code).
_NOT_CODE = {tokenize.STRING, tokenize.COMMENT}
if sys.version_info >= (3, 12):
    _NOT_CODE.add(tokenize.FSTRING_MIDDLE)


def source_files() -> list[Path]:
    """Every Python file of the core and of the plugins' ``src`` trees."""
    roots = [CORE, *sorted(ROOT.glob("plugins/*/src"))]
    return sorted(p for root in roots for p in root.rglob("*.py"))


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
    ):
        return first.end_lineno - first.lineno + 1
    return 0


def function_lengths(source: str) -> Iterator[tuple[int, str, int]]:
    """``(line, qualified name, length)`` of every function and method in ``source``,
    nested ones included, each measured as ``end_lineno - lineno + 1`` minus its
    docstring's lines."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[int, str, int]]:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                length = child.end_lineno - child.lineno + 1 - _docstring_lines(child)
                yield child.lineno, name, length
                name += "."
            elif isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}."
            yield from walk(child, name)

    yield from walk(ast.parse(source), "")


def long_functions(paths: list[Path], root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` for every function of ``paths`` over ``limit``, each
    path relative to ``root``."""
    found = []
    for path in paths:
        for line, name, length in function_lengths(path.read_text(encoding="utf-8")):
            if length > limit:
                found.append(f"{path.relative_to(root)}:{line} {name} ({length} lines)")
    return found


def _fstring_expressions(token: str) -> str:
    """The code inside an f-string token's braces, one expression after another (before
    Python 3.12 an f-string is one ``STRING`` token, its expressions included)."""
    if not re.match(r"[a-zA-Z]*[fF]", token):
        return ""
    tree = ast.parse(token, mode="eval")
    values = [n.value for n in ast.walk(tree) if isinstance(n, ast.FormattedValue)]
    return " ".join(ast.unparse(value) for value in values)


def code_only(source: str) -> list[str]:
    """The lines of ``source`` with every string and comment blanked to spaces; an
    f-string's expressions are code and stay, on the line where the f-string starts."""
    lines = [list(line) for line in source.splitlines()]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            continue
        (srow, scol), (erow, ecol) = tok.start, tok.end
        for row in range(srow, erow + 1):
            line = lines[row - 1]
            start = scol if row == srow else 0
            end = ecol if row == erow else len(line)
            line[start:end] = " " * (end - start)
        if tok.type == tokenize.STRING:
            lines[srow - 1].extend(" " + _fstring_expressions(tok.string))
    return ["".join(line) for line in lines]


def forbidden_reaches(source: str) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for every ``FORBIDDEN`` pattern in the code of ``source``."""
    for number, line in enumerate(code_only(source), start=1):
        for what, pattern in FORBIDDEN.items():
            if pattern.search(line):
                yield number, what


def test_no_function_is_longer_than_a_screen() -> None:
    found = long_functions(source_files())
    assert not found, (
        f"{len(found)} functions are longer than {MAX_LINES} lines without their "
        "docstring; split them:\n" + "\n".join(found)
    )


def test_the_core_has_no_globals_constructor_skips_or_private_reaches() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} {what}"
        for path in sorted(CORE.rglob("*.py"))
        for line, what in forbidden_reaches(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        f"{len(found)} lines of normandy_core/ keep what issue 30 removes "
        "(a global cache, a skipped constructor, a read of private state):\n" + "\n".join(found)
    )


# The checkers themselves, on small sources whose answer is known.


def test_the_files_checked_are_the_core_and_every_plugins_src() -> None:
    files = [p.relative_to(ROOT) for p in source_files()]
    assert Path("normandy_core/contract/boundary.py") in files
    plugins = {p.parts[1] for p in files if p.parts[0] == "plugins"}
    assert plugins >= {"normandy-window-manager", "normandy-archive", "normandy-native"}
    assert all(p.parts[0] == "normandy_core" or p.parts[2] == "src" for p in files)


def test_a_function_is_measured_without_its_docstring_and_decorators() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES - 1))
    source = textwrap.dedent(
        '''\
        import functools


        class Box:
            @functools.cache
            @staticmethod
            def method():
                """A docstring
                over three
                lines."""
        '''
    )
    source += body + "\n\n"
    source += textwrap.dedent(
        """\
        async def outer():
            def inner():
                return 1
            return inner
        """
    )
    # def at line 7, docstring 8-10, body 11-69: 63 lines, 60 without the docstring
    assert list(function_lengths(source)) == [
        (7, "Box.method", MAX_LINES),
        (71, "outer", 4),
        (72, "outer.inner", 2),
    ]


def test_one_line_over_the_limit_is_listed_with_its_place(tmp_path: Path) -> None:
    body = "\n".join(f"    y = {i}" for i in range(MAX_LINES))
    fake = tmp_path / "pkg" / "long.py"
    fake.parent.mkdir()
    fake.write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n", encoding="utf-8")
    assert long_functions([fake], root=tmp_path) == [f"pkg/long.py:1 long ({MAX_LINES + 1} lines)"]
    assert long_functions([fake], root=tmp_path, limit=MAX_LINES + 1) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('"""Once `global _cache` held it; counter._base is gone."""\n', []),
        ("x = 1  # no more tuple.__new__ or acc._prepared[0]\n", []),
        ("msg = 'read counter._exact'\n", []),
        ("def f():\n    global _cache\n", [(2, "global statement")]),
        ("new = tuple.__new__\n", [(1, "tuple.__new__")]),
        ("p = acc._prepared[0]\n", [(1, "._prepared[")]),
        ("b = counter._base\n", [(1, "._base")]),
        ("b = client._base_url\n", []),
        ("if cal._models and c._exact: pass\n", [(1, "._exact"), (1, "._models")]),
        ("h = caller._hookimpls\n", [(1, "._hookimpls")]),
        ('s = f"{counter._base} tokens"\n', [(1, "._base")]),
        ('s = f"counter._base is {n}"\n', []),
        ('s = """\n    counter._base\n"""\nt = c._exact\n', [(4, "._exact")]),
    ],
)
def test_only_code_counts_not_strings_or_comments(
    source: str, expected: list[tuple[int, str]]
) -> None:
    assert sorted(forbidden_reaches(source)) == sorted(expected)
