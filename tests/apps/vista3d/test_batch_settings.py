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
"""run_batch takes a pipeline's settings as they are, and refuses what it cannot run before the first image."""

from __future__ import annotations

import json
import pathlib
import tempfile
import unittest

import nibabel as nib
import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.batch.segmenter import pipeline_segment_fn
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.config import PipelineOptions
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.errors import Vista3DInputError
from tests.apps.vista3d.stub_vista import StubVista


def _pipe(**settings) -> Vista3DPipeline:
    return Vista3DPipeline(StubVista({1: 60.0, 20: -850.0}), device="cpu", roi_size=32, **settings)


class TestPipelineSettingsWin(unittest.TestCase):
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

    def test_strict_pipeline_fails_nan_images(self):
        for fn in (pipeline_segment_fn(_pipe(nonfinite="error"), [1]), _pipe(nonfinite="error")):
            out = self.tmp / f"o{id(fn)}"
            result = run_batch([self.nan, self.good], out, fn, pipeline_kwargs={"classes": [1]})
            self.assertEqual([r["status"] for r in result.records], ["failed", "done"])
            self.assertIn("NaN", result.records[0]["error"])
            self.assertFalse((out / "nan").exists())

    def test_pipeline_as_segment_fn(self):
        result = run_batch([self.good], self.tmp / "o", _pipe(output_dtype="int16"), pipeline_kwargs={"classes": [1]})
        self.assertEqual(result.done, 1, result.records)
        saved = nib.load(result.records[0]["output"])
        self.assertEqual(saved.get_data_dtype(), np.int16)  # the pipeline's own output type
        np.testing.assert_array_equal(np.asanyarray(saved.dataobj), _pipe()(str(self.good), classes=[1]).numpy())

    @parameterized.expand([
        ("nonfinite", {"nonfinite": "air"}, {"nonfinite": "error"}),
        ("output_dtype", {"output_dtype": "int16"}, {"output_dtype": "uint8"}),
        ("device", {"device": "cuda"}, {}),
    ])
    def test_disagreeing_setting_refused_up_front(self, name, given, own):
        for fn in (_pipe(**own), pipeline_segment_fn(_pipe(**own), [1])):
            with self.assertRaises(ValueError) as ctx:
                run_batch([self.good], self.tmp / "o", fn, **given)
            msg = str(ctx.exception)
            self.assertIn(f"{name}=", msg)
            self.assertIn(f"pipeline's {name}=", msg)
            self.assertNotIn("\n", msg)
        self.assertFalse((self.tmp / "o").exists())

    def test_options_in_pipeline_kwargs_are_the_runs(self):
        # a PipelineOptions given as options= decides the run's output type, masks and NaN policy, as its keywords
        # would (they were read from the keywords only: a float32 label map was written as uint8, and no masks)
        opts = PipelineOptions(roi_size=32, output_dtype="float32", per_class=True, nonfinite="error")
        kw = {"network": StubVista({1: 60.0, 20: -850.0}), "options": opts, "classes": [1]}
        result = run_batch([self.good, self.nan], self.tmp / "o", pipeline_kwargs=kw)
        self.assertEqual([r["status"] for r in result.records], ["done", "failed"], result.records)
        self.assertIn("NaN", result.records[1]["error"])
        self.assertEqual(nib.load(result.records[0]["output"]).get_data_dtype(), np.float32)
        self.assertTrue((self.tmp / "o" / "ct" / "liver.nii.gz").is_file())
        beside = run_batch([self.good], self.tmp / "b", pipeline_kwargs={**kw, "output_dtype": "int16"})
        self.assertEqual(nib.load(beside.records[0]["output"]).get_data_dtype(), np.int16)  # a keyword beside wins
        with self.assertRaisesRegex(ValueError, "nonfinite='air' disagrees with the pipeline's nonfinite='error'"):
            run_batch([self.good], self.tmp / "c", pipeline_kwargs=kw, nonfinite="air")

    def test_built_pipeline_takes_one_nonfinite(self):
        with self.assertRaises(ValueError) as ctx:
            run_batch([self.good], self.tmp / "o", pipeline_kwargs={"network": StubVista({1: 60.0}), "roi_size": 32,
                                                                    "nonfinite": "error"}, nonfinite="air",
                      device="cpu")
        self.assertIn("nonfinite='air'", str(ctx.exception))
        result = run_batch([self.nan], self.tmp / "o", pipeline_kwargs={
            "network": StubVista({1: 60.0}), "roi_size": 32, "nonfinite": "error", "classes": [1]}, device="cpu")
        self.assertEqual(result.records[0]["status"], "failed")
        summary = json.loads(result.summary_path.read_text())
        self.assertEqual(summary["failed"], 1)

    @parameterized.expand([("a string", "not a function"), ("a number", 3)])
    def test_not_callable_refused_before_any_image(self, _, fn):
        with self.assertRaises(TypeError) as ctx:
            run_batch([self.good], self.tmp / "o", fn)
        self.assertIn("segment_fn must be callable", str(ctx.exception))
        self.assertFalse((self.tmp / "o").exists())

    def test_pipeline_settings_in_kwargs_refused_with_a_pipeline(self):
        with self.assertRaises(ValueError) as ctx:
            run_batch([self.good], self.tmp / "o", _pipe(), pipeline_kwargs={"classes": [1], "roi_size": 64})
        self.assertIn("roi_size", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
