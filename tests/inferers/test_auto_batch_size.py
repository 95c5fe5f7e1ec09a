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
"""sw_batch_size="auto": the choice function, the CPU rule, and the CUDA probe with mocked GPU memory."""

from __future__ import annotations

import math
import unittest
from unittest import mock

import torch
from parameterized import parameterized

import monai.inferers.batch_size as bsz
from monai.inferers import (
    SlidingWindowInferer,
    SlidingWindowInfererAdapt,
    choose_sw_batch_size,
    even_batch_size,
    plan_sliding_windows,
    sliding_window_inference,
)

GB = 1 << 30


class TestChoice(unittest.TestCase):
    @parameterized.expand([
        ("even_split", 18, 1 * GB, 14.5 * GB, 0, None, 9),  # 14 fit: two calls of 9, not 14 + 4
        ("all_fit", 18, 1 * GB, 30 * GB, 0, None, 18),  # never more than the windows
        ("exact", 18, 1 * GB, 18 * GB, 0, None, 18),
        ("reserve", 18, 1 * GB, 20 * GB, 8 * GB, None, 9),  # 12 fit: two calls of 9
        ("none_fit", 18, 4 * GB, 1 * GB, 0, None, 1),
        ("max_batch", 27, 1 * GB, 100 * GB, 0, 10, 9),
        ("one_window", 1, 1 * GB, 100 * GB, 0, None, 1),
        ("zero_cost", 7, 0, 1 * GB, 0, None, 7),
    ])
    def test_choose(self, _name, windows, cost, free, reserve, max_batch, expected):
        self.assertEqual(choose_sw_batch_size(windows, cost, free, reserve, max_batch), expected)

    @parameterized.expand([(18, 14, 9), (27, 4, 4), (5, 100, 5), (10, 3, 3), (9, 3, 3), (7, 1, 1), (0, 4, 1)])
    def test_even(self, windows, cap, expected):
        got = even_batch_size(windows, cap)
        self.assertEqual(got, expected)
        if windows:
            self.assertLessEqual(got, cap)
            self.assertEqual(math.ceil(windows / got), math.ceil(windows / min(cap, windows)))  # no extra call

    @parameterized.expand([("word", "big"), ("zero", 0), ("bool", True), ("float", 2.0)])
    def test_bad_value(self, _name, value):
        with self.assertRaises(ValueError):
            sliding_window_inference(torch.rand(1, 1, 8, 8), 4, value, lambda w: w)

    def test_auto_spelling(self):
        self.assertEqual(bsz.check_sw_batch_size(" AUTO "), "auto")


class TestAutoOnCPU(unittest.TestCase):
    @parameterized.expand([((1, 1, 20, 20, 20), 8), ((2, 1, 12, 12), 4), ((1, 1, 8, 8), 8)])
    def test_fixed_rule(self, shape, roi):
        x = torch.rand(shape)
        calls = []
        out = sliding_window_inference(x, roi, "auto", lambda w: calls.append(w.shape[0]) or w * 2, 0.25)
        self.assertTrue(torch.allclose(out, x * 2))
        total = plan_sliding_windows(shape[2:], roi, 0.25, shape[0]).total_windows
        self.assertEqual(sum(calls), total)
        self.assertEqual(len(calls), math.ceil(total / bsz.CPU_AUTO_BATCH))
        self.assertLessEqual(max(calls) - min(calls), 1)


class FakeCudaMemory:
    """Stands in for the CUDA memory queries: each window in a forward call costs ``window_bytes``."""

    free = 20 * GB
    total = 40 * GB
    window_bytes = 1 * GB
    windows_in_call = 0
    queries = 0

    def __init__(self, device):
        self.device = device

    def available(self):
        FakeCudaMemory.queries += 1
        return FakeCudaMemory.free, FakeCudaMemory.total

    def start_peak(self):
        return 3 * GB  # allocated before the forward call

    def peak(self):
        return 3 * GB + FakeCudaMemory.windows_in_call * FakeCudaMemory.window_bytes


def _fake_gpu():
    return [
        mock.patch.object(bsz, "_is_cuda", lambda device: True),
        mock.patch.object(bsz, "_CudaMemory", FakeCudaMemory),
    ]


