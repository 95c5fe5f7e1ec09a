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
"""The fused instance norm: its PyTorch reference against the modules, the Triton kernels against float64."""

from __future__ import annotations

import unittest

import torch
import torch.nn as nn
from parameterized import parameterized

from monai.networks.kernels import (
    NormAct,
    instance_stats,
    merge_parts,
    merge_parts_triton,
    norm_act,
    norm_act_reference,
    unavailable_reason,
)
from monai.networks.kernels.instance_norm import _rows_per_part

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS_RUN = unavailable_reason(DEVICE) is None
WHY_NOT = f"the fused kernels do not run here: {unavailable_reason(DEVICE)}"

# (affine, act, residual, channels_last)
REFERENCE_CASES = [
    (True, "relu", False, False),
    (True, "relu", False, True),
    (False, "leakyrelu", True, False),
    (False, "leakyrelu", True, True),
    (True, "none", True, True),
]


def _module_path(x, affine, act, residual, weight=None, bias=None):
    norm = nn.InstanceNorm3d(x.shape[1], affine=affine).double()
    if affine:
        norm.weight.data.copy_(weight)
        norm.bias.data.copy_(bias)
    y = norm(x.double())
    if residual is not None:
        y = y + residual.double()
    return {"relu": nn.ReLU(), "leakyrelu": nn.LeakyReLU(0.01), "none": nn.Identity()}[act](y)


def _float64_norm_act(x, weight, bias, spec, residual, real):
    xd = x.double()
    var, mean = torch.var_mean(xd, dim=(2, 3, 4), unbiased=False, keepdim=True)
    y = (xd - mean) / torch.sqrt(var + spec.eps)
    if weight is not None:
        y = y * weight.double().view(1, -1, 1, 1, 1) + bias.double().view(1, -1, 1, 1, 1)
    if residual is not None:
        y = y + residual.double()
    y = {
        "relu": torch.relu,
        "leakyrelu": lambda t: nn.functional.leaky_relu(t, spec.negative_slope),
        "none": lambda t: t,
    }[spec.act](y)
    y[:, real:] = 0
    return y


class TestNormActReference(unittest.TestCase):
    @parameterized.expand(REFERENCE_CASES)
    def test_equals_modules(self, affine, act, with_residual, channels_last):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 5, 4, 6, 3, generator=g, dtype=torch.float64) * 2 + 1
        weight, bias = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(
            5, generator=g, dtype=torch.float64
        )
        residual = torch.randn(x.shape, generator=g, dtype=torch.float64) if with_residual else None
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        out = norm_act_reference(x, weight if affine else None, bias if affine else None, NormAct(act=act), residual)
        expected = _module_path(x, affine, act, residual, weight, bias)
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
        self.assertEqual(out.is_contiguous(memory_format=torch.channels_last_3d), channels_last)

    def test_padding_channels_are_zero(self):
        x = torch.randn(1, 8, 3, 3, 3)
        out = norm_act_reference(x, None, None, NormAct(act="none"), real_channels=5)
        self.assertTrue(torch.equal(out[:, 5:], torch.zeros_like(out[:, 5:])))
        self.assertGreater(out[:, :5].abs().sum().item(), 0)

    def test_bad_activation(self):
        with self.assertRaisesRegex(ValueError, "act must be one of"):
            NormAct(act="gelu")


