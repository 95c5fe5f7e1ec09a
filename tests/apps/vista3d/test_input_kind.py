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
"""What an input is (io/input_kind.py), and the one line each kind gets on the command line and from load_image."""

from __future__ import annotations

import gzip
import io
import os
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.io.input_kind import folder_problem, input_kind, input_problem, looks_like_label_map
from monai.apps.vista3d.io.nifti import load_image
from tests.apps.vista3d.test_cli import TINY, _one_line_errors, _write_ct, run_main

DICOM = b"\0" * 128 + b"DICM" + b"\2\0\0\0UL\4\0" + b"\0" * 64  # a Part 10 preamble, magic and a first element
NRRD = b"NRRD0004\ntype: short\ndimension: 3\nsizes: 4 4 4\nencoding: raw\n\n" + b"\0" * 128
META = (b"ObjectType = Image\nNDims = 3\nDimSize = 4 4 4\nElementType = MET_SHORT\nElementDataFile = LOCAL\n"
        + bytes(128))


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("series/IM0001", DICOM)
    return buf.getvalue()


def _nifti() -> bytes:
    buf = io.BytesIO()
    img = nib.Nifti1Image(np.zeros((4, 4, 4), np.int16), np.eye(4))
    img.to_file_map({"image": nib.FileHolder(fileobj=buf), "header": nib.FileHolder(fileobj=buf)})
    return buf.getvalue()


CASES = [
    ("dicom_part10", "IM0001", DICOM, "dicom", None),  # the DICOM reader says what is wrong with it, if anything
    ("dicom_by_name", "slice.dcm", b"\x08\x00\x05\x00CS\x0a\x00ISO_IR 100", "dicom", None),
    ("nrrd", "ct.nrrd", NRRD, "nrrd", "an NRRD file; the command line and run_batch read NIfTI"),
    ("nrrd_detached", "ct.nhdr", b"type: short\n", "nrrd", "(vista3d serve reads NRRD)"),
    ("metaimage", "ct.mha", META, "metaimage", "a MetaImage file; the command line"),
    ("zip", "series.zip", _zip(), "dicom", None),
    ("nifti", "ct.nii", _nifti(), "nifti", None),
    ("nifti_gz", "ct.nii.gz", gzip.compress(_nifti()), "nifti", None),
    ("nifti_named_oddly", "ct.img", _nifti(), "nifti", None),
    ("text", "notes.txt", b"hello", "other", None),
]


