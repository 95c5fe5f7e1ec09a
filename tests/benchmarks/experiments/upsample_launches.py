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
"""The decoder's upsampling kernel by launch: programs per SM against its serial epilogue (issue 50, item 4; not
on any path).

At 14 windows the fused forward spends 0.57 ms a window (H200, f2e563d) in ``conv_transpose3x3x3`` at the top
decoder level (96 -> 48 channels, 64^3 -> 128^3, with the skip add and the next norm's statistics): about four
times what its bytes (~0.6 GB) or its issued products (~116 GFLOP) take at the card's rates. Its launch then (16 x
16 voxels, 8 warps, 3 stages) took 221 KB of shared memory and 172 registers a thread (Triton 3.6, sm_90): one
program per SM, which idles through each program's short pipeline (2 to 8 loads) and its epilogue (two stores, two
skip loads, the statistics). 8 x 16 or 8 x 8 voxels on 4 warps with 2 stages fit two or three programs per SM, so
that one's epilogue overlaps another's products: 8 x 16 in 2 stages is now the default (``UPSAMPLE_LAUNCH``;
4.89 against 6.90 ms on an H100). Each launch is checked against float32 on the first and last sample, then timed
beside cuDNN's transposed convolution and a separate add::

    python tests/benchmarks/experiments/upsample_launches.py --batch 14
    python tests/benchmarks/experiments/upsample_launches.py --compile-only   # shared memory, registers; no GPU
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from monai.networks.kernels.conv3d import ConvLaunch
from monai.networks.kernels.conv_transpose3d import conv_transpose3x3x3, conv_transpose3x3x3_weights

# one program per SM at 16 x 16 voxels (the default until 8 x 16 on 4 warps in 2 stages); two or three at 8 x 16 / 8 x 8
# with 2 stages
LAUNCHES = [
    ConvLaunch(16, 16, num_warps=8, num_stages=3, swap=True),
    ConvLaunch(16, 16, num_warps=8, num_stages=2, swap=True),
    ConvLaunch(8, 16, num_warps=4, num_stages=3, swap=True),
    ConvLaunch(8, 16, num_warps=4, num_stages=2, swap=True),
    ConvLaunch(8, 8, num_warps=4, num_stages=3, swap=True),
    ConvLaunch(8, 8, num_warps=4, num_stages=2, swap=True),
]
C_IN, C_IN_PADDED, C_OUT, C_OUT_PADDED, SIZE = 96, 128, 48, 64, 64  # VISTA3D's top decoder level


def name(launch: ConvLaunch) -> str:
    return f"{launch.block_h}x{launch.block_w} voxels, {launch.num_warps} warps, {launch.num_stages} stages"


def compile_only() -> None:
    """Each launch compiled for sm_90 here: shared bytes, registers, spills (ptxas on the PTX)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from monai.networks.kernels.conv_transpose3d import _upsample_kernel
    from tests.benchmarks.experiments.gluon_conv3d.resident_weights import resources

    k0, k1, n = 64, 32, C_OUT_PADDED
    for launch in LAUNCHES:
        bh, bw = launch.block_h, launch.block_w
        box = f"tensordesc<fp16[1,{bh},1,{bw},{n}]>"
        sig = {"x0_desc": f"tensordesc<fp16[1,1,{bh},{bw},{k0}]>", "x1_desc": f"tensordesc<fp16[1,1,{bh},{bw},{k1}]>",
               "w0_desc": f"tensordesc<fp16[{k0},{2 * n}]>", "w1_desc": f"tensordesc<fp16[{k1},{2 * n}]>",
               "y_desc": box, "s_desc": box, "count_ptr": "*fp32", "mean_ptr": "*fp32", "m2_ptr": "*fp32",
               "D": "i32", "H": "i32", "W": "i32"}  # fmt: skip
        const = dict(K0=k0, K1=k1, N=n, BLOCK_H=bh, BLOCK_W=bw, STATS=True, SKIP=True, SWAP=launch.swap)
        sig.update({k: "constexpr" for k in const})
        src = ASTSource(fn=_upsample_kernel, signature=sig, constexprs=const)
        options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages)
        print(f"{name(launch)}: {resources(triton.compile(src, target=GPUTarget('cuda', 90, 32), options=options))}")


