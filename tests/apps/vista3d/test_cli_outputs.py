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
"""The command line never loses work or files: outputs checked first, no self-feeding, summaries kept."""

from __future__ import annotations

import errno
import json
import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.batch import run as batch
from monai.apps.vista3d.batch import workers as batch_workers
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.io.nifti import load_image
from tests.apps.vista3d.test_cli import (
    TINY,
    _one_line_errors,
    _write_ct,
    run_main,
    vista3d,
)


def _no_segmentation(*args, **kwargs):
    raise AssertionError("an image was segmented although the output could not be written")


class TestOutputsCheckedFirst(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.src = _write_ct(self.tmp / "ct.nii.gz")

    @parameterized.expand([
        ("upper_case", "SEG.NII.GZ", "must end with .nii.gz or .nii, in lower case"),
        ("upper_case_gz", "seg.nii.GZ", "must end with .nii.gz or .nii, in lower case"),
        ("name_too_long", "x" * 300 + ".nii.gz", "this file system takes names of at most"),
        ("folder_too_long", "y" * 300 + "/seg.nii.gz", "this file system takes names of at most"),
    ])
    def test_output_file_refused_before_any_work(self, _, name, msg):
        with mock.patch.object(Vista3DPipeline, "segment", _no_segmentation):
            code, _, err = run_main(["-i", self.src, "-o", self.tmp / name, *TINY])
        self.assertEqual(code, 2, err)
        lines = _one_line_errors(self, err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn(msg, lines[0])
        self.assertNotIn("Errno", err)
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), ["ct.nii.gz"])

    def test_output_folder_too_long_refused_before_any_work(self):
        with mock.patch.object(Vista3DPipeline, "segment", _no_segmentation):
            code, _, err = run_main(["-i", self.src, "-o", self.tmp / ("z" * 300), *TINY])
        self.assertEqual(code, 2, err)
        self.assertEqual(len(_one_line_errors(self, err)), 1, err)
        self.assertIn("this file system takes names of at most", err)
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), ["ct.nii.gz"])


class TestSummary(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.src = _write_ct(self.tmp / "ct.nii.gz")

    def test_a_users_summary_is_never_replaced(self):
        mine = self.tmp / "summary.json"
        mine.write_text('{"my": "notes"}')
        code, _, err = run_main(["-i", self.src, "-o", self.tmp / "seg.nii.gz", *TINY])
        self.assertEqual(code, 0, err)
        self.assertEqual(mine.read_text(), '{"my": "notes"}')
        ours = json.loads((self.tmp / "seg.summary.json").read_text())  # beside the one output, named after it
        self.assertEqual((ours["done"], ours["per_image"][0]["output"]), (1, str(self.tmp / "seg.nii.gz")))
        # in an output folder: refused before any work, the user's file kept
        (self.tmp / "out").mkdir()
        (self.tmp / "out" / "summary.json").write_text("my own notes")
        with mock.patch.object(Vista3DPipeline, "segment", _no_segmentation):
            code, _, err = run_main(["-i", self.src, "-o", self.tmp / "out", *TINY])
        self.assertEqual(code, 2, err)
        self.assertIn("is not a summary written by vista3d, so it is not replaced", err)
        self.assertEqual((self.tmp / "out" / "summary.json").read_text(), "my own notes")
        # a summary of ours is replaced by the next run
        code, _, err = run_main(["-i", self.src, "-o", self.tmp / "seg.nii.gz", *TINY])
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads((self.tmp / "seg.summary.json").read_text())["skipped"], 0)
        self.assertEqual(json.loads((self.tmp / "seg.summary.json").read_text())["done"], 1)  # kept from before

    def test_full_disk_leaves_nothing_and_one_line(self):
        real_replace = os.replace

        def full(src, dst):
            if str(dst).endswith("summary.json"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_replace(src, dst)

        with mock.patch.object(batch.os, "replace", full):
            code, _, err = run_main(["-i", self.src, "-o", self.tmp / "out", *TINY])
        self.assertEqual(code, 1, err)
        lines = _one_line_errors(self, err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn("the summary could not be written (no space left on device); the label maps written are kept",
                      lines[0])
        self.assertNotIn("Errno", err)
        self.assertEqual(sorted(str(p.relative_to(self.tmp)) for p in (self.tmp / "out").rglob("*")),
                         ["out/ct", "out/ct/ct_trans.nii.gz"])

    def test_failed_write_is_one_line_without_errno(self):
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[2]))

        with mock.patch.object(batch_workers, "save_label_map", full):
            code, _, err = run_main(["-i", self.src, "-o", self.tmp / "out", *TINY])
        self.assertEqual(code, 1, err)
        self.assertIn("error: ", err)
        self.assertIn("no space left on device", err)
        self.assertNotIn("Errno", err)
        self.assertFalse((self.tmp / "out" / "ct").exists())


