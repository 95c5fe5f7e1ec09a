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
"""run_batch reads and writes as its segmenter says (a job's options, a pipeline's, a function's own), and refuses what it
cannot run before the first image."""

from __future__ import annotations

import pathlib
import tempfile
import unittest

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.batch.segmenter import FunctionSegmenter, pipeline_segment_fn
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.config import PipelineOptions
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from tests.apps.vista3d.stub_vista import StubVista


def _pipe(**settings) -> Vista3DPipeline:
    return Vista3DPipeline(StubVista({1: 60.0, 20: -850.0}), device="cpu", roi_size=32, **settings)


class TestSegmenterSettingsAreTheRuns(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.good = write_phantom(self.tmp / "ct.nii.gz", (24, 24, 24), seed=0)
        img = nib.load(self.good)
        data = np.asanyarray(img.dataobj).astype(np.float32)
        data[3, 4, 5] = np.nan
        self.nan = self.tmp / "nan.nii.gz"
        nib.save(nib.Nifti1Image(data, img.affine), self.nan)

    def _job(self, **options) -> SegmentJob:
        return SegmentJob([1], PipelineOptions(roi_size=32, **options), "cpu", network=StubVista({1: 60.0, 20: -850.0}))

    @parameterized.expand([
        ("pipeline", lambda self: pipeline_segment_fn(_pipe(nonfinite="error"), [1])),
        ("job", lambda self: self._job(nonfinite="error")),
        ("function", lambda self: FunctionSegmenter(lambda image, geometry: image[0] > 0, nonfinite="error")),
    ])
    def test_strict_segmenter_fails_nan_images(self, _, make):
        out = self.tmp / "o"
        result = run_batch([self.nan, self.good], out, make(self))
        self.assertEqual([r["status"] for r in result.records], ["failed", "done"])
        self.assertIn("NaN", result.records[0]["error"])
        self.assertFalse((out / "nan").exists())

    def test_a_pipelines_own_output_type(self):
        result = run_batch([self.good], self.tmp / "o", pipeline_segment_fn(_pipe(output_dtype="int16"), [1]))
        self.assertEqual(result.done, 1, result.records)
        saved = nib.load(result.records[0]["output"])
        self.assertEqual(saved.get_data_dtype(), np.int16)
        np.testing.assert_array_equal(np.asanyarray(saved.dataobj), _pipe()(str(self.good), classes=[1]).numpy())

    def test_a_jobs_options_are_the_runs(self):
        job = self._job(output_dtype="float32", per_class=True, nonfinite="error")
        result = run_batch([self.good, self.nan], self.tmp / "o", job)
        self.assertEqual([r["status"] for r in result.records], ["done", "failed"], result.records)
        self.assertIn("NaN", result.records[1]["error"])
        self.assertEqual(nib.load(result.records[0]["output"]).get_data_dtype(), np.float32)
        self.assertTrue((self.tmp / "o" / "ct" / "liver.nii.gz").is_file())

    def test_a_functions_own_output_type(self):
        fn = FunctionSegmenter(lambda image, geometry: (image[0] > 0).to(torch.uint8), output_dtype="int16")
        result = run_batch([self.good], self.tmp / "o", fn)
        self.assertEqual(nib.load(result.records[0]["output"]).get_data_dtype(), np.int16)

    @parameterized.expand([("a string", "not a function"), ("a number", 3)])
    def test_not_callable_refused_before_any_image(self, _, fn):
        with self.assertRaises(TypeError) as ctx:
            run_batch([self.good], self.tmp / "o", fn)
        self.assertIn("segment_fn must be a SegmentJob, a Segmenter or a function", str(ctx.exception))
        self.assertFalse((self.tmp / "o").exists())

    def test_a_bare_pipeline_refused_before_any_image(self):
        with self.assertRaisesRegex(TypeError, "no prompt: give pipeline_segment_fn"):
            run_batch([self.good], self.tmp / "o", _pipe())
        self.assertFalse((self.tmp / "o").exists())


if __name__ == "__main__":
    unittest.main()
