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
"""A 96 -> 96 channel convolution as four 48 -> 48 resident-weight convolutions (issue 50, item 4; not on any path).

The 96-channel convolutions run on the Triton implicit GEMM at ~414 TFLOP/s of real work (H100), L2-bound: their
weights (498 KB) do not fit the resident kernel's shared memory. A quarter of them does: output half ``h`` is
``conv(x[:, :48], W[h, :48]) + conv(x[:, 48:], W[h, 48:])``, the second call taking the first's output as its
residual (its epilogue adds it in fp32 before rounding; the first's output is rounded to fp16 once on the way, a
second rounding the single kernel does not have), the block's residual entering the first. Same issued MMA work as
the 128-column Triton kernel; the resident kernel issues at ~930 TFLOP/s where the Triton one manages ~550.

This times, at 64^3 (the 96-channel level) with the block's residual and the statistics: the Triton kernel
(``FUSED_LAUNCHES[128]``) against the four resident calls on inputs already split into contiguous 64-channel
halves, and against the fused path's own form (``FusedConfig(resident_96=True)``: channel slices of the
128-channel tensors, no copies), each checked against float64::

    python tests/benchmarks/experiments/gluon_conv3d/quartered96.py --batch 14
    python tests/benchmarks/experiments/gluon_conv3d/quartered96.py --batch 1
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from monai.networks.kernels.conv3d import FUSED_LAUNCHES, conv3x3x3, conv3x3x3_weights
from monai.networks.kernels.conv3d_resident import conv3x3x3_resident, slab_loads_supported
from monai.networks.kernels.dispatch import _quartered


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.half().contiguous(memory_format=torch.channels_last_3d)


def _padded(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``x`` with zero channels appended up to ``channels``, channels-last fp16."""
    return _channels_last(F.pad(x, (0, 0, 0, 0, 0, 0, 0, channels - x.shape[1])))


def _ms(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=14)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (a.batch, 96, a.size, a.size, a.size)
    x32 = torch.randn(shape, generator=g).to(dev)
    res32 = torch.randn(shape, generator=g).to(dev)
    weight = (torch.randn(96, 96, 3, 3, 3, generator=g) / (27 * 96) ** 0.5).to(dev)
    ref = F.conv3d(x32.half().double(), weight.half().double(), padding=1) + res32.half().double()

    # the Triton kernel as the fused path runs it: 128 padded channels in and out
    launch = FUSED_LAUNCHES[128]
    x128, res128 = _padded(x32, 128), _padded(res32, 128)
    gemm = conv3x3x3_weights(weight.half(), out_columns=128, planes=launch.planes)

    def triton_conv():
        return conv3x3x3(x128, gemm, stats=True, residual=res128, launch=launch)

    # the quarters: inputs and residuals split into contiguous 64-channel halves (48 real)
    halves = [_padded(x32[:, 48 * i : 48 * (i + 1)], 64) for i in range(2)]
    res_halves = [_padded(res32[:, 48 * h : 48 * (h + 1)], 64) for h in range(2)]
    quarters = [
        [
            conv3x3x3_weights(weight[48 * h : 48 * (h + 1), 48 * i : 48 * (i + 1)].half(), out_columns=64)
            for i in range(2)
        ]
        for h in range(2)
    ]

    def quartered():
        out = []
        for h in range(2):
            partial, _ = conv3x3x3_resident(halves[0], quarters[h][0], residual=res_halves[h])
            out.append(conv3x3x3_resident(halves[1], quarters[h][1], stats=True, residual=partial))
        return out

    quarter_ops = (tuple(quarters[0]), tuple(quarters[1]))

    def sliced():
        return _quartered(x128, quarter_ops, res128, True, slabs=slab_loads_supported())

    y, (mean, _) = triton_conv()
    err_t = ((y[:, :96].double() - ref).norm() / ref.norm()).item()
    (y0, (m0, _)), (y1, (m1, _)) = quartered()
    yq = torch.cat([y0[:, :48], y1[:, :48]], 1)
    err_q = ((yq.double() - ref).norm() / ref.norm()).item()
    mean_gap = (torch.cat([m0[:, :48], m1[:, :48]], 1) - mean[:, :96]).abs().max().item()
    ys, (ms_, _) = sliced()
    err_s = ((ys[:, :96].double() - ref).norm() / ref.norm()).item()
    flop = 2 * a.batch * a.size**3 * 27 * 96 * 96  # real work
    t_t, t_q, t_s = _ms(triton_conv, a.repeats), _ms(quartered, a.repeats), _ms(sliced, a.repeats)
    print(f"{a.batch} x 96 -> 96 x {a.size}^3, residual and statistics (median of {a.repeats}):")
    print(f"  Triton, 128 padded columns: {t_t:.3f} ms  {flop / t_t / 1e9:.0f} TFLOP/s  rel. error {err_t:.2e}")
    print(f"  four resident quarters:     {t_q:.3f} ms  {flop / t_q / 1e9:.0f} TFLOP/s  rel. error {err_q:.2e}")
    print(f"  the fused path's form:      {t_s:.3f} ms  {flop / t_s / 1e9:.0f} TFLOP/s  rel. error {err_s:.2e}")
    print(f"  the channel means differ by at most {mean_gap:.2e} (quarters), "
          f"{(ms_[:, :96] - mean[:, :96]).abs().max().item():.2e} (the fused path's form)")  # fmt: skip


if __name__ == "__main__":
    main()
