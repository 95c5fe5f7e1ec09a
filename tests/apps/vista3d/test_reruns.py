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
"""Nothing this program writes is read back as a CT: a rerun does no new work (issue 34, item 1)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
import threading
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.batch.inputs import collect_inputs
from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.errors import OutputPathError
from monai.apps.vista3d.io.nifti import load_image
from monai.apps.vista3d.io.nifti_write import is_vista3d_output, read_output_record, save_label_map
from tests.apps.vista3d.stub_vista import StubVista, phantom, stub_job
from tests.apps.vista3d.test_cli import run_main

FLAGS = ["--embed-dim", "8", "--roi-size", "32", "--classes", "liver,spleen", "--device", "cpu", "--quiet"]


def _niftis(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.nii*"))


class TestReruns(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        img, aff, _ = phantom((24, 24, 16), np.eye(3), (1.5, 1.5, 1.5))
        self.pcin = self.dir / "pcin"
        (self.pcin / "a").mkdir(parents=True)
        nib.save(nib.Nifti1Image(np.round(img).astype(np.int16), aff), self.pcin / "a" / "ct.nii.gz")

    def tearDown(self):
        self.tmp.cleanup()

    @parameterized.expand([("inside", "seg"), ("same", "")])
    def test_per_class_reruns_do_no_new_work(self, _, sub):
        """``-i pcin -o pcin/seg --per-class`` (and ``-o pcin``) three times: one image, the same files."""
        out = self.pcin / sub
        code, _, err = run_main(["-i", self.pcin, "-o", out, *FLAGS, "--per-class"])
        self.assertEqual(code, 0, err)
        first = _niftis(self.pcin)
        self.assertEqual(len(first), 4)  # the CT, its label map and two masks
        for _ in range(2):
            code, _, err = run_main(["-i", self.pcin, "-o", out, *FLAGS, "--per-class"])
            self.assertEqual(code, 0, err)
            self.assertEqual(_niftis(self.pcin), first)
        self.assertEqual([p.name for p in collect_inputs(self.pcin)], ["ct.nii.gz"])
        marked = [p for p in first if is_vista3d_output(self.pcin / p)]
        self.assertEqual(len(marked), 3)  # every output carries the mark, the CT does not
        self.assertEqual(nib.load(self.pcin / marked[0]).header.get_intent()[0], "label")

    def test_an_output_named_explicitly_is_still_segmented(self):
        code, _, err = run_main(["-i", self.pcin, "-o", self.dir / "out", *FLAGS])
        self.assertEqual(code, 0, err)
        labels = self.dir / "out" / "a" / "ct" / "ct_trans.nii.gz"
        code, _, err = run_main(["-i", labels, "-o", self.dir / "again", *FLAGS])
        self.assertEqual(code, 0, err)
        self.assertTrue((self.dir / "again" / "ct_trans" / "ct_trans_trans.nii.gz").is_file())


class TestRerunSettings(unittest.TestCase):
    """A rerun skips an output only when it was made with this run's settings (kept in each label map's header)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.dir = Path(self._tmp.name)
        img, aff, _ = phantom((24, 24, 16), np.eye(3), (1.5, 1.5, 1.5))
        self.cts = []
        for i in range(2):
            self.cts.append(self.dir / "in" / f"ct{i}.nii.gz")
            self.cts[-1].parent.mkdir(exist_ok=True)
            nib.save(nib.Nifti1Image(np.round(img).astype(np.int16), aff), self.cts[-1])
        self.out = self.dir / "out"
        self.maps = [self.out / f"ct{i}" / f"ct{i}_trans.nii.gz" for i in range(2)]

    def _run(self, *flags: str):
        return run_main(["-i", self.dir / "in", "-o", self.out, *FLAGS, *flags])

    def test_same_settings_skipped(self):
        self.assertEqual(self._run()[0], 0)
        record = read_output_record(self.maps[0])
        self.assertEqual((record["classes"], record["roi_size"], record["overlap"]), ([1, 3], [32] * 3, 0.25))
        self.assertIsNone(record["weights"])
        code, out, err = self._run("--sw-batch-size", "2", "--no-streaming")  # the speed's settings: the same labels
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count("skipped:"), 0)  # --quiet
        summary = json.loads((self.out / "summary.json").read_text())
        self.assertEqual((summary["done"], summary["skipped"]), (2, 0))  # kept as the earlier run's
        self.assertEqual(summary["volumes_per_minute"], 0.0)  # not 60,000: this run made none

    @parameterized.expand([
        ("classes", ["--classes", "liver"], "classes [1, 3] then, [1] now"),
        ("window", ["--roi-size", "48"], "--roi-size [32, 32, 32] then, [48, 48, 48] now"),
        ("overlap", ["--overlap", "0.5"], "overlap 0.25 then, 0.5 now"),
        ("points", ["--points", "12,12,8", "--point-labels", "1", "--classes", "liver"], "points none then"),
    ])
    def test_other_settings_refused(self, _, flags, change):
        self.assertEqual(self._run()[0], 0)
        before = [p.read_bytes() for p in self.maps]
        code, _, err = self._run(*flags)
        self.assertEqual(code, 2, err)
        lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
        self.assertEqual(len(lines), 1, err)
        self.assertIn(f"error: {self.maps[0]} (and 1 more outputs) was made with other settings: ", lines[0])
        self.assertIn(change, lines[0])
        self.assertIn("pass --overwrite to redo them, or choose another output folder.", lines[0])
        self.assertEqual([p.read_bytes() for p in self.maps], before)
        code, _, err = self._run(*flags, "--overwrite")
        self.assertEqual(code, 0, err)
        redone = [p.read_bytes() for p in self.maps]
        code, _, err = self._run(*flags)  # now the outputs are this run's: skipped
        self.assertEqual(code, 0, err)
        self.assertEqual([p.read_bytes() for p in self.maps], redone)

    def test_other_weights_refused(self):
        weights = []
        for seed in range(2):
            torch.manual_seed(seed)
            from monai.networks.nets import vista3d132

            weights.append(self.dir / f"w{seed}.pt")
            torch.save(vista3d132(encoder_embed_dim=8).state_dict(), weights[-1])
        self.assertEqual(self._run("--weights", weights[0])[0], 0)
        self.assertEqual(read_output_record(self.maps[0])["weights"]["bytes"], weights[0].stat().st_size)
        code, _, err = self._run("--weights", weights[0])
        self.assertEqual(code, 0, err)
        code, _, err = self._run("--weights", weights[1])
        self.assertEqual(code, 2, err)
        self.assertIn('weights {"bytes":', err)

    def test_first_image_segmented_while_the_weights_are_hashed(self):
        """The record's SHA-256 of the weights is awaited on the saver's thread, not before the first image."""
        from monai.apps.vista3d.batch import provenance
        from monai.apps.vista3d.batch.segmenter import PipelineSegmenter
        from monai.networks.nets import vista3d132

        weights = self.dir / "w.pt"
        torch.save(vista3d132(encoder_embed_dim=8).state_dict(), weights)
        segmenting, seen = threading.Event(), []
        sha256, segment = provenance._sha256, PipelineSegmenter.__call__

        def slow_sha256(path):  # the hash finishes only once an image is being segmented (or after 20 s)
            seen.append(segmenting.wait(timeout=20))
            return sha256(path)

        def segment_and_say(self, *args):
            segmenting.set()
            return segment(self, *args)

        with mock.patch.object(provenance, "_sha256", slow_sha256), \
                mock.patch.object(PipelineSegmenter, "__call__", segment_and_say):
            code, _, err = run_main(["-i", self.cts[0], "-o", self.out, *FLAGS, "--weights", weights])
        self.assertEqual(code, 0, err)
        self.assertEqual(seen, [True])  # one hash, and an image was segmented before it returned
        record = read_output_record(self.maps[0])
        self.assertEqual(record["weights"]["sha256"], hashlib.sha256(weights.read_bytes()).hexdigest())

    def test_outputs_without_a_record_are_skipped(self):
        """An output of an earlier version (no record) is taken as it is, as before."""
        self.assertEqual(self._run()[0], 0)
        labels, geom = load_image(self.maps[0])
        save_label_map(labels[0], dataclasses.replace(geom, filename=None), self.maps[0])  # without its record
        self.assertIsNone(read_output_record(self.maps[0]))
        before = self.maps[0].read_bytes()
        code, _, err = run_main(["-i", self.cts[0], "-o", self.out, *FLAGS[:4], "--classes", "spleen", *FLAGS[6:]])
        self.assertEqual(code, 0, err)
        self.assertEqual(self.maps[0].read_bytes(), before)

    def test_python_api(self):
        first = stub_job([1], StubVista({1: 300.0}))
        self.assertEqual(run_batch(self.cts, self.out, first).done, 2)
        self.assertEqual(run_batch(self.cts, self.out, stub_job([1], StubVista({1: 300.0}))).skipped, 2)
        with self.assertRaisesRegex(OutputPathError, r"classes \[1\] then, \[3\] now; pass overwrite=True"):
            run_batch(self.cts, self.out, stub_job([3], StubVista({3: 600.0})))
        self.assertEqual(run_batch(self.cts, self.out, stub_job([3], StubVista({3: 600.0})), overwrite=True).done, 2)
        self.assertEqual(read_output_record(self.maps[1])["classes"], [3])


if __name__ == "__main__":
    unittest.main()
