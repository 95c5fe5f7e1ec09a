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

from __future__ import annotations

import os
import random
import unittest
from unittest import mock

import numpy as np
import torch
from parameterized import parameterized

import monai.utils.point_helpers as tu
from monai.utils.point_helpers import (
    convert_points_to_disc,
    erode,
    get_largest_connected_component_mask,
    keep_components_with_positive_points,
    keep_merge_components_with_points,
    sample_points_from_label,
)

REF = os.path.join(os.path.dirname(__file__), "..", "testing_data", "point_helpers_upstream.pt")
BACKENDS = [("scipy",), ("torch",)]


def backend(name: str):
    """Context that forces the torch labeller (scipy hidden) or leaves scipy in charge."""
    if name == "torch":
        return mock.patch.object(tu, "_scipy_ndimage", lambda: None)
    return mock.patch.object(tu, "_scipy_ndimage", tu._scipy_ndimage)


def two_blobs() -> torch.Tensor:
    """[12, 10, 8]: a 3x3x3 cube at the origin corner, a 2x2x2 cube far away, a voxel touching it diagonally."""
    m = torch.zeros(12, 10, 8, dtype=torch.bool)
    m[1:4, 1:4, 1:4] = True  # 27 voxels
    m[7:9, 6:8, 4:6] = True  # 8 voxels
    m[9, 8, 6] = True  # corner-adjacent to the 2x2x2 cube only
    return m


