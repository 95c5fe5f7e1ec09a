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
import torch.nn as nn
import torch.nn.functional as F
from parameterized import parameterized

from monai.networks.kernels import unavailable_reason
from monai.networks.kernels.conv3d import ConvLaunch
from monai.networks.kernels.conv_transpose3d import (
    conv_transpose3x3x3,
    conv_transpose3x3x3_weights,
    plain_upsample,
)
from tests.networks.kernels.test_conv3d import DEVICE, _channels_last


class TestPlainUpsample(unittest.TestCase):
    def test_only_the_segresnet_upsampling(self):
        up = dict(kernel_size=3, stride=2, padding=1, output_padding=1, bias=False)
        self.assertTrue(plain_upsample(nn.ConvTranspose3d(8, 4, **up)))
        for change in (dict(bias=True), dict(kernel_size=2, padding=0, output_padding=0), dict(output_padding=0)):
            self.assertFalse(plain_upsample(nn.ConvTranspose3d(8, 4, **{**up, **change})), change)
        self.assertFalse(plain_upsample(nn.Conv3d(8, 4, 3, stride=2, padding=1, bias=False)))


@unittest.skipUnless(
    unavailable_reason(DEVICE) is None, f"the fused kernels do not run here: {unavailable_reason(DEVICE)}"
)
class TestConvTranspose3x3x3(unittest.TestCase):
    # (batch, stored in, real in, real out, stored out, D, H, W, block_h, block_w, swap, skip, stats): 48 = 32 + 16
    # input channels with NaN padding channels (never read); output padding channels computed as zeros; tiles the
    # input's rows and columns do not fill (clipped stores, statistics over the inside only); one input plane; the
    # transposed product
    @parameterized.expand(
        [
            (1, 64, 48, 16, 32, 2, 3, 5, 4, 8, True, True, True),
            (2, 32, 32, 16, 16, 2, 4, 8, 4, 8, False, True, True),
            (1, 16, 16, 32, 32, 1, 5, 3, 4, 8, True, False, True),
            (2, 64, 48, 48, 64, 3, 2, 9, 4, 8, False, False, False),
        ]
    )
    def test_against_float64(self, batch, c_store, c_in, c_out, out_channels, d, h, w, bh, bw, swap, skip, stats):
        g = torch.Generator().manual_seed(c_in + h)
        x = torch.randn(batch, c_store, d, h, w, generator=g)
        x[:, c_in:] = float("nan")
        x = _channels_last(x)
        weight = (torch.randn(c_in, c_out, 3, 3, 3, generator=g) / (8 * c_in) ** 0.5).to(DEVICE)
        addend = None
        if skip:
            addend = torch.randn(batch, out_channels, 2 * d, 2 * h, 2 * w, generator=g)
            addend[:, c_out:] = 0
            addend = _channels_last(addend)
        gemm = conv_transpose3x3x3_weights(weight, out_columns=out_channels)
        launch = ConvLaunch(block_h=bh, block_w=bw, num_warps=4, swap=swap)
        y, moments = conv_transpose3x3x3(x, gemm, skip=addend, stats=stats, launch=launch)
        ref = F.conv_transpose3d(x[:, :c_in].double(), weight.double(), stride=2, padding=1, output_padding=1)
        if skip:
            ref = ref + addend[:, :c_out].double()
        self.assertEqual(tuple(y.shape), (batch, out_channels, 2 * d, 2 * h, 2 * w))
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        self.assertLess(((y[:, :c_out].double() - ref).norm() / ref.norm()).item(), 1e-3)  # fp16 output rounding
        self.assertTrue(torch.equal(y[:, c_out:], torch.zeros_like(y[:, c_out:])))
        if not stats:
            self.assertIsNone(moments)
            return
        mean, var = moments
        ref_var, ref_mean = torch.var_mean(y.double(), dim=(2, 3, 4), unbiased=False)
        self.assertEqual(tuple(mean.shape), (batch, out_channels))
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=1e-9)

    def test_weight_blocks_hold_every_tap_once(self):
        # each of the 27 taps feeds one (depth parity, in-plane parity) pair through one block; the rest are zeros
        weight = torch.randn(16, 16, 3, 3, 3)
        gemm = conv_transpose3x3x3_weights(weight).view(18, 16, 2, 16).float()
        self.assertEqual(int((gemm.abs().sum((1, 3)) > 0).sum()), 27)
        sums = sorted(gemm.sum((1, 3)).flatten().tolist())
        expected = sorted(weight.half().float().sum((0, 1)).flatten().tolist() + [0.0] * 9)
        torch.testing.assert_close(torch.tensor(sums), torch.tensor(expected), rtol=1e-4, atol=1e-3)

    def test_rejects_bad_inputs(self):
        x = _channels_last(torch.randn(1, 16, 2, 4, 8))
        w = conv_transpose3x3x3_weights(torch.randn(16, 16, 3, 3, 3).to(DEVICE))
        with self.assertRaisesRegex(ValueError, "channels-last fp16"):
            conv_transpose3x3x3(x.contiguous(), w)
        with self.assertRaisesRegex(ValueError, "do not fit an input of 16"):
            conv_transpose3x3x3(x, conv_transpose3x3x3_weights(torch.randn(32, 16, 3, 3, 3).to(DEVICE)))
        with self.assertRaisesRegex(ValueError, "the weights have 48"):
            conv_transpose3x3x3(x, conv_transpose3x3x3_weights(torch.randn(16, 48, 3, 3, 3).to(DEVICE)))
        with self.assertRaisesRegex(
            ValueError, r"skip must be a channels-last fp16 tensor of shape \(1, 16, 4, 8, 16\)"
        ):
            conv_transpose3x3x3(x, w, skip=x)
        with self.assertRaisesRegex(ValueError, "one input plane per program"):
            conv_transpose3x3x3(x, w, launch=ConvLaunch(planes=2))
        with self.assertRaisesRegex(ValueError, r"\[C_in, C_out, 3, 3, 3\]"):
            conv_transpose3x3x3_weights(torch.randn(16, 16, 2, 2, 2))


if __name__ == "__main__":
    unittest.main()
