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
"""The CUDA graph cache: one capture per input signature, the output copied or lent, recapture on new weights; eager
calls beyond its batch limit or off CUDA, and cuDNN's algorithm timing on each signature's first call only."""

from __future__ import annotations

import types
import unittest

import torch
from parameterized import parameterized

from monai.networks.kernels import GraphCache, cudnn_autotuning


class TestDriver(unittest.TestCase):
    """What runs eagerly and when cuDNN times its algorithms (on any machine: CPU calls are eager)."""

    @parameterized.expand([(None, 14, True), (4, 4, True), (4, 5, False), (0, 1, False)])
    def test_captures_up_to_max_batch(self, max_batch, batch, expected):
        cache = GraphCache(lambda x: x, [], max_batch=max_batch)
        self.assertEqual(cache.captures(types.SimpleNamespace(is_cuda=True, ndim=5, shape=(batch, 1))), expected)
        self.assertFalse(cache.captures(torch.zeros(1, 1)))  # never off CUDA

    @parameterized.expand([(True, False), (True, True), (False, False), (False, True)])
    def test_autotune_on_first_call_of_each_signature(self, autotune, caller_setting):
        seen = []

        def fn(x):
            seen.append(torch.backends.cudnn.benchmark)
            return x * 2

        cache = GraphCache(fn, [], autotune=autotune)
        before = torch.backends.cudnn.benchmark
        try:
            torch.backends.cudnn.benchmark = caller_setting
            for shape, first in (((2, 3), True), ((2, 3), False), ((4, 3), True), ((2, 3), False)):
                x = torch.ones(shape)
                torch.testing.assert_close(cache(x), x * 2)
                self.assertEqual(seen.pop(), (autotune and first) or caller_setting, f"{shape}, first {first}")
                self.assertEqual(torch.backends.cudnn.benchmark, caller_setting)
            with torch.autocast("cpu", dtype=torch.bfloat16):  # another autocast state: another signature
                cache(torch.ones(2, 3))
            self.assertEqual(seen.pop(), autotune or caller_setting)
            self.assertEqual(len(cache), 0)  # CPU calls capture nothing
        finally:
            torch.backends.cudnn.benchmark = before

    def test_failed_first_call_is_tuned_again(self):
        calls = []

        def fn(x):
            calls.append(torch.backends.cudnn.benchmark)
            if len(calls) == 1:
                raise RuntimeError("out of memory")
            return x

        cache = GraphCache(fn, [], autotune=True)
        before = torch.backends.cudnn.benchmark
        try:
            torch.backends.cudnn.benchmark = False
            with self.assertRaisesRegex(RuntimeError, "out of memory"):
                cache(torch.ones(1))
            self.assertFalse(torch.backends.cudnn.benchmark)  # restored though the call raised
            cache(torch.ones(1))
            self.assertEqual(calls, [True, True])
        finally:
            torch.backends.cudnn.benchmark = before

    def test_cudnn_autotuning_scope(self):
        before = torch.backends.cudnn.benchmark
        try:
            for caller in (False, True):
                torch.backends.cudnn.benchmark = caller
                with cudnn_autotuning():
                    self.assertTrue(torch.backends.cudnn.benchmark)
                with cudnn_autotuning(False):
                    self.assertEqual(torch.backends.cudnn.benchmark, caller)
                self.assertEqual(torch.backends.cudnn.benchmark, caller)
        finally:
            torch.backends.cudnn.benchmark = before


@unittest.skipUnless(torch.cuda.is_available(), "CUDA graphs need a GPU")
class TestGraphCache(unittest.TestCase):
    @parameterized.expand([(True,), (False,)])
    def test_replays_and_output(self, copy_output):
        weight = torch.randn(8, 8, device="cuda")
        cache = GraphCache(lambda x: (x @ weight).relu(), [weight], copy_output=copy_output)
        x1, x2 = torch.randn(4, 8, device="cuda"), torch.randn(4, 8, device="cuda")
        y1 = cache(x1)
        kept = y1.clone()
        y2 = cache(x2)
        self.assertEqual(len(cache), 1)
        torch.testing.assert_close(y2, (x2 @ weight).relu())
        # a copy keeps the first result; the lent buffer holds the latest replay's
        self.assertEqual(y1 is y2, not copy_output)
        torch.testing.assert_close(y1, kept if copy_output else y2)
        cache(torch.randn(2, 8, device="cuda"))
        self.assertEqual(len(cache), 2)  # a new shape: a second graph

    @parameterized.expand([(True,), (False,)])
    def test_tuple_output(self, copy_output):
        # the fused branch of class + point prompts returns both branches' features from one graph, the class
        # features a tuple of their own
        weight = torch.randn(8, 8, device="cuda")
        cache = GraphCache(lambda x: (x @ weight, ((x @ weight).relu(),)), [weight], copy_output=copy_output)
        x1, x2 = torch.randn(4, 8, device="cuda"), torch.randn(4, 8, device="cuda")
        a1, (b1,) = cache(x1)
        kept = (a1.clone(), b1.clone())
        a2, (b2,) = cache(x2)
        torch.testing.assert_close(a2, x2 @ weight)
        torch.testing.assert_close(b2, (x2 @ weight).relu())
        self.assertEqual(a1 is a2 and b1 is b2, not copy_output)
        torch.testing.assert_close((a1, b1), kept if copy_output else (a2, b2))

    def test_recaptures_when_a_parameter_changes(self):
        weight = torch.randn(8, 8, device="cuda")
        copies = {}

        def fn(x):  # reads a copy made per parameter version, as the fused path's padded weights are
            if weight._version not in copies:
                copies[weight._version] = weight * 1.0
            return x @ copies[weight._version]

        cache = GraphCache(fn, [weight])
        x = torch.randn(4, 8, device="cuda")
        torch.testing.assert_close(cache(x), x @ weight)
        weight.mul_(2.0)  # bumps the version: a graph kept would read the old copy
        torch.testing.assert_close(cache(x), x @ weight)

    def test_beyond_max_batch_runs_eagerly(self):
        weight = torch.randn(8, 8, device="cuda")
        cache = GraphCache(lambda x: x @ weight, [weight], max_batch=2)
        big = torch.randn(3, 8, device="cuda")
        torch.testing.assert_close(cache(big), big @ weight)
        self.assertEqual(len(cache), 0)
        cache(torch.randn(2, 8, device="cuda"))
        self.assertEqual(len(cache), 1)

if __name__ == "__main__":
    unittest.main()
