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

import unittest

import torch
from parameterized import parameterized

from monai.networks.kernels import unavailable_reason
from monai.networks.kernels.class_product import norm_act_product, norm_act_product_reference
from monai.networks.kernels.instance_norm import NormAct, instance_stats
from tests.networks.kernels.test_conv3d import DEVICE, _channels_last


@unittest.skipUnless(
    unavailable_reason(DEVICE) is None, f"the fused kernels do not run here: {unavailable_reason(DEVICE)}"
)
class TestNormActProduct(unittest.TestCase):
    # (batch, stored, real channels, classes, D, H, W, activation, residual, affine, statistics given): VISTA3D's 117
    # classes (one masked block of 128), more classes than a block, voxels a program does not fill, NaN in the
    # padding channels (never read)
    @parameterized.expand(
        [
            (2, 64, 48, 117, 3, 5, 7, "leakyrelu", True, True, True),
            (1, 64, 64, 200, 2, 4, 5, "relu", False, False, False),
            (1, 128, 96, 5, 2, 3, 3, "none", True, False, True),
        ]
    )
    def test_equals_the_norm_then_the_product(self, batch, c, real, k, d, h, w, act, residual, affine, given):
        g = torch.Generator().manual_seed(c + k)
        x = torch.randn(batch, c, d, h, w, generator=g)
        x[:, real:] = 0
        clean = _channels_last(x)
        x[:, real:] = float("nan")
        x = _channels_last(x)
        res = None
        if residual:
            res = torch.randn(batch, c, d, h, w, generator=g)
            res[:, real:] = 0
            res = _channels_last(res)
        weight = bias = None
        if affine:
            weight, bias = torch.randn(c, generator=g).to(DEVICE), torch.randn(c, generator=g).to(DEVICE)
            weight[real:] = 0
            bias[real:] = 0
        emb = torch.randn(k, c, generator=g)
        emb[:, real:] = 0
        emb = emb.half().to(DEVICE)
        spec = NormAct(act=act)
        stats = instance_stats(clean) if given else None
        out = norm_act_product(x, weight, bias, spec, emb, residual=res, real_channels=real, stats=stats)
        ref = norm_act_product_reference(
            clean.double(), weight, bias, spec, emb.double(), None if res is None else res.double(), real
        )
        self.assertEqual((out.dtype, tuple(out.shape)), (torch.float16, (batch, k, d * h * w)))
        self.assertFalse(out.isnan().any())
        self.assertLess(((out.double() - ref).norm() / ref.norm()).item(), 2e-3)  # fp16 features and logits

    def test_rejects_bad_inputs(self):
        x = _channels_last(torch.randn(1, 64, 2, 2, 2))
        emb = torch.zeros(3, 64, dtype=torch.float16, device=DEVICE)
        spec = NormAct()
        with self.assertRaisesRegex(ValueError, "64 or 128"):
            norm_act_product(_channels_last(torch.randn(1, 32, 2, 2, 2)), None, None, spec, emb[:, :32])
        with self.assertRaisesRegex(ValueError, r"fp16 class embeddings \[K, 64\]"):
            norm_act_product(x, None, None, spec, emb.float())
        with self.assertRaisesRegex(ValueError, "residual shape"):
            norm_act_product(x, None, None, spec, emb, residual=_channels_last(torch.randn(1, 64, 2, 2, 3)))
        with self.assertRaisesRegex(ValueError, "weight and bias"):
            norm_act_product(x, torch.ones(64, device=DEVICE), None, spec, emb)
        with self.assertRaisesRegex(ValueError, "channels-last"):
            norm_act_product(x.contiguous(), None, None, spec, emb)


if __name__ == "__main__":
    unittest.main()
