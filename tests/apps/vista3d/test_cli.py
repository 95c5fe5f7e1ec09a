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
"""``python -m monai.apps.vista3d``: segment and benchmark, exit codes and one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from parameterized import parameterized

from monai.apps.vista3d.__main__ import main
from tests.apps.vista3d.stub_vista import phantom

ROOT = Path(__file__).parents[3]
TINY = ["--embed-dim", "8", "--roi-size", "32", "--classes", "1,3", "--device", "cpu", "--quiet"]


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


class TestSegmentCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)
        img, cls.aff, _ = phantom((36, 34, 20), np.diag([-1.0, 1.0, 1.0]), (1.0, 1.1, 2.0))
        cls.img = img
        cls.src = cls.dir / "ct.nii.gz"
        nib.save(nib.Nifti1Image(np.round(img).astype(np.int16), cls.aff), cls.src)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def _errors(self, err):
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("WARNING: no --weights")]
        self.assertTrue(lines, "no error message")
        self.assertTrue(all(ln.startswith("error: ") for ln in lines), err)
        self.assertNotIn("Traceback", err)
        return " ".join(lines)

    def test_segment_writes_the_bundle_name(self):
        out_dir = self.dir / "out1"
        code, out, err = run_main(["segment", self.src, "--output-dir", out_dir, *TINY[:-1], "--timing"])
        self.assertEqual(code, 0, err)
        self.assertIn("RANDOM weights", err)
        path = out_dir / "ct" / "ct_trans.nii.gz"
        self.assertIn(f"wrote {path}", out)
        self.assertIn("postprocess", out)  # the --timing table
        res = nib.load(path)
        self.assertEqual(res.shape, self.img.shape)
        np.testing.assert_allclose(res.affine, nib.load(self.src).affine)
        self.assertEqual(res.get_data_dtype(), np.uint8)  # the default output dtype
        self.assertTrue(set(np.unique(np.asarray(res.dataobj)).tolist()) <= {0, 1, 3})
        # again: the finished output is skipped and left as it is; --overwrite redoes it, and the same seed gives
        # the same labels
        written = path.read_bytes()
        code, out, err = run_main(["segment", self.src, "--output-dir", out_dir, *TINY[:-1]])
        self.assertEqual(code, 0, err)
        self.assertIn(f"skipped {path}", out)
        self.assertIn("--overwrite", out)
        self.assertEqual(path.read_bytes(), written)
        self.assertEqual(json.loads((out_dir / "summary.json").read_text())["skipped"], 1)
        before = np.asarray(res.dataobj).copy()
        code, _, err = run_main(["segment", self.src, "--output-dir", out_dir, *TINY, "--overwrite",
                                 "--output-dtype", "float32"])
        self.assertEqual(code, 0, err)
        again = nib.load(path)
        self.assertEqual(again.get_data_dtype(), np.float32)  # the bundle's files
        np.testing.assert_array_equal(np.asarray(again.dataobj), before)

    def test_input_list_and_folder(self):
        other = self.dir / "lists" / "second.nii"
        other.parent.mkdir(exist_ok=True)
        nib.save(nib.Nifti1Image(self.img, self.aff), other)
        listing = self.dir / "files.txt"
        listing.write_text(f"# two images\n{self.src}\n\n{other}\n")
        code, _, err = run_main(["segment", "--input-list", listing, "--output-dir", self.dir / "out2", *TINY,
                                 "--sw-batch-size", "auto"])
        self.assertEqual(code, 0, err)
        self.assertTrue((self.dir / "out2" / "ct" / "ct_trans.nii.gz").is_file())
        self.assertTrue((self.dir / "out2" / "second" / "second_trans.nii.gz").is_file())
        code, _, err = run_main(["segment", "--input-list", other.parent, "--output-dir", self.dir / "out3", *TINY])
        self.assertEqual(code, 0, err)
        self.assertTrue((self.dir / "out3" / "second" / "second_trans.nii.gz").is_file())

    def test_point_prompt(self):
        code, _, err = run_main(["segment", self.src, "--output-dir", self.dir / "out4", *TINY[:4], "--device",
                                 "cpu", "--points", "18,17,10;5,5,10", "--point-labels", "1,0"])
        self.assertEqual(code, 0, err)
        lab = np.asarray(nib.load(self.dir / "out4" / "ct" / "ct_trans.nii.gz").dataobj)
        self.assertTrue(set(np.unique(lab).tolist()) <= {0.0, 1.0, 255.0})

    @parameterized.expand([
        ("unknown_class", ["--classes", "livr"], "unknown class name 'livr'"),
        ("id_out_of_range", ["--classes", "1,500"], "class id 500 is out of range"),
        ("point_outside", ["--points", "99,3,3", "--point-labels", "1"], "outside the image"),
        ("points_without_labels", ["--points", "3,3,3"], "without labels"),
        ("bad_points", ["--points", "3,a,3", "--point-labels", "1"], "cannot parse"),
    ])
    def test_prompt_errors(self, _, extra, msg):
        argv = ["segment", self.src, "--output-dir", self.dir / "bad", "--embed-dim", "8", "--roi-size", "32",
                "--device", "cpu", "--quiet", *extra]
        code, out, err = run_main(argv)
        self.assertEqual(code, 1)
        self.assertIn(msg, self._errors(err))
        self.assertFalse((self.dir / "bad" / "ct" / "ct_trans.nii.gz").exists())

    def test_checkpoint_mismatch(self):
        from monai.networks.nets import vista3d132

        ckpt = self.dir / "model16.pt"
        torch.save(vista3d132(encoder_embed_dim=16).state_dict(), ckpt)
        code, _, err = run_main(["segment", self.src, "--output-dir", self.dir / "out5", *TINY, "--weights", ckpt])
        self.assertEqual(code, 1)
        msg = self._errors(err)
        self.assertIn("does not match the VISTA3D network", msg)
        self.assertIn("shape mismatches", msg)
        self.assertNotIn("RANDOM", err)

    def test_output_errors(self):
        blocker = self.dir / "plain_file"
        blocker.write_text("x")
        code, _, err = run_main(["segment", self.src, "--output-dir", blocker / "sub", *TINY])
        self.assertEqual(code, 1)
        self.assertIn("cannot create the output folder", self._errors(err))
        before = self.src.read_bytes()
        code, _, err = run_main(["segment", self.src, "--output", self.src, "--overwrite", *TINY])
        self.assertEqual(code, 1)
        self.assertIn("is the input file", self._errors(err))
        self.assertEqual(self.src.read_bytes(), before)
        out = self.dir / "exact" / "labels.nii.gz"
        code, _, err = run_main(["segment", self.src, "--output", out, *TINY])
        self.assertEqual(code, 0, err)
        self.assertEqual(nib.load(out).shape, self.img.shape)

    def test_4d_needs_a_volume_index(self):
        src = self.dir / "four_d.nii.gz"
        nib.save(nib.Nifti1Image(np.stack([self.img, self.img], -1), self.aff), src)
        code, _, err = run_main(["segment", src, "--output-dir", self.dir / "out6", *TINY])
        self.assertEqual(code, 1)
        self.assertIn("--volume-index", self._errors(err))
        code, _, err = run_main(["segment", src, "--output-dir", self.dir / "out6", *TINY, "--volume-index", "1"])
        self.assertEqual(code, 0, err)
        self.assertEqual(nib.load(self.dir / "out6" / "four_d" / "four_d_trans.nii.gz").shape, self.img.shape)

    def test_constant_and_missing_images(self):
        flat = self.dir / "flat.nii.gz"
        nib.save(nib.Nifti1Image(np.full((20, 20, 20), -1000, np.int16), np.eye(4)), flat)
        missing = self.dir / "missing.nii.gz"
        code, _, err = run_main(["segment", flat, missing, self.src, "--output-dir", self.dir / "out7", *TINY])
        self.assertEqual(code, 1)  # the good image is still written
        msg = self._errors(err)
        self.assertIn("nothing to segment", msg)
        self.assertIn("no such file", msg)
        self.assertIn("2 of 3 image(s) failed", msg)
        self.assertTrue((self.dir / "out7" / "ct" / "ct_trans.nii.gz").is_file())

    @parameterized.expand([
        ("no_images", ["segment", "--output-dir", "x"], "no input images"),
        ("no_output", ["segment", "a.nii.gz"], "--output-dir"),
        ("bad_sw", ["segment", "a.nii.gz", "--output-dir", "x", "--sw-batch-size", "zero"], "--sw-batch-size"),
        ("bad_roi", ["benchmark", "--roi-size", "32,32", "--device", "cpu"], "--roi-size"),
    ])
    def test_usage_errors(self, _, argv, msg):
        code, _, err = run_main(argv)
        self.assertEqual(code, 2)
        self.assertIn(msg, self._errors(err))

    def test_no_command_prints_help(self):
        code, _, err = run_main([])
        self.assertEqual(code, 2)
        self.assertIn("segment", err)


class TestBenchmarkCli(unittest.TestCase):
    def test_small_benchmark(self):
        with tempfile.TemporaryDirectory() as tmp:
            js = Path(tmp) / "bench.json"
            code, out, err = run_main(["benchmark", "--size", "48,48,32", "--sw-batch-sizes", "1,2", *TINY,
                                       "--json", js])
            self.assertEqual(code, 0, err)
            self.assertIn("per-stage times", out)
            self.assertIn("latency vs sw_batch_size", out)
            self.assertIn("NOTE: reduced settings", out)
            self.assertIn("RANDOM weights", err)
            res = json.loads(js.read_text())
        self.assertEqual([r["sw_batch_size"] for r in res["runs"]], [1, 2])
        for r in res["runs"]:
            for stage in ("load", "preprocess", "inference", "postprocess", "invert", "save"):
                self.assertGreater(r["timings"][stage], 0.0)
            self.assertGreaterEqual(r["windows"], 1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
class TestCliSubprocess(unittest.TestCase):
    def _run(self, *args):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        return subprocess.run([sys.executable, "-m", "monai.apps.vista3d", *map(str, args)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    def test_segment_and_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            img, aff, _ = phantom((30, 30, 20), np.eye(3), (1.0, 1.0, 1.5))
            src = Path(tmp) / "ct.nii"
            nib.save(nib.Nifti1Image(img, aff), src)
            res = self._run("segment", src, "--output-dir", Path(tmp) / "out", *TINY)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertTrue((Path(tmp) / "out" / "ct" / "ct_trans.nii.gz").is_file())
            res = self._run("segment", src, "--output-dir", Path(tmp) / "out", *TINY, "--classes", "nope")
            self.assertEqual(res.returncode, 1)
            self.assertNotIn("Traceback", res.stderr)
            self.assertIn("error: ", res.stderr)
        res = self._run("--help")
        self.assertEqual(res.returncode, 0)
        self.assertIn("benchmark", res.stdout)

    def test_torchrun_two_ranks_equal_single_process(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            for i, shape in enumerate([(30, 30, 20), (24, 26, 18), (34, 28, 20)]):
                img, aff, _ = phantom(shape, np.eye(3), (1.0, 1.0, 1.5))
                nib.save(nib.Nifti1Image(np.round(img).astype(np.int16), aff), tmp / f"ct{i}.nii.gz")
            nib.save(nib.Nifti1Image(np.zeros((8, 8), np.int16), np.eye(4)), tmp / "flat.nii.gz")  # a 2D image fails
            single = self._run("segment", "--input-list", tmp, "--output-dir", tmp / "single", *TINY)
            self.assertEqual(single.returncode, 1, single.stderr)  # the 2D image
            env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
            multi = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                 "-m", "monai.apps.vista3d", "segment", "--input-list", str(tmp), "--output-dir", str(tmp / "multi"),
                 *TINY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            self.assertNotEqual(multi.returncode, 0, multi.stderr)  # the failure is reported in the exit code
            summary = json.loads((tmp / "multi" / "summary.json").read_text())
            records = summary["per_image"]
            self.assertEqual((summary["world_size"], summary["done"], summary["failed"]), (2, 3, 1))
            status = {Path(r["image"]).name: r["status"] for r in records}
            self.assertEqual(sorted(status), ["ct0.nii.gz", "ct1.nii.gz", "ct2.nii.gz", "flat.nii.gz"])
            self.assertEqual(sum(s == "done" for s in status.values()), 3, status)
            self.assertEqual(len({r.get("rank") for r in records}), 2, records)  # both ranks worked
            for i in range(3):
                a = nib.load(tmp / "single" / f"ct{i}" / f"ct{i}_trans.nii.gz")
                b = nib.load(tmp / "multi" / f"ct{i}" / f"ct{i}_trans.nii.gz")
                np.testing.assert_array_equal(np.asanyarray(a.dataobj), np.asanyarray(b.dataobj))
                np.testing.assert_array_equal(a.affine, b.affine)


if __name__ == "__main__":
    unittest.main()
