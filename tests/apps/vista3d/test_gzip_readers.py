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
"""The two gzip readers of ``load_image``: :class:`Gunzip` (streaming) and :class:`ParallelGunzip` (rapidgzip)."""

from __future__ import annotations

import contextlib
import gzip
import os
import pathlib
import tempfile
import unittest
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from nibabel.testing import data_path
from parameterized import parameterized

from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.io import gzip_codec as gz
from monai.apps.vista3d.io import nifti_read
from monai.apps.vista3d.io.nifti import load_image

# "auto" with the thresholds lowered, so that it picks rapidgzip for a small file on this machine
READERS = [("stream",), ("rapidgzip",), ("auto_parallel",)]


def _damaged(raw: bytes, kind: str) -> bytes:
    if kind == "corrupt":  # a flipped byte in the deflate data
        bad = bytearray(raw)
        bad[len(raw) // 2] ^= 0xFF
        return bytes(bad)
    if kind == "crc":  # a flipped bit in the stored CRC-32
        return raw[:-8] + bytes([raw[-8] ^ 1]) + raw[-7:]
    cut = {"truncated_half": len(raw) // 2, "truncated_97": len(raw) * 97 // 100, "no_trailer": len(raw) - 8}
    return raw[: cut[kind]]


DAMAGE = ["corrupt", "crc", "truncated_half", "truncated_97", "no_trailer"]


class ReaderCase(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.src = write_phantom(self.tmp / "ct.nii.gz", (40, 36, 70), seed=3)  # several read steps
        self.raw = self.src.read_bytes()

    @contextlib.contextmanager
    def reader(self, name: str):
        """The environment (and thresholds) under which ``load_image`` tries the reader ``name`` first."""
        env = {"VISTA3D_GZIP_READER": "auto" if name == "auto_parallel" else name, "VISTA3D_GZIP_CODEC": "auto"}
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.dict(os.environ, env))
            if name == "auto_parallel":
                stack.enter_context(mock.patch.object(gz, "RAPIDGZIP_MIN_BYTES", 0))
                stack.enter_context(mock.patch.object(gz, "RAPIDGZIP_MIN_CORES", 1))
            yield


class TestParallelGunzip(ReaderCase):
    @parameterized.expand([(1,), (2,)])
    def test_reads_what_gzip_reads(self, threads):
        expected = gzip.decompress(self.raw)
        r = gz.ParallelGunzip(self.src, threads)
        try:
            head = r.read(540)
            buf = np.zeros(len(expected), dtype=np.uint8)
            got = r.readinto(buf[540:5000]) + r.readinto(buf[5000:])
            self.assertEqual(r.readinto(np.zeros(10, dtype=np.uint8)), 0)  # the end
        finally:
            r.close()
        self.assertEqual(head, expected[:540])
        self.assertEqual(got, len(expected) - 540)
        self.assertEqual(buf[540:].tobytes(), expected[540:])

    def test_file_of_several_chunks(self):
        # incompressible bytes: 3 MiB of input, three of the 1 MiB chunks two threads get, and a chunk boundary
        # inside a read
        plain = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
        path = self.tmp / "chunks.gz"
        path.write_bytes(gzip.compress(plain, compresslevel=1))
        self.assertEqual(gz.rapidgzip_chunk_bytes(path.stat().st_size, 2), 1 << 20)
        r = gz.ParallelGunzip(path, 2)
        try:
            buf = np.zeros(len(plain), dtype=np.uint8)
            got = r.readinto(buf[: 1 << 20 | 12345]) + r.readinto(buf[1 << 20 | 12345 :])
        finally:
            r.close()
        self.assertEqual(got, len(plain))
        self.assertEqual(buf.tobytes(), plain)

    @parameterized.expand([
        (46 << 20, 16, 1 << 20),  # a 512x512x200 CT on an H100 host's 16 cores
        (200 << 20, 16, 2 << 20),
        (1 << 30, 16, 4 << 20),  # rapidgzip's own chunk once every thread has 4
        (10 << 20, 1, 2 << 20),
        (1 << 10, 64, 1 << 20),  # never below 1 MiB
    ])
    def test_chunk_size(self, size, threads, expected):
        self.assertEqual(gz.rapidgzip_chunk_bytes(size, threads), expected)

    def test_read_after_close(self):
        r = gz.ParallelGunzip(self.src, 1)
        r.close()
        with self.assertRaisesRegex(ValueError, "ct.nii.gz: read after close"):
            r.read(10)

    @parameterized.expand([(kind,) for kind in DAMAGE + ["two_members", "zero_padding"]])
    def test_refuses(self, kind):
        if kind == "two_members":
            plain = gzip.decompress(self.raw)
            data = gzip.compress(plain[:1000]) + gzip.compress(plain[1000:])
        elif kind == "zero_padding":
            data = self.raw + b"\x00" * 64
        else:
            data = _damaged(self.raw, kind)
        path = self.tmp / f"{kind}.nii.gz"
        path.write_bytes(data)
        with self.assertRaisesRegex(gz.ParallelInflateError, f"{kind}.nii.gz: corrupt or truncated gzip file"):
            r = gz.ParallelGunzip(path, 2)
            try:
                r.skip()
            finally:
                r.close()


class TestLoadWithEachReader(ReaderCase):
    @parameterized.expand([(r, kind) for r, in READERS for kind in DAMAGE])
    def test_damaged_file(self, reader, kind):
        path = self.tmp / "bad.nii.gz"
        path.write_bytes(_damaged(self.raw, kind))
        with self.reader(reader):
            with self.assertRaisesRegex(Vista3DInputError, r"bad.nii.gz: corrupt or truncated gzip file \(.*'gzip -t'"):
                load_image(path)

    @parameterized.expand(READERS)
    def test_same_image_from_every_form(self, reader):
        with mock.patch.dict(os.environ, {"VISTA3D_GZIP_READER": "stream"}):
            expected, _ = load_image(self.src)
        plain = gzip.decompress(self.raw)
        forms = {
            "single": self.raw,
            "two_members": gzip.compress(plain[:1000]) + gzip.compress(plain[1000:]),
            "zero_padding": self.raw + b"\x00" * 64,
        }
        with self.reader(reader):
            for name, data in forms.items():
                path = self.tmp / f"{name}.nii.gz"
                path.write_bytes(data)
                for kw in ({}, {"dtype": None, "contiguous": False}):
                    image, _ = load_image(path, **kw)
                    torch.testing.assert_close(image.float(), expected, rtol=0, atol=0, msg=f"{name} {kw}")

    @parameterized.expand(READERS)
    def test_4d_volume(self, reader):
        ref = nib.load(os.path.join(data_path, "example4d.nii.gz"))
        with self.reader(reader):
            image, _ = load_image(os.path.join(data_path, "example4d.nii.gz"), volume_index=1)
        np.testing.assert_allclose(image[0].numpy(), ref.get_fdata()[..., 1], rtol=1e-6)

    def test_rapidgzip_is_used(self):
        # a good file under VISTA3D_GZIP_READER=rapidgzip never reaches the streaming reader
        with self.reader("rapidgzip"), mock.patch.object(nifti_read, "Gunzip", side_effect=AssertionError("stream")):
            load_image(self.src)
        with self.reader("stream"), mock.patch.object(nifti_read, "ParallelGunzip", side_effect=AssertionError("rg")):
            load_image(self.src)


class TestChoice(ReaderCase):
    @parameterized.expand(
        [
            ("many_cores", {}, 8, 32 << 20, True),
            ("few_cores", {}, 7, 32 << 20, False),
            ("small_file", {}, 16, (32 << 20) - 1, False),
            ("zlib_forced", {"VISTA3D_GZIP_CODEC": "zlib"}, 16, 32 << 20, False),
            ("stream_forced", {"VISTA3D_GZIP_READER": "stream"}, 16, 32 << 20, False),
            ("rapidgzip_forced", {"VISTA3D_GZIP_READER": "rapidgzip"}, 1, 10, True),
        ]
    )
    def test_use_rapidgzip(self, _, env, cores, size, expected):
        path = self.tmp / "sized.gz"
        with open(path, "wb") as f:
            f.truncate(size)
        env = {"VISTA3D_GZIP_READER": "auto", "VISTA3D_GZIP_CODEC": "auto", **env}
        with mock.patch.dict(os.environ, env), mock.patch.object(gz, "available_cores", return_value=cores):
            self.assertEqual(gz.use_rapidgzip(path), expected)

    def test_without_rapidgzip(self):
        with mock.patch.object(gz, "_import_rapidgzip", return_value=None):
            with mock.patch.dict(os.environ, {"VISTA3D_GZIP_READER": "auto"}):
                with mock.patch.object(gz, "RAPIDGZIP_MIN_BYTES", 0), mock.patch.object(gz, "RAPIDGZIP_MIN_CORES", 1):
                    self.assertFalse(gz.use_rapidgzip(self.src))
                    self.assertEqual(tuple(load_image(self.src)[0].shape), (1, 40, 36, 70))
            with mock.patch.dict(os.environ, {"VISTA3D_GZIP_READER": "rapidgzip"}):
                with self.assertRaisesRegex(Vista3DInputError, "rapidgzip cannot be imported"):
                    load_image(self.src)

    def test_bad_choice(self):
        with mock.patch.dict(os.environ, {"VISTA3D_GZIP_READER": "pigz"}):
            with self.assertRaisesRegex(Vista3DInputError, "VISTA3D_GZIP_READER='pigz': use 'auto'"):
                load_image(self.src)


if __name__ == "__main__":
    unittest.main()
