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

import math
import unittest

import torch
from parameterized import parameterized
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from monai.apps.vista3d.inferer import sliding_window_label_inference
from monai.apps.vista3d.transforms import VistaPostTransformd
from monai.data import MetaTensor
from monai.inferers import sliding_window_inference
from tests.test_utils import assert_allclose


class RandomLogits(torch.nn.Module):
    """A fixed random convolution: logits of ``channels`` classes, some positive, some not, per voxel.

    ``repeat=2`` returns every channel twice, so that every voxel has tied maxima.
    """

    def __init__(self, spatial_dims: int, channels: int, repeat: int = 1):
        super().__init__()
        torch.manual_seed(0)
        conv = torch.nn.Conv3d if spatial_dims == 3 else torch.nn.Conv2d
        self.conv = conv(1, channels, 3, padding=1)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.conv(x)] * self.repeat, dim=1)


def full_logit_labels(inputs, roi_size, sw_batch_size, predictor, label_prompt=None, **kwargs):
    """The reference: ``sliding_window_inference``, then ``VistaPostTransformd`` on each image."""
    logits = sliding_window_inference(inputs, roi_size, sw_batch_size, predictor, **kwargs)
    post = VistaPostTransformd(keys="pred")
    prompt = None if label_prompt is None else torch.as_tensor(label_prompt)
    return torch.stack([post({"pred": logits[b], "label_prompt": prompt})["pred"] for b in range(logits.shape[0])])


# input shape, roi_size, sw_batch_size, classes, repeat, label_prompt, other arguments
CASES = [
    [(1, 1, 20, 18, 17), (8, 8, 8), 3, 4, 1, None, {}],
    [(2, 1, 19, 12, 16), (8, 6, 8), 4, 3, 1, [5, 2, 200], {"overlap": 0.5, "mode": "gaussian"}],
    [(1, 1, 6, 10, 5), (8, 8, 8), 2, 2, 1, None, {"padding_mode": "replicate"}],
    [(1, 1, 5, 7, 6), (8, 8, 8), 1, 3, 1, None, {"cval": 1.5}],
    [(2, 1, 23, 19), (8, 6), 5, 5, 1, None, {"overlap": (0.3, 0.6), "mode": "gaussian", "sigma_scale": 0.3}],
    [(1, 1, 12, 12, 12), 8, 1, 1, 1, [7], {"overlap": 0.0}],
    [(1, 1, 14, 13, 12), (8, 8, 8), 2, 2, 2, [300, 1, 2, 3], {}],
    [(1, 1, 16, 9, 11), (8, -1, 8), 3, 3, 1, None, {"overlap": 0.6}],
]


class TestSlidingWindowLabelInference(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_equals_labels_of_full_logits(self, shape, roi_size, sw_batch_size, classes, repeat, prompt, kwargs):
        inputs = torch.randn(*shape)
        predictor = RandomLogits(len(shape) - 2, classes, repeat).eval()
        with torch.no_grad():
            labels = sliding_window_label_inference(
                inputs, roi_size, sw_batch_size, predictor, label_prompt=prompt, **kwargs
            )
            expected = full_logit_labels(inputs, roi_size, sw_batch_size, predictor, label_prompt=prompt, **kwargs)
        ids = prompt or range(1, classes + 1)
        self.assertEqual(labels.dtype, torch.uint8 if max(ids) <= 255 else torch.int32)
        self.assertEqual(labels.shape, (shape[0], 1, *shape[2:]))
        self.assertGreater(len(torch.unique(expected)), 1)  # foreground and background both present
        assert_allclose(labels.to(expected.dtype), expected, type_test=False, rtol=0, atol=0)

    def test_with_coord_and_condition(self):
        inputs, condition = torch.randn(1, 1, 13, 11, 10), torch.randn(1, 1, 13, 11, 10)
        net = RandomLogits(3, 3).eval()
        seen = []

        def predictor(windows, window_slices, condition):
            seen.append([tuple(s[2:]) for s in window_slices])
            return net(windows + condition)

        def reference(windows_and_condition, window_slices):  # the condition as a second input channel
            seen.append([tuple(s[2:]) for s in window_slices])
            return net(windows_and_condition[:, :1] + windows_and_condition[:, 1:])

        with torch.no_grad():
            labels = sliding_window_label_inference(
                inputs, (8, 8, 8), 3, predictor, with_coord=True, condition=condition
            )
            expected = full_logit_labels(torch.cat([inputs, condition], 1), (8, 8, 8), 3, reference, with_coord=True)
        self.assertEqual(len(seen), 6)  # 8 windows in batches of 3, 3, 2 for each of the two paths
        self.assertEqual(seen[:3], seen[3:])
        assert_allclose(labels.to(expected.dtype), expected, type_test=False, rtol=0, atol=0)

    def test_metatensor_keeps_metadata(self):
        affine = torch.diag(torch.tensor([2.0, 1.5, 1.0, 1.0]))
        inputs = MetaTensor(torch.randn(1, 1, 10, 9, 8), affine=affine)
        with torch.no_grad():
            labels = sliding_window_label_inference(inputs, (8, 8, 8), 2, RandomLogits(3, 2).eval())
        self.assertIsInstance(labels, MetaTensor)
        assert_allclose(labels.affine, affine, type_test=False)

    def test_does_not_hold_the_logits_of_the_volume(self):
        shape, classes = (1, 1, 32, 32, 24), 8
        inputs, predictor = torch.randn(*shape), RandomLogits(3, classes).eval()
        volume = math.prod(shape[2:])
        with torch.no_grad(), LargestTensor() as streamed:
            sliding_window_label_inference(inputs, (8, 8, 8), 4, predictor)
        with torch.no_grad(), LargestTensor() as full:
            sliding_window_inference(inputs, (8, 8, 8), 4, predictor)
        self.assertGreaterEqual(full.numel, classes * volume)  # the measure sees the all-class logits
        self.assertLessEqual(streamed.numel, volume)  # the largest is the label map, one value a voxel

    @parameterized.expand(
        [
            ["roi_size", {"roi_size": (8, 8)}, "roi_size .* has 2 dimensions"],
            ["overlap", {"overlap": 1.0}, "overlap must be >= 0 and < 1"],
            ["tuple_output", {"predictor": lambda x: (x, x)}, r"predictor must return one \[n, C, \*roi_size\]"],
            ["zoomed_output", {"predictor": lambda x: x[..., ::2]}, r"predictor must return one \[n, C, \*roi_size\]"],
            ["label_prompt", {"label_prompt": [1, 2]}, "label_prompt has 2 entries for 1 logit channels"],
        ]
    )
    def test_errors(self, _, kwargs, message):
        arguments = {"roi_size": (8, 8, 8), "sw_batch_size": 2, "predictor": lambda x: x, **kwargs}
        with self.assertRaisesRegex(ValueError, message):
            sliding_window_label_inference(torch.randn(1, 1, 9, 9, 9), **arguments)


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


if __name__ == "__main__":
    unittest.main()
