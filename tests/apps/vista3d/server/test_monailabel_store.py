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
"""The MONAI Label protocol's uploads (bounded, expiring, never deleted under a reader) and the click sessions
that continue per (owner, upload, label) inside the server's session budget."""

from __future__ import annotations

import asyncio
import tempfile
import unittest
from pathlib import Path

from monai.apps.vista3d.server.errors import ServeError
from monai.apps.vista3d.server.monailabel_store import ClickEntry, ClickSessions, UploadStore
from monai.apps.vista3d.server.sessions import SessionStore
from tests.apps.vista3d.server.harness import ManualClock


class TestUploadStore(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.clock = ManualClock()
        self.ended = []
        self.store = UploadStore(self.root / "uploads", max_images=2, ttl=10.0, clock=self.clock,
                                 on_end=self.ended.append)

    def _put(self, key, text="x"):
        src = self.root / f"src-{len(list(self.root.iterdir()))}"
        src.write_text(text)
        return self.store.put(key, src, "nifti", "ct", str(key))

    def _status(self, key) -> tuple[int, str]:
        with self.assertRaises(ServeError) as caught:
            self.store.get(key, "image 'a'", "upload it again")
        return caught.exception.status, caught.exception.message

    def test_put_moves_the_file_in_under_a_server_name(self):
        upload = self._put("a", "voxels")
        self.assertEqual(upload.path.parent, self.root / "uploads")
        self.assertEqual(upload.path.read_text(), "voxels")
        self.assertIs(self.store.get("a", "", ""), upload)
        self.assertEqual(len(list(self.root.glob("src-*"))), 0)

    def test_never_uploaded_is_404_with_the_way_to_send_it(self):
        status, message = self._status("a")
        self.assertEqual(status, 404)
        self.assertEqual(message, "image 'a' is not on this server: upload it again")

    def test_a_new_upload_of_a_key_replaces_the_old_one(self):
        old = self._put("a", "old")
        new = self._put("a", "new")
        self.assertFalse(old.path.exists())
        self.assertNotEqual(old.token, new.token)
        self.assertEqual(self.ended, [old])
        self.assertEqual(self.store.get("a", "", "").path.read_text(), "new")

    def test_the_least_recently_used_is_evicted_with_a_410_that_says_why(self):
        a, _ = self._put("a"), self._put("b")
        self.store.get("a", "", "")  # a is now the most recently used: b goes first
        self._put("c")
        self.assertEqual(len(self.store), 2)
        status, message = self._status("b")
        self.assertEqual(status, 410)
        self.assertIn("evicted", message)
        self.assertIn("--max-sessions", message)
        self.assertTrue(a.path.exists())

    def test_a_client_past_its_share_evicts_its_own_oldest(self):
        store = UploadStore(self.root / "shared", max_images=4, ttl=10.0, clock=self.clock, per_client=1)
        src = [self.root / f"shared-src-{i}" for i in range(3)]
        for path in src:
            path.write_text("x")
        store.put("a1", src[0], "nifti", "ct", "a1", client="10.0.0.1")
        store.put("b1", src[1], "nifti", "ct", "b1", client="10.0.0.2")
        store.put("a2", src[2], "nifti", "ct", "a2", client="10.0.0.1")
        self.assertEqual(len(store), 2)
        store.get("b1", "", "")  # the other client's image stays
        with self.assertRaises(ServeError) as caught:
            store.get("a1", "image 'a1'", "upload it again")
        self.assertEqual(caught.exception.status, 410)
        self.assertIn("--max-sessions-per-client", caught.exception.message)
        store.close()

    def test_expiry_after_ttl_of_disuse(self):
        upload = self._put("a")
        self.clock.now = 10.0
        self.store.get("a", "", "")  # a use keeps it
        self.clock.now = 20.5
        self.assertEqual(self.store.sweep(), 1)
        self.assertFalse(upload.path.exists())
        status, message = self._status("a")
        self.assertEqual(status, 410)
        self.assertIn("--session-ttl", message)

    def test_removing_an_upload_unused_past_the_ttl_is_410_expired(self):
        upload = self._put("a")
        self.clock.now = 10.5  # not swept yet: the answer is the same as get's
        with self.assertRaises(ServeError) as caught:
            self.store.remove("a", "image 'a'", "upload it again")
        self.assertEqual(caught.exception.status, 410)
        self.assertIn("expired", caught.exception.message)
        self.assertEqual(self.ended, [upload])
        self.assertFalse(upload.path.exists())

    def test_expires_in_counts_from_the_last_use(self):
        upload = self._put("a")
        self.assertEqual(self.store.expires_in(upload), 10.0)
        self.clock.now = 4.0
        self.assertEqual(self.store.expires_in(upload), 6.0)
        self.store.get("a", "", "")  # a use starts it again
        self.assertEqual(self.store.expires_in(upload), 10.0)
        self.clock.now = 30.0
        self.assertEqual(self.store.expires_in(upload), 0.0)

    def test_a_file_in_use_outlives_its_end_until_released(self):
        upload = self._put("a")
        with self.store.use("a", "", "") as held:
            self.store.remove("a", "", "")
            self.assertTrue(held.path.exists())
            self.assertEqual(self._status("a")[0], 410)
        self.assertFalse(upload.path.exists())

    def test_count_by_owner_and_close(self):
        self._put((("127.0.0.1", "u1"), "ct"))
        self._put(("session", "s1"))
        self.assertEqual(self.store.count(("127.0.0.1", "u1")), 1)
        self.assertEqual(self.store.count(("127.0.0.1", "u2")), 0)
        self.store.close()
        self.assertFalse((self.root / "uploads").exists())
        self.assertEqual(len(self.ended), 2)


class TestClickSessions(unittest.TestCase):
    def setUp(self):
        self.store = SessionStore(max_sessions=2, ttl=10.0, clock=ManualClock())
        self.clicks = ClickSessions(self.store)

    def test_find_add_and_drop(self):
        key = ("owner", "token", "liver")
        self.assertIsNone(self.clicks.find(key))
        entry = ClickEntry(session=object(), image=None)
        self.clicks.add(key, entry)
        self.assertIs(self.clicks.find(key), entry)
        self.assertEqual(len(self.store), 1)
        self.clicks.drop(key)
        self.assertIsNone(self.clicks.find(key))
        self.assertEqual(len(self.store), 0)

    def test_an_evicted_session_starts_again(self):
        keys = [("o", "t", label) for label in ("liver", "spleen", "aorta")]
        for key in keys:
            self.clicks.add(key, ClickEntry(session=object(), image=None))
        self.assertIsNone(self.clicks.find(keys[0]))  # the store holds two: the first was evicted
        self.assertIsNotNone(self.clicks.find(keys[2]))

    def test_drop_upload_ends_its_sessions_only(self):
        self.clicks.add(("o", "t1", "liver"), ClickEntry(session=object(), image=None))
        self.clicks.add(("o", "t2", "liver"), ClickEntry(session=object(), image=None))
        self.clicks.drop_upload("t1")
        self.assertIsNone(self.clicks.find(("o", "t1", "liver")))
        self.assertIsNotNone(self.clicks.find(("o", "t2", "liver")))

    def test_requests_of_one_key_take_turns(self):
        order = []

        async def request(name: str, key: tuple, hold: float):
            async with self.clicks.serialized(key):
                order.append(f"{name} in")
                await asyncio.sleep(hold)
                order.append(f"{name} out")

        async def main():
            await asyncio.gather(request("a", ("k",), 0.05), request("b", ("k",), 0.0), request("c", ("other",), 0.0))

        asyncio.run(main())
        self.assertLess(order.index("a out"), order.index("b in"))  # same key: one after the other
        self.assertLess(order.index("c out"), order.index("a out"))  # another key does not wait
        self.assertEqual(self.clicks._turns, {})


if __name__ == "__main__":
    unittest.main()
