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
# torch.cuda.empty_cache() calls of one forward: the encoder's, and the point head's two (after downsampling the
# features, before each chunk of max_prompt prompts)
CALLS = {"class": 1, "points": 3, "mixed": 3}


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
    def test_default_keeps_every_call(self, mode):
        net = tiny_vista3d()
        self.assertTrue(net.release_cached_memory)
        _, calls = self.run_counting(net, PROMPTS[mode])
        self.assertEqual(calls, CALLS[mode])

    @parameterized.expand(PROMPTS.keys())
    def test_opt_out_skips_the_calls_same_outputs(self, mode):
        net = tiny_vista3d()
        out_default, _ = self.run_counting(net, PROMPTS[mode])
        net.release_cached_memory = False
        out_kept, calls = self.run_counting(net, PROMPTS[mode])
        self.assertEqual(calls, 0)
        self.assertTrue(torch.equal(out_default, out_kept))

    def test_constructor_sets_both_heads(self):
        net = tiny_vista3d(release_cached_memory=False)
        self.assertFalse(net.release_cached_memory)
        self.assertFalse(net.point_head.release_cached_memory)
        net.release_cached_memory = True
        self.assertTrue(net.point_head.release_cached_memory)

    def test_other_point_head_is_left_alone(self):
        net = VISTA3D(torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity(), release_cached_memory=False)
        self.assertFalse(net.release_cached_memory)
        self.assertFalse(hasattr(net.point_head, "release_cached_memory"))


if __name__ == "__main__":
    unittest.main()
