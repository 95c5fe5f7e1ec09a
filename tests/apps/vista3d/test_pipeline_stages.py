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
"""Preprocessing, inversion and post-transform of the VISTA3D pipeline, stage by stage."""

from __future__ import annotations

import unittest
from pathlib import Path

import nibabel.orientations as nio
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.core.postprocess import (
    ClassMasks,
    logits_to_labels,
    logits_to_masks,
    logits_to_outputs,
    pack_masks,
)
from monai.apps.vista3d.core.preprocess import (
    apply_orientation,
    foreground_box,
    input_to_preprocessed_coords,
    invert_labels,
    preprocess,
    preprocess_like_bundle,
    ras_orientation,
    resample,
    spacing_geometry,
    undo_orientation,
)
from monai.apps.vista3d.errors import ClassPromptError, EmptyForegroundError
from monai.apps.vista3d.labels import everything_labels, label_name, parse_classes

REF = torch.load(
    Path(__file__).parents[2] / "testing_data" / "vista3d_pipeline_reference.pt", weights_only=True
)
CASES = sorted(REF["cases"])


def _upstream_post(pred: torch.Tensor, label_prompt: list[int] | None) -> torch.Tensor:
    """The bundle's post-transform written as its per-class loop, to check the one-pass version against."""
    pred = pred.clone()
    n = pred.shape[0]
    pred[pred < 0] = 0.0
    if n > 1:
        bk = torch.all(pred <= 0, dim=0, keepdim=True)
        pred = pred.argmax(0).unsqueeze(0).float() + 1.0
        pred[bk] = 0.0
    else:
        pred[pred > 0] = 1.0
    if label_prompt is not None:
        pred += 0.5
        for i in range(1, n + 1):
            pred[pred == i + 0.5] = float(label_prompt[i - 1])
        pred[pred == 0.5] = 0.0
    return pred[0]


class TestPreprocessMatchesUpstream(unittest.TestCase):
    @parameterized.expand([(c, d) for c in CASES for d in (torch.float64, torch.float32)])
    def test_forward(self, name, dtype):
        case = REF["cases"][name]
        out, rec = preprocess(case["image"].float(), case["affine"].numpy(), dtype=dtype)
        self.assertEqual(out.dtype, torch.float32)
        self.assertEqual(tuple(out.shape), tuple(case["output"].shape))
        np.testing.assert_allclose(rec.final_affine, case["output_affine"].numpy(), atol=1e-9)
        atol = 1e-7 if dtype == torch.float64 else 1e-6
        torch.testing.assert_close(out, case["output"], atol=atol, rtol=0)
        self.assertTrue(out.is_contiguous())

    @parameterized.expand([(c,) for c in CASES])
    def test_inverse(self, name):
        case = REF["cases"][name]
        _, rec = preprocess(case["image"].float(), case["affine"].numpy())
        back = invert_labels(case["labels"].float(), rec)
        self.assertEqual(tuple(back.shape), tuple(case["image"].shape))
        expected = torch.nan_to_num(case["inverted"].float(), 255)
        # Voxel centres exactly half-way between two network voxels (0.75/0.625 mm inputs) are decided by
        # float rounding inside MONAI's grid_sample; this fork rounds half to even, so a few of them differ.
        allowed = 0.0 if "ties" not in name else 1e-3
        self.assertLessEqual((torch.nan_to_num(back, 255) != expected).double().mean().item(), allowed)
        # integer label maps take the same path without a float copy
        lab = torch.nan_to_num(case["labels"].float(), 255).to(torch.int16)
        back_i = invert_labels(lab, rec)
        self.assertEqual(back_i.dtype, torch.int16)
        torch.testing.assert_close(back_i, torch.nan_to_num(back, 255).to(torch.int16))