class TestAutoOnMockedGPU(unittest.TestCase):
    def setUp(self):
        self.patches = _fake_gpu()
        for p in self.patches:
            p.start()
        FakeCudaMemory.queries = 0
        self.calls = []

    def tearDown(self):
        for p in reversed(self.patches):
            p.stop()

    def net(self, w):
        FakeCudaMemory.windows_in_call = w.shape[0]
        self.calls.append(w.shape[0])
        return w + 1

    def test_probe_then_even_batches(self):
        x = torch.rand(1, 1, 20, 20, 14)  # roi 8, overlap 0.25: 3 x 3 x 2 = 18 windows
        # 20 GB available - 10 % of 40 GB = 16 GB; 1 GB * 1.25 per window -> 12 fit; 17 left -> 2 calls of 9 and 8
        out = sliding_window_inference(x, 8, "auto", self.net, 0.25)
        self.assertTrue(torch.allclose(out, x + 1))
        self.assertEqual(self.calls, [1, 9, 8])

    def test_cost_remembered_by_inferer(self):
        x = torch.rand(1, 1, 20, 20, 14)
        inferer = SlidingWindowInferer(8, "auto", 0.25, timing=True)
        inferer(x, self.net)
        self.assertEqual(self.calls, [1, 9, 8])
        self.assertTrue(inferer.timings["auto_batch"]["probe"])
        self.calls.clear()
        out = inferer(x, self.net)  # no probe: 12 fit, 18 windows -> two calls of 9
        self.assertEqual(self.calls, [9, 9])
        self.assertNotIn("probe", inferer.timings["auto_batch"])
        self.assertEqual(inferer.timings["auto_batch"]["max_batch"], 12)
        self.assertTrue(torch.allclose(out, x + 1))
        # another prompt shape changes the memory use: probe again
        self.calls.clear()
        inferer(x, lambda w, extra: self.net(w), torch.zeros(3))
        self.assertEqual(self.calls[0], 1)

    def test_named_predictors_share_a_cost(self):
        """Two wrappers that name one network alike probe once between them, through a cache the caller holds;
        unnamed ones are told apart by object."""

        class Wrapper:
            def __init__(self, owner, name):
                self.owner, self.auto_batch_key = owner, name

            def __call__(self, w):
                return self.owner.net(w)

        x = torch.rand(1, 1, 20, 20, 14)
        cache: dict = {}
        kept = []  # alive, so that no two unnamed wrappers share an id
        for name, probes in ((("vista", 48), [1, 9, 8]), (("vista", 48), [9, 9]), (("vista", 96), [1, 9, 8]),
                             (None, [1, 9, 8]), (None, [1, 9, 8])):
            self.calls.clear()
            kept.append(Wrapper(self, name))
            SlidingWindowInferer(8, "auto", 0.25, auto_cache=cache)(x, kept[-1])
            self.assertEqual(self.calls, probes, name)

    def test_same_size_same_batches(self):
        # the free memory moves between images (other allocations, the next image prefetched): an image of a size
        # already seen still gets that size's batches, so no new shape is compiled or autotuned for it
        inferer = SlidingWindowInfererAdapt(8, "auto", 0.25)
        small, large = torch.rand(1, 1, 20, 20, 14), torch.rand(1, 1, 20, 20, 20)  # 18 and 27 windows
        calls = []
        try:
            for free, x in ((20, small), (14, large), (30, small), (30, large), (14, small)):
                FakeCudaMemory.free = free * GB
                self.calls.clear()
                inferer(x, self.net)
                calls.append(list(self.calls))
        finally:
            FakeCudaMemory.free = 20 * GB
        # 20 GB: 12 fit (see above); 14 GB: (14 - 4) / 1.25 = 8 fit, 27 windows in 4 calls
        self.assertEqual(calls, [[1, 9, 8], [7, 7, 7, 6], [9, 9], [7, 7, 7, 6], [9, 9]])

    def test_plenty_of_memory_one_batch(self):
        FakeCudaMemory.free = 200 * GB
        try:
            x = torch.rand(1, 1, 20, 20, 14)
            inferer = SlidingWindowInfererAdapt(8, "auto", 0.25)
            inferer(x, self.net)
            inferer(x, self.net)
        finally:
            FakeCudaMemory.free = 20 * GB
        self.assertEqual(self.calls, [1, 17, 18])  # probe, the rest, then every window in one call

    def test_tight_memory(self):
        FakeCudaMemory.free = 4.5 * GB + 0.1 * 40 * GB  # 3 windows fit
        try:
            out = sliding_window_inference(torch.ones(1, 1, 20, 20, 14), 8, "auto", self.net, 0.25)
        finally:
            FakeCudaMemory.free = 20 * GB
        self.assertEqual(self.calls, [1] + [3] * 5 + [2])
        self.assertTrue(torch.allclose(out, torch.full_like(out, 2.0)))

    def test_buffered_batches_stay_in_band(self):
        x = torch.rand(1, 1, 20, 20, 14)
        out = sliding_window_inference(x, 8, "auto", self.net, 0.25, buffer_steps=1, buffer_dim=0)
        self.assertTrue(torch.allclose(out, x + 1))
        self.assertEqual(self.calls, [1, 5, 6, 6])  # bands of 6 windows: probe + 5, then 6 and 6


class TestProbeKeepsPeakStatistics(unittest.TestCase):
    """The probe reads the caller's CUDA peak counter without resetting it (torch.cuda faked at its API)."""

    def setUp(self):
        self.allocated, self.peak, self.calls = 3 * GB, 0, []
        cuda = {
            "memory_allocated": lambda device=None: self.allocated,
            "max_memory_allocated": lambda device=None: self.peak,
            "memory_reserved": lambda device=None: self.allocated,
            "mem_get_info": lambda device=None: (20 * GB, 40 * GB),
            "reset_peak_memory_stats": mock.Mock(side_effect=AssertionError("the caller's peak was reset")),
        }
        self.reset = cuda["reset_peak_memory_stats"]
        self.patches = [mock.patch.object(bsz, "_is_cuda", lambda device: True)]
        self.patches += [mock.patch.object(torch.cuda, name, fn) for name, fn in cuda.items()]
        for p in self.patches:
            p.start()

    def tearDown(self):
        for p in reversed(self.patches):
            p.stop()

    def net(self, w):
        self.peak = max(self.peak, self.allocated + w.shape[0] * GB)  # each window costs 1 GB at its peak
        self.calls.append(w.shape[0])
        return w + 1

    @parameterized.expand([(2 * GB, "exact", [1, 9, 8]), (30 * GB, "upper bound", [1] * 18)])
    def test_probe(self, earlier_peak, kind, calls):
        # an earlier peak of 30 GB bounds the probe's cost by 27 GB: one window per call, never too many
        self.peak = earlier_peak
        x = torch.rand(1, 1, 20, 20, 14)
        inferer = SlidingWindowInferer(8, "auto", 0.25, timing=True)
        out = inferer(x, self.net)
        self.assertTrue(torch.allclose(out, x + 1))
        self.assertEqual(inferer.timings["auto_batch"]["probe_peak"], kind)
        self.assertEqual(self.calls, calls)
        self.reset.assert_not_called()


if __name__ == "__main__":
    unittest.main()
