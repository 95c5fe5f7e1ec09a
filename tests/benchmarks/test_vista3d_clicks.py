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
"""The helpers of ``vista3d_clicks.py`` and ``vista3d_click_agreement.py`` (the benchmarks are not unit tests)."""

import unittest

import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.cli.phantom import PHANTOM_LABELS, make_phantom_labels
from tests.benchmarks.vista3d_click_agreement import (
    SPECIAL_CLASS,
    agreement,
    click_cases,
    train_clicks,
)
from tests.benchmarks.vista3d_clicks import click_sequence, organ_point, past_window_end
from tests.benchmarks.vista3d_everything import tiny_vista3d
from tests.benchmarks.vista3d_trained_agreement import phantom

TRUTH = make_phantom_labels((48, 48, 40), (1.5, 1.5, 1.5), 0)


class TestClicks(unittest.TestCase):
    @parameterized.expand([(name, rank) for name in ("liver", "spleen", "aorta", "right_kidney") for rank in (0, 1)])
    def test_organ_point_is_inside(self, name, rank):
        point = organ_point(TRUTH, PHANTOM_LABELS[name], rank)
        self.assertEqual(int(TRUTH[tuple(point)]), PHANTOM_LABELS[name])
        self.assertEqual(point, organ_point(TRUTH, PHANTOM_LABELS[name], rank))  # deterministic
        with self.assertRaisesRegex(ValueError, "not in the phantom"):
            organ_point(TRUTH, 99, rank)

    def test_sequence(self):
        clicks = click_sequence(TRUTH, 7)
        self.assertEqual(len(clicks), 7)
        self.assertEqual([label for _, label in clicks[:5]], [1, 1, 0, 1, 0])
        self.assertEqual(len({tuple(p) for p, _ in clicks}), 7)  # past the 5 of the sequence: other voxels

    def test_redraw_moves_only_that_click(self):
        clicks, redrawn = click_sequence(TRUTH, 5), click_sequence(TRUTH, 5, {1: 1})
        self.assertNotEqual(clicks[1][0], redrawn[1][0])
        self.assertEqual(int(TRUTH[tuple(redrawn[1][0])]), PHANTOM_LABELS["liver"])
        self.assertEqual([c for i, c in enumerate(clicks) if i != 1], [c for i, c in enumerate(redrawn) if i != 1])

    @parameterized.expand([
        ("alone", [[100.7, 100.7, 100.7]], 300, None),  # a click's own window is centred on it
        ("inside", [[163.4, 100.0, 100.0], [100.0, 100.0, 100.0]], 300, None),  # window 36..164: 127.4 -> 127
        ("last_half_voxel", [[163.6, 100.0, 100.0], [100.0, 100.0, 100.0]], 300, 0),  # 127.6 rounds to 128
        ("outside", [[164.2, 100.0, 100.0], [100.0, 100.0, 100.0]], 300, None),  # not in the window: not looked up
        ("earlier_window", [[100.0, 100.0, 100.0], [163.6, 100.0, 100.0]], 300, None),  # click 0's window saw only it
        ("image_end", [[199.7, 100.0, 100.0], [190.0, 100.0, 100.0]], 200, 0),  # window moved inside: 72..200
    ])
    def test_past_window_end(self, _, coords, size, expected):
        self.assertEqual(past_window_end(np.array(coords), (size, 300, 300), 128), expected)

    def test_past_window_end_small_image(self):  # upstream pads an image smaller than the window: 19 voxels here
        self.assertIsNone(past_window_end(np.array([[80.0, 50.0, 50.0], [10.0, 50.0, 50.0]]), (90, 100, 100), 128))
        self.assertEqual(past_window_end(np.array([[108.6, 50.0, 50.0], [10.0, 50.0, 50.0]]), (90, 100, 100), 128), 0)

    def test_cases(self):
        cases = click_cases(TRUTH)
        self.assertEqual(len([c for c in cases if c.startswith("organ_")]), 5)
        self.assertEqual(sorted(label for _, label in cases["special"]["clicks"]), [2, 3])
        self.assertEqual(cases["special"]["prompt_class"], SPECIAL_CLASS)
        self.assertEqual(cases["edit"]["class_vector"], PHANTOM_LABELS["liver"])
        self.assertTrue(cases["sequence"]["sequence"])
        for case in cases.values():  # positive clicks lie in the prompted organ (the special case: in the liver)
            organ = PHANTOM_LABELS["liver"] if case["prompt_class"] == SPECIAL_CLASS else case["prompt_class"]
            positives = [point for point, label in case["clicks"] if label in (1, 3)]
            self.assertTrue(positives)
            self.assertTrue(all(int(TRUTH[tuple(p)]) == organ for p in positives), case)
        self.assertEqual([label for _, label in cases["negative"]["clicks"]], [1, 0, 0])

    def test_agreement(self):
        a = torch.tensor([1.0, -1.0, float("nan"), 2.0])
        b = torch.tensor([1.5, 1.0, float("nan"), float("nan")])
        r = agreement(a, b)
        self.assertAlmostEqual(r["all"], 0.5)  # equal: both foreground, both without a prediction
        self.assertAlmostEqual(r["foreground"], 1 / 3)
        self.assertEqual(r["foreground_voxels"], 3)
        self.assertAlmostEqual(r["logit_max_abs_diff"], 2.0)


class TestTrainClicks(unittest.TestCase):
    def test_trains_the_point_branch_only(self):
        net = tiny_vista3d()
        encoder = {k: v.clone() for k, v in net.image_encoder.encoder.state_dict().items()}
        head = [p.detach().clone() for p in net.point_head.parameters()]
        losses = train_clicks(net, [phantom((24, 24, 20), seed=1)], steps=3, crop=16, lr=1e-3)
        self.assertEqual(len(losses), 3)
        self.assertTrue(all(np.isfinite(losses)))
        self.assertFalse(net.training)
        self.assertTrue(all(torch.equal(v, net.image_encoder.encoder.state_dict()[k]) for k, v in encoder.items()))
        self.assertTrue(any(not torch.equal(a, b) for a, b in zip(head, net.point_head.parameters())))


if __name__ == "__main__":
    unittest.main()
