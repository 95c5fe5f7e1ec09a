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
import gzip
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
import pytest
import torch
from parameterized import parameterized

from monai.apps.vista3d.cli.main import main
from tests.apps.vista3d.stub_vista import phantom
from tests.subprocess_env import child_env, default_sigint

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
        self.assertIn(f"[1/1] {self.src} ", out)
        self.assertIn(f" s -> {path}", out)
        self.assertIn("1 image(s): 1 done, 0 skipped, 0 failed in", out)
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
        self.assertIn(f"[1/1] {self.src} skipped: {path} exists (--overwrite redoes it)", out)
        self.assertEqual(path.read_bytes(), written)
        kept = json.loads((out_dir / "summary.json").read_text())  # the first run's image stays done (issue 34)
        self.assertEqual((kept["done"], kept["skipped"], kept["per_image"][0]["earlier_run"]), (1, 0, True))
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

    @parameterized.expand([  # flags that cannot be used are usage errors (2); a point outside one image fails it (1)
        ("unknown_class", ["--classes", "livr"], "unknown class name 'livr'", 2),
        ("id_out_of_range", ["--classes", "1,500"], "class id 500 is out of range", 2),
        ("point_outside", ["--points", "99,3,3", "--point-labels", "1"], "outside the image", 1),
        ("negative_point", ["--points", "-3,3,3", "--point-labels", "1"], "outside the image", 1),
        ("points_without_labels", ["--points", "3,3,3"], "without labels", 2),
        ("bad_points", ["--points", "3,a,3", "--point-labels", "1"], "cannot parse", 2),
    ])
    def test_prompt_errors(self, _, extra, msg, expected):
        argv = ["segment", self.src, "--output-dir", self.dir / "bad", "--embed-dim", "8", "--roi-size", "32",
                "--device", "cpu", "--quiet", *extra]
        code, out, err = run_main(argv)
        self.assertEqual(code, expected, err)
        self.assertIn(msg, self._errors(err))
        self.assertFalse((self.dir / "bad" / "ct" / "ct_trans.nii.gz").exists())

    def test_checkpoint_mismatch(self):
        from monai.networks.nets import vista3d132

        ckpt = self.dir / "model16.pt"
        torch.save(vista3d132(encoder_embed_dim=16).state_dict(), ckpt)
        code, _, err = run_main(["segment", self.src, "--output-dir", self.dir / "out5", *TINY, "--weights", ckpt])
        self.assertEqual(code, 1)
        msg = self._errors(err)
        self.assertIn("is a vista3d132 with --embed-dim 16, the network was built with 8; set --embed-dim 16", msg)
        self.assertNotIn("RANDOM", err)

    def test_output_errors(self):
        blocker = self.dir / "plain_file"
        blocker.write_text("x")
        code, _, err = run_main(["segment", self.src, "--output-dir", blocker / "sub", *TINY])
        self.assertEqual(code, 2)  # an output path: refused before any work
        self.assertIn("cannot create the output folder", self._errors(err))
        before = self.src.read_bytes()
        code, _, err = run_main(["segment", self.src, "--output", self.src, "--overwrite", *TINY])
        self.assertEqual(code, 2)  # refused before any work
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
        ("no_output", ["segment", "a.nii.gz"], "-o FOLDER"),
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


# what the installed console script runs (setup.py: vista3d=monai.apps.vista3d.cli.main:run)
CONSOLE_SCRIPT = "import sys; from monai.apps.vista3d.cli.main import run; sys.argv[0] = 'vista3d'; run()"


