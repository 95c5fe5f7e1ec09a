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

import unittest

import numpy as np
import torch
from parameterized import parameterized

from monai.transforms.utils import (
    keep_components_with_positive_points,
    keep_merge_components_with_points,
    label_connected_components,
)
from monai.utils import min_version, optional_import
from tests.test_utils import skip_if_no_cuda

measure, has_measure = optional_import("skimage.measure", "0.14.2", min_version)


def random_mask(shape, fill, seed):
    return np.random.RandomState(seed).rand(*shape) < fill


def snake(size):
    """A one-voxel-wide path that turns back at every row: its first and last voxels are far apart in rounds."""
    mask = np.zeros((size, size), dtype=bool)
    mask[::2] = True
    mask[1::4, -1] = True
    mask[3::4, 0] = True
    return mask


def corner_blobs(shape, seed):
    """Smooth blobs in one corner of a larger volume: the labeller works inside the foreground's box."""
    mask = np.zeros(shape, dtype=bool)
    sub = tuple(slice(s // 2, s) for s in shape)
    mask[sub] = random_mask([s - s // 2 for s in shape], 0.55, seed)
    return mask


# (mask, connectivity): random voxels at several densities, 1-D to 3-D, every connectivity, awkward shapes
CASES = [
    (random_mask((40,), 0.5, 0), 1),
    (random_mask((17, 23), 0.45, 1), 1),
    (random_mask((17, 23), 0.45, 2), 2),
    (random_mask((9, 10, 11), 0.3, 3), 1),
    (random_mask((9, 10, 11), 0.3, 4), 2),
    (random_mask((9, 10, 11), 0.3, 5), 3),
    (random_mask((12, 1, 13), 0.5, 6), 2),
    (random_mask((1, 16, 16, 16), 0.2, 7), 3),
    (snake(21), 1),
    (corner_blobs((24, 20, 18), 8), 3),
    (np.zeros((5, 6, 7), dtype=bool), 3),
    (np.ones((5, 6, 7), dtype=bool), 1),
]


@unittest.skipUnless(has_measure, "the reference is skimage.measure.label")
class TestLabelConnectedComponents(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_same_labels_as_skimage(self, mask, connectivity):
        expected, num = measure.label(mask, connectivity=connectivity, return_num=True)
        labels, n = label_connected_components(torch.as_tensor(mask), connectivity=connectivity, return_num=True)
        self.assertEqual((labels.dtype, labels.shape, n), (torch.int64, torch.Size(mask.shape), num))
        np.testing.assert_array_equal(labels.numpy(), expected)

    def test_default_connectivity_and_non_boolean_input(self):
        mask = random_mask((8, 9, 10), 0.3, 9)
        labels = label_connected_components(torch.as_tensor(mask, dtype=torch.float32) * 5)
        np.testing.assert_array_equal(labels.numpy(), measure.label(mask))

    def test_bad_connectivity(self):
        with self.assertRaisesRegex(ValueError, "connectivity must be in"):
            label_connected_components(torch.zeros(3, 3, dtype=torch.bool), connectivity=3)

    @parameterized.expand(CASES)
    @skip_if_no_cuda
    def test_on_the_gpu(self, mask, connectivity):
        labels = label_connected_components(torch.as_tensor(mask, device="cuda"), connectivity=connectivity)
        self.assertEqual(labels.device.type, "cuda")
        np.testing.assert_array_equal(labels.cpu().numpy(), measure.label(mask, connectivity=connectivity))


def click_inputs(seed):
    rng = np.random.RandomState(seed)
    pos = torch.as_tensor(corner_blobs((20, 18, 16), seed))[None, None]
    neg = torch.as_tensor(rng.rand(1, 1, 20, 18, 16) < 0.2)
    coords = torch.tensor([[[15, 14, 12], [12, 10, 9], [2, 3, 4]]])
    labels = torch.tensor([[1, 0, 1]])
    return pos, neg, coords, labels


@unittest.skipUnless(has_measure, "the CPU path of the click post-processing is skimage's")
class TestClickPostProcessingOnDevice(unittest.TestCase):
    @parameterized.expand([(0,), (1,), (2,)])
    @skip_if_no_cuda
    def test_keep_merge_components_on_the_gpu_equals_the_cpu(self, seed):
        pos, neg, coords, labels = click_inputs(seed)
        cpu = keep_merge_components_with_points(pos, neg, coords, labels)
        gpu = keep_merge_components_with_points(pos.cuda(), neg.cuda(), coords.cuda(), labels.cuda())
        self.assertEqual(gpu.device.type, "cuda")
        np.testing.assert_array_equal(gpu.cpu().numpy(), cpu.numpy())

    @parameterized.expand([(0,), (1,)])
    @skip_if_no_cuda
    def test_keep_components_with_positive_points_on_the_gpu_equals_the_cpu(self, seed):
        torch.manual_seed(seed)
        logits = torch.randn(1, 1, 20, 18, 16)
        logits[..., :2] = float("nan")
        coords, labels = torch.tensor([[[15, 14, 12], [3, 4, 5]]]), torch.tensor([[1, 1]])
        cpu = keep_components_with_positive_points(logits.clone(), coords, labels)
        gpu = keep_components_with_positive_points(logits.cuda(), coords.cuda(), labels.cuda())
        torch.testing.assert_close(gpu.cpu(), cpu, equal_nan=True)


if __name__ == "__main__":
    unittest.main()
