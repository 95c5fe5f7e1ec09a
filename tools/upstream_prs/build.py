"""Build the PR series as independent branches of an upstream MONAI tree; check, and optionally test, each one.

    python tools/upstream_prs/build.py --monai-src PATH [--also-apply PATH ...] [--tests-from CLONE] [--test]

PATH is a MONAI git clone or an unpacked sdist (a folder that is not a git repository gets one, with the untouched
tree as its first commit). Each branch is the PR's one signed-off commit on that untouched tree; the checkout of
PATH itself is left as it is. See README.md beside this file.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from any directory

from tools.upstream_prs.edits import EditError  # noqa: E402
from tools.upstream_prs.prs import PR, PRS, REPO  # noqa: E402
from tools.upstream_prs.writeups import missing, summary  # noqa: E402

TOOL_ID = ["-c", "user.name=vista3d-upstream-prs", "-c", "user.email=vista3d-upstream-prs@localhost"]


@dataclass
class Report:
    """What the tool found for one PR; one row of the closing table."""

    pr: PR
    applies: dict[str, bool] = field(default_factory=dict)  # tree label -> does the PR apply there
    built: bool = False
    format: str = "-"  # "black ok, isort ok, ruff ok" or what failed
    dco: bool = False
    writeup_problems: list[str] = field(default_factory=list)
    upstream_tests: str = "-"
    new_tests: str = "-"
    new_tests_on_base: str = "-"  # the new tests run on the untouched tree: they should fail there
    ok: bool = True


def git(repo: Path, *args: str, check: bool = True, ident: list[str] | None = None) -> str:
    proc = subprocess.run(["git", *(ident or TOOL_ID), "-C", str(repo), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout


def tree_label(tree: Path) -> str:
    """The tree's version as its sdist metadata gives it (``Version:`` of PKG-INFO), else the folder's name."""
    info = tree / "PKG-INFO"
    if info.is_file():
        found = re.search(r"^Version: (.+)$", info.read_text(), re.MULTILINE)
        if found:
            return found.group(1).strip()
    return tree.name


def ensure_repo(src: Path, docs_from: Path | None) -> str:
    """The commit the branches start from: HEAD of a git tree, or the untouched folder committed.

    An sdist has no ``docs/``: with ``docs_from`` (a git checkout of upstream), its ``docs/source`` is added in a
    second base commit, so that a PR's ``docs/source`` change is a one-line diff, as it is against upstream's git.
    """
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
    if docs_from is not None and not (src / "docs" / "source").exists() and (docs_from / "docs" / "source").is_dir():
        shutil.copytree(docs_from / "docs" / "source", src / "docs" / "source")
        rev = subprocess.run(["git", "-C", str(docs_from), "rev-parse", "--short", "HEAD"], capture_output=True)
        git(src, "add", "docs")
        git(src, "commit", "-q", "-m", f"docs/source of upstream's git ({rev.stdout.decode().strip() or 'checkout'})")
    return git(src, "rev-parse", "HEAD").strip()


def applies_on(tree: Path, pr: PR, docs_from: Path | None) -> bool:
    """Whether the PR's edits find their places in ``tree`` (nothing is written there).

    A ``docs/`` file the tree lacks (an sdist) is read from ``docs_from`` instead.
    """
    with tempfile.TemporaryDirectory(prefix="applies-") as tmp:
        for rel in pr.edits:
            path = tree / rel
            if not path.exists() and rel.startswith("docs/") and docs_from is not None:
                path = docs_from / rel
            if path.exists():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, Path(tmp) / rel)
        try:
            pr.edited(Path(tmp))
        except EditError:
            return False
        return not any((tree / rel).exists() for rel in pr.new_files)


@functools.lru_cache(maxsize=None)
def has_module(python: str, module: str) -> bool:
    """Whether ``python`` can import ``module`` (asked once per interpreter and module)."""
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def _formatter_env(work: Path) -> dict[str, str]:
    """The environment of the formatters: black's cache in the temporary tree, not in the user's ~/.cache."""
    return {**os.environ, "BLACK_CACHE_DIR": str(work.parent / "black-cache")}


def autofix(work: Path, files: list[str], python: str) -> None:
    """Upstream's ``./runtests.sh --autofix`` on the changed files: isort, then black, with the tree's config."""
    for module, args in (("isort", []), ("black", ["-q"])):
        if files and has_module(python, module):
            subprocess.run(
                [python, "-m", module, *args, *files], cwd=work, capture_output=True, env=_formatter_env(work)
            )


def format_checks(work: Path, files: list[str], python: str) -> str:
    """``black --check``, ``isort --check-only`` and ``ruff check`` of the changed files, with the tree's config."""
    if not files:
        return "no python files"
    results = []
    for name, cmd in (
        ("black", ["-m", "black", "--check", "-q"]),
        ("isort", ["-m", "isort", "--check-only", "-q"]),
        ("ruff", ["-m", "ruff", "check", "-q"]),
    ):
        if not has_module(python, name):
            results.append(f"{name} not installed")
            continue
        proc = subprocess.run(
            [python, *cmd, *files], cwd=work, capture_output=True, text=True, env=_formatter_env(work)
        )
        results.append(f"{name} {'ok' if proc.returncode == 0 else 'FAILED'}")
        if proc.returncode != 0:
            print((proc.stdout + proc.stderr)[-2000:], file=sys.stderr)
    return ", ".join(results)