class TestGeometry(unittest.TestCase):
    def test_spacing_geometry_keeps_directions(self):
        aff = np.diag([-0.8, 0.9, 2.5, 1.0])
        aff[:3, 3] = (30, -10, -40)
        new, shape = spacing_geometry(aff, (36, 32, 14))
        np.testing.assert_allclose(np.diag(new)[:3], (-1.5, 1.5, 1.5))
        # the output covers the input's voxel centres: extent (n - 1) * spacing / 1.5 + 1
        self.assertEqual(shape, (round(35 * 0.8 / 1.5) + 1, round(31 * 0.9 / 1.5) + 1, round(13 * 2.5 / 1.5) + 1))
        np.testing.assert_allclose(new[:3, 3], aff[:3, 3])

    def test_sheared_resample_matches_grid_sample_path(self):
        # A sheared map goes through grid_sample; an axis-aligned one through the separable passes:
        # both must sample the same continuous index.
        img = torch.rand(1, 12, 11, 10, dtype=torch.float64)
        diag = np.diag([0.73, 1.31, 0.87, 1.0])  # no exact half-way points: nearest is unambiguous
        diag[:3, 3] = (0.41, -0.62, 1.13)
        sheared = diag.copy()
        sheared[0, 1] = 1e-6  # just enough to leave the fast path
        a = resample(img, diag, (14, 9, 11), dtype=torch.float64)
        b = resample(img, sheared, (14, 9, 11), dtype=torch.float64)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        an = resample(img, diag, (14, 9, 11), mode="nearest")
        bn = resample(img, sheared, (14, 9, 11), mode="nearest", dtype=torch.float64)
        torch.testing.assert_close(an, bn)

    def test_orientation_round_trip(self):
        aff = np.array([[0.0, 0.0, -1.0, 0], [-1.0, 0.0, 0.0, 0], [0.0, -1.0, 0.0, 0], [0, 0, 0, 1]])
        ornt = ras_orientation(aff)
        x = torch.arange(3 * 4 * 5).reshape(1, 3, 4, 5)
        y = apply_orientation(x, ornt)
        # voxel axes point to -A, -S, -R: RAS comes from axes (2, 0, 1), each flipped
        self.assertEqual(tuple(y.shape), (1, 5, 3, 4))
        np.testing.assert_array_equal(y[0].numpy(), nio.apply_orientation(x[0].numpy(), ornt))
        torch.testing.assert_close(undo_orientation(y, ornt), x)

    def test_empty_foreground(self):
        with self.assertRaisesRegex(EmptyForegroundError, "nothing to segment"):
            foreground_box(torch.full((1, 8, 8, 8), -1000.0))
        with self.assertRaises(EmptyForegroundError):
            preprocess(torch.zeros(1, 16, 16, 16), np.eye(4))

    def test_foreground_box_margin(self):
        x = torch.zeros(1, 30, 30, 30)
        x[0, 12:15, 3:5, 20] = 1
        self.assertEqual(foreground_box(x, margin=10), ((2, 0, 10), (25, 15, 30)))
        self.assertEqual(foreground_box(x, margin=10, allow_smaller=False), ((2, -7, 10), (25, 15, 31)))

    def test_points_follow_the_geometry(self):
        case = REF["cases"]["oblique"]
        _, rec = preprocess(case["image"].float(), case["affine"].numpy())
        pts = np.array([[3.0, 4.0, 5.0], [20.0, 10.0, 7.0]])
        got = input_to_preprocessed_coords(pts, rec)
        world_in = (rec.input_affine @ np.c_[pts, np.ones(2)].T)[:3].T
        world_out = (rec.final_affine @ np.c_[got, np.ones(2)].T)[:3].T
        np.testing.assert_allclose(world_in, world_out, atol=1e-9)


class TestPostprocess(unittest.TestCase):
    @parameterized.expand([(1,), (3,), (7,)])
    def test_matches_the_per_class_loop(self, n):
        g = torch.Generator().manual_seed(n)
        logits = torch.randn(n, 9, 8, 7, generator=g)
        logits[:, :3] -= 5  # some all-negative voxels: background
        ids = torch.randperm(120, generator=g)[:n] + 1
        got = logits_to_labels(logits, ids)
        self.assertEqual(got.dtype, torch.int16)
        torch.testing.assert_close(got.float(), _upstream_post(logits, ids.tolist()))
        torch.testing.assert_close(logits_to_labels(logits[None]).float(), _upstream_post(logits, None))

    def test_ties_and_nan(self):
        logits = torch.zeros(2, 1, 1, 3)
        logits[:, 0, 0, 1] = 2.0  # tie: the first prompted class wins, as with argmax
        logits[1, 0, 0, 2] = 1.0
        self.assertEqual(logits_to_labels(logits, [7, 9]).flatten().tolist(), [0, 7, 9])
        single = torch.tensor([[[[1.0, -1.0, float("nan")]]]])
        self.assertEqual(logits_to_labels(single, [4]).flatten().tolist(), [4, 0, 255])

    def test_wrong_number_of_ids(self):
        with self.assertRaisesRegex(ValueError, "2 label ids for 3"):
            logits_to_labels(torch.zeros(3, 2, 2, 2), [1, 2])


