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
"""MONAI Label requests checked into the server's jobs, and answers written as Slicer reads them: the app's info,
the parameters each model takes, click continuation, dense label values and the answer's geometry."""

from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import nrrd
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.errors import ClassPromptError
from monai.apps.vista3d.io.image_geometry import ImageGeometry
from monai.apps.vista3d.labels import everything_labels, label_name
from monai.apps.vista3d.server import monailabel_jobs as mj
from monai.apps.vista3d.server.errors import ServeError
from monai.apps.vista3d.server.images import LoadedImage, load_nrrd

#: the LPS <-> RAS flip of NRRD's usual space
LPS = np.diag([-1.0, -1.0, 1.0])


def nrrd_affine(header: dict) -> np.ndarray:
    """The RAS voxel-to-world affine of an NRRD header in left-posterior-superior space."""
    assert header["space"] == "left-posterior-superior", header["space"]
    affine = np.eye(4)
    affine[:3, :3] = LPS @ np.asarray(header["space directions"]).T
    affine[:3, 3] = LPS @ np.asarray(header["space origin"])
    return affine


class TestInfo(unittest.TestCase):
    def test_what_slicer_reads(self):
        info = mj.app_info("1.0", 3)
        self.assertNotIn("config", info)  # Slicer refuses a server whose info has one
        models = info["models"]
        self.assertEqual({k: v["type"] for k, v in models.items()},
                         {"vista3d": "segmentation", "vista3d_clicks": "deepgrow"})
        self.assertEqual({v["dimension"] for v in models.values()}, {3})
        self.assertEqual(models["vista3d"]["config"], {"classes": "everything"})
        self.assertEqual(len(info["labels"]), len(everything_labels()))
        self.assertEqual(info["labels"][:3], ["liver", "spleen", "pancreas"])
        # the automatic model's labels are the values of its default answer: 1..117, dense, in id order
        self.assertEqual(list(models["vista3d"]["labels"].values()), list(range(1, 118)))
        self.assertEqual(list(models["vista3d"]["labels"]), info["labels"])
        self.assertIn("hepatic tumor", models["vista3d_clicks"]["labels"])
        self.assertEqual((info["trainers"], info["strategies"], info["datastore"]), ({}, {}, {"total": 3,
                                                                                             "completed": 0}))

    def test_unknown_model(self):
        with self.assertRaises(ServeError) as caught:
            mj.check_model("deepedit")
        self.assertEqual(caught.exception.status, 404)
        self.assertIn("vista3d_clicks", caught.exception.message)


