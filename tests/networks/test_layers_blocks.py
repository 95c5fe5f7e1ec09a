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
"""Layer factories and the blocks VISTA3D is built from."""

from __future__ import annotations

import unittest

import torch
from parameterized import parameterized
from torch import nn

from monai.networks.blocks import ADN, Convolution, MLPBlock, Swish, UnetrBasicBlock, UpSample
from monai.networks.blocks.dynunet_block import get_output_padding, get_padding
from monai.networks.layers import Act, Conv, Norm, get_act_layer, get_dropout_layer, get_norm_layer, split_args


class TestFactories(unittest.TestCase):
    @parameterized.expand(
        [
            [Conv, (Conv.CONV, 3), nn.Conv3d],
            [Conv, ("convtrans", 2), nn.ConvTranspose2d],
            [Norm, ("INSTANCE", 1), nn.InstanceNorm1d],
            [Norm, ("batch", 3), nn.BatchNorm3d],
            [Norm, "group", nn.GroupNorm],
            [Act, "relu", nn.ReLU],
            [Act, "GELU", nn.GELU],
            [Act, nn.Tanh, nn.Tanh],
        ]
    )
    def test_lookup(self, factory, key, expected):
        self.assertIs(factory[key], expected)

    @parameterized.expand([["default", {}, 1.0], ["alpha", {"alpha": 2.0}, 2.0]])
    def test_swish(self, _, kwargs, alpha):
        """Act["swish"] is MONAI's Swish, x * sigmoid(alpha * x), with its alpha argument (as in 1.6.1)."""
        act = get_act_layer(("swish", kwargs))
        self.assertIsInstance(act, Swish)
        self.assertEqual(repr(act), "Swish()")
        x = torch.linspace(-4, 4, 17)
        torch.testing.assert_close(act(x), x * torch.sigmoid(alpha * x))
        self.assertEqual(torch.allclose(act(x), nn.SiLU()(x)), alpha == 1.0)

    def test_unknown_name(self):
        with self.assertRaisesRegex(ValueError, "Unsupported option"):
            Act["nope"]
        with self.assertRaises(AttributeError):
            Conv.NOPE

    def test_split_args(self):
        self.assertEqual(split_args("relu"), ("relu", {}))
        self.assertEqual(split_args(("prelu", {"init": 0.2})), ("prelu", {"init": 0.2}))
        with self.assertRaises(TypeError):
            split_args(("prelu", 0.2))

    def test_layer_helpers(self):
        norm = get_norm_layer(("instance", {"affine": True}), spatial_dims=3, channels=5)
        self.assertIsInstance(norm, nn.InstanceNorm3d)
        self.assertEqual(norm.num_features, 5)
        self.assertTrue(norm.affine)
        self.assertEqual(get_norm_layer(("group", {"num_groups": 2}), channels=4).num_channels, 4)
        act = get_act_layer(("leakyrelu", {"negative_slope": 0.2}))
        self.assertEqual(act.negative_slope, 0.2)
        self.assertIsInstance(get_act_layer(""), nn.Identity)
        self.assertEqual(get_dropout_layer(0.3, 2).p, 0.3)
        self.assertIsInstance(get_dropout_layer(0.3, 2), nn.Dropout2d)


class TestBlocks(unittest.TestCase):
    def test_unetr_basic_block_keys(self):
        block = UnetrBasicBlock(3, 4, 4, kernel_size=3, stride=1, norm_name="instance", res_block=True)
        self.assertEqual(list(block.state_dict()), ["layer.conv1.conv.weight", "layer.conv2.conv.weight"])
        x = torch.randn(1, 4, 6, 6, 6)
        self.assertEqual(block(x).shape, x.shape)

    @parameterized.expand([[True, 2], [False, 2], [True, 1]])
    def test_unetr_basic_block_downsample(self, res, stride):
        block = UnetrBasicBlock(3, 2, 6, kernel_size=3, stride=stride, norm_name="batch", res_block=res)
        self.assertEqual(tuple(block(torch.randn(2, 2, 8, 8, 8)).shape), (2, 6, 8 // stride, 8 // stride, 8 // stride))

    def test_padding_helpers(self):
        self.assertEqual(get_padding(3, 1), 1)
        self.assertEqual(get_padding((3, 1), (2, 1)), (1, 0))
        self.assertEqual(get_output_padding(3, 2, 1), 1)
        with self.assertRaises(AssertionError):
            get_padding(1, 3)

    @parameterized.expand([["vit", 2], ["swin", 1], ["vista3d", 0]])
    def test_mlp_dropout_modes(self, mode, n_dropout):
        mlp = MLPBlock(8, 16, dropout_rate=0.1, dropout_mode=mode)
        self.assertEqual(len({id(m) for m in (mlp.drop1, mlp.drop2) if isinstance(m, nn.Dropout)}), n_dropout)
        self.assertEqual(mlp(torch.randn(3, 5, 8)).shape, (3, 5, 8))

    def test_mlp_geglu_and_errors(self):
        self.assertEqual(MLPBlock(8, 16, act="GEGLU").linear1.out_features, 32)
        with self.assertRaises(ValueError):
            MLPBlock(8, 16, dropout_rate=2.0)
        with self.assertRaises(ValueError):
            MLPBlock(8, 16, dropout_mode="nope")

    @parameterized.expand(
        [
            [dict(mode="deconv", in_channels=8, out_channels=4, kernel_size=3, scale_factor=2), (1, 4, 8, 8, 8), "deconv"],
            [dict(mode="deconv", in_channels=8, out_channels=4, kernel_size=(3, 3, 1), scale_factor=(2, 2, 1)), (1, 4, 8, 8, 4), "deconv"],
            [dict(mode="deconv", in_channels=8), (1, 8, 8, 8, 8), "deconv"],
            [dict(mode="deconvgroup", in_channels=8, out_channels=4), (1, 4, 8, 8, 8), "deconvgroup"],
            [dict(mode="nontrainable", in_channels=8, out_channels=4, align_corners=False), (1, 4, 8, 8, 8), "preconv"],
            [dict(mode="nontrainable", in_channels=8, pre_conv=nn.Conv3d(8, 2, 1), align_corners=False), (1, 2, 8, 8, 8),
             "preconv"],
        ]
    )
    def test_upsample(self, kwargs, shape, module):
        up = UpSample(spatial_dims=3, **kwargs)
        self.assertIn(module, dict(up.named_children()))
        self.assertEqual(tuple(up(torch.randn(1, 8, 4, 4, 4)).shape), shape)

    def test_upsample_errors(self):
        with self.assertRaisesRegex(ValueError, "in_channels"):
            UpSample(3, mode="deconv")
        with self.assertRaisesRegex(NotImplementedError, "not carried"):
            UpSample(3, 4, 4, mode="pixelshuffle")
        with self.assertRaisesRegex(TypeError, "pre_conv must be 'default', a module or None, got 'conv'"):
            UpSample(3, 4, 8, mode="nontrainable", pre_conv="conv")

    def test_convolution_adn(self):
        conv = Convolution(3, 2, 4, act="relu", norm="batch", dropout=0.1)
        self.assertEqual(list(dict(conv.adn.named_children())), ["N", "D", "A"])
        self.assertEqual(list(dict(ADN("AN", 4, norm="instance", norm_dim=2).named_children())), ["A", "N"])
        tconv = Convolution(3, 2, 4, strides=2, kernel_size=3, is_transposed=True, conv_only=True)
        self.assertEqual(tuple(tconv(torch.randn(1, 2, 4, 4, 4)).shape), (1, 4, 8, 8, 8))


if __name__ == "__main__":
    unittest.main()
