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
"""What an image gets beside its label map: the DICOM SEG read back by highdicom and by pydicom, the preview opened,
and the command line's DICOM inputs, --statistics, --preview, --output-type and their refusals."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.batch import workers as batch_workers
from monai.apps.vista3d.io.dicom import load_dicom
from monai.apps.vista3d.io.dicom_seg import write_dicom_seg
from monai.apps.vista3d.io.preview import PANEL_PX, preview_slices, render_preview, write_preview
from monai.apps.vista3d.io.nifti import load_image
from tests.apps.vista3d.dicom_series import AXIAL, SAGITTAL, SeriesSpec, ct_values, write_series
from tests.apps.vista3d.test_cli import TINY, _one_line_errors, run_main


def _labels(shape) -> np.ndarray:
    lab = np.zeros(shape, dtype=np.uint8)
    lab[2:9, 3:10, 1:6] = 1  # liver
    lab[10:14, 2:5, 4:11] = 14  # left kidney
    lab[5, 5, 7] = 29  # left lung lower lobe: one voxel
    lab[0:3, 0:2, 8:12] = 200  # an id without a name or a code
    return lab


def _onto_grid(values: np.ndarray, affine_lps: np.ndarray, grid_affine_ras: np.ndarray, shape) -> np.ndarray:
    """Place a (slice, row, column) volume with its LPS affine onto our [X, Y, Z] grid by world position."""
    out = np.zeros(shape, dtype=np.int64)
    idx = np.argwhere(values > 0)
    world = affine_lps @ np.c_[idx, np.ones(len(idx))].T
    ours = np.rint(np.linalg.inv(grid_affine_ras) @ np.diag([-1.0, -1.0, 1.0, 1.0]) @ world).astype(int)[:3].T
    out[tuple(ours.T)] = values[tuple(idx.T)]
    return out


class TestDicomSeg(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    @parameterized.expand([("axial", AXIAL), ("sagittal", SAGITTAL)])
    def test_round_trip(self, _, orientation):
        import highdicom as hd
        import pydicom

        write_series(SeriesSpec(orientation=orientation), self.dir / "s")
        _, geom = load_dicom(self.dir / "s")
        lab = _labels(geom.spatial_shape)
        path = write_dicom_seg(lab, geom, self.dir / "seg.dcm")
        # highdicom: segments by name, the volume placed back by its affine
        seg = hd.seg.segread(path)
        by_number = {int(s.SegmentNumber): s for s in seg.SegmentSequence}
        self.assertEqual([s.SegmentLabel for s in by_number.values()], ["liver", "left kidney",
                                                                        "left lung lower lobe", "label_200"])
        ids = {1: 1, 2: 14, 3: 29, 4: 200}
        volume = seg.get_volume(combine_segments=True, relabel=False)
        numbers = _onto_grid(np.asarray(volume.array), volume.affine, geom.affine, geom.spatial_shape)
        np.testing.assert_array_equal(np.vectorize(lambda n: ids.get(n, 0))(numbers), lab)
        kidney = by_number[2].SegmentedPropertyTypeCodeSequence[0]
        self.assertEqual((kidney.CodeValue, kidney.CodingSchemeDesignator), ("64033007", "SCT"))
        self.assertEqual(kidney.SegmentedPropertyTypeModifierCodeSequence[0].CodeMeaning, "Left")
        self.assertEqual(by_number[4].SegmentedPropertyTypeCodeSequence[0].CodeValue, "91723000")  # generic
        # pydicom alone: frames, their segment numbers and positions
        ds = pydicom.dcmread(path)
        self.assertEqual(ds.Modality, "SEG")
        self.assertEqual(ds.ReferencedSeriesSequence[0].SeriesInstanceUID, geom.source.series_uid)
        frames = ds.pixel_array.reshape(-1, ds.Rows, ds.Columns)
        rebuilt = np.zeros(geom.spatial_shape, dtype=np.int64)
        orientation_lps = np.asarray(ds.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence[0]
                                     .ImageOrientationPatient, dtype=float)
        spacing = np.asarray(ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing, dtype=float)
        inv = np.linalg.inv(geom.affine)
        for frame, item in zip(frames, ds.PerFrameFunctionalGroupsSequence):
            number = int(item.SegmentIdentificationSequence[0].ReferencedSegmentNumber)
            origin = np.asarray(item.PlanePositionSequence[0].ImagePositionPatient, dtype=float)
            rows, cols = np.nonzero(frame)
            world = (origin[None] + cols[:, None] * spacing[1] * orientation_lps[None, :3]
                     + rows[:, None] * spacing[0] * orientation_lps[None, 3:])
            ras = np.c_[world * [-1, -1, 1], np.ones(len(world))]
            ours = np.rint((inv @ ras.T)[:3]).astype(int)
            rebuilt[tuple(ours)] = ids[number]
        np.testing.assert_array_equal(rebuilt, lab)

    def test_refused_for_nifti(self):
        nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.int16), np.eye(4)), self.dir / "ct.nii.gz")
        _, geom = load_image(self.dir / "ct.nii.gz")
        with self.assertRaises(ValueError) as cm:
            write_dicom_seg(np.zeros((4, 4, 4), np.uint8), geom, self.dir / "seg.dcm")
        self.assertIn("not read from DICOM", str(cm.exception))
        self.assertFalse((self.dir / "seg.dcm").exists())


class TestPreview(unittest.TestCase):
    def test_written_and_opened(self):
        from PIL import Image

        ct = torch.full((40, 30, 20), -1000.0)
        lab = torch.zeros((40, 30, 20), dtype=torch.uint8)
        lab[5:15, 5:25, 2:18] = 1
        lab[25:35, 10:20, 5:15] = 3
        affine = np.diag([0.8, 0.8, 2.5, 1.0])
        slices = preview_slices(ct, lab, affine, [("spleen", (30.0, 15.0, 10.0))])
        self.assertEqual(slices.shown, [1, 3])
        self.assertEqual(len(slices.rows), 2)
        with tempfile.TemporaryDirectory() as tmp:
            path = write_preview(slices, Path(tmp) / "preview.png")
            with Image.open(path) as img:
                self.assertEqual(img.format, "PNG")
                self.assertGreaterEqual(img.width, 3 * PANEL_PX)
                self.assertGreaterEqual(img.height, 2 * PANEL_PX)
                self.assertEqual(img.size, render_preview(slices).size)
            self.assertEqual([p.name for p in Path(tmp).iterdir()], ["preview.png"])

    def test_radiological_orientation(self):
        """A structure on the patient's right is drawn on the left of the axial view, whatever the voxel order."""
        lab = torch.zeros((20, 20, 6), dtype=torch.uint8)
        lab[:5, 8:12, :] = 1  # voxel x 0..4
        for sign in (1.0, -1.0):  # voxel x runs towards the patient's left (-1, LAS) or right (+1, RAS)
            views = preview_slices(torch.zeros(20, 20, 6), lab, np.diag([sign, 1.0, 1.0, 1.0])).rows[0][1]
            axial = views[0][1]
            columns = np.nonzero(axial.any(axis=0))[0]
            on_screen_left = columns.max() < 10
            # x = 0..4 is the patient's left side for RAS (drawn on the right), the right side for LAS (drawn left)
            self.assertEqual(on_screen_left, sign < 0, sign)