class TestNoSelfFeeding(unittest.TestCase):
    @parameterized.expand([("same_folder", "cts"), ("inside_the_input", "cts/out")])
    def test_rerun_never_reads_its_outputs(self, _, out):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            for name in ("a.nii.gz", "p1/b.nii.gz"):
                _write_ct(tmp / "cts" / name)
            for run in range(2):
                code, stdout, err = run_main(["-i", tmp / "cts", "-o", tmp / out, *TINY[:-1]])
                self.assertEqual(code, 0, err)
                self.assertIn("2 image(s)", stdout)  # the second run: the same two, both skipped
            self.assertIn("2 skipped", stdout)
            found = sorted(str(p.relative_to(tmp / out)) for p in (tmp / out).rglob("*_trans*.nii.gz"))
            self.assertEqual(found, ["a/a_trans.nii.gz", "p1/b/b_trans.nii.gz"])


class TestPerClass(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.src = _write_ct(self.tmp / "cts" / "ct.nii.gz")

    def test_one_mask_per_class_and_reruns(self):
        argv = ["-i", self.tmp / "cts", "-o", self.tmp / "out", *TINY[:4], "--classes", "liver,left kidney",
                "--device", "cpu", "--per-class"]
        code, _, err = run_main(argv)
        self.assertEqual(code, 0, err)
        folder = self.tmp / "out" / "ct"
        self.assertEqual(sorted(p.name for p in folder.iterdir()), ["ct_trans.nii.gz", "left_kidney.nii.gz",
                                                                   "liver.nii.gz"])
        src = nib.load(self.src)
        for name in ("liver.nii.gz", "left_kidney.nii.gz"):
            mask = nib.load(folder / name)
            self.assertEqual((mask.shape, mask.get_data_dtype()), (src.shape, np.uint8))
            np.testing.assert_array_equal(mask.affine, src.affine)
            self.assertTrue(set(np.unique(np.asarray(mask.dataobj)).tolist()) <= {0, 1})
        code, _, err = run_main(argv)
        self.assertEqual(json.loads((self.tmp / "out" / "summary.json").read_text())["done"], 1)  # kept as done
        (folder / "liver.nii.gz").unlink()  # an incomplete set is done again
        code, _, err = run_main(argv)
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads((self.tmp / "out" / "summary.json").read_text())["done"], 1)
        self.assertTrue((folder / "liver.nii.gz").is_file())

    def test_batch_masks_equal_the_pipelines(self):
        from monai.apps.vista3d.batch.run import run_batch
        from tests.apps.vista3d.stub_vista import StubVista, stub_job

        kw = {"network": StubVista({1: 60.0, 3: 40.0}), "roi_size": (32, 32, 32)}  # overlapping intensity bands
        result = run_batch([self.src], self.tmp / "o", stub_job([1, 3], per_class=True, **kw))
        self.assertEqual(result.done, 1)
        direct = Vista3DPipeline(device="cpu", per_class=True, **kw).segment(str(self.src), classes=[1, 3]).masks
        for label_id, name in ((1, "liver"), (3, "spleen")):
            saved = np.asarray(nib.load(self.tmp / "o" / "ct" / f"{name}.nii.gz").dataobj)
            np.testing.assert_array_equal(saved, direct[label_id].numpy().astype(np.uint8))

    @parameterized.expand([
        ("points_only", ["--points", "10,10,10", "--point-labels", "1", "--classes", "everything"],
         "--per-class needs classes"),
        ("one_output_file", ["--classes", "liver"], "give an output folder, -o FOLDER"),
    ])
    def test_usage(self, name, extra, msg):
        out = self.tmp / ("seg.nii.gz" if name == "one_output_file" else "out")
        argv = ["-i", self.src, "-o", out, *TINY[:4], "--device", "cpu", "--per-class", *extra]
        code, _, err = run_main(argv)
        self.assertEqual(code, 2, err)
        self.assertIn(msg, err)


