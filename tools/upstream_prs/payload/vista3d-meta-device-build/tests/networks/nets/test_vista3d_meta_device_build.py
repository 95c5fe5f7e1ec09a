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
import subprocess
import sys
import unittest
from unittest import mock

import torch
from parameterized import parameterized

from monai.networks.nets.vista3d import ClassMappingClassify, PointMappingSAM, PositionEmbeddingRandom, vista3d132

# a fresh process: after importing the network's module, nothing of sympy or dynamo is loaded yet; building
# VISTA3D on the meta device must not load them (torch's meta-device random functions would)
FRESH_BUILD = """
import sys, torch
from monai.networks.nets.vista3d import vista3d132
before = [m for m in ("sympy", "torch._dynamo") if m in sys.modules]
with torch.device("meta"):
    net = vista3d132()
after = [m for m in ("sympy", "torch._dynamo") if m in sys.modules]
print(before, after, all(p.is_meta for p in net.parameters()))
"""


class TestMetaDeviceBuild(unittest.TestCase):
    def test_fresh_process_meta_build_loads_no_sympy(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run([sys.executable, "-c", FRESH_BUILD], capture_output=True, text=True, env=env, check=True)
        self.assertEqual(out.stdout.strip().splitlines()[-1], "[] [] True")

    @parameterized.expand(
        [
            (PointMappingSAM, {"feature_size": 8, "n_classes": 6}),
            (ClassMappingClassify, {"n_classes": 6, "feature_size": 8, "use_mlp": True}),
            (vista3d132, {"encoder_embed_dim": 8}),
        ]
    )
    def test_seeded_build_draws_as_plain_embeddings(self, build, kwargs):
        torch.manual_seed(3)
        new = build(**kwargs).state_dict()
        with mock.patch("monai.networks.nets.vista3d._normal_embedding", lambda n, d: torch.nn.Embedding(n, d)):
            torch.manual_seed(3)
            plain = build(**kwargs).state_dict()
        self.assertEqual(list(new), list(plain))
        for name in new:
            self.assertTrue(torch.equal(new[name], plain[name]), name)

    def test_positional_frequencies_drawn_as_before(self):
        torch.manual_seed(7)
        expected = 2.0 * torch.randn((3, 4))
        torch.manual_seed(7)
        positional = PositionEmbeddingRandom(num_pos_feats=4, scale=2.0)
        self.assertTrue(torch.equal(positional.positional_encoding_gaussian_matrix, expected))

    def test_meta_network_takes_a_checkpoints_tensors(self):
        torch.manual_seed(0)
        source = vista3d132(encoder_embed_dim=8)
        with torch.device("meta"):
            net = vista3d132(encoder_embed_dim=8)
        net.load_state_dict(source.state_dict(), assign=True)
        for (name, a), (_, b) in zip(source.state_dict().items(), net.state_dict().items()):
            self.assertTrue(torch.equal(a, b), name)
        with torch.device("meta"):
            position = PositionEmbeddingRandom(num_pos_feats=4)
        self.assertTrue(position.positional_encoding_gaussian_matrix.is_meta)


if __name__ == "__main__":
    unittest.main()
