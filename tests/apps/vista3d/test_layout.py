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
"""Every name a run writes, in one table; and the files a run leaves are those names."""

from __future__ import annotations

import pathlib
import tempfile
import unittest

from parameterized import parameterized

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.io.paths import (
    OutputLayout,
    lock_path,
    own_summary_name,
    part_summary_name,
    summary_kind,
)
from tests.apps.vista3d.stub_vista import stub_job

LAYOUT = OutputLayout(pathlib.Path("out"))

NAMES = [
    ("label_map", LAYOUT.label_map("ct.nii.gz"), "out/ct/ct_trans.nii.gz"),
    ("label_map_nii", LAYOUT.label_map("/data/a.b.nii"), "out/a.b/a.b_trans.nii.gz"),
    ("label_map_postfix", OutputLayout(pathlib.Path("o"), "seg").label_map("ct.nii.gz"), "o/ct/ct_seg.nii.gz"),
    ("mask_dir", LAYOUT.mask_dir("ct.nii.gz"), "out/ct"),
    ("masks", LAYOUT.masks("ct.nii.gz", [1, 999]), {1: "out/ct/liver.nii.gz", 999: "out/ct/label_999.nii.gz"}),
    ("summary", LAYOUT.summary(), "out/summary.json"),
    ("part_summary", LAYOUT.output_dir / part_summary_name((2, 5)), "out/summary.part-2-of-5.json"),
    ("part_summary_name", part_summary_name((2, 5)), "summary.part-2-of-5.json"),
    ("lock", lock_path(LAYOUT.label_map("ct.nii.gz")), "out/ct/.ct_trans.nii.gz.lock"),
    ("lock_path", lock_path("out/ct/ct_trans.nii.gz"), "out/ct/.ct_trans.nii.gz.lock"),
    ("temp_files", LAYOUT.temp_glob("out/ct/ct_trans.nii.gz"), ".ct_trans.nii.gz.*.part"),
]


SUMMARY_KINDS = [
    ("run", "summary.json", None),
    ("run_other_process", "summary.host-12.json", None),
    ("part", "summary.part-2-of-5.json", (2, 5)),
    ("part_other_process", "summary.part-2-of-5.host-12.json", (2, 5)),
    ("one_file_run", "seg.summary.json", False),
    ("not_json", "summary.json.part", False),
    ("label_map", "ct_trans.nii.gz", False),
]


class TestOutputLayout(unittest.TestCase):
    @parameterized.expand(SUMMARY_KINDS)
    def test_summary_kind(self, _, name, expected):
        self.assertEqual(summary_kind(name), expected)

    def test_own_summary_name(self):
        import os
        import socket

        got = own_summary_name(pathlib.Path("out/summary.part-1-of-2.json"))
        self.assertEqual(str(got), f"out/summary.part-1-of-2.{socket.gethostname()}-{os.getpid()}.json")
        self.assertEqual(summary_kind(got.name), (1, 2))  # a merge still counts it as part 1 of 2

    @parameterized.expand(NAMES)
    def test_name(self, _, got, expected):
        if isinstance(expected, dict):
            self.assertEqual({k: str(v) for k, v in got.items()}, expected)
        else:
            self.assertEqual(str(got), expected)

    def test_a_run_writes_the_layouts_names(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            (tmp / "in").mkdir()
            image = write_phantom(tmp / "in" / "ct.nii.gz", (24, 20, 16), seed=0)
            layout = OutputLayout(tmp / "out")
            result = run_batch([image], layout.output_dir, stub_job([1], per_class=True))
            self.assertEqual(result.done, 1, result.records)
            written = sorted(p for p in layout.output_dir.rglob("*") if p.is_file())
            expected = sorted([layout.label_map(image), layout.summary(), *layout.masks(image, [1]).values()])
            self.assertEqual(written, expected)  # no lock or temporary file left


if __name__ == "__main__":
    unittest.main()
