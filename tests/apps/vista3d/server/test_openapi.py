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
"""The server's own OpenAPI schema describes every request body (the NIM's JSON and upload forms, and MONAI Label's
multipart forms and login), and schemathesis, driven by that schema over a real socket, gets no 5xx on any
operation: a bounded number of generated requests per operation, bodies that fit the schema and bodies that break
it, each answer a 2xx or a 4xx with one JSON line."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.configuration import set_hypothesis_home_dir
from parameterized import parameterized
from schemathesis import GenerationMode

from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import settings, start_for_class, write_phantom
from tests.apps.vista3d.server.monailabel_client import SlicerLikeClient

#: generated requests per operation and mode (every operation; those with a body also get bodies that break the
#: schema): about a minute on 2 cores for all of them
EXAMPLES = 40
_METHODS = ("get", "put", "post", "delete", "patch")
_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")
TOKEN = "a-token-of-twenty-characters"  # so that the login form is read too


class TestOpenApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        data = Path(cls._tmp.name) / "data"
        data.mkdir()
        # hypothesis keeps caches in ./.hypothesis: here, in the test's own folder, removed after it
        set_hypothesis_home_dir(Path(cls._tmp.name) / "hypothesis")
        cls.addClassCleanup(set_hypothesis_home_dir, None)
        write_phantom(data / "ct.nii.gz", shape=(24, 24, 24))
        # small limits bound whatever a generated request may ask of the model
        limits = Limits(request_timeout=60.0, max_points=2, max_classes=2, max_voxels=20_000, queue_size=2)
        cls.server = start_for_class(cls, settings(data_dir=data, limits=limits, token=TOKEN))
        cls.headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=cls.server.url, headers=cls.headers) as http:
            cls.document = http.get("/openapi.json").json()
        # the image the schema's /infer/ examples name, uploaded as 3D Slicer does (no client id: the examples' own)
        slicer = SlicerLikeClient(cls.server.url, client_id="")
        slicer.headers.update(cls.headers)
        assert slicer.upload_image(data / "ct.nii.gz", "CTChest").status == 200

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _operations(self) -> dict[tuple[str, str], dict]:
        return {(method.upper(), path): op for path, ops in self.document["paths"].items()
                for method, op in ops.items() if method in _METHODS}

    def test_every_request_body_is_described(self):
        with_body = {key: op for key, op in self._operations().items() if key[0] in ("POST", "PUT")}
        self.assertLessEqual({("POST", "/v1/vista3d/inference"), ("POST", "/infer/{model}"), ("PUT", "/datastore/"),
                              ("PUT", "/session/"), ("POST", "/auth/token")}, set(with_body))
        for (method, path), op in with_body.items():
            content = op.get("requestBody", {}).get("content", {})
            self.assertTrue(content, f"{method} {path}: no request body described")
            for media, body in content.items():
                schema = body["schema"]
                self.assertEqual(schema.get("type"), "object", f"{method} {path} {media}")
                if media in _FORMS or media == "application/json" and path.startswith("/v1/"):
                    self.assertTrue(schema.get("properties"), f"{method} {path} {media}: no fields")
                    self.assertLessEqual(set(schema.get("required", ())), set(schema["properties"]), path)
        nim = with_body[("POST", "/v1/vista3d/inference")]["requestBody"]["content"]
        self.assertEqual(set(nim["application/json"]["schema"]["properties"]),
                         {"image", "prompts", "local_working_dir", "output", "statistics"})
        self.assertEqual(nim["multipart/form-data"]["schema"]["properties"]["image"]["format"], "binary")

    @parameterized.expand([
        # MONAI Label's forms as its server defines them: a 'params' JSON string beside the file's part
        ("POST", "/infer/{model}", "multipart/form-data", {"params": "string", "file": "binary"}, set()),
        ("PUT", "/datastore/", "multipart/form-data", {"params": "string", "file": "binary"}, {"file"}),
        ("PUT", "/datastore/image", "multipart/form-data", {"params": "string", "file": "binary"}, {"file"}),
        ("PUT", "/session/", "multipart/form-data", {"client_id": "string", "files": "binary"}, {"files"}),
        ("POST", "/auth/token", "application/x-www-form-urlencoded",
         {"username": "string", "password": "string", "grant_type": "string"}, {"password"}),
    ])
    def test_monailabel_forms(self, method, path, media, fields, required):
        schema = self._operations()[(method, path)]["requestBody"]["content"][media]["schema"]
        described = {name: prop.get("format", prop["type"]) for name, prop in schema["properties"].items()}
        self.assertEqual(described, fields)
        self.assertEqual(set(schema.get("required", ())), required)

    def test_schemathesis_finds_no_server_error(self):
        schema = schemathesis.openapi.from_dict(self.document)
        operations = [result.ok() for result in schema.get_all_operations()]
        self.assertEqual(len(operations), len(self._operations()))  # every one of them, whatever routes come
        failures: list[str] = []
        statuses: dict[str, set[int]] = {}
        for operation in operations:
            for examples in operation.get_strategies_from_examples():  # the schema's own examples first
                self._fuzz(examples, "examples", 2, failures, statuses)
            for mode in GenerationMode:
                if mode == GenerationMode.NEGATIVE and not len(operation.body):
                    continue  # no body to break (a path's string parameter cannot be made invalid)
                self._fuzz(operation.as_strategy(generation_mode=mode), mode.value, EXAMPLES, failures, statuses)
        self.assertEqual(failures, [])
        # the examples reached the model: both MONAI Label models answered on the uploaded image
        self.assertIn(200, statuses["POST /infer/vista3d (examples)"])
        self.assertIn(200, statuses["POST /infer/vista3d_clicks (examples)"])

    def _fuzz(self, strategy, mode: str, examples: int, failures: list[str], statuses: dict[str, set[int]]) -> None:
        @hypothesis_settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                             phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case):
            response = case.call(base_url=self.server.url, headers=self.headers, timeout=60)
            what = f"{case.method} {case.formatted_path} ({mode})"
            statuses.setdefault(what, set()).add(response.status_code)
            if response.status_code < 400:
                return  # an answer (the file of an /infer/ is bytes, not text)
            detail = response.json().get("detail") if response.status_code < 500 else None
            if not isinstance(detail, str) or "\n" in detail:
                failures.append(f"{what} -> {response.status_code}: {response.content[:200]!r}")

        run()


if __name__ == "__main__":
    unittest.main()
