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
"""DRAFT (not on any path, not yet run on a GPU): a persistent Gluon 3x3x3 convolution with the 27 taps' weights
resident in shared memory.

The Triton kernel in ``monai/networks/kernels/conv3d.py`` fetches every tap's weights from L2 once per program:
half of its L2 bytes. Here each persistent program loads the weights once (27 x [48, 64] fp16 = 166 KB), then
walks its tiles; per tap one TMA load of the shifted input patch (a ring of ``STAGES`` buffers, mbarriers) and
one asynchronous wgmma of the swapped product (output channels as M, voxels as N).

Compile check on the CPU (no GPU needed; 8x16 voxels, 3 stages: 90 registers, 219 KB of shared memory)::

    python tests/benchmarks/experiments/gluon_conv3d/resident_weights.py --compile-only

On the H200 (check, then time against the Triton kernel's default)::

    python tests/benchmarks/experiments/gluon_conv3d/resident_weights.py
"""

from __future__ import annotations

import argparse

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _issue(x0_desc, x1_desc, x0_s, x1_s, ready, stage, b, d, h0, w0, tap, K0: gl.constexpr):
    # the input patch of `tap` (depth, row, column offsets) for the tile at (b, d, h0, w0); zeros outside the volume
    dd = d + tap // 9 - 1
    hs = h0 + (tap % 9) // 3 - 1
    ws = w0 + tap % 3 - 1
    bar = ready.index(stage)
    mbarrier.expect(bar, x0_desc.block_type.nbytes + x1_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(x0_desc, [b, dd, hs, ws, 0], bar, x0_s.index(stage))
    tma.async_copy_global_to_shared(x1_desc, [b, dd, hs, ws, K0], bar, x1_s.index(stage))


@gluon.jit
def resident_conv_kernel(
    x0_desc,
    x1_desc,
    w0_desc,
    w1_desc,
    y_desc,
    D,
    H,
    W,
    n_tiles,
    K0: gl.constexpr,
    K1: gl.constexpr,
    N: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_W: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BM: gl.constexpr = BLOCK_H * BLOCK_W
    pid = gl.program_id(0)
    n_prog = gl.num_programs(0)
    # the weights, once per program: tap t's [K0, N] and [K1, N] blocks
    w0_s = gl.allocate_shared_memory(gl.float16, [27, K0, N], w0_desc.layout)
    w1_s = gl.allocate_shared_memory(gl.float16, [27, K1, N], w1_desc.layout)
    w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(w_bar, count=1)
    mbarrier.expect(w_bar, 27 * (w0_desc.block_type.nbytes + w1_desc.block_type.nbytes))
    for tap in gl.static_range(27):
        tma.async_copy_global_to_shared(w0_desc, [tap * (K0 + K1), 0], w_bar, w0_s.index(tap))
        tma.async_copy_global_to_shared(w1_desc, [tap * (K0 + K1) + K0, 0], w_bar, w1_s.index(tap))
    # the ring of input patches
    x0_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K0], x0_desc.layout)
    x1_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K1], x1_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    y_s = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_H, BLOCK_W, N], y_desc.layout)
    mbarrier.wait(w_bar, 0)

    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16]
    )
    tiles_w = gl.cdiv(W, BLOCK_W)
    tiles_h = gl.cdiv(H, BLOCK_H)
    count = 0  # patches consumed so far by this program: the ring position and barrier phase
    for tile in range(pid, n_tiles, n_prog):
        tw = tile % tiles_w
        rest = tile // tiles_w
        th = rest % tiles_h
        rest = rest // tiles_h
        d = rest % D
        b = rest // D
        h0 = th * BLOCK_H
        w0 = tw * BLOCK_W
        for ahead in gl.static_range(STAGES - 1):
            _issue(x0_desc, x1_desc, x0_s, x1_s, ready, (count + ahead) % STAGES, b, d, h0, w0, ahead, K0)
        acc = gl.zeros([N, BM], gl.float32, acc_layout)
        for t in range(27):
            stage = count % STAGES
            mbarrier.wait(ready.index(stage), (count // STAGES) & 1)
            a0 = x0_s.index(stage).reshape([BM, K0]).permute((1, 0))
            a1 = x1_s.index(stage).reshape([BM, K1]).permute((1, 0))
            acc = warpgroup_mma(w0_s.index(t).permute((1, 0)), a0, acc, is_async=True)
            acc = warpgroup_mma(w1_s.index(t).permute((1, 0)), a1, acc, is_async=True)
            # the previous patch's products are done: its buffer takes the patch STAGES - 1 ahead
            acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc,))
            if t + STAGES - 1 < 27:
                _issue(x0_desc, x1_desc, x0_s, x1_s, ready, (count + STAGES - 1) % STAGES, b, d, h0, w0,
                       t + STAGES - 1, K0)  # fmt: skip
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        tma.store_wait(pendings=0)  # the previous tile's store has left y_s
        y_s.reshape([BM, N]).store(gl.permute(acc.to(gl.float16), (1, 0)))
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [b, d, h0, w0, 0], y_s)
    tma.store_wait(pendings=0)


