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
"""The server's own OpenAPI schema describes every request body, and schemathesis, driven by that schema over a
real socket, gets no 5xx: a bounded number of generated requests per operation, bodies that fit the schema and
bodies that break it, each answer a 2xx or a 4xx with one JSON line."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.configuration import set_hypothesis_home_dir
from schemathesis import GenerationMode

from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import settings, start_for_class, write_phantom

#: generated requests per operation and mode (9 operations; the 3 with a body also get bodies that break the schema)
EXAMPLES = 40


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
        cls.server = start_for_class(cls, settings(data_dir=data, limits=limits))
        with httpx.Client(base_url=cls.server.url) as http:
            cls.document = http.get("/openapi.json").json()

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_every_request_body_is_described(self):
        posts = {path: ops["post"] for path, ops in self.document["paths"].items() if "post" in ops}
        self.assertEqual(set(posts), {"/v1/vista3d/inference", "/v1/vista3d/sessions",
                                      "/v1/vista3d/sessions/{session_id}/clicks"})
        for path, op in posts.items():
            content = op["requestBody"]["content"]
            self.assertIn("properties", content["application/json"]["schema"], path)
        inference = posts["/v1/vista3d/inference"]["requestBody"]["content"]
        self.assertEqual(set(inference["application/json"]["schema"]["properties"]),
                         {"image", "prompts", "local_working_dir", "output"})
        self.assertEqual(inference["multipart/form-data"]["schema"]["properties"]["image"]["format"], "binary")

    def test_schemathesis_finds_no_server_error(self):
        schema = schemathesis.openapi.from_dict(self.document)
        operations = [result.ok() for result in schema.get_all_operations()]
        self.assertEqual(len(operations), 9)
        failures: list[str] = []
        for operation in operations:
            for mode in GenerationMode:
                if mode == GenerationMode.NEGATIVE and not len(operation.body):
                    continue  # no body to break (a path's string parameter cannot be made invalid)
                self._fuzz(operation, mode, failures)
        self.assertEqual(failures, [])

    def _fuzz(self, operation, mode, failures: list[str]) -> None:
        @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                             phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case):
            response = case.call(base_url=self.server.url, timeout=60)
            what = (f"{case.method} {case.formatted_path} ({mode.value}) -> {response.status_code}: "
                    f"{response.text[:200]}")
            if response.status_code >= 500:
                failures.append(what)
            elif response.status_code >= 400:
                detail = response.json().get("detail")
                if not isinstance(detail, str) or "\n" in detail:
                    failures.append(what)

        run()


if __name__ == "__main__":
    unittest.main()
