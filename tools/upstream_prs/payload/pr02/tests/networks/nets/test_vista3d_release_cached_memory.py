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
from unittest import mock

import torch
from parameterized import parameterized

from monai.networks import eval_mode
from monai.networks.nets import VISTA3D, SegResNetDS2
from monai.networks.nets.vista3d import ClassMappingClassify, PointMappingSAM

PROMPTS = {
    "class": {"class_vector": torch.tensor([[1], [2]])},
    "points": {"point_coords": torch.tensor([[[3, 4, 5]], [[8, 8, 8]]]), "point_labels": torch.tensor([[1], [0]])},
    "mixed": {
        "class_vector": torch.tensor([[1], [2]]),
        "point_coords": torch.tensor([[[3, 4, 5]], [[8, 8, 8]]]),
        "point_labels": torch.tensor([[1], [0]]),
    },
}


def tiny_vista3d(**kwargs) -> VISTA3D:
    torch.manual_seed(0)
    encoder = SegResNetDS2(in_channels=1, blocks_down=(1, 1), norm="instance", out_channels=8, init_filters=8)
    class_head = ClassMappingClassify(n_classes=8, feature_size=8, use_mlp=True)
    point_head = PointMappingSAM(feature_size=8, n_classes=8, last_supported=4)
    return VISTA3D(encoder, class_head, point_head, **kwargs)


class TestReleaseCachedMemory(unittest.TestCase):
    def setUp(self):
        self.image = torch.randn(1, 1, 16, 16, 16)

    def run_counting(self, net, prompts):
        with mock.patch("torch.cuda.empty_cache") as empty_cache, eval_mode(net), torch.no_grad():
            out = net(self.image, **prompts)
        return out, empty_cache.call_count

    @parameterized.expand(PROMPTS.keys())
    def test_no_empty_cache_by_default(self, mode):
        _, calls = self.run_counting(tiny_vista3d(), PROMPTS[mode])
        self.assertEqual(calls, 0)

    @parameterized.expand(PROMPTS.keys())
    def test_opt_in_keeps_1_6_1_calls_and_outputs(self, mode):
        net = tiny_vista3d()
        out_default, _ = self.run_counting(net, PROMPTS[mode])
        net.release_cached_memory = True
        out_released, calls = self.run_counting(net, PROMPTS[mode])
        # the encoder's call, plus the point head's two (after downsampling, before each chunk of prompts)
        self.assertEqual(calls, 1 if mode == "class" else 3)
        self.assertTrue(torch.equal(out_default, out_released))

    def test_constructor_sets_both_heads(self):
        net = tiny_vista3d(release_cached_memory=True)
        self.assertTrue(net.release_cached_memory)
        self.assertTrue(net.point_head.release_cached_memory)
        net.release_cached_memory = False
        self.assertFalse(net.point_head.release_cached_memory)

    def test_generic_point_head_is_left_alone(self):
        net = VISTA3D(torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity(), release_cached_memory=True)
        self.assertTrue(net.release_cached_memory)
        self.assertFalse(hasattr(net.point_head, "release_cached_memory"))


class TestSharedBottleneck(unittest.TestCase):
    def test_both_decoders_equal_each_alone(self):
        torch.manual_seed(0)
        net = SegResNetDS2(in_channels=1, blocks_down=(1, 1, 1), norm="instance", out_channels=4, init_filters=4)
        x = torch.randn(2, 1, 16, 16, 16)
        with eval_mode(net), torch.no_grad():
            point, auto = net(x, with_point=True, with_label=True)
            point_alone, _ = net(x, with_point=True, with_label=False)
            _, auto_alone = net(x, with_point=False, with_label=True)
        self.assertTrue(torch.equal(point, point_alone))
        self.assertTrue(torch.equal(auto, auto_alone))

    def test_no_copy_of_the_bottleneck(self):
        net = SegResNetDS2(in_channels=1, blocks_down=(1, 1), norm="instance", out_channels=4, init_filters=4)
        with mock.patch.object(torch.Tensor, "clone", side_effect=AssertionError("bottleneck copied")), eval_mode(
            net
        ), torch.no_grad():
            net(torch.randn(1, 1, 8, 8, 8), with_point=True, with_label=True)


if __name__ == "__main__":
    unittest.main()
