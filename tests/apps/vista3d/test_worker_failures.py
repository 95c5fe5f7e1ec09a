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
"""Every worker thread's failure reaches the main thread: one line, the right exit code, nothing left behind, no
hang (issue 34, item 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np

from monai.apps.vista3d.batch import run as batch
from monai.apps.vista3d.batch import workers as batch_workers
from monai.apps.vista3d.io import gzip_codec
from tests.apps.vista3d.stub_vista import phantom
from tests.apps.vista3d.test_cli import ROOT, run_main
from tests.subprocess_env import child_env, default_sigint

# the command line with an inflate thread that never ends (a stuck read), telling when it is stuck
STUCK = """
import sys, threading
from monai.apps.vista3d.io import gzip_codec
from monai.apps.vista3d.cli.main import main

def stuck(self):
    print("stuck", flush=True)
    threading.Event().wait()

gzip_codec.Gunzip._run = stuck
sys.exit(main(sys.argv[1:]))
"""

FLAGS = ["--embed-dim", "8", "--roi-size", "32", "--classes", "liver,spleen", "--device", "cpu", "--quiet"]


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("WARNING: no --weights")]


class TestWorkerFailures(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        img, aff, _ = phantom((24, 24, 16), np.eye(3), (1.5, 1.5, 1.5))
        self.src = self.dir / "ct.nii.gz"
        nib.save(nib.Nifti1Image(np.round(img).astype(np.int16), aff), self.src)
        self.out = self.dir / "out"

    def tearDown(self):
        self.tmp.cleanup()

    def _run(self, *flags) -> tuple[int, list[str]]:
        """The command in a thread that must end (a hang fails the test instead of stopping the suite)."""
        got: dict = {}
        worker = threading.Thread(target=lambda: got.update(r=run_main([self.src, "-o", self.out, *FLAGS, *flags])),
                                  daemon=True)
        worker.start()
        worker.join(timeout=120)
        self.assertFalse(worker.is_alive(), "the run hangs")
        code, _, err = got["r"]
        return code, _errors(err)

    def _left_behind(self) -> list[str]:
        """Everything under the output folder but the summary (no folder, lock or part file)."""
        if not self.out.exists():
            return []
        return sorted(str(p.relative_to(self.out)) for p in self.out.rglob("*") if p.name != "summary.json")

    def test_bad_codec_refused_up_front(self):
        for value in ("bogus", "gzip"):
            with mock.patch.dict(os.environ, {"VISTA3D_GZIP_CODEC": value}):
                code, lines = self._run()
            self.assertEqual(code, 2)
            self.assertEqual(lines, [f"error: VISTA3D_GZIP_CODEC='{value}': use 'auto', 'zlib' or 'isal'."])
            self.assertFalse(self.out.exists())

    def test_inflate_thread_that_dies_silently(self):
        """The original hang: the inflate thread ended without handing anything on."""
        with mock.patch.object(gzip_codec.Gunzip, "_run", lambda self: None):
            code, lines = self._run()
        self.assertEqual(code, 1)
        self.assertIn("the inflate (ct.nii.gz) thread stopped without a result", lines[0])
        self.assertEqual(len(lines), 1, lines)  # one line (--quiet: no totals)
        self.assertEqual(self._left_behind(), [])

    def test_inflate_thread_error(self):
        def broken(self):
            self._put(RuntimeError("inflate failed"))

        with mock.patch.object(gzip_codec.Gunzip, "_run", broken):
            code, lines = self._run()
        self.assertEqual(code, 1)
        self.assertIn("RuntimeError: inflate failed", lines[0])
        self.assertEqual(self._left_behind(), [])

    def test_load_thread_failure(self):
        with mock.patch.object(batch.Loader, "_load_all", side_effect=RuntimeError("no stream")):
            code, lines = self._run()
        self.assertEqual(code, 1)
        self.assertEqual(lines, ["error: loading the images failed: RuntimeError: no stream"])
        self.assertEqual(self._left_behind(), [])

    def test_save_thread_failure(self):
        with mock.patch.object(batch_workers, "save_label_map", side_effect=OSError(28, "No space left on device")):
            code, lines = self._run()
        self.assertEqual(code, 1)
        self.assertIn("no space left on device", lines[0])
        self.assertEqual(self._left_behind(), [])

    def test_mask_save_failure(self):
        with mock.patch.object(batch_workers, "save_class_masks", side_effect=OSError(28, "No space left on device")):
            code, lines = self._run("--per-class")
        self.assertEqual(code, 1)
        self.assertIn("no space left on device", lines[0])
        self.assertEqual(self._left_behind(), [])

    def test_label_map_failure_after_the_masks_removes_them(self):
        with mock.patch.object(batch_workers, "save_label_map", side_effect=OSError(28, "No space left on device")):
            code, lines = self._run("--per-class")
        self.assertEqual(code, 1)
        self.assertEqual(self._left_behind(), [])  # the masks written first are gone with their label map


    def test_one_ctrl_c_is_enough(self):
        with subprocess.Popen([sys.executable, "-c", STUCK, "-i", self.src, "-o", self.out, *FLAGS], cwd=ROOT,
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=default_sigint) as proc:
            self.assertEqual(proc.stdout.readline().strip(), "stuck")
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                self.fail("one Ctrl-C did not stop the run")
        self.assertEqual(proc.returncode, 130, err)
        stopped = "error: interrupted; finished outputs are kept, unfinished images left nothing"
        self.assertEqual(_errors(err), [stopped])
        self.assertEqual(self._left_behind(), [])


if __name__ == "__main__":
    unittest.main()
