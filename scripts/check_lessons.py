"""Run every lesson without touching the repository, then compare its tables with the committed.

The lessons run under `pytest --nbmake` with `LLMENGINE_ARTIFACTS` pointing at a temporary
folder, so their figures and reports land there. Afterwards every deterministic table the
lessons wrote (`<tmp>/reports/*.md`) must equal the committed `reports/*.md` byte for byte,
and no committed table may be left without a lesson that writes it. Wall-clock tables
(`reports/wallclock/`) are never compared. A lesson that writes into the repository despite
the variable is caught too: the lesson, figure and report folders must look the same in
`git status` before and after.

The lessons run on `--workers` processes at once (pytest-xdist), each notebook whole in one:
they share nothing but the artifacts folder, where each writes its own files. Wall-clock
tables measured beside another lesson are noisier for it; they are never compared.

Usage: check_lessons.py [--artifacts DIR] [--timeout SECONDS] [--workers N]
With --artifacts DIR it skips running the lessons and only compares DIR/reports.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS_ENV = "LLMENGINE_ARTIFACTS"
WATCHED = ("lessons", "figures", "reports")
PYTEST_NO_TESTS = 5


def compare_reports(produced: Path, committed: Path) -> list[str]:
    """One message per table that differs, is missing, or is committed but no longer written."""
    made = {path.name: path for path in produced.glob("*.md")}
    kept = {path.name: path for path in committed.glob("*.md")}
    problems = []
    for name in sorted(made.keys() | kept.keys()):
        label = f"reports/{name}"
        if name not in kept:
            problems.append(f"{label}: written by a lesson but not committed (run `make reports`)")
        elif name not in made:
            problems.append(f"{label}: committed, but no lesson writes it any more (delete it)")
        else:
            old = kept[name].read_text(encoding="utf-8").splitlines(keepends=True)
            new = made[name].read_text(encoding="utf-8").splitlines(keepends=True)
            if old != new:
                diff = difflib.unified_diff(old, new, f"{label} (committed)", f"{label} (now)")
                problems.append(f"{label}: differs from what the lessons write\n{''.join(diff)}")
    return problems


def repository_changes() -> str | None:
    """`git status` of the folders lessons could write into; None outside a git checkout."""
    result = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", *WATCHED],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout if result.returncode == 0 else None


def run_lessons(notebooks: Sequence[Path], artifacts: Path, timeout: int, workers: int) -> int:
    """Execute the notebooks with nbmake, artifacts redirected; return pytest's exit status."""
    env = {**os.environ, ARTIFACTS_ENV: str(artifacts)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--nbmake",
        f"--nbmake-timeout={timeout}",
        f"--numprocesses={workers}",
        "--durations=0",
        "-p",
        "no:cacheprovider",
        *map(str, notebooks),
    ]
    status = subprocess.run(command, cwd=REPO_ROOT, env=env, check=False).returncode
    return 0 if status == PYTEST_NO_TESTS else status


def check(artifacts: Path) -> int:
    """Compare the tables under `artifacts`; print the verdict; 0 when all match."""
    problems = compare_reports(artifacts / "reports", REPO_ROOT / "reports")
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    if problems:
        return 1
    count = len(list((artifacts / "reports").glob("*.md")))
    print(f"reports: all {count} deterministic tables match the committed ones")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--artifacts", type=Path, help="compare this folder, run nothing")
    parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell")
    parser.add_argument("--workers", type=int, default=2, help="lessons run at once")
    args = parser.parse_args(argv)
    if args.artifacts is not None:
        return check(args.artifacts)
    notebooks = sorted((REPO_ROOT / "lessons").glob("*.ipynb"))
    if not notebooks:
        print("lessons: none yet, nothing to execute")
    before = repository_changes()
    with tempfile.TemporaryDirectory(prefix="llmengine-artifacts-") as folder:
        status = (
            run_lessons(notebooks, Path(folder), args.timeout, args.workers) if notebooks else 0
        )
        if status != 0:
            return status
        after = repository_changes()
        if before != after:
            print(
                f"FAIL running the lessons changed files in {', '.join(WATCHED)}:\n"
                f"before:\n{before}after:\n{after}",
                file=sys.stderr,
            )
            return 1
        return check(Path(folder))


if __name__ == "__main__":
    sys.exit(main())
