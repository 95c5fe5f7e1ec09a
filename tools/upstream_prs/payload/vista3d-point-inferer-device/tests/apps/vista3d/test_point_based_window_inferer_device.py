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

import torch
from parameterized import parameterized

from monai.apps.vista3d.inferer import point_based_window_inferer
from monai.data import MetaTensor
from tests.test_utils import skip_if_no_cuda


class WindowNet:
    """Stands in for VISTA3D: ``[1, 1, *roi]`` logits made from the window's own values; records its kwargs."""

    def __init__(self):
        self.kwargs: list[dict] = []

    def __call__(self, window, **kwargs):
        self.kwargs.append(kwargs)
        return (window - window.mean()) * 3.0


# (image shape, roi, points, extra arguments): overlapping windows, image smaller than the window, prev_mask
CASES = [
    ((1, 1, 24, 20, 16), (8, 8, 8), [[5, 5, 5], [8, 6, 7]], {}),
    ((1, 1, 24, 20, 16), (8, 8, 8), [[5, 5, 5]], {"center_only": False, "margin": 2}),
    ((1, 1, 6, 20, 5), (8, 8, 8), [[2, 9, 1]], {}),
    ((1, 1, 24, 20, 16), (8, 8, 8), [[5, 5, 5], [12, 12, 12]], {"prev_mask": True, "point_start": 1}),
]


def run(shape, roi, points, extra, device=None, on="cpu"):
    torch.manual_seed(0)
    image = torch.randn(*shape)
    kwargs = dict(extra)
    if kwargs.get("prev_mask"):
        kwargs["prev_mask"] = torch.randn(1, 1, *shape[2:]).to(on)
    coords = torch.tensor([points], device=on)
    labels = torch.ones(1, len(points), device=on)
    if device is not None:
        kwargs["device"] = device
    net = WindowNet()
    out = point_based_window_inferer(image.to(on), roi, net, coords, labels, **kwargs)
    return out, net


class TestPointInfererDevice(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_default_stitches_on_the_cpu(self, shape, roi, points, extra):
        out, _ = run(shape, roi, points, extra)
        explicit, net = run(shape, roi, points, extra, device="cpu")
        self.assertIsInstance(out, MetaTensor)
        self.assertEqual((out.device.type, tuple(out.shape)), ("cpu", shape))
        torch.testing.assert_close(out.as_tensor(), explicit.as_tensor(), rtol=0, atol=0, equal_nan=True)
        self.assertTrue(all("device" not in k for k in net.kwargs))  # the setting is not handed to the network

    @parameterized.expand(CASES)
    @skip_if_no_cuda
    def test_stitch_on_the_gpu_equals_the_cpu(self, shape, roi, points, extra):
        cpu, _ = run(shape, roi, points, extra, on="cuda")
        gpu, _ = run(shape, roi, points, extra, device="cuda", on="cuda")
        self.assertEqual((cpu.device.type, gpu.device.type), ("cpu", "cuda"))
        torch.testing.assert_close(gpu.as_tensor().cpu(), cpu.as_tensor(), equal_nan=True)


if __name__ == "__main__":
    unittest.main()
