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


ROUNDING_SPREAD = 4  # two float32 evaluations of one formula: their worst rounding errors agree within 0.8-1.3x here


def recorded_excess(out32: torch.Tensor, out64: torch.Tensor, recorded: torch.Tensor) -> float:
    """How far the recorded upstream output lies beyond float32 rounding of the exact result; <= 0 passes.

    ``out64`` (this network in float64) is the exact result of the computation on every machine; ``recorded`` is
    upstream's float32 evaluation of it. Its rounding error is bounded by the rounding error of this computation,
    measured here as our own float32 result's worst error ``max |out32 - out64|`` (times ``ROUNDING_SPREAD``: the
    two evaluations sum in different orders), plus the float32 rounding of each stored value. The bound follows the
    machine: where float32 rounds worse, ``out32`` shows it.
    """
    finite = torch.isfinite(recorded)
    own_error = (out32.double() - out64)[finite].abs().max() if finite.any() else torch.tensor(0.0)
    bound = ROUNDING_SPREAD * own_error + torch.finfo(torch.float32).eps * out64[finite].abs()
    return ((recorded.double()[finite] - out64[finite]).abs() - bound).max().item() if finite.any() else 0.0


def _to(value, dtype):
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


class TestVista3dParity(unittest.TestCase):
    """Outputs of the tiny model recorded from MONAI 1.6.1 (see tests/testing_data/README.md), compared with the
    exact (float64) result of this network within the float32 rounding of the computation (recorded_excess)."""

    @classmethod
    def setUpClass(cls):
        cls.model = build_tiny_vista3d(PARITY["config"])
        cls.model.load_state_dict(PARITY["state_dict"], strict=True)
        cls.model.eval()
        cls.model64 = build_tiny_vista3d(PARITY["config"])
        cls.model64.load_state_dict(PARITY["state_dict"], strict=True)
        cls.model64.double().eval()

    def _both(self, run, models=None) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = []
        for model, dtype in zip(models or (self.model, self.model64), (torch.float32, torch.float64)):
            model.image_embeddings = None
            with torch.no_grad():
                outputs.append(run(model, dtype))
        return outputs[0], outputs[1]

    def _recorded(self, name: str, models=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        case = PARITY["cases"][name]

        def run(model, dtype):
            inputs = {k: _to(v, dtype) for k, v in case["inputs"].items()}
            return model(PARITY["image"].to(dtype), **inputs)

        out32, out64 = self._both(run, models)
        return out32, out64, case["output"]

    def _recorded_extra(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def run(model, dtype):
            kwargs = {k: _to(v.clone(), dtype) if isinstance(v, torch.Tensor) else v for k, v in EXTRA["cases"][name].items()}
            image = kwargs.pop("image", PARITY["image"][..., 8:24, 8:24, 8:24].contiguous()).to(dtype)
            max_prompt = kwargs.pop("max_prompt", None)
            second_call_blank = kwargs.pop("second_image_zeros", False)
            if "patch_coords" in kwargs:
                kwargs["patch_coords"] = to_slices(kwargs["patch_coords"])
            prev_mask = kwargs.get("prev_mask")
            prev_mask_before = None if prev_mask is None else prev_mask.clone()
            if max_prompt:
                model.point_head.max_prompt = max_prompt
            try:
                out = model(image, **kwargs)
                if second_call_blank:
                    out = model(torch.zeros_like(image), **kwargs)
            finally:
                model.point_head.max_prompt = 32
            if prev_mask_before is not None:  # the caller's previous mask is not edited in place
                self.assertTrue(torch.equal(prev_mask, prev_mask_before))
            return out

        out32, out64 = self._both(run)
        return out32, out64, EXTRA["outputs"][name]

    @parameterized.expand(PARITY_CASES)
    def test_recorded_case(self, name):
        out32, out64, expected = self._recorded(name)
        self.assertEqual(out32.shape, expected.shape)
        self.assertTrue(torch.equal(torch.isfinite(out64), torch.isfinite(expected)), name)
        self.assertLessEqual(recorded_excess(out32, out64, expected), 0.0, name)

    @parameterized.expand(EXTRA_CASES)
    def test_recorded_extra_case(self, name):
        out32, out64, expected = self._recorded_extra(name)
        self.assertEqual(out32.shape, expected.shape)
        self.assertTrue(torch.equal(torch.isfinite(out64), torch.isfinite(expected)), name)
        self.assertLessEqual(recorded_excess(out32, out64, expected), 0.0, name)

    @parameterized.expand(
        [
            ["encoder_first_conv", "image_encoder.encoder.conv_init.weight", (9, 0, 0, 0, 0), "class_only"],
            ["class_embedding_of_class_60", "class_head.class_embeddings.weight", (60, 0), "class_only"],
            ["point_transformer_norm", "point_head.transformer.layers.0.norm1.weight", (0,), "points_only"],
        ]
    )
    def test_bound_refuses_one_perturbed_weight(self, _, parameter, index, case):
        """The bound is tight enough to see one weight moved by 1e-3 of its layer's largest weight."""
        state = {k: v.clone() for k, v in PARITY["state_dict"].items()}
        state[parameter][index] += 1e-3 * state[parameter].abs().max()
        models = [build_tiny_vista3d(PARITY["config"]) for _ in range(2)]
        for model in models:
            model.load_state_dict(state, strict=True)
        models[1].double()
        out32, out64, expected = self._recorded(case, [m.eval() for m in models])
        self.assertGreater(recorded_excess(out32, out64, expected), 0.0)


if __name__ == "__main__":
    unittest.main()
