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
"""Reading DICOM series (io/dicom.py): synthetic series written with pydicom against the volume they hold, against
SimpleITK's reading of the same files, and every refusal's one line."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.config import DicomOptions
from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.io.dicom import load_dicom
from monai.apps.vista3d.io.input_kind import input_kind
from monai.apps.vista3d.io.load_policy import load_input
from monai.apps.vista3d.io.nifti import load_image
from tests.subprocess_env import child_env
from tests.apps.vista3d.dicom_series import (
    AXIAL,
    CORONAL,
    OBLIQUE,
    SAGITTAL,
    SeriesSpec,
    ct_values,
    expected_affine,
    write_multiframe,
    write_series,
    zip_folder,
)

ORIENTATIONS = [("axial", AXIAL), ("coronal", CORONAL), ("sagittal", SAGITTAL), ("oblique", OBLIQUE)]


def _sitk_volume(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """SimpleITK's reading of a series folder as ``([X, Y, Z] array, RAS affine)``."""
    import SimpleITK as sitk

    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder)))
    img = reader.Execute()
    lps = np.eye(4)
    lps[:3, :3] = np.asarray(img.GetDirection()).reshape(3, 3) * np.asarray(img.GetSpacing())
    lps[:3, 3] = img.GetOrigin()
    return sitk.GetArrayFromImage(img).transpose(2, 1, 0), np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


