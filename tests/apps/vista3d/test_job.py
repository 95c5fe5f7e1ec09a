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
"""One validation of the job's settings: Python names the field, the command line names the flag."""

from __future__ import annotations

import io
import pathlib
import tempfile
import unittest
from contextlib import redirect_stderr

import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.cli.main import main
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.config import (
    PipelineOptions,
    SettingError,
    check_output_dtype,
    check_roi_size,
    check_sw_batch_size,
)
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.inferers.batch_size import check_sw_batch_size as inferer_check
from tests.apps.vista3d.stub_vista import StubVista

# (field, bad value in Python, the flag and its bad text on the command line)
CASES = [
    ("roi_size", 50, "--roi-size", "50"),
    ("overlap", 1.0, "--overlap", "1.0"),
    ("sw_batch_size", 0, "--sw-batch-size", "0"),
    ("encoder_embed_dim", 12, "--embed-dim", "12"),
    ("unreached_label", 1, "--unreached-label", "1"),
]



def _job(network_kwargs: dict, **options) -> SegmentJob:
    return SegmentJob("everything", PipelineOptions(**options), "cpu", network_kwargs=network_kwargs, warn_random=False)

class TestOneValidation(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.image = write_phantom(self.tmp / "ct.nii.gz", (24, 24, 24), seed=0)

    @parameterized.expand(CASES)
    def test_python_names_the_field(self, field, value, flag, _):
        network = {"encoder_embed_dim": value} if field == "encoder_embed_dim" else {"encoder_embed_dim": 8}
        given = {} if field == "encoder_embed_dim" else {field: value}
        for build in (lambda: Vista3DPipeline(device="cpu", network_kwargs=network, warn_random=False, **given),
                      lambda: run_batch([self.image], self.tmp / "o", _job(network, **given))):
            with self.assertRaises(SettingError) as ctx:
                build()
            self.assertEqual(ctx.exception.field, field)
            self.assertTrue(str(ctx.exception).startswith(f"{field} must be"), str(ctx.exception))
            self.assertNotIn(flag, str(ctx.exception))
        self.assertFalse((self.tmp / "o").exists())

    @parameterized.expand(CASES)
    def test_cli_names_the_flag(self, field, _, flag, text):
        err = io.StringIO()
        argv = ["-i", str(self.image), "-o", str(self.tmp / "c"), "--embed-dim", "8", "--device", "cpu", "--quiet",
                flag, text]  # (a second --embed-dim replaces the first)
        with redirect_stderr(err):
            self.assertEqual(main(argv), 2)
        lines = [x for x in err.getvalue().splitlines() if x.startswith("error:")]
        self.assertEqual(len(lines), 1, err.getvalue())
        self.assertIn(f"error: {flag} must be", lines[0])
        self.assertFalse(lines[0].startswith(f"error: {field}"), lines[0])
        self.assertFalse((self.tmp / "c").exists())

    @parameterized.expand([(128, (128, 128, 128)), ((64, 32, 16), (64, 32, 16)), ([16] * 3, (16, 16, 16))])
    def test_roi_size_resolved(self, value, expected):
        self.assertEqual(check_roi_size(value, 16), expected)

    @parameterized.expand([("auto", "auto"), (" AUTO ", "auto"), (4, 4), ("2", 2), (np.int64(3), 3)])
    def test_sw_batch_size_resolved(self, value, expected):
        self.assertEqual(check_sw_batch_size(value), expected)

    @parameterized.expand([(True,), (2.0,), (0,), ("-1",), ("many",), (None,)])
    def test_sw_batch_size_one_rule(self, value):
        """The app's check and the inferers' are one rule: the same values pass, the same are refused."""
        with self.assertRaises(SettingError) as ctx:
            check_sw_batch_size(value)
        self.assertEqual(ctx.exception.field, "sw_batch_size")
        with self.assertRaises(ValueError):
            inferer_check(value)

    def test_output_dtypes_listed_once(self):
        from monai.apps.vista3d.cli import main as cli

        parser = cli.build_parser()
        choices = next(a.choices for sub in parser._subparsers._group_actions for p in sub.choices.values()
                       for a in p._actions if "--output-dtype" in a.option_strings)
        for dtype in choices:
            self.assertEqual(check_output_dtype(dtype), dtype)
        with self.assertRaises(SettingError):
            check_output_dtype("int64")

    def test_stub_network_skips_the_vista_multiple(self):
        pipe = Vista3DPipeline(StubVista({1: 60.0}), device="cpu", roi_size=20)
        self.assertEqual(pipe.roi_size, (20, 20, 20))


if __name__ == "__main__":
    unittest.main()