def run(batch: int, size: int = SIZE, device: str = "cuda") -> None:
    """Check and time each launch (``device="cpu"`` under ``TRITON_INTERPRET=1``: the checks alone, small sizes)."""
    import triton

    g = torch.Generator().manual_seed(0)
    dev = torch.device(device)
    timed = dev.type == "cuda"
    x = torch.zeros(batch, C_IN_PADDED, size, size, size, device=dev, dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    x[:, :C_IN] = torch.randn(batch, C_IN, size, size, size, generator=g).to(dev, torch.float16)
    weight = (torch.randn(C_IN, C_OUT, 3, 3, 3, generator=g) / (27 * C_IN / 8) ** 0.5).to(dev)
    gemm = conv_transpose3x3x3_weights(weight, in_channels=C_IN, out_columns=C_OUT_PADDED)
    out_shape = (batch, C_OUT_PADDED, 2 * size, 2 * size, 2 * size)
    skip = torch.zeros(out_shape, device=dev, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
    skip[:, :C_OUT] = torch.randn(batch, C_OUT, *out_shape[2:], generator=g).to(dev, torch.float16)

    def reference(i: int) -> torch.Tensor:
        up = F.conv_transpose3d(x[i : i + 1, :C_IN].float(), weight, stride=2, padding=1, output_padding=1)
        return up + skip[i : i + 1, :C_OUT].float()

    refs = {i: reference(i) for i in (0, batch - 1)}
    flop = 2 * C_IN * C_OUT * 27 * batch * size**3
    moved = batch * size**3 * (C_IN * 2 + 8 * C_OUT_PADDED * 2 * 2)  # the input's real channels, skip and output
    print(f"the top level's upsampling, {batch} windows: ms, TFLOP/s of real work, GB/s of the bytes moved")
    for launch in LAUNCHES:
        y, (mean, var) = conv_transpose3x3x3(x, gemm, skip, stats=True, launch=launch)
        errs = []
        for i, ref in refs.items():
            got = y[i : i + 1, :C_OUT].float()
            errs.append(((got - ref).norm() / ref.norm()).item())
            ref_var, ref_mean = torch.var_mean(got, dim=(2, 3, 4), unbiased=False)
            errs.append(((mean[i, :C_OUT] - ref_mean[0]).abs() / ref_var[0].sqrt()).max().item())
        pad_ok = bool((y[:, C_OUT:] == 0).all())
        del y, mean, var
        checks = f"rel. err {max(errs[0::2]):.2e}, mean err / std {max(errs[1::2]):.2e}, padding " + (
            "zero" if pad_ok else "WRONG"
        )
        if not timed:
            print(f"  {name(launch)}: {checks}")
            continue
        ms = triton.testing.do_bench(lambda launch=launch: conv_transpose3x3x3(x, gemm, skip, True, launch))
        print(f"  {name(launch)}: {ms:.3f} ms, {flop / ms / 1e9:.0f} TFLOP/s, {moved / ms / 1e6:.0f} GB/s; {checks}")
    if not timed:
        return
    x_real = x[:, :C_IN].contiguous(memory_format=torch.channels_last_3d)
    skip_real = skip[:, :C_OUT].contiguous(memory_format=torch.channels_last_3d)
    w16 = weight.half()

    def cudnn():
        return F.conv_transpose3d(x_real, w16, stride=2, padding=1, output_padding=1) + skip_real

    ms = triton.testing.do_bench(cudnn)
    print(f"  cuDNN's transposed convolution and the add (real channels, no statistics): {ms:.3f} ms")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=14)
    p.add_argument("--size", type=int, default=SIZE, help="the input's edge (64: VISTA3D's top level)")
    p.add_argument("--device", default="cuda", help="cpu: the checks alone, under TRITON_INTERPRET=1")
    p.add_argument("--compile-only", action="store_true", help="compile each launch for sm_90 here (no GPU needed)")
    a = p.parse_args()
    compile_only() if a.compile_only else run(a.batch, a.size, a.device)
