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
"""Random weights announced (the command line's warning logged, "weights": "random" in ready and info, a header on
every answer), and a --weights file that cannot load refused before the port opens."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import httpx
import torch

from monai.apps.vista3d import PipelineOptions, SegmentJob
from monai.apps.vista3d.cli.main import _flagged, main
from monai.apps.vista3d.core.network_ready import RANDOM_WEIGHTS_WARNING
from monai.apps.vista3d.server.settings import TOKEN_ENV, Limits, ServerSettings
from monai.networks.nets import vista3d132
from tests.apps.vista3d.server.harness import LiveServer, settings, tiny_pipeline, write_phantom


class TestRandomWeights(unittest.TestCase):
    def test_random_weights_are_announced(self):
        # no weights and no network of the caller's: the server builds vista3d132 with random weights (here the
        # tiny network stands in for it, the settings are what announce it)
        model = SegmentJob(options=PipelineOptions(roi_size=32), device="cpu")
        with tempfile.TemporaryDirectory() as tmp:
            write_phantom(Path(tmp) / "ct.nii.gz", shape=(24, 24, 24))
            server_settings = ServerSettings(model=model, data_dir=Path(tmp), limits=Limits(request_timeout=120.0))
            with self.assertLogs("monai.apps.vista3d.server", "WARNING") as logs, \
                    LiveServer(server_settings, factory=tiny_pipeline) as server:
                server.wait_ready()
                with httpx.Client(base_url=server.url, timeout=120) as http:
                    ready = http.get("/v1/health/ready")
                    self.assertEqual(ready.json(), {"status": "ready", "weights": "random"})
                    info = http.get("/v1/vista3d/info")
                    self.assertEqual(info.json()["model"]["weights"], "random")
                    answers = [ready, info, http.get("/v1/health/live"), http.get("/v1/nothing"),
                               http.post("/v1/vista3d/inference", json={"image": "ct.nii.gz", "prompts": {"x": 1}}),
                               http.post("/v1/vista3d/inference", json={"image": "ct.nii.gz",
                                                                        "prompts": {"classes": ["liver"]}})]
                    self.assertEqual([a.status_code for a in answers], [200, 200, 200, 404, 422, 200])
                    for answer in answers:  # every answer, errors included, says so
                        self.assertEqual(answer.headers["x-vista3d-weights"], "random")
        self.assertIn(_flagged(RANDOM_WEIGHTS_WARNING), [record.getMessage() for record in logs.records])

    def test_weights_are_not_announced_when_given(self):
        with LiveServer(settings()) as server:
            server.wait_ready()
            with httpx.Client(base_url=server.url, timeout=120) as http:
                ready = http.get("/v1/health/ready")
        self.assertEqual(ready.json(), {"status": "ready", "weights": "loaded"})
        self.assertNotIn("x-vista3d-weights", ready.headers)


class TestWeightsBeforeThePort(unittest.TestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        os.environ.pop(TOKEN_ENV, None)
        self.addCleanup(patcher.stop)
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)

    def _serve(self, *flags: str) -> tuple[int, str, mock.Mock]:
        err = io.StringIO()
        with mock.patch("uvicorn.Server.run") as run, mock.patch("logging.basicConfig"), \
                contextlib.redirect_stderr(err):
            status = main(["serve", "--port", "0", "--device", "cpu", *flags])
        return status, err.getvalue(), run

    def test_a_file_that_cannot_load_is_refused_before_the_port_opens(self):
        text = self.tmp / "model.pt"
        text.write_text("not a checkpoint")
        other = self.tmp / "other.pt"  # a torch checkpoint, of another network
        torch.save(torch.nn.Linear(2, 2).state_dict(), other)
        cases = [((str(self.tmp / "missing.pt"),), "--weights"), ((str(text),), "text file"),
                 ((str(other),), "does not match the VISTA3D network")]
        for flags, said in cases:
            status, err, run = self._serve("--weights", *flags)
            self.assertEqual(status, 2, err)
            self.assertIn(said, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            run.assert_not_called()  # no port was opened

    def test_a_checkpoint_of_the_network_passes(self):
        good = self.tmp / "small.pt"
        torch.save(vista3d132(encoder_embed_dim=8).state_dict(), good)
        status, err, run = self._serve("--weights", str(good), "--embed-dim", "8", "--roi-size", "32")
        self.assertEqual(status, 0, err)
        run.assert_called_once()
        self.assertNotIn("RANDOM", err)


if __name__ == "__main__":
    unittest.main()
