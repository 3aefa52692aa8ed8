"""``make test`` builds the docs even when pytest fails (issue 33 item 9): make stopped at
the failed prerequisite, so a run whose tests failed (one started with SIGINT ignored,
say) never reported whether the docs still built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # starts make and its commands
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("failing", ["pytest", "mkdocs", ""])
def test_make_test_runs_the_docs_build_whatever_pytest_did(tmp_path: Path, failing: str) -> None:
    """Every command ``make test`` runs goes through a stand-in ``$(RUN)`` that records it
    and fails for the program named by ``failing``; uv itself is stood in by ``true``."""
    log = tmp_path / "ran.txt"
    runner = tmp_path / "run"
    runner.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"sys.exit(1 if {failing!r} and sys.argv[1] == {failing!r} else 0)\n"
    )
    runner.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    proc = subprocess.run(
        ["make", "-C", str(ROOT), "test", f"RUN={runner}", "UV=true", "UV_DEP="],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    ran = log.read_text().splitlines()
    programs = [line.split()[0] for line in ran]
    assert "pytest" in programs and "mkdocs" in programs, (ran, proc.stdout, proc.stderr)
    assert programs.index("pytest") < programs.index("mkdocs")
    assert (proc.returncode != 0) == bool(failing), (proc.returncode, proc.stderr)
