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
"""The timing option of the sliding-window inferers and the StageTimer behind it."""

from __future__ import annotations

import math
import unittest
from unittest import mock

import torch
from parameterized import parameterized

from monai.inferers import SlidingWindowInferer, SlidingWindowInfererAdapt, plan_sliding_windows
from monai.utils import StageTimer, format_timings

STAGES = ("prepare", "forward", "stitch", "finalize")


def _fake_cuda():
    """Pretend CUDA is usable: record stream waits and NVTX calls instead of running them."""
    calls: dict[str, list] = {"sync": [], "push": [], "pop": []}
    patches = [
        mock.patch("monai.utils.profiling.cuda_active", lambda: True),
        mock.patch("torch.cuda.synchronize", side_effect=AssertionError("device-wide synchronize on the user's path")),
        mock.patch(
            "torch.cuda.current_stream", lambda *a: mock.Mock(synchronize=lambda: calls["sync"].append(a))
        ),
        mock.patch("torch.cuda.nvtx.range_push", lambda name: calls["push"].append(name)),
        mock.patch("torch.cuda.nvtx.range_pop", lambda: calls["pop"].append(1)),
    ]
    return patches, calls


class FakeClock:
    """``time.perf_counter`` for the timing tests: it moves only when told (durations are for benchmarks)."""

    def __init__(self):
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def installed(self):
        return mock.patch("time.perf_counter", lambda: self.now)


class TestSlidingWindowTiming(unittest.TestCase):
    def test_keys_and_types(self):
        inferer = SlidingWindowInferer((6, 6, 6), 3, 0.5, "gaussian", timing=True)
        inferer(torch.rand(1, 1, 12, 10, 8), lambda w: w * 2)
        t = inferer.timings
        for key in ("total", "other", *STAGES):
            self.assertIsInstance(t[key], float, key)
            self.assertGreaterEqual(t[key], 0.0, key)
        for key in ("windows", "batches", "sw_batch_size"):
            self.assertIsInstance(t[key], int, key)
        self.assertEqual(t["stitch_device"], "cpu")
        # the windows run on the CPU: the timer waits for no CUDA stream, even where CUDA is up
        self.assertFalse(t["synchronized"])

    @unittest.skipUnless(torch.cuda.is_available(), "needs a CUDA GPU")
    def test_cuda_windows_synchronised(self):
        inferer = SlidingWindowInferer((6, 6, 6), 3, 0.5, "gaussian", timing=True)
        inferer(torch.rand(1, 1, 12, 10, 8, device="cuda"), lambda w: w * 2)
        self.assertTrue(inferer.timings["synchronized"])
        self.assertEqual(inferer.timings["stitch_device"], "cuda:0")

    def test_off_by_default(self):
        inferer = SlidingWindowInferer(4, 2)
        inferer(torch.rand(1, 1, 8, 8), lambda w: w)
        self.assertEqual(inferer.timings, {})

    @parameterized.expand([
        ("3d", (1, 1, 12, 10, 8), (6, 6, 6), 3, 0.5, None),
        ("3d_batch2", (2, 1, 12, 10, 8), (5, 4, 8), 4, 0.25, None),
        ("2d", (1, 2, 17, 9), (4, 4), 5, 0.0, None),
        ("padded", (1, 1, 4, 10, 8), (6, 6, 6), 1, 0.5, None),
        ("buffered", (2, 1, 12, 10, 8), (6, 6, 6), 3, 0.5, 2),
    ])
    def test_counts(self, _name, shape, roi, bs, overlap, buffer_steps):
        calls = []
        inferer = SlidingWindowInferer(roi, bs, overlap, timing=True, buffer_steps=buffer_steps, buffer_dim=0)
        inferer(torch.rand(shape), lambda w: calls.append(w.shape[0]) or w)
        plan = plan_sliding_windows(shape[2:], roi, overlap, shape[0])
        self.assertEqual(inferer.timings["windows"], plan.total_windows)
        self.assertEqual(inferer.timings["windows"], sum(calls))
        self.assertEqual(inferer.timings["batches"], len(calls))
        if buffer_steps is None:
            self.assertEqual(len(calls), math.ceil(plan.total_windows / bs))

    def test_stage_sums_with_a_clock_that_only_the_predictor_moves(self):
        """Structural, not wall-clock: on a fake clock that advances only inside the predictor, ``forward`` is
        exactly the predictor's time, the other stages are zero, and ``other`` is what the stages leave."""
        clock = FakeClock()
        delay = 0.25

        def slow(w):
            clock.advance(delay)
            return w + 1

        inferer = SlidingWindowInferer((8, 8, 8), 2, 0.5, "gaussian", timing=True)
        with clock.installed():
            inferer(torch.rand(1, 2, 16, 16, 12), slow)
        t = inferer.timings
        self.assertEqual(t["forward"], t["batches"] * delay)
        for key in ("prepare", "stitch", "finalize", "other"):
            self.assertEqual(t[key], 0.0, key)
        self.assertEqual(t["total"], t["forward"])
        self.assertEqual(t["other"], t["total"] - sum(t[k] for k in STAGES))

    def test_logged_as_one_info_line(self):
        inferer = SlidingWindowInferer(4, 2, 0.0, timing=True)
        with self.assertLogs("monai.inferers.inferer", "INFO") as logs:
            inferer(torch.rand(1, 1, 8, 8), lambda w: w)
        self.assertEqual(len(logs.records), 1)
        line = logs.records[0].getMessage()
        self.assertNotIn("\n", line)
        for word in ("total", "forward", "stitch", "prepare", "finalize", "windows 4", "batches 2"):
            self.assertIn(word, line)

    def test_no_sync_when_timing_off(self):
        patches, calls = _fake_cuda()
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        timer = StageTimer(enabled=False, device="cuda")  # what the inferer uses without timing for GPU windows
        for stage in ("loop", "forward"):
            with timer.stage(stage):
                pass
        self.assertEqual(calls["sync"], [])
        # stages are still marked for a profiler
        self.assertEqual(calls["push"], ["SW_Patchforward_Loop", "SW_Model_Computation"])
        self.assertEqual(len(calls["push"]), len(calls["pop"]))
        self.assertEqual(timer.timings, {})

    def test_fallback_attempts_recorded(self):
        failures = [1]

        def net(w):
            if failures[0]:
                failures[0] -= 1
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return w

        inferer = SlidingWindowInfererAdapt((8, 8, 4), 2, timing=True)
        with mock.patch.object(SlidingWindowInfererAdapt, "_on_accelerator", staticmethod(lambda x: True)), \
                self.assertLogs("monai.inferers.inferer", "INFO") as logs:
            inferer(torch.rand(1, 1, 16, 8, 6), net)
        t = inferer.timings
        self.assertEqual(t["stitching"], "buffered")
        self.assertEqual([a["stitching"] for a in t["attempts"]], ["gpu", "buffered"])
        self.assertIn("OutOfMemoryError", t["attempts"][0]["error"])
        self.assertIsNone(t["attempts"][1]["error"])
        self.assertGreaterEqual(t["call_total"], t["total"])
        self.assertTrue(any("failed attempts" in r.getMessage() for r in logs.records))


