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
"""3D Slicer's MONAI Label calls over a real socket: connect, upload (the hand-built multipart and a session),
automatic answers equal to Vista3DPipeline and click sequences equal to Vista3DSession, read back from the multipart
answer as Slicer reads it; per-client images, expiry, the shared queue, the token login, and bad requests."""

from __future__ import annotations

import json
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import nibabel as nib
import nrrd
import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.core.session import Vista3DSession
from monai.apps.vista3d.server.monailabel_jobs import auto_request, object_mask, renumber
from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import (
    Gate,
    ManualClock,
    settings,
    start_for_class,
    tiny_pipeline,
    write_phantom,
)
from tests.apps.vista3d.server.monailabel_client import SlicerLikeClient, hand_built_multipart
from tests.apps.vista3d.server.test_monailabel_jobs import LPS, nrrd_affine
from tests.networks.tiny_vista3d import tiny_vista3d_with_recorded_weights

WAIT = 60  # seconds before a wait on an event is a failure
TOKEN = "a-token-of-twenty-characters"
# five requests as Slicer sends them: every point placed on the segment so far, one more each time
POINTS = [([[20, 20, 18]], []), ([[20, 20, 18], [8, 30, 10]], []), ([[20, 20, 18], [8, 30, 10]], [[30, 9, 26]]),
          ([[20, 20, 18], [8, 30, 10], [20, 21, 18]], [[30, 9, 26]]),
          ([[20, 20, 18], [8, 30, 10], [20, 21, 18], [12, 25, 14]], [[30, 9, 26], [28, 14, 20]])]


def _read(answer_name: str, data: bytes, folder: Path) -> tuple[np.ndarray, dict | nib.Nifti1Image]:
    path = folder / answer_name
    path.write_bytes(data)
    if answer_name.endswith(".nrrd"):
        return nrrd.read(str(path), index_order="F")
    img = nib.load(str(path))
    return np.asarray(img.dataobj), img


def _new_points(before: tuple, now: tuple) -> tuple[list, list]:
    fg, bg = now[0][len(before[0]):], now[1][len(before[1]):]
    return fg + bg, [1] * len(fg) + [0] * len(bg)


