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

import os
import threading
import types
import unittest
from unittest import mock

import monai.utils.triton_support as triton_support


def _triton_with_key(key) -> types.SimpleNamespace:
    """A stand-in for the ``triton`` module with ``runtime.cache.triton_key``."""
    return types.SimpleNamespace(runtime=types.SimpleNamespace(cache=types.SimpleNamespace(triton_key=key)))


class TestPrefetchCacheKey(unittest.TestCase):
    def setUp(self):
        # each test starts in a process that has started no hash (the module keeps its one thread)
        patcher = mock.patch.object(triton_support, "_cache_key_thread", None)
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_hashes_on_a_daemon_thread(self):
        seen = []
        fake = _triton_with_key(lambda: seen.append(threading.current_thread().name))
        with mock.patch.object(triton_support, "triton", fake), mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
            thread = triton_support.prefetch_cache_key()
        self.assertIsNotNone(thread)
        thread.join(10)
        self.assertTrue(thread.daemon)  # never holds the process's exit
        self.assertEqual(seen, ["triton-cache-key"])

    def test_nothing_without_triton(self):
        with mock.patch.object(triton_support, "triton", None):
            self.assertIsNone(triton_support.prefetch_cache_key())

    def test_nothing_where_triton_has_no_key(self):  # another Triton layout: no hash to move, nothing started
        with mock.patch.object(triton_support, "triton", types.SimpleNamespace(runtime=None)):
            self.assertIsNone(triton_support.prefetch_cache_key())

    def test_nothing_under_the_interpreter(self):  # the interpreter looks up no compiled kernels
        fake = _triton_with_key(lambda: self.fail("hashed under the interpreter"))
        with mock.patch.object(triton_support, "triton", fake), mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}):
            self.assertIsNone(triton_support.prefetch_cache_key())

    def test_one_hash_per_process(self):
        # the command starts the hash as early as it can, the network's loader asks again: one thread, one hash
        release, hashed = threading.Event(), []
        fake = _triton_with_key(lambda: release.wait(10) and hashed.append(1))
        with mock.patch.object(triton_support, "triton", fake), mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
            first = triton_support.prefetch_cache_key()
            second = triton_support.prefetch_cache_key()
            release.set()
            first.join(10)
            self.assertIs(triton_support.prefetch_cache_key(), first)  # a finished hash is not started again
        self.assertIs(first, second)
        self.assertEqual(hashed, [1])

    def test_wait_returns_once_the_hash_is_done(self):
        release, hashed = threading.Event(), []
        fake = _triton_with_key(lambda: release.wait(10) and hashed.append(1))
        with mock.patch.object(triton_support, "triton", fake), mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
            triton_support.prefetch_cache_key()
            threading.Timer(0.2, release.set).start()
            triton_support.wait_for_cache_key()
        self.assertEqual(hashed, [1])  # not before the hash was kept

    def test_wait_without_a_hash_started(self):
        triton_support.wait_for_cache_key()  # nothing to wait for: returns at once
        self.assertIsNone(triton_support._cache_key_thread)


if __name__ == "__main__":
    unittest.main()
