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

from __future__ import annotations

import json
import os
import tempfile
import threading
import types
import unittest
from unittest import mock

import triton
import triton.runtime.cache
from parameterized import parameterized

import monai.utils.triton_cache_key as triton_cache_key

_REAL_TRITON_KEY = triton.runtime.cache.triton_key  # as Triton defines it, before any test replaces it


def _triton_with_key(key) -> types.SimpleNamespace:
    """A stand-in for the ``triton`` module with ``runtime.cache.triton_key``."""
    return types.SimpleNamespace(runtime=types.SimpleNamespace(cache=types.SimpleNamespace(triton_key=key)))


class TestPrefetchCacheKey(unittest.TestCase):
    def setUp(self):
        # each test starts in a process that has started no hash (the module keeps its one thread), and the thread
        # finds the key of the stand-in Triton a test gives (its triton_key), with no file
        body = lambda: triton_cache_key.triton.runtime.cache.triton_key()  # noqa: E731
        for name, value in [("_cache_key_thread", None), ("known_triton_key", body)]:
            patcher = mock.patch.object(triton_cache_key, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)

    def test_hashes_on_a_daemon_thread(self):
        seen = []
        fake = _triton_with_key(lambda: seen.append(threading.current_thread().name))
        with mock.patch.object(triton_cache_key, "triton", fake), \
                mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
            thread = triton_cache_key.prefetch_cache_key()
        self.assertIsNotNone(thread)
        thread.join(10)
        self.assertTrue(thread.daemon)  # never holds the process's exit
        self.assertEqual(seen, ["triton-cache-key"])

    def test_nothing_without_triton(self):
        with mock.patch.object(triton_cache_key, "triton", None):
            self.assertIsNone(triton_cache_key.prefetch_cache_key())

    def test_nothing_where_triton_has_no_key(self):  # another Triton layout: no hash to move, nothing started
        with mock.patch.object(triton_cache_key, "triton", types.SimpleNamespace(runtime=None)):
            self.assertIsNone(triton_cache_key.prefetch_cache_key())

    def test_nothing_under_the_interpreter(self):  # the interpreter looks up no compiled kernels
        fake = _triton_with_key(lambda: self.fail("hashed under the interpreter"))
        with mock.patch.object(triton_cache_key, "triton", fake), \
                mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}):
            self.assertIsNone(triton_cache_key.prefetch_cache_key())

    def test_one_hash_per_process(self):
        # the command starts the hash as early as it can, the network's loader asks again: one thread, one hash
        release, hashed = threading.Event(), []
        fake = _triton_with_key(lambda: release.wait(10) and hashed.append(1))
        with mock.patch.object(triton_cache_key, "triton", fake), \
                mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
            first = triton_cache_key.prefetch_cache_key()
            second = triton_cache_key.prefetch_cache_key()
            release.set()
            first.join(10)
            self.assertIs(triton_cache_key.prefetch_cache_key(), first)  # a finished hash is not started again
        self.assertIs(first, second)
        self.assertEqual(hashed, [1])

    def test_wait_returns_once_the_hash_is_done(self):
        release, hashed = threading.Event(), []
        fake = _triton_with_key(lambda: release.wait(10) and hashed.append(1))
        with mock.patch.object(triton_cache_key, "triton", fake), \
                mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
            triton_cache_key.prefetch_cache_key()
            threading.Timer(0.2, release.set).start()
            triton_cache_key.wait_for_cache_key()
        self.assertEqual(hashed, [1])  # not before the hash was kept

    def test_wait_without_a_hash_started(self):
        triton_cache_key.wait_for_cache_key()  # nothing to wait for: returns at once
        self.assertIsNone(triton_cache_key._cache_key_thread)


