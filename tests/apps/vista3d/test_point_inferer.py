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

import os
import unittest

import torch
from parameterized import parameterized

from monai.apps.vista3d import point_based_window_inferer
from tests.networks.tiny_vista3d import tiny_vista3d_with_recorded_weights
from tests.testing_data.point_cases import (
    StubPredictor,
    make_inferer_cases,
    make_vista3d_inferer_case,
)

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "testing_data")
REF = os.path.join(DATA, "point_helpers_upstream.pt")
DEVICES = [("cpu",)] + ([("cuda",)] if torch.cuda.is_available() else [])


class Recorder(torch.nn.Module):
    """VISTA3D's call signature; returns ``[1, channels]`` windows of ``value`` and records each call."""

    def __init__(self, channels: int = 1, value: float = 1.0):
        super().__init__()
        self.channels, self.value, self.calls = channels, value, []

    def forward(
        self,
        input_images,
        point_coords=None,
        point_labels=None,
        class_vector=None,
        prompt_class=None,
        patch_coords=None,
        prev_mask=None,
        **kwargs,
    ):
        self.calls.append(
            {
                "shape": tuple(input_images.shape),
                "window": [(s.start, s.stop) for s in patch_coords[0][2:]],
                "points": point_coords.clone(),
                "labels": point_labels,
                "prev_mask": prev_mask,
                "class_vector": class_vector,
                "prompt_class": prompt_class,
                "kwargs": kwargs,
            }
        )
        return torch.full((1, self.channels, *input_images.shape[2:]), self.value)