class TestPromptOutputs(unittest.TestCase):
    """``logits_to_outputs``: the label map (and masks) of a prompt's logits, as the pipeline's full-logits path."""

    def test_class_prompt_with_masks(self):
        logits = torch.randn(1, 3, 6, 5, 4)
        labels, masks = logits_to_outputs(logits, [4, 9, 2], masks=True)
        torch.testing.assert_close(labels, logits_to_labels(logits, [4, 9, 2]))
        reference = logits_to_masks(logits, [4, 9, 2])
        self.assertEqual(list(masks.label_ids), [4, 9, 2])
        for i in (4, 9, 2):
            torch.testing.assert_close(masks[i], reference[i])
        self.assertIsNone(logits_to_outputs(logits, [4, 9, 2])[1])

    def test_clicks_without_a_class_keep_the_clicked_component(self):
        logits = torch.full((1, 1, 12, 6, 6), -1.0)
        logits[..., 1:4, 1:4, 1:4] = 2.0  # the clicked blob
        logits[..., 7:10, 1:4, 1:4] = 2.0  # another blob, not clicked
        coords, point_labels = torch.tensor([[[2.0, 2.0, 2.0]]]), torch.tensor([[1]])
        labels, masks = logits_to_outputs(logits.clone(), None, coords, point_labels)
        self.assertIsNone(masks)
        self.assertTrue((labels[1:4, 1:4, 1:4] == 1).all())
        self.assertEqual(int((labels == 1).sum()), 27)  # the other blob is dropped
        with_class, _ = logits_to_outputs(logits.clone(), [3], coords, point_labels)
        self.assertEqual(int((with_class == 3).sum()), 54)  # a class prompt keeps every component