class TestKnownTritonKey(unittest.TestCase):
    """The key kept in the kernel cache folder: taken where this install's stamp is on file, computed otherwise."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.folder = tmp.name
        self.computed = []
        # Triton's own hash of itself (0.9 s here) stands in as a counted call; restored after each test, since a
        # key taken from the file replaces it for the process
        patcher = mock.patch.object(triton.runtime.cache, "triton_key", self._compute)
        patcher.start()
        self.addCleanup(patcher.stop)

    def _compute(self) -> str:
        self.computed.append(1)
        return f"{triton.__version__}-key-{len(self.computed)}"

    def test_computed_once_then_taken_from_the_file(self):
        first = triton_cache_key.known_triton_key(self.folder)
        self.assertEqual(self.computed, [1])
        self.assertTrue(os.path.isfile(os.path.join(self.folder, triton_cache_key.KEY_FILE)))
        with mock.patch.object(triton.runtime.cache, "triton_key", lambda: self.fail("hashed again")):
            self.assertEqual(triton_cache_key.known_triton_key(self.folder), first)
            self.assertEqual(triton.runtime.cache.triton_key(), first)  # the process's key from then on

    def test_a_changed_install_is_hashed_again(self):
        first = triton_cache_key.known_triton_key(self.folder)
        root = os.path.dirname(os.path.dirname(os.path.abspath(triton.runtime.cache.__file__)))
        with mock.patch.object(os, "stat", _stat_touching(os.path.join(root, "runtime", "cache.py"))):
            second = triton_cache_key.known_triton_key(self.folder)
        self.assertEqual(len(self.computed), 2)
        self.assertNotEqual(first, second)
        # both installs keep their key (two environments sharing one cache folder)
        with open(os.path.join(self.folder, triton_cache_key.KEY_FILE)) as f:
            self.assertEqual(sorted(json.load(f)["keys"].values()), sorted([first, second]))

    @parameterized.expand([("damaged", "{not json"), ("another format", '{"format": 99, "keys": {}}'),
                           ("not a mapping", '{"format": 1, "keys": [1, 2]}')])
    def test_an_unreadable_file_is_written_anew(self, _, text):
        with open(os.path.join(self.folder, triton_cache_key.KEY_FILE), "w") as f:
            f.write(text)
        key = triton_cache_key.known_triton_key(self.folder)
        self.assertEqual(self.computed, [1])
        with open(os.path.join(self.folder, triton_cache_key.KEY_FILE)) as f:
            self.assertEqual(list(json.load(f)["keys"].values()), [key])

    def test_an_unwritable_folder_keeps_nothing(self):
        blocked = os.path.join(self.folder, "a file")
        open(blocked, "w").close()  # a file where the folder would be: nothing can be made in it
        key = triton_cache_key.known_triton_key(os.path.join(blocked, "cache"))
        self.assertEqual(key, f"{triton.__version__}-key-1")
        again = triton_cache_key.known_triton_key(os.path.join(blocked, "cache"))
        self.assertEqual(again, f"{triton.__version__}-key-2")

    def test_the_stamp_covers_every_file_triton_hashes(self):
        # Triton's real hash, with each file it opens recorded: each must be one the stamp follows
        opened, real_open = [], open

        def recording_open(file, *args, **kwargs):
            opened.append(os.path.abspath(file))
            return real_open(file, *args, **kwargs)

        root = os.path.dirname(os.path.dirname(os.path.abspath(triton.runtime.cache.__file__)))
        hash_itself = getattr(_REAL_TRITON_KEY, "__wrapped__", _REAL_TRITON_KEY)  # past its per-process cache
        with mock.patch("builtins.open", recording_open):
            hash_itself()
        self.assertGreater(len(opened), 5)
        self.assertEqual(set(opened) - set(triton_cache_key._hashed_files(root)), set())


def _stat_touching(path: str):
    """``os.stat`` as if ``path`` had been written a second later."""
    real_stat = os.stat

    def stat(p, *args, **kwargs):
        st = real_stat(p, *args, **kwargs)
        if os.path.abspath(p) == path:
            return types.SimpleNamespace(st_size=st.st_size, st_mtime_ns=st.st_mtime_ns + 10**9, st_ino=st.st_ino)
        return st

    return stat


if __name__ == "__main__":
    unittest.main()
