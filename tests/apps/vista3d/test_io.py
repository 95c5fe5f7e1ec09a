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

from __future__ import annotations

import gzip
import hashlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from nibabel.testing import data_path
from parameterized import parameterized

from monai.apps.vista3d.cli.phantom import (
    PHANTOM_HU,
    PHANTOM_LABELS,
    make_phantom,
    make_phantom_labels,
    write_phantom,
)
from monai.apps.vista3d.config import DEFAULT_OUTPUT_DTYPE
from monai.apps.vista3d.core.postprocess import ClassMasks, pack_masks
from monai.apps.vista3d.errors import Vista3DInputError, Vista3DOutputError
from monai.apps.vista3d.io import label_transfer, nifti_read, nifti_write
from monai.apps.vista3d.io import nifti as vio
from monai.apps.vista3d.io.atomic import write_atomically
from monai.apps.vista3d.io.gzip_codec import available_cores
from monai.apps.vista3d.io.image_geometry import LPS_RAS_FLIP, ImageGeometry, as_xyz, reverse_voxel_axes
from monai.apps.vista3d.io.nifti import load_image
from monai.apps.vista3d.io.nifti_write import save_class_masks, save_label_map
from monai.apps.vista3d.io.paths import (
    class_file_name,
    class_mask_dir,
    class_mask_paths,
    output_path,
)
from monai.apps.vista3d.labels import label_names

NIBABEL_FILES = [
    ("anatomical.nii",),  # big-endian int16, LAS
    ("reoriented_anat_moved.nii",),  # big-endian float32, RAS
    ("standard.nii.gz",),  # uint8, xyzt_units unknown, only an sform
]


def _patch_header(path, endianness=None, **fields):
    """Edit header fields of an uncompressed .nii in place (to write headers nibabel refuses to make)."""
    path = pathlib.Path(path)
    raw = bytearray(path.read_bytes())
    hdr = nib.Nifti1Header.from_fileobj(__import__("io").BytesIO(bytes(raw)), check=False)
    data = np.ndarray(hdr.get_data_shape(), hdr.get_data_dtype(), raw, int(hdr["vox_offset"]), order="F").copy()
    if endianness is not None and endianness != hdr.endianness:
        hdr = hdr.as_byteswapped(endianness)
        data = data.astype(data.dtype.newbyteorder(endianness))
    for key, value in fields.items():
        hdr[key] = value
    hdr["vox_offset"] = 0
    bio = __import__("io").BytesIO()
    hdr.write_to(bio)
    head = bio.getvalue()
    path.write_bytes(head + b"\x00" * (int(hdr["vox_offset"]) - len(head)) + data.tobytes(order="F"))


