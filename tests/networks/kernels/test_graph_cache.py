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
"""The CUDA graph cache: one capture per input signature, the output copied or lent, recapture on new weights."""

from __future__ import annotations

import unittest

import torch
from parameterized import parameterized

from monai.networks.kernels import GraphCache


@unittest.skipUnless(torch.cuda.is_available(), "CUDA graphs need a GPU")
class TestGraphCache(unittest.TestCase):
    @parameterized.expand([(True,), (False,)])
    def test_replays_and_output(self, copy_output):
        weight = torch.randn(8, 8, device="cuda")
        cache = GraphCache(lambda x: (x @ weight).relu(), [weight], copy_output=copy_output)
        x1, x2 = torch.randn(4, 8, device="cuda"), torch.randn(4, 8, device="cuda")
        y1 = cache(x1)
        kept = y1.clone()
        y2 = cache(x2)
        self.assertEqual(len(cache), 1)
        torch.testing.assert_close(y2, (x2 @ weight).relu())
        # a copy keeps the first result; the lent buffer holds the latest replay's
        self.assertEqual(y1 is y2, not copy_output)
        torch.testing.assert_close(y1, kept if copy_output else y2)
        cache(torch.randn(2, 8, device="cuda"))
        self.assertEqual(len(cache), 2)  # a new shape: a second graph

    def test_recaptures_when_a_parameter_changes(self):
        weight = torch.randn(8, 8, device="cuda")
        copies = {}

        def fn(x):  # reads a copy made per parameter version, as the fused path's padded weights are
            if weight._version not in copies:
                copies[weight._version] = weight * 1.0
            return x @ copies[weight._version]

        cache = GraphCache(fn, [weight])
        x = torch.randn(4, 8, device="cuda")
        torch.testing.assert_close(cache(x), x @ weight)
        weight.mul_(2.0)  # bumps the version: a graph kept would read the old copy
        torch.testing.assert_close(cache(x), x @ weight)

if __name__ == "__main__":
    unittest.main()
