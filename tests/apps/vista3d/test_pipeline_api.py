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
"""The Python API's options: checked where they are given, and readable back (issue 34, item 6)."""

from __future__ import annotations

import dataclasses
import unittest
from unittest import mock

import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.config import PipelineOptions, SettingError
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from tests.apps.vista3d.stub_vista import HU, StubVista, phantom


def _pipe(**kw):
    return Vista3DPipeline(network=StubVista(HU), device="cpu", roi_size=(32, 32, 32), **kw)


class TestPipelineOptions(unittest.TestCase):
    def test_replace_refuses_a_typo_like_the_constructor(self):
        with self.assertRaises(TypeError):
            _pipe(per_clas=True)
        pipe = _pipe()
        with self.assertRaisesRegex(TypeError, "per_clas"):
            pipe.replace(per_clas=True)
        self.assertFalse(pipe.per_class)  # nothing changed

    def test_overlap_one_refused_by_the_constructor(self):
        for overlap in (1.0, -0.1):
            with self.assertRaisesRegex(ValueError, r"overlap must be in \[0, 1\)"):
                _pipe(overlap=overlap)
        with self.assertRaisesRegex(ValueError, "overlap must be"):
            _pipe().replace(overlap=1.0)

    def test_options_read_back(self):
        pipe = _pipe(sw_batch_size=3, per_class=True, overlap=0.5)
        opts = pipe.options
        self.assertIsInstance(opts, PipelineOptions)
        self.assertEqual((opts.sw_batch_size, opts.per_class, opts.overlap, opts.roi_size), (3, True, 0.5, (32,) * 3))
        self.assertIs(opts.amp, False)  # resolved for the CPU
        self.assertEqual(pipe.replace(streaming=False).options, dataclasses.replace(opts, streaming=False))
        self.assertEqual(_pipe(options=opts).options, opts)  # a pipeline built from them has the same ones

    @parameterized.expand([
        ("roi_size", {"roi_size": (32, 0, 32)}), ("roi_size", {"roi_size": "big"}), ("overlap", {"overlap": 1.0}),
        ("sw_batch_size", {"sw_batch_size": 0}), ("sw_batch_size", {"sw_batch_size": 2.5}),
        ("output_dtype", {"output_dtype": "float16"}), ("nonfinite", {"nonfinite": "zero"}),
    ])
    def test_checked_when_built(self, field, bad):
        with self.assertRaises(SettingError) as caught:
            PipelineOptions(**bad)
        self.assertEqual(caught.exception.field, field)
        self.assertTrue(str(caught.exception).startswith(f"{field} "))

    def test_resolved_when_built(self):
        opts = PipelineOptions(roi_size=64, overlap="0.5", sw_batch_size="4", amp=1, per_class=np.bool_(True))
        self.assertEqual((opts.roi_size, opts.overlap, opts.sw_batch_size), ((64, 64, 64), 0.5, 4))
        self.assertIs(opts.amp, True)
        self.assertIs(opts.per_class, True)
        self.assertIsNone(PipelineOptions().amp)  # decided by the pipeline's device
        self.assertEqual(PipelineOptions(sw_batch_size="auto").sw_batch_size, "auto")

    def test_window_multiple_is_the_pipelines_check(self):
        opts = PipelineOptions(roi_size=40)  # any positive size: the multiple of 16 depends on the network
        self.assertEqual(opts.roi_size, (40, 40, 40))
        from monai.networks.nets import vista3d132

        with self.assertRaisesRegex(SettingError, "multiples of 16"):
            Vista3DPipeline(network=vista3d132(encoder_embed_dim=8), device="cpu", options=opts)

    def test_mask_of_a_class_not_requested(self):
        img, aff, _ = phantom((24, 24, 16), np.eye(3), (1.5, 1.5, 1.5))
        result = _pipe(per_class=True).segment(torch.from_numpy(img), aff, classes=[1, 3])
        self.assertEqual(tuple(result.masks[1].shape), img.shape)
        with self.assertRaisesRegex(KeyError, r"no mask for label 25: the masks are of the requested classes \[1, 3\]"):
            result.masks[25]


class TestOnePlanPerImage(unittest.TestCase):
    @parameterized.expand([("streamed", True), ("full_logits", False)])
    def test_windows_planned_once(self, _, streaming):
        """The pass plans its windows; the progress bar takes its total from that plan, not from one of its own."""
        from monai.apps.vista3d.core.progress import WindowProgress
        from monai.inferers import windows

        planned, totals, real, original = [], [], windows.SlidingWindowPlan.__init__, WindowProgress.planned

        def counted(plan, *args, **kwargs):  # every plan, wherever it is made, is built by this class
            planned.append(args[0] if args else kwargs.get("image_size"))
            real(plan, *args, **kwargs)

        def seen(progress, plan):
            totals.append(plan.total_windows)
            original(progress, plan)

        img, aff, _ = phantom((72, 72, 56), np.eye(3), (1.0, 1.0, 1.0))  # several 32^3 windows on the 1.5 mm grid
        pipe = _pipe(streaming=streaming, progress=True)
        with mock.patch.object(windows.SlidingWindowPlan, "__init__", counted), \
                mock.patch.object(WindowProgress, "planned", seen), mock.patch("sys.stderr"):
            result = pipe.segment(torch.from_numpy(img), aff, classes=[1])
        self.assertEqual(len(planned), 1, planned)
        self.assertEqual(totals, [result.windows])
        self.assertGreater(result.windows, 1)


if __name__ == "__main__":
    unittest.main()
