# Copyright (c) MONAI Consortium
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#     http://www.apache.org/licenses/LICENSE-2.0
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The documentation's relative links and raw-output paths point to files and headings that exist (no network)."""

from __future__ import annotations

import re
import tempfile
import unittest
from pathlib import Path

from parameterized import parameterized

ROOT = Path(__file__).resolve().parents[1]

# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ")"
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# `docs/notes/...`: how the README, the changelog and the PR write-ups cite raw output without a link
_NOTES_PATH = re.compile(r"`(docs/notes/[^`*\s]+)`")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def documents(root: Path) -> list[Path]:
    """The README and every Markdown file under ``docs/`` and ``tools/``."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    for folder in ("docs", "tools"):
        found += sorted((root / folder).rglob("*.md"))
    return found


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (lower case, punctuation dropped, spaces to '-')."""
    anchors: set[str] = set()
    for line in _FENCE.sub("", text).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:  # repeated headings get -1, -2, ...
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def broken_links(path: Path, root: Path) -> list[str]:
    """Each relative link or cited ``docs/notes/`` path in ``path`` whose file or heading does not exist."""
    text = path.read_text(encoding="utf-8")
    prose = _FENCE.sub("", text)
    broken = []
    for target in _LINK.findall(_CODE_SPAN.sub("", prose)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor")
    for cited in _NOTES_PATH.findall(prose):
        if not (root / cited).exists():
            broken.append(f"{cited}: no such file")
    return broken


class TestDocsLinks(unittest.TestCase):
    def test_every_link_resolves(self):
        docs = documents(ROOT)
        self.assertIn(ROOT / "docs" / "benchmarks.md", docs)
        report = [f"{p.relative_to(ROOT)}: {b}" for p in docs for b in broken_links(p, ROOT)]
        self.assertEqual(report, [], "broken links in the documentation:\n" + "\n".join(report))

    @parameterized.expand(
        [
            ("file", "[raw](notes/missing.txt)", ["notes/missing.txt: no such file"]),
            ("anchor", "[see](#no-such-heading)", ["#no-such-heading: no heading with that anchor"]),
            ("other_file_anchor", "[see](other.md#nope)", ["other.md#nope: no heading with that anchor"]),
            ("notes_path", "raw output `docs/notes/gone/run.txt`", ["docs/notes/gone/run.txt: no such file"]),
            ("good", "[a](other.md) [b](other.md#a-b-c) [c](#2-vista3d-serve) [d](https://x.org/y) `x](gone.md)`", []),
            ("fenced", "```\n[a](gone.md)\n```", []),
        ]
    )
    def test_finds_broken_links(self, _, line, expected):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "docs").mkdir()
            (folder / "docs" / "other.md").write_text("# A, b: c\n")
            page = folder / "docs" / "page.md"
            page.write_text(f"# Page\n\n## 2. `vista3d serve`\n\n{line}\n")
            self.assertEqual(broken_links(page, folder), expected)
            self.assertEqual(documents(folder), [folder / "docs" / "other.md", page])

    def test_repeated_headings(self):
        self.assertEqual(heading_anchors("# Run\n## Run\n```\n# not a heading\n```\n"), {"run", "run-1"})


if __name__ == "__main__":
    unittest.main()