class TestParams(unittest.TestCase):
    @parameterized.expand([
        ("not_json", "{", None, 400, "not valid JSON"),
        ("deep", "[" * 100000 + "]" * 100000, None, 400, "not valid JSON"),
        ("a_list", "[1]", None, 422, "JSON object"),
        ("unknown", '{"largest_cc": true}', "vista3d", 422, "unknown parameter 'largest_cc' for model 'vista3d'"),
        ("click_param_on_auto", '{"foreground": []}', "vista3d", 422, "unknown parameter 'foreground'"),
        ("roi", '{"label": "liver", "roi": [1, 2, 3, 4]}', "vista3d_clicks", 422, "takes no ROI box"),
        ("client_id", '{"client_id": 7}', "vista3d", 422, "'client_id' must be a string"),
    ])
    def test_refused(self, _, text, model, status, words):
        with self.assertRaises(ServeError) as caught:
            mj.parse_params(text, model)
        self.assertEqual(caught.exception.status, status)
        self.assertIn(words, caught.exception.message)

    def test_what_slicer_sends_passes(self):
        sent = ('{"label": "liver", "foreground": [[1, 2, 3]], "background": [], "reset_state": true, '
                '"client_id": "user-xyz", "result_extension": ".nrrd", "result_dtype": "uint8"}')
        self.assertEqual(mj.parse_params(sent, "vista3d_clicks")["label"], "liver")
        self.assertEqual(mj.parse_params(None, "vista3d"), {})

    @parameterized.expand([
        ({}, "nifti", (".nii.gz", "uint8")),
        ({}, "nrrd", (".nrrd", "uint8")),
        ({"result_extension": ".nrrd", "result_dtype": "uint8"}, "nifti", (".nrrd", "uint8")),
        ({"result_extension": ".nii", "result_dtype": "int16"}, "nrrd", (".nii", "int16")),
    ])
    def test_result_format(self, params, image_format, expected):
        fmt = mj.result_format(params, image_format)
        self.assertEqual((fmt.suffix, fmt.dtype), expected)

    @parameterized.expand([({"result_extension": ".seg.nrrd"},), ({"result_dtype": "int8"},),
                           ({"result_extension": "nrrd"},)])
    def test_result_format_refused(self, params):
        with self.assertRaises(ServeError) as caught:
            mj.result_format(params, "nifti")
        self.assertEqual(caught.exception.status, 422)

    @parameterized.expand([
        ("everything", None, {label_name(i): v for v, i in enumerate(sorted(everything_labels()), 1)}),
        ("names", "spleen, liver", {"liver": 1, "spleen": 2}),
        ("ids_and_a_list", [3, "aorta"], {"spleen": 1, "aorta": 2}),
        ("a_group", "kidney", {"right kidney": 1, "left kidney": 2}),
    ])
    def test_auto_request_numbers_densely_in_id_order(self, _, classes, names):
        req = mj.auto_request({} if classes is None else {"classes": classes})
        self.assertEqual(req.label_names, names)
        self.assertEqual(sorted(label_name(i) for i in req.prompt.label_ids), sorted(names))

    def test_auto_request_refusals(self):
        with self.assertRaises(ClassPromptError):
            mj.auto_request({"classes": "livr"})
        with self.assertRaises(ServeError):
            mj.auto_request({"classes": [True]})

    @parameterized.expand([
        ("nothing", {}, (0, 0)),
        ("clicks", {"label": "x", "foreground": [[1, 2, 3]] * 3, "background": [[4, 5, 6]]}, (4, 0)),
        ("not_lists", {"foreground": "1,2,3", "classes": 7}, (0, 0)),
        ("everything", {"classes": " Everything "}, (0, 0)),
        ("everything_listed", {"classes": ["everything"]}, (0, 0)),
        ("names_as_given", {"classes": "liver, spleen,liver"}, (0, 3)),
        ("a_list", {"classes": [1, "aorta"]}, (0, 2)),
    ])
    def test_prompt_sizes_as_given(self, _, params, sizes):
        self.assertEqual(mj.prompt_sizes(params), sizes)

    @parameterized.expand([("Liver", 1), ("left  kidney", 14), ("hepatic tumor", 26), ("tumor", None),
                           ("3", None), ("Segment_1", None)])
    def test_click_label_to_class(self, label, class_id):
        self.assertEqual(mj.click_request({"label": label, "foreground": [[1, 2, 3]]}).class_id, class_id)

    @parameterized.expand([
        ("no_label", {"foreground": [[1, 2, 3]]}, "'label' is required"),
        ("two_coordinates", {"label": "liver", "foreground": [[1, 2]]}, "voxel indices"),
        ("text", {"label": "liver", "background": [["1", 2, 3]]}, "voxel indices"),
        ("bool", {"label": "liver", "foreground": [[True, 2, 3]]}, "voxel indices"),
        ("nan", {"label": "liver", "foreground": [[float("nan"), 2, 3]]}, "voxel indices"),
        ("reset", {"label": "liver", "reset_state": "yes"}, "reset_state"),
    ])
    def test_click_request_refused(self, _, params, words):
        with self.assertRaises(ServeError) as caught:
            mj.click_request(params)
        self.assertEqual(caught.exception.status, 422)
        self.assertIn(words, caught.exception.message)


class TestNewClicks(unittest.TestCase):
    def _req(self, fg, bg):
        return mj.click_request({"label": "liver", "foreground": fg, "background": bg})

    def test_the_points_after_those_clicked(self):
        step = mj.new_clicks([(1, 2, 3)], [], self._req([[1, 2, 3], [4, 5, 6]], [[7, 8, 9]]))
        self.assertEqual(step, ([[4, 5, 6], [7, 8, 9]], [1, 0]))

    def test_nothing_new(self):
        self.assertEqual(mj.new_clicks([(1, 2, 3)], [], self._req([[1, 2, 3]], [])), ([], []))

    def test_a_moved_or_removed_point_starts_again(self):
        self.assertIsNone(mj.new_clicks([(1, 2, 3)], [], self._req([[1, 2, 4]], [])))
        self.assertIsNone(mj.new_clicks([(1, 2, 3)], [(4, 4, 4)], self._req([[1, 2, 3]], [])))


