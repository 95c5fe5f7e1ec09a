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
"""Click sessions over a real socket: five clicks equal Vista3DSession's, changed boxes, reset, delete, TTL and
LRU eviction with a clear 410."""

from __future__ import annotations

import gzip
import tempfile
import threading
import unittest
from dataclasses import dataclass
from pathlib import Path

import httpx
import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.core.session import Vista3DSession
from monai.apps.vista3d.server.errors import ServeError
from monai.apps.vista3d.server.routes import changed_box
from monai.apps.vista3d.server.sessions import BoundedStore, SessionEntry, SessionStore
from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import (
    LiveServer,
    ManualClock,
    settings,
    start_for_class,
    tiny_pipeline,
    write_phantom,
)

# clicks inside the body of the 40 x 40 x 36 phantom: (points, labels, class on the first click)
CLICKS = [([[20, 20, 18]], [1]), ([[8, 30, 10]], [1]), ([[30, 9, 26]], [0]), ([[20, 21, 18]], [1]),
          ([[12, 25, 14], [28, 14, 20]], [1, 0])]


def _image(data: bytes) -> nib.Nifti1Image:
    return nib.Nifti1Image.from_bytes(gzip.decompress(data))


class TestSessions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.data = Path(cls._tmp.name)
        cls.ct = write_phantom(cls.data / "ct.nii.gz")
        cls.clock = ManualClock()
        limits = Limits(max_sessions=2, session_ttl=100.0, request_timeout=120.0, max_points=6,
                        max_sessions_per_client=2)
        cls.server = start_for_class(cls, settings(data_dir=cls.data, limits=limits), clock=cls.clock)
        cls.http = httpx.Client(base_url=cls.server.url, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.http.close()
        cls._tmp.cleanup()

    def _session(self, http: httpx.Client | None = None) -> str:
        response = (http or self.http).post("/v1/vista3d/sessions", json={"image": "ct.nii.gz"})
        self.assertEqual(response.status_code, 201, response.text)
        return response.json()["session_id"]

    def _client(self, address: str) -> httpx.Client:
        """An HTTP client at another loopback address of this host: another client for the server."""
        http = httpx.Client(base_url=self.server.url, timeout=120,
                            transport=httpx.HTTPTransport(local_address=address))
        self.addCleanup(http.close)
        return http

    def test_sessions_belong_to_their_client(self):
        # another client's session id is a 404 for every use (as an id never issued), never a takeover
        sid = self._session()
        other = self._client("127.0.0.2")
        for method, path, body in (("GET", "", None), ("POST", "/clicks", {"points": CLICKS[0][0]}),
                                   ("DELETE", "", None)):
            response = other.request(method, f"/v1/vista3d/sessions/{sid}{path}", json=body)
            self.assertEqual(response.status_code, 404, response.text)
            self.assertIn(f"no session {sid!r}", response.json()["detail"])
        self.assertEqual(self._click(sid, *CLICKS[0]).status_code, 200)  # still the owner's, untouched
        self.assertEqual(self.http.delete(f"/v1/vista3d/sessions/{sid}").status_code, 204)
        self.assertEqual(other.get(f"/v1/vista3d/sessions/{sid}").status_code, 404)  # nor why it ended

    def _click(self, sid: str, points, labels, **extra) -> httpx.Response:
        return self.http.post(f"/v1/vista3d/sessions/{sid}/clicks",
                              json={"points": points, "point_labels": labels, **extra})

    def test_five_clicks_equal_vista3d_session(self):
        for object_class in (None, "liver"):
            reference = Vista3DSession(tiny_pipeline(), str(self.ct))
            sid = self._session()
            for k, (points, labels) in enumerate(CLICKS):
                extra = {"class": object_class} if k == 0 and object_class else {}
                response = self._click(sid, points, labels, **extra)
                self.assertEqual(response.status_code, 200, response.text)
                self.assertEqual(response.headers["content-type"], "application/gzip")
                expected = reference.click(points, labels, classes=object_class if k == 0 else None)
                np.testing.assert_array_equal(np.asarray(_image(response.content).dataobj),
                                              expected.numpy().astype(np.uint8), err_msg=f"click {k}")
            info = self.http.get(f"/v1/vista3d/sessions/{sid}").json()
            self.assertEqual((info["clicks"], info["class"]), (6, 1 if object_class else None))

    def test_changed_box_answers(self):
        full, boxed = self._session(), self._session()
        previous = np.full((40, 40, 36), 255, dtype=np.uint8)
        for points, labels in CLICKS[:3]:
            whole = _image(self._click(full, points, labels).content)
            labels_now = np.asarray(whole.dataobj)
            response = self._click(boxed, points, labels, **{"return": "box"})
            self.assertEqual(response.status_code, 200, response.text)
            x0, y0, z0, x1, y1, z1 = (int(v) for v in response.headers["x-vista3d-box"].split(","))
            part = _image(response.content)
            np.testing.assert_array_equal(np.asarray(part.dataobj), labels_now[x0:x1, y0:y1, z0:z1])
            # the box keeps its place in the world: its first voxel is the full grid's (x0, y0, z0)
            np.testing.assert_allclose(part.affine[:3, 3], (whole.affine @ [x0, y0, z0, 1])[:3])
            outside = np.ones(labels_now.shape, bool)
            outside[x0:x1, y0:y1, z0:z1] = False
            np.testing.assert_array_equal(labels_now[outside], previous[outside])  # nothing changed outside
            previous = labels_now

    def test_reset_starts_a_new_object(self):
        sid = self._session()
        self._click(sid, *CLICKS[0], **{"class": "liver"})
        refused = self._click(sid, *CLICKS[1], **{"class": "spleen"})
        self.assertEqual(refused.status_code, 422)
        self.assertIn("reset", refused.json()["detail"])
        response = self._click(sid, *CLICKS[1], **{"class": "spleen", "reset": True})
        self.assertEqual(response.status_code, 200, response.text)
        expected = tiny_pipeline().segment(str(self.ct), classes="spleen", points=CLICKS[1][0],
                                           point_labels=CLICKS[1][1]).labels
        np.testing.assert_array_equal(np.asarray(_image(response.content).dataobj), expected.numpy().astype(np.uint8))

    def test_points_bound_per_object(self):
        # an object's clicks all go to the network again on each click: --max-points bounds them all (here 6,
        # which CLICKS reach exactly); one more point is refused until the object is reset
        sid = self._session()
        for points, labels in CLICKS:
            self.assertEqual(self._click(sid, points, labels).status_code, 200)
        refused = self._click(sid, *CLICKS[0])
        self.assertEqual(refused.status_code, 413)
        self.assertIn("would have 7 points", refused.json()["detail"])
        self.assertIn('"reset": true', refused.json()["detail"])
        self.assertEqual(self._click(sid, *CLICKS[0], reset=True).status_code, 200)
        too_many = self._click(sid, [[20, 20, 18]] * 7, [1] * 7, reset=True)
        self.assertEqual(too_many.status_code, 413)
        self.assertIn("--max-points 6", too_many.json()["detail"])

    def test_delete_expire_evict(self):
        a = self._session()
        self.assertEqual(self.http.delete(f"/v1/vista3d/sessions/{a}").status_code, 204)
        gone = self._click(a, *CLICKS[0])
        self.assertEqual(gone.status_code, 410)
        self.assertIn("deleted", gone.json()["detail"])
        # the store holds two: a third evicts the least recently used
        b, c = self._session(), self._session()
        self.assertEqual(self.http.get(f"/v1/vista3d/sessions/{b}").status_code, 200)  # b is now the most recent
        d = self._session()
        evicted = self._click(c, *CLICKS[0])
        self.assertEqual(evicted.status_code, 410)
        self.assertIn("evicted", evicted.json()["detail"])
        self.assertIn("--max-sessions", evicted.json()["detail"])
        self.assertEqual(self._click(b, *CLICKS[0]).status_code, 200)
        # unused for longer than the TTL: expired
        self.clock.now += 101.0
        expired = self.http.get(f"/v1/vista3d/sessions/{d}")
        self.assertEqual(expired.status_code, 410)
        self.assertIn("expired", expired.json()["detail"])
        unknown = self.http.get("/v1/vista3d/sessions/nope")
        self.assertEqual(unknown.status_code, 404)
        self.assertIn("POST /v1/vista3d/sessions", unknown.json()["detail"])

    def test_session_from_upload(self):
        files = {"image": ("mine.nii.gz", self.ct.read_bytes(), "application/gzip")}
        response = self.http.post("/v1/vista3d/sessions", files=files)
        self.assertEqual(response.status_code, 201, response.text)
        self.assertEqual((response.json()["name"], response.json()["shape"]), ("mine", [40, 40, 36]))


class TestSessionShares(unittest.TestCase):
    def test_a_client_opening_many_evicts_only_its_own(self):
        # four sessions, two per client: client A opening session after session (issue 47 measured 56-68 a
        # second evicting everyone's) only ever evicts its own; client B's stay
        with tempfile.TemporaryDirectory() as tmp:
            write_phantom(Path(tmp) / "ct.nii.gz", shape=(24, 24, 24))
            limits = Limits(max_sessions=4, max_sessions_per_client=2, request_timeout=120.0)
            with LiveServer(settings(data_dir=Path(tmp), limits=limits)) as server:
                server.wait_ready()
                a, b = (httpx.Client(base_url=server.url, timeout=120, transport=httpx.HTTPTransport(local_address=ip))
                        for ip in ("127.0.0.1", "127.0.0.2"))
                with a, b:
                    def open_session(http):
                        response = http.post("/v1/vista3d/sessions", json={"image": "ct.nii.gz"})
                        self.assertEqual(response.status_code, 201, response.text)
                        return response.json()["session_id"]

                    bs = [open_session(b), open_session(b)]
                    as_ = [open_session(a) for _ in range(5)]
                    self.assertEqual([b.get(f"/v1/vista3d/sessions/{s}").status_code for s in bs], [200, 200])
                    self.assertEqual([a.get(f"/v1/vista3d/sessions/{s}").status_code for s in as_],
                                     [410, 410, 410, 200, 200])
                    evicted = a.get(f"/v1/vista3d/sessions/{as_[0]}").json()["detail"]
                    self.assertIn("--max-sessions-per-client", evicted)

@dataclass
class _Entry:
    owner: str
    last_used: float = 0.0


class _Store(BoundedStore[str, _Entry]):
    def add(self, key: str, owner: str) -> list[str]:
        with self._lock:
            self._sweep_locked()
            return [e.owner for e in self._admit_locked(key, _Entry(owner))]

    def get(self, key: str, owner: str | None) -> tuple[int, str]:
        """200 and the owner, or the status and message of the error."""
        with self._lock:
            self._sweep_locked()
            try:
                return 200, self._touch_locked(key, owner, "missing", key, "send it again").owner
            except ServeError as e:
                return e.status, e.message


class TestBoundedStore(unittest.TestCase):
    def setUp(self):
        self.clock = ManualClock()
        self.store = _Store(capacity=3, ttl=10.0, clock=self.clock, per_client=2, remembered=2)

    def test_past_its_share_an_owner_evicts_its_own_least_recently_used(self):
        self.store.add("a1", "A"), self.store.add("b1", "B"), self.store.add("a2", "A")
        self.store.get("a1", "A")  # a2 is now A's least recently used
        self.assertEqual(self.store.add("a3", "A"), ["A"])
        self.assertEqual(self.store.get("a2", "A"), (410, "a2 was evicted: one client holds at most 2 entries and it "
                                                          "was that client's least recently used; send it again"))
        self.assertEqual(self.store.get("b1", "B"), (200, "B"))

    def test_when_full_the_least_recently_used_of_all_is_evicted(self):
        self.store.add("a1", "A"), self.store.add("b1", "B"), self.store.add("c1", "C")
        self.store.get("a1", "A")
        self.assertEqual(self.store.add("d1", "D"), ["B"])
        self.assertEqual(len(self.store), 3)
        self.assertIn("the store holds at most 3 entries", self.store.get("b1", "B")[1])

    def test_expiry_counts_from_the_last_use(self):
        self.store.add("a1", "A"), self.store.add("b1", "B")
        self.clock.now = 8.0
        self.store.get("a1", "A")
        self.clock.now = 15.0
        self.assertEqual(self.store.sweep(), 1)
        self.assertEqual(self.store.get("b1", "B"), (410, "b1 was expired: unused for more than 10 s (--session-ttl); "
                                                          "send it again"))
        self.assertEqual(self.store.expires_in(self.store._live["a1"]), 3.0)

    @parameterized.expand([("owner", "A", 410), ("another_client", "B", 404), ("any_client", None, 410)])
    def test_an_ended_key_is_told_410_only_to_its_owner(self, _, asker, status):
        self.store.add("a1", "A"), self.store.add("a2", "A"), self.store.add("a3", "A")
        self.assertEqual(self.store.get("a1", asker)[0], status)

    def test_a_live_key_of_another_owner_is_missing(self):
        self.store.add("a1", "A")
        self.assertEqual(self.store.get("a1", "B"), (404, "missing"))
        self.assertEqual(self.store.get("a1", None), (200, "A"))

    def test_only_the_last_ended_keys_are_remembered(self):
        for i in range(5):
            self.store.add(f"k{i}", "A")  # k0, k1, k2 evicted; two remembered
        self.assertEqual([self.store.get(f"k{i}", "A")[0] for i in range(5)], [404, 410, 410, 200, 200])


class _Interleaved:
    """A lock that, the first time it is let go, runs another request (as a second thread would, between two of a
    request's turns with the lock)."""

    def __init__(self, between):
        self._lock, self._between = threading.Lock(), between

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *exc):
        self._lock.release()
        between, self._between = self._between, None
        if between is not None:
            between()


