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
"""How close the norm's apply pass comes to the memory's bandwidth, by launch (issue 50, item 4; not on any path).

At 14 windows the fused forward spends ~1.95 ms a window in ``norm_act``'s apply kernel (H100), a pass that only
moves memory: it reads the real channels (48 of 64, 96 of 128), the residual where there is one, and writes the
real channels. This times the apply at the forward's two widest shapes, in place and with a residual, for several
``(block_s, num_warps)``, and prints the bytes it moves per second; the default is ``(128, 4)``. A launch that
moves more per second is worth its place in ``norm_act``'s defaults (or a per-width table)::

    python tests/benchmarks/experiments/apply_bandwidth.py --batch 14
"""

from __future__ import annotations

import argparse
import itertools

import torch

from monai.networks.kernels.instance_norm import NormAct, instance_stats, norm_act

_LAUNCHES = [(64, 4), (128, 4), (128, 8), (256, 4), (256, 8), (512, 8)]


def _ms(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=14)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cuda")
    spec = NormAct(act="leakyrelu")
    print(f"norm_act's apply, {a.batch} windows; GB/s of the real channels read and written")
    for (channels, real, size), residual in itertools.product([(64, 48, 128), (128, 96, 64)], (False, True)):
        shape = (a.batch, channels, size, size, size)
        x = torch.randn(shape, device=dev, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        x[:, real:] = 0
        res = torch.zeros_like(x) if residual else None
        stats = instance_stats(x)
        weight = torch.ones(channels, device=dev)
        bias = torch.zeros(channels, device=dev)
        moved = x.numel() // channels * real * 2 * (3 if residual else 2)
        row = []
        for block_s, warps in _LAUNCHES:

            def apply(block_s=block_s, warps=warps):
                norm_act(x, weight, bias, spec, res, real, out=x, stats=stats, block_s=block_s, num_warps=warps)

            ms = _ms(apply, a.repeats)
            row.append(f"({block_s},{warps}) {ms:.3f} ms {moved / ms / 1e6:.0f}")
        kind = "with residual" if residual else "in place"
        print(f"  {real}/{channels} channels at {size}^3, {kind}: " + " | ".join(row))


if __name__ == "__main__":
    main()