class TestWording(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)

    def test_zero_size_is_not_called_2d(self):
        hdr = nib.Nifti1Header()
        hdr.set_data_shape((0, 30, 20))
        hdr.set_data_dtype(np.int16)
        path = self.tmp / "empty.nii"
        path.write_bytes(hdr.binaryblock + bytes(4))
        with self.assertRaisesRegex(ValueError, r"a size of zero or less \(shape 0 x 30 x 20\); the file is damaged"):
            load_image(path)

    def test_spacing_without_numpy_reprs(self):
        img = nib.Nifti1Image(np.zeros((8, 8, 8), np.int16), np.eye(4))
        img.header["pixdim"][1:4] = [1.0, 0.5, 0.0]
        img.set_sform(None, code=0)
        img.set_qform(None, code=0)
        nib.save(img, self.tmp / "flat.nii.gz")
        with self.assertRaises(ValueError) as ctx:
            load_image(self.tmp / "flat.nii.gz")
        self.assertIn("spacing (pixdim 1 x 0.5 x 0);", str(ctx.exception))
        self.assertNotIn("np.float", str(ctx.exception))
        self.assertNotIn("array(", str(ctx.exception))

    def test_broken_link_in_a_folder_is_reported(self):
        _write_ct(self.tmp / "cts" / "good.nii.gz")
        (self.tmp / "cts" / "gone.nii.gz").symlink_to(self.tmp / "elsewhere.nii.gz")
        code, _, err = run_main(["-i", self.tmp / "cts", "-o", self.tmp / "out", *TINY])
        self.assertEqual(code, 1, err)
        self.assertIn("gone.nii.gz: a broken symbolic link (to", err)
        self.assertTrue((self.tmp / "out" / "good" / "good_trans.nii.gz").is_file())

    def test_negative_point_is_a_point(self):
        src = _write_ct(self.tmp / "ct.nii.gz")
        res = vista3d("-i", src, "-o", self.tmp / "o", *TINY[:4], "--device", "cpu", "--points", "-3,4,5",
                      "--point-labels", "1")
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertIn("[[-3.0, 4.0, 5.0]] lie outside the image", res.stderr)


class TestKernelPreparation(unittest.TestCase):
    @parameterized.expand([("default", []), ("cuda_asked", ["--device", "cuda"])])
    def test_prepare_without_a_gpu_says_so(self, _, extra):
        res = vista3d("prepare", *extra, CUDA_VISIBLE_DEVICES="")  # no GPU, also on a machine that has one
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(res.stderr, "")
        self.assertEqual(res.stdout.splitlines(), [
            "vista3d prepare: nothing to prepare (no CUDA GPU here); the fused kernels run on a Hopper GPU with Triton"])

    def test_prepare_checks_its_flags(self):
        res = vista3d("prepare", "--roi-size", "50")
        self.assertEqual(res.returncode, 2)
        self.assertIn("--roi-size must be one or three positive multiples of 16", res.stderr)

    def test_unwritable_kernel_cache_costs_speed_not_the_run(self):
        from monai.apps.vista3d.cli.main import _usable_kernel_cache

        with tempfile.TemporaryDirectory() as tmp:
            blocker = Path(tmp) / "a_file"
            blocker.write_text("x")
            for cache, moved in ((str(blocker / "cache"), True), (str(Path(tmp) / "cache"), False)):
                with mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": cache}), mock.patch("sys.stderr") as err:
                    _usable_kernel_cache()
                    now = os.environ["TRITON_CACHE_DIR"]
                self.assertEqual(now != cache, moved)
                if moved:  # a fresh writable folder, and one line that says why
                    self.assertTrue(Path(now).is_dir())
                    written = "".join(c.args[0] for c in err.write.call_args_list)
                    self.assertIn(f"the kernel cache {cache} cannot be written; compiling into {now}", written)
                    Path(now).rmdir()
                else:
                    err.write.assert_not_called()


if __name__ == "__main__":
    unittest.main()
