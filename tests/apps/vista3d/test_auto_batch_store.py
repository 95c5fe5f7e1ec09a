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
"""``sw_batch_size="auto"``'s window costs kept on disk: a later "process" (new passes, network and store over the
same file) chooses its batch without the one-window probe; on a mocked GPU whose windows cost 1 GB each."""

from __future__ import annotations

import json
import os
import tempfile
import unittest
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import torch

import monai.inferers.batch_size as bsz
from monai.apps.vista3d.core.auto_batch_store import STORE_NAME, AutoBatchStore
from monai.apps.vista3d.core.preprocess import preprocess_like_bundle
from monai.apps.vista3d.core.window_pass import PassSettings, WindowPasses
from tests.apps.vista3d.stub_vista import HU, StubVista, phantom

GB = 2**30


class _Memory:
    """20 of 40 GB available; each window of the running call costs 1 GB."""

    windows_in_call = 0

    def __init__(self, device):
        self.device = device

    def available(self):
        return 20 * GB, 40 * GB

    def start_peak(self):
        return 0

    def peak(self):
        return _Memory.windows_in_call * GB


class _MeteredVista(StubVista):
    def forward(self, input_images, *args, **kwargs):
        _Memory.windows_in_call = int(input_images.shape[0])
        return super().forward(input_images, *args, **kwargs)


def _image() -> torch.Tensor:
    img, aff, _ = phantom((40, 38, 30), np.eye(3), (1.5, 1.5, 1.5))
    return preprocess_like_bundle(torch.from_numpy(img)[None], aff)[0]


