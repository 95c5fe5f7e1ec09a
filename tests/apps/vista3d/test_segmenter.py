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
"""SegmentJob: the pipeline a run builds, resolved and checked once where the run enters (CLI or run_batch)."""

from __future__ import annotations

import dataclasses
import io
import pathlib
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.batch.segmenter import (
    FunctionSegmenter,
    PipelineSegmenter,
    as_segmenter,
)
from monai.apps.vista3d.batch.summary import BatchResult
from monai.apps.vista3d.cli.main import main
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.config import PipelineOptions, SettingError
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.core.prompts import Prompt
from tests.apps.vista3d.stub_vista import StubVista

TINY = {"encoder_embed_dim": 8}


class TestSegmentJob(unittest.TestCase):
    @parameterized.expand([
        ("per_class", {"prompt": Prompt(None, [[1, 2, 3]], [1]), "options": PipelineOptions(per_class=True)}),
        ("encoder_embed_dim", {"network_kwargs": {"encoder_embed_dim": 12}}),
        ("roi_size", {"options": PipelineOptions(roi_size=40)}),  # vista3d132 halves the window four times
    ])
    def test_bad_setting_names_its_field(self, field, kwargs):
        with self.assertRaises(SettingError) as ctx:
            SegmentJob(**{"device": "cpu", "network_kwargs": TINY, **kwargs})
        self.assertEqual(ctx.exception.field, field)

    def test_resolved_once(self):
        job = SegmentJob("liver,3", PipelineOptions(roi_size=32, per_class=True), "cpu", network_kwargs=TINY)
        self.assertEqual(job.prompt.label_ids, [1, 3])
        self.assertEqual(job.device, torch.device("cpu"))
        self.assertEqual(job.mask_ids, [1, 3])
        self.assertIsNone(SegmentJob("liver", device="cpu", network_kwargs=TINY).mask_ids)
        with self.assertRaises(AttributeError):  # frozen: what was checked stays as checked
            job.device = "cuda"  # type: ignore[misc]

    def test_weights_file_checked_before_any_work(self):
        with self.assertRaises(SettingError) as ctx:
            SegmentJob(device="cpu", network_kwargs=TINY, weights="/no/such/model.pt")
        self.assertEqual(ctx.exception.field, "weights")
        self.assertIn("/no/such/model.pt", str(ctx.exception))

    def test_builds_the_pipeline_it_describes(self):
        stub = StubVista({1: 60.0})
        job = SegmentJob([1], PipelineOptions(roi_size=32, sw_batch_size=2, nonfinite="error"), "cpu", network=stub)
        built = job.build()
        self.assertIs(built.network, stub)
        self.assertEqual(built.options, dataclasses.replace(job.options, amp=False))  # amp: off on a CPU
        self.assertEqual(built.device, job.device)


class TestSegmenters(unittest.TestCase):
    """What run_batch takes: a job, or a segmenter that says once how its images are read and written."""

    def test_none_is_the_default_job(self):
        self.assertIsInstance(as_segmenter(None), SegmentJob)

    def test_a_job_says_how_images_are_read_and_written(self):
        job = SegmentJob("liver", PipelineOptions(roi_size=32, nonfinite="error", per_class=True), "cpu",
                         network=StubVista({1: 60.0}))
        self.assertIs(as_segmenter(job), job)
        self.assertEqual((job.device, job.nonfinite, job.output_dtype, job.mask_ids),
                         (torch.device("cpu"), "error", "uint8", [1]))

    def test_a_pipeline_keeps_its_settings(self):
        pipe = Vista3DPipeline(StubVista({1: 60.0}), device="cpu", roi_size=32, output_dtype="int16")
        seg = PipelineSegmenter(pipe, Prompt([1]))
        self.assertIs(as_segmenter(seg), seg)
        self.assertEqual((seg.device, seg.output_dtype, seg.nonfinite, seg.mask_ids),
                         (torch.device("cpu"), "int16", "air", None))
        with self.assertRaisesRegex(TypeError, "pipeline_segment_fn"):  # a bare pipeline has no prompt
            as_segmenter(pipe)

    def test_a_function_runs_on_the_cpu(self):
        seg = as_segmenter(lambda image, geometry: image[0] > 0)
        self.assertIsInstance(seg, FunctionSegmenter)
        self.assertEqual((seg.device, seg.output_dtype, seg.nonfinite, seg.mask_ids),
                         (torch.device("cpu"), "uint8", "air", None))
        own = FunctionSegmenter(lambda image, geometry: image[0] > 0, output_dtype="float32", nonfinite="error")
        self.assertEqual((own.output_dtype, own.nonfinite), ("float32", "error"))
        with self.assertRaises(SettingError):
            FunctionSegmenter(lambda image, geometry: image, output_dtype="int64")
        with self.assertRaises(TypeError):
            as_segmenter("not callable")


