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
"""Parity of sliding_window_inference with outputs recorded from upstream MONAI 1.6.1."""

from __future__ import annotations

import os
import unittest

import torch
from parameterized import parameterized

from monai.inferers import SlidingWindowInferer, sliding_window_inference

DATA = os.path.join(os.path.dirname(__file__), "..", "testing_data", "sliding_window_parity.pt")
REF = torch.load(DATA, weights_only=True)
CASES = [(f"{i}_{c['kwargs']['mode']}_{c['kwargs']['padding_mode']}", i) for i, c in enumerate(REF["cases"])]


def _conv() -> torch.nn.Module:
    conv = torch.nn.Conv3d(2, 3, 3, padding=1)
    conv.load_state_dict(REF["conv_state_dict"])
    return conv.eval()


class TestSlidingWindowParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conv = _conv()

    def _check(self, out, expected):
        self.assertEqual(tuple(out.shape), tuple(expected.shape))
        self.assertTrue(torch.allclose(out, expected, rtol=1e-4, atol=1e-5), float((out - expected).abs().max()))

    @parameterized.expand(CASES)
    def test_recorded_case(self, _name, index):
        case = REF["cases"][index]
        with torch.no_grad():
            out = sliding_window_inference(REF["input"], predictor=self.conv, **case["kwargs"])
        self._check(out, case["output"])

    @parameterized.expand([c for c in CASES if REF["cases"][c[1]]["kwargs"]["padding_mode"] == "reflect"])
    def test_reflect_with_cval(self, _name, index):
        # cval only affects constant padding; upstream rejects the combination, the fork ignores cval here
        kwargs = dict(REF["cases"][index]["kwargs"], cval=0.5)
        with torch.no_grad():
            out = sliding_window_inference(REF["input"], predictor=self.conv, **kwargs)
        self._check(out, REF["cases"][index]["output"])

    @parameterized.expand(CASES[::5])
    def test_inferer_and_buffered(self, _name, index):
        kw = REF["cases"][index]["kwargs"]
        expected = REF["cases"][index]["output"]
        with torch.no_grad():
            inferer = SlidingWindowInferer(
                kw["roi_size"], kw["sw_batch_size"], kw["overlap"], kw["mode"], kw["sigma_scale"],
                kw["padding_mode"], kw.get("cval", 0.0),
            )
            self._check(inferer(REF["input"], self.conv), expected)
            for dim in (0, -1):
                self._check(inferer(REF["input"], self.conv, buffer_steps=2, buffer_dim=dim), expected)


if __name__ == "__main__":
    unittest.main()