def author_of(repo: Path) -> tuple[str, str]:
    """``(name, email)`` of this repository's git identity: the author and sign-off of every PR commit."""
    name = subprocess.run(["git", "-C", str(repo), "config", "user.name"], capture_output=True, text=True)
    email = subprocess.run(["git", "-C", str(repo), "config", "user.email"], capture_output=True, text=True)
    if not name.stdout.strip() or not email.stdout.strip():
        raise SystemExit("set git's user.name and user.email (the DCO sign-off needs a real identity) or --author")
    return name.stdout.strip(), email.stdout.strip()


def build_branch(src: Path, pr: PR, base: str, author: tuple[str, str], python: str, report: Report) -> str:
    """Commit the PR on ``base`` in a temporary worktree, signed off; returns the new commit."""
    ident = ["-c", f"user.name={author[0]}", "-c", f"user.email={author[1]}"]
    with tempfile.TemporaryDirectory(prefix=f"{pr.branch}-") as tmp:
        work = Path(tmp) / "tree"
        git(src, "worktree", "add", "-q", "--detach", str(work), base)
        try:
            pr.apply(work)
            git(work, "add", "-A")
            changed = git(work, "diff", "--cached", "--name-only").split()
            py_files = [f for f in changed if f.endswith(".py")]
            autofix(work, py_files, python)
            git(work, "add", "-A")
            git(work, "commit", "-q", "-s", "-m", summary((REPO / pr.writeup).read_text()), ident=ident)
            report.format = format_checks(work, py_files, python)
            commit = git(work, "rev-parse", "HEAD").strip()
        finally:
            git(src, "worktree", "remove", "--force", str(work), check=False)
    git(src, "branch", "-f", pr.branch, commit)
    message = git(src, "log", "-1", "--format=%B", pr.branch)
    report.dco = f"Signed-off-by: {author[0]} <{author[1]}>" in message
    return commit


def check_writeup(src: Path, pr: PR) -> list[str]:
    """What the write-up names that the branch's diff lacks, and the measuring commands it does not quote."""
    diff = git(src, "diff", "--function-context", f"{pr.branch}~1", pr.branch)
    changed = set(git(src, "diff", "--name-only", f"{pr.branch}~1", pr.branch).split())
    text = (REPO / pr.writeup).read_text()
    problems = missing(text, diff, changed, pr.upstream_tests)
    problems += [f"the write-up does not quote its measuring command `{c}`" for c in pr.measured if c not in text]
    return problems


def _ran(stderr: str) -> str:
    """unittest's closing lines, e.g. ``Ran 14 tests in 42.1s, OK (skipped=2)``."""
    lines = stderr.strip().splitlines()
    ran = [x for x in lines if x.startswith("Ran ")]
    return ", ".join(ran[-1:] + lines[-1:]) or "no output"


def _checkout(src: Path, ref: str, work: Path, tests_from: Path | None) -> None:
    """A fresh clone of ``src`` at ``ref`` in ``work``; upstream's ``tests/`` files it lacks copied in."""
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(src), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", ref], check=True)
    if tests_from is not None:
        for f in (tests_from / "tests").rglob("*"):
            dst = work / f.relative_to(tests_from)
            if f.is_file() and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dst)


