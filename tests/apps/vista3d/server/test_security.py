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
"""Bad requests over a real socket: each gets a 4xx with one JSON line saying what is wrong, and the next good
request is still answered. The URL rules (allow-list, private addresses, redirects, file://), the --data-dir
confinement (.., symlinks out), the size limits (body, download, voxels, gzip bombs) and the bearer token."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import tempfile
import unittest
import zlib
from pathlib import Path
from unittest import mock

import httpx
import nibabel as nib
import numpy as np
from parameterized import parameterized

from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import (
    ImageHost,
    LiveServer,
    settings,
    start_for_class,
    write_phantom,
)


def _nifti_header(shape, dtype=np.int16) -> bytes:
    hdr = nib.Nifti1Header()
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(dtype)
    hdr.set_qform(np.eye(4), code=1)
    hdr["vox_offset"] = 352
    return hdr.binaryblock + b"\x00" * 4


def _bomb(zeros: int) -> bytes:
    """A .nii.gz whose header says 40 x 40 x 36 int16 and whose gzip stream inflates to ``zeros`` more bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(_nifti_header((40, 40, 36)))]
    block = b"\x00" * (1 << 20)
    for _ in range(zeros >> 20):
        out.append(c.compress(block))
    return b"".join(out) + c.flush()


def _files(folder: Path, outside: Path) -> None:
    write_phantom(folder / "ct.nii.gz")
    (folder / "notes.txt").write_text("not an image")
    (folder / "scan.dcm").write_bytes(b"\x00" * 128 + b"DICM" + b"\x00" * 300)
    (folder / "big.nii.gz").write_bytes(gzip.compress(_nifti_header((50, 50, 50)) + b"\x00" * 250_000))
    (folder / "bomb.nii.gz").write_bytes(_bomb(64 << 20))
    (folder / "corrupt.nii.gz").write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(4000))
    (folder / "truncated.nii").write_bytes(_nifti_header((40, 40, 36)) + b"\x00" * 1000)
    empty = nib.Nifti1Image(np.full((40, 40, 36), -1000, np.int16), np.eye(4))
    nib.save(empty, str(folder / "air.nii.gz"))
    (folder / "detached.nrrd").write_bytes(b"NRRD0004\ntype: short\ndimension: 3\nsizes: 4 4 4\nencoding: raw\n"
                                           b"data file: /etc/passwd\n\n")
    (folder / "ascii.nrrd").write_bytes(b"NRRD0004\ntype: short\ndimension: 3\nsizes: 1 1 2\nencoding: ascii\n\n1 2\n")
    (folder / "flat.nrrd").write_bytes(b"NRRD0004\ntype: short\ndimension: 2\nsizes: 2 2\nencoding: raw\n\n"
                                       + b"\0" * 8)
    (folder / "series").mkdir()
    (outside / "secret.nii.gz").write_bytes((folder / "ct.nii.gz").read_bytes())
    (folder / "link.nii.gz").symlink_to(outside / "secret.nii.gz")
    (folder / "out_link").symlink_to(outside, target_is_directory=True)


LIVER = {"prompts": {"classes": ["liver"]}}


