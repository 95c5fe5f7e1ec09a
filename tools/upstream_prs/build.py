"""Build the VISTA3D PR series as stacked branches of an upstream MONAI tree, and optionally test each branch.

    python tools/upstream_prs/build.py --monai-src PATH [--test] [--tests-from PATH] [--python PYTHON]

PATH is a MONAI git clone (e.g. at tag 1.6.1) or an unpacked ``monai==1.6.1`` sdist; a folder that is not a git
repository gets one, with the untouched tree as its first commit. Branch ``vista3d-pr-NN`` is the PR's single
commit on top of the previous PR's branch; the checkout of PATH itself is left as it is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from any directory

from tools.upstream_prs.edits import EditError  # noqa: E402
from tools.upstream_prs.prs import PR, PRS, REPO  # noqa: E402
from tools.upstream_prs.writeups import missing, summary  # noqa: E402

GIT_ID = ["-c", "user.name=vista3d-upstream-prs", "-c", "user.email=vista3d-upstream-prs@localhost"]


def git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *GIT_ID, "-C", str(repo), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout


def ensure_repo(src: Path) -> str:
    """The commit the series starts from: HEAD of a git tree, or a first commit of an untouched folder."""
    if not (src / "monai" / "__init__.py").is_file():
        raise SystemExit(f"--monai-src {src}: no monai/__init__.py there; pass a MONAI source tree")
    inside = subprocess.run(["git", "-C", str(src), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if inside.returncode == 0 and Path(inside.stdout.strip()).resolve() == src.resolve():
        if git(src, "status", "--porcelain", "--untracked-files=no").strip():
            raise SystemExit(f"--monai-src {src} has uncommitted changes; commit or stash them first")
        return git(src, "rev-parse", "HEAD").strip()
    git(src, "init", "-q")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "MONAI source tree, untouched")
    return git(src, "rev-parse", "HEAD").strip()


def build_branch(src: Path, pr: PR, parent: str) -> str:
    """Commit the PR on ``parent`` in a temporary worktree; returns the new commit."""
    with tempfile.TemporaryDirectory(prefix=f"{pr.branch}-") as tmp:
        work = Path(tmp) / "tree"
        git(src, "worktree", "add", "-q", "--detach", str(work), parent)
        try:
            pr.apply(work)
            git(work, "add", "-A")
            git(work, "commit", "-q", "-m", summary((REPO / pr.writeup).read_text()))
            commit = git(work, "rev-parse", "HEAD").strip()
        finally:
            git(src, "worktree", "remove", "--force", str(work), check=False)
    git(src, "branch", "-f", pr.branch, commit)
    return commit


def check_writeup(src: Path, pr: PR) -> list[str]:
    diff = git(src, "diff", "--function-context", f"{pr.branch}~1", pr.branch)
    changed = set(git(src, "diff", "--name-only", f"{pr.branch}~1", pr.branch).split())
    return missing((REPO / pr.writeup).read_text(), diff, changed, pr.tests)


def run_tests(src: Path, pr: PR, tests_from: Path | None, python: str) -> bool:
    """Run the PR's tests in a fresh clone of its branch; upstream's test helpers come from ``tests_from``."""
    with tempfile.TemporaryDirectory(prefix=f"{pr.branch}-test-") as tmp:
        work = Path(tmp) / "tree"
        subprocess.run(["git", "clone", "-q", "--branch", pr.branch, str(src), str(work)], check=True)
        if tests_from is not None:  # an sdist has no tests/: add upstream's, never over the branch's own
            for f in (tests_from / "tests").rglob("*.py"):
                dst = work / f.relative_to(tests_from)
                if not dst.exists():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(f, dst)
        env = {**os.environ, "PYTHONPATH": str(work), "BUILD_MONAI": "0", "MONAI_ALGO_HASH": "0"}
        modules = [t.removesuffix(".py").replace("/", ".") for t in pr.tests]
        cmd = [python, "-m", "unittest", *modules]  # upstream's runner (runtests.sh) is unittest
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        report = proc.stderr.strip().splitlines()
        last = ", ".join([x for x in report if x.startswith("Ran ")] + report[-1:]) or "no output"
        ok = proc.returncode == 0
        if not ok:
            print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
        print(f"{pr.branch}: {' '.join(pr.tests)}: {last}: {'passed' if ok else 'failed'}", flush=True)
        return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--monai-src", type=Path, required=True, help="MONAI git clone or unpacked sdist")
    parser.add_argument("--test", action="store_true", help="run each branch's tests in a fresh checkout")
    parser.add_argument(
        "--tests-from", type=Path, help="a MONAI checkout whose tests/ supplies upstream's tests (for an sdist)"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter of the test environment")
    args = parser.parse_args(argv)
    src = args.monai_src.resolve()
    tests_from = args.tests_from.resolve() if args.tests_from else None
    if args.test and tests_from is None and not (src / "tests" / "test_utils.py").is_file():
        raise SystemExit(f"{src} has no tests/ (an sdist?): pass --tests-from a MONAI git checkout")
    parent = ensure_repo(src)
    built, failed = [], []
    for pr in PRS:
        try:
            parent = build_branch(src, pr, parent)
        except EditError as e:
            print(f"{pr.branch}: PR {pr.number} does not apply: {e}; later PRs are stacked without it", flush=True)
            failed.append(pr.branch)
            continue
        built.append(pr)
        print(f"== {pr.branch} ({parent[:10]}): {summary((REPO / pr.writeup).read_text()).splitlines()[0]}")
        print(git(src, "diff", "--stat", f"{pr.branch}~1", pr.branch).rstrip(), flush=True)
        problems = check_writeup(src, pr)
        for p in problems:
            print(f"{pr.branch}: {pr.writeup}: {p}", flush=True)
        if problems:
            failed.append(pr.branch)
    if args.test:
        for pr in built:
            if not run_tests(src, pr, tests_from, args.python):
                failed.append(pr.branch)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
