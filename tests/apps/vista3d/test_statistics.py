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
"""Per-structure statistics (core/statistics.py) against values computed by hand and by numpy, and against
TotalSegmentator's definitions of volume and mean intensity."""

from __future__ import annotations

import unittest
from unittest import mock

import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.core import statistics as stats_mod
from monai.apps.vista3d.core.statistics import label_centroids, structure_statistics

AFFINE = np.array([[-0.5, 0, 0, 10.0], [0, 0.8, 0, -4.0], [0, 0, 2.0, 7.0], [0, 0, 0, 1]])


def _phantom():
    """A 10x10x10 CT of 0 HU with a 3x3x3 'liver' (id 1) of known values and a 'spleen' (id 3) on the x=0 face."""
    ct = np.zeros((10, 10, 10), dtype=np.float32)
    lab = np.zeros((10, 10, 10), dtype=np.uint8)
    lab[4:7, 3:6, 3:6] = 1
    ct[4:7, 3:6, 3:6] = np.arange(27, dtype=np.float32).reshape(3, 3, 3) * 10 - 100  # -100, -90, ..., 160
    lab[0:2, 7:9, 4:6] = 3
    ct[0:2, 7:9, 4:6] = 50
    return ct, lab


def _numpy_reference(ct, lab, label_id):
    m = lab == label_id
    v, idx = ct[m].astype(np.float64), np.argwhere(m)
    return {"voxels": int(m.sum()), "mean": v.mean(), "median": float(np.median(v)), "std": v.std(),
            "min": v.min(), "max": v.max(), "centroid": idx.mean(0), "bbox": (idx.min(0), idx.max(0))}


