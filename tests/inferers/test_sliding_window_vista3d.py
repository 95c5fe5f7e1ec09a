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
"""SlidingWindowInfererAdapt driving the tiny VISTA3D of the recorded upstream case ``sliding_window_everything``."""

from __future__ import annotations

import unittest

import torch
from parameterized import parameterized

from monai.inferers import SlidingWindowInfererAdapt
from tests.networks.tiny_vista3d import load_testing_data, tiny_vista3d_with_recorded_weights


class TestSlidingWindowVista3D(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.net = tiny_vista3d_with_recorded_weights()
        cls.case = load_testing_data("vista3d_tiny_parity.pt")["cases"]["sliding_window_everything"]

    @parameterized.expand([("recorded_batch", 3), ("auto", "auto")])
    def test_everything_parity(self, _name, sw_batch_size):
        inputs = self.case["inputs"]
        cv = inputs["class_vector"]
        inferer = SlidingWindowInfererAdapt(roi_size=(32, 32, 32), sw_batch_size=sw_batch_size, with_coord=True)
        with torch.no_grad():
            out = inferer(inputs["image"], self.net, transpose=True, class_vector=cv, prompt_class=cv,
                          point_coords=None, point_labels=None, labels=None, label_set=None, prev_mask=None)
        expected = self.case["output"]
        self.assertEqual(tuple(out.shape), tuple(expected.shape))
        self.assertTrue(torch.allclose(out, expected, rtol=1e-4, atol=1e-4), float((out - expected).abs().max()))


if __name__ == "__main__":
    unittest.main()
