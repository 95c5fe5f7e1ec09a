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
"""SegResNetDS, SegResNetDS2 and SegResEncoder: output shapes, deep supervision, anisotropic kernels."""

from __future__ import annotations

import math
import unittest

import torch
from parameterized import parameterized

from monai.networks.nets import SegResEncoder, SegResNetDS, SegResNetDS2
from monai.networks.nets.segresnet_ds import SegResBlock, aniso_kernel, scales_for_resolution

DS_CASES = [
    # kwargs, input shape
    [dict(spatial_dims=3, init_filters=4, out_channels=2, blocks_down=(1, 1, 1)), (2, 1, 16, 16, 16)],
    [dict(spatial_dims=2, init_filters=4, in_channels=3, out_channels=5, blocks_down=(1, 2), norm="instance"), (1, 3, 8, 12)],
    [dict(spatial_dims=1, init_filters=4, out_channels=1, blocks_down=(1, 1, 1), act="leakyrelu"), (2, 1, 16)],
    [dict(spatial_dims=3, init_filters=4, out_channels=2, blocks_down=(1,), norm="batch"), (1, 1, 5, 6, 7)],
    [dict(spatial_dims=3, init_filters=4, out_channels=3, blocks_down=(1, 1, 1), resolution=(1, 1, 4)), (1, 1, 16, 16, 8)],
    [dict(spatial_dims=3, init_filters=4, out_channels=2, blocks_down=(1, 1, 1), upsample_mode="nontrainable"), (1, 1, 8, 8, 8)],
    [dict(spatial_dims=3, init_filters=4, out_channels=2, blocks_down=(1, 1, 1), norm=("group", {"num_groups": 2})), (1, 1, 8, 8, 8)],
]


class TestSegResNetDS(unittest.TestCase):
    @parameterized.expand(DS_CASES)
    def test_shape(self, kwargs, shape):
        net = SegResNetDS(**kwargs).eval()
        with torch.no_grad():
            out = net(torch.randn(shape))
        self.assertEqual(tuple(out.shape), (shape[0], kwargs["out_channels"], *shape[2:]))

    def test_deep_supervision(self):
        net = SegResNetDS(init_filters=4, out_channels=2, blocks_down=(1, 1, 1, 1), dsdepth=3).train()
        outs = net(torch.randn(1, 1, 16, 16, 16))
        self.assertEqual([tuple(o.shape) for o in outs], [(1, 2, 16, 16, 16), (1, 2, 8, 8, 8), (1, 2, 4, 4, 4)])
        net.eval()
        with torch.no_grad():
            self.assertEqual(tuple(net(torch.randn(1, 1, 16, 16, 16)).shape), (1, 2, 16, 16, 16))

    def test_anisotropic_factors(self):
        net = SegResNetDS(init_filters=4, blocks_down=(1, 1, 1, 1), resolution=(0.8, 0.8, 3.0))
        scales = net.anisotropic_scales
        self.assertEqual(len(scales), 4)
        # the coarse axis is not downsampled until the fine ones have caught up
        self.assertEqual([s[2] for s in scales[:1]], [1])
        self.assertEqual(net.shape_factor(), [math.prod(s[d] for s in scales[:-1]) for d in range(3)])
        self.assertTrue(net.is_valid_shape(torch.zeros(1, 1, *net.shape_factor())))
        kernels = [aniso_kernel(s)[0] for s in scales]
        self.assertEqual(kernels[0][2], 1)
        self.assertEqual(tuple(net.encoder.conv_init.weight.shape[2:]), tuple(kernels[0]))

    def test_invalid_shape(self):
        net = SegResNetDS(init_filters=4, blocks_down=(1, 1, 1))
        self.assertEqual(net.shape_factor(), [4, 4, 4])
        with self.assertRaisesRegex(ValueError, "divisible"):
            net(torch.randn(1, 1, 16, 16, 10))

    @parameterized.expand([[dict(spatial_dims=4)], [dict(resolution=[1, -1, 1])], [dict(resolution=1.0)]])
    def test_bad_arguments(self, kwargs):
        with self.assertRaises((ValueError, TypeError)):
            SegResNetDS(**kwargs)