class TestStatistics(unittest.TestCase):
    def test_hand_computed_phantom(self):
        ct, lab = _phantom()
        out = structure_statistics(torch.from_numpy(ct), torch.from_numpy(lab), AFFINE)
        liver = out["structures"]["liver"]
        # 27 voxels of 0.5 x 0.8 x 2 = 0.8 mm3; values -100..160 in steps of 10: mean = median = 30
        self.assertEqual(liver["voxels"], 27)
        self.assertAlmostEqual(liver["volume_mm3"], 21.6)
        self.assertEqual((liver["mean"], liver["median"], liver["min"], liver["max"]), (30.0, 30.0, -100.0, 160.0))
        self.assertAlmostEqual(liver["std"], 10 * np.sqrt((27**2 - 1) / 12), places=4)
        self.assertEqual(liver["centroid"]["voxel"], [5.0, 4.0, 4.0])
        self.assertEqual(liver["centroid"]["world"], [7.5, -0.8, 15.0])  # AFFINE @ (5, 4, 4, 1)
        self.assertEqual(liver["bbox"], {"min": [4, 3, 3], "max": [6, 5, 5]})
        self.assertFalse(liver["touches_border"])
        spleen = out["structures"]["spleen"]
        self.assertEqual((spleen["voxels"], spleen["mean"], spleen["std"]), (8, 50.0, 0.0))
        self.assertTrue(spleen["touches_border"])
        self.assertEqual(set(out["structures"]), {"liver", "spleen"})  # only what is present, no background
        self.assertAlmostEqual(out["voxel_volume_mm3"], 0.8)

    def test_totalsegmentator_definitions(self):
        """TotalSegmentator: volume = voxel count x product of the header's zooms, intensity = the mean of the CT
        (cast to int16) over the mask, rounded to 5 decimals; a structure within 3 voxels of a face is dropped."""
        ct, lab = _phantom()
        out = structure_statistics(torch.from_numpy(ct), torch.from_numpy(lab), AFFINE,
                                   exclude_border_structures=True)
        zooms = np.linalg.norm(AFFINE[:3, :3], axis=0)
        ct16 = ct.astype(np.int16)
        mask = lab == 1
        cut = any(m[:3].any() or m[-3:].any() for m in (mask, mask.transpose(1, 0, 2), mask.transpose(2, 0, 1)))
        self.assertFalse(cut)
        self.assertAlmostEqual(out["structures"]["liver"]["volume_mm3"], mask.sum() * float(np.prod(zooms)))
        self.assertEqual(out["structures"]["liver"]["mean"], round(float(np.average(ct16, weights=mask)), 5))
        self.assertFalse(out["structures"]["liver"]["excluded_at_border"])
        spleen = out["structures"]["spleen"]  # within 3 voxels of the x=0 face: TotalSegmentator drops it
        self.assertTrue(spleen["excluded_at_border"])
        self.assertIsNone(spleen["volume_mm3"])
        self.assertIsNone(spleen["mean"])
        self.assertEqual(spleen["voxels"], 8)

    @parameterized.expand([("integer_histogram", 0.0), ("float_sort", 0.25)])
    def test_against_numpy_many_slabs(self, _, fraction):
        rng = np.random.default_rng(0)
        lab = rng.integers(0, 7, size=(13, 11, 9)).astype(np.int16)
        lab[lab == 4] = 0  # an id that is absent
        ct = (rng.integers(-1000, 1500, size=lab.shape) + fraction).astype(np.float32)
        names = {i: f"s{i}" for i in range(7)}
        for slab in (1 << 24, 11 * 9 * 2):  # one slab, and slabs of two x-planes
            with mock.patch.object(stats_mod, "SLAB_VOXELS", slab):
                out = structure_statistics(torch.from_numpy(ct), torch.from_numpy(lab), AFFINE, names)
            self.assertEqual(sorted(out["structures"]), ["s1", "s2", "s3", "s5", "s6"])
            for name, got in out["structures"].items():
                ref = _numpy_reference(ct, lab, got["id"])
                self.assertEqual(got["voxels"], ref["voxels"])
                self.assertAlmostEqual(got["mean"], ref["mean"], places=4)
                self.assertEqual(got["median"], ref["median"])
                self.assertAlmostEqual(got["std"], ref["std"], places=3)
                self.assertEqual((got["min"], got["max"]), (ref["min"], ref["max"]))
                np.testing.assert_allclose(got["centroid"]["voxel"], ref["centroid"], atol=1e-3)
                self.assertEqual(got["bbox"], {"min": ref["bbox"][0].tolist(), "max": ref["bbox"][1].tolist()})

    def test_unnamed_ids_and_centroids(self):
        ct, lab = _phantom()
        lab[8, 7, 9] = 200
        out = structure_statistics(torch.from_numpy(ct)[None], torch.from_numpy(lab)[None], AFFINE)
        self.assertEqual(out["structures"]["label_200"]["voxels"], 1)
        centres = label_centroids(torch.from_numpy(lab))
        np.testing.assert_allclose(centres[1].numpy(), [5.0, 4.0, 4.0])
        self.assertTrue(bool(torch.isnan(centres[2]).all()))

    def test_centroids_over_many_slabs(self):
        rng = np.random.default_rng(1)
        lab = rng.integers(0, 6, size=(13, 11, 9)).astype(np.int16)
        lab[lab == 2] = 0  # an id that is absent
        with mock.patch.object(stats_mod, "SLAB_VOXELS", 11 * 9 * 2):  # slabs of two x-planes, the last of one
            centres = label_centroids(torch.from_numpy(lab))
        self.assertEqual(tuple(centres.shape), (6, 3))
        for label_id in (1, 3, 4, 5):
            np.testing.assert_allclose(centres[label_id].numpy(), np.argwhere(lab == label_id).mean(0), atol=1e-9)
        self.assertTrue(bool(torch.isnan(centres[2]).all()))

    def test_refuses_other_grid(self):
        with self.assertRaises(ValueError):
            structure_statistics(torch.zeros(4, 4, 4), torch.zeros(4, 4, 5, dtype=torch.uint8), AFFINE)


if __name__ == "__main__":
    unittest.main()