class TestLabelValues(unittest.TestCase):
    def test_renumber(self):
        ids = torch.tensor([[[0, 1], [3, 14]]], dtype=torch.int16)
        names = {"liver": 1, "spleen": 2, "left kidney": 3}
        out = mj.renumber(ids, names, [3, 1, 14])
        self.assertEqual(out.dtype, torch.uint8)
        self.assertEqual(out.tolist(), [[[0, 1], [2, 3]]])
        with self.assertRaises(RuntimeError):
            mj.renumber(torch.tensor([[[6]]]), names, [3, 1, 14])

    def test_object_mask(self):
        label_map = torch.tensor([0, 1, 255, 26, 0], dtype=torch.int16)
        self.assertEqual(mj.object_mask(label_map).tolist(), [0, 1, 0, 1, 0])


class TestWriteResult(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.shape = (5, 6, 7)
        self.affine = np.array([[0.0, -0.8, 0.0, 12.0], [0.9, 0.0, 0.0, -4.0], [0.0, 0.0, 1.5, 30.0],
                                [0.0, 0.0, 0.0, 1.0]])
        self.values = torch.arange(210, dtype=torch.int64).reshape(self.shape).remainder(4).to(torch.uint8)

    def _nifti_image(self) -> LoadedImage:
        img = nib.Nifti1Image(np.zeros(self.shape, np.int16), self.affine)
        geometry = ImageGeometry(self.affine, self.shape, img.header.copy(), None, np.dtype(np.int16))
        return LoadedImage("ct", "nifti", self.shape, geometry)

    def _nrrd_image(self) -> LoadedImage:
        path = self.root / "ct.nrrd"
        header = {"space": "left-posterior-superior", "space directions": (LPS @ self.affine[:3, :3]).T,
                  "space origin": LPS @ self.affine[:3, 3]}
        nrrd.write(str(path), np.zeros(self.shape, np.int16), header, index_order="F")
        _, affine, placement = load_nrrd(path)
        np.testing.assert_allclose(affine, self.affine, atol=1e-12)  # the RAS grid the answers are checked on
        return LoadedImage("ct", "nrrd", self.shape, placement)

    @parameterized.expand([("uint8",), ("int16",), ("float32",)])
    def test_nifti_in_nrrd_out(self, dtype):
        out = mj.write_result(self.values, self._nifti_image(), self.root / "a.nrrd", mj.ResultFormat(".nrrd", dtype))
        data, header = nrrd.read(str(out), index_order="F")
        self.assertEqual(data.dtype, np.dtype(dtype))
        np.testing.assert_array_equal(data, self.values.numpy())
        np.testing.assert_allclose(nrrd_affine(header), self.affine, atol=1e-12)

    def test_nrrd_in_nrrd_out_keeps_its_fields(self):
        out = mj.write_result(self.values, self._nrrd_image(), self.root / "a.nrrd", mj.ResultFormat(".nrrd", "uint8"))
        _, header = nrrd.read(str(out))
        _, source = nrrd.read(str(self.root / "ct.nrrd"))
        self.assertEqual(header["space"], source["space"])
        np.testing.assert_array_equal(header["space directions"], source["space directions"])
        np.testing.assert_array_equal(header["space origin"], source["space origin"])

    @parameterized.expand([("nifti", ".nii.gz"), ("nrrd", ".nii.gz"), ("nifti", ".nii")])
    def test_nifti_out(self, source, suffix):
        image = self._nifti_image() if source == "nifti" else self._nrrd_image()
        out = mj.write_result(self.values, image, self.root / f"a{suffix}", mj.ResultFormat(suffix, "int16"))
        img = nib.load(str(out))
        self.assertEqual(img.get_data_dtype(), np.dtype(np.int16))
        np.testing.assert_array_equal(np.asarray(img.dataobj), self.values.numpy())
        np.testing.assert_allclose(img.affine, self.affine, atol=1e-5)

    def test_nrrd_answers_need_no_pynrrd(self):
        # the app writes NRRD itself: a server without pynrrd still answers 3D Slicer's NRRD requests
        with mock.patch.dict(sys.modules, {"nrrd": None}):  # 'import nrrd' raises ImportError in here
            fmt = mj.result_format({"result_extension": ".nrrd"}, "nifti")
            out = mj.write_result(self.values, self._nifti_image(), self.root / "a.nrrd", fmt)
        data, header = nrrd.read(str(out), index_order="F")
        np.testing.assert_array_equal(data, self.values.numpy())
        np.testing.assert_allclose(nrrd_affine(header), self.affine, atol=1e-12)

    def test_a_wrong_shape_is_refused(self):
        with self.assertRaises(RuntimeError):
            mj.write_result(self.values[:2], self._nifti_image(), self.root / "a.nrrd",
                            mj.ResultFormat(".nrrd", "uint8"))


if __name__ == "__main__":
    unittest.main()