def vista3d(*args, timeout=300, **env_extra: str):
    """Run the ``vista3d`` console script's entry point in a subprocess on this worktree's monai (``env_extra``:
    more environment variables of the child)."""
    env = child_env(OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def vista3d_here(*args) -> subprocess.CompletedProcess:
    """The console script's entry point in this process (``sys.argv[0]`` = ``vista3d``), as :func:`vista3d` returns
    it: for the checks that need no process of their own."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(sys, "argv", ["vista3d", *map(str, args)]), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's --help
            code = e.code or 0
    return subprocess.CompletedProcess(["vista3d", *args], code, out.getvalue(), err.getvalue())


def _write_ct(path: Path, shape=(30, 30, 20), seed: int = 0, four_d: bool = False) -> Path:
    img, aff, _ = phantom(shape, np.eye(3), (1.0, 1.0, 1.5))
    img = np.round(img + 10 * seed).astype(np.int16)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.stack([img - 500, img], -1) if four_d else img, aff), path)
    return path


def _one_line_errors(test: unittest.TestCase, stderr: str) -> list[str]:
    test.assertNotIn("Traceback", stderr)
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("WARNING: no --weights")]
    test.assertTrue(all(ln.startswith(("error: ", "warning: ")) for ln in lines), stderr)
    return lines


@pytest.mark.slow
class TestCliAsUsersExpect(unittest.TestCase):
    """The ``vista3d`` entry point in a subprocess on NIfTI files, as a user runs it."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def test_patient_folders_rerun_and_mixed_4d(self):
        cts = self.tmp / "cts"
        _write_ct(cts / "p1" / "ct.nii.gz", seed=0)
        _write_ct(cts / "p2" / "ct.nii.gz", seed=1)
        _write_ct(cts / "p3" / "ct.nii.gz", (24, 26, 18), seed=2, four_d=True)
        out = self.tmp / "out"
        res = vista3d("-i", cts, "-o", out, *TINY[:-1], "--volume-index", "1")
        self.assertEqual(res.returncode, 0, res.stderr)
        results = {p: out / p / "ct" / "ct_trans.nii.gz" for p in ("p1", "p2", "p3")}
        for p, path in results.items():
            self.assertEqual(nib.load(path).shape, nib.load(cts / p / "ct.nii.gz").shape[:3])
            self.assertIn(f"{cts / p / 'ct.nii.gz'} ", res.stdout)
        self.assertRegex(res.stdout, r"\[3/3\] .* s -> ")
        self.assertIn("3 image(s): 3 done, 0 skipped, 0 failed in", res.stdout)
        written = {p: path.read_bytes() for p, path in results.items()}
        # the same names given as files cannot both be written: refused before any work
        res = vista3d(cts / "p1" / "ct.nii.gz", cts / "p2" / "ct.nii.gz", "-o", self.tmp / "flat", *TINY)
        self.assertEqual(res.returncode, 2)
        lines = _one_line_errors(self, res.stderr)
        self.assertEqual(len(lines), 1, res.stderr)
        self.assertIn("would both be written to", lines[0])
        self.assertFalse((self.tmp / "flat").exists())
        # a rerun skips what is finished and exits 0; --overwrite redoes it
        res = vista3d("-i", cts, "-o", out, *TINY[:-1], "--volume-index", "1")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(res.stdout.count("skipped: "), 3, res.stdout)
        self.assertEqual({p: path.read_bytes() for p, path in results.items()}, written)
        kept = json.loads((out / "summary.json").read_text())  # what the first run did stays done (issue 34)
        self.assertEqual((kept["done"], kept["skipped"]), (3, 0))
        res = vista3d("segment", "--input-list", cts, "--output-dir", out, *TINY, "--volume-index", "1",
                      "--overwrite")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads((out / "summary.json").read_text())["done"], 3)

    @parameterized.expand([
        ("sigterm", signal.SIGTERM, 143, "terminated"),
        ("sigint", signal.SIGINT, 130, "interrupted"),
    ])
    def test_stopped_run_leaves_only_finished_outputs(self, _, sig, code, word):
        for i in range(8):
            _write_ct(self.tmp / "cts" / f"ct{i}.nii.gz", (48, 48, 32), seed=i)
        out = self.tmp / "out"
        env = child_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-c", CONSOLE_SCRIPT, "-i", str(self.tmp / "cts"), "-o", str(out),
                                 *TINY[:-1]], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=default_sigint)
        first = proc.stdout.readline()  # the first image is finished
        self.assertIn("[1/8]", first)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, code, stderr)
        lines = _one_line_errors(self, stderr)
        self.assertEqual(len(lines), 1, stderr)
        self.assertIn(word, lines[0])
        self.assertNotIn("[8/8]", stdout)
        leftovers = [p for p in out.rglob("*") if p.name != "summary.json"]
        for p in leftovers:  # every folder holds a complete result, nothing else
            if p.is_dir():
                self.assertEqual([c.name for c in p.iterdir()], [f"{p.name}_trans.nii.gz"])
            else:
                self.assertEqual(nib.load(p).shape, (48, 48, 32))
        self.assertGreaterEqual(len(leftovers), 2)
        # the summary is written on the way out too, and every finished image was reported when it was written
        summary = json.loads((out / "summary.json").read_text())
        written = sorted(str(p) for p in out.rglob("*_trans.nii.gz"))
        self.assertTrue(summary["interrupted"])
        self.assertEqual(sorted(r["output"] for r in summary["per_image"] if r["status"] == "done"), written)
        self.assertEqual(summary["done"], len(written))
        self.assertEqual({r["status"] for r in summary["per_image"]} - {"done"}, {"interrupted"})
        self.assertEqual(sorted(ln.split(" -> ")[1] for ln in (first + stdout).splitlines() if " -> " in ln), written)

    def test_bad_images_one_line_each(self):
        good = _write_ct(self.tmp / "in" / "good.nii.gz")
        hdr = nib.Nifti1Header()
        hdr.set_data_shape((4000, 4000, 4000))
        hdr.set_data_dtype(np.int16)
        hdr["vox_offset"] = 352
        (self.tmp / "in" / "huge.nii").write_bytes(hdr.binaryblock + bytes(4) + bytes(20000))
        nib.save(nib.Nifti1Image(np.zeros((1, 1, 1), np.int16), np.eye(4)), self.tmp / "in" / "dot.nii.gz")
        img = nib.load(good).get_fdata().astype(np.float32)
        img[:3, :3, :2] = np.nan  # outside the body, as after a resampling
        nib.save(nib.Nifti1Image(img, nib.load(good).affine), self.tmp / "in" / "nan.nii.gz")
        out = self.tmp / "out"
        res = vista3d("-i", self.tmp / "in", "-o", out, *TINY)
        self.assertEqual(res.returncode, 1, res.stderr)
        lines = _one_line_errors(self, res.stderr)
        text = "\n".join(lines)
        self.assertIn("huge.nii: truncated: the header needs", text)
        self.assertIn("dot.nii.gz: a single voxel (shape (1, 1, 1))", text)
        self.assertIn("nan.nii.gz: 18 voxel(s) are not finite (18 NaN, 0 Inf); read as air (-1000 HU). Use --strict",
                      text)
        self.assertIn("error: 2 of 4 image(s) failed", text)
        for ln in lines:
            name = next((n for n in ("huge.nii", "dot.nii.gz", "nan.nii.gz") if n in ln), None)
            if name:
                self.assertEqual(ln.count(name), 1, ln)  # the path once
        self.assertTrue((out / "nan" / "nan_trans.nii.gz").is_file())
        self.assertEqual(sorted(p.name for p in out.iterdir()), ["good", "nan", "summary.json"])
        res = vista3d(self.tmp / "in" / "nan.nii.gz", "-o", out, *TINY, "--strict", "--overwrite")
        self.assertEqual(res.returncode, 1)
        self.assertIn("18 voxel(s) are not finite", _one_line_errors(self, res.stderr)[0])

    def test_progress_bars_on_a_terminal(self):
        cts = self.tmp / "cts"
        for i in range(2):
            _write_ct(cts / f"ct{i}.nii.gz", seed=i)
        import fcntl
        import pty
        import struct
        import termios

        leader, follower = pty.openpty()  # stderr on a terminal, as for a user at a shell
        # of a terminal's size: a new pty has 0 x 0, where tqdm (when installed) draws nothing
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        env = child_env(OMP_NUM_THREADS="1")
        with subprocess.Popen([sys.executable, "-c", CONSOLE_SCRIPT, "-i", cts, "-o", self.tmp / "out", *TINY[:-1]],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=follower, text=True) as proc:
            os.close(follower)
            seen = b""
            while True:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            stdout, _ = proc.communicate(timeout=300)
        os.close(leader)
        self.assertEqual(proc.returncode, 0, seen)
        text = seen.decode(errors="replace")
        self.assertIn("images [--------------------] 1/2", text)  # no image finished yet while the first runs
        self.assertIn("images [##########----------] 2/2", text)
        try:
            import tqdm  # noqa: F401  (with tqdm the windows get tqdm's bar)
        except ImportError:
            self.assertIn("| windows [####################] 1/1", text)
        else:
            self.assertIn("| windows", text)
        self.assertIn("2 image(s): 2 done, 0 skipped, 0 failed in", stdout)

    def test_list_classes_and_usage(self):
        # in this process, as the console script names itself (one subprocess below runs the script itself)
        res = vista3d_here("--list-classes")
        self.assertEqual(res.returncode, 0, res.stderr)
        lines = res.stdout.splitlines()
        self.assertIn("  1* liver", lines)
        self.assertIn("  2  kidney", lines)  # a group, not in "everything"
        self.assertIn("117 classes in 'everything'", res.stdout)
        usage = "usage: vista3d [segment] -i IMAGE_OR_FOLDER [-i ...] -o OUTPUT [options]\n       vista3d --list-classes"
        for argv in (["--help"], ["segment", "--help"], ["-h"]):  # the default command's help is the program's
            res = vista3d_here(*argv)
            self.assertEqual(res.returncode, 0)
            self.assertTrue(res.stdout.startswith(usage), res.stdout[:300])
            for flag in ("--list-classes", "--strict", "--weights", "--sw-batch-size", "benchmark", "--version"):
                self.assertIn(flag, res.stdout)
        res = vista3d_here("benchmark", "--help")
        self.assertTrue(res.stdout.startswith("usage: vista3d benchmark [options]"), res.stdout[:200])
        import monai

        res = vista3d("--version")
        self.assertEqual(res.returncode, 0)
        self.assertEqual(res.stdout.strip(), f"vista3d {monai.__version__}: the VISTA3D fork of MONAI, API- and "
                                             f"checkpoint-compatible with MONAI {monai.__upstream_version__}")


