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

import tempfile
import unittest
from pathlib import Path

import torch

from monai.apps.vista3d.checkpoint import load_checkpoint
from monai.apps.vista3d.errors import CheckpointError


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


if __name__ == "__main__":
    unittest.main()
