"""Write-up checks: every file and function a write-up names must be in its branch's diff."""

from __future__ import annotations

import re

_CODE = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^(monai|tests)/[\w/.-]+\.py$")
# `Class.method`, `module.function()`, `name()`, `snake_case_name`, `Name(arg=...)`: a name the code must contain
_NAME = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)(\(.*\))?$")


def summary(text: str) -> str:
    """The commit message: the title, then the first section's text."""
    lines = text.strip().splitlines()
    title = lines[0].lstrip("# ").strip()
    body: list[str] = []
    for line in lines[1:]:
        if line.startswith("## "):
            if body:
                break
            continue
        if body or line.strip():
            body.append(line)
    return title + "\n\n" + "\n".join(body).strip() + "\n"


def named_items(text: str) -> tuple[set[str], set[str]]:
    """(paths, names) that the write-up's code spans name; commands (with spaces) and literals are not names."""
    paths, names = set(), set()
    for span in _CODE.findall(text):
        span = span.strip()
        if _PATH.match(span):
            paths.add(span)
            continue
        m = _NAME.match(span)
        if m is None or span in {"True", "False", "None"}:
            continue
        name = m.group(1)
        if "." in name or "_" in name or m.group(2) is not None or name[:1].isupper():
            names.add(name)
    return paths, names


def missing(text: str, diff: str, changed: set[str], run_unchanged: tuple[str, ...] = ()) -> list[str]:
    """What the write-up names that the diff (with whole functions as context) does not contain.

    ``run_unchanged``: upstream's test files that the branch is tested with; a write-up may name them.
    """
    paths, names = named_items(text)
    out = [f"file {p} is not changed by the branch" for p in sorted(paths) if p not in changed | set(run_unchanged)]
    for name in sorted(names):
        last = name.split(".")[-1]
        if last not in diff:
            out.append(f"{name} is not in the branch's diff")
    return out
