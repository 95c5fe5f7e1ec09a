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
"""vista3d serve over a real socket with a zip of a DICOM series (uploaded, or by URL): the same label map as the
same volume sent as NIfTI, statistics in the answer equal to core.statistics on that label map, and the zip
archives it refuses (a bomb, too many voxels, two series, a path escape, ...) with a 4xx, one line, nothing left."""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
import unittest
import zipfile
from pathlib import Path

import httpx
import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.core.statistics import structure_statistics
from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.dicom_series import SeriesSpec, expected_affine, write_series, zip_folder
from tests.apps.vista3d.server.harness import ImageHost, settings, start_for_class
from tests.apps.vista3d.server.nim_client import NimClient
from tests.apps.vista3d.stub_vista import phantom

SHAPE = (40, 40, 36)
SPEC = SeriesSpec(shape=SHAPE, spacing=(1.0, 1.0, 1.0), origin=(-19.5, -19.5, -17.5), intercept=-1024.0)
MAX_VOXELS = 60_000  # the phantom has 57,600


def _label_map(files: dict[str, bytes], name: str) -> tuple[np.ndarray, np.ndarray]:
    img = nib.Nifti1Image.from_bytes(gzip.decompress(files[name]))
    return np.asarray(img.dataobj), img.affine


def _document(size: int) -> bytes:
    """A DICOM file without an image (an encapsulated PDF of ``size`` bytes), as a PACS export may zip beside a
    series."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.filebase import DicomBytesIO
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.104.1"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.SeriesInstanceUID = "DOC", generate_uid()
    ds.EncapsulatedDocument = bytes(size)
    buf = DicomBytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def _zip(dest: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return dest


class TestDicomZip(unittest.TestCase):
    """One server for the class (max_voxels just above the phantom's, its own scratch folder to check for leftovers);
    the phantom as a DICOM series (zipped) and as NIfTI with the series' affine."""

    @classmethod
    def setUpClass(cls):
        cls.host = ImageHost().__enter__()
        cls.addClassCleanup(cls.host.__exit__, None, None, None)
        cls._tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls._tmp.cleanup)
        cls.tmp = Path(cls._tmp.name)
        cls.work = cls.tmp / "work"
        cls.work.mkdir()
        cls.data = cls.tmp / "data"
        (cls.data / "results").mkdir(parents=True)
        values, _, _ = phantom(SHAPE, np.eye(3), (1.0, 1.0, 1.0))
        cls.values = np.rint(values)
        write_series(SPEC, cls.tmp / "series", values=cls.values)
        cls.zip = zip_folder(cls.tmp / "series", cls.host.folder / "ct.zip")
        shutil.copy(cls.zip, cls.data / "ct.zip")
        cls.nifti = cls.tmp / "ct.nii.gz"
        nib.save(nib.Nifti1Image(cls.values.astype(np.int16), expected_affine(SPEC)), str(cls.nifti))
        cls.server = start_for_class(cls, settings(allow_url_hosts=("127.0.0.1",), allow_private_urls=True,
                                                   work_dir=cls.work, data_dir=cls.data,
                                                   limits=Limits(request_timeout=120.0, max_voxels=MAX_VOXELS)))
        cls.client = NimClient(cls.server.url)
        cls.addClassCleanup(cls.client.close)
        cls.expected = cls._upload(cls.nifti, "ct.nii.gz")

    @classmethod
    def _upload(cls, path: Path, filename: str, **fields) -> httpx.Response:
        files = {"image": (filename, path.read_bytes(), "application/octet-stream")}
        return cls.client.http.post("/v1/vista3d/inference", files=files, data=fields)

    def refused(self, send, status: int, *words: str) -> str:
        """Send a request that must be refused: its status, one line holding ``words``, no server path in it,
        and no scratch folder of its own left behind (an earlier answer's may still be on its way out)."""
        before = set(self.work.iterdir())
        response = send()
        detail = response.json()["detail"]
        self.assertEqual(response.status_code, status, detail)
        self.assertNotIn("\n", detail)
        self.assertNotIn(str(self.work), detail)
        for word in words:
            self.assertIn(word, detail)
        self.assertEqual(set(self.work.iterdir()) - before, set())
        return detail

    def test_upload_equals_nifti(self):
        self.assertEqual(self.expected.status_code, 200, self.expected.text)
        want, want_affine = _label_map(NimClient.unzip(self.expected), "ct_trans.nii.gz")
        response = self._upload(self.zip, "ct.zip")
        self.assertEqual(response.status_code, 200, response.text)
        files = NimClient.unzip(response)
        self.assertEqual(sorted(files), ["ct_trans.nii.gz"])
        got, affine = _label_map(files, "ct_trans.nii.gz")
        self.assertGreater(len(np.unique(want)), 1)  # the phantom's organs are found: a real comparison
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(affine, want_affine, atol=1e-4)

    def test_url_with_statistics(self):
        response = self.client.http.post("/v1/vista3d/inference", json={"image": self.host.url("ct.zip"),
                                                                        "statistics": True})
        self.assertEqual(response.status_code, 200, response.text)
        self.assertIn("statistics", response.headers["server-timing"])
        files = NimClient.unzip(response)
        self.assertEqual(sorted(files), ["ct_trans.nii.gz", "statistics.json"])
        labels, affine = _label_map(files, "ct_trans.nii.gz")
        want, _ = _label_map(NimClient.unzip(self.expected), "ct_trans.nii.gz")
        np.testing.assert_array_equal(labels, want)
        stats = json.loads(files["statistics.json"])
        self.assertEqual((stats["image"], stats["label_map"]), ("ct", "ct_trans.nii.gz"))
        np.testing.assert_allclose(affine, expected_affine(SPEC), atol=1e-5)
        reference = structure_statistics(torch.from_numpy(self.values), torch.from_numpy(labels.astype(np.int64)),
                                         expected_affine(SPEC))
        self.assertTrue(reference["structures"])
        self.assertEqual({k: v for k, v in stats.items() if k not in ("image", "label_map")}, reference)

    def test_statistics_of_a_nifti_upload(self):
        response = self._upload(self.nifti, "ct.nii.gz", statistics="true")
        self.assertEqual(response.status_code, 200, response.text)
        files = NimClient.unzip(response)
        labels, affine = _label_map(files, "ct_trans.nii.gz")
        reference = structure_statistics(torch.from_numpy(self.values), torch.from_numpy(labels.astype(np.int64)),
                                         affine)
        self.assertEqual(json.loads(files["statistics.json"])["structures"], reference["structures"])

    def test_data_dir_path_with_statistics_into_local_working_dir(self):
        response = self.client.inference("ct.zip", local_working_dir="results")
        self.assertEqual(response.status_code, 200, response.text)
        self.assertNotIn("statistics", response.json())
        self.assertEqual(Path(response.json()["output"]), self.data / "results" / "ct_trans.nii.gz")
        response = self.client.http.post("/v1/vista3d/inference", json={
            "image": "ct.zip", "local_working_dir": "results", "statistics": True})
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()  # a second answer there takes a name of its own
        self.assertEqual(Path(answer["output"]), self.data / "results" / "ct_trans-2.nii.gz")
        self.assertEqual(Path(answer["statistics"]), self.data / "results" / "ct_trans-2_statistics.json")
        self.assertEqual(json.loads(Path(answer["statistics"]).read_text())["label_map"], "ct_trans-2.nii.gz")
        img = nib.load(answer["output"])
        labels = np.asarray(img.dataobj).astype(np.int64)
        want, _ = _label_map(NimClient.unzip(self.expected), "ct_trans.nii.gz")
        np.testing.assert_array_equal(labels, want)
        stats = json.loads(Path(answer["statistics"]).read_text())
        reference = structure_statistics(torch.from_numpy(self.values), torch.from_numpy(labels), expected_affine(SPEC))
        self.assertEqual(stats["structures"], reference["structures"])

    def test_a_document_beside_the_series(self):
        """A DICOM file without an image in the zip (a report, a DICOMDIR) is read past, up to its bound."""
        members = {f"s/{f.name}": f.read_bytes() for f in (self.tmp / "series").iterdir()}
        members["s/REPORT"] = _document(2 << 20)
        response = self._upload(_zip(self.tmp / "with_report.zip", members), "ct.zip")
        self.assertEqual(response.status_code, 200, response.text)
        want, _ = _label_map(NimClient.unzip(self.expected), "ct_trans.nii.gz")
        np.testing.assert_array_equal(_label_map(NimClient.unzip(response), "ct_trans.nii.gz")[0], want)
        members["s/REPORT"] = _document(65 << 20)
        big = _zip(self.tmp / "with_big_report.zip", members)
        self.refused(lambda: self._upload(big, "ct.zip"), 413, "without an image", "leave them out")

    def test_click_session_on_a_zip(self):
        files = {"image": ("ct.zip", self.zip.read_bytes(), "application/zip")}
        response = self.client.http.post("/v1/vista3d/sessions", files=files)
        self.assertEqual(response.status_code, 201, response.text)
        info = response.json()
        self.assertEqual((info["name"], info["format"], info["shape"]), ("ct", "nifti", list(SHAPE)))
        self.assertEqual(self.client.http.delete(f"/v1/vista3d/sessions/{info['session_id']}").status_code, 204)

    @parameterized.expand([("not_json", "yes", 400), ("not_a_bool", "1", 422)])
    def test_statistics_field_is_a_json_bool(self, _, value, status):
        self.refused(lambda: self._upload(self.nifti, "ct.nii.gz", statistics=value), status, "statistics")

    def test_statistics_need_the_zip_answer(self):
        self.refused(lambda: self.client.http.post("/v1/vista3d/inference", json={
            "image": self.host.url("ct.zip"), "statistics": True}, headers={"Accept": "application/gzip"}),
            406, "statistics.json", "application/zip")

    def _series_bytes(self, spec: SeriesSpec, folder: str) -> dict[str, bytes]:
        write_series(spec, self.tmp / folder)
        return {f"{folder}/{f.name}": f.read_bytes() for f in sorted((self.tmp / folder).iterdir())}

    def _refusal_zip(self, case: str) -> Path:
        dest = self.tmp / f"{case}.zip"
        small = SeriesSpec(shape=(8, 8, 4))
        if case == "bomb":  # one slice padded with 8 MiB of zeros: a few KB zipped
            members = self._series_bytes(small, "bomb")
            first = sorted(members)[0]
            members[first] += bytes(8 << 20)
            return _zip(dest, members)
        if case == "too_many_voxels":
            return _zip(dest, self._series_bytes(SeriesSpec(shape=(64, 64, 16)), "big"))
        if case == "two_series":
            members = self._series_bytes(small.with_(description="abdomen"), "a")
            members.update(self._series_bytes(small.with_(seed=3, description="lung"), "b"))
            return _zip(dest, members)
        if case == "path_escape":
            members = self._series_bytes(small, "escape")
            members["../../etc/evil.dcm"] = next(iter(members.values()))
            return _zip(dest, members)
        if case == "no_dicom":
            return _zip(dest, {"readme.txt": b"not an image"})
        if case == "not_ct":
            return _zip(dest, self._series_bytes(small.with_(modality="MR"), "mr"))
        raise AssertionError(case)

    @parameterized.expand([
        ("bomb", 413, "more than its header describes", "zip bomb"),
        # 64 x 64 voxels a slice: the count stops at the 15th, the first past MAX_VOXELS
        ("too_many_voxels", 413, f"{64 * 64 * 15} voxels", f"more than --max-voxels {MAX_VOXELS}", "before any voxel"),
        ("two_series", 422, "holds 2 series", "abdomen", "lung", "send a zip of one series"),
        ("path_escape", 422, "../../etc/evil.dcm", "outside the archive's folder"),
        ("no_dicom", 422, "holds no DICOM image"),
        ("not_ct", 422, "modality is MR, not CT", "send a CT series"),
    ])
    def test_refused(self, case, status, *words):
        path = self._refusal_zip(case)
        detail = self.refused(lambda: self._upload(path, "series.zip"), status, *words)
        for option in ("--series", "--allow-modality"):  # the command line's: a request has no such option
            self.assertNotIn(option, detail)
        shutil.copy(path, self.host.folder / path.name)
        self.refused(lambda: self.client.inference(self.host.url(path.name)), status, *words)

    def test_single_dicom_file_refused(self):
        one = sorted((self.tmp / "series").iterdir())[0]
        self.refused(lambda: self._upload(one, "slice.dcm"), 415, "single DICOM file", "zip")

    def test_damaged_zip_refused(self):
        data = self.zip.read_bytes()
        damaged = self.tmp / "damaged.zip"
        damaged.write_bytes(data[: len(data) // 2])
        self.refused(lambda: self._upload(damaged, "damaged.zip"), 422, "zip")


if __name__ == "__main__":
    unittest.main()
