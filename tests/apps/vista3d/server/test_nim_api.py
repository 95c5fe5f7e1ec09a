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
"""vista3d serve over a real socket with a client written from the NIM's documentation: each endpoint, NIM-shaped
requests, answers equal to Vista3DPipeline on the same file; uploads, --data-dir paths and NRRD beyond the NIM."""

from __future__ import annotations

import gzip
import json
import tempfile
import threading
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import nibabel as nib
import nrrd
import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.labels import everything_labels, label_names
from tests.apps.vista3d.server.harness import (
    ImageHost,
    LiveServer,
    settings,
    start_for_class,
    tiny_pipeline,
    write_phantom,
)
from tests.apps.vista3d.server.nim_client import NimClient


def _nifti_labels(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    img = nib.Nifti1Image.from_bytes(gzip.decompress(data))
    return np.asarray(img.dataobj), img.affine


def _expected(path: Path, **prompt) -> np.ndarray:
    return tiny_pipeline().segment(str(path), **prompt).labels.numpy().astype(np.uint8)


class TestNimApi(unittest.TestCase):
    """One server for the class: an image host for the URLs, a --data-dir for paths and local_working_dir."""

    @classmethod
    def setUpClass(cls):
        cls.host = ImageHost().__enter__()
        cls.ct = write_phantom(cls.host.folder / "ct.nii.gz")
        cls._data = tempfile.TemporaryDirectory()
        cls.data = Path(cls._data.name)
        write_phantom(cls.data / "local.nii.gz")
        (cls.data / "results").mkdir()
        cls.server = start_for_class(cls, settings(allow_url_hosts=("127.0.0.1",), allow_private_urls=True,
                                                   data_dir=cls.data))
        cls.client = NimClient(cls.server.url)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.host.__exit__(None, None, None)
        cls._data.cleanup()

    def test_health(self):
        self.assertEqual((self.client.live().status_code, self.client.live().json()), (200, {"status": "live"}))
        self.assertEqual((self.client.ready().status_code, self.client.ready().json()),
                         (200, {"status": "ready", "weights": "loaded"}))

    def test_info_and_license(self):
        info = self.client.info()
        self.assertEqual(info["name"], "VISTA3D")
        self.assertEqual(info["labels"]["liver"], 1)
        self.assertEqual(len(info["labels"]), len(label_names()) - 1)
        self.assertEqual(info["everything"], everything_labels())
        self.assertIn("nrrd", info["formats"])
        self.assertEqual((info["limits"]["max_points"], info["limits"]["max_queue_per_client"]), (64, 5))
        lic = self.client.http.get("/v1/license")
        self.assertEqual((lic.status_code, lic.json()["license"]), (200, "Apache-2.0"))

    @parameterized.expand([
        ("everything", None, None, {}),
        ("names", ["liver", "spleen"], None, {"classes": ["liver", "spleen"]}),
        ("ids", [1, 3], None, {"classes": [1, 3]}),
        ("click", None, {"spleen": [[25, 20, 18], [26, 20, 18]]},
         {"classes": ["spleen"], "points": [[25, 20, 18], [26, 20, 18]], "point_labels": [1, 1]}),
        ("click_with_class", ["spleen"], {"spleen": [[25, 20, 18]]},
         {"classes": ["spleen"], "points": [[25, 20, 18]], "point_labels": [1]}),
    ])
    def test_inference_equals_pipeline(self, _, classes, points, prompt):
        response = self.client.inference(self.host.url("ct.nii.gz"), classes=classes, points=points)
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(response.headers["content-type"], "application/zip")
        files = NimClient.unzip(response)
        self.assertEqual(list(files), ["ct_trans.nii.gz"])
        labels, affine = _nifti_labels(files["ct_trans.nii.gz"])
        np.testing.assert_array_equal(labels, _expected(self.ct, **prompt))
        np.testing.assert_allclose(affine, nib.load(str(self.ct)).affine)
        stages = [part.split(";dur=")[0] for part in response.headers["server-timing"].split(", ")]
        self.assertEqual((stages[0], stages[-1]), ("check", "write"))  # the server's time from the check to the answer
        self.assertIn("inference", stages)

    def test_data_dir_path_and_local_working_dir(self):
        response = self.client.inference("local.nii.gz", classes=["liver"], local_working_dir="results")
        self.assertEqual(response.status_code, 200, response.text)
        written = Path(response.json()["output"])
        self.assertEqual(written, self.data / "results" / "local_trans.nii.gz")
        np.testing.assert_array_equal(np.asarray(nib.load(str(written)).dataobj),
                                      _expected(self.data / "local.nii.gz", classes=["liver"]))
        # an absolute path inside --data-dir is the same file
        again = self.client.inference(str(self.data / "local.nii.gz"), classes=["liver"])
        self.assertEqual(again.status_code, 200, again.text)

    def test_same_named_uploads_get_their_own_outputs(self):
        # two clients upload different images both named scan.nii.gz into one local_working_dir at the same time:
        # each answer names its own file, holding its own image's label map; a rerun adds a file, overwriting none
        (self.data / "shared").mkdir()
        images = {"a": write_phantom(Path(self._data.name) / "a.nii.gz"),
                  "b": write_phantom(Path(self._data.name) / "b.nii.gz", spacing=(1.3, 1.3, 1.3))}

        def upload(key: str) -> httpx.Response:
            files = {"image": ("scan.nii.gz", images[key].read_bytes(), "application/gzip")}
            form = {"prompts": json.dumps({"classes": ["liver"]}), "local_working_dir": "shared"}
            with NimClient(self.server.url) as client:
                return client.http.post("/v1/vista3d/inference", files=files, data=form)

        with ThreadPoolExecutor(2) as pool:
            answers = dict(zip("ab", pool.map(upload, "ab")))
        outputs = {k: Path(r.json()["output"]) for k, r in answers.items()}
        self.assertEqual(sorted(p.name for p in outputs.values()), ["scan_trans-2.nii.gz", "scan_trans.nii.gz"])
        for key, path in outputs.items():
            np.testing.assert_array_equal(np.asarray(nib.load(str(path)).dataobj),
                                          _expected(images[key], classes=["liver"]))
        before = {p: p.read_bytes() for p in outputs.values()}
        rerun = Path(upload("a").json()["output"])
        self.assertEqual(rerun.name, "scan_trans-3.nii.gz")
        self.assertEqual({p: p.read_bytes() for p in outputs.values()}, before)
        self.assertEqual(sorted(p.name for p in (self.data / "shared").iterdir()),
                         ["scan_trans-2.nii.gz", "scan_trans-3.nii.gz", "scan_trans.nii.gz"])  # no temporary left

    def test_upload_and_raw_answer(self):
        files = {"image": ("upload.nii.gz", self.ct.read_bytes(), "application/gzip")}
        form = {"prompts": json.dumps({"classes": ["spleen"]})}
        response = self.client.http.post("/v1/vista3d/inference", files=files, data=form,
                                         headers={"Accept": "application/gzip"})
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(response.headers["content-type"], "application/gzip")
        self.assertIn("upload_trans.nii.gz", response.headers["content-disposition"])
        labels, _ = _nifti_labels(response.content)
        np.testing.assert_array_equal(labels, _expected(self.ct, classes=["spleen"]))

    def test_same_host_redirect_is_followed(self):
        response = self.client.inference(self.host.url("ct.nii.gz", via="to/"), classes=["liver"])
        self.assertEqual(response.status_code, 200, response.text)

    def test_nrrd_in_nrrd_out(self):
        img = nib.load(str(self.ct))
        ras_to_lps = np.diag([-1.0, -1.0, 1.0])
        header = {"space": "left-posterior-superior", "space directions": (ras_to_lps @ img.affine[:3, :3]).T,
                  "space origin": ras_to_lps @ img.affine[:3, 3], "kinds": ["domain"] * 3, "encoding": "gzip"}
        path = self.host.folder / "ct.nrrd"
        nrrd.write(str(path), np.asarray(img.dataobj), header, index_order="F")
        response = self.client.inference(self.host.url("ct.nrrd"), classes=["liver", "spleen"])
        self.assertEqual(response.status_code, 200, response.text)
        files = NimClient.unzip(response)
        self.assertEqual(list(files), ["ct_trans.nrrd"])
        with tempfile.NamedTemporaryFile(suffix=".nrrd") as f:
            f.write(files["ct_trans.nrrd"])
            f.flush()
            labels, out_header = nrrd.read(f.name, index_order="F")
        np.testing.assert_array_equal(labels, _expected(self.ct, classes=["liver", "spleen"]))
        self.assertEqual(out_header["space"], "left-posterior-superior")
        np.testing.assert_allclose(out_header["space directions"], header["space directions"])
        np.testing.assert_allclose(out_header["space origin"], header["space origin"])


    def test_output_options_of_nim_clients(self):
        # NIM clients send "output": its extension and dtype are honoured, keys this server does not use are
        # accepted and named back in X-Vista3D-Note
        body = {"image": self.host.url("ct.nii.gz"), "prompts": {"classes": ["liver"]},
                "output": {"extension": ".nrrd", "dtype": "int16", "colormap": "x"}}
        response = self.client.http.post("/v1/vista3d/inference", json=body)
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(response.headers["x-vista3d-note"], "ignored: output.colormap")
        files = NimClient.unzip(response)
        self.assertEqual(list(files), ["ct_trans.nrrd"])
        with tempfile.NamedTemporaryFile(suffix=".nrrd") as f:
            f.write(files["ct_trans.nrrd"])
            f.flush()
            labels, header = nrrd.read(f.name, index_order="F")
        self.assertEqual(labels.dtype, np.int16)
        np.testing.assert_array_equal(labels, _expected(self.ct, classes=["liver"]))
        affine = nib.load(str(self.ct)).affine  # the NIfTI grid in LPS, as ITK and 3D Slicer place NRRD files
        lps = np.diag([-1.0, -1.0, 1.0])
        self.assertEqual(header["space"], "left-posterior-superior")
        np.testing.assert_allclose(header["space directions"], (lps @ affine[:3, :3]).T)
        np.testing.assert_allclose(header["space origin"], lps @ affine[:3, 3])
        # and the other way: NRRD in, NIfTI out, in the same place in the world
        img = nib.load(str(self.ct))
        nrrd.write(str(self.host.folder / "lps.nrrd"), np.asarray(img.dataobj), {
            "space": "left-posterior-superior", "space directions": (lps @ img.affine[:3, :3]).T,
            "space origin": lps @ img.affine[:3, 3], "kinds": ["domain"] * 3}, index_order="F")
        body = {"image": self.host.url("lps.nrrd"), "prompts": {"classes": ["liver"]},
                "output": {"extension": ".nii.gz"}}
        response = self.client.http.post("/v1/vista3d/inference", json=body)
        self.assertEqual(response.status_code, 200, response.text)
        self.assertNotIn("x-vista3d-note", response.headers)
        labels, affine = _nifti_labels(NimClient.unzip(response)["lps_trans.nii.gz"])
        np.testing.assert_array_equal(labels, _expected(self.ct, classes=["liver"]))
        np.testing.assert_allclose(affine, img.affine)


class TestReadiness(unittest.TestCase):
    def test_not_ready_until_loaded_and_warmed(self):
        release, warmed = threading.Event(), []

        def factory():
            if not release.wait(timeout=60):
                raise RuntimeError("never released")
            pipe = tiny_pipeline()
            warm_up = pipe.warm_up
            pipe.warm_up = lambda *a: (warmed.append(a), warm_up(*a))
            return pipe

        with LiveServer(factory=factory) as server, NimClient(server.url) as client:
            self.assertEqual(client.live().status_code, 200)
            for response in (client.ready(), client.inference("http://127.0.0.1/ct.nii.gz"),
                             client.http.post("/v1/vista3d/sessions", json={"image": "x"})):
                self.assertEqual(response.status_code, 503)
                self.assertEqual(response.headers["retry-after"], "5")
                self.assertIn("still loading", response.json()["detail"])
            self.assertEqual(client.info()["model"]["state"], "loading")
            release.set()
            server.wait_ready()
            self.assertEqual(len(warmed), 1)  # ready only after the warm-up forward
            self.assertEqual(client.ready().json()["status"], "ready")

    def test_failed_load_is_reported(self):
        def factory():
            raise ValueError("bad checkpoint: missing keys")

        with LiveServer(factory=factory) as server:
            server.worker.wait_for(lambda w: w.state != "loading", 60)
            with httpx.Client(base_url=server.url) as client:
                response = client.get("/v1/health/ready")
                self.assertEqual(response.status_code, 503)
                self.assertEqual(response.json()["status"], "failed")
                self.assertIn("bad checkpoint: missing keys", response.json()["detail"])
                self.assertNotIn("retry-after", response.headers)


if __name__ == "__main__":
    unittest.main()
