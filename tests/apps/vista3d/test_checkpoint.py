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
import unittest.mock
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

    @parameterized.expand([
        ("nan", torch.float32, float("nan"), True),
        ("inf", torch.float32, float("-inf"), True),
        ("float64 past float32's range", torch.float64, 1e39, True),  # Inf once the network's float32 holds it
        ("finite values whose sum overflows", torch.float32, 3e38, False),
    ])
    def test_non_finite_weights_refused_where_they_land(self, _, dtype, value, refused):
        sd = build_network({"encoder_embed_dim": 8}).state_dict()
        key = "class_head.mlp.0.weight"
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        sd[key] = torch.full_like(sd[key], value)
        devices = [None, torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.pt"
            torch.save(sd, path)
            for device in devices:
                if not refused:
                    net = network_from_checkpoint(path, {"encoder_embed_dim": 8}, device)
                    self.assertEqual(net.class_head.mlp[0].weight.device.type, (device or torch.device("cpu")).type)
                    continue
                with self.assertRaises(CheckpointError, msg=str(device)) as ctx:
                    network_from_checkpoint(path, {"encoder_embed_dim": 8}, device)
                self.assertIn(f"holds NaN or Inf weights in 1 tensor(s): {key}; it is damaged", str(ctx.exception))

    @unittest.skipUnless(torch.cuda.is_available(), "the weights' check on the GPU needs CUDA")
    def test_weights_checked_on_the_gpu_they_were_copied_to(self):
        from monai.apps.vista3d.core import checkpoint

        seen = []
        original = checkpoint._check_finite

        def record(sd, path):
            seen.extend({v.device.type for v in sd.values()})
            return original(sd, path)

        with tempfile.TemporaryDirectory() as tmp, unittest.mock.patch.object(checkpoint, "_check_finite", record):
            path = Path(tmp) / "model.pt"
            torch.save(build_network({"encoder_embed_dim": 8}).state_dict(), path)
            net = network_from_checkpoint(path, {"encoder_embed_dim": 8}, torch.device("cuda"))
        self.assertEqual(set(seen), {"cuda"})
        self.assertTrue(all(p.is_cuda for p in net.parameters()))

    def test_meta_build_draws_nothing(self):
        """Counting weights or taking a checkpoint's tensors builds on the meta device; drawing random values there
        imports sympy and dynamo (about a second of a fresh process), so the build must not."""
        code = ("import sys, torch\nfrom monai.networks.nets import vista3d132\nwith torch.device('meta'):\n"
                "    vista3d132(encoder_embed_dim=8)\nprint(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), "[]")


if __name__ == "__main__":
    unittest.main()