class TestScales(unittest.TestCase):
    @parameterized.expand([[(1, 1, 5), 5], [(1, 1, 5), None], [(1, 1, 5), 2], [(2, 1, 1), 4], [(1, 1, 1), 3], [(0.5, 1, 4), 6]])
    def test_scales_reach_isotropy(self, res, n_stages):
        scales = scales_for_resolution(res, n_stages)
        if n_stages:
            self.assertEqual(len(scales), n_stages)
        spacing = list(res)
        for i, s in enumerate(scales):
            self.assertTrue(all(f in (1, 2) for f in s))
            if i == 0 and max(res) >= 2 * min(res):  # the coarsest axis waits for the fine ones
                self.assertEqual(s[list(res).index(max(res))], 1)
            spacing = [sp * f for sp, f in zip(spacing, s)]
        if n_stages is None or n_stages >= len(scales_for_resolution(res)):
            self.assertLess(max(spacing) / min(spacing), 2)

    def test_non_positive(self):
        with self.assertRaises(ValueError):
            scales_for_resolution((1, 0, 1))


class TestSegResNetDS2(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.net = SegResNetDS2(init_filters=4, out_channels=3, blocks_down=(1, 1, 1), norm="instance").eval()
        self.x = torch.randn(2, 1, 8, 8, 8)

    def test_branches(self):
        with torch.no_grad():
            point, auto = self.net(self.x)
            point_only, none = self.net(self.x, with_point=True, with_label=False)
            none2, auto_only = self.net(self.x, with_point=False, with_label=True)
        self.assertEqual(tuple(point.shape), (2, 3, 8, 8, 8))
        self.assertEqual(tuple(auto.shape), (2, 3, 8, 8, 8))
        self.assertEqual((none, none2), ([], []))
        self.assertTrue(torch.equal(point, point_only))
        self.assertTrue(torch.equal(auto, auto_only))
        # the decoders are independent: changing the class decoder leaves the point branch alone
        with torch.no_grad():
            for p in self.net.up_layers_auto.parameters():
                p.add_(0.1)
            point2, auto2 = self.net(self.x)
        self.assertTrue(torch.equal(point, point2))
        self.assertFalse(torch.allclose(auto, auto2))

    def test_same_decoder_as_segresnetds(self):
        ds = SegResNetDS(init_filters=4, out_channels=3, blocks_down=(1, 1, 1), norm="instance").eval()
        ds.load_state_dict({k: v for k, v in self.net.state_dict().items() if not k.startswith("up_layers_auto")})
        with torch.no_grad():
            self.assertTrue(torch.allclose(ds(self.x), self.net(self.x, with_label=False)[0]))

    def test_set_auto_grad(self):
        self.net.set_auto_grad(auto_freeze=True)
        self.assertFalse(any(p.requires_grad for p in self.net.encoder.parameters()))
        self.assertFalse(any(p.requires_grad for p in self.net.up_layers_auto.parameters()))
        self.assertTrue(all(p.requires_grad for p in self.net.up_layers.parameters()))


class TestSegResEncoder(unittest.TestCase):
    @parameterized.expand([[3, (1, 2, 2), None, (1, 2, 16, 16, 16)], [2, (1, 1), None, (2, 2, 8, 8)], [3, (1, 1, 1), [(2, 2, 1), (2, 2, 2), (2, 2, 2)], (1, 2, 16, 16, 8)]])
    def test_levels(self, dims, blocks, scales, shape):
        enc = SegResEncoder(spatial_dims=dims, init_filters=4, in_channels=2, blocks_down=blocks, anisotropic_scales=scales)
        feats = enc(torch.randn(shape))
        self.assertEqual(len(feats), len(blocks))
        size = list(shape[2:])
        for i, f in enumerate(feats):
            self.assertEqual(tuple(f.shape), (shape[0], 4 * 2**i, *size))
            stride = scales[i] if scales else (2,) * dims
            size = [s // st for s, st in zip(size, stride)]

    def test_head_module(self):
        enc = SegResEncoder(init_filters=4, blocks_down=(1, 1), head_module=lambda feats: feats[-1:])
        self.assertEqual(len(enc(torch.randn(1, 1, 8, 8, 8))), 1)

    def test_block_does_not_touch_input(self):
        block = SegResBlock(3, 4, norm=("instance", {"affine": True}), act=("relu", {"inplace": True}))
        x = torch.randn(1, 4, 4, 4, 4)
        x0 = x.clone()
        block(x)
        self.assertTrue(torch.equal(x, x0))


if __name__ == "__main__":
    unittest.main()
