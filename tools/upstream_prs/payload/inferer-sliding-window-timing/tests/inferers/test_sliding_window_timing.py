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

from monai.inferers import SlidingWindowInferer, SlidingWindowInfererAdapt, format_window_timings
from tests.test_utils import assert_allclose, skip_if_no_cuda

KEYS = {"total", "forward", "other", "sync", "windows", "batches", "sw_batch_size", "synchronized"}

# (input shape, roi, sw_batch_size, extra inferer arguments)
CASES = [
    ((1, 1, 16, 16, 16), (8, 8, 8), 4, {}),
    ((2, 1, 12, 10, 9), (8, 8, 8), 3, {"overlap": 0.5}),
    ((1, 2, 20, 12), (8, 8), 5, {}),
    ((1, 1, 6, 6, 6), (8, 8, 8), 2, {}),
    ((1, 1, 16, 16, 24), (8, 8, 8), 4, {"buffer_steps": 1, "buffer_dim": -1, "device": "cpu"}),
]


class CountingNet:
    """Doubles its input; records the number of windows of every call."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, x, *args):
        self.calls.append(x.shape[0])
        return x * 2


class TestSlidingWindowTiming(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_counts_and_equal_results(self, shape, roi, sw_batch_size, kwargs):
        x = torch.rand(shape)
        net = CountingNet()
        timed = SlidingWindowInferer(roi, sw_batch_size, timing=True, **kwargs)
        with mock.patch("torch.cuda.synchronize") as synchronize:
            out = timed(x, net)
        t = timed.timings
        self.assertEqual(set(t), KEYS)
        self.assertEqual((t["batches"], t["windows"]), (len(net.calls), sum(net.calls)))
        self.assertEqual(t["sw_batch_size"], sw_batch_size)
        self.assertGreaterEqual(t["total"], t["forward"])
        self.assertAlmostEqual(t["other"], t["total"] - t["forward"])
        # windows on the CPU: nothing is synchronised, so the measurement adds no waiting
        self.assertEqual((t["synchronized"], t["sync"], synchronize.call_count), ([], 0.0, 0))
        untimed = SlidingWindowInferer(roi, sw_batch_size, **kwargs)
        assert_allclose(out, untimed(x, CountingNet()), rtol=0, atol=0)

    def test_off_by_default(self):
        inferer = SlidingWindowInferer((8, 8, 8), 2, overlap=0.0)
        inferer(torch.rand(1, 1, 16, 16, 16), CountingNet())
        self.assertFalse(inferer.timing)
        self.assertEqual(inferer.timings, {})

    def test_network_seconds_go_to_forward(self):
        # a network that advances a fake clock by one second per call: forward is exactly the number of batches
        clock = [0.0]

        def slow_net(x):
            clock[0] += 1.0
            return x

        inferer = SlidingWindowInferer((8, 8, 8), 2, overlap=0.0, timing=True)
        with mock.patch("monai.inferers.inferer.time.perf_counter", side_effect=lambda: clock[0]):
            inferer(torch.rand(1, 1, 16, 16, 16), slow_net)
        t = inferer.timings
        self.assertEqual(t["batches"], 4)  # 8 windows, 2 per call
        self.assertEqual((t["forward"], t["total"], t["other"]), (4.0, 4.0, 0.0))

    def test_logged_as_one_info_line(self):
        inferer = SlidingWindowInferer((8, 8, 8), 8, overlap=0.0, timing=True)
        with self.assertLogs("monai.inferers.inferer", level="INFO") as logs:
            inferer(torch.rand(1, 1, 16, 16, 16), CountingNet())
        self.assertEqual(len(logs.output), 1)
        self.assertIn("SlidingWindowInferer: total", logs.output[0])
        self.assertIn("windows 8, batches 1, sw_batch_size 8", logs.output[0])

    def test_with_coord_passes_coordinates(self):
        seen = []

        def net(x, coords):
            seen.append(len(coords))
            return x

        inferer = SlidingWindowInferer((8, 8, 8), 3, with_coord=True, timing=True)
        inferer(torch.rand(1, 1, 16, 16, 8), net)
        self.assertEqual(inferer.timings["windows"], sum(seen))

    def test_adapt_inherits_timing(self):
        net = CountingNet()
        inferer = SlidingWindowInfererAdapt((8, 8, 8), 4, overlap=0.0, timing=True)
        out = inferer(torch.rand(1, 1, 16, 16, 16), net)
        self.assertEqual((inferer.timings["windows"], inferer.timings["batches"]), (8, 2))
        self.assertEqual(net.calls, [4, 4])
        self.assertEqual(tuple(out.shape), (1, 1, 16, 16, 16))

    def test_format(self):
        t = {"total": 0.2, "forward": 0.15, "other": 0.05, "sync": 0.001, "windows": 8, "batches": 2}
        line = format_window_timings({**t, "sw_batch_size": 4, "synchronized": []})
        self.assertEqual(
            line,
            "total 200.0 ms | forward 150.0 ms (75%), other 50.0 ms (25%) | sync 1.0 ms | "
            "windows 8, batches 2, sw_batch_size 4",
        )

    @skip_if_no_cuda
    def test_synchronises_only_the_windows_device(self):
        x = torch.rand(1, 1, 16, 16, 16, device="cuda:0")
        inferer = SlidingWindowInferer((8, 8, 8), 4, overlap=0.0, timing=True)
        with mock.patch("torch.cuda.synchronize") as synchronize:
            inferer(x, CountingNet())
        self.assertEqual(inferer.timings["synchronized"], ["cuda:0"])
        self.assertTrue(all(c.args == (torch.device("cuda:0"),) for c in synchronize.call_args_list))
        self.assertEqual(synchronize.call_count, 2 + 2 * inferer.timings["batches"])


if __name__ == "__main__":
    unittest.main()
