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
"""The slab conversion of :mod:`monai.apps.vista3d.io.nifti_read`: every layout, type, scaling and block boundary; an
uncompressed file read with plain reads (cut or rewritten while read, extensions past byte 540)."""

from __future__ import annotations

import gzip
import os
import pathlib
import tempfile
import unittest
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.io import gzip_codec, nifti_read
from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.io.nifti import load_image, read_header

SHAPE = (37, 5, 41)  # divisible by no block size used here


def _stored(dtype: str, shape: tuple[int, ...] = SHAPE, seed: int = 0) -> np.ndarray:
    """Random voxels of ``dtype`` in file order (F-contiguous), as a NIfTI file stores them."""
    values = np.random.default_rng(seed).integers(-1000, 3000, size=shape)
    if np.dtype(dtype).kind == "u":
        values = np.abs(values)
    return np.asfortranarray(values.astype(dtype))


def _expected(arr: np.ndarray, slope, inter, kind) -> np.ndarray:
    """The float32 scaling the loader promises: cast, times float32(slope), plus float32(inter)."""
    ref = arr.astype(kind)
    if slope is not None and (slope != 1 or (inter or 0) != 0):
        ref *= np.float32(slope)
        ref += np.float32(inter or 0.0)
    return ref


# (name, stored dtype, result dtype, slope, inter)
CONVERT_CASES = [
    ("int16_float32", "<i2", np.float32, None, None),
    ("int16_scaled", "<i2", np.float32, 0.5, -1024.0),
    ("int16_unit_scale", "<i2", np.float32, 1.0, 0.0),
    ("big_endian_int16", ">i2", np.float32, None, None),
    ("big_endian_to_native", ">i2", np.int16, None, None),
    ("uint8_scaled", "u1", np.float32, 2.0, 1.5),
    ("float64_to_float32", "<f8", np.float32, 3.0, None),
    ("int16_same_type", "<i2", np.int16, None, None),
    ("uint16_to_int32", "<u2", np.int32, None, None),
]


class TestConvertSlab(unittest.TestCase):
    @parameterized.expand(
        [
            (f"{case[0]}_{layout}_{tile}_{scratch}", *case[1:], layout, tile, scratch)
            for case in CONVERT_CASES
            for layout in ("C", "F")
            for tile in ((512, 1, 16), (8, 3, 7))
            for scratch in (True, False)
        ]
    )
    def test_slabs_cover_the_volume(self, _, stored, kind, slope, inter, layout, tile, scratch):
        arr = _stored(stored)
        contiguous = layout == "C"
        out = np.full(SHAPE, 77, dtype=kind) if contiguous else np.full(SHAPE[::-1], 77, dtype=kind).T
        buf = np.empty(SHAPE[0] * SHAPE[1] * tile[2], dtype=kind) if scratch else None
        expected = _expected(arr, slope, inter, kind)
        with mock.patch.object(nifti_read, "COPY_TILE", tile):
            for k0 in range(0, SHAPE[2], tile[2]):
                k1 = min(k0 + tile[2], SHAPE[2])
                nifti_read.convert_slab(out, arr, k0, k1, slope, inter, contiguous, buf)
                np.testing.assert_array_equal(out[:, :, :k1], expected[:, :, :k1])
                self.assertTrue(np.all(out[:, :, k1:] == 77), "slices after the slab were written")
        self.assertEqual(out.flags.c_contiguous, contiguous)

    def test_scratch_larger_than_the_slab(self):
        arr = _stored("<i2")
        out = np.empty(SHAPE, dtype=np.float32)
        buf = np.full(SHAPE[0] * SHAPE[1] * 50, np.nan, dtype=np.float32)
        nifti_read.convert_slab(out, arr, 0, SHAPE[2], 0.25, 3.0, True, buf)
        np.testing.assert_array_equal(out, _expected(arr, 0.25, 3.0, np.float32))


class TestSink(unittest.TestCase):
    @parameterized.expand([((0, 17, 41),), ((0, 1, 2, 41),), ((0, 41),), ((0, 16, 32, 33, 41),)])
    def test_hand_ons_longer_than_a_slab(self, bounds):
        arr = _stored("<i2")
        expected = torch.from_numpy(_expected(arr, 0.5, 2.0, np.float32))
        for contiguous in (True, False):
            sink = nifti_read._Sink(arr, 0.5, 2.0, contiguous, False, torch.device("cpu"), may_alias=True)
            for k0, k1 in zip(bounds[:-1], bounds[1:]):
                sink(k0, k1)
            image = sink.result()
            self.assertEqual(image.is_contiguous(), contiguous)
            torch.testing.assert_close(image, expected, rtol=0, atol=0)