class TestDicomRead(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    @parameterized.expand(ORIENTATIONS)
    def test_same_volume_as_nifti_and_simpleitk(self, _, orientation):
        spec = SeriesSpec(orientation=orientation, slope=2.0, intercept=-1000.0)
        write_series(spec, self.dir / "s")
        image, geom = load_dicom(self.dir / "s")
        self.assertEqual(image.dtype, torch.float32)
        self.assertEqual(tuple(image.shape), (1, *spec.shape))
        np.testing.assert_array_equal(image[0].numpy(), ct_values(spec))  # rescale applied
        np.testing.assert_allclose(geom.affine, expected_affine(spec), atol=1e-4)
        sitk_values, sitk_affine = _sitk_volume(self.dir / "s")
        np.testing.assert_array_equal(image[0].numpy(), sitk_values)
        np.testing.assert_allclose(geom.affine, sitk_affine, atol=1e-4)
        # the same volume written as NIfTI reads back the same through the NIfTI loader
        nib.save(nib.Nifti1Image(ct_values(spec).astype(np.int16), expected_affine(spec)), self.dir / "ct.nii.gz")
        nifti, ngeom = load_image(self.dir / "ct.nii.gz")
        np.testing.assert_array_equal(image.numpy(), nifti.numpy())
        np.testing.assert_allclose(geom.affine, ngeom.affine, atol=1e-4)

    def test_more_slices_and_rows_than_a_tile(self):
        """The slices are laid out 16 at a time, 128 rows at a time (io/dicom.py): a volume with several of each,
        and a partial last one, against SimpleITK."""
        spec = SeriesSpec(shape=(21, 259, 37), orientation=OBLIQUE)
        write_series(spec, self.dir / "s")
        image, geom = load_dicom(self.dir / "s")
        np.testing.assert_array_equal(image[0].numpy(), ct_values(spec))
        sitk_values, sitk_affine = _sitk_volume(self.dir / "s")
        np.testing.assert_array_equal(image[0].numpy(), sitk_values)
        np.testing.assert_allclose(geom.affine, sitk_affine, atol=1e-4)

    def test_rescale_of_each_slice(self):
        """RescaleSlope and RescaleIntercept may differ from slice to slice: each slice's own apply."""
        import pydicom

        spec = SeriesSpec()  # axial: a slice's index is its z position's
        write_series(spec, self.dir / "s")
        expected = ct_values(spec)
        for f in sorted((self.dir / "s").iterdir())[::3]:
            ds = pydicom.dcmread(f)
            k = round((float(ds.ImagePositionPatient[2]) - spec.origin[2]) / spec.spacing[2])
            stored = ds.pixel_array // 2
            ds.PixelData = stored.astype(np.int16).tobytes()
            ds.RescaleSlope, ds.RescaleIntercept = 2.0, -1000.0
            ds.save_as(f, enforce_file_format=True)
            expected[:, :, k] = (2.0 * stored - 1000.0).T
        image, _ = load_dicom(self.dir / "s")
        np.testing.assert_array_equal(image[0].numpy(), expected)
        np.testing.assert_array_equal(image[0].numpy(), _sitk_volume(self.dir / "s")[0])

    def test_spacing_from_positions_not_slice_thickness(self):
        spec = SeriesSpec(spacing=(0.8, 0.7, 1.25), slice_thickness=5.0)
        write_series(spec, self.dir / "s")
        _, geom = load_dicom(self.dir / "s")
        np.testing.assert_allclose(geom.spacing, (0.8, 0.7, 1.25), atol=1e-5)

    def test_zip_and_multiframe_and_load_policy(self):
        spec = SeriesSpec(orientation=CORONAL)
        write_series(spec, self.dir / "s")
        zip_folder(self.dir / "s", self.dir / "s.zip")
        zip_folder(self.dir / "s", self.dir / "upload")  # a zip known by its bytes, as the server saves one
        write_multiframe(spec, self.dir / "multi.dcm")
        for src in (self.dir / "s.zip", self.dir / "upload", self.dir / "multi.dcm", self.dir / "s"):
            self.assertEqual(input_kind(src), "dicom")
            image, geom = load_input(src, torch.device("cpu"))
            np.testing.assert_array_equal(image[0].numpy(), ct_values(spec), err_msg=str(src))
            np.testing.assert_allclose(geom.affine, expected_affine(spec), atol=1e-4, err_msg=str(src))
        self.assertEqual(input_kind(self.dir / "x.nii.gz"), "missing")

    def test_only_dicom_members_are_inflated_whole(self):
        """A member of a zip without the DICOM marker is not inflated to its end: one whose CRC is wrong (zipfile
        checks it there) does not stop the read."""
        write_series(SeriesSpec(shape=(8, 8, 4)), self.dir / "s")
        path = zip_folder(self.dir / "s", self.dir / "s.zip")
        with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("notes.bin", bytes(1 << 20))
        data = bytearray(path.read_bytes())
        central = data.rindex(b"PK\x01\x02", 0, data.rindex(b"notes.bin"))
        data[central + 16:central + 20] = b"\xde\xad\xbe\xef"  # the central directory's CRC-32 of notes.bin
        path.write_bytes(bytes(data))
        with zipfile.ZipFile(path) as z, self.assertRaises(zipfile.BadZipFile):
            z.read("notes.bin")
        image, _ = load_dicom(path)
        self.assertEqual(tuple(image.shape), (1, 8, 8, 4))

    def test_output_header_is_the_affine(self):
        spec = SeriesSpec(orientation=SAGITTAL)
        write_series(spec, self.dir / "s")
        _, geom = load_dicom(self.dir / "s")
        self.assertEqual((int(geom.header["qform_code"]), int(geom.header["sform_code"])), (1, 1))
        np.testing.assert_allclose(geom.header.get_best_affine(), geom.affine, atol=1e-4)
        self.assertEqual(len(geom.source.datasets), spec.shape[2])
        self.assertNotIn("PixelData", geom.source.datasets[0])

    def test_series_picked_by_uid(self):
        uids = write_series(SeriesSpec(), self.dir / "s")
        second = write_series(SeriesSpec(seed=5, description="second"), self.dir / "s", uids=uids)
        image, geom = load_dicom(self.dir / "s", DicomOptions(series=second["series"]))
        np.testing.assert_array_equal(image[0].numpy(), ct_values(SeriesSpec(seed=5)))
        self.assertEqual(geom.source.series_uid, second["series"])

    @parameterized.expand([
        ("missing", dict(drop=(5,)), "1 slice(s) missing"),
        ("duplicate", dict(duplicate=(3,)), "share a position"),
        ("uneven", dict(uneven={6: 0.5}), "uneven slice spacing"),
        ("tilt", dict(tilt_mm=0.5), "gantry tilt of about 11.3 degrees"),
        ("modality", dict(modality="MR"), "modality is MR, not CT"),
    ])
    def test_refusals(self, _, changes, words):
        write_series(SeriesSpec(**changes), self.dir / "s")
        with self.assertRaises(Vista3DInputError) as cm:
            load_dicom(self.dir / "s")
        self.assertIn(words, str(cm.exception))
        self.assertEqual(len(str(cm.exception).splitlines()), 1)

    def test_modality_allowed(self):
        write_series(SeriesSpec(modality="MR"), self.dir / "s")
        image, _ = load_dicom(self.dir / "s", DicomOptions(allow_modality=True))
        self.assertEqual(tuple(image.shape), (1, 16, 14, 12))

    def test_two_series_listed(self):
        uids = write_series(SeriesSpec(description="abdomen"), self.dir / "s")
        second = write_series(SeriesSpec(seed=2, description="lung window"), self.dir / "s", uids=uids)
        with self.assertRaises(Vista3DInputError) as cm:
            load_dicom(self.dir / "s")
        text = str(cm.exception)
        for words in ("holds 2 series", uids["series"], second["series"], "abdomen", "lung window", "--series UID"):
            self.assertIn(words, text)
        with self.assertRaises(Vista3DInputError) as cm:
            load_dicom(self.dir / "s", DicomOptions(series="1.2.3"))
        self.assertIn("no series 1.2.3 here", str(cm.exception))

    def test_no_dicom(self):
        (self.dir / "empty").mkdir()
        (self.dir / "empty" / "notes.txt").write_text("no images")
        with self.assertRaises(Vista3DInputError) as cm:
            load_input(self.dir / "empty", torch.device("cpu"))
        self.assertIn("is a folder with no DICOM file directly inside, not an image", str(cm.exception))

    def test_single_slice(self):
        write_series(SeriesSpec(shape=(8, 8, 3), drop=(1, 2)), self.dir / "s")
        with self.assertRaises(Vista3DInputError) as cm:
            load_dicom(self.dir / "s")
        self.assertIn("a single 2D slice", str(cm.exception))

    def test_missing_decoder_names_the_package(self):
        """JPEG Lossless needs pylibjpeg-libjpeg or GDCM, which the 'dicom' extra does not install."""
        from pydicom.encaps import encapsulate
        from pydicom.pixels import get_decoder
        from pydicom.uid import JPEGLosslessSV1

        if get_decoder(JPEGLosslessSV1).is_available:
            self.skipTest("a JPEG Lossless decoder is installed here")  # CI installs none (requirements-dev.txt)
        write_series(SeriesSpec(shape=(8, 8, 4)), self.dir / "s")
        import pydicom

        for f in (self.dir / "s").iterdir():
            ds = pydicom.dcmread(f)
            ds.file_meta.TransferSyntaxUID = JPEGLosslessSV1
            ds.PixelData = encapsulate([b"\xff\xd8 not really jpeg \xff\xd9"])
            ds["PixelData"].VR = "OB"
            ds.save_as(f, enforce_file_format=True)
        with self.assertRaises(Vista3DInputError) as cm:
            load_dicom(self.dir / "s")
        self.assertIn("JPEG Lossless", str(cm.exception))
        self.assertIn("pip install pylibjpeg pylibjpeg-libjpeg", str(cm.exception))

    def test_without_the_extra(self):
        """Without pydicom (the core install) a DICOM input is refused with the install line."""
        write_series(SeriesSpec(shape=(8, 8, 4)), self.dir / "s")
        code = ("import sys; sys.modules['pydicom'] = None\n"
                "from monai.apps.vista3d.io.load_policy import load_input\n"
                "import torch\n"
                f"try:\n    load_input({str(self.dir / 's')!r}, torch.device('cpu'))\n"
                "except ValueError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=child_env())
        self.assertIn("reading DICOM needs pydicom and highdicom", out.stdout)
        self.assertIn("pip install pydicom highdicom", out.stdout)


if __name__ == "__main__":
    unittest.main()
