"""The install commands the documentation gives, and the distributions' declared metadata.

An install command is a line of a ``bash`` block of README.md or docs/ that runs
``pip install``. The pages give each as ``uv pip install ...`` (``pip install`` takes the
same arguments), so tests/test_install.py can run every one of them, as written, in a
fresh virtual environment.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doc_blocks import ROOT, Block, blocks
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # the core's own dependency below 3.11
    import tomli as tomllib

__all__ = [
    "PAGES",
    "UV_INSTALL",
    "InstallBlock",
    "distribution_roots",
    "extra_requirements",
    "install_blocks",
    "pyproject",
    "rel",
]

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: How every install command of the pages starts.
UV_INSTALL = "uv pip install "


def rel(page: Path) -> str:
    """``docs/x.md``: a page as the tests name it."""
    return page.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class InstallBlock:
    """A ``bash`` block of a page holding at least one ``pip install`` line."""

    block: Block

    @property
    def page(self) -> str:
        """The page, as :func:`rel` names it."""
        return rel(self.block.path)

    @property
    def lines(self) -> list[str]:
        """The block's commands, one a line, without the comments that follow them."""
        found = []
        for line in self.block.code.splitlines():
            # A comment starts at a '#' after a space (a URL's '#subdirectory=' does not).
            command = re.sub(r"(^|\s)#.*$", "", line).strip()
            if command:
                found.append(command)
        return found

    @property
    def installs(self) -> list[str]:
        """The lines that install something with ``pip``."""
        return [line for line in self.lines if "pip install " in line]


def install_blocks(pages: list[Path] | None = None) -> list[InstallBlock]:
    """Every ``bash`` block of ``pages`` (all of them by default) that installs something."""
    found = []
    for page in pages or PAGES:
        for block in blocks(page):
            candidate = InstallBlock(block)
            if block.lang == "bash" and candidate.installs:
                found.append(candidate)
    return found


def pyproject(root: Path) -> dict[str, Any]:
    """The ``pyproject.toml`` of the distribution in the folder ``root``, parsed."""
    with (root / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def distribution_roots() -> dict[str, Path]:
    """Every distribution of the workspace by name: the core and each ``plugins/*``."""
    roots = [ROOT, *sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))]
    return {pyproject(r)["project"]["name"]: r for r in roots}


def extra_requirements(root: Path, extra: str) -> list[Requirement]:
    """The requirements of the optional dependency ``extra`` of the distribution at ``root``."""
    extras = pyproject(root)["project"].get("optional-dependencies", {})
    return [Requirement(r) for r in extras.get(extra, [])]
