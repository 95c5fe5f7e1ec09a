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
"""Where the resident convolution computes a plane's statistics (issue 50, item 4; an experiment).

The resident kernel's two consumer warpgroups share one output staging buffer and take it in turn. Its statistics
cost 15 % (H100, 14 x 48 x 128^3: 8.00 against 6.93 ms) although they are a few dozen adds per thread: they run
between the plane's TMA store and the wait for it, so on the path the two planes' epilogues take one after the other.
``conv3d_resident.STATS_LATE = True`` moves them after the buffer is handed to the other plane. This times both
orders with statistics, with and without the residual, taking turns (and the kernel without statistics), and checks
that the two orders write the same bits::

    python tests/benchmarks/experiments/gluon_conv3d/stats_order.py --batch 14
    python tests/benchmarks/experiments/gluon_conv3d/stats_order.py --compile-only   # sm_90 here, no GPU
"""

from __future__ import annotations

import argparse

import torch

from monai.networks.kernels import conv3d_resident
from monai.networks.kernels.conv3d import conv3x3x3_weights


def _ms(fn, repeats: int) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def run(batch: int, size: int, rounds: int) -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (batch, 64, size, size, size)
    x = torch.randn(shape, generator=g).half().to(dev).contiguous(memory_format=torch.channels_last_3d)
    res = torch.randn(shape, generator=g).half().to(dev).contiguous(memory_format=torch.channels_last_3d)
    x[:, 48:] = 0
    res[:, 48:] = 0
    w = conv3x3x3_weights((torch.randn(48, 48, 3, 3, 3, generator=g) / (27 * 48) ** 0.5).to(dev), out_columns=64)
    flop = 2 * batch * size**3 * 48 * 48 * 27
    plain = sorted(_ms(lambda: conv3d_resident.conv3x3x3_resident(x, w), 30)[1:])[14]
    print(f"{batch} x 48 x {size}^3, no statistics: {plain:.3f} ms ({flop / plain / 1e9:.0f} TFLOP/s)")
    for residual in (None, res):
        outs, times = {}, {False: [], True: []}
        for late in (False, True):  # compile both, keep the outputs
            conv3d_resident.STATS_LATE = late
            outs[late] = conv3d_resident.conv3x3x3_resident(x, w, stats=True, residual=residual)
        torch.cuda.synchronize()
        for _ in range(rounds):  # take turns, so clocks and heat treat both alike
            for late in (False, True):
                conv3d_resident.STATS_LATE = late
                times[late] += _ms(lambda: conv3d_resident.conv3x3x3_resident(x, w, stats=True, residual=residual), 5)
        same = torch.equal(outs[False][0], outs[True][0]) and all(
            torch.equal(a, b) for a, b in zip(outs[False][1], outs[True][1])
        )
        kind = "stats + residual" if residual is not None else "stats"
        for late in (False, True):
            ms = sorted(times[late])[len(times[late]) // 2]
            order = "after the hand-over (STATS_LATE)" if late else "before the store wait (default)"
            print(f"{batch} x 48 x {size}^3, {kind}, {order}: {ms:.3f} ms ({flop / ms / 1e9:.0f} TFLOP/s)")
        print(f"  outputs and statistics bit-identical: {same}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=14)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--compile-only", action="store_true", help="compile both orders for sm_90 here (no GPU needed)")
    a = p.parse_args()
    if a.compile_only:
        from resident_weights import resources  # (this folder's script: ptxas' registers and spills)

        for late in (False, True):
            conv3d_resident.STATS_LATE = late
            for res in (False, True):
                c = conv3d_resident.compile_for_sm90(stats=True, residual=res, slabs=True)
                print(f"STATS_LATE={late}, residual={res}: {resources(c)}")
    else:
        run(a.batch, a.size, a.rounds)


if __name__ == "__main__":
    main()
