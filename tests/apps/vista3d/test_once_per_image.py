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
"""Each thing done once per run or per image: the input folder walked once, each header read once before the image is
loaded, one job built from the flags."""

from __future__ import annotations

import collections
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from monai.apps.vista3d.batch import inputs, run
from monai.apps.vista3d.core import feasibility
from monai.apps.vista3d.io import nifti
from tests.apps.vista3d.test_cli import TINY, _write_ct, run_main


class TestOncePerImage(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.cts = [_write_ct(self.tmp / "cts" / f"p{k}" / "ct.nii.gz", (24, 24, 16), seed=k) for k in range(2)]

    def test_cli_walks_the_folder_once_and_reads_each_header_once(self):
        walks, headers, rereads = [], collections.Counter(), []
        real_walk, real_header = inputs._find_nifti, nifti.read_header

        def walk(folder, skip=None):
            walks.append(Path(folder))
            return real_walk(folder, skip)

        def header(path):
            headers[Path(path)] += 1
            return real_header(path)

        with mock.patch.object(inputs, "_find_nifti", walk), mock.patch.object(run, "read_header", header), \
                mock.patch.object(feasibility, "read_header", lambda p: rereads.append(p)):
            code, _, err = run_main(["-i", self.tmp / "cts", "-o", self.tmp / "out", *TINY])
        self.assertEqual(code, 0, err)
        self.assertEqual(walks, [self.tmp / "cts"])
        self.assertEqual(headers, {p: 1 for p in self.cts})
        self.assertEqual(rereads, [])  # the fit check takes the header the run read
        self.assertTrue(all((self.tmp / "out" / f"p{k}" / "ct" / "ct_trans.nii.gz").is_file() for k in range(2)))


if __name__ == "__main__":
    unittest.main()
