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
"""SimpleInferer, SlidingWindowInferer and the out-of-memory fallbacks of SlidingWindowInfererAdapt."""

from __future__ import annotations

import unittest
from unittest import mock

import torch
from parameterized import parameterized

from monai.inferers import (
    Inferer,
    SimpleInferer,
    SlidingWindowInferer,
    SlidingWindowInfererAdapt,
    sliding_window_inference,
)
from monai.inferers.sliding_window import run_sliding_window


class OOMPredictor:
    """Raises ``torch.cuda.OutOfMemoryError`` on its first ``failures`` calls, then doubles the windows."""

    def __init__(self, failures: int, error: type[Exception] = torch.cuda.OutOfMemoryError):
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.error("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return x * 2


def _pretend_gpu():
    """Let the adaptive inferer treat CPU inputs as GPU inputs, so that its fallbacks run on CPU."""
    return mock.patch.object(SlidingWindowInfererAdapt, "_on_accelerator", staticmethod(lambda inputs: True))


class TestSimpleInferer(unittest.TestCase):
    def test_calls_network_once(self):
        net = mock.MagicMock(side_effect=lambda x, a, b=0: x * a + b)
        x = torch.rand(2, 1, 4, 4)
        out = SimpleInferer()(x, net, 3, b=1)
        self.assertTrue(torch.allclose(out, x * 3 + 1))
        net.assert_called_once()
        self.assertIsInstance(SimpleInferer(), Inferer)

    def test_abstract(self):
        with self.assertRaises(TypeError):
            Inferer()


class TestSlidingWindowInferer(unittest.TestCase):
    @parameterized.expand([
        ("constant", (6, 5, 4), 1, 0.25, "constant"),
        ("gaussian_batch", (6, 5, 4), 4, 0.5, "gaussian"),
        ("int_roi", 5, 3, (0.2, 0.4, 0.6), "gaussian"),
        ("whole_dim", (-1, 5, 4), 2, 0.5, "constant"),
    ])
    def test_matches_function(self, _name, roi, bs, overlap, mode):
        x = torch.rand(2, 2, 11, 9, 7)
        net = lambda w, s: w * w.mean((1, 2, 3, 4), True) * s  # noqa: E731
        cache = isinstance(roi, tuple) and min(roi) > 0
        inferer = SlidingWindowInferer(roi, bs, overlap, mode, cache_roi_weight_map=cache)
        ref = sliding_window_inference(x, roi, bs, net, overlap, mode, 0.125, "constant", 0.0, None, None, False,
                                       None, None, None, -1, False, 2.0)
        self.assertTrue(torch.allclose(inferer(x, net, 2.0), ref, atol=1e-6))

    def test_cached_weight_map(self):
        inferer = SlidingWindowInferer((4, 6), mode="gaussian", cache_roi_weight_map=True)
        self.assertEqual(tuple(inferer.roi_weight_map.shape), (4, 6))
        with self.assertWarns(UserWarning):
            inferer = SlidingWindowInferer((4, -1), cache_roi_weight_map=True)
        self.assertIsNone(inferer.roi_weight_map)

    def test_cpu_thresh_and_call_overrides(self):
        x = torch.rand(1, 1, 8, 8)
        inferer = SlidingWindowInferer(4, 2, cpu_thresh=10)
        with mock.patch("monai.inferers.inferer.run_sliding_window", wraps=run_sliding_window) as spy:
            out = inferer(x, lambda w: w)
            self.assertEqual(str(spy.call_args[0][2].device), "cpu")  # the stitching device
            inferer(x, lambda w: w, buffer_steps=2, buffer_dim=0)
            settings = spy.call_args[0][2]
            self.assertEqual((settings.buffer_steps, settings.buffer_dim), (2, 0))
        self.assertTrue(torch.allclose(out, x))

    def test_with_coord(self):
        x = torch.rand(1, 1, 8, 8)
        seen = []
        SlidingWindowInferer(4, 3, with_coord=True)(x, lambda w, c: seen.extend(c) or w)
        self.assertEqual(len(seen), 9)
        self.assertEqual(seen[0], [slice(0, 1), slice(None), slice(0, 4), slice(0, 4)])

    def test_on_plan_gets_the_passes_plan(self):
        x = torch.rand(2, 1, 8, 8)
        plans, seen = [], []
        inferer = SlidingWindowInferer(4, 3, overlap=0.5, on_plan=plans.append)
        out = inferer(x, lambda w: seen.append(len(w)) or w)
        self.assertTrue(torch.allclose(out, x))
        self.assertEqual(len(plans), 1)  # once per pass, before the windows
        self.assertEqual(plans[0].total_windows, sum(seen))  # 2 images x 9 windows
        self.assertEqual(plans[0].total_windows, 18)
        with self.assertRaises(TypeError):  # not an argument of the function: it would reach the network
            sliding_window_inference(x, 4, 3, lambda w: w, on_plan=plans.append)

    def test_condition_shape_checked(self):
        x = torch.rand(1, 1, 8, 8)
        inferer = SlidingWindowInferer(4)
        out = inferer(x, lambda w, condition: w - condition, condition=x)
        self.assertTrue(torch.allclose(out, torch.zeros_like(x)))
        with self.assertRaises(ValueError):
            inferer(x, lambda w, condition: w, condition=x[..., :4])

    def test_bad_mode(self):
        with self.assertRaises(ValueError):
            SlidingWindowInferer(4, mode="median")


class TestSlidingWindowInfererAdapt(unittest.TestCase):
    def setUp(self):
        self.x = torch.rand(1, 1, 16, 8, 6)
        self.expected = self.x * 2

    def _stages(self, inferer):
        return [(a["stitching"], a["buffer_steps"], a["error"] is not None) for a in inferer.attempts]

    @parameterized.expand([
        ("gpu_ok", None, 0, [("gpu", None, False)], None),
        ("gpu_then_buffered", None, 1, [("gpu", None, True), ("buffered", 1, False)], 1),
        ("gpu_buffered_cpu", None, 2, [("gpu", None, True), ("buffered", 1, True), ("cpu", None, False)], 1),
        ("buffer_halving", 4, 3, [("gpu", None, True), ("buffered", 4, True), ("buffered", 2, True),
                                   ("buffered", 1, False)], 1),
        ("skip_buffer", 0, 1, [("gpu", None, True), ("cpu", None, False)], 0),
    ])
    def test_fallback_order(self, _name, buffer_steps, failures, stages, remembered_steps):
        inferer = SlidingWindowInfererAdapt((8, 8, 4), 2, 0.5, buffer_steps=buffer_steps)
        net = OOMPredictor(failures)
        with _pretend_gpu(), self.assertLogs("monai.inferers.inferer", "INFO") if failures else _null():
            out = inferer(self.x, net)
        self.assertTrue(torch.allclose(out, self.expected))
        self.assertEqual(self._stages(inferer), stages)
        if failures:
            self.assertEqual(inferer.cpu_thresh, self.x.shape[2:].numel() - 1)
            self.assertEqual(inferer.buffer_steps, remembered_steps)
            self.assertIn("OutOfMemoryError", inferer.attempts[0]["error"])
        else:
            self.assertIsNone(inferer.cpu_thresh)
        # the longest spatial dimension is at least twice the last one: bands along it
        self.assertEqual({a["buffer_dim"] for a in inferer.attempts}, {0})

    def test_failed_size_is_remembered(self):
        inferer = SlidingWindowInfererAdapt((8, 8, 4), 2, 0.5)
        with _pretend_gpu(), self.assertLogs("monai.inferers.inferer", "WARNING"):
            inferer(self.x, OOMPredictor(1))
            self.assertEqual(self._stages(inferer)[-1], ("buffered", 1, False))
            # same size again: starts with buffered stitching, no GPU attempt
            out = inferer(self.x, OOMPredictor(0))
            self.assertEqual(self._stages(inferer), [("buffered", 1, False)])
            self.assertTrue(torch.allclose(out, self.expected))
            # a smaller volume still tries the GPU first
            small = torch.rand(1, 1, 8, 8, 6)
            inferer(small, OOMPredictor(0))
            self.assertEqual(self._stages(inferer), [("gpu", None, False)])
            # buffered fails again for the large one: straight to CPU
            inferer(self.x, OOMPredictor(1))
            self.assertEqual(self._stages(inferer), [("buffered", 1, True), ("cpu", None, False)])

    def test_stitching_arguments(self):
        inferer = SlidingWindowInfererAdapt((8, 8, 4), 2, 0.5)
        oom = torch.cuda.OutOfMemoryError("simulated")
        with _pretend_gpu(), mock.patch.object(SlidingWindowInferer, "_run", autospec=True,
                                               side_effect=[oom, oom, "done"]) as run:
            with self.assertLogs("monai.inferers.inferer", "WARNING"):
                self.assertEqual(inferer(self.x, OOMPredictor(0)), "done")
        # (self, inputs, network, device, buffer_steps, buffer_dim, args, kwargs)
        calls = [(str(c[0][3]), c[0][4], c[0][5]) for c in run.call_args_list]
        self.assertEqual(calls, [("cpu", None, 0), ("cpu", 1, 0), ("cpu", None, 0)])

    def test_no_fallback_on_cpu_or_other_errors(self):
        inferer = SlidingWindowInfererAdapt((8, 8, 4), 2)
        with self.assertRaises(torch.cuda.OutOfMemoryError):  # a CPU input cannot fall back
            inferer(self.x, OOMPredictor(1))
        with _pretend_gpu(), self.assertRaises(RuntimeError):
            inferer(self.x, OOMPredictor(1, error=RuntimeError))
        self.assertEqual(len(inferer.attempts), 1)
        self.assertIsNone(inferer.cpu_thresh)

    def test_device_given_disables_adaptation(self):
        inferer = SlidingWindowInfererAdapt((8, 8, 4), 2, device="cpu")
        with _pretend_gpu(), self.assertRaises(torch.cuda.OutOfMemoryError):
            inferer(self.x, OOMPredictor(1))
        self.assertTrue(torch.allclose(inferer(self.x, OOMPredictor(0)), self.expected))

    def test_gives_up(self):
        inferer = SlidingWindowInfererAdapt((8, 8, 4), 2, buffer_steps=2 ** 20)
        with _pretend_gpu(), self.assertLogs("monai.inferers.inferer", "WARNING"), self.assertRaises(RuntimeError):
            inferer(self.x, OOMPredictor(100))
        self.assertEqual(len(inferer.attempts), inferer.max_attempts)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    unittest.main()
