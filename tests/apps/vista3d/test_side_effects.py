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
"""Library calls leave the process as they found it: umask, RNG states, cuDNN and precision flags, environment,
threads, import hooks and global handlers (``tests.process_state``); only ``__main__`` may change them. Importing
is covered by tests/test_import_side_effects.py."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.cli.phantom import write_phantom
from tests.apps.vista3d.stub_vista import stub_job
from tests.process_state import process_state


class TestNoProcessWideChanges(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.inputs = [write_phantom(self.tmp / f"ct{i}.nii.gz", (24, 20, 16), seed=i) for i in range(2)]

    def test_run_batch(self):
        job = stub_job([1, 20])
        before = process_state()
        forbidden = {
            "umask": mock.patch.object(os, "umask", side_effect=AssertionError("os.umask")),
            "seed": mock.patch.object(torch, "manual_seed", side_effect=AssertionError("torch.manual_seed")),
            "device": mock.patch.object(torch.cuda, "set_device", side_effect=AssertionError("set_device")),
            "peak": mock.patch.object(torch.cuda, "reset_peak_memory_stats", side_effect=AssertionError("reset")),
        }
        for patch in forbidden.values():
            patch.start()
            self.addCleanup(patch.stop)
        result = run_batch(self.inputs, self.tmp / "out", job)
        self.assertEqual((result.exit_code, len(result.records)), (0, 2))
        after = process_state()
        for key in before:
            self.assertEqual(after[key], before[key], f"run_batch changed the process's {key}")


if __name__ == "__main__":
    unittest.main()
