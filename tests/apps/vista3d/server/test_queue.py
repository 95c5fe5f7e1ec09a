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
"""The bounded queue in front of the model, over a real socket: 429 with Retry-After when full, requests served
in order, a client that disconnects frees its slot (queued or running), a request over its time limit gets 504.

The model is held with a gate (a forward pre-hook waiting on an event) and every step waits on the worker's own
condition, never on a sleep.
"""

from __future__ import annotations

import json
import socket
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import Gate, LiveServer, settings, write_phantom
from tests.networks.tiny_vista3d import tiny_vista3d_with_recorded_weights

WAIT = 60  # seconds before a wait is a failure (the waits end on events, in milliseconds)


class _Recording(Vista3DPipeline):
    """The tiny pipeline, recording the voxel size of every image it segments (the order jobs ran in)."""

    def __init__(self):
        super().__init__(network=tiny_vista3d_with_recorded_weights(), device="cpu", roi_size=16)
        self.order: list[float] = []

    def segment(self, image, affine=None, *args, **kwargs):
        self.order.append(round(float(affine[0, 0]), 2))
        return super().segment(image, affine, *args, **kwargs)


class TestQueue(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.data = Path(self._tmp.name)
        for spacing in (1.0, 1.1, 1.2, 1.3):  # one image per request, told apart by their voxel size
            write_phantom(self.data / f"ct{spacing}.nii.gz", spacing=(spacing,) * 3)
        self.pipe = _Recording()

    def tearDown(self):
        self._tmp.cleanup()

    def _server(self, **limits) -> LiveServer:
        limits = Limits(**{"queue_size": 1, "request_timeout": 120.0, "max_queue_per_client": 2, **limits})
        server = LiveServer(settings(data_dir=self.data, limits=limits), factory=lambda: self.pipe)
        server.__enter__()
        self.addCleanup(server.__exit__, None, None, None)
        server.wait_ready()
        self.pipe.order.clear()
        gate = Gate(self.pipe.network)
        self.addCleanup(gate.remove)
        return server, gate

    def _post(self, server: LiveServer, spacing: float, source: str = "127.0.0.1") -> httpx.Response:
        """One request from the client at address ``source`` (a loopback address of this host)."""
        transport = httpx.HTTPTransport(local_address=source)
        with httpx.Client(base_url=server.url, timeout=120, transport=transport) as client:
            return client.post("/v1/vista3d/inference", json={"image": f"ct{spacing}.nii.gz",
                                                              "prompts": {"classes": ["liver"]}})

    def _raw_request(self, server: LiveServer, spacing: float) -> socket.socket:
        """A request sent on a socket of its own, left open: closing it is the client disconnecting."""
        body = json.dumps({"image": f"ct{spacing}.nii.gz", "prompts": {"classes": ["liver"]}}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        return sock

    def test_full_queue_gets_429_and_requests_run_in_order(self):
        server, gate = self._server()
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(self._post, server, 1.0)
            self.assertTrue(gate.entered.wait(WAIT))  # the first request is running, held at the gate
            second = pool.submit(self._post, server, 1.1)
            self.assertTrue(server.worker.wait_for(lambda w: w.pending == 1, WAIT))  # and one waits
            busy = self._post(server, 1.2)
            self.assertEqual(busy.status_code, 429)
            self.assertGreaterEqual(int(busy.headers["retry-after"]), 1)
            self.assertIn("--queue-size 1", busy.json()["detail"])
            gate.open()
            self.assertEqual(first.result().status_code, 200)
            self.assertEqual(second.result().status_code, 200)
        self.assertEqual(self.pipe.order, [1.0, 1.1])  # in the order they arrived; the refused one never ran
        self.assertTrue(server.worker.wait_for(lambda w: w.held == 0, WAIT))
        self.assertEqual(self._post(server, 1.3).status_code, 200)  # and the server keeps serving

    def test_one_client_holds_only_its_share(self):
        # four places, two per client: a third request of one client is refused (429 naming the flag) while a
        # request of another client still gets a place, and all that were admitted are served in order
        server, gate = self._server(queue_size=3)
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(self._post, server, 1.0)
            self.assertTrue(gate.entered.wait(WAIT))
            second = pool.submit(self._post, server, 1.1)
            self.assertTrue(server.worker.wait_for(lambda w: w.pending == 1, WAIT))
            refused = self._post(server, 1.2)
            self.assertEqual(refused.status_code, 429)
            self.assertIn("--max-queue-per-client 2", refused.json()["detail"])
            self.assertGreaterEqual(int(refused.headers["retry-after"]), 1)
            other = pool.submit(self._post, server, 1.3, "127.0.0.2")
            self.assertTrue(server.worker.wait_for(lambda w: w.pending == 2, WAIT))
            gate.open()
            self.assertEqual([f.result().status_code for f in (first, second, other)], [200, 200, 200])
        self.assertEqual(self.pipe.order, [1.0, 1.1, 1.3])

    def test_disconnect_while_queued_frees_the_slot(self):
        server, gate = self._server()
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(self._post, server, 1.0)
            self.assertTrue(gate.entered.wait(WAIT))
            leaver = self._raw_request(server, 1.1)
            self.assertTrue(server.worker.wait_for(lambda w: w.pending == 1, WAIT))
            leaver.close()
            self.assertTrue(server.worker.wait_for(lambda w: w.pending == 0 and w.held == 1, WAIT))
            third = pool.submit(self._post, server, 1.2)  # takes the freed slot instead of a 429
            self.assertTrue(server.worker.wait_for(lambda w: w.pending == 1, WAIT))
            gate.open()
            self.assertEqual(first.result().status_code, 200)
            self.assertEqual(third.result().status_code, 200)
        self.assertEqual(self.pipe.order, [1.0, 1.2])  # the one that left never ran
        self.assertEqual(server.worker.counts["cancelled"], 1)

    def test_disconnect_while_running_stops_the_job(self):
        server, gate = self._server()
        leaver = self._raw_request(server, 1.0)
        self.assertTrue(gate.entered.wait(WAIT))
        leaver.close()
        self.assertTrue(server.worker.wait_for(lambda w: w.held == 0, WAIT))  # the slot is free at once
        gate.open()  # the job stops at its next network call
        self.assertTrue(server.worker.wait_for(lambda w: not w.running and w.counts["cancelled"] == 1, WAIT))
        forwards = gate.calls
        self.assertEqual(self._post(server, 1.1).status_code, 200)
        self.assertEqual(self.pipe.order, [1.0, 1.1])
        self.assertGreater(gate.calls, forwards)

    def test_request_over_its_time_limit(self):
        server, gate = self._server(request_timeout=3.0)
        late = self._post(server, 1.0)  # held at the gate past its three seconds
        self.assertEqual(late.status_code, 504)
        self.assertIn("--request-timeout", late.json()["detail"])
        gate.open()
        self.assertTrue(server.worker.wait_for(lambda w: not w.running and w.counts["cancelled"] == 1, WAIT))
        gate.remove()
        self.assertEqual(self._post(server, 1.1).status_code, 200)


if __name__ == "__main__":
    unittest.main()
