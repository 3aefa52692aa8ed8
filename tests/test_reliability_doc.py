"""docs/reliability.md stays true: its table is the one tests/reliability_counts.py makes.

The numbers in that module are imported by the tests each row names, which run that
many attempts and assert every one survived; this test checks that the page shows
exactly those rows and that every test it names exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from reliability_counts import ROWS, render_table

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reliability.md"


def test_the_table_is_generated_from_the_counts_the_tests_use():
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- reliability-table:begin -->\n(.*?)<!-- reliability-table:end -->", text, re.S
    )
    assert found, "docs/reliability.md lost its table markers"
    assert found.group(1) == render_table(), (
        "docs/reliability.md is stale; regenerate the table with "
        "`python tests/reliability_counts.py`"
    )


def test_every_row_names_an_existing_test_that_uses_the_counts():
    assert len({r.test for r in ROWS}) == len(ROWS)
    for row in ROWS:
        path, _, name = row.test.partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        tree = ast.parse(source)
        functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in functions, row.test
        assert "from reliability_counts import" in source, f"{path} does not use the counts"
