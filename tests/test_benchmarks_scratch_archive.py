"""Every benchmark module writes its archive into a scratch directory, never the user's home."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import os, sys
import {module}
print(os.environ.get("NORMANDY_ARCHIVE_PATH", ""))
"""


@pytest.mark.parametrize("module", ["benchmarks.round_aware", "benchmarks.cost", "benchmarks"])
def test_a_benchmark_module_run_without_an_archive_path_gets_a_scratch_one(
    module: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NORMANDY_ARCHIVE_")}
    env["HOME"] = str(tmp_path / "home")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    path = out.stdout.strip()
    assert "normandy-bench-archive-" in path, path
    assert not path.startswith(env["HOME"])
    # removed at exit: nothing is left behind either
    assert not Path(path).parent.exists()
