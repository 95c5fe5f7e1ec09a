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

from monai.networks.kernels import unavailable_reason
from monai.networks.kernels.conv3d import (
    ConvLaunch,
    channel_pieces,
    conv3x3x3,
    conv3x3x3_single_channel,
    conv3x3x3_weights,
    single_channel_weights,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.half().to(DEVICE).contiguous(memory_format=torch.channels_last_3d)


def _padded_input(g, batch, channels, real, d, h, w) -> torch.Tensor:
    """Random real channels, NaN in the padding channels: a kernel that reads them fails the comparison."""
    x = torch.randn(batch, channels, d, h, w, generator=g)
    x[:, real:] = float("nan")
    return _channels_last(x)


@unittest.skipUnless(
    unavailable_reason(DEVICE) is None, f"the fused kernels do not run here: {unavailable_reason(DEVICE)}"
)
class TestConv3x3x3(unittest.TestCase):
    # (batch, stored in, real in, real out, stored out, D, H, W, block_h, block_w, planes): powers of two; 48 = 32 + 16
    # input channels; padding channels never read and computed as zeros; planes the patches do not divide; a window
    # smaller than a patch; two output planes per program, with an odd depth (the last program's second plane lies
    # outside the volume); four planes; the transposed product (swap)
    @parameterized.expand(
        [
            (2, 16, 16, 32, 32, 3, 5, 19, 4, 8, 1),
            (1, 64, 48, 48, 64, 2, 3, 5, 8, 16, 1),
            (1, 48, 48, 16, 16, 2, 4, 8, 4, 8, 1),
            (2, 64, 48, 48, 64, 3, 5, 9, 4, 8, 2),
            (1, 32, 32, 32, 32, 4, 4, 8, 4, 8, 2),
            (2, 64, 48, 48, 64, 3, 5, 9, 4, 8, 1, True),
            (1, 64, 48, 48, 64, 3, 4, 8, 4, 8, 2, True),
            (1, 64, 48, 48, 64, 6, 4, 8, 4, 8, 4, True),
            (1, 16, 16, 16, 16, 3, 4, 8, 4, 8, 4),
        ]
    )
    def test_against_float64(
        self, batch, c_store, c_in, c_out, out_channels, d, h, w, block_h, block_w, planes, swap=False
    ):
        g = torch.Generator().manual_seed(c_in + h)
        x = _padded_input(g, batch, c_store, c_in, d, h, w)
        weight = (torch.randn(c_out, c_in, 3, 3, 3, generator=g) / (27 * c_in) ** 0.5).to(DEVICE)
        launch = ConvLaunch(block_h=block_h, block_w=block_w, planes=planes, swap=swap)
        gemm = conv3x3x3_weights(weight, out_columns=out_channels, planes=planes)
        y, (mean, var) = conv3x3x3(x, gemm, stats=True, launch=launch)
        ref = F.conv3d(x[:, :c_in].double(), weight.double(), padding=1)
        self.assertEqual(tuple(y.shape), (batch, out_channels, d, h, w))
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        self.assertLess(((y[:, :c_out].double() - ref).norm() / ref.norm()).item(), 1e-3)  # fp16 output rounding
        self.assertTrue(torch.equal(y[:, c_out:], torch.zeros_like(y[:, c_out:])))
        # the statistics are those of the stored output
        ref_var, ref_mean = torch.var_mean(y.double(), dim=(2, 3, 4), unbiased=False)
        self.assertEqual(tuple(mean.shape), (batch, out_channels))
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=1e-9)

    @parameterized.expand([(16, 16, 1, False), (48, 64, 2, False), (48, 64, 1, True)])
    def test_residual(self, c, c_store, planes, swap):
        g = torch.Generator().manual_seed(7)
        batch, d, h, w = 2, 3, 5, 9
        x = _padded_input(g, batch, c_store, c, d, h, w)
        weight = (torch.randn(c, c, 3, 3, 3, generator=g) / 10).to(DEVICE)
        residual = torch.randn(batch, c_store, d, h, w, generator=g)
        residual[:, c:] = 0
        residual = _channels_last(residual)
        launch = ConvLaunch(block_h=4, block_w=8, planes=planes, swap=swap)
        gemm = conv3x3x3_weights(weight, out_columns=c_store, planes=planes)
        y, (mean, _) = conv3x3x3(x, gemm, True, residual, launch)
        ref = F.conv3d(x[:, :c].double(), weight.double(), padding=1) + residual[:, :c].double()
        self.assertLess(((y[:, :c].double() - ref).norm() / ref.norm()).item(), 1e-3)
        self.assertTrue(torch.equal(y[:, c:], torch.zeros_like(y[:, c:])))
        torch.testing.assert_close(mean.double(), y.double().mean(dim=(2, 3, 4)), rtol=1e-5, atol=1e-6)

    @parameterized.expand([(1, 5, 6, 7, 48, 64, torch.float32), (3, 2, 17, 130, 16, 16, torch.float16)])
    def test_single_channel(self, batch, d, h, w, channels, out_channels, dtype):
        g = torch.Generator().manual_seed(d * h)
        x = torch.randn(batch, 1, d, h, w, generator=g).to(DEVICE, dtype)
        weight = torch.randn(channels, 1, 3, 3, 3, generator=g).to(DEVICE)
        gemm = single_channel_weights(weight, out_channels)
        y, no_stats = conv3x3x3_single_channel(x, gemm)
        ref = F.conv3d(x.half().double(), weight.half().double(), padding=1)
        self.assertIsNone(no_stats)
        self.assertEqual(y.dtype, torch.float16)
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        self.assertLess(((y[:, :channels].double() - ref).norm() / ref.norm()).item(), 1e-3)
        self.assertTrue(torch.equal(y[:, channels:], torch.zeros_like(y[:, channels:])))
        # the statistics of the stored output, from the epilogue (parts over voxels the last program does not fill);
        # they leave the stored values as the same launch without them. (Against the default launch only up to
        # rounding: under Triton's interpreter another block shape is another numpy matmul, whose summation order
        # depends on the CPU; on an AVX-512 host one value came out one fp16 ulp apart.)
        y_again, (mean, var) = conv3x3x3_single_channel(x, gemm, stats=True, block_v=64)
        self.assertTrue(torch.equal(y_again, conv3x3x3_single_channel(x, gemm, block_v=64)[0]))
        torch.testing.assert_close(y_again, y, rtol=1e-3, atol=1e-3)
        ref_var, ref_mean = torch.var_mean(y_again.double(), dim=(2, 3, 4), unbiased=False)
        self.assertEqual(tuple(mean.shape), (batch, out_channels))
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=1e-9)
        with self.assertRaisesRegex(ValueError, r"\[B, 1, D, H, W\]"):
            conv3x3x3_single_channel(x.expand(batch, 2, d, h, w), gemm)
        with self.assertRaisesRegex(ValueError, "build them with single_channel_weights"):
            conv3x3x3_single_channel(x, weight)
        with self.assertRaisesRegex(ValueError, r"C <= out_channels \(8\)"):
            single_channel_weights(weight, 8)
        with self.assertRaisesRegex(ValueError, "power-of-two"):
            single_channel_weights(weight[:16], 48)

    def test_rejects_bad_inputs(self):
        x = _channels_last(torch.randn(1, 16, 2, 4, 8))
        w = conv3x3x3_weights(torch.randn(16, 16, 3, 3, 3).to(DEVICE))
        with self.assertRaisesRegex(ValueError, "channels-last fp16"):
            conv3x3x3(x.contiguous(), w)
        with self.assertRaisesRegex(ValueError, "do not fit an input of 16"):
            conv3x3x3(x, conv3x3x3_weights(torch.randn(16, 32, 3, 3, 3).to(DEVICE)))
        with self.assertRaisesRegex(ValueError, "two powers of two"):
            conv3x3x3(x[:, :8].contiguous(memory_format=torch.channels_last_3d), w[: 27 * 8])
        with self.assertRaisesRegex(ValueError, "the weights have 48 per plane"):
            conv3x3x3(x, conv3x3x3_weights(torch.randn(48, 16, 3, 3, 3).to(DEVICE)))
        with self.assertRaisesRegex(ValueError, r"planes=launch.planes"):  # stacked for 2 planes, launched with 1
            conv3x3x3(x, conv3x3x3_weights(torch.randn(16, 16, 3, 3, 3).to(DEVICE), planes=2))
        with self.assertRaisesRegex(ValueError, "residual"):
            conv3x3x3(x, w, residual=x[:, :8])
        with self.assertRaisesRegex(ValueError, "planes must be 1, 2 or 4"):
            ConvLaunch(planes=3)


