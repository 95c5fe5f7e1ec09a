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
"""One launch of each Triton 3x3x3 convolution form on the full-resolution VISTA3D shape, for Nsight Compute.

Run under ``ncu`` (clocks left alone), e.g.::

    ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section MemoryWorkloadAnalysis --section Occupancy -k regex:_conv_kernel \\
        python3 tests/benchmarks/ncu_conv3d.py

Each form runs twice (the first launch compiles); profile with ``--launch-skip 1 --launch-count 1`` per form or
read the second of each pair. ``--resident`` runs the resident-weight Gluon convolution instead, with the next
norm's statistics, without and with a residual: ``-k regex:_resident_conv``.
"""

from __future__ import annotations

import argparse

import torch

from monai.networks.kernels.conv3d import ConvLaunch, conv3x3x3, conv3x3x3_weights
from monai.networks.kernels.padded_weights import pad_channels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=14)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--channels", type=int, default=48)
    p.add_argument("--resident", action="store_true", help="the resident-weight Gluon kernel instead")
    a = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.batch, a.channels, a.size, a.size, a.size, generator=g).to("cuda", torch.float16)
    x = pad_channels(x, 64 if a.channels <= 64 else 128)
    weight = torch.randn(a.channels, a.channels, 3, 3, 3, generator=g).cuda() / (27 * a.channels) ** 0.5
    if a.resident:
        from monai.networks.kernels import conv3d_resident

        gemm = conv3x3x3_weights(weight, out_columns=64)
        for residual in (None, x):
            for _ in range(2):
                conv3d_resident.conv3x3x3_resident(x, gemm, stats=True, residual=residual)
            torch.cuda.synchronize()
            print(f"ran conv3x3x3_resident, statistics{', residual' if residual is not None else ''}", flush=True)
        return 0
    forms = (
        ("swapped", ConvLaunch(swap=True)),
        ("swapped, 2 stacked planes of 8x16, 4 warps", ConvLaunch(8, 16, planes=2, swap=True)),
        ("swapped, 2 stacked planes of 8x16, 8 warps", ConvLaunch(8, 16, 8, planes=2, swap=True)),
        ("swapped, 2 stacked planes of 16x16, 8 warps", ConvLaunch(16, 16, 8, planes=2, swap=True)),
    )
    for name, launch in forms:
        gemm = conv3x3x3_weights(weight, out_columns=x.shape[1], planes=launch.planes)
        for _ in range(2):
            conv3x3x3(x, gemm, stats=True, launch=launch)
        torch.cuda.synchronize()
        print(f"ran {name}: {launch}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