class TestPointInferer(unittest.TestCase):
    def test_centre_windows(self):
        img = torch.randn(1, 1, 30, 26, 21)
        pts = torch.tensor([[[15.0, 13.0, 10.0], [2.0, 25.0, 20.6], [15.0, 13.0, 10.0]]])
        rec = Recorder(channels=3)
        out = point_based_window_inferer(img, (16, 12, 10), rec, pts, torch.tensor([[1, 0, 1]]), transpose=True)
        self.assertEqual(out.shape, (1, 3, 30, 26, 21))
        self.assertEqual(out.device.type, "cpu")
        windows = [c["window"] for c in rec.calls]
        # centred; then shifted inside at the low edge of axis 0 and the high edges of axes 1 and 2
        self.assertEqual(windows, [[(7, 23), (7, 19), (5, 15)], [(0, 16), (14, 26), (11, 21)], windows[0]])
        for c in rec.calls:
            self.assertEqual(c["shape"], (1, 1, 16, 12, 10))
            self.assertTrue(torch.equal(c["points"], pts))  # every window gets the whole prompt
            self.assertEqual(c["kwargs"], {"transpose": True})
            self.assertIsNone(c["prev_mask"])
        covered = torch.zeros(30, 26, 21, dtype=torch.bool)
        count = torch.zeros(30, 26, 21)
        for (a, b), (c, d), (e, f) in windows:
            covered[a:b, c:d, e:f] = True
            count[a:b, c:d, e:f] += 1
        # overlapping windows add up; uncovered voxels are NaN
        self.assertTrue(torch.isnan(out[:, :, ~covered]).all())
        self.assertTrue(torch.equal(out[0, 1][covered], count[covered]))
        self.assertEqual(float(count.max()), 3.0)  # a repeated point plus an overlapping window

    def test_odd_roi_centre_is_one_short(self):
        rec = Recorder()
        point_based_window_inferer(torch.zeros(1, 1, 30, 26, 21), (15, 11, 9), rec, torch.tensor([[[15, 13, 0]]]), None)
        self.assertEqual(rec.calls[0]["window"], [(8, 22), (8, 18), (0, 9)])

    @parameterized.expand([(5,), (3,)])
    def test_not_center_only(self, margin):
        size, roi = (30, 26, 21), (16, 12, 10)
        pts = torch.tensor([[[15.0, 13.0, 10.0], [1.0, 24.0, 20.0]]])
        rec = Recorder()
        out = point_based_window_inferer(
            torch.zeros(1, 1, *size), roi, rec, pts, torch.ones(1, 2), center_only=False, margin=margin
        )
        self.assertEqual(len(rec.calls), 54)
        for c in rec.calls:
            self.assertEqual(c["shape"], (1, 1, *roi))  # all inside the image, also near its edges
            for (a, b), s, r in zip(c["window"], size, roi):
                self.assertTrue(0 <= a and b <= s and b - a == r)
        starts0 = sorted({c["window"][0][0] for c in rec.calls[:27]})
        # point 15 on axis 0: the point sits `margin` voxels from the window end, the window start, or centred
        self.assertEqual(starts0, sorted({15 - 16 + margin, 15 - margin, 7}))
        self.assertFalse(torch.isnan(out[0, 0, 14, 12, 9]))

    def test_prev_mask_and_point_start(self):
        img = torch.randn(1, 1, 30, 26, 21)
        prev = torch.randn(1, 2, 30, 26, 21)
        pts = torch.tensor([[[15.0, 13.0, 10.0], [5.0, 5.0, 5.0]]])
        rec = Recorder(channels=2, value=0.5)
        out = point_based_window_inferer(
            img, (16, 12, 10), rec, pts, torch.tensor([[1, 1]]), class_vector=torch.tensor([3]), prev_mask=prev,
            point_start=1, prompt_class=torch.tensor([3]),
        )
        self.assertEqual(len(rec.calls), 1)  # only the point at index 1 places a window
        call = rec.calls[0]
        self.assertEqual(call["window"], [(0, 16), (0, 12), (0, 10)])
        self.assertTrue(torch.equal(call["points"], pts))
        self.assertIs(call["prev_mask"], prev)
        self.assertTrue(torch.equal(call["class_vector"], torch.tensor([3])))
        covered = torch.zeros(30, 26, 21, dtype=torch.bool)
        covered[:16, :12, :10] = True
        self.assertTrue(torch.equal(out[:, :, ~covered], prev[:, :, ~covered]))
        self.assertTrue((out[:, :, covered] == 0.5).all())

    @parameterized.expand(DEVICES)
    def test_stitch_device(self, device):
        """``device`` moves the stitch and the result there; the values are the CPU stitch's (prev_mask, NaN,
        overlapping windows, padding)."""
        img = torch.randn(1, 1, 13, 26, 21).to(device)
        pts = torch.tensor([[[6.0, 5.0, 4.0], [6.0, 20.0, 15.0], [7.0, 9.0, 10.0]]], device=device)
        labels = torch.tensor([[1, 0, 1]], device=device)
        rec = Recorder(channels=2, value=0.25)
        for prev in (None, torch.randn(1, 2, 13, 26, 21).to(device)):
            expected = point_based_window_inferer(img, (16, 12, 10), rec, pts, labels, prev_mask=prev)
            out = point_based_window_inferer(img, (16, 12, 10), rec, pts, labels, prev_mask=prev, device=device)
            self.assertEqual(expected.device.type, "cpu")  # MONAI 1.6.1's default
            self.assertEqual(out.device.type, device)
            self.assertTrue(torch.equal(out.cpu(), expected) if prev is not None else
                            torch.equal(out.cpu().nan_to_num(-7.0), expected.nan_to_num(-7.0)))
            self.assertEqual(bool(torch.isnan(expected).any()), prev is None)

    def test_padding_small_image(self):
        img = torch.randn(1, 1, 13, 26, 9)
        prev = torch.randn(1, 1, 13, 26, 9)
        pts = torch.tensor([[[4.0, 3.0, 8.0]]])
        rec = Recorder()
        out = point_based_window_inferer(img, (16, 12, 10), rec, pts, torch.ones(1, 1), prev_mask=prev)
        self.assertEqual(out.shape, (1, 1, 13, 26, 9))
        call = rec.calls[0]
        self.assertEqual(call["shape"], (1, 1, 16, 12, 10))
        # 3 voxels padded on axis 0 (1 before), 1 on axis 2 (0 before): points and prev_mask follow the padding
        self.assertEqual(call["points"].tolist(), [[[5.0, 3.0, 8.0]]])
        self.assertEqual(tuple(call["prev_mask"].shape), (1, 1, 16, 26, 10))
        self.assertTrue(torch.equal(call["prev_mask"][:, :, 1:14, :, :9], prev))
        self.assertEqual(call["window"], [(0, 16), (0, 12), (0, 10)])
        self.assertTrue((out[:, :, :, :12] == 1).all())
        self.assertTrue(torch.equal(out[:, :, :, 12:], prev[:, :, :, 12:]))

    def test_errors(self):
        img = torch.zeros(1, 1, 16, 16, 16)
        with self.assertRaisesRegex(ValueError, "one object"):
            point_based_window_inferer(img, (8, 8, 8), Recorder(), torch.zeros(2, 1, 3), torch.ones(2, 1))
        with self.assertRaisesRegex(ValueError, "5D"):
            point_based_window_inferer(img[0], (8, 8, 8), Recorder(), torch.zeros(1, 1, 3), torch.ones(1, 1))
        with self.assertRaisesRegex(ValueError, "point_start"):
            point_based_window_inferer(
                img, (8, 8, 8), Recorder(), torch.zeros(1, 1, 3), torch.ones(1, 1), point_start=1
            )


class TestPointInfererUpstream(unittest.TestCase):
    """Outputs recorded from upstream MONAI 1.6.1 by tests/testing_data/make_point_helpers_reference.py."""

    def test_stub_cases(self):
        ref = torch.load(REF, weights_only=True)["inferer"]["stub"]
        cases = make_inferer_cases()
        self.assertEqual(len(cases), len(ref))
        for case, expected in zip(cases, ref):
            out = point_based_window_inferer(predictor=StubPredictor(), **case)
            torch.testing.assert_close(out, expected, equal_nan=True, rtol=1e-6, atol=1e-6)

    def test_tiny_vista3d(self):
        data = torch.load(REF, weights_only=True)
        self.assertEqual(data["vista3d_case"].keys(), make_vista3d_inferer_case().keys())
        model = tiny_vista3d_with_recorded_weights()
        with torch.no_grad():
            out = point_based_window_inferer(predictor=model, **data["vista3d_case"])
        torch.testing.assert_close(out, data["inferer"]["vista3d"], equal_nan=True, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