class TestRunBatchTakesAJob(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.image = write_phantom(self.tmp / "ct.nii.gz", (24, 24, 24), seed=0)

    def _job(self, **options) -> SegmentJob:
        return SegmentJob([1], PipelineOptions(roi_size=32, **options), "cpu", network=StubVista({1: 60.0}))

    def test_same_as_its_pipeline(self):
        job = self._job(output_dtype="int16")
        result = run_batch([self.image], self.tmp / "o", job)
        self.assertEqual(result.done, 1, result.records)
        saved = nib.load(result.records[0]["output"])
        self.assertEqual(saved.get_data_dtype(), np.int16)
        pipe = Vista3DPipeline(StubVista({1: 60.0}), device="cpu", roi_size=32)
        np.testing.assert_array_equal(np.asanyarray(saved.dataobj), pipe(str(self.image), classes=[1]).numpy())

    @parameterized.expand([("pipeline_kwargs", {"roi_size": 64}), ("nonfinite", "air"), ("device", "cuda"),
                           ("output_dtype", "int16")])
    def test_the_job_is_the_one_place_of_its_settings(self, name, value):
        """What segments, where and how it reads and writes is the job's: run_batch has no second place for it."""
        with self.assertRaisesRegex(TypeError, name):
            run_batch([self.image], self.tmp / "o", self._job(nonfinite="error"), **{name: value})
        self.assertFalse((self.tmp / "o").exists())


class TestCommandLineBuildsOneJob(unittest.TestCase):
    def test_flags_become_the_job(self):
        with tempfile.TemporaryDirectory() as tmp:
            image = write_phantom(pathlib.Path(tmp) / "ct.nii.gz", (24, 24, 24), seed=0)
            given = {}

            def fake_run_batch(items, output_dir, segment_fn=None, **kwargs):
                given.update(kwargs, segment_fn=segment_fn)
                return BatchResult([], world_size=1)

            argv = ["-i", str(image), "-o", str(pathlib.Path(tmp) / "out"), "--device", "cpu", "--embed-dim", "8",
                    "--roi-size", "32", "--strict", "--per-class", "--classes", "liver,spleen", "--output-dtype",
                    "int16", "--sw-batch-size", "3", "--quiet"]
            with mock.patch("monai.apps.vista3d.batch.run.run_batch", fake_run_batch), \
                    redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
                self.assertEqual(main(argv), 0)
        job = given["segment_fn"]
        self.assertIsInstance(job, SegmentJob)
        self.assertEqual(job.options, PipelineOptions(roi_size=32, sw_batch_size=3, output_dtype="int16",
                                                      nonfinite="error", per_class=True))
        self.assertEqual((job.prompt.label_ids, job.device, job.network_kwargs), ([1, 3], torch.device("cpu"), TINY))
        self.assertFalse(any(k in given for k in ("pipeline_kwargs", "nonfinite", "output_dtype", "device")))


if __name__ == "__main__":
    unittest.main()
