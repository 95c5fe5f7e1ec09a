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
"""``inspect_image`` reads the header only; ``check_inflated_size`` counts the gzip stream against it."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import unittest
import zlib
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.server import images
from monai.apps.vista3d.server.errors import ServeError


def _header(shape: tuple[int, ...]) -> bytes:
    hdr = nib.Nifti1Header()
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(np.int16)
    hdr["vox_offset"] = 352
    return hdr.binaryblock + b"\x00" * 4


def _gzip_zeros(shape: tuple[int, ...], zeros: int) -> bytes:
    """A .nii.gz of ``shape`` whose stream holds ``zeros`` bytes of zeros after the header (compressed ~1000:1)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(_header(shape)) + b"".join(c.compress(b"\x00" * (1 << 20)) for _ in range(zeros >> 20)) + c.flush()


class TestInspectImage(unittest.TestCase):
    def setUp(self):
        self.folder = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.folder, ignore_errors=True)

    def _write(self, name: str, data: bytes) -> Path:
        (self.folder / name).write_bytes(data)
        return self.folder / name

    def test_header_only(self):
        # inspecting reads the header: a stream that would inflate 64 MiB past it is not touched yet
        path = self._write("bomb.nii.gz", _gzip_zeros((40, 40, 36), 64 << 20))
        with mock.patch.object(images, "_counted_inflate") as counted:
            info = images.inspect_image(path, 10**9)
        counted.assert_not_called()
        self.assertEqual((info.format, info.shape, info.inflated_bytes), ("nifti", (40, 40, 36), 352 + 40 * 40 * 36 * 2))

    def test_uncompressed_needs_no_count(self):
        path = self._write("ct.nii", _header((8, 8, 8)) + b"\x00" * 1024)
        info = images.inspect_image(path, 10**9)
        self.assertIsNone(info.inflated_bytes)
        with mock.patch.object(images, "_counted_inflate") as counted:
            images.check_inflated_size(path, info)
        counted.assert_not_called()

    @parameterized.expand([
        ["bomb", 64 << 20, True],  # 64 MiB past a 115 kB header: refused, one MiB past it at most inflated
        ["exact", 40 * 40 * 36 * 2, False],  # all air: compresses 1000:1, yet holds what the header says
        ["padded", 40 * 40 * 36 * 2 + (512 << 10), False],  # within the MiB of padding some writers add
    ])
    def test_count(self, _, zeros, refused):
        path = self._write("x.nii.gz", _gzip_zeros((40, 40, 36), zeros))
        info = images.inspect_image(path, 10**9)
        if not refused:
            images.check_inflated_size(path, info)
            return
        with self.assertRaises(ServeError) as cm:
            images.check_inflated_size(path, info)
        self.assertEqual(cm.exception.status, 413)
        self.assertIn(f"{352 + 40 * 40 * 36 * 2} bytes", cm.exception.message)

    def test_corrupt_stream_is_422(self):
        good = gzip.compress(_header((40, 40, 36)) + os.urandom(40 * 40 * 36 * 2))
        path = self._write("bad.nii.gz", good[:4096] + bytes(b ^ 0xFF for b in good[4096:8192]) + good[8192:])
        info = images.inspect_image(path, 10**9)
        with self.assertRaises(ServeError) as cm:
            images.check_inflated_size(path, info)
        self.assertEqual(cm.exception.status, 422)

    def test_too_many_voxels_refused_from_the_header(self):
        path = self._write("big.nii.gz", gzip.compress(_header((50, 50, 50)) + os.urandom(1000)))
        with self.assertRaises(ServeError) as cm:
            images.inspect_image(path, 1000)
        self.assertEqual(cm.exception.status, 413)
        for words in ("125000 voxels (shape (50, 50, 50))", "more than --max-voxels 1000", "before any voxel"):
            self.assertIn(words, cm.exception.message)


class TestWriteLabelMap(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def _negative_pixdim_ct(self) -> Path:
        """A .nii whose stored pixdim is negative along y (nibabel reads it as positive; ITK reads it as a flip)."""
        img = nib.Nifti1Image(np.zeros((10, 9, 8), np.int16), np.diag([1.5, 1.5, 2.0, 1.0]))
        img.header.set_qform(img.affine, 1)
        path = self.tmp / "ct.nii"
        nib.save(img, path)
        raw = bytearray(path.read_bytes())
        pixdim = np.frombuffer(bytes(raw[76:108]), dtype="<f4").copy()
        pixdim[2] = -pixdim[2]
        raw[76:108] = pixdim.astype("<f4").tobytes()
        path.write_bytes(bytes(raw))
        return path

    @staticmethod
    def _stored(path: Path) -> nib.Nifti1Header:
        block = (gzip.open(path) if path.name.endswith(".gz") else open(path, "rb")).read(348)
        return nib.Nifti1Header(block, check=False)

    def test_whole_map_keeps_the_stored_header(self):
        from monai.apps.vista3d.io.nifti import load_image

        src = self._negative_pixdim_ct()
        image, geometry = load_image(src)
        loaded = images.LoadedImage("ct", "nifti", tuple(geometry.spatial_shape), geometry)
        labels = torch.zeros(image.shape[1:], dtype=torch.uint8)
        labels[2:5, 3:6, 1:4] = 7
        out = images.write_label_map(labels, loaded, self.tmp / "ct_trans.nii.gz")
        before, after = self._stored(src), self._stored(out)
        self.assertLess(float(before["pixdim"][2]), 0)
        for key in ("pixdim", "qform_code", "sform_code", "quatern_b", "quatern_c", "quatern_d", "qoffset_x",
                    "qoffset_y", "qoffset_z", "srow_x", "srow_y", "srow_z"):
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)
        np.testing.assert_array_equal(np.asanyarray(nib.load(out).dataobj), labels.numpy())

    def test_a_box_keeps_its_place(self):
        from monai.apps.vista3d.io.nifti import load_image

        src = self._negative_pixdim_ct()
        image, geometry = load_image(src)
        loaded = images.LoadedImage("ct", "nifti", tuple(geometry.spatial_shape), geometry)
        labels = torch.arange(image[0].numel(), dtype=torch.int32).reshape(image.shape[1:]) % 100
        box = (slice(2, 6), slice(1, 8), slice(3, 5))
        out = nib.load(images.write_label_map(labels, loaded, self.tmp / "box.nii.gz", box, dtype="int16"))
        np.testing.assert_array_equal(np.asanyarray(out.dataobj), labels[box].numpy())
        # its first voxel lies where the whole map's voxel (2, 1, 3) lies
        np.testing.assert_allclose(out.affine[:3, 3], (geometry.affine @ np.array([2, 1, 3, 1.0]))[:3])


if __name__ == "__main__":
    unittest.main()
