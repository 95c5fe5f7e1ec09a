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
"""Experiments (not on any path): persistent Gluon 3x3x3 convolutions with the 27 taps' weights resident in shared
memory.

The Triton kernel in ``monai/networks/kernels/conv3d.py`` fetches every tap's weights from L2 once per program:
half of its L2 bytes. Here each persistent program loads the weights once (27 x [48, 64] fp16 = 166 KB), then
walks its tiles; per patch one TMA load of the shifted input (a ring of ``STAGES`` buffers, mbarriers) and
asynchronous wgmmas of the swapped product (output channels as M = 64, voxels as N = 128).

``resident_conv_kernel``, the draft (H200, 14 x 48 x 128^3: correct, 13.5 ms at 3 stages, 12.4 ms at 4, against
10.8 ms for the Triton kernel): one output plane per tile, 27 patch loads per plane, and at each tile boundary the
load pipeline drains and refills, the tensor cores idle for a TMA latency. Kept here for comparison.

Its successor, v2, is on the fused path as :py:func:`monai.networks.kernels.conv3d_resident.conv3x3x3_resident`
(9.36 ms, 390 TFLOP/s): the loads run ``STAGES - 1`` patches ahead over the program's flat sequence of (tile,
patch) pairs, so the next tile's first patches load while this one ends and stores; and a tile is two output planes
(36 patches, 18 loads per plane), two [64, 128] fp32 accumulators on one warpgroup. Not the Triton kernel's one
[128, 128] accumulator over two warpgroups with a stacked [w(plane 0); w(plane 1)] operand: its resident stacked
weights would take 36 x [48, 128] fp16 = 332 KB, and its zero blocks at the edge planes add a third to the
tensor-core work (72 64-row products per tile where 54 do the work). Its tile's second plane is stored during the
next tile's first patches; storing it right after the first plane (a wait for the staging buffer in between)
measured the same (9.379 against 9.364 ms; in a second run 9.151 against 9.231 ms) and was dropped: deferred, the
second plane's statistics (``stats=True``: the next norm's, per plane, in the epilogue) run beside the next tile's
products.

The module's kernel also takes a residual (``conv(x) + residual``, the SegResNet blocks' conv2), loaded by TMA into
the output staging buffer well before each plane's epilogue; ``run`` times it with the statistics and the input as
the residual, beside the Triton kernel's ``conv3x3x3(x, w, True, x, launch)``.

Shared memory (limit 232,448 B): 219,176 B at 3 stages, 231,464 B at 4 (both kernels: 165,888 of weights,
12,288 per stage, one 16 KB output staging buffer; 231,480 B with the residual's barrier). Compile the draft and the
module's kernel (without and with the statistics and the residual) on the CPU (no GPU needed; prints shared bytes,
registers and spills from ptxas, wgmma and TMA instructions in the PTX)::

    python tests/benchmarks/experiments/gluon_conv3d/resident_weights.py --compile-only

On the H200 (each variant checked against float64, then timed next to the Triton kernel's default)::

    python tests/benchmarks/experiments/gluon_conv3d/resident_weights.py
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch
import triton
from triton.compiler.compiler import CompiledKernel
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.runtime.jit import JITFunction

# the module's patch loader and its TMA copies (named as the installed Triton names them) serve the draft too
from monai.networks.kernels.conv3d_resident import _load_patch, _tma_load, _tma_store


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
        _tma_load(w0_desc, [tap * (K0 + K1), 0], w_bar, w0_s.index(tap))
        _tma_load(w1_desc, [tap * (K0 + K1) + K0, 0], w_bar, w1_s.index(tap))
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
            _load_patch(x0_desc, x1_desc, x0_s, x1_s, ready, (count + ahead) % STAGES, b, d, h0, w0, ahead, K0)
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
                _load_patch(x0_desc, x1_desc, x0_s, x1_s, ready, (count + STAGES - 1) % STAGES, b, d, h0, w0,
                       t + STAGES - 1, K0)  # fmt: skip
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        tma.store_wait(pendings=0)  # the previous tile's store has left y_s
        y_s.reshape([BM, N]).store(gl.permute(acc.to(gl.float16), (1, 0)))
        fence_async_shared()
        _tma_store(y_desc, [b, d, h0, w0, 0], y_s)
    tma.store_wait(pendings=0)


def layout(block: list[int]) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(block, gl.float16)


def compile_only(
    block_h: int = 8,
    block_w: int = 16,
    stages: int = 3,
    num_warps: int = 4,
    kernel: JITFunction | None = None,
    **constexprs,
):
    """Compile ``kernel`` (the draft by default) for sm_90 on this machine; ``constexprs``: its extra ones."""
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
    const = dict(K0=k0, K1=k1, N=n, BLOCK_H=block_h, BLOCK_W=block_w, STAGES=stages, **constexprs, num_warps=num_warps)
    sig.update({k: "constexpr" for k in const})
    src = GluonASTSource(fn=kernel or resident_conv_kernel, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def resources(c: CompiledKernel) -> str:
    """Shared bytes, registers and spills (``n_regs`` / ``n_spills`` need a GPU to load the kernel, so ptxas -v
    is rerun on the PTX as Triton runs it) and the wgmma / TMA instructions in the PTX (static counts: the loops
    are not unrolled)."""
    import re
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(c.asm["ptx"])
        f.flush()
        log = subprocess.run(
            [triton.knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"],
            capture_output=True,
            text=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    ptx = c.asm["ptx"]
    stores = ptx.count(".global.shared::cta.bulk_group")
    return (
        f"shared {c.metadata.shared} B, {regs.group(1) if regs else '?'} registers, "
        f"spills {'%s/%s B (stores/loads)' % spills.groups() if spills else '?'}, "
        f"wgmma {ptx.count('wgmma.mma_async')} in {ptx.count('wgmma.commit_group')} groups, "
        f"TMA loads {ptx.count('cp.async.bulk.tensor') - stores}, TMA stores {stores}"
    )


# the draft's variants run() times: (name, kernel, output planes per tile, stages, extra constexprs)
VARIANTS = [
    ("draft", resident_conv_kernel, 1, 3, {}),
    ("draft", resident_conv_kernel, 1, 4, {}),
]


def make_launch(
    kernel: JITFunction,
    x: torch.Tensor,
    gemm: torch.Tensor,
    y: torch.Tensor,
    planes: int,
    stages: int,
    block_h: int = 8,
    block_w: int = 16,
    programs: int | None = None,
    **constexprs,
) -> Callable[[], None]:
    """A launch of ``kernel`` on ``x`` [B, 64, D, H, W] channels-last fp16 (48 real channels) into ``y``, its
    descriptors built once; ``planes``: output planes per tile; ``programs``: the persistent grid (one per SM by
    default, never more than the tiles: a program without a tile would leave its first loads in flight)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def desc(t, block):
        return TensorDescriptor.from_tensor(t, block, layout(block))

    n_b, _, d, h, w = x.shape
    xv, yv = x.permute(0, 2, 3, 4, 1), y.permute(0, 2, 3, 4, 1)
    tiles = n_b * triton.cdiv(d, planes) * triton.cdiv(h, block_h) * triton.cdiv(w, block_w)
    programs = min(programs or torch.cuda.get_device_properties(x.device).multi_processor_count, tiles)
    args = (
        desc(xv, [1, 1, block_h, block_w, 32]),
        desc(xv, [1, 1, block_h, block_w, 16]),
        desc(gemm, [32, 64]),
        desc(gemm, [16, 64]),
        desc(yv, [1, 1, block_h, block_w, 64]),
        d,
        h,
        w,
        tiles,
    )
    const = dict(K0=32, K1=16, N=64, BLOCK_H=block_h, BLOCK_W=block_w, STAGES=stages, num_warps=4, **constexprs)

    def launch() -> None:
        kernel[(programs,)](*args, **const)

    return launch


