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
"""The small helpers of ``tests/benchmarks/vista3d_end_to_end.py`` (the benchmark itself is not a unit test)."""

import math
import tempfile
import unittest
from pathlib import Path

import nibabel as nib
import numpy as np
from parameterized import parameterized

from tests.benchmarks.vista3d_end_to_end import (
    case_name,
    format_table,
    label_agreement,
    median_stages,
    parse_cases,
)

CASES_OK = [
    ("one", "512x512x200@0.78x0.78x2.0", [((512, 512, 200), (0.78, 0.78, 2.0))]),
    ("two_spaces", " 64x64x24@1x1x4 , 8X8X8@2x2x2,", [((64, 64, 24), (1.0, 1.0, 4.0)), ((8, 8, 8), (2.0, 2.0, 2.0))]),
]
CASES_BAD = [("no_spacing", "512x512x200"), ("two_dims", "512x512@1x1"), ("zero_spacing", "8x8x8@1x0x1"),
             ("empty", " , "), ("words", "big@small")]


class TestParseCases(unittest.TestCase):
    @parameterized.expand(CASES_OK)
    def test_parse(self, _, text, expected):
        self.assertEqual(parse_cases(text), expected)

    @parameterized.expand(CASES_BAD)
    def test_bad(self, _, text):
        with self.assertRaisesRegex(ValueError, "case|no cases"):
            parse_cases(text)

    def test_case_name_has_no_dots(self):
        name = case_name((512, 512, 200), (0.78, 0.78, 2.0))
        self.assertEqual(name, "ct_512x512x200_0p78x0p78x2mm")
        self.assertNotIn(".", name)  # SaveImaged cuts the output name at the first dot


class TestStatsAndTable(unittest.TestCase):
    def test_median_stages(self):
        runs = [{"load": 1.0, "total": 3.0}, {"load": 3.0, "total": 5.0}, {"load": 2.0, "total": 4.0, "save": 1.0}]
        self.assertEqual(median_stages(runs), {"load": 2.0, "save": 0.0, "total": 4.0})

    def test_table_has_every_row_and_speedup(self):
        rows = [{"case": "ct_a", "impl": "upstream float32", "stages": {"load": 1.0, "total": 4.0}, "file_mb": 2.0},
                {"case": "ct_a", "impl": "fork uint8", "stages": {"load": 0.5, "total": 2.0}, "file_mb": 1.0,
                 "speedup": 2.0}]
        text = format_table(rows)
        self.assertEqual(len(text.splitlines()), 4)
        self.assertIn("2.00x", text.splitlines()[-1])
        self.assertIn("upstream float32", text)


class TestLabelAgreement(unittest.TestCase):
    def test_equal_share_across_dtypes(self):
        aff = np.diag([0.8, 0.8, 2.0, 1.0])
        a = np.zeros((6, 5, 4), dtype=np.uint8)
        a[1:3, 1:3, 1:3] = 7
        b = a.astype(np.float32)
        b[0, 0, :2] = 255.0  # 2 of 120 voxels differ
        with tempfile.TemporaryDirectory() as d:
            pa, pb, pc = Path(d) / "a.nii.gz", Path(d) / "b.nii.gz", Path(d) / "c.nii.gz"
            nib.save(nib.Nifti1Image(a, aff), pa)
            nib.save(nib.Nifti1Image(b, aff), pb)
            nib.save(nib.Nifti1Image(a[:5], aff * 2), pc)
            res = label_agreement(pa, pb)
            self.assertAlmostEqual(res["equal_voxels"], 118 / 120)
            self.assertTrue(res["same_affine"])
            other = label_agreement(pa, pc)
            self.assertTrue(math.isnan(other["equal_voxels"]))
            self.assertFalse(other["same_affine"])


if __name__ == "__main__":
    unittest.main()
