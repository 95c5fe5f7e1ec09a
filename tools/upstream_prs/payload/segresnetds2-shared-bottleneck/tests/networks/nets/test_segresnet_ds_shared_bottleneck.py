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
from monai.networks.nets import SegResNetDS2

# (blocks_down, upsample_mode, dsdepth)
CASES = [((1, 1, 1), "deconv", 1), ((1, 2), "nontrainable", 2), ((1, 1, 1), "pixelshuffle", 1)]


class TestSharedBottleneck(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_both_decoders_equal_each_alone(self, blocks_down, upsample_mode, dsdepth):
        torch.manual_seed(0)
        net = SegResNetDS2(
            in_channels=1,
            blocks_down=blocks_down,
            norm="instance",
            out_channels=3,
            init_filters=4,
            upsample_mode=upsample_mode,
            dsdepth=dsdepth,
        )
        x = torch.randn(2, 1, 16, 16, 16)
        with eval_mode(net), torch.no_grad():
            point, auto = net(x, with_point=True, with_label=True)
            point_alone, _ = net(x, with_point=True, with_label=False)
            _, auto_alone = net(x, with_point=False, with_label=True)
        for both, alone in zip([point, auto], [point_alone, auto_alone]):
            for a, b in zip(both if isinstance(both, list) else [both], alone if isinstance(alone, list) else [alone]):
                self.assertTrue(torch.equal(a, b))

    def test_gradients_reach_the_encoder_through_both_decoders(self):
        torch.manual_seed(0)
        net = SegResNetDS2(in_channels=1, blocks_down=(1, 1), norm="instance", out_channels=2, init_filters=4)
        x = torch.randn(1, 1, 8, 8, 8)
        point, auto = net(x, with_point=True, with_label=True)
        (point.sum() + auto.sum()).backward()
        both = [p.grad.clone() for p in net.encoder.parameters()]
        net.zero_grad()
        point, _ = net(x, with_point=True, with_label=False)
        _, auto = net(x, with_point=False, with_label=True)
        (point.sum() + auto.sum()).backward()
        for a, b in zip(both, [p.grad for p in net.encoder.parameters()]):
            torch.testing.assert_close(a, b)

    def test_no_copy_of_the_bottleneck(self):
        net = SegResNetDS2(in_channels=1, blocks_down=(1, 1), norm="instance", out_channels=4, init_filters=4)
        with mock.patch.object(torch.Tensor, "clone", side_effect=AssertionError("bottleneck copied")):
            with eval_mode(net), torch.no_grad():
                net(torch.randn(1, 1, 8, 8, 8), with_point=True, with_label=True)


if __name__ == "__main__":
    unittest.main()
