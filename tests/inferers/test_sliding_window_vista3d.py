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
"""SlidingWindowInfererAdapt driving the tiny VISTA3D of the recorded upstream case ``sliding_window_everything``.

Skipped where ``monai.networks`` has no VISTA3D yet (the networks live on another branch until merged).
"""

from __future__ import annotations

import os
import unittest

import torch
from parameterized import parameterized

from monai.inferers import SlidingWindowInfererAdapt

try:
    from monai.networks.nets import VISTA3D, SegResNetDS2
    from monai.networks.nets.vista3d import ClassMappingClassify, PointMappingSAM

    HAS_VISTA3D = True
except ImportError:
    HAS_VISTA3D = False

DATA = os.path.join(os.path.dirname(__file__), "..", "testing_data", "vista3d_tiny_parity.pt")


@unittest.skipUnless(HAS_VISTA3D, "monai.networks.nets.VISTA3D is not available in this checkout")
class TestSlidingWindowVista3D(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ref = torch.load(DATA, weights_only=True)
        encoder = SegResNetDS2(
            in_channels=1, blocks_down=(1, 1, 1), norm="instance", out_channels=16, init_filters=16, dsdepth=1
        )
        cls.net = VISTA3D(
            encoder, ClassMappingClassify(512, 16, True), PointMappingSAM(16, n_classes=512, last_supported=132)
        )
        cls.net.load_state_dict(ref["state_dict"])
        cls.net.eval()
        cls.case = ref["cases"]["sliding_window_everything"]

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