class TestSessionStore(unittest.TestCase):
    def test_of_two_requests_that_delete_a_session_the_second_is_told_410(self):
        store = SessionStore(max_sessions=2, ttl=10.0, clock=ManualClock())
        sid = store.add(SessionEntry(session=None, image=None, owner="A"))
        statuses = []

        def other_delete():
            try:
                store.remove(sid, "A")
                statuses.append(204)
            except ServeError as e:
                statuses.append(e.status)

        store._lock = _Interleaved(other_delete)
        store.remove(sid, "A")
        self.assertEqual(statuses, [410])
        with self.assertRaises(ServeError) as caught:  # and the session stays its owner's: 410, not 404
            store.get(sid, "A")
        self.assertEqual(caught.exception.status, 410)


class TestChangedBox(unittest.TestCase):
    def test_box(self):
        before = torch.zeros((5, 6, 7), dtype=torch.uint8)
        after = before.clone()
        self.assertIsNone(changed_box(before, after))
        after[1, 2, 3] = 1
        after[3, 4, 3] = 2
        self.assertEqual(changed_box(before, after), (slice(1, 4), slice(2, 5), slice(3, 4)))
        unknown = torch.full((5, 6, 7), 255, dtype=torch.uint8)
        unknown[0, 0, 0] = 0
        self.assertEqual(changed_box(None, unknown), (slice(0, 1),) * 3)


if __name__ == "__main__":
    unittest.main()