def _unittest(work: Path, tests: tuple[str, ...], python: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")]))  # the tree before the rest
    env = {**os.environ, "PYTHONPATH": path, "BUILD_MONAI": "0", "MONAI_ALGO_HASH": "0"}
    modules = [t.removesuffix(".py").replace("/", ".") for t in tests]
    return subprocess.run([python, "-m", "unittest", *modules], cwd=work, env=env, capture_output=True, text=True)


def run_tests(src: Path, pr: PR, tests_from: Path | None, python: str, report: Report, base: str | None = None) -> bool:
    """Upstream's tests of the touched modules, then the PR's new tests, in a fresh clone of the branch.

    With ``tests_from``, upstream's ``tests/`` files that the branch lacks (an sdist has none) are copied in first.
    With ``base``, the new tests also run on the untouched tree, where they should fail (else they test nothing
    the PR changes); that is reported, not counted as a failure of the PR.
    """
    with tempfile.TemporaryDirectory(prefix=f"{pr.branch}-test-") as tmp:
        work = Path(tmp) / "tree"
        _checkout(src, pr.branch, work, tests_from)
        ok = True
        for kind, tests in (("upstream", pr.upstream_tests), ("new", pr.new_tests)):
            proc = _unittest(work, tests, python)
            passed = proc.returncode == 0
            if not passed:
                print(proc.stdout[-4000:] + proc.stderr[-3000:], file=sys.stderr)
            result = f"{_ran(proc.stderr)}: {'passed' if passed else 'failed'}"
            setattr(report, f"{kind}_tests", result)
            print(f"{pr.branch}: {kind} tests {' '.join(tests)}: {result}", flush=True)
            ok = ok and passed
        if base is not None and pr.new_tests:
            untouched = Path(tmp) / "untouched"
            _checkout(src, base, untouched, tests_from)
            for rel in pr.new_tests:
                shutil.copyfile(pr.payload / rel, untouched / rel)
            proc = _unittest(untouched, pr.new_tests, python)
            report.new_tests_on_base = f"{_ran(proc.stderr)}: {'passed' if proc.returncode == 0 else 'failed'}"
            print(f"{pr.branch}: new tests on the untouched tree: {report.new_tests_on_base}", flush=True)
        return ok


def print_table(reports: list[Report], labels: list[str]) -> None:
    head = ["branch", *(f"applies on {x}" for x in labels), "format", "DCO", "upstream tests", "new tests"]
    head += ["new tests on the untouched tree", "numbers"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in reports:
        numbers = "; ".join(f"`{c.replace('BRANCH', r.pr.branch)}`" for c in r.pr.measured) or "-"
        cells = [
            r.pr.branch,
            *("yes" if r.applies.get(x) else "no" for x in labels),
            r.format,
            "yes" if r.dco else "no",
            r.upstream_tests,
            r.new_tests,
            r.new_tests_on_base,
            numbers,
        ]
        print("| " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--monai-src", type=Path, required=True, help="MONAI git clone or unpacked sdist: the base")
    parser.add_argument(
        "--also-apply", type=Path, action="append", default=[], help="another MONAI tree to check the PRs apply on"
    )
    parser.add_argument("--tests-from", type=Path, help="a MONAI git checkout: upstream's tests/ and docs/source")
    parser.add_argument("--test", action="store_true", help="run each branch's tests in a fresh checkout")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the test and formatter environment")
    parser.add_argument("--author", help='"Name <email>" of the commits and sign-offs (default: git config here)')
    args = parser.parse_args(argv)
    src = args.monai_src.resolve()
    tests_from = args.tests_from.resolve() if args.tests_from else None
    if args.test and tests_from is None and not (src / "tests" / "test_utils.py").is_file():
        raise SystemExit(f"{src} has no tests/ (an sdist?): pass --tests-from a MONAI git checkout")
    if args.author:
        found = re.fullmatch(r"\s*(.+?)\s*<(.+)>\s*", args.author)
        if found is None:
            raise SystemExit(f'--author {args.author!r}: expected "Name <email>"')
        author = (found.group(1), found.group(2))
    else:
        author = author_of(REPO)
    others = [p.resolve() for p in args.also_apply]
    labels = [tree_label(p) for p in others] + [tree_label(src)]
    applies = {pr.branch: {tree_label(p): applies_on(p, pr, tests_from) for p in others} for pr in PRS}
    base = ensure_repo(src, tests_from)
    reports = []
    for pr in PRS:
        report = Report(pr, applies=applies[pr.branch])
        reports.append(report)
        try:
            build_branch(src, pr, base, author, args.python, report)
        except EditError as e:
            print(f"{pr.branch}: does not apply on {tree_label(src)}: {e}", flush=True)
            report.applies[tree_label(src)], report.ok = False, False
            continue
        report.applies[tree_label(src)], report.built = True, True
        print(f"== {pr.branch} ({git(src, 'rev-parse', '--short', pr.branch).strip()}): {pr.writeup}")
        print(git(src, "diff", "--stat", f"{pr.branch}~1", pr.branch).rstrip(), flush=True)
        report.writeup_problems = check_writeup(src, pr)
        for p in report.writeup_problems:
            print(f"{pr.branch}: {pr.writeup}: {p}", flush=True)
        report.ok = not report.writeup_problems and report.dco and "FAILED" not in report.format
    if args.test:
        for report in reports:
            if report.built and not run_tests(src, report.pr, tests_from, args.python, report, base):
                report.ok = False
    print_table(reports, labels)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