class TestInputKind(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)

    @parameterized.expand(CASES)
    def test_kind_and_line(self, _, name, content, kind, message):
        path = self.tmp / name
        path.write_bytes(content)
        self.assertEqual(input_kind(path), kind)
        problem = input_problem(path)
        if message is None:
            self.assertIsNone(problem)
            return
        self.assertTrue(problem.startswith(f"{path}: "), problem)
        self.assertIn(message, problem)
        self.assertNotIn("\n", problem)
        with self.assertRaises(Vista3DInputError) as ctx:  # load_image says the same
            load_image(path)
        self.assertEqual(str(ctx.exception), problem)

    @parameterized.expand([(c[0], c[1], c[2]) for c in CASES if c[3] == "dicom"])
    def test_dicom_is_not_read_as_nifti(self, _, name, content):
        path = self.tmp / name
        path.write_bytes(content)
        with self.assertRaises(Vista3DInputError) as ctx:
            load_image(path)
        self.assertEqual(str(ctx.exception), f"{path}: a DICOM input; load_image reads NIfTI: read it with "
                         "monai.apps.vista3d.io.load_policy.load_input (or io.dicom.load_dicom).")
        self.assertEqual(input_problem(path, nifti_only=True), str(ctx.exception))
        self.assertIsNone(input_problem(path))  # for the batch, a DICOM input is the DICOM reader's

    def test_a_pipe_is_not_opened(self):
        path = self.tmp / "ct.nii.gz"
        os.mkfifo(path)
        self.assertEqual(input_kind(path), "other")  # returns at once: nobody writes the pipe
        self.assertIn("not a regular file", input_problem(path))

    @parameterized.expand([
        ("missing", None, "missing", "no such file; check the path."),
        ("folder", "dir", "folder", "is a folder with no DICOM file directly inside, not an image"),
        ("broken_link", "link", "missing", "a broken symbolic link"),
    ])
    def test_not_a_file(self, _, make, kind, message):
        path = self.tmp / "x.nii.gz"
        if make == "dir":
            path.mkdir()
        elif make == "link":
            path.symlink_to(self.tmp / "gone.nii.gz")
        self.assertEqual(input_kind(path), kind)
        self.assertIn(message, input_problem(path))

    @parameterized.expand([
        ("dicom", ["a/IM1", "a/IM2", "b/c.dcm"], [DICOM, DICOM, DICOM], "holds zip archives or DICOM files (3) and no image the folder search takes"),
        ("nrrd", ["x.nrrd", "seg.seg.nrrd"], [NRRD, NRRD], "holds NRRD files (2)"),
        ("zip", ["s.zip"], [_zip()], "holds zip archives or DICOM files (1)"),
        ("empty", [], [], "no .nii or .nii.gz image or DICOM series found"),
        ("hidden_dicom", [".cache/IM1"], [DICOM], "no .nii or .nii.gz image or DICOM series found"),
    ])
    def test_folder(self, _, names, contents, message):
        for name, content in zip(names, contents):
            (self.tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (self.tmp / name).write_bytes(content)
        problem = folder_problem(self.tmp)
        self.assertTrue(problem.startswith(f"{self.tmp}: "))
        self.assertIn(message, problem)


def _labels(dtype, intent: str | None = None, first_slice_value: int = 0) -> nib.Nifti1Image:
    lab = np.zeros((30, 28, 12), dtype)
    lab[5:20, 4:12, 3:9], lab[20:25, 14:20, 3:9] = 1, 5
    lab[..., 0] = first_slice_value
    img = nib.Nifti1Image(lab, np.diag([1.5, 1.5, 2.5, 1.0]))
    if intent is not None:
        img.header.set_intent(intent)
    return img


class TestLabelMaps(unittest.TestCase):
    """Other tools' label maps in a folder search (TotalSegmentator and nnU-Net write uint8, MONAI's bundle float32,
    ITK-SNAP uint16), told from CTs by their header and first slice."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)

    @parameterized.expand([
        ("uint8", _labels(np.uint8), True),
        ("uint16", _labels(np.uint16), True),
        ("int16", _labels(np.int16), True),
        ("float32", _labels(np.float32), True),
        ("label intent, first slice like a CT", _labels(np.int16, "label", -1000), True),
        ("neuroname intent", _labels(np.int16, "neuroname", -1000), True),
        ("air in the first slice", _labels(np.int16, None, -1000), False),
        ("no background in the first slice (a noise-free phantom)", _labels(np.int16, None, 40), False),
        ("a single voxel (no volume: its load refuses it)", nib.Nifti1Image(np.zeros((1, 1, 1), np.uint8), np.eye(4)),
         False),
    ])
    def test_rule(self, _, img, expected):
        for suffix in (".nii", ".nii.gz"):
            nib.save(img, self.tmp / f"x{suffix}")
            self.assertEqual(looks_like_label_map(self.tmp / f"x{suffix}"), expected, suffix)

    @parameterized.expand([("int16",), ("uint8",), ("float32",), ("float64",)])
    def test_cts_are_not_label_maps(self, dtype):
        for orientation in ("RAS", "LPS", "PIR"):
            ct = write_phantom(self.tmp / "ct.nii.gz", (32, 30, 20), seed=1, orientation=orientation, dtype=dtype)
            self.assertFalse(looks_like_label_map(ct), orientation)

    def test_unreadable_files_are_not_label_maps(self):
        for name, content in (("a.nii.gz", b"\x1f\x8bnot gzip"), ("b.nii", b"short"), ("c.nii", DICOM)):
            (self.tmp / name).write_bytes(content)
            self.assertFalse(looks_like_label_map(self.tmp / name), name)

    def test_folder_search_leaves_them_out_with_a_note(self):
        ct = _write_ct(self.tmp / "in" / "p1" / "ct.nii.gz")
        for name, img in (("p1/seg.nii.gz", _labels(np.uint8)), ("p1/totalseg/liver.nii.gz", _labels(np.uint8)),
                          ("p2/labels.nii", _labels(np.float32))):
            (self.tmp / "in" / name).parent.mkdir(parents=True, exist_ok=True)
            nib.save(img, self.tmp / "in" / name)
        code, out, err = run_main(["-i", self.tmp / "in", "-o", self.tmp / "out", *TINY[:-1]])
        self.assertEqual(code, 0, err)
        lines = _one_line_errors(self, err)
        self.assertEqual(len(lines), 1, err)
        self.assertRegex(lines[0], r"^warning: left out 3 label map\(s\) found in the input folders, e\.g\. .*in/p1/"
                                   r"seg\.nii\.gz \(a label intent, or a first slice of at most 32 whole .*name a "
                                   r"file to segment it")
        self.assertEqual([p.name for p in (self.tmp / "out").rglob("*.nii.gz")], ["ct_trans.nii.gz"])
        self.assertIn(str(ct), out)
        # named explicitly, a label map is segmented as asked
        code, _, err = run_main(["-i", self.tmp / "in" / "p2" / "labels.nii", "-o", self.tmp / "out2", *TINY])
        self.assertEqual(code, 0, err)
        self.assertTrue((self.tmp / "out2" / "labels" / "labels_trans.nii.gz").is_file())


class TestOnTheCommandLine(unittest.TestCase):
    """Other formats are said before any network is built: a folder is refused (exit 2), a file fails as its image."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)

    def test_folder_of_zip_archives_refused(self):
        (self.tmp / "cts").mkdir()
        (self.tmp / "cts" / "series.zip").write_bytes(_zip())
        code, _, err = run_main(["-i", self.tmp / "cts", "-o", self.tmp / "out", *TINY])
        self.assertEqual(code, 2, err)
        self.assertEqual(_one_line_errors(self, err), [
            f"error: {self.tmp / 'cts'}: holds zip archives or DICOM files (1) and no image the folder search takes; "
            "give a zip of one DICOM series with -i, or the series' folder."])
        self.assertFalse((self.tmp / "out").exists())

    def test_files_fail_before_the_network_is_built(self):
        (self.tmp / "ct.nrrd").write_bytes(NRRD)
        ct = _write_ct(self.tmp / "ct.nii.gz")
        bad = [self.tmp / "ct.nrrd", self.tmp / "gone.nii.gz"]
        said_at_build = []

        def build(job):  # what stderr held when the network was built
            said_at_build.append(sys.stderr.getvalue())
            return real_build(job)

        real_build = SegmentJob.build
        for inputs, builds in ((bad, 0), ([*bad, ct], 1)):
            said_at_build.clear()
            with mock.patch.object(SegmentJob, "build", build):
                code, _, err = run_main([*(a for p in inputs for a in ("-i", p)), "-o", self.tmp / "out", *TINY])
            self.assertEqual(code, 1, err)
            lines = _one_line_errors(self, err)
            self.assertIn("ct.nrrd: an NRRD file", lines[0])
            self.assertIn("gone.nii.gz: no such file", lines[1])
            self.assertEqual(lines[2], f"error: 2 of {len(inputs)} image(s) failed")
            self.assertEqual(len(said_at_build), builds)  # no network for inputs that cannot be read
            for said in said_at_build:
                self.assertEqual(said.count("error: "), 2, said)  # each bad input said before the build
        self.assertTrue((self.tmp / "out" / "ct" / "ct_trans.nii.gz").is_file())


if __name__ == "__main__":
    unittest.main()