def run(batch: int = 14, size: int = 128) -> None:
    """On a Hopper GPU: the draft's variants and the module's kernel (without and with its statistics, and with the
    statistics and the input as its residual) against float64 and timed, next to conv3x3x3's default (the same
    three forms).

    Checked per variant, on outputs whose memory was just filled with NaN (a voxel never written shows): the first
    and the last sample in full (worst plane's relative error: the last planes, the end of the batch and so the
    cross-tile look-ahead and the plane pairing of every tile a program walks), the zero padding channels, and an
    odd shape (D = 13: the last tile's second plane lies outside; H, W not multiples of the tile) on 5 programs, so
    each program walks many tiles. The module's statistics against the float64 mean and variance of the float64
    output (with the residual: conv(x) + x) rounded to fp16 (the values as stored), on the same samples."""
    import time

    import torch.nn.functional as F

    from monai.networks.kernels.conv3d import ConvLaunch, conv3x3x3, conv3x3x3_weights
    from monai.networks.kernels.conv3d_resident import conv3x3x3_resident
    from monai.networks.kernels.padded_weights import pad_channels

    start = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    x = pad_channels(torch.randn(batch, 48, size, size, size, generator=g).cuda().half(), 64)
    x_odd = pad_channels(torch.randn(2, 48, 13, 20, 24, generator=g).cuda().half(), 64)
    weight = (torch.randn(48, 48, 3, 3, 3, generator=g) / (27 * 48) ** 0.5).cuda()
    gemm = conv3x3x3_weights(weight, out_columns=64)
    w64 = weight.double()

    def reference(t):
        return F.conv3d(t[:, :48].double(), w64, padding=1)

    def worst_plane_err(out, ref):  # max over samples and planes of |out - ref| / |ref| per plane
        diff = (out[:, :48].double() - ref).flatten(3).norm(dim=3).norm(dim=1)
        return (diff / ref.flatten(3).norm(dim=3).norm(dim=1)).max().item()

    def stats_err(stats, ref):
        # worst |mean - ref| in units of the channel's standard deviation, and worst relative variance error, of
        # the real channels; the padding channels' statistics must be zeros
        mean, var = stats
        ref_var, ref_mean = torch.var_mean(ref.half().double(), dim=(2, 3, 4), unbiased=False)
        pad_ok = bool((mean[:, 48:] == 0).all()) and bool((var[:, 48:] == 0).all())
        e_mean = ((mean[:, :48].double() - ref_mean).abs() / ref_var.sqrt()).max().item()
        e_var = ((var[:, :48].double() - ref_var).abs() / ref_var).max().item()
        return e_mean, e_var, pad_ok

    def poisoned(like, fn):  # fn's output allocation reuses the block of this NaN tensor, freed just before
        torch.full_like(like, float("nan"))
        return fn()

    refs = reference(x[:1]), reference(x[-1:]), reference(x_odd)
    base = conv3x3x3_weights(weight, out_columns=64, planes=2)
    triton_default = ConvLaunch(8, 16, 4, 3, 2, True)
    ms_triton = triton.testing.do_bench(lambda: conv3x3x3(x, base, launch=triton_default))
    ms_triton_stats = triton.testing.do_bench(lambda: conv3x3x3(x, base, stats=True, launch=triton_default))
    # the residual form of the fused path (the SegResNet blocks' conv2: conv(x) + x, then the next norm's statistics)
    ms_triton_residual = triton.testing.do_bench(lambda: conv3x3x3(x, base, True, x, triton_default))
    flop = 2 * 48 * 48 * 27 * batch * size**3
    print(f"Triton default (8x16 voxels x 2 planes, swapped): {ms_triton:.3f} ms, with statistics "
          f"{ms_triton_stats:.3f} ms, with statistics and residual {ms_triton_residual:.3f} ms")  # fmt: skip
    y = torch.empty_like(x)
    y_odd = torch.empty_like(x_odd)
    for name, kernel, planes, stages, constexprs in VARIANTS:
        label = f"{name} 8x16, {stages} stages"
        try:
            y.fill_(float("nan"))
            y_odd.fill_(float("nan"))
            launch = make_launch(kernel, x, gemm, y, planes, stages, **constexprs)
            launch()
            make_launch(kernel, x_odd, gemm, y_odd, planes, stages, programs=5, **constexprs)()
            errs = worst_plane_err(y[:1], refs[0]), worst_plane_err(y[-1:], refs[1]), worst_plane_err(y_odd, refs[2])
            pad_ok = bool((y[:, 48:] == 0).all()) and bool((y_odd[:, 48:] == 0).all())
            ms = triton.testing.do_bench(launch)
            print(f"{label}: {ms:.3f} ms ({flop / ms / 1e9:.0f} TFLOP/s), worst-plane rel. err first sample "
                  f"{errs[0]:.2e}, last {errs[1]:.2e}, odd shape {errs[2]:.2e}, padding channels "
                  f"{'zero' if pad_ok else 'WRONG'}")  # fmt: skip
        except Exception as e:  # a launch the GPU refuses is reported, not fatal
            print(f"{label}: {type(e).__name__}: {str(e)[:200]}")
    del y, y_odd
    # the residual is the input itself (its padding channels are zero), as in the blocks' conv2
    refs_residual = (
        refs[0] + x[:1, :48].double(),
        refs[1] + x[-1:, :48].double(),
        refs[2] + x_odd[:, :48].double(),
    )
    ms_triton_for = {(False, False): ms_triton, (True, False): ms_triton_stats, (True, True): ms_triton_residual}
    for stats, res in ((False, False), (True, False), (True, True)):
        label = f"conv3x3x3_resident (v2, 4 stages){' +stats' if stats else ''}{' +residual' if res else ''}"
        want = refs_residual if res else refs
        try:
            out, st = poisoned(x, lambda s=stats, r=res: conv3x3x3_resident(x, gemm, s, residual=x if r else None))
            out_odd, st_odd = poisoned(
                x_odd, lambda s=stats, r=res: conv3x3x3_resident(x_odd, gemm, s, 5, x_odd if r else None)
            )
            errs = (
                worst_plane_err(out[:1], want[0]),
                worst_plane_err(out[-1:], want[1]),
                worst_plane_err(out_odd, want[2]),
            )
            pad_ok = bool((out[:, 48:] == 0).all()) and bool((out_odd[:, 48:] == 0).all())
            text = ""
            if stats:
                checks = [
                    stats_err((st[0][:1], st[1][:1]), want[0]),
                    stats_err((st[0][-1:], st[1][-1:]), want[1]),
                    stats_err(st_odd, want[2]),
                ]
                e_mean = max(c[0] for c in checks)
                e_var = max(c[1] for c in checks)
                pad_stats = "zero" if all(c[2] for c in checks) else "WRONG"
                text = (
                    f"; statistics vs float64 of the fp16-rounded output: worst |mean err| / std {e_mean:.2e}, "
                    f"worst var rel. err {e_var:.2e}, padding channels' {pad_stats}"
                )
            del out, out_odd, st, st_odd
            ms = triton.testing.do_bench(
                lambda s=stats, r=res: conv3x3x3_resident(x, gemm, stats=s, residual=x if r else None)
            )
            print(f"{label}: {ms:.3f} ms ({flop / ms / 1e9:.0f} TFLOP/s), worst-plane rel. err first sample "
                  f"{errs[0]:.2e}, last {errs[1]:.2e}, odd shape {errs[2]:.2e}, padding channels "
                  f"{'zero' if pad_ok else 'WRONG'}{text}; Triton default "
                  f"{ms_triton_for[stats, res]:.3f} ms")  # fmt: skip
        except Exception as e:  # reported, not fatal: the draft's lines still stand
            print(f"{label}: {type(e).__name__}: {str(e)[:200]}")
    print(f"({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile-only", action="store_true", help="compile every variant for sm_90 here (no GPU needed)")
    a = p.parse_args()
    if a.compile_only:
        from monai.networks.kernels.conv3d_resident import compile_for_sm90

        for name, kernel, _, stages, constexprs in VARIANTS:
            print(f"{name}, {stages} stages: {resources(compile_only(stages=stages, kernel=kernel, **constexprs))}")
        for stats in (False, True):
            for res in (False, True):
                label = f"conv3x3x3_resident (v2, 4 stages){' +stats' if stats else ''}{' +residual' if res else ''}"
                print(f"{label}: {resources(compile_for_sm90(stats=stats, residual=res))}")
    else:
        run()