class TestAutoBatchStore(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.path = Path(tmp.name) / "kernels" / STORE_NAME
        for p in (mock.patch.object(bsz, "_is_cuda", lambda device: True),
                  mock.patch.object(bsz, "_CudaMemory", _Memory)):
            p.start()
            self.addCleanup(p.stop)
        self.x = _image()

    def _process(self, path: Path | None = None, amp: bool = False) -> WindowPasses:
        """What a new process builds: a network, its passes and a store over the file (and its peak memory: 0)."""
        _Memory.windows_in_call = 0
        settings = PassSettings((16, 16, 16), overlap=0.25, sw_batch_size="auto", amp=amp, progress=False,
                                timing=False)
        return WindowPasses(_MeteredVista(HU), torch.device("cpu"), settings, AutoBatchStore(path or self.path))

    def _streamed_batches(self, passes: WindowPasses, classes=(1, 3)) -> list[int]:
        passes.stream(self.x, list(classes), masks=False)
        return list(passes.counting.batches)

    def test_a_later_process_skips_the_probe(self):
        first = self._streamed_batches(self._process())
        self.assertEqual(first[0], 1)  # the probe
        self.assertGreater(max(first), 1)
        self.assertTrue(self.path.is_file())
        later = self._process()
        second = self._streamed_batches(later)
        self.assertEqual(sum(second), sum(first))
        self.assertGreater(second[0], 1)  # no probe: the first call is a full batch
        self.assertEqual(max(second), max(first))
        labels_first, _, _ = self._process().stream(self.x, [1, 3], masks=False)
        labels_later, _, _ = later.stream(self.x, [1, 3], masks=False)
        torch.testing.assert_close(labels_first, labels_later)

    def test_full_logits_path_is_kept_too(self):
        self._process().logits(self.x, [1, 3])
        later = self._process()
        later.logits(self.x, [1, 3])
        self.assertGreater(later.counting.batches[0], 1)

    def test_what_a_cost_depends_on(self):
        self._streamed_batches(self._process())
        for other in (dict(amp=True), dict(classes=(1, 3, 5))):
            passes = self._process(amp=other.get("amp", False))
            batches = self._streamed_batches(passes, other.get("classes", (1, 3)))
            self.assertEqual(batches[0], 1, other)  # probed again: another precision, another class count
        self.assertEqual(len(json.loads(self.path.read_text())["costs"]), 3)

    def test_a_bounded_probe_is_not_stored(self):
        passes = self._process()
        _Memory.windows_in_call = 50  # a peak of the caller's before the probe: it only bounds the window's cost
        self.assertEqual(self._streamed_batches(passes)[0], 1)
        self.assertEqual(AutoBatchStore(self.path).load(), {})
        self.assertEqual(self._streamed_batches(self._process())[0], 1)  # so a later process measures it again
        self.assertEqual(len(AutoBatchStore(self.path).load()), 1)

    def test_only_costs_are_stored(self):
        self._streamed_batches(self._process())
        doc = json.loads(self.path.read_text())
        self.assertEqual(doc["format"], 1)
        for key, cost in doc["costs"].items():
            self.assertTrue(key.startswith("(('named', '_MeteredVista'"), key)  # no object of a process, no batch
            self.assertEqual(set(cost), {"window_bytes", "result_bytes_per_voxel", "exact"})
            self.assertEqual(cost["window_bytes"], bsz.SAFETY_FACTOR * GB)

    def test_two_processes_keep_both_costs(self):
        a, b = self._process(), self._process()
        self._streamed_batches(a, (1,))
        _Memory.windows_in_call = 0  # b's own peak memory, as another process has
        self._streamed_batches(b, (1, 3))  # b loaded the file before a wrote it: it merges, it does not overwrite
        self.assertEqual(len(AutoBatchStore(self.path).load()), 2)

    def test_damaged_file_said_once_and_written_anew(self):
        self.path.parent.mkdir(parents=True)
        for text in ("{not json", '{"format": 99, "costs": {}}', '{"format": 1, "costs": {"os.system(1)": {}}}'):
            self.path.write_text(text)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                passes = self._process()
                self.assertEqual(self._streamed_batches(passes)[0], 1)
                passes.stream(self.x, [1, 3], masks=False)
            said = [str(w.message) for w in caught if "sw_batch_size='auto'" in str(w.message)]
            self.assertEqual(len(said), 1, said)
            self.assertIn("is not a store of window costs", said[0])
            self.assertEqual(len(AutoBatchStore(self.path).load()), 1)  # written anew by the pass

    def test_unwritable_folder_costs_a_probe_not_the_run(self):
        self.path.parent.parent.mkdir(parents=True, exist_ok=True)
        self.path.parent.write_text("a file where the kernel cache folder would be")  # no user can write in it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            labels, _, _ = self._process().stream(self.x, [1, 3], masks=False)
        said = [str(w.message) for w in caught if "sw_batch_size='auto'" in str(w.message)]
        self.assertEqual(len(said), 1, said)
        self.assertIn("A later run measures its window batch again", said[0])
        self.assertTrue(self.path.parent.is_file())
        self.assertTrue(set(torch.unique(labels).tolist()) >= {1, 3})

    def test_without_a_store_nothing_is_written(self):
        settings = PassSettings((16, 16, 16), overlap=0.25, sw_batch_size="auto", amp=False, progress=False,
                                timing=False)
        passes = WindowPasses(_MeteredVista(HU), torch.device("cpu"), settings)
        self.assertIsNone(passes.counting.auto_batch_key)
        passes.stream(self.x, [1, 3], masks=False)
        self.assertFalse(self.path.parent.exists())

    def test_in_kernel_cache(self):
        with mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": str(self.path.parent)}):
            self.assertEqual(AutoBatchStore.in_kernel_cache().path, self.path)


@unittest.skipUnless(torch.cuda.is_available(), "the pipeline keeps the costs on CUDA only: needs a CUDA GPU")
class TestPipelineOnGpu(unittest.TestCase):
    def test_a_second_pipeline_does_not_probe(self):
        from monai.apps.vista3d.core.pipeline import Vista3DPipeline
        from tests.networks.tiny_vista3d import build_tiny_vista3d

        with tempfile.TemporaryDirectory() as folder, mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": folder}):
            img, aff, _ = phantom((80, 76, 60), np.eye(3), (1.5, 1.5, 1.5))  # 18 windows of 32
            batches = []
            for _ in range(2):
                pipe = Vista3DPipeline(build_tiny_vista3d(), device="cuda", sw_batch_size="auto", roi_size=32,
                                       warn_random=False, fuse=False)
                torch.cuda.reset_peak_memory_stats()  # as in a new process: the earlier tests' peaks bound no probe
                pipe.segment(torch.from_numpy(img), aff, classes=[1, 3])
                batches.append(list(pipe._passes.counting.batches))
            self.assertTrue((Path(folder) / STORE_NAME).is_file())
            self.assertEqual(batches[0][0], 1)
            self.assertNotEqual(batches[1][:1], [1])


if __name__ == "__main__":
    unittest.main()
