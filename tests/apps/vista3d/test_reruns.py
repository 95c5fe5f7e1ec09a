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
"""Nothing this program writes is read back as a CT: a rerun does no new work (issue 34, item 1)."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import nibabel as nib
import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.batch.inputs import collect_inputs
from monai.apps.vista3d.io.nifti_write import is_vista3d_output
from tests.apps.vista3d.stub_vista import phantom
from tests.apps.vista3d.test_cli import run_main

FLAGS = ["--embed-dim", "8", "--roi-size", "32", "--classes", "liver,spleen", "--device", "cpu", "--quiet"]


def _niftis(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.nii*"))


class TestReruns(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        img, aff, _ = phantom((24, 24, 16), np.eye(3), (1.5, 1.5, 1.5))
        self.pcin = self.dir / "pcin"
        (self.pcin / "a").mkdir(parents=True)
        nib.save(nib.Nifti1Image(np.round(img).astype(np.int16), aff), self.pcin / "a" / "ct.nii.gz")

    def tearDown(self):
        self.tmp.cleanup()

    @parameterized.expand([("inside", "seg"), ("same", "")])
    def test_per_class_reruns_do_no_new_work(self, _, sub):
        """``-i pcin -o pcin/seg --per-class`` (and ``-o pcin``) three times: one image, the same files."""
        out = self.pcin / sub
        code, _, err = run_main(["-i", self.pcin, "-o", out, *FLAGS, "--per-class"])
        self.assertEqual(code, 0, err)
        first = _niftis(self.pcin)
        self.assertEqual(len(first), 4)  # the CT, its label map and two masks
        for _ in range(2):
            code, _, err = run_main(["-i", self.pcin, "-o", out, *FLAGS, "--per-class"])
            self.assertEqual(code, 0, err)
            self.assertEqual(_niftis(self.pcin), first)
        self.assertEqual([p.name for p in collect_inputs(self.pcin)], ["ct.nii.gz"])
        marked = [p for p in first if is_vista3d_output(self.pcin / p)]
        self.assertEqual(len(marked), 3)  # every output carries the mark, the CT does not
        self.assertEqual(nib.load(self.pcin / marked[0]).header.get_intent()[0], "label")

    def test_an_output_named_explicitly_is_still_segmented(self):
        code, _, err = run_main(["-i", self.pcin, "-o", self.dir / "out", *FLAGS])
        self.assertEqual(code, 0, err)
        labels = self.dir / "out" / "a" / "ct" / "ct_trans.nii.gz"
        code, _, err = run_main(["-i", labels, "-o", self.dir / "again", *FLAGS])
        self.assertEqual(code, 0, err)
        self.assertTrue((self.dir / "again" / "ct_trans" / "ct_trans_trans.nii.gz").is_file())


if __name__ == "__main__":
    unittest.main()
