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
"""A .nii.gz served by ``python -m http.server`` on this machine and fetched by URL, as a user tries it.

The tester's 403 ``WrapStructError('Binary block is wrong size')``: the server refused the loopback address (403, its
one-line JSON answer), and the client read that answer as a NIfTI file. The refusal is the URL policy (a loopback
or private address needs ``--allow-private-urls``); its first answer named only ``--allow-url-host``, so following it
led to a second 403. Each refusal now names every flag the URL needs, and with them the file is segmented.
"""

from __future__ import annotations

import gzip
import io
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile
from pathlib import Path

import httpx
import nibabel as nib
import numpy as np

from tests.apps.vista3d.server.harness import LiveServer, settings, tiny_pipeline, write_phantom

LIVER = {"prompts": {"classes": ["liver"]}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TestFetchFromThisMachine(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls._tmp.cleanup)
        cls.folder = Path(cls._tmp.name)
        cls.ct = write_phantom(cls.folder / "ct.nii.gz", shape=(24, 24, 24))
        cls.port = _free_port()
        cls.files = subprocess.Popen([sys.executable, "-m", "http.server", str(cls.port), "--bind", "127.0.0.1",
                                      "--directory", str(cls.folder)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        cls.addClassCleanup(cls.files.wait, 30)
        cls.addClassCleanup(cls.files.terminate)
        for _ in range(200):  # until it listens
            try:
                httpx.head(f"http://127.0.0.1:{cls.port}/ct.nii.gz").raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.05)

    def _post(self, server: LiveServer, host: str) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            return http.post("/v1/vista3d/inference", json={"image": f"http://{host}:{self.port}/ct.nii.gz", **LIVER})

    def test_the_advice_of_each_refusal_works(self):
        for host in ("127.0.0.1", "localhost"):
            with LiveServer(settings()) as server:
                server.wait_ready()
                refused = self._post(server, host)
            self.assertEqual(refused.status_code, 403, refused.text)
            self.assertEqual(refused.headers["content-type"], "application/json")  # not an image to read
            detail = refused.json()["detail"]
            self.assertIn(f"--allow-url-host {host} --allow-private-urls", detail)
            with LiveServer(settings(allow_url_hosts=(host,))) as server:  # half the advice: refused again
                server.wait_ready()
                again = self._post(server, host)
            self.assertEqual(again.status_code, 403, again.text)
            self.assertIn("--allow-private-urls", again.json()["detail"])
            with LiveServer(settings(allow_url_hosts=(host,), allow_private_urls=True)) as server:
                server.wait_ready()
                answer = self._post(server, host)
            self.assertEqual(answer.status_code, 200, answer.text)
            with zipfile.ZipFile(io.BytesIO(answer.content)) as z:
                (name,) = z.namelist()
                self.assertEqual(name, "ct_trans.nii.gz")
                labels = nib.Nifti1Image.from_bytes(gzip.decompress(z.read(name)))
            expected = tiny_pipeline().segment(str(self.ct), classes="liver").labels.numpy()
            np.testing.assert_array_equal(np.asarray(labels.dataobj), expected.astype(np.uint8))
            np.testing.assert_array_equal(labels.affine, nib.load(self.ct).affine)

    def test_public_hosts_are_not_told_to_allow_private_ones(self):
        with LiveServer(settings(allow_url_hosts=("images.example.org",))) as server:
            server.wait_ready()
            with httpx.Client(base_url=server.url, timeout=120) as http:
                refused = http.post("/v1/vista3d/inference", json={"image": "https://data.example.org/ct.nii.gz"})
        self.assertEqual(refused.status_code, 403)
        self.assertIn("--allow-url-host data.example.org (allowed now", refused.json()["detail"])
        self.assertNotIn("--allow-private-urls", refused.json()["detail"])


if __name__ == "__main__":
    unittest.main()
