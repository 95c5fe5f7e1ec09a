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
"""Triton is optional: without it the fused path imports, and its PyTorch reference runs (in a child process whose
imports of ``triton`` fail, as on a machine that has none)."""

from __future__ import annotations

import subprocess
import sys
import unittest

from tests.subprocess_env import ROOT, child_env

CHILD = """
import sys


class NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("no Triton on this machine")


sys.meta_path.insert(0, NoTriton())
import torch

from monai.networks.kernels import unavailable_reason
from monai.networks.kernels.dispatch import FusedConfig
from tests.networks.test_vista3d_fused import build_tiny_vista3d

print(unavailable_reason("cpu"))
net = build_tiny_vista3d().eval()
x = torch.randn(1, 1, 16, 16, 16)
with torch.no_grad():
    expected = net(x, class_vector=torch.tensor([[1], [2]]), transpose=True)
    out = net.fuse(FusedConfig(kernels="torch"))(x, class_vector=torch.tensor([[1], [2]]), transpose=True)
print(float((out - expected).abs().max()))
"""


class TestWithoutTriton(unittest.TestCase):
    def test_fused_reference_runs(self):
        done = subprocess.run(
            [sys.executable, "-c", CHILD], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300
        )
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        reason, max_error = done.stdout.strip().splitlines()[-2:]
        self.assertIn("Triton", reason)  # the kernels say why they do not run
        self.assertLess(float(max_error), 1e-4)


if __name__ == "__main__":
    unittest.main()
