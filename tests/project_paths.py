"""Where this test run imports the project from, for the subprocesses the tests start.

A subprocess given an environment of its own (a throwaway venv, an example plugin's test
run, a fake distribution on ``PYTHONPATH``) must import the same ``normandy_core`` and
in-tree plugins as the test process: in a checkout installed in editable mode that is
the checkout either way, but with the code under test put on ``PYTHONPATH`` (a second
work tree beside an installed one) only this path says so.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["PROJECT_PACKAGES", "project_pythonpath", "with_project_path"]

PROJECT_PACKAGES = (
    "normandy_core",
    "normandy_window_manager",
    "normandy_clear_tool_results",
    "normandy_pipeline",
    "normandy_archive",
    "normandy_langchain",
)


def project_pythonpath() -> str:
    """The directories holding the project's packages as this process imports them."""
    dirs: list[str] = []
    for name in PROJECT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        parent = str(Path(next(iter(spec.submodule_search_locations))).parent)
        if parent not in dirs:
            dirs.append(parent)
    return os.pathsep.join(dirs)


def with_project_path(*first: str) -> str:
    """``first`` then the project's directories, as one ``PYTHONPATH`` value."""
    return os.pathsep.join([*first, project_pythonpath()])