class TestLoadSlabBoundaries(unittest.TestCase):
    """``load_image`` of a ``.nii.gz`` whatever the slab and block sizes: the same voxels as nibabel's."""

    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.tmp = pathlib.Path(self._dir.name)

    def tearDown(self):
        self._dir.cleanup()

    def _write(self, data: np.ndarray, slope=None, inter=None) -> pathlib.Path:
        img = nib.Nifti1Image(data, np.diag([0.8, 0.9, 2.0, 1.0]))
        if slope is not None:
            img.header.set_slope_inter(slope, inter)
        nib.save(img, self.tmp / "img.nii")
        path = self.tmp / "img.nii.gz"
        path.write_bytes(gzip.compress((self.tmp / "img.nii").read_bytes(), 1))
        return path

    @parameterized.expand(
        [
            (tile, step, queue)
            for tile in ((512, 1, 16), (8, 3, 7), (64, 64, 64))
            for step in (4 << 20, 3000)  # one read, and reads that end mid-slice
            for queue in (128, 1)
        ]
    )
    def test_every_form_matches_nibabel(self, tile, step, queue):
        data = _stored("<i2", (29, 23, 45), seed=1)
        path = self._write(data, slope=0.5, inter=-10.0)
        ref = torch.from_numpy(nib.load(path).get_fdata().astype(np.float32))
        tile_patch = mock.patch.object(nifti_read, "COPY_TILE", tile)
        step_patch = mock.patch.object(nifti_read, "_READ_STEP", step)
        with tile_patch, step_patch, mock.patch.object(gzip_codec, "_QUEUE_CHUNKS", queue):
            c_order, _ = load_image(path)
            f_order, _ = load_image(path, contiguous=False)
            stored, _ = load_image(path, dtype=None, contiguous=False)
            stored_c, _ = load_image(path, dtype=None)
        self.assertTrue(c_order.is_contiguous())
        self.assertEqual(f_order.stride()[1:], (1, 29, 29 * 23))
        for image in (c_order, f_order, stored, stored_c):
            self.assertEqual(image.dtype, torch.float32)  # scaled files are float32 in every form
            torch.testing.assert_close(image[0], ref, rtol=0, atol=0)

    @parameterized.expand([(0,), (2,)])
    def test_4d_volume(self, index):
        data = _stored("<i2", (13, 11, 19, 3), seed=2)
        path = self._write(data)
        with mock.patch.object(nifti_read, "COPY_TILE", (8, 3, 7)):
            c_order, _ = load_image(path, volume_index=index)
            stored, _ = load_image(path, volume_index=index, dtype=None)
        self.assertTrue(c_order.is_contiguous())
        np.testing.assert_array_equal(c_order[0].numpy(), data[..., index].astype(np.float32))
        self.assertEqual(stored.dtype, torch.int16)
        np.testing.assert_array_equal(stored[0].numpy(), data[..., index])


def cut_while_read(path: pathlib.Path, keep: int, rewrite: bool = False):
    """A patch of the plain reader that, on its first voxel read of ``path``, cuts the file to ``keep`` bytes (or,
    ``rewrite``: overwrites its last bytes in place, the size kept), as another program writing it would."""
    real = nifti_read._PlainReader.readinto
    done = []

    def readinto(self, buf):
        if not done and os.path.samefile(self.f.name, path) and self.f.tell() >= 348:
            done.append(1)
            if rewrite:
                with open(path, "r+b") as f:
                    f.seek(-64, os.SEEK_END)
                    f.write(b"\x7f" * 64)
                st = os.stat(path)
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # clocks of coarse file systems
            else:
                os.truncate(path, keep)
        return real(self, buf)

    return mock.patch.object(nifti_read._PlainReader, "readinto", readinto)


class TestPlainReads(unittest.TestCase):
    """An uncompressed ``.nii`` is read, not memory-mapped: a file cut while read is one line, not a SIGBUS."""

    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.addCleanup(self._dir.cleanup)
        self.tmp = pathlib.Path(self._dir.name)
        self.data = _stored("<i2", (33, 29, 40), seed=3)
        self.path = self.tmp / "ct.nii"
        nib.save(nib.Nifti1Image(self.data, np.diag([0.8, 0.9, 2.0, 1.0])), self.path)

    @parameterized.expand([("c", True, torch.float32), ("file order", False, torch.float32), ("stored", False, None)])
    def test_matches_nibabel(self, _, contiguous, dtype):
        with mock.patch.object(nifti_read, "_READ_STEP", 3000):  # reads that end mid-slice
            image, geom = load_image(self.path, contiguous=contiguous, dtype=dtype)
        np.testing.assert_array_equal(image[0].numpy(), self.data)
        self.assertEqual(image.is_contiguous(), contiguous)

    def test_cut_while_read(self):
        with cut_while_read(self.path, 352 + 2 * 33 * 29 * 7):
            with self.assertRaises(Vista3DInputError) as ctx:
                load_image(self.path)
        msg = str(ctx.exception)
        self.assertIn("truncated", msg)
        self.assertIn("cut while it was read", msg)
        self.assertNotIn("\n", msg)

    def test_rewritten_while_read(self):
        with cut_while_read(self.path, 0, rewrite=True), self.assertRaises(Vista3DInputError) as ctx:
            load_image(self.path)
        self.assertIn("the file changed while it was read", str(ctx.exception))

    @parameterized.expand([(".nii",), (".nii.gz",)])
    def test_extensions_past_byte_540(self, suffix):
        img = nib.Nifti1Image(self.data, np.diag([0.8, 0.9, 2.0, 1.0]))
        img.header.extensions.append(nib.nifti1.Nifti1Extension("comment", b"a long note " * 100))
        path = self.tmp / f"ext{suffix}"
        nib.save(img, path)
        head = gzip.open(path).read(544) if suffix == ".nii.gz" else path.read_bytes()[:544]
        self.assertGreater(nifti_read.vox_offset(head), 540)
        image, geom = load_image(path)
        np.testing.assert_array_equal(image[0].numpy(), np.asarray(nib.load(path).dataobj))
        self.assertEqual(len(geom.header.extensions), 1)
        self.assertEqual(read_header(path).spatial, (33, 29, 40))


if __name__ == "__main__":
    unittest.main()