def _read_response(reader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length from a socket's reader: ``(status, headers, body)``."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline().strip()):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader.read(int(headers["content-length"]))


def _post(body) -> dict:
    return {"json": body}


# (name, how to send it (keyword arguments of httpx's post, or a method/path pair), the status expected)
BAD_REQUESTS = [
    ("not_json", {"content": b"{image:", "headers": {"Content-Type": "application/json"}}, 400),
    ("empty_body", {"content": b"", "headers": {"Content-Type": "application/json"}}, 400),
    ("not_an_object", _post(["ct.nii.gz"]), 422),
    ("unknown_field", _post({"image": "ct.nii.gz", "prompt": {}}), 422),
    ("no_image", _post({"prompts": {"classes": ["liver"]}}), 422),
    ("wrong_content_type", {"content": b"x", "headers": {"Content-Type": "text/plain"}}, 415),
    ("unknown_class", _post({"image": "ct.nii.gz", "prompts": {"classes": ["livr"]}}), 422),
    ("class_out_of_range", _post({"image": "ct.nii.gz", "prompts": {"classes": [999]}}), 422),
    ("two_clicked_objects", _post({"image": "ct.nii.gz", "prompts": {"points": {"liver": [[1, 2, 3]],
                                                                                "spleen": [[4, 5, 6]]}}}), 422),
    ("classes_beside_clicks", _post({"image": "ct.nii.gz", "prompts": {"classes": ["liver", "spleen"],
                                                                        "points": {"spleen": [[20, 20, 18]]}}}), 422),
    ("bad_point_label", _post({"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[20, 20, 18]]},
                                                                  "point_labels": {"spleen": [2]}}}), 422),
    ("two_coordinates", _post({"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[20, 20]]}}}), 422),
    ("file_url", _post({"image": "file:///etc/passwd"}), 403),
    ("ftp_url", _post({"image": "ftp://127.0.0.1/ct.nii.gz"}), 422),
    ("host_not_allowed", _post({"image": "http://localhost:{port}/ct.nii.gz"}), 403),
    ("credentials_in_url", _post({"image": "http://user:pw@127.0.0.1:{port}/ct.nii.gz"}), 422),
    ("url_not_found", _post({"image": "http://127.0.0.1:{port}/missing.nii.gz"}), 422),
    ("redirect_elsewhere", _post({"image": "http://127.0.0.1:{port}/away/ct.nii.gz"}), 403),
    ("download_too_large", _post({"image": "http://127.0.0.1:{port}/large.bin"}), 413),
    ("download_too_large_unsized", _post({"image": "http://127.0.0.1:{port}/unsized/large.bin"}), 413),
    ("dot_dot", _post({"image": "../outside/secret.nii.gz"}), 403),
    ("absolute_outside", _post({"image": "{outside}/secret.nii.gz"}), 403),
    ("symlink_out", _post({"image": "link.nii.gz"}), 403),
    ("no_such_file", _post({"image": "nothing.nii.gz"}), 422),
    ("a_folder", _post({"image": "series"}), 415),
    ("working_dir_outside", _post({"image": "ct.nii.gz", "local_working_dir": "{outside}"}), 403),
    ("working_dir_symlink_out", _post({"image": "ct.nii.gz", "local_working_dir": "out_link"}), 403),
    ("working_dir_dot_dot", _post({"image": "ct.nii.gz", "local_working_dir": "series/../../outside"}), 403),
    ("working_dir_missing", _post({"image": "ct.nii.gz", "local_working_dir": "nowhere"}), 422),
    ("not_an_image", _post({"image": "notes.txt"}), 415),
    ("dicom", _post({"image": "scan.dcm"}), 415),
    ("too_many_voxels", _post({"image": "big.nii.gz"}), 413),
    ("gzip_bomb", _post({"image": "http://127.0.0.1:{port}/bomb.nii.gz"}), 413),
    ("corrupt_gzip", _post({"image": "corrupt.nii.gz"}), 422),
    ("truncated", _post({"image": "truncated.nii"}), 422),
    ("nothing_but_air", _post({"image": "air.nii.gz"}), 422),
    ("nrrd_detached_data", _post({"image": "detached.nrrd"}), 415),
    ("nrrd_ascii", _post({"image": "ascii.nrrd"}), 415),
    ("nrrd_2d", _post({"image": "flat.nrrd"}), 422),
    ("huge_point_label", _post({"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[20, 20, 18]]},
                                                                   "point_labels": {"spleen": [10**30]}}}), 422),
    ("huge_coordinate", _post({"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[10**400, 20, 18]]}}}), 422),
    ("nan_coordinate", {"content": b'{"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[NaN, 20, 18]]}}}',
                        "headers": {"Content-Type": "application/json"}}, 400),
    ("deep_nesting", {"content": b'{"image": "ct.nii.gz", "prompts": ' + b"[" * 1000 + b"]" * 1000 + b"}",
                      "headers": {"Content-Type": "application/json"}}, 422),
    ("true_as_class", _post({"image": "ct.nii.gz", "prompts": {"classes": [True]}}), 422),
    ("true_as_point_label", _post({"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[20, 20, 18]]},
                                                                      "point_labels": {"spleen": [True]}}}), 422),
    ("string_as_coordinate", _post({"image": "ct.nii.gz", "prompts": {"points": {"spleen": [["20", 20, 18]]}}}), 422),
    ("too_many_points", _post({"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[20, 20, 18]] * 5}}}), 413),
    ("too_many_classes", _post({"image": "ct.nii.gz", "prompts": {"classes": [1, 3, 4, 5, 6, 7]}}), 413),
    ("unknown_output_format", _post({"image": "ct.nii.gz", "output": {"extension": ".png"}}), 422),
    ("form_deep_prompts", {"files": {"image": ("ct.nii.gz", b"x")}, "data": {"prompts": "[" * 100 + "]" * 100}},
     422),
    ("upload_truncated", {"files": {"image": ("t.nii", _nifti_header((40, 40, 36)) + b"\x00" * 1000)}}, 422),
    ("form_without_image", {"data": {"prompts": "{}"}, "files": {"other": ("x", b"x")}}, 422),
    ("form_unknown_field", {"files": {"image": ("ct.nii.gz", b"x")}, "data": {"colour": "red"}}, 422),
    ("form_bad_prompts", {"files": {"image": ("ct.nii.gz", b"x")}, "data": {"prompts": "{classes"}}, 400),
    ("wrong_method", ("GET", "/v1/vista3d/inference"), 405),
    ("no_such_endpoint", ("GET", "/v1/vista3d/nothing"), 404),
    ("no_such_session", ("POST", "/v1/vista3d/sessions/abc/clicks"), 404),
    ("session_bad_image", ("POST", "/v1/vista3d/sessions", {"image": "notes.txt"}), 415),
]


class TestBadRequests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        root = Path(cls._tmp.name)
        cls.data, cls.outside = root / "data", root / "outside"
        cls.data.mkdir()
        cls.outside.mkdir()
        _files(cls.data, cls.outside)
        cls.host = ImageHost().__enter__()
        write_phantom(cls.host.folder / "ct.nii.gz")
        write_phantom(cls.host.folder / "small.nii.gz", shape=(24, 24, 24))  # the good request: a few windows
        (cls.host.folder / "large.bin").write_bytes(b"\x00" * (3 << 20))
        (cls.host.folder / "bomb.nii.gz").write_bytes(_bomb(64 << 20))
        limits = Limits(max_body_bytes=1 << 20, max_download_bytes=2 << 20, max_voxels=100_000,
                        request_timeout=120.0, max_points=4, max_classes=5)
        cls.server = start_for_class(cls, settings(data_dir=cls.data, allow_url_hosts=("127.0.0.1",),
                                                   allow_private_urls=True, limits=limits))
        cls.http = httpx.Client(base_url=cls.server.url, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.http.close()
        cls.host.__exit__(None, None, None)
        cls._tmp.cleanup()

    def _fill(self, value):
        if isinstance(value, str):
            return value.replace("{port}", str(self.host.port)).replace("{outside}", str(self.outside))
        if isinstance(value, dict):
            return {k: self._fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._fill(v) for v in value]
        return value

    def _good(self) -> None:
        response = self.http.post("/v1/vista3d/inference", json={"image": self.host.url("small.nii.gz"),
                                                                 "prompts": {"classes": ["liver"]}})
        self.assertEqual(response.status_code, 200, response.text)

    def assert_one_line_error(self, response: httpx.Response, status: int) -> None:
        self.assertEqual(response.status_code, status, response.text)
        self.assertEqual(response.headers["content-type"], "application/json")
        detail = response.json()["detail"]
        self.assertIsInstance(detail, str)
        self.assertTrue(detail and "\n" not in detail and "Traceback" not in detail, detail)
        for path in (str(self.data), str(self.server.state.work_dir)):  # the server's own folders are not named
            self.assertNotIn(path, detail)

    @parameterized.expand(BAD_REQUESTS)
    def test_bad_request_then_good(self, _, how, status):
        if isinstance(how, tuple):
            method, path, *body = how
            response = self.http.request(method, path, json=body[0] if body else None)
        else:
            response = self.http.post("/v1/vista3d/inference", **self._fill(how))
        self.assert_one_line_error(response, status)
        self._good()

    def test_points_and_classes_at_the_limit_and_past_it(self):
        at = {"image": "ct.nii.gz", "prompts": {"points": {"spleen": [[20, 20, 18], [21, 20, 18], [22, 20, 18],
                                                                     [20, 21, 18]]}}}
        self.assertEqual(self.http.post("/v1/vista3d/inference", json=at).status_code, 200)
        at["prompts"]["points"]["spleen"].append([20, 22, 18])
        past = self.http.post("/v1/vista3d/inference", json=at)
        self.assert_one_line_error(past, 413)
        self.assertIn("5 points", past.json()["detail"])
        self.assertIn("--max-points 4", past.json()["detail"])
        classes = {"image": "ct.nii.gz", "prompts": {"classes": [1, 3, 4, 5, 6]}}
        self.assertEqual(self.http.post("/v1/vista3d/inference", json=classes).status_code, 200)
        classes["prompts"]["classes"].append(7)
        past = self.http.post("/v1/vista3d/inference", json=classes)
        self.assert_one_line_error(past, 413)
        self.assertIn("--max-classes 5", past.json()["detail"])

    @parameterized.expand([
        ("huge_int", b'{"image": "ct.nii.gz", "prompts": {"point_labels": {"liver": [100000000000000000000000]}}}'),
        ("deep", b'{"image": ' + b"[" * 2000 + b"]" * 2000 + b"}"),
        ("true_class", b'{"image": "ct.nii.gz", "prompts": {"classes": [true]}}'),
        ("internal_error", b'{"image": "ct.nii.gz"}'),
    ])
    def test_connection_stays_usable_after_an_error(self, name, body):
        # the error and then a good request on the same connection: the server answers both, closing nothing
        from monai.apps.vista3d.server import routes

        boom = mock.patch.object(routes, "nim_prompt", side_effect=RuntimeError("a bug"))
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=60) as sock, \
                (boom if name == "internal_error" else contextlib.nullcontext()):
            reader = sock.makefile("rb")
            sock.sendall(b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            status, headers, answer = _read_response(reader)
            self.assertEqual(status, 500 if name == "internal_error" else 422, answer)
            self.assertNotEqual(headers.get("connection"), "close")
            self.assertNotIn(b"a bug", answer)  # an internal error says only its type
            sock.sendall(b"GET /v1/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, answer = _read_response(reader)
            self.assertEqual((status, json.loads(answer)), (200, {"status": "live"}))

    def test_body_over_the_limit_by_its_length(self):
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=60) as sock:
            sock.sendall(b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 99999999999\r\n\r\n")
            chunks = []
            while chunk := sock.recv(65536):  # the answer may come in several segments; the server then closes
                chunks.append(chunk)
            head = b"".join(chunks).decode()
        self.assertTrue(head.startswith("HTTP/1.1 413"), head)
        self.assertIn("--max-body-mb", head)
        self._good()

    def test_image_larger_than_memory(self):
        # the header's volume, resampled, against the memory there (as segment_file checks it): 413 before the load,
        # the message without the server's scratch path
        with mock.patch("monai.apps.vista3d.core.feasibility.memory_available", return_value=1 << 10):
            response = self.http.post("/v1/vista3d/inference", json={"image": "ct.nii.gz"})
        self.assert_one_line_error(response, 413)
        self.assertIn("the image: segmenting it needs at least", response.json()["detail"])
        self.assertNotIn("vista3d-serve-", response.json()["detail"])
        self._good()

    def test_malformed_http_and_long_paths(self):
        # a request the HTTP parser cannot read never reaches the app: the protocol answers it, in the same JSON
        # form as every other error (also a chunked body that breaks once its headers have reached the app); a long
        # unknown path gets the app's 404 without the path echoed in full
        for raw in (b"GARBAGE\r\n\r\n", b"GET /v1/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                    b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=60) as sock:
                sock.sendall(raw)
                answer = b""
                while chunk := sock.recv(65536):  # the server closes the connection after its answer
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"HTTP/1.1 400"), head)
            self.assertIn(b"content-type: application/json", head.lower())
            detail = json.loads(body)["detail"]
            self.assertIn("not valid HTTP/1.1", detail)
            self.assertNotIn("\n", detail)
        response = self.http.get("/v1/" + "a" * 50_000)
        self.assert_one_line_error(response, 404)
        self.assertLess(len(response.json()["detail"]), 400)
        self._good()

    def test_body_over_the_limit_as_it_streams(self):
        # no Content-Length (chunked): the limit is counted as the body arrives
        boundary = "b0undary"

        def chunks():
            yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"ct.nii.gz\"\r\n"
                   "Content-Type: application/gzip\r\n\r\n").encode()
            for _ in range(3):
                yield b"\x00" * (1 << 19)
            yield f"\r\n--{boundary}--\r\n".encode()

        response = self.http.post("/v1/vista3d/inference", content=chunks(),
                                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        self.assert_one_line_error(response, 413)
        self.assertIn("--max-body-mb", response.json()["detail"])
        self._good()

    @parameterized.expand([["url"], ["upload"]])
    def test_bomb_is_refused_without_inflating_it(self, how):
        # the refusal comes from the counted inflate, which stops one MiB past what the header describes: the
        # 64 MiB of zeros are never produced (the limit the message names is the header's size)
        if how == "url":
            response = self.http.post("/v1/vista3d/inference",
                                      json={"image": self.host.url("bomb.nii.gz")})
        else:
            bomb = (self.host.folder / "bomb.nii.gz").read_bytes()
            response = self.http.post("/v1/vista3d/inference", files={"image": ("bomb.nii.gz", bomb)})
        self.assert_one_line_error(response, 413)
        self.assertIn(f"{352 + 40 * 40 * 36 * 2} bytes", response.json()["detail"])
        self._good()

    def test_only_client_bytes_are_counted(self):
        # the operator's files under --data-dir are read once by the load; what a client sends is counted first
        from monai.apps.vista3d.server import call

        small = (self.host.folder / "small.nii.gz").read_bytes()
        with mock.patch.object(call, "check_inflated_size", wraps=call.check_inflated_size) as counted:
            (self.data / "small.nii.gz").write_bytes(small)
            served = self.http.post("/v1/vista3d/inference", json={"image": "small.nii.gz", **LIVER})
            self.assertEqual(served.status_code, 200)
            self.assertEqual(counted.call_count, 0)
            upload = self.http.post("/v1/vista3d/inference", data={"prompts": json.dumps(LIVER["prompts"])},
                                    files={"image": ("small.nii.gz", small)})
            self.assertEqual(upload.status_code, 200)
            self.assertEqual(counted.call_count, 1)


class TestUrlAddresses(unittest.TestCase):
    def test_private_addresses_refused_unless_allowed(self):
        with ImageHost() as host:
            ct = write_phantom(host.folder / "ct.nii.gz", shape=(24, 24, 24))
            with LiveServer(settings(allow_url_hosts=("127.0.0.1", "localhost"))) as server:
                server.wait_ready()
                with httpx.Client(base_url=server.url, timeout=120) as http:
                    for name in ("127.0.0.1", "localhost"):
                        response = http.post("/v1/vista3d/inference",
                                             json={"image": f"http://{name}:{host.port}/ct.nii.gz"})
                        self.assertEqual(response.status_code, 403, response.text)
                        self.assertIn("--allow-private-urls", response.json()["detail"])
                    upload = http.post("/v1/vista3d/inference", files={"image": ("ct.nii.gz", ct.read_bytes())})
                    self.assertEqual(upload.status_code, 200, upload.text)

    def test_urls_off_without_an_allow_list(self):
        with LiveServer(settings()) as server:
            server.wait_ready()
            with httpx.Client(base_url=server.url) as http:
                response = http.post("/v1/vista3d/inference", json={"image": "https://example.org/ct.nii.gz"})
                self.assertEqual(response.status_code, 403)
                self.assertIn("--allow-url-host example.org", response.json()["detail"])
                response = http.post("/v1/vista3d/inference", json={"image": "ct.nii.gz"})
                self.assertEqual(response.status_code, 403)
                self.assertIn("--data-dir", response.json()["detail"])
                with tempfile.TemporaryDirectory() as tmp:
                    ct = write_phantom(Path(tmp) / "ct.nii.gz", shape=(24, 24, 24))
                    upload = http.post("/v1/vista3d/inference", files={"image": ("ct.nii.gz", ct.read_bytes())})
                self.assertEqual(upload.status_code, 200, upload.text)


class TestToken(unittest.TestCase):
    def test_bearer_token(self):
        token = "t0ken-for-the-tests-only"
        with LiveServer(settings(token=token)) as server:
            server.wait_ready()
            with httpx.Client(base_url=server.url) as http:
                self.assertEqual(http.get("/v1/health/ready").status_code, 200)  # probes need no token
                self.assertEqual(http.get("/v1/health/live").status_code, 200)
                for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme's name in any case (RFC 7235)
                    ok = http.get("/v1/vista3d/info", headers={"Authorization": f"{scheme} {token}"})
                    self.assertEqual(ok.status_code, 200, scheme)
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
                    response = http.get("/v1/vista3d/info", headers=headers)
                    self.assertEqual(response.status_code, 401)
                    self.assertEqual(response.headers["www-authenticate"], "Bearer")
                    self.assertIn("Authorization: Bearer", response.json()["detail"])
                ok = http.get("/v1/vista3d/info", headers={"Authorization": f"Bearer {token}"})
                self.assertEqual(ok.status_code, 200)
                refused = http.post("/v1/vista3d/inference", json={"image": "x"})
                self.assertEqual(refused.status_code, 401)


if __name__ == "__main__":
    unittest.main()
