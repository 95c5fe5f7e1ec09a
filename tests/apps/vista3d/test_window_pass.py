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
"""The network's passes over a preprocessed image: streamed, full logits and clicks agree, and say what ran."""

from __future__ import annotations

import unittest

import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.core.postprocess import logits_to_outputs
from monai.apps.vista3d.core.preprocess import preprocess_like_bundle
from monai.apps.vista3d.core.progress import stop_between_windows
from monai.apps.vista3d.core.window_pass import PassSettings, WindowPasses
from monai.apps.vista3d.errors import PromptError
from tests.apps.vista3d.stub_vista import HU, StubVista, phantom

ROI = (16, 16, 16)


def _passes(sw_batch_size=2) -> tuple[WindowPasses, StubVista]:
    net = StubVista(HU)
    settings = PassSettings(ROI, overlap=0.25, sw_batch_size=sw_batch_size, amp=False, progress=False, timing=True)
    return WindowPasses(net, torch.device("cpu"), settings), net


def _image() -> torch.Tensor:
    img, aff, _ = phantom((24, 22, 20), np.eye(3), (1.5, 1.5, 1.5))
    return preprocess_like_bundle(torch.from_numpy(img)[None], aff)[0]


class TestWindowPasses(unittest.TestCase):
    @parameterized.expand([(1,), (3,), ("auto",)])
    def test_streamed_equals_the_logits_path(self, sw_batch_size):
        passes, _ = _passes(sw_batch_size)
        x = _image()
        labels, masks, streamed = passes.stream(x, [1, 3], masks=True)
        logits, full = passes.logits(x, [1, 3])
        ref_labels, ref_masks = logits_to_outputs(logits, [1, 3], masks=True)
        torch.testing.assert_close(labels, ref_labels)
        self.assertEqual(labels.dtype, torch.int16)
        self.assertTrue(set(torch.unique(labels).tolist()) >= {1, 3})
        for i in (1, 3):
            torch.testing.assert_close(masks[i], ref_masks[i])
        self.assertEqual(streamed.windows, full.windows)
        self.assertGreater(full.windows, 1)
        self.assertIn("inference/total", full.stages)

    def test_windows_counted_per_call(self):
        passes, net = _passes(2)
        _, run = passes.logits(_image(), [1])
        self.assertEqual(run.windows, sum(passes.counting.batches))
        self.assertEqual(net.calls, len(passes.counting.batches))
        self.assertEqual(run.sw_batch_size, 2)

    def test_clicks_run_windows_around_the_points(self):
        passes, _ = _passes()
        x = _image()
        coords = torch.tensor([[[8.0, 8.0, 8.0]]])
        logits, run = passes.logits(x, None, coords, torch.tensor([[1]]))
        self.assertEqual(tuple(logits.shape[2:]), tuple(x.shape[1:]))
        self.assertEqual(run.windows, 1)

    def test_no_classes_is_refused(self):
        passes, net = _passes()
        with self.assertRaisesRegex(PromptError, "no classes"):
            passes.stream(_image(), [], masks=False)
        self.assertEqual(net.calls, 0)

    @parameterized.expand([("stream",), ("logits",), ("clicks",)])
    def test_a_check_stops_the_pass_between_windows(self, kind):
        # the caller's check runs before every window batch of every kind of pass: raising there stops the pass
        # with the windows run so far, and once the block ends the thread has no check left
        passes, net = _passes(1)
        x = _image()
        seen = []

        class Stop(Exception):
            pass

        def check():
            seen.append(net.calls)
            if len(seen) == 3:
                raise Stop()

        coords = torch.tensor([[[4.0, 4.0, 4.0], [12.0, 12.0, 12.0], [18.0, 16.0, 14.0], [8.0, 8.0, 8.0]]])
        run = {"stream": lambda: passes.stream(x, [1, 3], masks=False), "logits": lambda: passes.logits(x, [1]),
               "clicks": lambda: passes.logits(x, None, coords, torch.ones((1, 4), dtype=torch.long))}[kind]
        with stop_between_windows(check), self.assertRaises(Stop):
            run()
        self.assertEqual(seen, [0, 1, 2])  # checked before each window; the third check stopped the pass
        self.assertEqual(net.calls, 2)
        run()  # no check left on this thread: the whole pass runs
        self.assertGreater(net.calls, 4)

    def test_no_autocast_on_the_cpu(self):
        passes, _ = _passes()
        passes = WindowPasses(passes.network, torch.device("cpu"), PassSettings(ROI, 0.25, 1, True, False, False))
        with passes.autocast():
            self.assertFalse(torch.is_autocast_enabled())


if __name__ == "__main__":
    unittest.main()