class TestCliDicom(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.spec = SeriesSpec(shape=(36, 34, 20), spacing=(1.0, 1.1, 2.0))
        self.uids = write_series(self.spec, self.tmp / "cts" / "patient1" / "CT_abdomen")

    # a label map on a GPU reaches the saver cast and laid out where it is (DeviceLabelMap): here a CPU map is
    # handed on as if it were off the host
    @parameterized.expand([("label_map_on_the_host", False), ("label_map_as_from_a_gpu", True)])
    def test_series_folder_with_every_extra(self, _, off_host):
        import pydicom

        src = self.tmp / "cts" / "patient1" / "CT_abdomen"
        with mock.patch.object(batch_workers, "_on_device", lambda labels: off_host):
            code, _, err = run_main(["-i", src, "-o", self.tmp / "out", *TINY, "--statistics", "--preview",
                                     "--output-type", "dicom-seg"])
        self.assertEqual(code, 0, err)
        folder = self.tmp / "out" / "CT_abdomen"
        self.assertEqual(sorted(p.name for p in folder.iterdir()),
                         ["CT_abdomen_trans.dcm", "CT_abdomen_trans.nii.gz", "preview.png", "statistics.json"])
        labels, lgeom = load_image(folder / "CT_abdomen_trans.nii.gz")
        stats = json.loads((folder / "statistics.json").read_text())
        self.assertEqual(stats["image"], str(src))
        present = {int(i) for i in np.unique(labels.numpy()) if i > 0}
        self.assertEqual({s["id"] for s in stats["structures"].values()}, present)
        seg = pydicom.dcmread(folder / "CT_abdomen_trans.dcm")  # one segment per structure of the label map
        self.assertEqual(len(seg.SegmentSequence), len(present))
        # the same statistics from the command, over the same CT and label map
        code, out, err = run_main(["statistics", src, folder / "CT_abdomen_trans.nii.gz", "--device", "cpu"])
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["structures"], stats["structures"])
        # the NIfTI output lies where the series does
        _, geom = load_dicom(src)
        np.testing.assert_allclose(lgeom.affine, geom.affine, atol=1e-4)

    def test_folder_search_and_output_name(self):
        write_series(SeriesSpec(shape=(36, 34, 20), seed=4), self.tmp / "cts" / "patient2" / "CT")
        code, _, err = run_main(["-i", self.tmp / "cts", "-o", self.tmp / "out", *TINY])
        self.assertEqual(code, 0, err)
        self.assertTrue((self.tmp / "out" / "patient1" / "CT_abdomen" / "CT_abdomen_trans.nii.gz").is_file())
        self.assertTrue((self.tmp / "out" / "patient2" / "CT" / "CT_trans.nii.gz").is_file())
        code, _, err = run_main(["-i", self.tmp / "cts" / "patient2" / "CT", "-o", self.tmp / "named",
                                 "--output-name", "p2", *TINY])
        self.assertEqual(code, 0, err)
        self.assertTrue((self.tmp / "named" / "p2" / "p2_trans.nii.gz").is_file())

    @parameterized.expand([
        ("two_series", "holds 2 series", 1),
        ("not_ct", "modality is MR, not CT", 1),
        ("missing_slice", "1 slice(s) missing", 1),
        ("tilt", "gantry tilt", 1),
        ("seg_of_nifti", "--output-type dicom-seg refers to the DICOM series", 2),
        ("output_name_many", "--output-name names one image's outputs", 2),
        ("no_dicom", "no .nii or .nii.gz image or DICOM series found", 2),
    ])
    def test_refusals_write_nothing(self, case, words, exit_code):
        src = self.tmp / "bad"
        extra: list = []
        if case == "two_series":
            write_series(SeriesSpec(shape=(36, 34, 20)), src, uids=write_series(SeriesSpec(shape=(36, 34, 20),
                                                                                         seed=1), src))
        elif case == "not_ct":
            write_series(SeriesSpec(shape=(36, 34, 20), modality="MR"), src)
        elif case == "missing_slice":
            write_series(SeriesSpec(shape=(36, 34, 20), drop=(7,)), src)
        elif case == "tilt":
            write_series(SeriesSpec(shape=(36, 34, 20), tilt_mm=0.4), src)
        elif case == "seg_of_nifti":
            src.mkdir()
            nib.save(nib.Nifti1Image(ct_values(self.spec).astype(np.int16), np.eye(4)), src / "ct.nii.gz")
            extra = ["--output-type", "dicom-seg"]
        elif case == "output_name_many":
            src = self.tmp / "cts"
            write_series(SeriesSpec(shape=(36, 34, 20), seed=4), self.tmp / "cts" / "patient2" / "CT")
            extra = ["--output-name", "x"]
        else:
            (src / "sub").mkdir(parents=True)
            (src / "sub" / "readme.txt").write_text("no images")
        code, _, err = run_main(["-i", src, "-o", self.tmp / "out", *TINY, "--statistics", *extra])
        self.assertEqual(code, exit_code, err)
        lines = [ln for ln in _one_line_errors(self, err) if ln.startswith("error: ")]
        self.assertIn(words, lines[0])
        written = [p for p in (self.tmp / "out").rglob("*") if p.is_file() and p.name != "summary.json"] \
            if (self.tmp / "out").exists() else []
        self.assertEqual(written, [])

    def test_series_flag_picks_one(self):
        src = self.tmp / "cts" / "patient1" / "CT_abdomen"
        second = write_series(SeriesSpec(shape=(36, 34, 20), seed=9, description="second"), src, uids=self.uids)
        code, _, err = run_main(["-i", src, "-o", self.tmp / "out", *TINY, "--series", second["series"]])
        self.assertEqual(code, 0, err)

    def test_statistics_command_refusals_and_names(self):
        src = self.tmp / "cts" / "patient1" / "CT_abdomen"
        lab = np.zeros(self.spec.shape, dtype=np.uint8)
        lab[3:9, 4:10, 5:9] = 7
        _, geom = load_dicom(src)
        nib.save(nib.Nifti1Image(lab, geom.affine), self.tmp / "other.nii.gz")
        (self.tmp / "names.json").write_text(json.dumps({"liver_segment_2": 7}))
        code, _, err = run_main(["statistics", src, self.tmp / "other.nii.gz", "--label-names", self.tmp / "names.json",
                                 "-o", self.tmp / "stats.json", "--device", "cpu"])
        self.assertEqual(code, 0, err)
        stats = json.loads((self.tmp / "stats.json").read_text())
        self.assertEqual(stats["structures"]["liver_segment_2"]["voxels"], 6 * 6 * 4)
        nib.save(nib.Nifti1Image(lab[:-1], geom.affine), self.tmp / "small.nii.gz")
        code, _, err = run_main(["statistics", src, self.tmp / "small.nii.gz", "--device", "cpu"])
        self.assertEqual(code, 2, err)
        self.assertIn("give the label map made for this CT", err)


if __name__ == "__main__":
    unittest.main()