class TestLabel(unittest.TestCase):
    @parameterized.expand(BACKENDS)
    def test_known_components(self, name):
        with backend(name):
            lab26, n26 = tu._label(two_blobs(), connectivity=3)
            lab6, n6 = tu._label(two_blobs(), connectivity=1)
            lab18, n18 = tu._label(two_blobs(), connectivity=2)
        self.assertEqual((n26, n18, n6), (2, 3, 3))
        self.assertEqual(lab26.dtype, torch.int64)
        # raster-order numbering: the cube at the origin corner comes first
        self.assertEqual(int(lab26[1, 1, 1]), 1)
        self.assertEqual(int(lab26[9, 8, 6]), 2)
        self.assertEqual(int(lab6[9, 8, 6]), 3)
        self.assertEqual(int((lab26 == 1).sum()), 27)
        self.assertEqual(int((lab26 == 2).sum()), 9)
        self.assertEqual(int((lab26 == 0).sum()), two_blobs().numel() - 36)

    def test_snake_converges(self):
        # one long winding 6-connected path: many propagation steps without pointer jumping
        m = torch.zeros(9, 9, 3, dtype=torch.bool)
        for r in range(0, 9, 2):
            m[r, :, 1] = True
            if r + 1 < 9:
                m[r + 1, 8 if (r // 2) % 2 == 0 else 0, 1] = True
        with backend("torch"):
            lab, n = tu._label(m, connectivity=1)
        self.assertEqual(n, 1)
        self.assertTrue(torch.equal(lab > 0, m))

    @parameterized.expand([((2, 1, 9, 8, 7), 3), ((11, 9, 8), 1), ((11, 9, 8), 2), ((11, 9, 8), 3), ((13, 12), 2)])
    def test_torch_equals_scipy(self, shape, connectivity):
        gen = torch.Generator().manual_seed(sum(shape) + connectivity)
        for density in (0.1, 0.3, 0.6):
            m = torch.rand(shape, generator=gen) < density
            with backend("scipy"):
                a, na = tu._label(m, connectivity)
            with backend("torch"):
                b, nb = tu._label(m, connectivity)
            self.assertEqual(na, nb)
            self.assertTrue(torch.equal(a, b))

    @parameterized.expand([(1,), (2,), (3,)])
    def test_torch_equals_scipy_blobs_in_a_corner(self, connectivity):
        # smooth blobs (long, winding components) in one corner of a larger volume: the labeller works inside the
        # foreground's box, and a component's id must not depend on it
        gen = torch.Generator().manual_seed(connectivity)
        field = torch.randn(1, 1, 20, 18, 16, generator=gen)
        for _ in range(2):
            field = torch.nn.functional.avg_pool3d(field, 3, 1, 1)
        m = torch.zeros(31, 27, 23, dtype=torch.bool)
        m[9:29, 7:25, 5:21] = field[0, 0] > 0.05
        with backend("scipy"):
            a, na = tu._label(m, connectivity)
        with backend("torch"):
            b, nb = tu._label(m, connectivity)
        self.assertGreater(na, 1)
        self.assertEqual(na, nb)
        self.assertTrue(torch.equal(a, b))

    @parameterized.expand([((1, 1, 1),), ((1,),), ((1, 7, 1),), ((3, 1, 4),)])
    def test_size_one_axes(self, shape):
        gen = torch.Generator().manual_seed(len(shape))
        for m in (torch.ones(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.bool),
                  torch.rand(shape, generator=gen) < 0.5):
            with backend("scipy"):
                a, na = tu._label(m)
            with backend("torch"):
                b, nb = tu._label(m)
            self.assertEqual((na, nb), (na, na))
            self.assertTrue(torch.equal(a, b))

    @parameterized.expand([(name, c) for (name,) in BACKENDS for c in (1, 3)])
    def test_items_are_labelled_apart(self, name, connectivity):
        # each item alone, its ids continued from the items before it: no component crosses the first axis
        gen = torch.Generator().manual_seed(connectivity)
        m = torch.rand(3, 1, 7, 6, 5, generator=gen) < 0.4
        m[1] = m[0]  # touching copies: one component across the items if they were not apart
        with backend(name):
            got, n = tu._label(m, connectivity, items=True)
            alone = [tu._label(m[i], connectivity) for i in range(3)]
        expected, offset = [], 0
        for ids, count in alone:
            expected.append(torch.where(ids > 0, ids + offset, 0))
            offset += count
        self.assertEqual(n, offset)
        self.assertTrue(torch.equal(got, torch.stack(expected)))

    def test_items_need_an_image_axis(self):
        with self.assertRaisesRegex(ValueError, "items=True"):
            tu._label(torch.ones(4, dtype=torch.bool), items=True)

    @unittest.skipUnless(torch.cuda.is_available(), "the labeller on a GPU: needs a CUDA GPU")
    def test_gpu_equals_scipy(self):
        gen = torch.Generator().manual_seed(5)
        field = torch.randn(1, 1, 70, 60, 50, generator=gen)
        for _ in range(3):
            field = torch.nn.functional.avg_pool3d(field, 5, 1, 2)
        for m in (field[0, 0] > 0.02, torch.rand(40, 30, 20, generator=gen) < 0.3):
            for connectivity in (1, 3):
                with backend("scipy"):
                    a, na = tu._label(m, connectivity)
                b, nb = tu._label(m.cuda(), connectivity)
                self.assertEqual(b.device.type, "cuda")
                self.assertEqual(na, nb)
                self.assertTrue(torch.equal(a, b.cpu()))

    def test_empty_and_bad_connectivity(self):
        for name in ("scipy", "torch"):
            with backend(name):
                lab, n = tu._label(torch.zeros(4, 5, 6, dtype=torch.bool))
            self.assertEqual(n, 0)
            self.assertEqual(int(lab.abs().sum()), 0)
        with self.assertRaisesRegex(ValueError, "connectivity"):
            tu._label(torch.ones(3, 3, 3, dtype=torch.bool), connectivity=4)


class TestMorphologyAndLargest(unittest.TestCase):
    def test_erode(self):
        m = torch.zeros(1, 1, 7, 7, 7)
        m[0, 0, 1:6, 1:6, 1:6] = 1
        out = erode(m)
        self.assertEqual(out.dtype, torch.float32)
        self.assertEqual(int(out.sum()), 27)
        self.assertEqual(int(out[0, 0, 2:5, 2:5, 2:5].sum()), 27)
        # the image border does not erode (outside counts as foreground)
        self.assertEqual(int(erode(torch.ones(1, 1, 4, 4, 4)).sum()), 64)
        with self.assertRaisesRegex(ValueError, "odd"):
            erode(m, filter_size=2)

    @parameterized.expand(BACKENDS)
    def test_largest(self, name):
        with backend(name):
            largest = get_largest_connected_component_mask(two_blobs())
            both = get_largest_connected_component_mask(two_blobs(), num_components=2)
            small6 = get_largest_connected_component_mask(two_blobs(), connectivity=1, num_components=2)
            arr = get_largest_connected_component_mask(two_blobs().numpy().astype(np.float32))
        self.assertEqual(largest.dtype, torch.bool)
        self.assertEqual(int(largest.sum()), 27)
        self.assertTrue(bool(largest[2, 2, 2]))
        self.assertTrue(torch.equal(both, two_blobs()))
        self.assertEqual(int(small6.sum()), 35)  # 27 + 8, the lone diagonal voxel dropped
        self.assertFalse(bool(small6[9, 8, 6]))
        self.assertIsInstance(arr, np.ndarray)
        self.assertTrue(np.array_equal(arr, largest.numpy()))


class TestKeepComponents(unittest.TestCase):
    @parameterized.expand(BACKENDS)
    def test_merge_with_points(self, name):
        pos = two_blobs()[None, None].repeat(2, 1, 1, 1, 1)
        neg = torch.zeros_like(pos)
        neg[1, 0, 6:12, 0:2, 0:2] = True
        coords = torch.tensor(
            [
                [[2.2, 1.6, 3.4], [0.0, 0.0, 0.0]],  # inside the big cube; a -1 padding point
                [[9.0, 1.0, 1.0], [10.0, 9.0, 7.0]],  # negative point in neg; positive point 1 voxel off the corner
            ]
        )
        labels = torch.tensor([[1, -1], [2, 3]])
        with backend(name):
            out = keep_merge_components_with_points(pos, neg, coords, labels)
            none = keep_merge_components_with_points(pos, neg, coords, labels, margins=1)
        self.assertEqual(out.shape, pos.shape)
        self.assertEqual(out.dtype, torch.bool)
        expected0 = torch.zeros_like(pos[0, 0])
        expected0[1:4, 1:4, 1:4] = True
        self.assertTrue(torch.equal(out[0, 0], expected0))
        expected1 = neg[1, 0] | (two_blobs() & ~expected0)
        self.assertTrue(torch.equal(out[1, 0], expected1))
        # margin 0 only: the off-corner positive point no longer reaches its component
        self.assertTrue(torch.equal(none[1, 0], neg[1, 0]))

    @parameterized.expand([(name, b) for (name,) in BACKENDS for b in (1, 2)])
    def test_merge_labels_both_masks_at_once(self, name, b):
        """One labelling of both masks keeps each component and the highest-id rule of labelling them apart (one
        row: the masks as two separate items; two: stacked with an empty item between them)."""
        gen = torch.Generator().manual_seed(b)
        for trial in range(12):
            pos = torch.rand(b, 1, 9, 8, 7, generator=gen) > 0.93  # sparse: many small components
            neg = torch.rand(b, 1, 9, 8, 7, generator=gen) > 0.93
            coords = torch.randint(0, 7, (b, 5, 3), generator=gen).float()
            labels = torch.randint(-1, 4, (b, 5), generator=gen)
            with backend(name):
                pos_ids, _ = tu._label(pos, connectivity=3)
                neg_ids, _ = tu._label(neg, connectivity=3)
                out = keep_merge_components_with_points(pos, neg, coords, labels)
            expected = torch.zeros_like(pos)
            for r in range(b):
                for (x, y, z), lb in zip(coords[r].int().tolist(), labels[r].tolist()):
                    ids = pos_ids if lb in (1, 3) else neg_ids if lb in (0, 2) else None
                    for margin in range(3) if ids is not None else ():
                        top = int(ids[r, 0, max(x - margin, 0) : x + margin + 1, max(y - margin, 0) : y + margin + 1,
                                      max(z - margin, 0) : z + margin + 1].max())
                        if top > 0:
                            expected[r] |= ids[r] == top
                            break
            self.assertTrue(torch.equal(out, expected), f"trial {trial}")

    @parameterized.expand(BACKENDS)
    def test_merge_with_points_numpy(self, name):
        """numpy in, numpy out (as MONAI 1.6.1), the same masks as for tensors."""
        pos = two_blobs()[None, None].repeat(2, 1, 1, 1, 1)
        neg = torch.zeros_like(pos)
        neg[1, 0, 6:12, 0:2, 0:2] = True
        coords = torch.tensor([[[2.2, 1.6, 3.4], [0.0, 0.0, 0.0]], [[9.0, 1.0, 1.0], [10.0, 9.0, 7.0]]])
        labels = torch.tensor([[1, -1], [2, 3]])
        with backend(name):
            expected = keep_merge_components_with_points(pos, neg, coords, labels)
            out = keep_merge_components_with_points(pos.numpy(), neg.numpy(), coords.numpy(), labels.numpy())
        self.assertIsInstance(out, np.ndarray)
        self.assertEqual(out.dtype, np.bool_)
        np.testing.assert_array_equal(out, expected.numpy())

    def test_merge_rejects_non_bool(self):
        with self.assertRaisesRegex(ValueError, "bool"):
            keep_merge_components_with_points(
                torch.zeros(1, 1, 4, 4, 4), torch.zeros(1, 1, 4, 4, 4), torch.zeros(1, 1, 3), torch.ones(1, 1)
            )

    @parameterized.expand(BACKENDS)
    def test_positive_points(self, name):
        img = torch.full((1, 2, 12, 10, 8), -2.0)
        img[0, :, 1:4, 1:4, 1:4] = 1.0
        img[0, :, 7:9, 6:8, 4:6] = 3.0
        img[0, :, 0, 9, 7] = float("nan")
        coords = torch.tensor([[[2, 2, 2], [8, 7, 5]], [[2, 2, 2], [0, 0, 0]]])
        labels = torch.tensor([[1, 0], [0, -1]])  # prompt 1 has no positive point: left untouched
        before = img.clone()
        with backend(name):
            out = keep_components_with_positive_points(img, coords, labels)
        self.assertIs(out, img)
        self.assertTrue(torch.equal(out[0, 1].nan_to_num(7.0), before[0, 1].nan_to_num(7.0)))
        kept = out[0, 0, 1:4, 1:4, 1:4]
        self.assertTrue(torch.equal(kept, torch.ones_like(kept)))
        outside = before[0, 0].clone()
        outside[1:4, 1:4, 1:4] = float("nan")
        fill = outside[~torch.isnan(outside)].mean()
        self.assertTrue(torch.allclose(out[0, 0, 7:9, 6:8, 4:6], fill.expand(2, 2, 2)))
        self.assertLess(float(fill), 0.0)
        self.assertTrue(torch.isnan(out[0, 0, 0, 9, 7]))


    @parameterized.expand(BACKENDS)
    def test_positive_point_in_the_last_half_voxel(self, name):
        """A point at size - 0.5 rounds to one past the end: it is taken as the last voxel, not an IndexError."""
        img = torch.full((1, 1, 8, 8, 8), -1.0)
        img[0, 0, 5:8, 5:8, 5:8] = 2.0  # the clicked corner component
        img[0, 0, 0:2, 0:2, 0:2] = 2.0  # another component, dropped
        with backend(name):
            out = keep_components_with_positive_points(img, torch.tensor([[[7.5, 7.5, 7.5]]]), torch.tensor([[1]]))
        self.assertEqual(int((out[0, 0] > 0).sum()), 27)
        self.assertTrue(bool((out[0, 0, 5:8, 5:8, 5:8] > 0).all()))


class TestPoints(unittest.TestCase):
    @parameterized.expand([("disc", True, 2), ("gaussian", False, 3)])
    def test_discs_while_exporting_equal_the_loop(self, _, disc, radius):
        """Under torch.export the balls are built without reading the labels in Python; same values as the loop."""
        point = torch.tensor([[[5.0, 6.0, 4.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]], [[1.0, 9.0, 3.0], [7.0, 2.0, 8.0],
                                                                                  [3.0, 3.0, 3.0]]])
        label = torch.tensor([[1, -1, 2], [0, 3, 1]])
        looped = convert_points_to_disc((10, 12, 9), point, label, radius=radius, disc=disc)
        with mock.patch("torch.compiler.is_exporting", return_value=True):
            at_once = convert_points_to_disc((10, 12, 9), point, label, radius=radius, disc=disc)
        torch.testing.assert_close(at_once, looped, rtol=1e-6, atol=1e-6)  # sums of up to 3 floats in another order

    def test_disc(self):
        point = torch.tensor([[[5.0, 6.0, 4.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]])
        label = torch.tensor([[1, -1, 2]])
        disc = convert_points_to_disc((10, 12, 9), point, label, radius=2, disc=True)
        self.assertEqual(disc.shape, (1, 2, 10, 12, 9))
        self.assertEqual(disc.dtype, torch.float32)
        # squared distance < 4 in the unit lattice: 1 + 6 + 12 + 8 voxels
        self.assertEqual(int(disc[0, 1].sum()), 27)
        self.assertEqual(float(disc[0, 1, 5, 6, 4]), 1.0)
        self.assertEqual(float(disc[0, 1, 7, 6, 4]), 0.0)
        self.assertEqual(int(disc[0, 0].sum()), 27)  # label 2 is negative: channel 0; -1 skipped
        self.assertEqual(float(disc[0, 0, 0, 0, 0]), 0.0)
        gauss = convert_points_to_disc((10, 12, 9), point, label, radius=3)
        self.assertAlmostEqual(float(gauss[0, 1, 5, 6, 4]), 1.0, places=6)
        self.assertAlmostEqual(float(gauss[0, 1, 5, 6, 7]), float(np.exp(-9 / 18)), places=6)
        # two coincident positive points add up
        twice = convert_points_to_disc((4, 4, 4), torch.ones(1, 2, 3), torch.tensor([[3, 1]]), radius=1)
        self.assertAlmostEqual(float(twice[0, 1, 1, 1, 1]), 2.0, places=6)
        self.assertEqual(float(twice[0, 0].abs().sum()), 0.0)

    def _labels(self):
        lab = torch.zeros(1, 1, 14, 12, 10)
        lab[0, 0, 2:7, 2:7, 2:7] = 1  # 5^3 cube centred on (4, 4, 4)
        lab[0, 0, 9:12, 8:11, 6:9] = 2
        lab[0, 0, 13, 0, 0] = 3  # one voxel: erosion removes it entirely
        return lab

    @parameterized.expand(BACKENDS)
    def test_sample_counts_and_padding(self, name):
        lab = self._labels()
        with backend(name):
            random.seed(0)
            p, pl = sample_points_from_label(lab, [1, 2, 3, 4], max_ppoint=3, max_npoint=2)
            random.seed(0)
            p2, pl2 = sample_points_from_label(lab, [1, 2, 3, 4], max_ppoint=3, max_npoint=2)
        self.assertEqual(p.shape, (4, 5, 3))
        self.assertEqual(pl.shape, (4, 5))
        self.assertTrue(torch.equal(p, p2) and torch.equal(pl, pl2))
        self.assertEqual(pl[0].tolist(), [1, 1, 1, 0, 0])
        self.assertEqual(pl[2].tolist(), [1, 0, 0, -1, -1])
        self.assertEqual(pl[3].tolist(), [-1] * 5)
        self.assertEqual(p[3].abs().sum().item(), 0)
        self.assertEqual(p[2, 3:].abs().sum().item(), 0)
        self.assertEqual(p[2, 0].tolist(), [13, 0, 0])
        for b, lid in enumerate([1, 2, 3]):
            for n in range(5):
                if pl[b, n] < 0:
                    continue
                x, y, z = p[b, n].long().tolist()
                self.assertEqual(lab[0, 0, x, y, z].item() == lid, bool(pl[b, n] == 1))
        # positives come from the eroded label: the 3x3x3 core of the 5^3 cube
        self.assertTrue(bool((p[0, :3] >= 3).all() and (p[0, :3] <= 5).all()))

    def test_sample_center_and_seed(self):
        lab = self._labels()
        p, pl = sample_points_from_label(lab, [1], max_ppoint=1, use_center=True)
        self.assertEqual(p[0, 0].tolist(), [4, 4, 4])
        self.assertEqual(pl.tolist(), [[1]])
        random.seed(1)
        a = sample_points_from_label(lab, [1, 2], max_ppoint=2, max_npoint=2)[0]
        random.seed(2)
        b = sample_points_from_label(lab, [1, 2], max_ppoint=2, max_npoint=2)[0]
        self.assertFalse(torch.equal(a, b))
        with self.assertRaisesRegex(ValueError, "batch size 1"):
            sample_points_from_label(lab.repeat(2, 1, 1, 1, 1), [1])

    @unittest.skipUnless(torch.cuda.is_available(), "needs CUDA")
    def test_stays_on_device(self):
        m = two_blobs().cuda()
        self.assertEqual(get_largest_connected_component_mask(m).device, m.device)
        pts, lbs = torch.ones(1, 1, 3).cuda(), torch.ones(1, 1).cuda()
        out = keep_merge_components_with_points(m[None, None], m[None, None], pts, lbs)
        self.assertEqual(out.device, m.device)


class TestUpstreamReference(unittest.TestCase):
    """Outputs recorded from upstream MONAI 1.6.1 (tests/testing_data/make_point_helpers_reference.py)."""

    @parameterized.expand(BACKENDS)
    def test_matches_upstream(self, name):
        ref = torch.load(REF, weights_only=True)
        cases, outputs = ref["cases"], ref["outputs"]
        with backend(name):
            for c, o in zip(cases["sample"], outputs["sample"]):
                random.seed(c["seed"])
                p, pl = sample_points_from_label(
                    c["labels"], c["label_set"], c["max_ppoint"], c["max_npoint"], use_center=c["use_center"]
                )
                self.assertEqual((p.dtype, pl.dtype), (o["point"].dtype, o["point_label"].dtype))
                self.assertTrue(torch.equal(p, o["point"]) and torch.equal(pl, o["point_label"]))
            for c, o in zip(cases["disc"], outputs["disc"]):
                out = convert_points_to_disc(c["image_size"], c["point"], c["point_label"], c["radius"], c["disc"])
                torch.testing.assert_close(out, o, rtol=1e-6, atol=1e-6)
            for c, o in zip(cases["merge"], outputs["merge"]):
                self.assertTrue(torch.equal(keep_merge_components_with_points(**c), o))
            for c, o in zip(cases["positive"], outputs["positive"]):
                out = keep_components_with_positive_points(c["img"].clone(), c["point_coords"], c["point_labels"])
                torch.testing.assert_close(out, o, equal_nan=True, rtol=1e-6, atol=1e-6)
            for c, o in zip(cases["largest"], outputs["largest"]):
                out = get_largest_connected_component_mask(c["img"], c["connectivity"], c["num_components"])
                self.assertTrue(torch.equal(out, o))


if __name__ == "__main__":
    unittest.main()