def layout(block: list[int]) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(block, gl.float16)


def compile_only(block_h: int = 8, block_w: int = 16, stages: int = 3, num_warps: int = 4):
    """Compile for sm_90 on this machine and report registers and shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    k0, k1, n = 32, 16, 64

    def desc(block):
        return f"tensordesc<fp16{block},{layout(block)!r}>".replace(" ", "")

    sig = {
        "x0_desc": desc([1, 1, block_h, block_w, k0]),
        "x1_desc": desc([1, 1, block_h, block_w, k1]),
        "w0_desc": desc([k0, n]),
        "w1_desc": desc([k1, n]),
        "y_desc": desc([1, 1, block_h, block_w, n]),
        "D": "i32",
        "H": "i32",
        "W": "i32",
        "n_tiles": "i32",
    }
    const = dict(K0=k0, K1=k1, N=n, BLOCK_H=block_h, BLOCK_W=block_w, STAGES=stages, num_warps=num_warps)
    sig.update({k: "constexpr" for k in const})
    src = GluonASTSource(fn=resident_conv_kernel, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def run(batch: int = 14, size: int = 128, block_h: int = 8, block_w: int = 16, stages: int = 3) -> None:
    """On a Hopper GPU: the kernel against float64 (first window) and timed next to conv3x3x3's default."""
    import torch
    import torch.nn.functional as F
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from monai.networks.kernels.conv3d import ConvLaunch, conv3x3x3, conv3x3x3_weights
    from monai.networks.kernels.padded_weights import pad_channels

    g = torch.Generator().manual_seed(0)
    x = pad_channels(torch.randn(batch, 48, size, size, size, generator=g).cuda().half(), 64)
    weight = (torch.randn(48, 48, 3, 3, 3, generator=g) / (27 * 48) ** 0.5).cuda()
    gemm = conv3x3x3_weights(weight, out_columns=64)
    y = torch.empty_like(x)

    def desc(t, block):
        return TensorDescriptor.from_tensor(t, block, layout(block))

    xv, yv = x.permute(0, 2, 3, 4, 1), y.permute(0, 2, 3, 4, 1)
    tiles = batch * size * triton.cdiv(size, block_h) * triton.cdiv(size, block_w)
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    args = (
        desc(xv, [1, 1, block_h, block_w, 32]),
        desc(xv, [1, 1, block_h, block_w, 16]),
        desc(gemm, [32, 64]),
        desc(gemm, [16, 64]),
        desc(yv, [1, 1, block_h, block_w, 64]),
        size,
        size,
        size,
        tiles,
    )

    def launch():
        resident_conv_kernel[(min(n_sm, tiles),)](
            *args, K0=32, K1=16, N=64, BLOCK_H=block_h, BLOCK_W=block_w, STAGES=stages, num_warps=4
        )
        return y

    launch()
    ref = F.conv3d(x[:1, :48].double(), weight.double(), padding=1)
    err = ((y[:1, :48].double() - ref).norm() / ref.norm()).item()
    ms = triton.testing.do_bench(launch)
    base = conv3x3x3_weights(weight, out_columns=64, planes=2)
    ms_triton = triton.testing.do_bench(lambda: conv3x3x3(x, base, launch=ConvLaunch(8, 16, 4, 3, 2, True)))
    flop = 2 * 48 * 48 * 27 * batch * size**3
    name = f"resident-weight Gluon conv {block_h}x{block_w}, {stages} stages"
    print(f"{name}: {ms:.3f} ms ({flop / ms / 1e9:.0f} TFLOP/s), rel. err {err:.2e}; Triton default {ms_triton:.3f} ms")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile-only", action="store_true", help="compile for sm_90 here (no GPU needed)")
    a = p.parse_args()
    if a.compile_only:
        c = compile_only()
        ptx = c.asm["ptx"]
        print(f"compiled: shared {c.metadata.shared} B, wgmma {ptx.count('wgmma.mma_async')}, "
              f"TMA loads {ptx.count('cp.async.bulk.tensor')}")  # fmt: skip
    else:
        for stages in (3, 4):  # 4 stages need 231 KB of the 227 KB a block may have: expect a refusal
            try:
                run(stages=stages)
            except Exception as e:  # a launch the GPU refuses is reported, not fatal
                print(f"{stages} stages: {type(e).__name__}: {str(e)[:200]}")
