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
import os
import pathlib
import tempfile
import unittest
import zlib
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.cli.phantom import make_phantom_labels, write_phantom
from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.io import gzip_codec as gz
from monai.apps.vista3d.io import label_transfer
from monai.apps.vista3d.io.nifti import load_image
from monai.apps.vista3d.io.nifti_write import save_label_map


def _has_isal() -> bool:
    try:
        import isal  # noqa: F401
    except ImportError:
        return False
    return True


CODECS = [("zlib",)] + ([("isal",)] if _has_isal() else [])


class TestCodecs(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.src = write_phantom(self.tmp / "in.nii.gz", (40, 36, 24), seed=5)
        self.image, self.geom = load_image(self.src)
        self.labels = make_phantom_labels((40, 36, 24), seed=5)

    @parameterized.expand(CODECS)
    def test_codec_roundtrip(self, codec):
        with mock.patch.dict(os.environ, {"VISTA3D_GZIP_CODEC": codec}):
            self.assertEqual(gz.gzip_codec().__name__.split(".")[-1], "zlib" if codec == "zlib" else "isal_zlib")
            image, _ = load_image(self.src)
            torch.testing.assert_close(image, self.image, rtol=0, atol=0)
            # several blocks and threads: force small blocks so the CRC combination is exercised
            with mock.patch.object(gz, "_BLOCK", 4096), mock.patch.object(label_transfer, "_SLAB_BYTES", 4096):
                for level, threads in [(1, 1), (1, 3), (6, 2), (0, 2)]:
                    out = save_label_map(
                        self.labels, self.geom, self.tmp / f"{codec}{level}{threads}.nii.gz", "uint8", level,
                        threads=threads,
                    )
                    raw = gzip.decompress(out.read_bytes())  # the standard library checks CRC and length
                    back = nib.load(out)
                    np.testing.assert_array_equal(np.asanyarray(back.dataobj), self.labels)
                    self.assertEqual(len(raw), 352 + self.labels.size)
        # what one codec wrote, the other reads
        with mock.patch.dict(os.environ, {"VISTA3D_GZIP_CODEC": "zlib"}):
            for f in self.tmp.glob("*.nii.gz"):
                if f.name != "in.nii.gz":
                    np.testing.assert_array_equal(load_image(f)[0][0].numpy(), self.labels)

    def test_crc32_combine(self):
        a, b = os.urandom(1000), os.urandom(777)
        self.assertEqual(gz.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)), zlib.crc32(a + b))
        self.assertEqual(gz.crc32_combine(zlib.crc32(a), zlib.crc32(b""), 0), zlib.crc32(a))

    def test_write_gzip_callable_blocks(self):
        bufs = [b"head", np.arange(5000, dtype=np.int16), lambda: np.full(3000, 7, np.uint8), lambda: b"", b"tail"]
        expected = b"head" + bufs[1].tobytes() + bytes([7] * 3000) + b"tail"
        for threads in (1, 3):
            out = __import__("io").BytesIO()
            with mock.patch.object(gz, "_BLOCK", 1000):
                gz.write_gzip(out, bufs, 1, threads, zlib)
            self.assertEqual(gzip.decompress(out.getvalue()), expected)

    def test_write_gzip_block_error_propagates(self):
        def bad():
            raise Vista3DInputError("label ids do not fit")

        for threads in (1, 2):
            with self.assertRaisesRegex(Vista3DInputError, "do not fit"):
                gz.write_gzip(__import__("io").BytesIO(), [b"x" * 10, bad, b"y"], 1, threads, zlib)

    @parameterized.expand([("missing", ImportError("No module named 'isal'")), ("broken", OSError("bad ELF"))])
    def test_isal_import_falls_back_to_zlib(self, _, error):
        real_import = __import__

        def fake_import(name, *args, **kwargs):
            if name == "isal" or name.startswith("isal."):
                raise error
            return real_import(name, *args, **kwargs)

        with mock.patch("builtins.__import__", fake_import):
            with mock.patch.dict(os.environ, {"VISTA3D_GZIP_CODEC": "auto"}):
                self.assertIs(gz.gzip_codec(), zlib)
                out = save_label_map(self.labels, self.geom, self.tmp / "fallback.nii.gz", threads=2)
                image, _ = load_image(self.src)
            with mock.patch.dict(os.environ, {"VISTA3D_GZIP_CODEC": "isal"}):
                with self.assertRaisesRegex(Vista3DInputError, "isal cannot be imported"):
                    gz.gzip_codec()
        np.testing.assert_array_equal(np.asanyarray(nib.load(out).dataobj), self.labels)
        torch.testing.assert_close(image, self.image, rtol=0, atol=0)

    def test_bad_codec_choice(self):
        with mock.patch.dict(os.environ, {"VISTA3D_GZIP_CODEC": "lz4"}):
            with self.assertRaisesRegex(Vista3DInputError, "VISTA3D_GZIP_CODEC"):
                gz.gzip_codec()


if __name__ == "__main__":
    unittest.main()
