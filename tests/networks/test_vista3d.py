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
"""VISTA3D behaviour: output shapes per prompt mode, argument errors, freezing and feature caching."""

from __future__ import annotations

import unittest
from unittest import mock

import torch
from parameterized import parameterized

from monai.networks.nets import VISTA3D
from monai.networks.nets.vista3d import ClassMappingClassify, PointMappingSAM
from tests.networks.tiny_vista3d import build_tiny_vista3d

S = 16  # spatial size of the test images
COORDS = torch.tensor([[[3, 4, 5], [10, 10, 10]], [[8, 2, 12], [0, 0, 0]]])
LABELS = torch.tensor([[1, 0], [1, -1]])
WINDOW = (slice(0, 1), slice(None), slice(2, 2 + S), slice(0, S), slice(1, 1 + S))

SHAPE_CASES = [
    ["class_only", dict(class_vector=torch.tensor([[1], [2], [3]])), (3, 1, S, S, S)],
    ["class_only_1d_vector", dict(class_vector=torch.tensor([4, 5])), (2, 1, S, S, S)],
    ["class_only_transpose", dict(class_vector=torch.tensor([[1], [2], [3]]), transpose=True), (1, 3, S, S, S)],
    ["points_only", dict(point_coords=COORDS, point_labels=LABELS), (2, 1, S, S, S)],
    ["points_transpose", dict(point_coords=COORDS, point_labels=LABELS, transpose=True), (1, 2, S, S, S)],
    [
        "points_zero_shot",
        dict(point_coords=COORDS, point_labels=LABELS, prompt_class=torch.tensor([[5], [300]])),
        (2, 1, S, S, S),
    ],
    ["points_special_labels", dict(point_coords=COORDS, point_labels=torch.tensor([[3, 2], [3, -1]])), (2, 1, S, S, S)],
    [
        "class_and_points",
        dict(class_vector=torch.tensor([[3], [9]]), point_coords=COORDS, point_labels=LABELS, prompt_class=torch.tensor([[3], [9]])),
        (2, 1, S, S, S),
    ],
    [
        "class_and_points_in_window",
        dict(
            class_vector=torch.tensor([[3], [9]]),
            point_coords=COORDS + torch.tensor([2, 0, 1]),
            point_labels=LABELS,
            patch_coords=[WINDOW],
            transpose=True,
        ),
        (1, 2, S, S, S),
    ],
    [
        "points_prev_mask_in_window",
        dict(
            point_coords=COORDS + torch.tensor([2, 0, 1]),
            point_labels=LABELS,
            patch_coords=[WINDOW],
            prev_mask=torch.randn(1, 2, S + 4, S, S + 2),
            transpose=True,
        ),
        (1, 2, S, S, S),
    ],
    ["points_pad_size", dict(point_coords=COORDS, point_labels=LABELS, pad_size=[1, 0, 0, 2, 3, 0]), (2, 1, S, S, S)],
    ["lists_as_prompts", dict(point_coords=COORDS.tolist(), point_labels=LABELS.tolist()), (2, 1, S, S, S)],
]

ERROR_CASES = [
    ["coords_without_labels", dict(point_coords=COORDS), "given together"],
    ["labels_without_coords", dict(point_labels=LABELS), "given together"],
    ["coords_not_3d", dict(point_coords=COORDS[..., :2], point_labels=LABELS), r"\[B, N, 3\]"],
    ["labels_shape_mismatch", dict(point_coords=COORDS, point_labels=LABELS[:, :1]), "must have shape"],
    ["prompt_class_rows", dict(point_coords=COORDS, point_labels=LABELS, prompt_class=torch.tensor([[1]])), "one row"],
    ["class_vector_shape", dict(class_vector=torch.ones(2, 2, dtype=torch.long)), r"\[B, 1\]"],
    ["bad_point_label", dict(point_coords=COORDS, point_labels=torch.tensor([[1, 4], [1, 0]])), "point_labels must be"],
]


