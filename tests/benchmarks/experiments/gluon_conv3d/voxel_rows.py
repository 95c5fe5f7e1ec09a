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
"""The resident 48 -> 48 convolution turned around: voxels as the MMA's rows, no padding channels multiplied
(issue 50, item 4; an experiment, not on any path).

:py:mod:`monai.networks.kernels.conv3d_resident` multiplies ``[64 output channels, K] x [K, 128 voxels]``: a quarter
of its tensor-core work is the 16 zero channels that make M a power of two. Here each consumer warpgroup multiplies
``[128 voxels, K] x [K, 32]`` and ``[128 voxels, K] x [K, 16]`` (output channels 0-31 and 32-47, two accumulators):
the voxels (the slab's row-shift view) are loaded into registers once per product by ``ldmatrix`` and feed both
(``mma_forms.py``'s ``n48_rs``). Everything else is the resident kernel's: the same producer warp, slab ring and
tile order (imported from it), the weights from the same ``[1296, 64]`` matrix, now as four blocks per tap
(``[32, 32]``, ``[32, 16]``, ``[16, 32]``, ``[16, 16]``: 124,416 B instead of 165,888). Differences that follow:

* each plane's warpgroup has its own staging buffers (channels 0-31 and 32-47; the shared memory the weights no
  longer take), so the planes do not hand one buffer back and forth; the zero padding channels 48-63 are stored
  from a buffer zeroed once;
* the statistics reduce over the accumulator's rows, which lie across the warpgroup's four warps (a reduction
  through shared memory, once per plane).

Measured on an H100 (docs/notes/h100-2026-12-07c): right (the resident kernel's errors against float64, to the
digit) but slower, 11.20 ms against 6.93 for 14 x 48 x 128^3 (12.05 / 8.00 with statistics), and the MMA form
itself gains nothing: ``mma_forms.py`` gives 722 TFLOP/s of real work for it against 700 for the padded form (whose
m64n128 instructions run near the tensor cores' peak, where N = 32 and 16 do not). Kept as the record; the depth
taps run as a loop at run time (unrolled, the 27 taps' weight descriptors were hoisted and spilled 1.8 KB) and each
product waits for the one before (three in flight spilled too).

Compile for sm_90 here (no GPU; registers, spills, shared memory, ptxas' warnings)::

    python tests/benchmarks/experiments/gluon_conv3d/voxel_rows.py --compile-only

On a Hopper GPU: checked against float64 (as ``resident_weights.py`` checks the resident kernel) and timed beside
the resident kernel, each with and without statistics and residual::

    python tests/benchmarks/experiments/gluon_conv3d/voxel_rows.py
"""

# ruff: noqa: N803, N806 (Gluon's constexpr parameters and values are upper case, as in monai/networks/kernels)
from __future__ import annotations

import argparse

import torch
import triton

from monai.networks.kernels.gluon_compat import GLUON_MISSING