@unittest.skipUnless(KERNELS_RUN, WHY_NOT)
class TestNormActKernel(unittest.TestCase):
    # (batch, channels, real channels, spatial, act, affine, residual): spatial sizes that no tile divides
    @parameterized.expand(
        [
            (1, 64, 48, (5, 7, 9), "relu", True, False),
            (3, 64, 64, (17, 1, 3), "none", True, True),
            (2, 128, 96, (3, 11, 13), "leakyrelu", False, True),
            (1, 64, 48, (2, 3, 2), "leakyrelu", False, False),
        ]
    )
    def test_against_float64(self, batch, channels, real, spatial, act, affine, with_residual):
        g = torch.Generator().manual_seed(batch + channels)
        x = torch.randn(batch, channels, *spatial, generator=g) * 3 + 2
        x[:, real:] = 0
        x = x.half().to(DEVICE).contiguous(memory_format=torch.channels_last_3d)
        weight = bias = None
        if affine:
            weight, bias = torch.randn(channels, generator=g), torch.randn(channels, generator=g)
            weight[real:], bias[real:] = 0, 0
            weight, bias = weight.to(DEVICE), bias.to(DEVICE)
        residual = (
            torch.randn(x.shape, generator=g).half().to(DEVICE).contiguous(memory_format=torch.channels_last_3d)
            if with_residual
            else None
        )
        spec = NormAct(act=act)
        out = norm_act(x, weight, bias, spec, residual, real_channels=real)
        expected = _float64_norm_act(x, weight, bias, spec, residual, real)
        self.assertEqual(out.dtype, torch.float16)
        self.assertTrue(out.is_contiguous(memory_format=torch.channels_last_3d))
        # fp16 output: within one rounding step of the float64 result
        torch.testing.assert_close(out.double(), expected, rtol=2e-3, atol=2e-3)
        self.assertTrue(torch.equal(out[:, real:], torch.zeros_like(out[:, real:])))

    def test_in_place(self):
        x = torch.randn(2, 64, 4, 5, 6).half().to(DEVICE).contiguous(memory_format=torch.channels_last_3d)
        expected = norm_act(x, None, None, NormAct())
        out = norm_act(x, None, None, NormAct(), out=x)
        self.assertIs(out, x)
        self.assertTrue(torch.equal(out, expected))

    def test_padding_channels_neither_read_nor_written_in_place(self):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(2, 64, 3, 4, 5, generator=g)
        residual = torch.randn(x.shape, generator=g)
        clean = x.clone()
        clean[:, 48:] = 0
        x[:, 48:], residual[:, 48:] = float("nan"), float("nan")  # a kernel that reads them returns NaN
        x, residual, clean = (
            t.half().to(DEVICE).contiguous(memory_format=torch.channels_last_3d) for t in (x, residual, clean)
        )
        stats = instance_stats(clean)
        out = norm_act(x, None, None, NormAct(), residual, real_channels=48, stats=stats)  # a new tensor
        expected = _float64_norm_act(clean, None, None, NormAct(), residual.nan_to_num(0.0), 48)
        torch.testing.assert_close(out.double(), expected, rtol=2e-3, atol=2e-3)
        # in place the padding channels keep what they hold (zeros in the padded layout; NaN here, to see it)
        norm_act(x, None, None, NormAct(), residual, real_channels=48, out=x, stats=stats)
        torch.testing.assert_close(x[:, :48].double(), expected[:, :48], rtol=2e-3, atol=2e-3)
        self.assertTrue(x[:, 48:].isnan().all())

    def test_statistics_with_a_large_mean(self):
        # values around 1000 with spread 1: a plain sum of squares in float32 would lose the variance
        g = torch.Generator().manual_seed(3)
        x = (torch.randn(2, 64, 9, 10, 11, generator=g, dtype=torch.float64) + 1000).half()
        mean, var = instance_stats(x.to(DEVICE).contiguous(memory_format=torch.channels_last_3d))
        ref_var, ref_mean = torch.var_mean(x.double(), dim=(2, 3, 4), unbiased=False)
        torch.testing.assert_close(mean.double().cpu(), ref_mean, rtol=1e-6, atol=0)
        torch.testing.assert_close(var.double().cpu(), ref_var, rtol=1e-4, atol=0)

    @parameterized.expand([(1, 64, (5, 7, 9)), (3, 128, (65, 2, 33))])
    def test_add_then_statistics(self, batch, channels, spatial):
        g = torch.Generator().manual_seed(channels)
        x = (torch.randn(batch, channels, *spatial, generator=g) * 2 + 3).half().to(DEVICE)
        addend = torch.randn(x.shape, generator=g).half().to(DEVICE)
        x, addend = (t.contiguous(memory_format=torch.channels_last_3d) for t in (x, addend))
        expected = x + addend
        mean, var = instance_stats(x, add=addend)
        self.assertTrue(torch.equal(x, expected))  # the sum is written into x, rounded as torch's fp16 add
        ref_var, ref_mean = torch.var_mean(expected.double(), dim=(2, 3, 4), unbiased=False)
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=0)
        # known statistics are used as given
        out = norm_act(x, None, None, NormAct(act="none"), stats=(mean, var))
        torch.testing.assert_close(out, norm_act(x, None, None, NormAct(act="none")), rtol=0, atol=0)
        with self.assertRaisesRegex(ValueError, "addend's shape"):
            instance_stats(x, add=addend[:, :, :1])

    def test_rejects_bad_inputs(self):
        x = torch.randn(1, 64, 2, 2, 2).half().to(DEVICE)
        with self.assertRaisesRegex(ValueError, "channels-last"):
            norm_act(x, None, None, NormAct())
        with self.assertRaisesRegex(ValueError, "multiple of 64"):
            norm_act(x[:, :48].contiguous(memory_format=torch.channels_last_3d), None, None, NormAct())
        x = x.contiguous(memory_format=torch.channels_last_3d)
        with self.assertRaisesRegex(ValueError, "weight and bias"):
            norm_act(x, torch.ones(64, device=DEVICE), None, NormAct())