def _checkpoint(kind: str, folder: Path) -> Path:
    from monai.networks.nets import vista3d132

    path = folder / f"{kind}.pt"
    if kind == "text":
        path.write_text("model weights: see the bundle\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind in ("truncated", "embed16"):
        torch.save(vista3d132(encoder_embed_dim=16 if kind == "embed16" else 8).state_dict(), path)
        if kind == "truncated":
            path.write_bytes(path.read_bytes()[:5000])
    elif kind == "nifti":
        nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.int16), np.eye(4)), folder / "x.nii.gz")
        path.write_bytes((folder / "x.nii.gz").read_bytes())
    elif kind == "module":
        torch.save(vista3d132(encoder_embed_dim=8), path)
    return path


@pytest.mark.slow
class TestCliOneLineErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tmp = Path(cls._tmp.name)
        cls.src = _write_ct(cls.tmp / "ct.nii.gz")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @parameterized.expand([
        ("text", 1, "is a text file, not a checkpoint; expected a VISTA3D state dict"),
        ("empty", 1, "is empty (0 bytes); expected a VISTA3D state dict"),
        ("truncated", 1, "is truncated or damaged"),
        ("nifti", 1, "is a NIfTI image (.nii.gz), not a checkpoint; expected a VISTA3D state dict"),
        ("module", 1, "holds pickled Python objects (monai.networks.nets.vista3d.VISTA3D), not only tensors"),
        ("embed16", 1, "with --embed-dim 16, the network was built with 8; set --embed-dim 16"),
    ])
    def test_checkpoint(self, kind, code, msg):
        res = vista3d(self.src, "-o", self.tmp / kind, *TINY, "--weights", _checkpoint(kind, self.tmp))
        self.assertEqual(res.returncode, code, res.stderr)
        lines = _one_line_errors(self, res.stderr)
        self.assertEqual(len(lines), 1, res.stderr)
        self.assertIn(msg, lines[0])
        self.assertIn("bundle", lines[0]) if kind != "embed16" else None
        self.assertNotIn("\x1b", res.stderr)
        self.assertFalse((self.tmp / kind).exists())

    @parameterized.expand([
        ("roi_50", ["--roi-size", "50"], "--roi-size must be one or three positive multiples of 16"),
        ("embed_7", ["--embed-dim", "7"], "--embed-dim must be a positive multiple of 8, got 7"),
        ("file_output_for_a_folder", ["-o", "x.nii.gz"], "-o FILE.nii.gz names one output"),
    ])
    def test_usage(self, _, extra, msg):
        res = vista3d("-i", self.tmp, "-o", self.tmp / "u", *TINY, *extra)
        self.assertEqual(res.returncode, 2, res.stderr)
        # (the folder also holds an all-zero image of test_checkpoint, left out of the search with a warning)
        lines = [ln for ln in _one_line_errors(self, res.stderr) if ln.startswith("error: ")]
        self.assertEqual(len(lines), 1, res.stderr)
        self.assertIn(msg, lines[0])