if GLUON_MISSING is None:
    from monai.networks.kernels.conv3d_resident import (
        _produce_units,
        _release_unit,
        _ring_rows,
        _tile_origin,
    )
    from monai.networks.kernels.gluon_compat import (
        TensorDescriptor,
        ast_source,
        fence_async_shared,
        gl,
        gluon,
        mbarrier,
        tma,
        tma_load,
        tma_store,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

_K0, _K1 = 32, 16  # input channels as two power-of-two pieces (the MMA's K)
_N0, _N1 = 32, 16  # output channels likewise (the MMA's N); 48-63 are written as zeros
_N = 64  # output channels stored
_BLOCK_H, _BLOCK_W = 8, 16  # a tile's voxels per plane: the MMA's M = 128
_STAGES = 3  # slabs in flight (the ring of 32 rows)
_NUM_WARPS = 4
_MAXNREG = 168
_CONSUMER_REGS = 232
_PRODUCER_REGS = 24
_WAIT = 4  # wgmma groups left in flight at each product's wait: the product's own four

if GLUON_MISSING is None:

    @gluon.jit
    def _piece_stats(out, shift, mean_ptr, m2_ptr, count, inside, part, OFFSET: gl.constexpr, C: gl.constexpr,
                     layout: gl.constexpr):  # fmt: skip
        # per-channel mean and centred sum of squares of `out` [voxels, C] (output channels OFFSET ...) over the
        # voxels `inside`, one pass shifted by `shift` (the previous plane's means); returns the means
        t = gl.where(inside[:, None], out.to(gl.float32) - shift[None, :], 0.0)
        s1 = gl.sum(t, axis=0)
        s2 = gl.sum(t * t, axis=0)
        n = gl.maximum(count, 1.0)
        mean = gl.where(count > 0, shift + s1 / n, 0.0)
        m2 = gl.maximum(s2 - s1 * s1 / n, 0.0)
        cols = part.to(gl.int64) * 64 + OFFSET + gl.arange(0, C, layout=gl.SliceLayout(0, layout))
        gl.store(mean_ptr + cols, mean)
        gl.store(m2_ptr + cols, m2)
        return mean

    @gluon.jit
    def _release_previous(empty, p, c: gl.constexpr, q, STAGES: gl.constexpr):
        # the slab before (depth tap p, column shift c) back to the producer, once its products are done (none at
        # the tile's first slab): released for both planes where only this plane uses it (input plane q' = 0 or 3)
        if c > 0:
            qp = q
        else:
            qp = q - 1
        if (c > 0) | (p > 0):
            if (qp == 0) | (qp == 3):
                mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=2)
            else:
                mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1)

    @gluon.jit
    def _consume_plane(x0_s, x1_s, v0_s, u0_s, v1_s, u1_s, y0_s, y1_s, z_s, ready, empty, w_bar, r_bar,
                       y0_desc, y1_desc, r0_desc, r1_desc, count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                       PLANE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr, STAGES: gl.constexpr,
                       STATS: gl.constexpr, RESIDUAL: gl.constexpr, WAIT: gl.constexpr):  # fmt: skip
        # one warpgroup: output plane d0 + PLANE of each tile from the slabs of input planes d0 - 1 + PLANE ...
        # d0 + 1 + PLANE, each through its three row shifts: per tap [128, 32 + 16] x [32 + 16, 32] and x [.., 16]
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        UNIT: gl.constexpr = 3
        FIRST: gl.constexpr = UNIT * PLANE
        l32: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 32, 16])
        l16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        a32: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l32, k_width=2)
        a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l16, k_width=2)
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        tiles_d = gl.cdiv(D, 2)
        y0 = y0_s.index(PLANE)
        y1 = y1_s.index(PLANE)
        mbarrier.wait(w_bar, 0)
        shift32 = gl.zeros([32], gl.float32, gl.SliceLayout(0, l32))
        shift16 = gl.zeros([16], gl.float32, gl.SliceLayout(0, l16))
        i = 0
        for tile in range(pid, n_tiles, n_prog):
            b, d0, h0, w0 = _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            acc32 = gl.zeros([BM, 32], gl.float32, l32)
            acc16 = gl.zeros([BM, 16], gl.float32, l16)
            # input planes d0 - 1 + q, q = PLANE + p: a loop at run time over the depth taps p, so the compiler
            # does not hoist all 27 taps' weight descriptors out of the tile loop (they spilled); the column shift c
            # is the slab's ring buffer (3 slabs per input plane, STAGES == 3)
            for p in range(3):
                q = PLANE + p
                group = gl.where(q == 0, 0, gl.where(q == 3, 2, 1))
                # a group-1 buffer holds two of this tile's slabs (q = 1, 2), the others one
                phase = gl.where(group == 1, (q == 2).to(gl.int32), i & 1)
                for c in gl.static_range(3):
                    mbarrier.wait(ready.index(group * STAGES + c), phase)
                    for r in gl.static_range(3):
                        # the slab's rows r ... r + BLOCK_H - 1 (row shift r - 1), column shift c - 1: tap
                        # 9 * p + 3 * r + c
                        tap = 9 * p + 3 * r + c
                        a0 = _ring_rows(x0_s, c * (BLOCK_H + 2) + r, BLOCK_H).load(a32)
                        a1 = _ring_rows(x1_s, c * (BLOCK_H + 2) + r, BLOCK_H).load(a32)
                        acc32 = warpgroup_mma(a0, v0_s.index(tap), acc32, is_async=True)
                        acc32 = warpgroup_mma(a1, v1_s.index(tap), acc32, is_async=True)
                        # (the A operand's registers do not depend on N: the conversion moves nothing)
                        acc16 = warpgroup_mma(gl.convert_layout(a0, a16), u0_s.index(tap), acc16, is_async=True)
                        acc16 = warpgroup_mma(gl.convert_layout(a1, a16), u1_s.index(tap), acc16, is_async=True)
                        # only this product's 4 wgmmas may still run (one product's voxel registers in flight, not
                        # a slab's three: those spilled); at a slab's first, the previous slab's buffer is free
                        acc32, acc16 = warpgroup_mma_wait(num_outstanding=WAIT, deps=(acc32, acc16))
                        if r == 0:
                            _release_previous(empty, p, c, q, STAGES)
            acc32, acc16 = warpgroup_mma_wait(num_outstanding=0, deps=(acc32, acc16))
            _release_unit(empty, FIRST + 3 * UNIT - 1, UNIT, STAGES)
            d = d0 + PLANE
            if RESIDUAL:  # this plane's residual, loaded into its staging buffers after its previous store
                mbarrier.wait(r_bar.index(PLANE), i & 1)
                acc32 = acc32 + y0.reshape([BM, 32]).load(l32).to(gl.float32)
                acc16 = acc16 + y1.reshape([BM, 16]).load(l16).to(gl.float32)
            out32 = acc32.to(gl.float16)
            out16 = acc16.to(gl.float16)
            y0.reshape([BM, 32]).store(out32)
            y1.reshape([BM, 16]).store(out16)
            fence_async_shared()
            tma_store(y0_desc, [b, d, h0, w0, 0], y0)
            tma_store(y1_desc, [b, d, h0, w0, 32], y1)
            tma_store(y1_desc, [b, d, h0, w0, 48], z_s)
            if STATS:  # while the stores read the staging buffers out
                part = 2 * tile + PLANE
                count = gl.minimum(H - h0, BLOCK_H) * gl.minimum(W - w0, BLOCK_W)
                count = gl.where(d < D, count, 0).to(gl.float32)
                v32 = gl.arange(0, BM, layout=gl.SliceLayout(1, l32))
                v16 = gl.arange(0, BM, layout=gl.SliceLayout(1, l16))
                in32 = ((h0 + v32 // BLOCK_W) < H) & ((w0 + v32 % BLOCK_W) < W) & (d < D)
                in16 = ((h0 + v16 // BLOCK_W) < H) & ((w0 + v16 % BLOCK_W) < W) & (d < D)
                shift32 = _piece_stats(out32, shift32, mean_ptr, m2_ptr, count, in32, part, 0, 32, l32)
                shift16 = _piece_stats(out16, shift16, mean_ptr, m2_ptr, count, in16, part, 32, 16, l16)
                pad = part.to(gl.int64) * 64 + 48 + gl.arange(0, 16, layout=gl.SliceLayout(0, l16))
                zero = gl.zeros([16], gl.float32, gl.SliceLayout(0, l16))
                gl.store(mean_ptr + pad, zero)
                gl.store(m2_ptr + pad, zero)
                gl.store(count_ptr + part, count)
            tma.store_wait(pendings=0)
            if RESIDUAL:
                nb, nd, nh, nw = _tile_origin(tile + n_prog, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
                if tile + n_prog < n_tiles:
                    mbarrier.expect(r_bar.index(PLANE), r0_desc.block_type.nbytes + r1_desc.block_type.nbytes)
                    tma_load(r0_desc, [nb, nd + PLANE, nh, nw, 0], r_bar.index(PLANE), y0)
                    tma_load(r1_desc, [nb, nd + PLANE, nh, nw, 32], r_bar.index(PLANE), y1)
            i += 1

    @gluon.jit
    def _voxel_rows_kernel(x0_desc, x1_desc, x0h_desc, x1h_desc, v0_desc, u0_desc, v1_desc, u1_desc,
                           y0_desc, y1_desc, r0_desc, r1_desc, count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                           K0: gl.constexpr, K1: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr,
                           STAGES: gl.constexpr, STATS: gl.constexpr, RESIDUAL: gl.constexpr,
                           CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, WAIT: gl.constexpr,
                           num_warps: gl.constexpr):  # fmt: skip
        # the resident kernel's program with the voxel-row consumers: weights once, then the producer warp and the
        # two planes' warpgroups
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        gl.static_assert(STAGES == 3, "a slab's ring buffer is its column shift")
        v0_s = gl.allocate_shared_memory(gl.float16, [27, K0, 32], v0_desc.layout)
        u0_s = gl.allocate_shared_memory(gl.float16, [27, K0, 16], u0_desc.layout)
        v1_s = gl.allocate_shared_memory(gl.float16, [27, K1, 32], v1_desc.layout)
        u1_s = gl.allocate_shared_memory(gl.float16, [27, K1, 16], u1_desc.layout)
        w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(w_bar, count=1)
        mbarrier.expect(w_bar, 27 * (v0_desc.block_type.nbytes + u0_desc.block_type.nbytes
                                      + v1_desc.block_type.nbytes + u1_desc.block_type.nbytes))  # fmt: skip
        for tap in gl.static_range(27):
            row = tap * (K0 + K1)
            tma_load(v0_desc, [row, 0], w_bar, v0_s.index(tap))
            tma_load(u0_desc, [row, 32], w_bar, u0_s.index(tap))
            tma_load(v1_desc, [row + K0, 0], w_bar, v1_s.index(tap))
            tma_load(u1_desc, [row + K0, 32], w_bar, u1_s.index(tap))
        voxels: gl.constexpr = 32 * BLOCK_W
        gl.static_assert(STAGES * (BLOCK_H + 2) <= 32, "the slabs do not fit the ring")
        x0_s = gl.allocate_shared_memory(gl.float16, [voxels, K0], gl.NVMMASharedLayout(2 * K0, 16))
        x1_s = gl.allocate_shared_memory(gl.float16, [voxels, K1], gl.NVMMASharedLayout(2 * K1, 16))
        ready = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(3 * STAGES):
            mbarrier.init(ready.index(q), count=1)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(STAGES):
            mbarrier.init(empty.index(q), count=2)
        # staging: one pair of buffers per plane (channels 0-31, 32-47), and the padding channels' zeros
        y0_s = gl.allocate_shared_memory(gl.float16, [2, 1, 1, BLOCK_H, BLOCK_W, 32], y0_desc.layout)
        y1_s = gl.allocate_shared_memory(gl.float16, [2, 1, 1, BLOCK_H, BLOCK_W, 16], y1_desc.layout)
        z_s = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_H, BLOCK_W, 16], y1_desc.layout)
        zl: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [num_warps, 1], [1, 0])
        z_s.reshape([BM, 16]).store(gl.zeros([BM, 16], gl.float16, zl))
        r_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(r_bar.index(0), count=1)
        mbarrier.init(r_bar.index(1), count=1)
        if RESIDUAL:  # each plane's first residual
            b, d0, h0, w0 = _tile_origin(gl.program_id(0), gl.cdiv(W, BLOCK_W), gl.cdiv(H, BLOCK_H),
                                         gl.cdiv(D, 2), BLOCK_H, BLOCK_W)  # fmt: skip
            for p in gl.static_range(2):
                mbarrier.expect(r_bar.index(p), r0_desc.block_type.nbytes + r1_desc.block_type.nbytes)
                tma_load(r0_desc, [b, d0 + p, h0, w0, 0], r_bar.index(p), y0_s.index(p))
                tma_load(r1_desc, [b, d0 + p, h0, w0, 32], r_bar.index(p), y1_s.index(p))
        fence_async_shared()
        gl.warp_specialize(
            [
                (_consume_plane, (x0_s, x1_s, v0_s, u0_s, v1_s, u1_s, y0_s, y1_s, z_s, ready, empty, w_bar, r_bar,
                                  y0_desc, y1_desc, r0_desc, r1_desc, count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                                  0, BLOCK_H, BLOCK_W, STAGES, STATS, RESIDUAL, WAIT)),
                (_consume_plane, (x0_s, x1_s, v0_s, u0_s, v1_s, u1_s, y0_s, y1_s, z_s, ready, empty, w_bar, r_bar,
                                  y0_desc, y1_desc, r0_desc, r1_desc, count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                                  1, BLOCK_H, BLOCK_W, STAGES, STATS, RESIDUAL, WAIT)),
                (_produce_units, (x0_desc, x1_desc, x0h_desc, x1h_desc, x0_s, x1_s, ready, empty, D, H, W, n_tiles,
                                  K0, BLOCK_H, BLOCK_W, STAGES, True)),
            ],  # fmt: skip
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )

    def _layout(block: list[int]) -> gl.NVMMASharedLayout:
        return gl.NVMMASharedLayout.get_default_for(block, gl.float16)

    def _constexprs(stats: bool, residual: bool) -> dict:
        const = dict(K0=_K0, K1=_K1, BLOCK_H=_BLOCK_H, BLOCK_W=_BLOCK_W, STAGES=_STAGES, STATS=stats)
        const.update(RESIDUAL=residual, CONSUMER_REGS=_CONSUMER_REGS, PRODUCER_REGS=_PRODUCER_REGS, WAIT=_WAIT)
        return dict(const, num_warps=_NUM_WARPS)

    # the TMA boxes: the slabs' (as the resident kernel's), the four weight blocks, the staging buffers (also the
    # residual's)
    _BOXES = {
        "x0_desc": [_BLOCK_H, 1, 1, _BLOCK_W, _K0],
        "x1_desc": [_BLOCK_H, 1, 1, _BLOCK_W, _K1],
        "x0h_desc": [2, 1, 1, _BLOCK_W, _K0],
        "x1h_desc": [2, 1, 1, _BLOCK_W, _K1],
        "v0_desc": [_K0, _N0],
        "u0_desc": [_K0, _N1],
        "v1_desc": [_K1, _N0],
        "u1_desc": [_K1, _N1],
        "y0_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N0],
        "y1_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N1],
        "r0_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N0],
        "r1_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N1],
    }

    def compile_for_sm90(stats: bool = True, residual: bool = False):
        """The kernel compiled for compute capability 9.0 without a GPU."""
        from triton.backends.compiler import GPUTarget

        sig = {k: f"tensordesc<fp16{v},{_layout(v)!r}>".replace(" ", "") for k, v in _BOXES.items()}
        sig.update({"count_ptr": "*fp32", "mean_ptr": "*fp32", "m2_ptr": "*fp32"})
        sig.update({"D": "i32", "H": "i32", "W": "i32", "n_tiles": "i32"})
        const = _constexprs(stats, residual)
        sig.update({k: "constexpr" for k in const})
        if not residual:
            for name in ("r0_desc", "r1_desc"):
                sig[name], const[name] = "constexpr", None
        src = ast_source()(fn=_voxel_rows_kernel, signature=sig, constexprs=const)
        options = dict(num_warps=_NUM_WARPS, maxnreg=_MAXNREG)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def conv3x3x3_voxel_rows(
    x: torch.Tensor,
    weights: torch.Tensor,
    stats: bool = False,
    programs: int | None = None,
    residual: torch.Tensor | None = None,
    slabs: bool | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """:py:func:`~monai.networks.kernels.conv3d_resident.conv3x3x3_resident`'s call and result, computed by the
    voxel-row kernel (slab loads only: ``slabs`` must not be ``False``); checks its inputs as that function does."""
    from monai.networks.kernels.conv3d_resident import _check_inputs
    from monai.networks.kernels.instance_norm import merge_parts_triton

    if slabs is False:
        raise ValueError("conv3x3x3_voxel_rows loads slabs only; call it with slabs=None or True.")
    _check_inputs(x, weights, programs, residual)
    n_b, _, d, h, w = x.shape
    y = torch.empty((n_b, _N, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    n_tiles = n_b * triton.cdiv(d, 2) * triton.cdiv(h, _BLOCK_H) * triton.cdiv(w, _BLOCK_W)
    grid = min(programs or torch.cuda.get_device_properties(x.device).multi_processor_count, n_tiles)
    count = mean = m2 = y
    if stats:
        mean = torch.empty((2 * n_tiles, _N), device=x.device, dtype=torch.float32)
        m2 = torch.empty_like(mean)
        count = torch.empty(2 * n_tiles, device=x.device, dtype=torch.float32)
    xv = x.permute(3, 0, 2, 4, 1)
    yv = y.permute(0, 2, 3, 4, 1)
    rv = residual.permute(0, 2, 3, 4, 1) if residual is not None else None
    tensors = dict(x0_desc=xv, x1_desc=xv, x0h_desc=xv, x1h_desc=xv)
    tensors.update(v0_desc=weights, u0_desc=weights, v1_desc=weights, u1_desc=weights)
    tensors.update(y0_desc=yv, y1_desc=yv, r0_desc=rv, r1_desc=rv)
    descs = {
        k: None if t is None else TensorDescriptor.from_tensor(t, _BOXES[k], _layout(_BOXES[k]))
        for k, t in tensors.items()
    }
    const = _constexprs(stats, residual is not None)
    _voxel_rows_kernel[(grid,)](**descs, count_ptr=count, mean_ptr=mean, m2_ptr=m2, D=d, H=h, W=w, n_tiles=n_tiles,
                                **const, maxnreg=_MAXNREG)  # fmt: skip
    if not stats:
        return y, None
    return y, merge_parts_triton(count.view(n_b, -1), mean.view(n_b, -1, _N), m2.view(n_b, -1, _N))


def compile_report() -> None:
    """Each variant compiled for sm_90: resources and any ptxas warning (a serialized wgmma shows here)."""
    import subprocess
    import tempfile

    from tests.benchmarks.experiments.gluon_conv3d.resident_weights import label, resources

    for stats, res in ((False, False), (False, True), (True, False), (True, True)):
        c = compile_for_sm90(stats=stats, residual=res)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(c.asm["ptx"])
            f.flush()
            log = subprocess.run(
                [triton.knobs.nvidia.ptxas.path, "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"],
                capture_output=True,
                text=True,
            ).stderr
        warnings = [line for line in log.splitlines() if "arning" in line]
        print(f"{label(stats, res)}, voxel rows: {resources(c)}" + "".join(f"\n    {w}" for w in warnings))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile-only", action="store_true", help="compile the kernel for sm_90 here (no GPU needed)")
    a = p.parse_args()
    if GLUON_MISSING is not None:
        raise SystemExit(f"needs Gluon: {GLUON_MISSING}")
    if a.compile_only:
        compile_report()
    else:
        from tests.benchmarks.experiments.gluon_conv3d import resident_weights

        resident_weights.run(extras=[("voxel rows", conv3x3x3_voxel_rows)])