class TestClassMasks(unittest.TestCase):
    @parameterized.expand([(1,), (8,), (9,), (117,)])
    def test_each_class_on_its_own(self, n):
        g = torch.Generator().manual_seed(n)
        logits = torch.randn(n, 6, 5, 4, generator=g)
        logits[0, 0, 0, 0] = float("nan")  # no prediction: in no mask
        logits[-1, 0, 0, 1] = 0.0  # not > 0
        ids = (torch.randperm(120, generator=g)[:n] + 1).tolist()
        masks = logits_to_masks(logits[None], ids)
        self.assertEqual(masks.packed.shape, (-(-n // 8), 6, 5, 4))
        self.assertEqual(list(masks), ids)
        self.assertEqual(tuple(masks.spatial_shape), (6, 5, 4))
        for k, label_id in enumerate(ids):
            self.assertEqual(masks[label_id].dtype, torch.bool)
            self.assertTrue(torch.equal(masks[label_id], logits[k] > 0), label_id)
        self.assertTrue(torch.equal(masks.dense(), (logits > 0).to(torch.uint8)))
        self.assertFalse(masks[ids[0]][0, 0, 0])  # the NaN voxel
        # the label map's class is inside its mask, and the map is background where no mask is set
        labels = logits_to_labels(logits.nan_to_num(-1.0), ids)
        dense = masks.dense().bool()
        for label_id in ids:
            self.assertTrue(dense[ids.index(label_id)][labels == label_id].all())
        self.assertTrue(torch.equal(labels == 0, ~dense.any(0)))

    def test_unpacks_what_pack_masks_packs(self):
        logits = torch.tensor([[1.0, -1.0, 2.0]] * 8 + [[-1.0, 3.0, 0.5]])[..., None, None]  # [9, 3, 1, 1]
        packed = pack_masks(logits)
        self.assertEqual(packed.flatten().tolist(), [255, 0, 255, 0, 1, 1])  # class i: bit i % 8 of byte i // 8
        self.assertEqual(ClassMasks(packed, range(1, 10))[9].flatten().tolist(), [False, True, True])

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "need 2 packed channels"):
            ClassMasks(torch.zeros(1, 2, 2, 2, dtype=torch.uint8), range(9))
        with self.assertRaisesRegex(ValueError, "unique"):
            ClassMasks(torch.zeros(1, 2, 2, 2, dtype=torch.uint8), [3, 3])
        with self.assertRaisesRegex(ValueError, "uint8"):
            ClassMasks(torch.zeros(1, 2, 2, 2), [3])
        with self.assertRaisesRegex(ValueError, "2 label ids for 3"):
            logits_to_masks(torch.zeros(3, 2, 2, 2), [1, 2])
        with self.assertRaises(KeyError):
            logits_to_masks(torch.zeros(2, 2, 2, 2), [1, 2])[5]


class TestLabels(unittest.TestCase):
    def test_everything(self):
        self.assertEqual(len(everything_labels()), 117)
        self.assertEqual(parse_classes("everything"), everything_labels())
        self.assertEqual(parse_classes(None), everything_labels())

    def test_names_ids_and_subclasses(self):
        self.assertEqual(parse_classes("3, Liver,left kidney"), [3, 1, 14])
        self.assertEqual(parse_classes(["kidney", 1]), [14, 5, 1])
        self.assertEqual(parse_classes("kidney", expand_subclasses=False), [2])
        self.assertEqual(label_name(115), "heart")

    @parameterized.expand([("livr", "did you mean 'liver'"), ("0", "out of range"), ("133", "out of range"),
                           ("1,,3", "empty class name"), ("", "empty class name")])
    def test_bad_prompts(self, spec, msg):
        with self.assertRaisesRegex(ClassPromptError, msg):
            parse_classes(spec)



class TestComputeLayout(unittest.TestCase):
    """Preprocessing's cast and re-layout of a file-order image is one pass over the volume."""

    @staticmethod
    def _full_volume_ops(x):
        from torch.utils._python_dispatch import TorchDispatchMode

        from monai.apps.vista3d.io.load_policy import as_compute_layout

        ops = []

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if isinstance(out, torch.Tensor) and out.numel() == x.numel():
                    ops.append(str(func))
                return out

        with Record():
            y = as_compute_layout(x)
        return y, [o for o in ops if not o.startswith(("aten.alias", "aten.detach"))]

    @parameterized.expand([("int16_file_order", torch.int16, True, 1), ("float32_file_order", torch.float32, True, 1),
                           ("uint8_contiguous", torch.uint8, False, 1), ("float32_contiguous", torch.float32, False, 0)])
    def test_one_pass(self, _, dtype, file_order, passes):
        base = torch.arange(4 * 5 * 6).reshape(1, 6, 5, 4).to(dtype)
        x = base.permute(0, 3, 2, 1) if file_order else base.permute(0, 3, 2, 1).contiguous()
        y, ops = self._full_volume_ops(x)
        self.assertEqual(len(ops), passes, ops)
        self.assertTrue(y.is_contiguous())
        self.assertEqual(y.dtype, torch.float32)
        torch.testing.assert_close(y, x.float())


class TestBundlePreprocess(unittest.TestCase):
    def test_an_image_as_read_is_preprocessed_as_its_float_copy(self):
        img, aff, _ = _stub_phantom()
        stored = torch.from_numpy(img.astype(np.int16)).permute(2, 1, 0).contiguous().permute(2, 1, 0)[None]
        self.assertFalse(stored.is_contiguous())  # file order, stored type
        x, record = preprocess_like_bundle(stored, aff)
        y, expected = preprocess(stored.float().contiguous(), aff, margin=10, pixdim=(1.5, 1.5, 1.5))
        torch.testing.assert_close(x, y)
        self.assertEqual(record.final_shape, expected.final_shape)
        self.assertTrue(x.is_contiguous())


def _stub_phantom():
    from tests.apps.vista3d.stub_vista import phantom

    return phantom((20, 18, 16), np.eye(3), (2.0, 2.0, 2.5))


if __name__ == "__main__":
    unittest.main()
