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
"""VISTA3D against MONAI 1.6.1: checkpoint layout of vista3d132 and recorded outputs of every prompt mode."""

from __future__ import annotations

import json
import os
import unittest

import pytest
import torch
from parameterized import parameterized

from monai.networks.nets import vista3d132
from tests.networks.tiny_vista3d import TESTING_DATA, build_tiny_vista3d, load_testing_data, to_slices

PARITY = load_testing_data("vista3d_tiny_parity.pt")
EXTRA = load_testing_data("vista3d_tiny_parity_extra.pt")
# the sliding-window case needs the inferers; it is tested with them
PARITY_CASES = [[name] for name in PARITY["cases"] if name != "sliding_window_everything"]
EXTRA_CASES = [[name] for name in EXTRA["cases"]]


@pytest.mark.slow
class TestVista3d132Checkpoint(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(TESTING_DATA, "vista3d132_state_dict_shapes.json")) as f:
            cls.reference = json.load(f)
        cls.model = vista3d132()

    @classmethod
    def tearDownClass(cls):
        del cls.model

    def test_names_and_shapes(self):
        state = self.model.state_dict()
        expected = self.reference["state_dict"]
        self.assertEqual(len(expected), 259)
        self.assertEqual(list(state), list(expected))
        for name, shape in expected.items():
            self.assertEqual(list(state[name].shape), shape, name)
        n_params = sum(p.numel() for p in self.model.parameters())
        self.assertEqual(n_params, self.reference["n_parameters"])

    def test_strict_load(self):
        gen = torch.Generator().manual_seed(0)
        state = {
            name: torch.randn(shape, generator=gen) if shape else torch.tensor(0.0)
            for name, shape in self.reference["state_dict"].items()
        }
        self.model.load_state_dict(state, strict=True)
        probe = "class_head.class_embeddings.weight"
        self.assertTrue(torch.equal(self.model.state_dict()[probe], state[probe]))


class TestVista3dParity(unittest.TestCase):
    """Outputs of the tiny model recorded from MONAI 1.6.1 (see tests/testing_data/README.md)."""

    @classmethod
    def setUpClass(cls):
        cls.model = build_tiny_vista3d(PARITY["config"])
        cls.model.load_state_dict(PARITY["state_dict"], strict=True)
        cls.model.eval()

    def setUp(self):
        self.model.image_embeddings = None

    @parameterized.expand(PARITY_CASES)
    def test_recorded_case(self, name):
        case = PARITY["cases"][name]
        with torch.no_grad():
            out = self.model(PARITY["image"], **case["inputs"])
        self.assertEqual(out.shape, case["output"].shape)
        self.assertTrue(torch.allclose(out, case["output"], rtol=1e-4, atol=1e-5), name)

    @parameterized.expand(EXTRA_CASES)
    def test_recorded_extra_case(self, name):
        kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in EXTRA["cases"][name].items()}
        image = kwargs.pop("image", PARITY["image"][..., 8:24, 8:24, 8:24].contiguous())
        max_prompt = kwargs.pop("max_prompt", None)
        second_call_blank = kwargs.pop("second_image_zeros", False)
        if "patch_coords" in kwargs:
            kwargs["patch_coords"] = to_slices(kwargs["patch_coords"])
        prev_mask = kwargs.get("prev_mask")
        prev_mask_before = None if prev_mask is None else prev_mask.clone()
        if max_prompt:
            self.model.point_head.max_prompt = max_prompt
        try:
            with torch.no_grad():
                out = self.model(image, **kwargs)
                if second_call_blank:
                    out = self.model(torch.zeros_like(image), **kwargs)
        finally:
            self.model.point_head.max_prompt = 32
        expected = EXTRA["outputs"][name]
        self.assertEqual(out.shape, expected.shape)
        self.assertTrue(torch.allclose(out, expected, rtol=1e-4, atol=1e-5), name)
        if prev_mask_before is not None:  # the caller's previous mask is not edited in place
            self.assertTrue(torch.equal(prev_mask, prev_mask_before))


if __name__ == "__main__":
    unittest.main()
