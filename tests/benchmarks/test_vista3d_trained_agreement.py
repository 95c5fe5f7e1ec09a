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
"""The helpers of ``tests/benchmarks/vista3d_trained_agreement.py`` (the benchmark itself is not a unit test)."""

import unittest

import torch
from parameterized import parameterized

from tests.benchmarks.vista3d_everything import tiny_vista3d
from tests.benchmarks.vista3d_trained_agreement import (
    TrainConfig,
    class_targets,
    dice,
    foreground_agreement,
    phantom,
    random_crops,
    soft_dice_loss,
    train,
)


class TestPhantomData(unittest.TestCase):
    def test_phantom_is_scaled_and_labelled(self):
        image, labels = phantom((40, 36, 32), seed=3)
        self.assertEqual(tuple(image.shape), (1, 1, 40, 36, 32))
        self.assertEqual(tuple(labels.shape), (40, 36, 32))
        self.assertGreaterEqual(image.min().item(), 0.0)
        self.assertLessEqual(image.max().item(), 1.0)
        self.assertLess(image[0, 0, 0, 0, 0].item(), 0.05)  # a corner is air: -1000 HU is just below the window
        self.assertTrue({1, 3, 6}.issubset(set(labels.unique().tolist())))  # liver, spleen, aorta

    def test_class_targets_one_hot(self):
        labels = torch.tensor([[0, 1], [5, 14]])
        t = class_targets(labels, torch.tensor([1, 5, 7]))
        self.assertEqual(tuple(t.shape), (3, 2, 2))
        torch.testing.assert_close(t[0], torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
        torch.testing.assert_close(t[1], torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
        self.assertEqual(t[2].sum().item(), 0.0)

    def test_crops_take_the_same_boxes(self):
        image = torch.arange(8 * 9 * 10, dtype=torch.float32).view(1, 1, 8, 9, 10)
        labels = image[0, 0].long()
        x, y = random_crops(image, labels, 4, 3, torch.Generator().manual_seed(0))
        self.assertEqual(tuple(x.shape), (3, 1, 4, 4, 4))
        self.assertEqual(tuple(y.shape), (3, 4, 4, 4))
        torch.testing.assert_close(x[:, 0].long(), y)
        for i in range(3):  # each crop is a contiguous box of the volume: consecutive along the last axis
            self.assertTrue(((x[i, 0, :, :, 1:] - x[i, 0, :, :, :-1]) == 1).all())

    @parameterized.expand([("equal", [1, 1, 2], [1, 1, 2], {1: 1.0, 2: 1.0, 3: 1.0}),
                           ("half", [1, 0, 0], [1, 1, 0], {1: 2 / 3}),
                           ("missed", [0, 0], [2, 2], {2: 0.0})])
    def test_dice(self, _, pred, truth, expected):
        self.assertEqual(dice(torch.tensor(pred), torch.tensor(truth), list(expected)), expected)

    def test_foreground_agreement_ignores_common_background(self):
        a, b = torch.tensor([0, 0, 0, 1, 2, 3]), torch.tensor([0, 0, 0, 1, 2, 0])
        self.assertAlmostEqual(foreground_agreement(a, b), 2 / 3)
        self.assertEqual(foreground_agreement(torch.zeros(4), torch.zeros(4)), 1.0)

    def test_soft_dice_loss_counts_present_classes_only(self):
        target = torch.zeros(1, 3, 4)
        target[0, 0, :2] = 1  # class 0 present; classes 1, 2 absent
        perfect = torch.where(target > 0, 30.0, -30.0)
        self.assertLess(soft_dice_loss(perfect, target).item(), 1e-6)
        wrong = perfect.clone()
        wrong[0, 1:] = 30.0  # absent classes called everywhere: no effect on this loss
        self.assertLess(soft_dice_loss(wrong, target).item(), 1e-6)
        missed = perfect.clone()
        missed[0, 0] = -30.0
        self.assertGreater(soft_dice_loss(missed, target).item(), 0.99)
        self.assertEqual(soft_dice_loss(perfect, torch.zeros(1, 3, 4)).item(), 0.0)


class TestTrain(unittest.TestCase):
    def test_training_lowers_the_loss(self):
        net = tiny_vista3d()
        before = [p.detach().clone() for p in net.parameters()]
        volume = phantom((24, 24, 20), seed=1)
        losses = train(net, [volume], torch.tensor([1, 3, 5, 6, 14]), TrainConfig(steps=6, crop=16, batch=1, lr=1e-3))
        self.assertEqual(len(losses), 6)
        self.assertLess(losses[-1], losses[0])
        self.assertFalse(net.training)
        self.assertTrue(any(not torch.equal(a, b) for a, b in zip(before, net.parameters())))

    def test_time_budget_stops_early(self):
        losses = train(tiny_vista3d(), [phantom((20, 20, 20), seed=2)], torch.tensor([1]),
                       TrainConfig(steps=50, crop=16, batch=1, seconds=0.0))
        self.assertEqual(len(losses), 1)  # the budget is checked after each step


if __name__ == "__main__":
    unittest.main()
