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
its address (another loopback address is another machine); its uploads and sessions are its own (another client's
request for them is a 404, as for one never made), its click sessions and uploads count against its own share
(--max-sessions-per-client), and its share of the queue holds on ``/infer/``. A request's points and classes are
bounded by --max-points and --max-classes (413 naming the flag).

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
        limits = Limits(queue_size=2, max_queue_per_client=1, max_sessions=16, max_sessions_per_client=2,
                        max_points=4, max_classes=2, request_timeout=120.0)
        cls.server = start_for_class(cls, settings(limits=limits), factory=lambda: tiny_pipeline(cls.network))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _client(self, source: str, client_id: str = "user") -> SlicerLikeClient:
        """A Slicer at ``source`` with the phantom uploaded as image ``ct``."""
        client = SlicerLikeClient(self.server.url, client_id=client_id, source=source)
        self.assertEqual(client.upload_image(self.ct, "ct").status, 200)
        return client

    def test_points_and_classes_bounded_by_the_servers_flags(self):
        client = self._client("127.0.5.1")
        at_limit = {"label": "liver", "foreground": [[20, 20, 18], [19, 20, 18], [18, 20, 18]],
                    "background": [[2, 2, 2]]}
        self.assertEqual(client.infer_reply("vista3d_clicks", "ct", at_limit).status, 200)
        ran = dict(self.server.worker.counts)
        past = {**at_limit, "background": [[2, 2, 2], [3, 3, 3]]}  # a fifth point on the segment
        for model, params, flag in (("vista3d_clicks", past, "--max-points 4"),
                                    ("vista3d", {"classes": "liver, spleen, aorta"}, "--max-classes 2"),
                                    ("vista3d", {"classes": [1, 3, 6]}, "--max-classes 2")):
            reply = client.infer_reply(model, "ct", params)
            self.assertEqual(reply.status, 413, reply.body)
            self.assertIn(flag, reply.json()["detail"])
        self.assertEqual(self.server.worker.counts, ran)  # refused before the queue: no job ran for them

    def test_another_client_cannot_use_ones_images_or_sessions(self):
        mine = self._client("127.0.2.1")
        theirs = SlicerLikeClient(self.server.url, client_id=mine.client_id, source="127.0.2.2")  # the same user id
        created = mine.create_session(self.ct)
        self.assertEqual(created.status, 200, created.body)
        sid = created.json()["session_id"]
        self.assertEqual(mine.infer_reply("vista3d_clicks", "ct", LIVER).status, 200)  # a click session on "ct"
        for reply, words in ((theirs.infer_reply("vista3d_clicks", "ct", LIVER), "upload it first"),
                             (theirs.infer_reply("vista3d", "ct", {"classes": "liver"}), "upload it first"),
                             (theirs.get_session(sid), "is not on this server"),
                             (theirs.remove_session(sid), "is not on this server"),
                             (theirs.infer_reply("vista3d_clicks", "ct", LIVER, session_id=sid), "is not on this")):
            self.assertEqual(reply.status, 404, reply.body)
            self.assertIn(words, reply.json()["detail"])
        # nothing of the owner's was touched: its session, its image and its clicks go on
        self.assertEqual(mine.get_session(sid).status, 200)
        self.assertEqual(mine.infer("vista3d_clicks", "ct", LIVER, session_id=sid).params["label_names"],
                         {"liver": 1})
        again = mine.infer("vista3d_clicks", "ct", LIVER)
        self.assertEqual(again.params["latencies"], {})  # the same points on its click session: nothing ran again
        self.assertEqual(mine.remove_session(sid).status, 200)
        self.assertEqual(mine.get_session(sid).status, 410)  # the owner hears why it is gone; the other, nothing
        self.assertEqual(theirs.get_session(sid).status, 404)

    def _repeat_ran(self, client: SlicerLikeClient, label: str) -> bool:
        """Whether the client's last request on ``label`` ran again when sent again (its click session had ended)."""
        return client.infer("vista3d_clicks", "ct", {**LIVER, "label": label}).params["latencies"] != {}

    def test_click_sessions_count_against_their_address_share(self):
        # two sessions per client: a third of one client evicts that client's oldest, never another's
        mine, theirs = self._client("127.0.3.1"), self._client("127.0.3.2")
        for label in ("first", "second"):
            self.assertTrue(self._repeat_ran(mine, label))
        for label in ("first", "second", "third"):
            self.assertTrue(self._repeat_ran(theirs, label))
        self.assertEqual([self._repeat_ran(mine, label) for label in ("first", "second")], [False, False])
        self.assertEqual([self._repeat_ran(theirs, label) for label in ("third", "first")], [False, True])

    def test_uploads_count_against_their_address_share(self):
        # two images per client: a third upload of one client evicts that client's oldest (410 saying why)
        mine, theirs = (SlicerLikeClient(self.server.url, source=source) for source in ("127.0.4.1", "127.0.4.2"))
        own = [mine.create_session(self.ct).json()["session_id"] for _ in range(2)]
        other = [theirs.create_session(self.ct).json()["session_id"] for _ in range(3)]
        self.assertEqual([mine.get_session(sid).status for sid in own], [200, 200])
        self.assertEqual([theirs.get_session(sid).status for sid in other], [410, 200, 200])
        self.assertIn("--max-sessions-per-client", theirs.get_session(other[0]).json()["detail"])

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