class TestStackedWeights(unittest.TestCase):
    @parameterized.expand([(1,), (2,), (4,)])
    def test_blocks(self, planes):
        # block (input plane p, shift s) feeds output plane j through depth tap p - j, zeros elsewhere
        weight = torch.randn(6, 5, 3, 3, 3)
        gemm = conv3x3x3_weights(weight, in_channels=8, out_columns=16, planes=planes)
        self.assertEqual(tuple(gemm.shape), ((planes + 2) * 9 * 8, planes * 16))
        blocks = gemm.view(planes + 2, 3, 3, 8, planes, 16)
        for p in range(planes + 2):
            for j in range(planes):
                block = blocks[p, :, :, :, j]
                if 0 <= p - j <= 2:
                    expected = weight[:, :, p - j].permute(2, 3, 1, 0).half()  # [kh, kw, in, out]
                    torch.testing.assert_close(block[:, :, :5, :6], expected)
                    self.assertEqual(block[:, :, 5:].abs().sum().item(), 0.0)
                    self.assertEqual(block[:, :, :, 6:].abs().sum().item(), 0.0)
                else:
                    self.assertEqual(block.abs().sum().item(), 0.0)


class TestChannelPieces(unittest.TestCase):
    @parameterized.expand([(16, (16, 0)), (48, (32, 16)), (64, (64, 0)), (96, (64, 32)), (128, (128, 0))])
    def test_pieces(self, n, pieces):
        self.assertEqual(channel_pieces(n), pieces)

    @parameterized.expand([(8,), (40,), (112,), (0,)])
    def test_rejects(self, n):
        with self.assertRaisesRegex(ValueError, f"got {n}"):
            channel_pieces(n)


if __name__ == "__main__":
    unittest.main()
