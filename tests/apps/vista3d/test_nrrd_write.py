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
"""save_nrrd against pynrrd's reader: voxels, order, placement and type; refusals; nothing left on failure."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import nrrd
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.io import label_transfer
from monai.apps.vista3d.io.nrrd_write import save_nrrd

PLACEMENT = {"space": "left-posterior-superior",
             "space directions": np.array([[-0.8, 0.0, 0.0], [0.0, -0.7, 0.1], [0.0, 0.0, 1.5]]),
             "space origin": np.array([12.5, -3.25, 100.0])}


class TestSaveNrrd(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp())
        self.rng = np.random.default_rng(0)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    @parameterized.expand([("uint8", 0, 133), ("int16", -5, 300), ("uint16", 0, 60000), ("int32", -70000, 70000),
                           ("float32", 0, 133), ("float64", 0, 133)])
    def test_read_back_by_pynrrd(self, dtype, lo, hi):
        values = self.rng.integers(lo, hi, size=(13, 9, 7))
        path = save_nrrd(torch.from_numpy(values), PLACEMENT, self.dir / "a.nrrd", dtype, threads=3)
        data, header = nrrd.read(str(path), index_order="F")
        np.testing.assert_array_equal(data, values)
        self.assertEqual(data.dtype, np.dtype(dtype))
        self.assertEqual(header["space"], "left-posterior-superior")
        self.assertEqual(header["encoding"], "gzip")
        np.testing.assert_array_equal(header["space directions"], PLACEMENT["space directions"])
        np.testing.assert_array_equal(header["space origin"], PLACEMENT["space origin"])

    def test_many_slabs_and_a_strided_array(self):
        values = self.rng.integers(0, 3, size=(40, 30, 25)).astype(np.uint8)
        strided = np.asfortranarray(values)[:, ::-1, :]  # neither C nor Fortran order
        with mock.patch.object(label_transfer, "_SLAB_BYTES", 3000):  # several blocks on several threads
            save_nrrd(strided, PLACEMENT, self.dir / "b.nrrd", threads=4)
        data, _ = nrrd.read(str(self.dir / "b.nrrd"), index_order="F")
        np.testing.assert_array_equal(data, strided)

    def test_a_leading_channel_and_bool(self):
        values = self.rng.random((1, 6, 5, 4)) > 0.5
        save_nrrd(torch.from_numpy(values), PLACEMENT, self.dir / "c.nrrd")
        data, header = nrrd.read(str(self.dir / "c.nrrd"), index_order="F")
        np.testing.assert_array_equal(data, values[0].astype(np.uint8))
        self.assertEqual(list(header["sizes"]), [6, 5, 4])

    def test_read_by_simpleitk_as_3d_slicer_reads_it(self):
        import SimpleITK as sitk  # a dev dependency: what 3D Slicer's MONAI Label module reads answers with

        values = self.rng.integers(0, 4, size=(11, 8, 6)).astype(np.uint8)
        save_nrrd(values, PLACEMENT, self.dir / "s.nrrd")
        image = sitk.ReadImage(str(self.dir / "s.nrrd"))
        np.testing.assert_array_equal(sitk.GetArrayFromImage(image).T, values)  # ITK's array is [Z, Y, X]
        directions = PLACEMENT["space directions"]
        spacing = np.linalg.norm(directions, axis=1)
        np.testing.assert_allclose(image.GetSpacing(), spacing)
        np.testing.assert_allclose(np.array(image.GetDirection()).reshape(3, 3), (directions / spacing[:, None]).T)
        np.testing.assert_allclose(image.GetOrigin(), PLACEMENT["space origin"])

    @unittest.skipUnless(torch.cuda.is_available(), "needs a CUDA GPU")
    def test_from_the_gpu(self):
        values = self.rng.integers(0, 2, size=(64, 48, 20)).astype(np.uint8)
        save_nrrd(torch.from_numpy(values).cuda(), PLACEMENT, self.dir / "g.nrrd")
        np.testing.assert_array_equal(nrrd.read(str(self.dir / "g.nrrd"), index_order="F")[0], values)

    @parameterized.expand([
        ("suffix", {"path": "x.nii.gz"}, "must end with .nrrd"),
        ("dtype", {"dtype": "int8"}, "not supported"),
        ("range", {"values": np.full((4, 4, 4), 300)}, "uint8"),
        ("shape", {"values": np.zeros((4, 4))}, "give [X, Y, Z]"),
        ("placement", {"placement": {**PLACEMENT, "space origin": np.array([0.0, np.nan, 0.0])}}, "finite origin"),
    ])
    def test_refusals_leave_nothing(self, _, change, words):
        args = {"values": np.zeros((4, 4, 4), dtype=np.int64), "placement": PLACEMENT, "path": "x.nrrd",
                "dtype": "uint8", **change}
        with self.assertRaises(Vista3DInputError) as ctx:
            save_nrrd(args["values"], args["placement"], self.dir / args["path"], args["dtype"])
        self.assertIn(words, str(ctx.exception))
        self.assertEqual(list(self.dir.iterdir()), [])


if __name__ == "__main__":
    unittest.main()
