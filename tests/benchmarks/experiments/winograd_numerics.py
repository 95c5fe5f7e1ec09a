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
"""How far Winograd's F(2, 3) moves a 48 -> 48 channel 3x3x3 convolution in fp16 (issue 50, item 4; CPU, not on any
path).

A direct convolution on tensor cores multiplies fp16 operands, sums in fp32 and stores fp16. Winograd's F(2, 3) does
8 products where the direct form does 27 (in 3D) but rounds its transformed inputs and weights to fp16 before the
products. This emulates both roundings in float64 (the products of fp16 values are exact, the fp32 sum nearly so) and
prints each form's relative error against float64 of the same fp16 inputs: direct, F(2, 3) along the columns only,
and F(2, 3) in all three dimensions::

    python tests/benchmarks/experiments/winograd_numerics.py --size 32

Measured (1 x 48 x 32^3, leaky-ReLU inputs): 2.1e-4, 4.1e-4 and 6.1e-4. Usable numbers, not pursued: on Hopper the
transforms, not the products, would set the pace. Each of the 64 points is its own [voxels, 48] x [48, 48] product
with its own accumulator; the output transform adds each into ~3.4 of 8 outputs on the FP32 units (1/15 of the tensor
cores' rate) and the input transform reads 8 inputs per point: per warpgroup ~200 instructions a point against ~50 ns
of its products, where the resident kernel keeps its 27 taps' sums in one accumulator on the tensor cores.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

# F(2, 3): input transform B^T (4 x 4), weight transform G (4 x 3), output transform A^T (2 x 4)
_BT = torch.tensor([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=torch.float64)
_G = torch.tensor([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=torch.float64)
_AT = torch.tensor([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=torch.float64)


def _fp16(t: torch.Tensor) -> torch.Tensor:
    return t.half().double()


def _fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float().double()


def direct(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _fp16(_fp32(F.conv3d(x, w, padding=1)))


def winograd_columns(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F(2, 3) along the last dimension, the other two taps summed directly (one accumulator per point)."""
    size = x.shape[-1]
    xp = F.pad(x, (1, 1, 1, 1, 1, 1))
    tiles = xp.unfold(4, 4, 2)  # [B, C, D + 2, H + 2, size / 2, 4]
    v = _fp16(tiles @ _BT.T)
    u = _fp16(torch.einsum("oidhk,xk->oidhx", w, _G))
    m = 0
    for kd in range(3):
        for kh in range(3):
            m = m + torch.einsum("bidhtx,oix->bodhtx", v[:, :, kd : kd + size, kh : kh + size], u[:, :, kd, kh])
    return _fp16((_fp32(m) @ _AT.T).flatten(-2))


def winograd_3d(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F(2, 3) in all three dimensions: 64 points, one product each, per 2 x 2 x 2 outputs."""
    b, c, size = x.shape[0], w.shape[0], x.shape[-1]
    tiles = F.pad(x, (1, 1, 1, 1, 1, 1)).unfold(2, 4, 2).unfold(3, 4, 2).unfold(4, 4, 2)
    v = _fp16(torch.einsum("bctuvijk,xi,yj,zk->bctuvxyz", tiles, _BT, _BT, _BT))
    u = _fp16(torch.einsum("oiabc,xa,yb,zc->oixyz", w, _G, _G, _G))
    m = _fp32(torch.einsum("bituvxyz,oixyz->botuvxyz", v, u))
    out = torch.einsum("botuvxyz,px,qy,rz->botuvpqr", m, _AT, _AT, _AT)
    return _fp16(out.permute(0, 1, 2, 5, 3, 6, 4, 7).reshape(b, c, size, size, size))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=32, help="the volume's edge (even)")
    p.add_argument("--channels", type=int, default=48)
    a = p.parse_args()
    g = torch.Generator().manual_seed(0)
    c = a.channels
    x = _fp16(F.leaky_relu(torch.randn(1, c, a.size, a.size, a.size, generator=g, dtype=torch.float64), 0.01))
    w = _fp16(torch.randn(c, c, 3, 3, 3, generator=g, dtype=torch.float64) * (2 / (27 * c)) ** 0.5)
    ref = F.conv3d(x, w, padding=1)
    for name, form in (("direct", direct), ("F(2,3) along W", winograd_columns), ("F(2,3)^3", winograd_3d)):
        y = form(x, w)
        print(f"{name:16s} relative error {((y - ref).norm() / ref.norm()).item():.2e}")


if __name__ == "__main__":
    main()