class TestStageTimer(unittest.TestCase):
    def test_accumulates(self):
        clock = FakeClock()
        timer = StageTimer()
        with clock.installed():
            for i in range(3):
                with timer.stage("a"):
                    clock.advance(0.5 * (i + 1))
                clock.advance(10.0)  # between stages: not charged to any
                timer.count("n")
        self.assertEqual(timer.timings["a"], 3.0)
        self.assertEqual(timer.timings["n"], 3)

    def test_disabled_records_nothing(self):
        timer = StageTimer(enabled=False, nvtx=False)
        with timer.stage("a"):
            pass
        timer.count("n")
        timer.set("x", 1)
        self.assertEqual(timer.timings, {})

    def test_format(self):
        line = format_timings({"total": 2.0, "forward": 1.5, "stitch": 0.5, "windows": 8, "stitching": "gpu"})
        self.assertIn("forward 1500.0 ms (75%)", line)
        self.assertIn("windows 8", line)
        self.assertIn("stitching gpu", line)




class TestStageTimerSyncScope(unittest.TestCase):
    def test_waits_on_current_stream_not_device(self):
        """With sync on, stage boundaries wait on the caller's stream only, never device-wide."""
        from monai.utils.profiling import StageTimer

        stream = mock.Mock()
        with mock.patch("torch.cuda.current_stream", return_value=stream), mock.patch(
            "torch.cuda.synchronize", side_effect=AssertionError("device-wide synchronize")
        ):
            timer = StageTimer(sync=True, nvtx=False)
            with timer.stage("forward"):
                pass
        self.assertEqual(stream.synchronize.call_count, 2)
        self.assertIn("forward", timer.timings)

    @parameterized.expand([("cpu", 0, 0), (torch.device("cpu"), 0, 0), ("cuda", 2, 1), (None, 2, 1)])
    def test_device_of_the_work(self, device, syncs, pushes):
        """A CPU job in a process that also used the GPU (CUDA initialised by earlier work) neither waits on nor
        marks the current GPU: the CUDA calls are only made for work on CUDA (or of an unknown device)."""
        patches, calls = _fake_cuda()
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        timer = StageTimer(device=device)
        with timer.stage("forward"):
            pass
        self.assertEqual((len(calls["sync"]), len(calls["push"])), (syncs, pushes))
        self.assertIn("forward", timer.timings)

    def test_cpu_inferer_touches_no_gpu(self):
        patches, calls = _fake_cuda()
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        inferer = SlidingWindowInferer(4, 2, timing=True)
        x = torch.rand(1, 1, 8, 8)
        with mock.patch("monai.inferers.inferer.StageTimer", side_effect=StageTimer) as made:
            inferer(x, lambda w: w)
        self.assertEqual(made.call_args.kwargs["device"], x.device)  # the windows' device decides (sw_device)
        self.assertEqual((calls["sync"], calls["push"]), ([], []))
        self.assertFalse(inferer.timings["synchronized"])


if __name__ == "__main__":
    unittest.main()