class TestVista3dForward(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.model = build_tiny_vista3d(feature_size=8, blocks_down=(1, 1)).eval()
        cls.image = torch.randn(1, 1, S, S, S)

    def setUp(self):
        self.model.image_embeddings = None

    @parameterized.expand(SHAPE_CASES)
    def test_output_shape(self, _, kwargs, shape):
        with torch.no_grad():
            out = self.model(self.image, **kwargs)
        self.assertEqual(tuple(out.shape), shape)
        self.assertTrue(torch.isfinite(out).all())

    @parameterized.expand(ERROR_CASES)
    def test_bad_arguments(self, _, kwargs, message):
        with self.assertRaisesRegex(ValueError, message):
            self.model(self.image, **kwargs)

    def test_class_windows(self):
        """A batch of sliding windows with class prompts: one output per window and class."""
        images = torch.randn(3, 1, S, S, S)
        cv = torch.tensor([[1], [7]])
        with torch.no_grad():
            out = self.model(images, class_vector=cv, transpose=True)
            single = [self.model(images[[i]], class_vector=cv, transpose=True) for i in range(3)]
        self.assertEqual(tuple(out.shape), (3, 2, S, S, S))
        self.assertTrue(torch.allclose(out, torch.cat(single), atol=1e-5))

    @parameterized.expand(
        [
            ["plain", dict()],
            ["transpose", dict(transpose=True)],
            ["labels_to_sample_from", dict(labels=torch.zeros(1, 1, S, S, S), label_set=[0, 1], patch_coords=[WINDOW])],
        ]
    )
    def test_no_prompt_is_one_ninf_row(self, _, kwargs):
        """Without class_vector and point_coords, MONAI 1.6.1 returns [1, 1, *spatial] of NINF_VALUE, not an error."""
        images = torch.randn(2, 1, S, S + 2, S)
        with torch.no_grad():
            out = self.model(images, **kwargs)
        self.assertEqual(tuple(out.shape), (1, 1, S, S + 2, S))
        self.assertTrue((out == self.model.NINF_VALUE).all())

    def test_padding_only_row_is_ninf(self):
        labels = torch.tensor([[1, 0], [-1, -1]])
        with torch.no_grad():
            out = self.model(self.image, point_coords=COORDS, point_labels=labels)
        self.assertTrue((out[1] == self.model.NINF_VALUE).all())
        self.assertFalse((out[0] == self.model.NINF_VALUE).any())

    def test_clicks_outside_window(self):
        far = torch.tensor([[[S + 5, 1, 1]], [[0, 0, 0]]])  # outside, and on the window's first voxel
        with torch.no_grad():
            out = self.model(
                self.image, point_coords=far, point_labels=torch.tensor([[1], [1]]), patch_coords=[WINDOW[:2] + (slice(0, S),) * 3]
            )
        self.assertEqual(tuple(out.shape), (2, 1, S, S, S))
        self.assertTrue((out == self.model.NINF_VALUE).all())

    @parameterized.expand([["edit_prev_mask", False], ["class_and_click", True]])
    def test_click_in_window_last_half_voxel(self, _, with_class):
        # 2 + S - 0.4 is inside the window (before its stop, 2 + S) but rounds to one past its last voxel: the
        # click must count in the last voxel, as the same click placed there does, not index past the window
        prompts = dict(point_labels=torch.tensor([[1]]), patch_coords=[WINDOW], transpose=True)
        if with_class:
            prompts.update(class_vector=torch.tensor([[3]]), prompt_class=torch.tensor([[3]]))
        else:
            prompts.update(prev_mask=torch.randn(1, 1, S + 4, S, S + 2))
        with torch.no_grad():
            edge = self.model(self.image[:1], point_coords=torch.tensor([[[2 + S - 0.4, 5.0, 6.0]]]), **prompts)
            last = self.model(self.image[:1], point_coords=torch.tensor([[[2 + S - 1.0, 5.0, 6.0]]]), **prompts)
            before = self.model(self.image[:1], class_vector=torch.tensor([[3]]), transpose=True) if with_class \
                else prompts["prev_mask"][WINDOW]
        self.assertEqual(tuple(edge.shape), (1, 1, S, S, S))
        self.assertFalse(torch.isnan(edge).any())
        self.assertFalse(torch.equal(edge, before))  # the click edited the window
        # the point head sees coordinates 0.6 voxel apart; which voxels flip is decided alike
        self.assertGreater((edge > 0).eq(last > 0).float().mean().item(), 0.95)

    def test_class_points_gaussian_differs_from_class_only(self):
        cv = torch.tensor([[3], [9]])
        with torch.no_grad():
            auto = self.model(self.image, class_vector=cv)
            mixed = self.model(self.image, class_vector=cv, point_coords=COORDS, point_labels=LABELS, radius=2)
        # far from every click the automatic result is kept, at the clicks the point result takes over
        self.assertTrue(torch.allclose(mixed[0, 0, 15, 0, 0], auto[0, 0, 15, 0, 0]))
        self.assertFalse(torch.allclose(mixed[0, 0, 3, 4, 5], auto[0, 0, 3, 4, 5]))


class TestVista3dKeepCache(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(1)
        self.model = build_tiny_vista3d(feature_size=8, blocks_down=(1, 1)).eval()
        self.image = torch.randn(1, 1, S, S, S)

    def test_points_reuse_cached_features(self):
        with torch.no_grad():
            first = self.model(self.image, point_coords=COORDS, point_labels=LABELS, keep_cache=True)
            self.assertIsNotNone(self.model.image_embeddings)
            self.assertFalse(self.model.image_embeddings.requires_grad)
            with mock.patch.object(self.model.image_encoder, "forward", side_effect=AssertionError("encoder ran")):
                again = self.model(torch.zeros_like(self.image), point_coords=COORDS, point_labels=LABELS, keep_cache=True)
        self.assertTrue(torch.equal(first, again))

    def test_no_cache_without_flag_or_with_classes(self):
        with torch.no_grad():
            self.model(self.image, point_coords=COORDS, point_labels=LABELS)
            self.assertIsNone(self.model.image_embeddings)
            self.model(self.image, class_vector=torch.tensor([[1]]), keep_cache=True)
            self.assertIsNone(self.model.image_embeddings)
            self.model(self.image, point_coords=COORDS, point_labels=LABELS, keep_cache=True)
            cached = self.model.image_embeddings
            # class prompts always run the encoder, even with a cache
            blank = self.model(torch.zeros_like(self.image), class_vector=torch.tensor([[1]]), keep_cache=True)
            fresh = self.model(torch.zeros_like(self.image), class_vector=torch.tensor([[1]]))
        self.assertTrue(torch.equal(blank, fresh))
        self.assertIs(self.model.image_embeddings, cached)


class TestVista3dFusedDecision(unittest.TestCase):
    def test_cpu_never_fused(self):
        # even where the Triton interpreter would run the kernels on CPU tensors, the network is not fused there
        with mock.patch("monai.utils.triton_support.interpreting", lambda: True):
            self.assertIn("CUDA GPUs, not on cpu", VISTA3D.fused_unavailable_reason("cpu"))

    def test_cuda_asks_the_kernels(self):
        with mock.patch("monai.utils.triton_support.unavailable_reason", lambda device: f"asked for {device}"):
            self.assertEqual(VISTA3D.fused_unavailable_reason("cuda:1"), "asked for cuda:1")
        with mock.patch("monai.utils.triton_support.unavailable_reason", lambda device: None):
            self.assertIsNone(VISTA3D.fused_unavailable_reason(torch.device("cuda", 0)))


class TestVista3dAutoGrad(unittest.TestCase):
    def setUp(self):
        self.model = build_tiny_vista3d(feature_size=8, blocks_down=(1, 1))

    def _trainable(self, module):
        return {p.requires_grad for p in module.parameters()}

    @parameterized.expand(
        [
            [True, False, {False}, {False}, {False}, {True}, {True}],
            [False, True, {False}, {True}, {True}, {False}, {False}],
            [True, True, {False}, {False}, {False}, {False}, {False}],
            [False, False, {True}, {True}, {True}, {True}, {True}],
        ]
    )
    def test_set_auto_grad(self, auto, point, encoder, auto_dec, class_head, point_dec, point_head):
        m = self.model
        m.set_auto_grad(auto_freeze=True, point_freeze=True)  # start from a different state
        m.set_auto_grad(auto_freeze=auto, point_freeze=point)
        self.assertEqual((m.auto_freeze, m.point_freeze), (auto, point))
        self.assertEqual(self._trainable(m.image_encoder.encoder), encoder)
        self.assertEqual(self._trainable(m.image_encoder.up_layers_auto), auto_dec)
        self.assertEqual(self._trainable(m.class_head), class_head)
        self.assertEqual(self._trainable(m.image_encoder.up_layers), point_dec)
        self.assertEqual(self._trainable(m.point_head), point_head)

    def test_frozen_branch_gets_no_gradient(self):
        m = self.model.train()
        m.set_auto_grad(auto_freeze=True)
        out = m(torch.randn(1, 1, S, S, S), point_coords=COORDS, point_labels=LABELS)
        out.sum().backward()
        self.assertTrue(all(p.grad is None for p in m.class_head.parameters()))
        self.assertTrue(all(p.grad is None for p in m.image_encoder.encoder.parameters()))
        self.assertTrue(any(p.grad is not None for p in m.point_head.parameters()))

    def test_generic_encoder_without_set_auto_grad(self):
        enc = torch.nn.Conv3d(1, 8, 1)
        m = VISTA3D(enc, ClassMappingClassify(16, 8), PointMappingSAM(8, n_classes=16, last_supported=8))
        m.set_auto_grad(point_freeze=True)
        self.assertEqual(self._trainable(enc), {False})
        self.assertEqual(self._trainable(m.class_head), {True})


if __name__ == "__main__":
    unittest.main()