class TestSlicerProtocol(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.folder = Path(cls._tmp.name)
        cls.ct = write_phantom(cls.folder / "ct.nii.gz")
        cls.ct2 = write_phantom(cls.folder / "ct2.nii.gz", spacing=(1.2, 1.2, 1.2))
        img = nib.load(str(cls.ct))
        cls.affine = img.affine
        cls.ct_nrrd = cls.folder / "ct.nrrd"
        nrrd.write(str(cls.ct_nrrd), np.asarray(img.dataobj), {
            "space": "left-posterior-superior", "space directions": (LPS @ img.affine[:3, :3]).T,
            "space origin": LPS @ img.affine[:3, 3]}, index_order="F")
        cls.reference = tiny_pipeline()
        cls.server = start_for_class(cls, settings(limits=Limits(max_sessions=8, request_timeout=120.0)))
        cls.client = SlicerLikeClient(cls.server.url)
        assert cls.client.upload_image(cls.ct, "CT chest").status == 200

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self.scratch = Path(tempfile.mkdtemp(dir=self.folder))

    def _expected_auto(self, path: Path, classes: str) -> tuple[np.ndarray, dict]:
        req = auto_request({"classes": classes})
        labels = self.reference.segment(str(path), classes=req.prompt).labels
        return renumber(labels, req.label_names, req.prompt.label_ids).numpy(), req.label_names

    # ------------------------------------------------------------------------------------------------ connect
    def test_connect_as_slicer_does(self):
        self.assertFalse(self.client.auth_enabled())
        info = self.client.info()
        self.assertEqual(info.status, 200)
        self.assertNotIn("config", info.json())
        self.assertEqual(info.json()["models"]["vista3d_clicks"]["type"], "deepgrow")
        self.assertFalse(self.client.training_running())
        self.assertTrue(self.client.token_valid())

    # ---------------------------------------------------------------------------------------------- automatic
    def test_automatic_everything_equals_the_pipeline_on_the_uploaded_grid(self):
        answer = self.client.infer("vista3d", "CT chest", {"classes": "everything"})
        expected, names = self._expected_auto(self.ct, "everything")
        self.assertEqual(answer.params["label_names"], names)
        self.assertTrue(answer.filename.endswith(".nrrd"))
        data, header = _read(answer.filename, answer.data, self.scratch)
        self.assertEqual(data.dtype, np.uint8)
        np.testing.assert_array_equal(data, expected)
        self.assertGreater(len(np.unique(data)), 1)
        np.testing.assert_allclose(nrrd_affine(header), self.affine, atol=1e-6)

    def test_nrrd_upload_keeps_its_own_fields_and_other_outputs(self):
        self.assertEqual(self.client.upload_image(self.ct_nrrd, "ct nrrd", route="/datastore/image").status, 200)
        answer = self.client.infer("vista3d", "ct nrrd", {"classes": "liver, spleen"})
        expected, names = self._expected_auto(self.ct, "liver, spleen")
        self.assertEqual(answer.params["label_names"], {"liver": 1, "spleen": 2})
        data, header = _read(answer.filename, answer.data, self.scratch)
        np.testing.assert_array_equal(data, expected)
        _, source = nrrd.read(str(self.ct_nrrd))
        self.assertEqual(header["space"], source["space"])
        np.testing.assert_array_equal(header["space directions"], source["space directions"])
        # the same request in NIfTI, int16, as the file alone (output=image) and as the JSON alone (output=json)
        params = {"classes": "liver, spleen", "result_extension": ".nii.gz", "result_dtype": "int16"}
        image = self.client.infer_reply("vista3d", "ct nrrd", params, output="image")
        self.assertEqual(image.status, 200, image.body)
        self.assertIn('filename="ct_vista3d.nii.gz"', image.headers["content-disposition"])
        data, img = _read("out.nii.gz", image.body, self.scratch)
        self.assertEqual(img.get_data_dtype(), np.int16)
        np.testing.assert_array_equal(data, expected)
        np.testing.assert_allclose(img.affine, self.affine, atol=1e-5)
        only_json = self.client.infer_reply("vista3d", "ct nrrd", params, output="json")
        self.assertEqual(only_json.headers["content-type"], "application/json")
        self.assertEqual(only_json.json()["label_names"], names)

    # ------------------------------------------------------------------------------------------------- clicks
    def _five_clicks(self, client: SlicerLikeClient, image: str, label: str, class_id, path: Path,
                     session_id: str | None = None) -> None:
        reference = Vista3DSession(self.reference, str(path))
        before = ([], [])
        for k, (fg, bg) in enumerate(POINTS):
            params = {"label": label, "foreground": fg, "background": bg}
            if k == 0:
                params["reset_state"] = True  # the same points on this segment in another test start over here
            answer = client.infer("vista3d_clicks", image, params, session_id=session_id)
            self.assertEqual(answer.params["label_names"], {label: 1})
            self.assertEqual(answer.params["clicks"], len(fg) + len(bg))
            self.assertGreater(answer.params["latencies"]["inference"], 0)
            points, labels = _new_points(before, (fg, bg))
            expected = object_mask(reference.click(points, labels, classes=class_id)).numpy()
            data, header = _read(answer.filename, answer.data, self.scratch)
            np.testing.assert_array_equal(data, expected, err_msg=f"request {k}")
            before = (fg, bg)
        self.assertTrue(expected.any())
        np.testing.assert_allclose(nrrd_affine(header), nib.load(str(path)).affine, atol=1e-6)

    @parameterized.expand([("a_vista3d_class", "liver", 1), ("a_name_of_ones_own", "my lesion", None)])
    def test_five_clicks_equal_vista3d_session(self, _, label, class_id):
        self._five_clicks(self.client, "CT chest", label, class_id, self.ct)

    def test_no_new_point_answers_again_and_a_moved_point_starts_again(self):
        params = {"label": "spleen", "foreground": [[8, 30, 10]], "background": []}
        first = self.client.infer("vista3d_clicks", "CT chest", params)
        again = self.client.infer("vista3d_clicks", "CT chest", params)
        self.assertEqual(again.data, first.data)
        self.assertEqual((again.params["clicks"], again.params["latencies"]), (1, {}))  # nothing ran
        for change in ({"foreground": [[9, 30, 10], [20, 20, 18]]}, {"reset_state": True}):
            answer = self.client.infer("vista3d_clicks", "CT chest", {**params, **change})
            fresh = Vista3DSession(self.reference, str(self.ct))
            fg = change.get("foreground", params["foreground"])
            expected = object_mask(fresh.click(fg, [1] * len(fg), classes=3)).numpy()
            np.testing.assert_array_equal(_read(answer.filename, answer.data, self.scratch)[0], expected)

    def test_session_upload_then_clicks(self):
        reply = self.client.create_session(self.ct2)
        self.assertEqual(reply.status, 200, reply.body)
        sid = reply.json()["session_id"]
        self.assertEqual(self.client.get_session(sid).status, 200)
        self._five_clicks(self.client, "ct2", "aorta", 6, self.ct2, session_id=sid)
        deleted = self.client.remove_session(sid)
        self.assertEqual(deleted.status, 200)
        gone = self.client.infer_reply("vista3d_clicks", "ct2", {"label": "aorta", "foreground": [[20, 20, 18]]},
                                       session_id=sid)
        self.assertEqual(gone.status, 410)
        self.assertIn("was deleted", gone.json()["detail"])

    # ---------------------------------------------------------------------------------------- whose images
    def test_an_image_id_belongs_to_its_client_and_a_new_upload_starts_new_clicks(self):
        other = SlicerLikeClient(self.server.url, client_id="someone-else")
        missing = other.infer_reply("vista3d_clicks", "CT chest", {"label": "liver", "foreground": [[20, 20, 18]]})
        self.assertEqual(missing.status, 404)
        self.assertIn("upload it first", missing.json()["detail"])
        # the other client's "CT chest" is its own image: clicks on it are clicks on ct2
        self.assertEqual(other.upload_image(self.ct2, "CT chest").status, 200)
        click = {"label": "liver", "foreground": [[20, 20, 18]]}
        mine = self.client.infer("vista3d_clicks", "CT chest", click)
        theirs = other.infer("vista3d_clicks", "CT chest", click)
        expected = {path: object_mask(Vista3DSession(self.reference, str(path)).click([[20, 20, 18]], [1], 1))
                    for path in (self.ct, self.ct2)}
        np.testing.assert_array_equal(_read(mine.filename, mine.data, self.scratch)[0], expected[self.ct].numpy())
        np.testing.assert_array_equal(_read(theirs.filename, theirs.data, self.scratch)[0],
                                      expected[self.ct2].numpy())
        # a new upload under the same id: the same points are a first click on the new image
        self.assertEqual(other.upload_image(self.ct, "CT chest").status, 200)
        again = other.infer("vista3d_clicks", "CT chest", click)
        np.testing.assert_array_equal(_read(again.filename, again.data, self.scratch)[0], expected[self.ct].numpy())

    # -------------------------------------------------------------------------------------------- bad input
    @parameterized.expand([
        ("unknown_model", "POST", "/infer/deepedit?image=CT+chest", {}, 404, "no model 'deepedit'"),
        ("no_image", "POST", "/infer/vista3d", {}, 422, "name the image"),
        ("never_uploaded", "POST", "/infer/vista3d?image=nope", {}, 404, "upload it first"),
        ("bad_params", "POST", "/infer/vista3d?image=CT+chest", "{", 400, "not valid JSON"),
        ("unknown_param", "POST", "/infer/vista3d?image=CT+chest", {"device": "cuda"}, 422,
         "unknown parameter 'device'"),
        ("no_label", "POST", "/infer/vista3d_clicks?image=CT+chest", {"foreground": [[1, 2, 3]]},
         422, "'label' is required"),
        ("no_points", "POST", "/infer/vista3d_clicks?image=CT+chest", {"label": "kidney"}, 422,
         "no points"),
        ("outside", "POST", "/infer/vista3d_clicks?image=CT+chest",
         {"label": "spleen", "foreground": [[99, 2, 3]]}, 422, "outside the image"),
        ("bad_class", "POST", "/infer/vista3d?image=CT+chest", {"classes": "livr"}, 422,
         "did you mean 'liver'"),
        ("seg_nrrd", "POST", "/infer/vista3d?image=CT+chest", {"result_extension": ".seg.nrrd"}, 422,
         "result_extension"),
        ("dicom_seg", "POST", "/infer/vista3d?image=CT+chest&output=dicom_seg", {}, 422, "output='dicom_seg'"),
        ("save_label", "PUT", "/datastore/label?image=CT+chest", {}, 404, "save the segmentation in 3D Slicer"),
        ("train", "POST", "/train/", {}, 404, "training is not offered"),
        ("no_session", "GET", "/session/never-issued", None, 404, "create a new one with PUT /session/"),
    ])
    def test_bad_requests_get_one_json_line(self, _, method, selector, params, status, words):
        """``params``: what the form's ``params`` field holds (the client's id added to an object), None: no body."""
        if isinstance(params, dict):
            params = json.dumps({**params, "client_id": self.client.client_id})
        body, ctype = (None, None) if params is None else hand_built_multipart({"params": params}, {})[::-1]
        reply = self.client.request(method, selector, body, ctype)
        self.assertEqual(reply.status, status, reply.body)
        self.assertEqual(reply.headers["content-type"], "application/json")
        detail = reply.json()["detail"]
        self.assertIn(words, detail)
        self.assertNotIn("\n", detail)
        self.assertEqual(self.client.info().status, 200)  # and the server goes on

    @parameterized.expand([
        ("not_an_image", {"params": "{}"}, {"file": "text"}, 415, "neither NIfTI"),
        ("no_file", {"params": "{}"}, {}, 422, "no complete 'file' part"),
        ("json_body", None, None, 415, "multipart/form-data"),
        ("unknown_field", {"label": "x"}, {}, 422, "unknown form field 'label'"),
    ])
    def test_bad_uploads(self, _, fields, files, status, words):
        paths = {}
        for name, text in (files or {}).items():
            paths[name] = self.scratch / f"{name}.nii.gz"
            paths[name].write_text(text)
        if fields is None:
            ctype, body = "application/json", b'{"image": "x"}'
        else:
            ctype, body = hand_built_multipart(fields, paths)
        reply = self.client.request("PUT", "/datastore/?image=bad", body, ctype)
        self.assertEqual(reply.status, status, reply.body)
        self.assertIn(words, reply.json()["detail"])


class TestSharedGates(unittest.TestCase):
    """The token (with Slicer's login), the body limit, the expiry and the queue hold for the protocol's endpoints
    too (each test uploads what it uses: one of them moves the clock past the expiry)."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.folder = Path(cls._tmp.name)
        cls.ct = write_phantom(cls.folder / "ct.nii.gz")
        cls.network = tiny_vista3d_with_recorded_weights()
        cls.clock = ManualClock()
        limits = Limits(queue_size=0, max_body_bytes=200_000, session_ttl=100.0, request_timeout=120.0)
        cls.server = start_for_class(cls, settings(token=TOKEN, limits=limits),
                                     factory=lambda: tiny_pipeline(cls.network), clock=cls.clock)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _logged_in(self) -> SlicerLikeClient:
        client = SlicerLikeClient(self.server.url)
        self.assertEqual(client.login("anyone", TOKEN).status, 200)
        return client

    def test_login_with_the_token_as_password(self):
        client = SlicerLikeClient(self.server.url)
        self.assertTrue(client.auth_enabled())
        refused = client.info()
        self.assertEqual(refused.status, 401)
        wrong = client.login("anyone", "not-the-token")
        self.assertEqual(wrong.status, 401)
        self.assertIn("the server's token", wrong.json()["detail"])
        self.assertFalse(client.token_valid())
        client = self._logged_in()
        self.assertTrue(client.token_valid())
        self.assertEqual(client.info().status, 200)
        self.assertEqual(client.upload_image(self.ct, "ct").status, 200)
        answer = client.infer("vista3d_clicks", "ct", {"label": "liver", "foreground": [[20, 20, 18]]})
        self.assertEqual(answer.params["label_names"], {"liver": 1})
        stranger = SlicerLikeClient(self.server.url)
        self.assertEqual(stranger.upload_image(self.ct, "ct").status, 401)

    def test_token_valid_takes_the_scheme_in_any_case(self):
        # /auth/token/valid answers as the token gate does: the scheme's name in any case (RFC 7235)
        for scheme in ("Bearer", "bearer", "BEARER"):
            client = SlicerLikeClient(self.server.url)
            client.headers["Authorization"] = f"{scheme} {TOKEN}"
            self.assertEqual(client.info().status, 200, scheme)
            self.assertTrue(client.token_valid(), scheme)
            client.headers["Authorization"] = f"{scheme} not-the-token"
            self.assertEqual(client.info().status, 401, scheme)
            self.assertFalse(client.token_valid(), scheme)

    def test_body_limit(self):
        big = self.folder / "big.nii.gz"
        big.write_bytes(bytes(300_000))
        reply = self._logged_in().upload_image(big, "big")
        self.assertEqual(reply.status, 413)
        self.assertIn("--max-body-mb", reply.json()["detail"])

    def test_uploads_expire_as_sessions_do(self):
        client = self._logged_in()
        self.assertEqual(client.upload_image(self.ct, "ct").status, 200)
        self.clock.now += 101.0  # past --session-ttl
        gone = client.infer_reply("vista3d", "ct", {"classes": "liver"})
        self.assertEqual(gone.status, 410)
        self.assertIn("expired", gone.json()["detail"])
        self.assertIn("upload it first", gone.json()["detail"])

    def test_the_queue_is_shared_with_the_nim_api(self):
        client = self._logged_in()
        self.assertEqual(client.upload_image(self.ct, "ct").status, 200)
        gate = Gate(self.network)
        self.addCleanup(gate.remove)
        click = {"label": "spleen", "foreground": [[8, 30, 10]]}
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(client.infer_reply, "vista3d_clicks", "ct", click)
            self.assertTrue(gate.entered.wait(WAIT))  # the click runs, held at the gate: the one slot is taken
            busy = client.infer_reply("vista3d", "ct", {"classes": "liver"})
            self.assertEqual(busy.status, 429)
            self.assertIn("retry-after", busy.headers)
            nim = httpx.post(f"{self.server.url}/v1/vista3d/sessions", json={"image": "ct.nii.gz"},
                             headers={"Authorization": f"Bearer {TOKEN}"})
            self.assertEqual(nim.status_code, 429)
            gate.open()
            self.assertEqual(held.result().status, 200)
        self.assertTrue(self.server.worker.wait_for(lambda w: w.held == 0, WAIT))


if __name__ == "__main__":
    unittest.main()