def _sha(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


class TempDirCase(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = pathlib.Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()


class TestPhantom(unittest.TestCase):
    def test_deterministic_and_plausible(self):
        a, aff = make_phantom((48, 40, 32), (1.0, 1.0, 1.5), seed=3)
        b, _ = make_phantom((48, 40, 32), (1.0, 1.0, 1.5), seed=3)
        c, _ = make_phantom((48, 40, 32), (1.0, 1.0, 1.5), seed=4)
        np.testing.assert_array_equal(a, b)
        self.assertFalse(np.array_equal(a, c))
        self.assertEqual(a.dtype, np.int16)
        np.testing.assert_allclose(np.diag(aff)[:3], [1.0, 1.0, 1.5])
        # the centre of the volume is the world origin
        np.testing.assert_allclose(aff @ [23.5, 19.5, 15.5, 1], [0, 0, 0, 1], atol=1e-9)
        # every tissue appears (noise is at most 15 HU)
        for name, hu in PHANTOM_HU.items():
            self.assertTrue(np.any(np.abs(a.astype(int) - hu) <= 15), name)
        self.assertLessEqual(abs(int(a[0, 0, 0]) + 1000), 15)  # air in the corner

    def test_labels_match_phantom(self):
        hu, _ = make_phantom((48, 40, 32), seed=2)
        labels = make_phantom_labels((48, 40, 32), seed=2)
        for name, label in PHANTOM_LABELS.items():
            inside = labels == label
            self.assertTrue(inside.any(), name)
            expected = PHANTOM_HU["kidney" if "kidney" in name else name]
            self.assertLessEqual(np.abs(hu[inside].astype(int) - expected).max(), 15, name)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            make_phantom((4, 40, 32))
        with self.assertRaises(ValueError):
            make_phantom((16, 16, 16), (0.0, 1.0, 1.0))
        with tempfile.TemporaryDirectory() as d, self.assertRaises(ValueError):
            write_phantom(os.path.join(d, "x.nii"), (16, 16, 16), orientation="XYZ")


class TestAsXyz(unittest.TestCase):
    def test_three_values(self):
        self.assertEqual(as_xyz(int(s) for s in np.zeros((4, 5, 6)).shape), (4, 5, 6))
        geom = ImageGeometry(np.diag([0.5, 2.0, 3.0, 1.0]), (4, 5, 6), None, None, np.dtype(np.int16))
        self.assertEqual(geom.spacing, (0.5, 2.0, 3.0))

    @parameterized.expand([("two", (4, 5)), ("four", (1, 4, 5, 6))])
    def test_other_counts_refused(self, _, values):
        with self.assertRaisesRegex(ValueError, f"three values.*got {len(values)}"):
            as_xyz(values)


class TestLpsRasAndAxes(unittest.TestCase):
    def test_flip_converts_both_ways(self):
        lps = np.array([10.0, 20.0, 30.0, 1.0])  # 10 mm left, 20 mm posterior, 30 mm superior of the origin
        np.testing.assert_array_equal(LPS_RAS_FLIP @ lps, [-10.0, -20.0, 30.0, 1.0])
        np.testing.assert_array_equal(LPS_RAS_FLIP @ LPS_RAS_FLIP, np.eye(4))
        with self.assertRaises(ValueError):  # one matrix shared by every reader and writer: nobody may edit it
            LPS_RAS_FLIP[0, 0] = 1.0

    def test_reverse_voxel_axes_keeps_each_voxel_in_place(self):
        rng = np.random.default_rng(0)
        array = rng.integers(0, 100, size=(2, 3, 4))
        affine = np.eye(4)
        affine[:3] = rng.normal(size=(3, 4))  # oblique, with an origin
        out, out_affine = reverse_voxel_axes(array, affine)
        self.assertEqual(out.shape, (4, 3, 2))
        for i, j, k in np.ndindex(*array.shape):
            self.assertEqual(out[k, j, i], array[i, j, k])
            np.testing.assert_allclose(out_affine @ [k, j, i, 1], affine @ [i, j, k, 1])
        back, back_affine = reverse_voxel_axes(out, out_affine)
        np.testing.assert_array_equal(back, array)
        np.testing.assert_array_equal(back_affine, affine)
        out_affine[0, 0] = 99.0  # a copy: the caller's affine is not changed through it
        self.assertNotEqual(affine[0, 0], 99.0)


class TestRoundTrip(TempDirCase):
    @parameterized.expand(
        [
            ("RAS", "int16", ".nii.gz"),
            ("LAS", "int16", ".nii"),
            ("LPS", "float32", ".nii.gz"),
            ("PIR", "float64", ".nii"),
            ("oblique", "int16", ".nii.gz"),
            ("RAS", "uint8", ".nii.gz"),  # nibabel sets scl_slope/scl_inter
        ]
    )
    def test_load_save(self, orientation, dtype, suffix):
        src = write_phantom(self.tmp / f"in{suffix}", (20, 18, 12), (0.8, 1.1, 2.5), 1, orientation, dtype=dtype)
        before = _sha(src)
        ref = nib.load(src)
        image, geom = load_image(src)
        self.assertEqual(image.dtype, torch.float32)
        self.assertEqual(tuple(image.shape), (1,) + ref.shape)
        self.assertTrue(image.is_contiguous())
        np.testing.assert_allclose(image[0].numpy(), ref.get_fdata(), rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(geom.affine, ref.affine)
        self.assertEqual(geom.affine.dtype, np.float64)
        self.assertEqual(geom.spatial_shape, ref.shape)
        self.assertEqual(geom.dtype, ref.get_data_dtype())
        self.assertEqual(geom.filename, str(src))
        self.assertEqual(nib.aff2axcodes(geom.affine), nib.aff2axcodes(ref.affine))
        np.testing.assert_allclose(sorted(geom.spacing), sorted([0.8, 1.1, 2.5]), rtol=1e-6)

        labels = torch.from_numpy((ref.get_fdata() > 0).astype(np.float32) * 3)
        for out_dtype, out_suffix in [("float32", ".nii.gz"), ("uint8", ".nii"), ("int16", ".nii.gz")]:
            out = save_label_map(labels, geom, self.tmp / "out" / f"seg{out_suffix}", dtype=out_dtype)
            back = nib.load(out)
            self.assertEqual(back.get_data_dtype(), np.dtype(out_dtype))
            np.testing.assert_array_equal(np.asanyarray(back.dataobj), labels.numpy())
            np.testing.assert_array_equal(back.affine, ref.affine)
            for key in ("qform_code", "sform_code", "pixdim", "xyzt_units"):
                np.testing.assert_array_equal(back.header[key], ref.header[key], err_msg=key)
            np.testing.assert_allclose(back.header.get_qform(), ref.header.get_qform(), atol=1e-6)
            np.testing.assert_allclose(back.header.get_sform(), ref.header.get_sform(), atol=1e-6)
            self.assertEqual((back.dataobj.slope, back.dataobj.inter), (1.0, 0.0))
            self.assertEqual(back.shape, ref.shape)
        self.assertEqual(_sha(src), before, "the input file changed")

    @parameterized.expand([
        ("negative pixdim, qform and sform", {"pixdim": [1, -1.5, 1.5, 1.5, 1, 1, 1, 1]}),
        ("negative pixdim, qform only", {"pixdim": [-1, 1.5, -1.5, 2.0, 1, 1, 1, 1], "sform_code": 0}),
        ("qfac 0, sform only", {"pixdim": [0, 1.5, 1.5, 2.0, 1, 1, 1, 1], "qform_code": 0}),
    ])
    def test_stored_geometry_kept(self, _, fields):
        """nibabel reads a negative pixdim as positive (and qfac 0 as 1); the output keeps the stored fields, so that
        readers that take the sign as a flip (ITK, SimpleITK) place the label map on the CT."""
        src = write_phantom(self.tmp / "ct.nii", (20, 18, 12), (1.5, 1.5, 2.0), 1)
        _patch_header(src, **fields)

        def stored(path):
            block = (gzip.open(path) if str(path).endswith(".gz") else open(path, "rb")).read(348)
            return nib.Nifti1Header(block, check=False)

        image, geom = load_image(src)
        for suffix in (".nii.gz", ".nii"):
            out = save_label_map(torch.zeros(image.shape[1:]), geom, self.tmp / f"seg{suffix}")
            before, after = stored(src), stored(out)
            for key in ("pixdim", "qform_code", "sform_code", "quatern_b", "quatern_c", "quatern_d", "qoffset_x",
                        "qoffset_y", "qoffset_z", "srow_x", "srow_y", "srow_z", "xyzt_units"):
                np.testing.assert_array_equal(after[key], before[key], err_msg=key)
            np.testing.assert_array_equal(nib.load(out).affine, nib.load(src).affine)

    def test_settings_record(self):
        """A label map's settings record is its one 'vista3d-settings' comment; the input's other extensions stay."""
        img = nib.Nifti1Image(np.full((8, 8, 8), -1000, np.int16), np.eye(4))
        img.header.extensions.append(nib.nifti1.Nifti1Extension("comment", b'vista3d-settings {"old": 1}'))
        img.header.extensions.append(nib.nifti1.Nifti1Extension("afni", b"<AFNI_attributes/>"))
        nib.save(img, self.tmp / "ct.nii.gz")
        image, geom = load_image(self.tmp / "ct.nii.gz")
        self.assertEqual(nifti_write.read_output_record(self.tmp / "ct.nii.gz"), {"old": 1})
        for record in ({"classes": [1, 3], "weights": None}, None):
            out = save_label_map(torch.zeros(image.shape[1:]), geom, self.tmp / "seg.nii.gz", record=record)
            self.assertEqual(nifti_write.read_output_record(out), record)
            self.assertEqual([e.get_code() for e in nib.load(out).header.extensions], [4] + [6] * (record is not None))
            self.assertTrue(nifti_write.is_vista3d_output(out))
            self.assertIsNone(nifti_write.output_problem(out))

    @parameterized.expand([("list", b"[1, 3]"), ("number", b"7"), ("broken", b'{"classes": ')])
    def test_settings_record_not_an_object(self, _, text):
        """A record that is no JSON object (a rerun compares it key by key) reads as unreadable: None."""
        img = nib.Nifti1Image(np.zeros((8, 8, 8), np.uint8), np.eye(4))
        img.header.extensions.append(nib.nifti1.Nifti1Extension("comment", b"vista3d-settings " + text))
        nib.save(img, self.tmp / "seg.nii.gz")
        self.assertIsNone(nifti_write.read_output_record(self.tmp / "seg.nii.gz"))

    @parameterized.expand(NIBABEL_FILES)
    def test_nibabel_files(self, name):
        src = os.path.join(data_path, name)
        before = _sha(src)
        ref = nib.load(src)
        image, geom = load_image(src)
        np.testing.assert_allclose(image[0].numpy(), ref.get_fdata(), rtol=1e-6)
        np.testing.assert_array_equal(geom.affine, ref.affine)
        self.assertEqual(geom.dtype, ref.get_data_dtype())
        out = save_label_map(image[0] > image.mean(), geom, self.tmp / "seg.nii.gz", dtype="uint8")
        back = nib.load(out)
        np.testing.assert_array_equal(back.affine, ref.affine)
        np.testing.assert_array_equal(np.asanyarray(back.dataobj), (image[0] > image.mean()).numpy())
        self.assertEqual(back.header["sform_code"], ref.header["sform_code"])
        self.assertEqual(back.header["qform_code"], ref.header["qform_code"])
        self.assertEqual(_sha(src), before)

    @parameterized.expand([("example4d.nii.gz", 1), ("example_nifti2.nii.gz", 0), ("functional.nii", 19)])
    def test_4d_volume_index(self, name, index):
        src = os.path.join(data_path, name)
        ref = nib.load(src)
        image, geom = load_image(src, volume_index=index)
        np.testing.assert_allclose(image[0].numpy(), ref.get_fdata()[..., index])
        self.assertEqual(geom.spatial_shape, ref.shape[:3])
        out = save_label_map(image > 0, geom, self.tmp / "seg.nii.gz", dtype="uint8")
        back = nib.load(out)
        self.assertEqual(type(back), type(ref))  # NIfTI-2 stays NIfTI-2
        self.assertEqual(back.shape, ref.shape[:3])
        np.testing.assert_array_equal(back.affine, ref.affine)
        with self.assertRaisesRegex(Vista3DInputError, "volume_index"):
            load_image(src)
        with self.assertRaisesRegex(Vista3DInputError, "out of range"):
            load_image(src, volume_index=ref.shape[3])

    def test_scaled_big_endian(self):
        data = np.arange(6 * 5 * 4, dtype=">i2").reshape(6, 5, 4) - 30
        nib.save(nib.Nifti1Image(data, np.diag([2.0, 3.0, 4.0, 1.0])), self.tmp / "be.nii")
        _patch_header(self.tmp / "be.nii", scl_slope=0.5, scl_inter=-7.25, endianness=">")
        self.assertEqual(nib.load(self.tmp / "be.nii").header.endianness, ">")
        np.testing.assert_allclose(nib.load(self.tmp / "be.nii").get_fdata(), data * 0.5 - 7.25)
        image, geom = load_image(self.tmp / "be.nii")
        np.testing.assert_allclose(image[0].numpy(), data * 0.5 - 7.25)
        self.assertEqual(geom.dtype, np.dtype(">i2"))
        out = save_label_map(image[0] > 0, geom, self.tmp / "seg.nii.gz", dtype="uint8")
        back = nib.load(out)
        self.assertEqual((back.dataobj.slope, back.dataobj.inter), (1.0, 0.0))
        np.testing.assert_array_equal(back.get_fdata(), (data * 0.5 - 7.25) > 0)

    def test_multimember_gzip(self):
        src = write_phantom(self.tmp / "a.nii", (16, 16, 12), seed=2)
        raw = src.read_bytes()
        (self.tmp / "b.nii.gz").write_bytes(gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]))
        a, _ = load_image(src)
        b, _ = load_image(self.tmp / "b.nii.gz")
        torch.testing.assert_close(a, b)

    def test_output_header_without_input(self):
        geom = ImageGeometry(np.diag([1.5, 1.5, 2.0, 1.0]), (4, 5, 6), None, None, np.dtype("int16"))
        out = save_label_map(np.ones((1, 4, 5, 6)), geom, self.tmp / "x.nii.gz", dtype="uint8")
        np.testing.assert_array_equal(nib.load(out).affine, geom.affine)


class TestAtomicWrite(TempDirCase):
    def setUp(self):
        super().setUp()
        self.src = write_phantom(self.tmp / "in.nii.gz", (16, 16, 12), seed=0)
        self.image, self.geom = load_image(self.src)

    def _names(self):
        return sorted(p.name for p in self.tmp.iterdir())

    @parameterized.expand([("seg.nii.gz",), ("seg.nii",)])
    def test_failure_mid_write_leaves_nothing(self, name):
        target = self.tmp / name
        with mock.patch.object(nifti_write, "write_gzip", side_effect=RuntimeError("disk gone")), mock.patch.object(
            os, "fsync", side_effect=OSError(5, "Input/output error")
        ):
            with self.assertRaises((RuntimeError, Vista3DOutputError)):
                save_label_map(self.image > 0, self.geom, target)
        self.assertFalse(target.exists())
        self.assertEqual(self._names(), ["in.nii.gz"])

    def test_failure_keeps_previous_output(self):
        target = save_label_map(self.image > 0, self.geom, self.tmp / "seg.nii.gz")
        before = _sha(target)
        with mock.patch.object(os, "replace", side_effect=OSError(28, "No space left on device")):
            with self.assertRaisesRegex(Vista3DOutputError, "No space left"):
                save_label_map(self.image > 100, self.geom, target)
        self.assertEqual(_sha(target), before)
        self.assertEqual(self._names(), ["in.nii.gz", "seg.nii.gz"])

    @parameterized.expand([
        ("full_disk", OSError(28, "No space left on device"), Vista3DOutputError, "writing failed"),
        ("writer_error", ValueError("bad picture"), ValueError, "bad picture"),
    ])
    def test_small_file_failure_keeps_the_previous_one(self, _, error, raised, words):
        """write_atomically (statistics, preview, SEG) fails as a label map does: the old file stays, no temporary
        file is left, a full disk is one line."""
        target = self.tmp / "statistics.json"
        target.write_bytes(b"old")

        def write(f):
            f.write(b"partial")
            raise error

        with self.assertRaisesRegex(raised, words):
            write_atomically(target, write)
        self.assertEqual(target.read_bytes(), b"old")
        self.assertEqual(self._names(), ["in.nii.gz", "statistics.json"])
        self.assertEqual(write_atomically(target, lambda f: f.write(b"new")), target)
        self.assertEqual((target.read_bytes(), self._names()), (b"new", ["in.nii.gz", "statistics.json"]))

    @parameterized.expand([(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
    def test_file_mode_follows_umask(self, umask, mode):
        old = os.umask(umask)  # the test sets the umask; the library must only obey it
        try:
            with mock.patch.object(os, "umask", side_effect=AssertionError("io must not touch the umask")):
                target = save_label_map(self.image > 0, self.geom, self.tmp / f"seg{umask}.nii.gz")
        finally:
            os.umask(old)
        self.assertEqual(target.stat().st_mode & 0o777, mode)
        self.assertEqual(self._names(), ["in.nii.gz", f"seg{umask}.nii.gz"])

    def test_importing_io_leaves_the_umask_alone(self):
        code = "import os, unittest.mock as m; m.patch.object(os, 'umask', side_effect=SystemExit(3)).start(); "
        code += "import monai.apps.vista3d.io.nifti"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.assertEqual(subprocess.run([sys.executable, "-c", code], env=env).returncode, 0)


class TestBadInput(TempDirCase):
    def _write(self, data, name="x.nii.gz", affine=None, units="mm"):
        img = nib.Nifti1Image(data, np.eye(4) if affine is None else affine)
        img.header.set_xyzt_units(units)
        nib.save(img, self.tmp / name)
        return self.tmp / name

    def test_missing(self):
        with self.assertRaisesRegex(Vista3DInputError, "no such file"):
            load_image(self.tmp / "nope.nii.gz")
        with self.assertRaisesRegex(Vista3DInputError, "is a folder with no DICOM file directly inside, not an image"):
            load_image(self.tmp)

    @parameterized.expand(
        [
            (b"hello, this is not an image\n" * 40, "not a NIfTI"),
            (b"", "not a NIfTI"),
            (gzip.compress(b"plain text inside a gzip file" * 30), "not a NIfTI"),
        ]
    )
    def test_not_nifti(self, content, msg):
        (self.tmp / "x.nii.gz").write_bytes(content)
        with self.assertRaisesRegex(Vista3DInputError, msg):
            load_image(self.tmp / "x.nii.gz")

    def test_pair_and_analyze(self):
        with self.assertRaisesRegex(Vista3DInputError, "pair"):
            load_image(os.path.join(data_path, "nifti1.hdr"))
        with self.assertRaisesRegex(Vista3DInputError, "not a NIfTI"):
            load_image(os.path.join(data_path, "analyze.hdr"))

    @parameterized.expand([(0.5,), (0.97,), (-8,)])
    def test_truncated_gzip(self, frac):
        src = write_phantom(self.tmp / "good.nii.gz", (24, 24, 16), seed=0)
        raw = src.read_bytes()
        cut = raw[: int(len(raw) * frac)] if frac > 0 else raw[:frac]
        (self.tmp / "cut.nii.gz").write_bytes(cut)
        with self.assertRaisesRegex(Vista3DInputError, "corrupt or truncated gzip"):
            load_image(self.tmp / "cut.nii.gz")

    def test_corrupt_gzip(self):
        src = write_phantom(self.tmp / "good.nii.gz", (24, 24, 16), seed=0)
        raw = bytearray(src.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        (self.tmp / "bad.nii.gz").write_bytes(bytes(raw))
        with self.assertRaisesRegex(Vista3DInputError, "corrupt or truncated gzip"):
            load_image(self.tmp / "bad.nii.gz")

    def test_truncated_nii(self):
        src = write_phantom(self.tmp / "good.nii", (24, 24, 16), seed=0)
        (self.tmp / "cut.nii").write_bytes(src.read_bytes()[:-100])
        with self.assertRaisesRegex(Vista3DInputError, "truncated"):
            load_image(self.tmp / "cut.nii")

    @parameterized.expand([((10, 12), "a 2D image"), ((10, 12, 1), "a 2D image"), ((10, 1, 12), "a 2D image"),
                           ((1, 1, 1), "a single voxel"), ((1, 9, 1), "a line of voxels")])
    def test_not_3d(self, shape, what):
        msg = re.escape(f"{what} (shape {tuple(shape)}); VISTA3D segments 3D")
        with self.assertRaisesRegex(Vista3DInputError, msg):
            load_image(self._write(np.zeros(shape, np.int16)))

    @parameterized.expand([
        ("x.nii", "truncated: the header needs"),
        ("x.nii.gz", "more than a .*-byte .nii.gz can hold"),
    ])
    def test_header_claims_a_huge_volume(self, name, msg):
        hdr = nib.Nifti1Header()
        hdr.set_data_shape((4000, 4000, 4000))
        hdr.set_data_dtype(np.int16)
        hdr["vox_offset"] = 352
        raw = hdr.binaryblock + b"\x00" * 4 + b"\x01\x00" * 5000
        path = self.tmp / name
        path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
        with mock.patch.object(np, "empty", side_effect=AssertionError("allocated")):
            with self.assertRaisesRegex(Vista3DInputError, msg):
                load_image(path)

    def test_more_than_the_memory(self):
        path = self._write(np.ones((20, 20, 20), np.int16), name="x.nii")
        with mock.patch.object(nifti_read, "host_memory_available", return_value=1000):
            with self.assertRaisesRegex(Vista3DInputError, "reading it needs .* GiB of memory"):
                load_image(path)

    def test_4d_singleton_is_3d(self):
        image, geom = load_image(self._write(np.ones((5, 6, 7, 1), np.int16)))
        self.assertEqual(tuple(image.shape), (1, 5, 6, 7))
        with self.assertRaisesRegex(Vista3DInputError, "out of range"):
            load_image(self._write(np.ones((5, 6, 7), np.int16)), volume_index=1)

    def test_5d(self):
        with self.assertRaisesRegex(Vista3DInputError, "5D"):
            load_image(self._write(np.ones((5, 6, 7, 2, 3), np.int16)))

    @parameterized.expand([(np.nan, "1 NaN, 0 Inf"), (np.inf, "0 NaN, 1 Inf")])
    def test_non_finite(self, value, msg):
        data = np.zeros((6, 6, 6), np.float32)
        data[1, 2, 3] = value
        with self.assertRaisesRegex(Vista3DInputError, msg):
            load_image(self._write(data))
        with self.assertWarnsRegex(UserWarning, f"1 voxel\\(s\\) are not finite \\({msg}\\); read as air"):
            image, _ = load_image(self._write(data), nonfinite="air")
        self.assertEqual(float(image[0, 1, 2, 3]), vio.AIR_HU)
        self.assertEqual(float(image.sum()), vio.AIR_HU)

    def test_nibabel_image_with_nan_outside_the_field_of_view(self):
        path = pathlib.Path(data_path) / "resampled_anat_moved.nii"
        n_nan = int(np.isnan(np.asanyarray(nib.load(path).dataobj)).sum())
        self.assertGreater(n_nan, 0)
        with self.assertRaisesRegex(Vista3DInputError, f"{n_nan} NaN"):
            load_image(path)
        with self.assertWarnsRegex(UserWarning, f"{n_nan} voxel\\(s\\) are not finite"):
            image, _ = load_image(path, nonfinite="air")
        self.assertTrue(bool(torch.isfinite(image).all()))

    def test_zero_spacing(self):
        path = self._write(np.ones((6, 6, 6), np.int16), name="x.nii")
        pixdim = nib.load(path).header["pixdim"].copy()
        pixdim[2] = 0.0
        _patch_header(path, pixdim=pixdim, qform_code=1, sform_code=0)
        with self.assertRaisesRegex(Vista3DInputError, "spacing"):
            load_image(path)
        _patch_header(path, sform_code=1, srow_x=[1, 0, 0, 0], srow_y=[1, 0, 0, 0], srow_z=[0, 0, 1, 0])
        with self.assertRaisesRegex(Vista3DInputError, "degenerate"):
            load_image(path)
        _patch_header(path, sform_code=1, srow_x=[1, 0, 0, 0], srow_y=[0, np.nan, 0, 0], srow_z=[0, 0, 1, 0])
        with self.assertRaisesRegex(Vista3DInputError, "non-finite"):
            load_image(path)

    def test_units(self):
        load_image(self._write(np.ones((6, 6, 6), np.int16), units="unknown"))  # read as mm
        with self.assertRaisesRegex(Vista3DInputError, "meter"):
            load_image(self._write(np.ones((6, 6, 6), np.int16), units="meter"))

    def test_output_errors(self):
        src = write_phantom(self.tmp / "in.nii.gz", (16, 16, 12), seed=0)
        before = _sha(src)
        image, geom = load_image(src)
        with self.assertRaisesRegex(Vista3DOutputError, "is the input"):
            save_label_map(image > 0, geom, src)
        with self.assertRaisesRegex(Vista3DOutputError, "is the input"):
            save_label_map(image > 0, geom, self.tmp / "." / "sub" / ".." / "in.nii.gz")
        os.link(src, self.tmp / "hardlink.nii.gz")
        with self.assertRaisesRegex(Vista3DOutputError, "is the input"):
            save_label_map(image > 0, geom, self.tmp / "hardlink.nii.gz")
        (self.tmp / "file").write_text("a file, not a folder")
        with self.assertRaisesRegex(Vista3DOutputError, "cannot write"):
            save_label_map(image > 0, geom, self.tmp / "file" / "seg.nii.gz")
        if os.geteuid() != 0:  # root can write anywhere
            ro = self.tmp / "ro"
            ro.mkdir(mode=0o500)
            with self.assertRaisesRegex(Vista3DOutputError, "cannot write"):
                save_label_map(image > 0, geom, ro / "seg.nii.gz")
        self.assertEqual(_sha(src), before)

    def test_bad_labels(self):
        src = write_phantom(self.tmp / "in.nii.gz", (16, 16, 12), seed=0)
        image, geom = load_image(src)
        with self.assertRaisesRegex(Vista3DInputError, "does not match the input grid"):
            save_label_map(torch.zeros(16, 16, 11), geom, self.tmp / "seg.nii.gz")
        with self.assertRaisesRegex(Vista3DInputError, "does not fit uint8"):
            save_label_map(torch.full((16, 16, 12), 300.0), geom, self.tmp / "seg.nii.gz", dtype="uint8")
        with self.assertRaisesRegex(Vista3DInputError, "does not fit uint8"):
            save_label_map(torch.full((16, 16, 12), float("nan")), geom, self.tmp / "seg.nii.gz", dtype="uint8")
        with self.assertRaisesRegex(Vista3DInputError, "not supported"):
            save_label_map(image, geom, self.tmp / "seg.nii.gz", dtype="complex64")
        with self.assertRaisesRegex(Vista3DInputError, ".nii"):
            save_label_map(image, geom, self.tmp / "seg.png")
        with self.assertRaisesRegex(Vista3DInputError, "compresslevel"):
            save_label_map(image, geom, self.tmp / "seg.nii.gz", compresslevel=11)
        self.assertFalse((self.tmp / "seg.nii.gz").exists())


class TestLayout(TempDirCase):
    def setUp(self):
        super().setUp()
        self.src = write_phantom(self.tmp / "in.nii.gz", (40, 36, 24), seed=5)
        self.image, _ = load_image(self.src)

    def test_fortran_layout(self):
        image, _ = load_image(self.src, contiguous=False)
        self.assertFalse(image.is_contiguous())
        self.assertEqual(image.stride()[1:], (1, 40, 40 * 36))
        torch.testing.assert_close(image, self.image, rtol=0, atol=0)


# (name, numpy array written by nibabel, suffix, header edits, torch dtype of load_image(dtype=None))
STORED_CASES = [
    ("int16_gz", np.int16, ".nii.gz", {}, torch.int16),
    ("int16_nii", np.int16, ".nii", {}, torch.int16),
    ("int16_big_endian", np.int16, ".nii", {"endianness": ">"}, torch.int16),
    ("uint8", np.uint8, ".nii.gz", {}, torch.uint8),
    ("uint16_widened", np.uint16, ".nii.gz", {}, torch.int32),
    ("float32", np.float32, ".nii.gz", {}, torch.float32),
    ("float64", np.float64, ".nii", {}, torch.float64),
    ("scaled_int16", np.int16, ".nii", {"scl_slope": 0.5, "scl_inter": -3.0}, torch.float32),
]


class TestStoredLoad(TempDirCase):
    """``load_image(dtype=None)``: the stored values in the file's layout, for conversion where they are used."""

    def _write(self, dtype, suffix, edits):
        rng = np.random.default_rng(3)
        data = rng.integers(0, 200, size=(23, 17, 70)).astype(dtype)  # > one slab of z-slices
        path = self.tmp / f"img{suffix}"
        nib.save(nib.Nifti1Image(data, np.diag([0.8, 0.9, 2.0, 1.0])), self.tmp / "img.nii")
        if edits:
            _patch_header(self.tmp / "img.nii", **edits)
        if suffix == ".nii.gz":
            path.write_bytes(gzip.compress((self.tmp / "img.nii").read_bytes(), 1))
        return path

    @parameterized.expand(STORED_CASES)
    def test_stored_values_and_layout(self, _, dtype, suffix, edits, expected):
        path = self._write(dtype, suffix, edits)
        ref = nib.load(path).get_fdata()
        image, geom = load_image(path, dtype=None, contiguous=False)
        self.assertEqual(image.dtype, expected)
        self.assertEqual(tuple(image.shape), (1, 23, 17, 70))
        self.assertEqual(image.stride()[1:], (1, 23, 23 * 17))  # the file's own layout: no transposition
        np.testing.assert_allclose(image[0].double().numpy(), ref, rtol=1e-6)
        image[0, 0, 0, 0] = 1  # writable; never the file's pages
        self.assertEqual(nib.load(path).get_fdata()[0, 0, 0], ref[0, 0, 0])
        c_order, _ = load_image(path, dtype=None)
        self.assertTrue(c_order.is_contiguous())
        np.testing.assert_allclose(c_order[0].double().numpy(), ref, rtol=1e-6)
        f64, _ = load_image(path, dtype=torch.float64, device="cpu")
        self.assertEqual(f64.dtype, torch.float64)
        np.testing.assert_allclose(f64[0].numpy(), ref, rtol=1e-6)
        self.assertEqual(geom.spatial_shape, (23, 17, 70))

    def test_integer_dtype_refused(self):
        path = self._write(np.int16, ".nii.gz", {})
        with self.assertRaisesRegex(ValueError, "floating type or None"):
            load_image(path, dtype=torch.int16)

    def test_accelerator_branch_on_meta(self):
        # the branch that copies slabs to a device, run on the data-less "meta" device (no GPU here)
        path = self._write(np.int16, ".nii.gz", {})
        for dtype, expected in ((None, torch.int16), (torch.float32, torch.float32)):
            image, geom = load_image(path, dtype=dtype, contiguous=dtype is not None, device="meta")
            self.assertEqual((image.device.type, image.dtype, tuple(image.shape)), ("meta", expected, (1, 23, 17, 70)))
        self.assertEqual(geom.spatial_shape, (23, 17, 70))

    @parameterized.expand(STORED_CASES)
    def test_staged_slabs_on_the_cpu(self, _, dtype, suffix, edits, expected):
        # the read a CUDA device gets (slabs through staging buffers, pinned there), run here on the CPU; types torch
        # lacks, or in the other byte order, still take the converting read
        path = self._write(dtype, suffix, edits)
        ref = nib.load(path).get_fdata()
        staged = []

        def on_any_device(device, stored):
            staged.append(stored == nifti_read._carrier(stored))
            return staged[-1]

        with mock.patch.object(nifti_read, "_staged", on_any_device):
            image, _ = load_image(path, dtype=None, contiguous=False, device="cpu")
        self.assertEqual(staged, [dtype != np.uint16 and "endianness" not in edits])
        self.assertEqual((image.dtype, tuple(image.shape)), (expected, (1, 23, 17, 70)))
        np.testing.assert_allclose(image[0].double().numpy(), ref, rtol=1e-6)

    @parameterized.expand([(".nii", "truncated: the header needs 55092 bytes, the file has 30352"),
                           (".nii.gz", "truncated: the header needs 55092 bytes after decompression, the file has 30352")])
    def test_staged_slabs_of_a_truncated_file(self, suffix, message):
        path = self._write(np.int16, ".nii", {})
        raw = path.read_bytes()[:30352]
        path = self.tmp / f"cut{suffix}"
        path.write_bytes(gzip.compress(raw, 1) if suffix == ".nii.gz" else raw)
        with mock.patch.object(nifti_read, "_staged", lambda device, stored: True):
            with self.assertRaisesRegex(Vista3DInputError, re.escape(message)):
                load_image(path, dtype=None, device="cpu")

    @parameterized.expand([(".nii",), (".nii.gz",)])
    def test_staged_slabs_read_with_the_header(self, suffix):
        # 6-byte slices: the 188 voxel bytes read with a 352-byte header fill the first slabs of 16 slices and part of
        # the next
        data = np.random.default_rng(6).integers(0, 255, size=(2, 3, 50)).astype(np.uint8)
        nib.save(nib.Nifti1Image(data, np.eye(4)), self.tmp / f"tiny{suffix}")
        with mock.patch.object(nifti_read, "_staged", lambda device, stored: True):
            image, _ = load_image(self.tmp / f"tiny{suffix}", dtype=None, device="cpu")
        np.testing.assert_array_equal(image[0].numpy(), data)

    def test_staged_slabs_of_a_later_volume(self):
        data = np.random.default_rng(5).integers(-1000, 1000, size=(9, 7, 40, 3)).astype(np.int16)
        nib.save(nib.Nifti1Image(data, np.eye(4)), self.tmp / "four.nii")
        with mock.patch.object(nifti_read, "_staged", lambda device, stored: True):
            image, _ = load_image(self.tmp / "four.nii", dtype=None, volume_index=2, device="cpu")
        np.testing.assert_array_equal(image[0].numpy(), data[..., 2])

    @parameterized.expand(STORED_CASES)
    @unittest.skipUnless(torch.cuda.is_available(), "needs CUDA")
    def test_to_cuda(self, _, dtype, suffix, edits, expected):
        path = self._write(dtype, suffix, edits)
        ref = nib.load(path).get_fdata()
        for as_dtype in (None, torch.float32):
            image, _ = load_image(path, dtype=as_dtype, contiguous=False, device="cuda")
            self.assertEqual((image.device.type, image.dtype), ("cuda", as_dtype or expected))
            on_side_stream = torch.cuda.Stream()
            with torch.cuda.stream(on_side_stream):  # whole when returned, read from any stream
                host = image[0].double().cpu().numpy()
            np.testing.assert_allclose(host, ref, rtol=1e-6)


def _header_fields_kept(testcase, back, ref):
    """Every header field of ``ref`` is in ``back``, except those that describe the voxel values, and ``back`` is
    marked as this program's output (intent 'label' named 'vista3d')."""
    changed = {"datatype", "bitpix", "scl_slope", "scl_inter", "cal_min", "cal_max", "vox_offset", "dim", "glmax",
               "glmin", "intent_code", "intent_name", "intent_p1", "intent_p2", "intent_p3"}
    testcase.assertEqual(back.header.get_intent(), ("label", (), "vista3d"))
    for key in ref.header.keys():
        if key not in changed:
            np.testing.assert_array_equal(back.header[key], ref.header[key], err_msg=key)
    testcase.assertEqual(tuple(back.header["dim"][1:4]), tuple(ref.header["dim"][1:4]))


class TestSaveLabelMap(TempDirCase):
    """Slab-parallel writing: any source layout and dtype, every output dtype, equal to the labels in memory."""

    def setUp(self):
        super().setUp()
        self.src = write_phantom(self.tmp / "ct.nii.gz", (30, 26, 41), (0.78, 0.78, 2.0), seed=4, orientation="LPS")
        self.ref = nib.load(self.src)
        _, self.geom = load_image(self.src)
        labels = make_phantom_labels((30, 26, 41), (0.78, 0.78, 2.0), seed=4).astype(np.int16)
        labels[0, 0, -1] = 255  # the sentinel of voxels no window reached
        self.labels = labels

    @parameterized.expand(
        [(dt, layout, threads) for dt in ("uint8", "int16", "uint16", "int32", "float32", "float64")
         for layout, threads in [("c_int16", 1), ("f_int16", 3), ("strided", 2), ("c_float32", 2), ("tensor", 3)]]
    )
    def test_every_dtype_and_layout(self, dtype, layout, threads):
        src = {
            "c_int16": self.labels,
            "f_int16": np.asfortranarray(self.labels),
            "strided": np.pad(self.labels, ((0, 0), (0, 0), (0, 5)))[:, :, :41],
            "c_float32": self.labels.astype(np.float32),
            "tensor": torch.from_numpy(self.labels)[None],
        }[layout]
        with mock.patch.object(label_transfer, "_SLAB_BYTES", 2000):  # several slabs, so several blocks and threads
            out = save_label_map(src, self.geom, self.tmp / "out" / f"seg_{dtype}.nii.gz", dtype, threads=threads)
        back = nib.load(out)
        self.assertEqual(back.get_data_dtype(), np.dtype(dtype))
        np.testing.assert_array_equal(np.asanyarray(back.dataobj), self.labels)
        np.testing.assert_array_equal(back.affine, self.ref.affine)
        _header_fields_kept(self, back, self.ref)
        self.assertEqual((back.dataobj.slope, back.dataobj.inter), (1.0, 0.0))

    def test_default_is_uint8(self):
        out = save_label_map(self.labels, self.geom, self.tmp / "seg.nii.gz")
        self.assertEqual(nib.load(out).get_data_dtype(), np.uint8)
        self.assertEqual(DEFAULT_OUTPUT_DTYPE, "uint8")
        np.testing.assert_array_equal(np.asanyarray(nib.load(out).dataobj), self.labels)

    @parameterized.expand([("contiguous", lambda a: a), ("strided", lambda a: a[:, :, ::-1])])
    def test_label_that_does_not_fit(self, _, view):
        labels = self.labels.copy()
        labels[3, 4, 40] = 300  # in the last slab
        target = self.tmp / "seg.nii.gz"
        target.write_bytes(b"previous")
        with mock.patch.object(label_transfer, "_SLAB_BYTES", 2000):
            msg = r"\[0, 300\].*does not fit uint8 \[0, 255\].*int16 or float32"
            with self.assertRaisesRegex(Vista3DInputError, msg):
                save_label_map(view(labels), self.geom, target, "uint8", threads=2)
        self.assertEqual(target.read_bytes(), b"previous")
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), ["ct.nii.gz", "seg.nii.gz"])  # no temporary

    def test_threads_default_to_the_cores(self):
        self.assertGreaterEqual(available_cores(), 1)
        self.assertLessEqual(available_cores(), os.cpu_count())

    @parameterized.expand(
        [
            ("uint8_range_float32", torch.int16, 0, "float32", np.uint8),
            ("uint8_range_int16", torch.int64, 0, "int16", np.uint8),
            ("needs_int16", torch.int16, 300, "float32", np.int16),
            ("negative", torch.int32, -5, "float64", np.int16),
            ("needs_int32", torch.int32, 40000, "float32", np.float32),
            ("same_width", torch.int16, 0, "uint8", np.uint8),
            ("float_labels", torch.float32, 0, "float32", np.float32),
            ("bool", torch.bool, 0, "float32", np.uint8),
        ]
    )
    def test_device_map_crosses_narrow(self, _, src_dtype, extra, dtype, carrier):
        labels = torch.from_numpy(self.labels).to(src_dtype)
        if extra:
            labels[1, 2, 3] = extra
        on_device = label_transfer.to_device_file_order(labels, np.dtype(dtype))  # what a GPU map becomes there
        self.assertEqual(on_device.data.dtype, torch.from_numpy(np.zeros(1, carrier)).dtype)
        self.assertEqual(on_device.shape, tuple(labels.shape))
        self.assertNotEqual(on_device.data.data_ptr(), labels.data_ptr())  # its own copy, whatever the caller does
        # slabs of any cut, widened to the output type on the host, in file order
        nz = labels.shape[2]
        slabs = [on_device.slab(k, min(k + 7, nz), np.dtype(dtype)) for k in range(0, nz, 7)]
        self.assertTrue(all(s.dtype == np.dtype(dtype) and s.flags.c_contiguous for s in slabs))
        np.testing.assert_array_equal(np.concatenate(slabs).T, labels.numpy())
        with mock.patch.object(label_transfer, "_SLAB_BYTES", 2000):  # widened slab by slab on the compressing threads
            out = save_label_map(on_device, self.geom, self.tmp / "narrow.nii.gz", dtype, threads=2)
            ref = save_label_map(labels.numpy(), self.geom, self.tmp / "ref.nii.gz", dtype, threads=2)
        self.assertEqual(gzip.decompress(out.read_bytes()), gzip.decompress(ref.read_bytes()))
        self.assertEqual(nib.load(out).get_data_dtype(), np.dtype(dtype))

    def test_map_already_in_file_order_is_copied(self):
        labels = torch.zeros(1, 1, 5, dtype=torch.uint8)  # its file-order layout is itself
        on_device = label_transfer.to_device_file_order(labels, np.dtype("uint8"))
        labels += 7  # the caller changes its tensor after handing it on
        self.assertEqual(on_device.slab(0, 5, np.dtype("uint8")).ravel().tolist(), [0] * 5)

    def test_device_map_off_the_grid(self):
        on_device = label_transfer.to_device_file_order(torch.from_numpy(self.labels)[:-1], np.dtype("uint8"))
        with self.assertRaisesRegex(Vista3DInputError, r"does not match the input grid"):
            save_label_map(on_device, self.geom, self.tmp / "g.nii.gz")
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir() if p.name.startswith("g")), [])

    def test_device_map_checked_before_narrowing(self):
        labels = torch.from_numpy(self.labels).to(torch.int32)
        labels[0, 0, 0] = -1
        with self.assertRaisesRegex(Vista3DInputError, r"\[-1, 255\].*does not fit uint8"):
            label_transfer.to_device_file_order(labels, np.dtype("uint8"))

    @unittest.skipUnless(torch.cuda.is_available(), "needs CUDA")
    def test_cuda_labels(self):
        for dtype in ("uint8", "float32"):
            out = save_label_map(torch.from_numpy(self.labels).cuda(), self.geom, self.tmp / "g.nii.gz", dtype)
            np.testing.assert_array_equal(np.asanyarray(nib.load(out).dataobj), self.labels)
        bad = torch.from_numpy(self.labels).cuda() + 300
        with self.assertRaisesRegex(Vista3DInputError, "does not fit uint8"):
            save_label_map(bad, self.geom, self.tmp / "g.nii.gz", "uint8")

    @unittest.skipUnless(torch.cuda.is_available(), "needs CUDA")
    def test_cuda_map_made_on_a_busy_stream(self):
        # the map is written on a side stream behind a long wait: its slabs' copies must wait for it (uint8 into
        # uint8: no range check, which would wait on the host)
        source = torch.from_numpy(self.labels.astype(np.uint8)).cuda()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clocks before the map exists
            labels = source * 1
            with mock.patch.object(label_transfer, "_SLAB_BYTES", 2000):  # many slabs, on several threads
                out = save_label_map(labels, self.geom, self.tmp / "busy.nii.gz", threads=4)
        np.testing.assert_array_equal(np.asanyarray(nib.load(out).dataobj), self.labels)


class TestSaveClassMasks(TempDirCase):
    """One uint8 file per class on the input's grid, named as in the label list, written as a complete set."""

    def setUp(self):
        super().setUp()
        self.src = write_phantom(self.tmp / "ct 1.nii.gz", (30, 26, 17), (0.78, 0.78, 2.0), seed=2, orientation="LPS")
        self.ref = nib.load(self.src)
        _, self.geom = load_image(self.src)
        g = torch.Generator().manual_seed(0)
        self.ids = [1, 14, 25]  # liver, left kidney, hepatic vessel
        logits = torch.randn(3, 30, 26, 17, generator=g)
        logits[2] = logits[0] - 0.5  # the vessel lies inside the liver: a voxel in two masks
        self.dense = logits > 0
        self.masks = ClassMasks(pack_masks(logits), self.ids)
        self.out = self.tmp / "out"

    def _names(self, folder):
        return sorted(p.name for p in folder.iterdir())

    @parameterized.expand([("class_masks",), ("dict_of_arrays",)])
    def test_names_grid_and_values(self, source):
        masks = self.masks if source == "class_masks" else {i: m.numpy() for i, m in zip(self.ids, self.dense)}
        folder = class_mask_dir(self.src, self.out)
        self.assertEqual(folder, output_path(self.src, self.out).parent)
        self.assertEqual(folder, self.out / "ct 1")
        written = save_class_masks(masks, self.geom, folder, threads=2)
        expected = {1: "liver.nii.gz", 14: "left_kidney.nii.gz", 25: "hepatic_vessel.nii.gz"}
        self.assertEqual({i: p.name for i, p in written.items()}, expected)
        self.assertEqual(written, class_mask_paths(folder, self.ids))
        self.assertEqual(self._names(folder), sorted(expected.values()))  # no temporary file left
        for k, label_id in enumerate(self.ids):
            back = nib.load(written[label_id])
            self.assertEqual(back.get_data_dtype(), np.uint8)
            np.testing.assert_array_equal(back.affine, self.ref.affine)
            _header_fields_kept(self, back, self.ref)
            np.testing.assert_array_equal(np.asarray(back.dataobj), self.dense[k].numpy().astype(np.uint8))
        both = np.asarray(nib.load(written[1]).dataobj) & np.asarray(nib.load(written[25]).dataobj)
        self.assertGreater(int(both.sum()), 0)  # overlapping classes both kept

    def test_class_file_names(self):
        self.assertEqual(class_file_name(14), "left_kidney.nii.gz")
        self.assertEqual(class_file_name(17), "portal_vein_and_splenic_vein.nii.gz")
        self.assertEqual(class_file_name(200), "label_200.nii.gz")
        names = [class_file_name(i) for i in label_names()]
        self.assertEqual(len(set(names)), len(names))
        self.assertFalse([n for n in names if " " in n or "/" in n])

    def test_failure_mid_set_leaves_no_file(self):
        calls = []
        real = nifti_write.write_gzip

        def fail_on_second(*args, **kwargs):
            calls.append(args[0].name)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real(*args, **kwargs)

        folder = class_mask_dir(self.src, self.out)
        with mock.patch.object(nifti_write, "write_gzip", fail_on_second):
            with self.assertRaisesRegex(Vista3DOutputError, "No space left"):
                save_class_masks(self.masks, self.geom, folder)
        self.assertEqual(len(calls), 2)
        self.assertEqual(self._names(folder), [])  # the first mask was written, then removed with the set

    def test_failure_keeps_the_previous_set(self):
        folder = class_mask_dir(self.src, self.out)
        first = save_class_masks(self.masks, self.geom, folder)
        before = {i: _sha(p) for i, p in first.items()}
        flipped = ClassMasks(~self.masks.packed, self.ids)
        with mock.patch.object(nifti_write, "write_gzip", side_effect=[None, OSError(5, "Input/output error")]):
            with self.assertRaisesRegex(Vista3DOutputError, "Input/output error"):
                save_class_masks(flipped, self.geom, folder)
        self.assertEqual({i: _sha(p) for i, p in first.items()}, before)
        self.assertEqual(self._names(folder), sorted(p.name for p in first.values()))

    def test_bad_masks_one_line(self):
        folder = self.tmp / "m"
        with self.assertRaisesRegex(Vista3DInputError, "no class masks to save") as ctx:
            save_class_masks({}, self.geom, folder)
        self.assertNotIn("\n", str(ctx.exception))
        with self.assertRaisesRegex(Vista3DInputError, r"mask of class 14 \(left kidney\): .*does not match") as ctx:
            save_class_masks({1: self.dense[0], 14: self.dense[1][:, :, :5]}, self.geom, folder)
        self.assertNotIn("\n", str(ctx.exception))
        self.assertFalse(folder.exists() and any(folder.iterdir()))


if __name__ == "__main__":
    unittest.main()
