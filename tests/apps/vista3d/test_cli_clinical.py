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
"""The command line on the files a clinic has: cut while read, odd headers, other formats, other tools' label maps."""

from __future__ import annotations

import errno
import json
import os
import tempfile
import unittest
from collections import namedtuple
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np

from monai.apps.vista3d.cli.parser import build_parser
from monai.apps.vista3d.config import PipelineOptions
from monai.apps.vista3d.batch import claims, summary
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.io import nifti_write, paths
from monai.apps.vista3d.io.paths import lock_path
from tests.apps.vista3d.test_cli import TINY, _one_line_errors, _write_ct, run_main
from tests.apps.vista3d.test_nifti_read import cut_while_read


def _left_behind(folder: Path) -> list[str]:
    """Lock and temporary files under ``folder``."""
    return sorted(str(p) for p in folder.rglob(".*") if p.is_file())


class TestFilesCutWhileRead(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.cts = [_write_ct(self.tmp / "in" / f"ct{i}.nii", seed=i) for i in range(3)]

    def test_one_image_fails_the_batch_goes_on(self):
        out = self.tmp / "out"
        with cut_while_read(self.cts[1], 352 + 2 * 30 * 30 * 5):
            code, _, err = run_main(["-i", self.tmp / "in", "-o", out, *TINY])
        self.assertEqual(code, 1, err)
        lines = _one_line_errors(self, err)
        self.assertEqual(len(lines), 2, err)  # the image's line and the count
        self.assertIn("ct1.nii: truncated", lines[0])
        summary = json.loads((out / "summary.json").read_text())
        self.assertEqual([r["status"] for r in summary["per_image"]], ["done", "failed", "done"])
        self.assertTrue((out / "ct0" / "ct0_trans.nii.gz").is_file())
        self.assertTrue((out / "ct2" / "ct2_trans.nii.gz").is_file())
        self.assertFalse((out / "ct1").exists())
        self.assertEqual(_left_behind(out), [])
        self.assertFalse(any(lock_path(o).exists() for o in out.rglob("*.nii.gz")))


def _disk_full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


class TestOutputPathErrors(unittest.TestCase):
    """The output folder's problems are refused before any work with one line and exit 2; a disk that fills during the
    run fails its images with one line each and leaves no lock file. A full disk is simulated: ENOSPC raised where
    the file is written (a tmpfs of its own needs root), or a statvfs that says 0 bytes are free."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.cts = [_write_ct(self.tmp / "in" / f"ct{i}.nii.gz", seed=i) for i in range(2)]

    def _refused(self, out: Path, message: str) -> None:
        with mock.patch.object(Vista3DPipeline, "segment", side_effect=AssertionError("segmented")):
            code, _, err = run_main(["-i", self.tmp / "in", "-o", out, *TINY])
        self.assertEqual(code, 2, err)
        lines = _one_line_errors(self, err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn(message, lines[0])
        self.assertNotIn("Errno", err)

    def test_a_file_where_the_folder_goes(self):
        (self.tmp / "taken").write_text("x")
        for out in (self.tmp / "taken", self.tmp / "taken" / "out"):
            self._refused(out, f"cannot create the output folder {out}: {self.tmp / 'taken'} is a file")
        self.assertEqual((self.tmp / "taken").read_text(), "x")

    def test_read_only_folder(self):
        # permission bits do not bind root (the tests may run as root): the folder is made unwritable for the check
        (self.tmp / "ro").mkdir()
        real = os.access
        with mock.patch("os.access", lambda p, mode, **kw: False if Path(p) == self.tmp / "ro" else real(p, mode)):
            self._refused(self.tmp / "ro" / "out", f"the output folder {self.tmp / 'ro'} is not writable")
        self.assertEqual(list((self.tmp / "ro").iterdir()), [])

    def test_full_disk_refused_up_front(self):
        usage = namedtuple("usage", "total used free")
        with mock.patch.object(paths.shutil, "disk_usage", lambda p: usage(2**30, 2**30, 4096)):
            self._refused(self.tmp / "out", f"the output folder {self.tmp / 'out'} is on a full file system")
        self.assertFalse((self.tmp / "out").exists())

    def test_disk_full_while_saving(self):
        out = self.tmp / "out"
        with mock.patch.object(nifti_write, "write_gzip", _disk_full):
            code, _, err = run_main(["-i", self.tmp / "in", "-o", out, *TINY])
        self.assertEqual(code, 1, err)
        lines = _one_line_errors(self, err)
        self.assertEqual(len(lines), 3, err)
        for line in lines[:2]:
            self.assertIn("_trans.nii.gz: writing failed (No space left on device); nothing was left", line)
        self.assertNotIn("Errno", err)
        written = json.loads((out / "summary.json").read_text())
        self.assertEqual([r["status"] for r in written["per_image"]], ["failed", "failed"])
        self.assertEqual(sorted(p.name for p in out.rglob("*")), ["summary.json"])  # no lock, no temporary file

    def test_disk_full_at_the_claims(self):
        """The lock files of a disk that is full: removed again, the summary's too; one line each."""
        out = self.tmp / "out"
        with mock.patch.object(claims, "_owner", _disk_full):
            code, _, err = run_main(["-i", self.tmp / "in", "-o", out, *TINY])
        self.assertEqual(code, 1, err)
        lines = _one_line_errors(self, err)
        self.assertEqual(lines[:2], [f"error: {ct}: no space left on device" for ct in self.cts])
        self.assertIn("summary.json: the summary could not be written (no space left on device)", lines[2])
        self.assertFalse(out.exists() and any(out.rglob("*")), list(out.rglob("*")))

    def test_summary_that_cannot_be_written(self):
        out = self.tmp / "out"
        with mock.patch.object(summary, "json", mock.Mock(dumps=_disk_full, loads=json.loads)):  # its writes only
            code, _, err = run_main(["-i", self.tmp / "in", "-o", out, *TINY])
        self.assertEqual(code, 1, err)
        self.assertEqual(_one_line_errors(self, err), [
            f"error: {out / 'summary.json'}: the summary could not be written (no space left on device); the label "
            "maps written are kept."])
        self.assertEqual(len(list(out.rglob("*_trans.nii.gz"))), 2)
        self.assertEqual(_left_behind(out), [])


class TestPointPromptFill(unittest.TestCase):
    def test_unreached_voxels_are_background(self):
        """A click's label map is 0 where no window reached (as a viewer expects); --unreached-label 255 writes the
        bundle's file; the Python API's default is the command line's."""
        self.assertEqual(PipelineOptions().unreached_label, build_parser().parse_args(["segment"]).unreached_label)
        with tempfile.TemporaryDirectory() as tmp:
            ct = _write_ct(Path(tmp) / "ct.nii.gz", shape=(80, 80, 40))
            maps = {}
            for fill in ("0", "255"):
                argv = ["-i", ct, "-o", Path(tmp) / fill, *TINY[:4], "--device", "cpu", "--quiet", "--points",
                        "40,40,20", "--point-labels", "1"] + (["--unreached-label", fill] if fill == "255" else [])
                code, _, err = run_main(argv)
                self.assertEqual(code, 0, err)
                maps[fill] = np.asarray(nib.load(Path(tmp) / fill / "ct" / "ct_trans.nii.gz").dataobj)
        unreached = maps["255"] == 255
        self.assertGreater(unreached.mean(), 0.3)  # windows of 32 around one click leave most of the CT
        self.assertNotIn(255, np.unique(maps["0"]))
        self.assertTrue((maps["0"][unreached] == 0).all())
        np.testing.assert_array_equal(maps["0"][~unreached], maps["255"][~unreached])


if __name__ == "__main__":
    unittest.main()
