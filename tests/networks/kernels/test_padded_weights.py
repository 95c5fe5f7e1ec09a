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
"""Channel padding of activations and convolution weights."""

from __future__ import annotations

import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F
from parameterized import parameterized

from monai.networks.kernels import PaddedWeights, image_channels, pad_channels, padded_channels
from monai.networks.kernels.conv3d import conv3x3x3_weights
from monai.networks.kernels.conv_transpose3d import conv_transpose3x3x3_weights


class TestPaddedWeights(unittest.TestCase):
    @parameterized.expand(
        [(1, 64, 8), (3, 64, 8), (8, 64, 8), (16, 64, 64), (48, 64, 64), (64, 64, 64), (96, 128, 128), (192, 192, 192)]
    )
    def test_padded_channels(self, channels, expected, expected_image):
        self.assertEqual(padded_channels(channels), expected)
        self.assertEqual(image_channels(channels), expected_image)

    def test_padded_conv_equals_conv(self):
        g = torch.Generator().manual_seed(0)
        conv = nn.Conv3d(5, 20, 3, padding=1, bias=True)
        x = torch.randn(2, 5, 4, 5, 6, generator=g)
        w, b = PaddedWeights()(conv, torch.float32, 8)
        self.assertEqual(tuple(w.shape), (64, 8, 3, 3, 3))
        self.assertTrue(w.is_contiguous(memory_format=torch.channels_last_3d))
        y = F.conv3d(pad_channels(x, 8), w, b, padding=1)
        torch.testing.assert_close(y[:, :20], conv(x), rtol=1e-5, atol=1e-5)
        self.assertTrue(torch.equal(y[:, 20:], torch.zeros_like(y[:, 20:])))

    def test_transposed_weights(self):
        conv = nn.ConvTranspose3d(96, 48, 3, stride=2, padding=1, output_padding=1, bias=False)
        x = torch.randn(1, 96, 3, 3, 3)
        w, b = PaddedWeights()(conv, torch.float32, 128)
        self.assertEqual(tuple(w.shape), (128, 64, 3, 3, 3))
        self.assertIsNone(b)
        y = F.conv_transpose3d(pad_channels(x, 128), w, None, 2, 1, 1)
        torch.testing.assert_close(y[:, :48], conv(x), rtol=1e-5, atol=1e-5)

    def test_transposed_operand_cached(self):
        conv = nn.ConvTranspose3d(96, 48, 3, stride=2, padding=1, output_padding=1, bias=False)
        weights = PaddedWeights()
        gemm = weights.transposed_gemm(conv)
        self.assertEqual((gemm.dtype, tuple(gemm.shape)), (torch.float16, (18 * 96, 2 * 64)))
        self.assertTrue(torch.equal(gemm, conv_transpose3x3x3_weights(conv.weight, out_columns=64)))
        self.assertIs(weights.transposed_gemm(conv), gemm)

    def test_quarters_cached(self):
        conv = nn.Conv3d(96, 96, 3, padding=1, bias=False)
        weights = PaddedWeights()
        quarters = weights.quarters(conv)
        for h in range(2):
            for i in range(2):
                part = conv.weight[48 * h : 48 * (h + 1), 48 * i : 48 * (i + 1)]
                self.assertTrue(torch.equal(quarters[h][i], conv3x3x3_weights(part, out_columns=64)))
                self.assertEqual(tuple(quarters[h][i].shape), (27 * 48, 64))
        self.assertIs(weights.quarters(conv), quarters)

    def test_cache_follows_the_parameters(self):
        conv = nn.Conv3d(16, 16, 3, bias=False)
        weights = PaddedWeights()
        first, _ = weights(conv, torch.float16, 64)
        self.assertIs(weights(conv, torch.float16, 64)[0], first)  # unchanged parameter: the cached copy
        conv.load_state_dict({"weight": torch.randn(16, 16, 3, 3, 3)})
        second, _ = weights(conv, torch.float16, 64)
        self.assertTrue(torch.equal(second[:16, :16], conv.weight.half()))
        with torch.no_grad():
            conv.weight.mul_(2)
        self.assertTrue(torch.equal(weights(conv, torch.float16, 64)[0][:16, :16], conv.weight.half()))
        self.assertEqual(weights(conv, torch.float32, 64)[0].dtype, torch.float32)

    def test_single_channel_operand_cached(self):
        conv = nn.Conv3d(1, 48, 3, padding=1, bias=False)
        weights = PaddedWeights()
        gemm = weights.single_channel(conv)
        self.assertEqual((gemm.dtype, tuple(gemm.shape)), (torch.float16, (32, 64)))
        self.assertTrue(torch.equal(gemm[:27, :48], conv.weight.detach().reshape(48, 27).t().half()))
        self.assertTrue(torch.equal(gemm[27:].sum() + gemm[:, 48:].sum(), torch.zeros((), dtype=torch.float16)))
        self.assertIs(weights.single_channel(conv), gemm)  # one operand per weight, not one per call
        self.assertIsNot(weights.gemm(conv), gemm)  # the 3x3x3 GEMM operand of the same layer is another value
        with torch.no_grad():
            conv.weight.mul_(2)
        self.assertTrue(
            torch.equal(weights.single_channel(conv)[:27, :48], conv.weight.detach().reshape(48, 27).t().half())
        )

    def test_norm_affine_padded_and_cached(self):
        norm = nn.InstanceNorm3d(48, affine=True)
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        weights = PaddedWeights()
        w, b = weights.affine(norm, 64)
        self.assertEqual((w.dtype, tuple(w.shape)), (torch.float32, (64,)))
        torch.testing.assert_close(w[:48], norm.weight.detach())
        torch.testing.assert_close(b[:48], norm.bias.detach())
        self.assertTrue(torch.equal(torch.cat([w[48:], b[48:]]), torch.zeros(32)))
        self.assertIs(weights.affine(norm, 64)[0], w)
        with torch.no_grad():
            norm.weight.add_(1.0)  # an in-place write bumps the version: a new copy
        torch.testing.assert_close(weights.affine(norm, 64)[0][:48], norm.weight.detach())


if __name__ == "__main__":
    unittest.main()
