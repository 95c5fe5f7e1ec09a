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
"""The Triton 3x3x3 convolution and its statistics epilogue against float64."""

from __future__ import annotations

import unittest

import torch
import torch.nn.functional as F
from parameterized import parameterized

from monai.networks.kernels import merge_parts, unavailable_reason
from monai.networks.kernels.conv3d import conv3x3x3, conv3x3x3_single_channel, conv3x3x3_weights

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@unittest.skipUnless(
    unavailable_reason(DEVICE) is None, f"the fused kernels do not run here: {unavailable_reason(DEVICE)}"
)
class TestConv3x3x3(unittest.TestCase):
    # (batch, c_in, c_out, D, H, W, block_h, block_w): planes the patches do not divide, a window smaller than a patch
    @parameterized.expand(
        [
            (2, 16, 32, 3, 5, 19, 4, 8),
            (1, 32, 16, 4, 8, 16, 8, 16),
            (1, 16, 16, 2, 3, 5, 8, 16),
        ]
    )
    def test_against_float64(self, batch, c_in, c_out, d, h, w, block_h, block_w):
        g = torch.Generator().manual_seed(c_in + h)
        x = (
            torch.randn(batch, c_in, d, h, w, generator=g)
            .half()
            .to(DEVICE)
            .contiguous(memory_format=torch.channels_last_3d)
        )
        weight = (torch.randn(c_out, c_in, 3, 3, 3, generator=g) / (27 * c_in) ** 0.5).to(DEVICE)
        y, parts = conv3x3x3(x, conv3x3x3_weights(weight), stats=True, block_h=block_h, block_w=block_w)
        ref = F.conv3d(x.double(), weight.double(), padding=1)
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        self.assertLess(((y.double() - ref).norm() / ref.norm()).item(), 1e-3)  # fp16 output rounding
        # the per-patch statistics merge to those of the stored output
        tiles_h, tiles_w = -(-h // block_h), -(-w // block_w)
        hs = torch.tensor([min(block_h, h - i * block_h) for i in range(tiles_h)])
        ws = torch.tensor([min(block_w, w - j * block_w) for j in range(tiles_w)])
        counts = (hs[:, None] * ws[None, :]).flatten().repeat(d).double()
        mean, m2 = (p.view(batch, -1, c_out).double() for p in parts)
        mean, var = merge_parts(mean, m2, counts.to(mean.device))
        ref_var, ref_mean = torch.var_mean(y.double(), dim=(2, 3, 4), unbiased=False)
        torch.testing.assert_close(mean, ref_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var, ref_var, rtol=1e-4, atol=0)

    @parameterized.expand([(0.0,), (0.01,)])
    def test_norm_prologue(self, slope):
        g = torch.Generator().manual_seed(7)
        batch, c, d, h, w = 2, 16, 3, 5, 19
        x = (
            torch.randn(batch, c, d, h, w, generator=g)
            .half()
            .to(DEVICE)
            .contiguous(memory_format=torch.channels_last_3d)
        )
        weight = (torch.randn(c, c, 3, 3, 3, generator=g) / 10).to(DEVICE)
        scale, shift = (torch.rand(batch, c, generator=g) + 0.5).to(DEVICE), torch.randn(batch, c, generator=g).to(
            DEVICE
        )
        y, _ = conv3x3x3(x, conv3x3x3_weights(weight), prologue=(scale, shift, slope), block_h=4, block_w=8)
        view = (batch, c, 1, 1, 1)
        activated = F.leaky_relu(x.double() * scale.double().view(view) + shift.double().view(view), slope)
        ref = F.conv3d(activated, weight.double(), padding=1)  # zero padding of the activated tensor
        self.assertLess(((y.double() - ref).norm() / ref.norm()).item(), 1e-3)

    @parameterized.expand([(1, 5, 6, 7, 48, 64, torch.float32), (3, 2, 17, 130, 16, 16, torch.float16)])
    def test_single_channel(self, batch, d, h, w, channels, out_channels, dtype):
        g = torch.Generator().manual_seed(d * h)
        x = torch.randn(batch, 1, d, h, w, generator=g).to(DEVICE, dtype)
        weight = torch.randn(channels, 1, 3, 3, 3, generator=g).to(DEVICE)
        y = conv3x3x3_single_channel(x, weight, out_channels)
        ref = F.conv3d(x.half().double(), weight.half().double(), padding=1)
        self.assertEqual(y.dtype, torch.float16)
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        self.assertLess(((y[:, :channels].double() - ref).norm() / ref.norm()).item(), 1e-3)
        self.assertTrue(torch.equal(y[:, channels:], torch.zeros_like(y[:, channels:])))
        with self.assertRaisesRegex(ValueError, r"\[B, 1, D, H, W\]"):
            conv3x3x3_single_channel(x.expand(batch, 2, d, h, w), weight, out_channels)

    def test_rejects_bad_inputs(self):
        x = torch.randn(1, 16, 2, 4, 8).half().to(DEVICE)
        w = conv3x3x3_weights(torch.randn(16, 16, 3, 3, 3))
        with self.assertRaisesRegex(ValueError, "channels-last fp16"):
            conv3x3x3(x, w)
        with self.assertRaisesRegex(ValueError, "do not fit"):
            conv3x3x3(x.contiguous(memory_format=torch.channels_last_3d), w[:100])


if __name__ == "__main__":
    unittest.main()
