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
"""The server's limits on 3D Slicer's MONAI Label calls, over a real socket, as on the NIM's endpoints: a client is
its address (another loopback address is another machine); its share of the queue holds on ``/infer/``.

Each test speaks from addresses of its own, so that the shares of one test are not those of another; the model is
held with a gate (a forward pre-hook waiting on an event) and every step waits on the worker's own condition.
"""

from __future__ import annotations

import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import Gate, settings, start_for_class, tiny_pipeline, write_phantom
from tests.apps.vista3d.server.monailabel_client import SlicerLikeClient
from tests.networks.tiny_vista3d import tiny_vista3d_with_recorded_weights

WAIT = 60  # seconds before a wait on an event is a failure
LIVER = {"label": "liver", "foreground": [[20, 20, 18]]}


class TestMonaiLabelLimits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.ct = write_phantom(Path(cls._tmp.name) / "ct.nii.gz")
        cls.network = tiny_vista3d_with_recorded_weights()
        limits = Limits(queue_size=2, max_queue_per_client=1, request_timeout=120.0)
        cls.server = start_for_class(cls, settings(limits=limits), factory=lambda: tiny_pipeline(cls.network))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _client(self, source: str, client_id: str = "user") -> SlicerLikeClient:
        """A Slicer at ``source`` with the phantom uploaded as image ``ct``."""
        client = SlicerLikeClient(self.server.url, client_id=client_id, source=source)
        self.assertEqual(client.upload_image(self.ct, "ct").status, 200)
        return client

    def test_one_client_holds_only_its_share_of_the_queue(self):
        # three places, one per client: a second /infer/ of the client whose click runs is refused (429 naming the
        # flag), while another client's click takes a place and is served after it
        mine, theirs = self._client("127.0.1.1"), self._client("127.0.1.2")
        gate = Gate(self.network)
        self.addCleanup(gate.remove)
        worker = self.server.worker
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(mine.infer_reply, "vista3d_clicks", "ct", LIVER)
            self.assertTrue(gate.entered.wait(WAIT))  # the click runs, held at the gate
            refused = mine.infer_reply("vista3d", "ct", {"classes": "liver"})
            self.assertEqual(refused.status, 429, refused.body)
            self.assertIn("--max-queue-per-client 1", refused.json()["detail"])
            self.assertGreaterEqual(int(refused.headers["retry-after"]), 1)
            other = pool.submit(theirs.infer_reply, "vista3d_clicks", "ct", LIVER)
            self.assertTrue(worker.wait_for(lambda w: w.pending == 1, WAIT))  # admitted: waiting for the model
            gate.open()
            self.assertEqual([held.result().status, other.result().status], [200, 200])
        self.assertTrue(worker.wait_for(lambda w: w.held == 0, WAIT))


if __name__ == "__main__":
    unittest.main()
