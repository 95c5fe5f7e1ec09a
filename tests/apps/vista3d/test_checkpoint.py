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
"""Loading VISTA3D checkpoints: strict, with the mismatching keys and shapes named."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import torch
from parameterized import parameterized

from monai.apps.vista3d.core.checkpoint import (
    build_network,
    load_checkpoint,
    network_from_checkpoint,
)
from monai.apps.vista3d.errors import CheckpointError
from tests.subprocess_env import child_env


class TestLoadCheckpoint(unittest.TestCase):
    def test_checkpoint_mismatch(self):
        from monai.networks.nets import vista3d132

        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            small = vista3d132(encoder_embed_dim=8)
            sd = small.state_dict()
            path = Path(tmp) / "model.pt"
            torch.save(sd, path)
            other = vista3d132(encoder_embed_dim=16)
            with self.assertRaisesRegex(CheckpointError, "encoder_embed_dim=8, the network was built with 16; set "
                                        "encoder_embed_dim=8"):
                load_checkpoint(other, path)
            sd.pop(next(iter(sd)))
            sd["extra.weight"] = torch.zeros(1)
            torch.save(sd, path)
            with self.assertRaisesRegex(CheckpointError, "1 missing keys: .*1 unexpected keys: extra.weight"):
                load_checkpoint(vista3d132(encoder_embed_dim=8), path)
            # the DataParallel prefix and a {"state_dict": ...} wrapper are accepted
            torch.save({"state_dict": {f"module.{k}": v for k, v in small.state_dict().items()}}, path)
            net = load_checkpoint(vista3d132(encoder_embed_dim=8), path)
            torch.testing.assert_close(net.state_dict(), small.state_dict())
            path.write_bytes(b"not a checkpoint")
            with self.assertRaisesRegex(CheckpointError, "is a text file, not a checkpoint; expected a VISTA3D state"):
                load_checkpoint(net, path)


class TestNetworkFromCheckpoint(unittest.TestCase):
    @parameterized.expand([("zip", True, torch.float32), ("legacy", False, torch.float32), ("half", True, torch.float16)])
    def test_same_network_as_build_then_load(self, _, zipped, dtype):
        torch.manual_seed(1)
        reference = build_network({"encoder_embed_dim": 8})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.pt"
            torch.save({k: v.to(dtype) for k, v in reference.state_dict().items()}, path,
                       _use_new_zipfile_serialization=zipped)
            loaded = load_checkpoint(build_network({"encoder_embed_dim": 8}), path)
            net = network_from_checkpoint(path, {"encoder_embed_dim": 8})
        self.assertFalse(net.training)
        got, want = net.state_dict(), loaded.state_dict()
        self.assertEqual(list(got), list(want))
        for k in want:  # a float16 file still gives the float32 network that load_state_dict's copy gives
            self.assertEqual(got[k].dtype, want[k].dtype, k)
            self.assertTrue(torch.equal(got[k], want[k]), k)
        self.assertFalse(any(t.is_meta for t in [*net.parameters(), *net.buffers()]))

    def test_mismatch_named_as_load_checkpoint_does(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.pt"
            torch.save(build_network({"encoder_embed_dim": 8}).state_dict(), path)
            with self.assertRaisesRegex(CheckpointError, "encoder_embed_dim=8, the network was built with 16"):
                network_from_checkpoint(path, {"encoder_embed_dim": 16})

    def test_meta_build_draws_nothing(self):
        """Counting weights or taking a checkpoint's tensors builds on the meta device; drawing random values there
        imports sympy and dynamo (about a second of a fresh process), so the build must not."""
        code = ("import sys, torch\nfrom monai.networks.nets import vista3d132\nwith torch.device('meta'):\n"
                "    vista3d132(encoder_embed_dim=8)\nprint(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), "[]")


if __name__ == "__main__":
    unittest.main()