def _torchrun_logs(tmp: Path) -> list[str]:
    """torchrun's flag for its log folder: inside the test's own folder (without it, each run leaves a
    ``torchelastic_*`` folder in the system's temporary folder)."""
    return [f"--log-dir={tmp / 'torchrun-logs'}"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
class TestCliSubprocess(unittest.TestCase):
    def _run(self, *args):
        env = child_env()
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
            # the rest needs no process of its own (the subprocess above ran the module form end to end)
            code, _, err = run_main(["segment", src, "--output-dir", Path(tmp) / "out", *TINY, "--classes", "nope"])
            self.assertEqual(code, 2)
            self.assertNotIn("Traceback", err)
            self.assertIn("error: ", err)
        res = vista3d_here("--help")
        self.assertEqual(res.returncode, 0)
        self.assertIn("benchmark", res.stdout)

    def test_torchrun_two_ranks_equal_single_process(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            cts = tmp / "cts"
            names = ["ct0.nii.gz", "ct1.nii.gz", "ct2.nii.gz", "sub/ct0.nii.gz"]  # two images named ct0.nii.gz
            for name, shape in zip(names, [(30, 30, 20), (24, 26, 18), (34, 28, 20), (26, 30, 18)]):
                _write_ct(cts / name, shape)
            nib.save(nib.Nifti1Image(np.zeros((8, 8), np.int16), np.eye(4)), cts / "flat.nii.gz")  # a 2D image fails
            single = self._run("segment", "--input-list", cts, "--output-dir", tmp / "single", *TINY)
            self.assertEqual(single.returncode, 1, single.stderr)  # the 2D image
            env = child_env(OMP_NUM_THREADS="1")

            def torchrun():
                return subprocess.run(
                    [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", *_torchrun_logs(tmp),
                     f"--master_port={_free_port()}", "-m", "monai.apps.vista3d", "-i", str(cts), "-o",
                     str(tmp / "multi"), *TINY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

            multi = torchrun()
            self.assertNotEqual(multi.returncode, 0, multi.stderr)  # the failure is reported in the exit code
            summary = json.loads((tmp / "multi" / "summary.json").read_text())
            records = summary["per_image"]
            self.assertEqual((summary["world_size"], summary["done"], summary["failed"]), (2, 4, 1))
            status = {str(Path(r["image"]).relative_to(cts)): r["status"] for r in records}
            self.assertEqual(sorted(status), sorted([*names, "flat.nii.gz"]))
            self.assertEqual(sum(s == "done" for s in status.values()), 4, status)
            self.assertEqual(len({r.get("rank") for r in records}), 2, records)  # both ranks worked
            for name in names:
                rel = Path(name).parent / Path(name).name.split(".")[0]
                a = nib.load(tmp / "single" / rel / f"{rel.name}_trans.nii.gz")
                b = nib.load(tmp / "multi" / rel / f"{rel.name}_trans.nii.gz")
                self.assertEqual(a.shape, nib.load(cts / name).shape)
                np.testing.assert_array_equal(np.asanyarray(a.dataobj), np.asanyarray(b.dataobj))
                np.testing.assert_array_equal(a.affine, b.affine)
            # two inputs with one output are refused on every rank before any work, as by one process
            refused = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", *_torchrun_logs(tmp),
                 f"--master_port={_free_port()}", "-m", "monai.apps.vista3d", str(cts / "ct0.nii.gz"),
                 str(cts / "sub" / "ct0.nii.gz"), "-o",
                 str(tmp / "refused"), *TINY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("would both be written to", refused.stderr)
            self.assertFalse((tmp / "refused").exists())
            # a rerun skips the finished images on every rank, as one process does
            again = torchrun()
            self.assertNotEqual(again.returncode, 0, again.stderr)
            summary = json.loads((tmp / "multi" / "summary.json").read_text())
            # the images done by the first run stay done in the summary the rerun writes (issue 34)
            self.assertEqual((summary["skipped"], summary["done"], summary["failed"]), (0, 4, 1))
            self.assertEqual(sum(bool(r.get("earlier_run")) for r in summary["per_image"]), 4)

    def test_torchrun_ranks_stop_together(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            for i in range(10):
                _write_ct(tmp / "cts" / f"ct{i}.nii.gz", (48, 48, 32), seed=i)
            out = tmp / "out"
            env = child_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            proc = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", *_torchrun_logs(tmp),
                 f"--master_port={_free_port()}", "-m", "monai.apps.vista3d", "-i", str(tmp / "cts"), "-o", str(out),
                 *TINY[:-1]],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = ""
            while "->" not in line:  # an image is finished on one of the ranks
                line = proc.stdout.readline()
                self.assertTrue(line, "torchrun ended before any image was finished")
            proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both ranks
            stdout, stderr = proc.communicate(timeout=120)  # returns only when both ranks have stopped
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("terminated", stderr)
            self.assertNotIn("10 image(s)", stdout)  # the run did not go on to its end on either rank
            for folder in (p for p in out.rglob("*") if p.is_dir()):  # only complete results are left
                self.assertEqual([c.name for c in folder.iterdir()], [f"{folder.name}_trans.nii.gz"])
                self.assertEqual(nib.load(folder / f"{folder.name}_trans.nii.gz").shape, (48, 48, 32))


class TestFusedPerRun(unittest.TestCase):
    """The command decides once, from how many images it segments, what the network is fused with."""

    @parameterized.expand([("one image", 1), ("two images", 2)])
    def test_image_count_reaches_the_job(self, _, count):
        from monai.apps.vista3d.batch import run as batch_run
        from monai.apps.vista3d.core import network_ready
        from monai.networks.kernels.dispatch import FusedConfig

        chosen = FusedConfig(graph_max_windows=0, cudnn_autotune=False)
        with tempfile.TemporaryDirectory() as tmp:
            cts = [str(_write_ct(Path(tmp) / f"ct{i}.nii.gz", seed=i)) for i in range(count)]
            with mock.patch.object(network_ready, "fused_for_images", return_value=chosen) as choice, \
                    mock.patch.object(batch_run, "run_batch", side_effect=RuntimeError("stop here")) as run_batch, \
                    contextlib.redirect_stderr(io.StringIO()):
                with self.assertRaises(RuntimeError):
                    main(["-i", *cts, "-o", str(Path(tmp) / "out"), "--embed-dim", "8", "--roi-size", "32",
                          "--device", "cpu"])
        self.assertEqual(choice.call_args.args[:2], (count, torch.device("cpu")))
        self.assertIs(run_batch.call_args.args[2].fuse, chosen)


class TestNibabelWithoutPydicom(unittest.TestCase):
    def test_segment_imports_nibabel_alone_and_keeps_extensions(self):
        # where pydicom is installed, nibabel would import it whole (0.2 s) to parse DICOM headers kept in NIfTI
        # extensions; the command imports nibabel as where it is not, and keeps such an extension byte for byte
        code = (
            "import importlib.util, sys\n"
            "from monai.apps.vista3d.cli.main import main\n"
            "assert 'nibabel' not in sys.modules\n"
            "status = main(sys.argv[1:])\n"
            "import nibabel.nifti1\n"
            "print(status, 'pydicom' in sys.modules, nibabel.nifti1.have_dicom)\n"
            "if importlib.util.find_spec('pydicom') is not None:\n"
            "    import pydicom  # still importable for the DICOM reader\n"
        )
        content = b"\x08\x00\x60\x00\x02\x00\x00\x00CT"  # (0008,0060) Modality 'CT', implicit VR
        with tempfile.TemporaryDirectory() as tmp:
            ct = _write_ct(Path(tmp) / "ct.nii.gz")
            img = nib.load(ct)
            img.header.extensions.append(nib.nifti1.Nifti1Extension(2, content))
            nib.save(img, ct)
            out = Path(tmp) / "out.nii.gz"
            res = subprocess.run([sys.executable, "-c", code, "-i", str(ct), "-o", str(out), "--embed-dim", "8",
                                  "--roi-size", "32", "--device", "cpu", "--quiet"], capture_output=True, text=True,
                                 env=child_env(), timeout=300)
            self.assertEqual(res.stdout.split()[-3:], ["0", "False", "False"], res.stderr)
            with open(out, "rb") as f:
                written = gzip.decompress(f.read())
        self.assertIn(content, written[348:int(np.frombuffer(written[108:112], "<f4")[0])])  # among the extensions


if __name__ == "__main__":
    unittest.main()