class TestMergeParts(unittest.TestCase):
    def test_equals_whole(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 10, 3, generator=g, dtype=torch.float64) * 5 + 50  # [B, S, C]
        sizes = [4, 4, 2]
        parts = torch.split(x, sizes, dim=1)
        mean = torch.stack([p.mean(1) for p in parts], 1)
        m2 = torch.stack([((p - p.mean(1, keepdim=True)) ** 2).sum(1) for p in parts], 1)
        merged_mean, var = merge_parts(mean, m2, torch.tensor(sizes, dtype=torch.float64))
        torch.testing.assert_close(merged_mean, x.mean(1))
        torch.testing.assert_close(var, x.var(1, unbiased=False))


@unittest.skipUnless(KERNELS_RUN, WHY_NOT)
class TestMergePartsTriton(unittest.TestCase):
    # (samples, parts, channels): one launch (<= 128 parts), two and three levels of 128-fold merges
    @parameterized.expand([(2, 3, 64), (1, 300, 128), (2, 70000, 64)])
    def test_equals_reference(self, batch, n_parts, channels):
        g = torch.Generator().manual_seed(n_parts)
        count = torch.randint(0, 300, (batch, n_parts), generator=g).double()
        count[:, -1] = 0  # an empty part (a plane past the volume's end): its mean must not count
        mean = torch.randn(batch, n_parts, channels, generator=g, dtype=torch.float64) + 40
        mean[:, -1] = 1e4
        m2 = torch.rand(batch, n_parts, channels, generator=g, dtype=torch.float64) * count[..., None]
        ref_mean = (mean * count[..., None]).sum(1) / count.sum(1, keepdim=True)
        ref_m2 = m2.sum(1) + (count[..., None] * (mean - ref_mean[:, None]) ** 2).sum(1)
        got_mean, got_var = merge_parts_triton(*(t.float().to(DEVICE) for t in (count, mean, m2)))
        torch.testing.assert_close(got_mean.double().cpu(), ref_mean, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got_var.double().cpu(), ref_m2 / count.sum(1, keepdim=True), rtol=1e-4, atol=1e-4)

    def test_rejects_mismatched_shapes(self):
        mean = torch.zeros(1, 4, 64, device=DEVICE)
        with self.assertRaisesRegex(ValueError, "counts"):
            merge_parts_triton(torch.zeros(1, 3, device=DEVICE), mean, mean)


class TestStatisticsParts(unittest.TestCase):
    # (rows, channel blocks x samples, block rows, rows per part): 4096 where the grid is large; halved while it has
    # fewer than 512 programs, down to the block
    @parameterized.expand(
        [(128**3, 14, 64, 4096), (128**3, 1, 64, 4096), (32**3, 3, 64, 128), (16**3, 6, 64, 64), (64**3, 2, 64, 1024)]
    )
    def test_rows_per_part(self, n_rows, columns, block_s, expected):
        rows = _rows_per_part(n_rows, columns, block_s)
        self.assertEqual(rows, expected)
        self.assertTrue(rows == block_s or -(-n_rows // rows) * columns >= 512)


if __name__ == "__main__":
    unittest.main()
