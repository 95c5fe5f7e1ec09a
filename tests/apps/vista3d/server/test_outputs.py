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
"""Answers placed in a local_working_dir: every one under its own name, never over another file, also when many
are placed at once, with or without hard links; a folder whose names are all taken is a 409."""

from __future__ import annotations

import errno
import os
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

from parameterized import parameterized

from monai.apps.vista3d.server import outputs
from monai.apps.vista3d.server.errors import ServeError


class TestPublish(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.folder = self.root / "out"
        self.folder.mkdir()

    def _sources(self, n: int) -> list[Path]:
        paths = []
        for k in range(n):
            path = self.root / f"src{k}"
            path.write_bytes(f"answer {k}".encode())
            paths.append(path)
        return paths

    @parameterized.expand([("hard_links", None), ("no_hard_links", OSError(errno.EPERM, "no links here"))])
    def test_many_at_once_each_its_own_name(self, _, link_error):
        sources = self._sources(8)
        patch = mock.patch.object(os, "link", side_effect=link_error) if link_error else mock.patch.object(
            os, "link", wraps=os.link)
        with patch, ThreadPoolExecutor(8) as pool:
            placed = list(pool.map(lambda src: outputs.publish(src, self.folder, "scan_trans.nii.gz"), sources))
        expected = ["scan_trans.nii.gz"] + [f"scan_trans-{k}.nii.gz" for k in range(2, 9)]
        self.assertEqual(sorted(p.name for p in placed), sorted(expected))
        for src, path in zip(sources, placed):
            self.assertEqual(path.read_bytes(), src.read_bytes())  # each answer holds its own bytes
        self.assertEqual(sorted(p.name for p in self.folder.iterdir()), sorted(expected))  # nothing else left

    def test_an_existing_file_is_kept(self):
        (self.folder / "ct_trans.nrrd").write_bytes(b"someone's")
        (src,) = self._sources(1)
        self.assertEqual(outputs.publish(src, self.folder, "ct_trans.nrrd").name, "ct_trans-2.nrrd")
        self.assertEqual((self.folder / "ct_trans.nrrd").read_bytes(), b"someone's")

    def test_all_names_taken_is_409(self):
        (src,) = self._sources(1)
        with mock.patch.object(outputs, "MAX_COPIES", 2):
            outputs.publish(src, self.folder, "ct_trans.nii.gz")
            outputs.publish(src, self.folder, "ct_trans.nii.gz")
            with self.assertRaises(ServeError) as caught:
                outputs.publish(src, self.folder, "ct_trans.nii.gz")
        self.assertEqual(caught.exception.status, 409)
        self.assertIn("ct_trans.nii.gz", caught.exception.message)
        self.assertEqual(len(list(self.folder.iterdir())), 2)


if __name__ == "__main__":
    unittest.main()
