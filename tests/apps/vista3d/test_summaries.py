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
"""Summaries tell the truth: concurrent whole runs, outputs checked on disk, reruns (issue 34, item 4)."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import nibabel as nib
import numpy as np

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.batch.summary_merge import merge_summaries
from tests.apps.vista3d.test_batch import tiny_segment
from tests.apps.vista3d.test_cli import run_main


class TestSummaries(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.cts = []
        for k in range(4):
            data = np.full((8, 8, 6), 40 * k, dtype=np.int16)
            path = self.dir / "in" / f"ct{k}.nii.gz"
            path.parent.mkdir(exist_ok=True)
            nib.save(nib.Nifti1Image(data, np.eye(4)), path)
            self.cts.append(path)
        self.out = self.dir / "out"

    def tearDown(self):
        self.tmp.cleanup()

    def _summary(self) -> tuple[int, str, str]:
        return run_main(["summary", self.out])

    def test_two_whole_runs_at_once_keep_both_summaries(self):
        """Run B writes its summary after run A, which finished while B was running: neither replaces the other."""
        first, second = self.cts[:2], self.cts[2:]

        def segment_and_start_another(image, geometry):
            if not (self.out / "summary.json").exists():  # A starts and finishes while B segments its first image
                self.assertEqual(run_batch(first, self.out, tiny_segment, quiet=True).exit_code, 0)
            return tiny_segment(image, geometry)

        b = run_batch(second, self.out, segment_and_start_another, quiet=True)
        self.assertEqual(b.exit_code, 0)
        self.assertNotEqual(b.summary_path.name, "summary.json")
        self.assertEqual(json.loads((self.out / "summary.json").read_text())["done"], 2)
        code, out, err = self._summary()
        self.assertEqual(code, 0, err)
        self.assertIn("4 of 4 image(s) have an output", out)

    def test_summary_checks_the_disk(self):
        self.assertEqual(run_batch(self.cts, self.out, tiny_segment, quiet=True).exit_code, 0)
        self.assertEqual(self._summary()[0], 0)
        gone = self.out / "ct1" / "ct1_trans.nii.gz"
        gone.unlink()
        cut = self.out / "ct2" / "ct2_trans.nii.gz"
        cut.write_bytes(cut.read_bytes()[:40])
        code, out, err = self._summary()
        self.assertEqual(code, 1)
        self.assertIn("2 of 4 image(s) have an output", out)
        self.assertIn(f"{gone}: missing", out)
        self.assertIn(f"{cut}: incomplete", out)
        self.assertIn("2 of 4 image(s) have no output", err)
        totals = merge_summaries(self.out)["totals"]
        self.assertEqual((totals["done"], totals["not_on_disk"], totals["complete"]), (2, 2, False))

    def test_rerun_keeps_done_as_done(self):
        self.assertEqual(run_batch(self.cts[:2], self.out, tiny_segment, quiet=True).exit_code, 0)
        rerun = run_batch(self.cts, self.out, tiny_segment, quiet=True)
        self.assertEqual((rerun.done, rerun.skipped), (2, 2))  # what this run did
        saved = json.loads((self.out / "summary.json").read_text())
        self.assertEqual((saved["done"], saved["skipped"]), (4, 0))  # what the folder holds
        self.assertEqual(sum(bool(r.get("earlier_run")) for r in saved["per_image"]), 2)
        code, out, _ = self._summary()
        self.assertEqual(code, 0)
        self.assertIn("4 of 4 image(s) have an output", out)

    def test_rerun_of_a_finished_part_keeps_its_done(self):
        for _ in range(2):
            self.assertEqual(run_batch(self.cts, self.out, tiny_segment, quiet=True, part=(0, 2)).exit_code, 0)
        saved = json.loads((self.out / "summary.part-0-of-2.json").read_text())
        self.assertEqual((saved["done"], saved["skipped"]), (2, 0))
        self.assertEqual(merge_summaries(self.out)["totals"]["done"], 2)



class TestSummaryRecordsHowOutputsWereMade(unittest.TestCase):
    def test_job_weights_and_versions(self):
        import hashlib

        import torch

        import monai
        from monai.apps.vista3d import PipelineOptions, SegmentJob
        from monai.networks.nets import vista3d132

        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            image = tmp / "ct.nii.gz"
            nib.save(nib.Nifti1Image(np.full((20, 20, 16), 40, dtype=np.int16), np.eye(4)), image)
            weights = tmp / "model.pt"
            torch.manual_seed(0)
            torch.save(vista3d132(encoder_embed_dim=8).state_dict(), weights)
            options = PipelineOptions(roi_size=32, overlap=0.5, output_dtype="int16")
            job = SegmentJob("liver,spleen", options, "cpu", weights=weights, network_kwargs={"encoder_embed_dim": 8})
            result = run_batch([image], tmp / "out", job)
            self.assertEqual(result.done, 1, result.records)
            settings = json.loads(result.summary_path.read_text())["settings"]
            digest = hashlib.sha256(weights.read_bytes()).hexdigest()
            size = weights.stat().st_size
        self.assertEqual(settings["weights"], {"path": str(weights), "bytes": size, "sha256": digest})
        self.assertEqual((settings["classes"], settings["network"], settings["device"]), ([1, 3], "vista3d132", "cpu"))
        self.assertEqual(settings["options"]["roi_size"], [32, 32, 32])
        self.assertEqual((settings["options"]["overlap"], settings["options"]["output_dtype"]), (0.5, "int16"))
        self.assertEqual(settings["versions"], {"monai": monai.__version__, "torch": torch.__version__})

    def test_a_callers_function(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            image = tmp / "ct.nii.gz"
            nib.save(nib.Nifti1Image(np.full((8, 8, 6), 40, dtype=np.int16), np.eye(4)), image)
            result = run_batch([image], tmp / "out", tiny_segment)
            settings = json.loads(result.summary_path.read_text())["settings"]
        self.assertEqual((settings["segmenter"], settings["output_dtype"], settings["weights"]),
                         ("FunctionSegmenter", "uint8", None))

if __name__ == "__main__":
    unittest.main()
