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
"""A persistent 3x3x3 convolution (48 -> 48 channels, stride 1, zero padding 1, no bias) for Hopper GPUs, written in
Gluon, with the 27 taps' weights resident in shared memory and the next instance norm's statistics in its epilogue.

The Triton kernel of :py:mod:`monai.networks.kernels.conv3d` fetches every tap's weights from L2 once per program,
half of its L2 traffic. Here one program per SM loads the weights once (27 x [48, 64] fp16, 166 KB) and then walks
its share of the tiles. A tile is two consecutive output planes of 8 x 16 voxels: the four input planes they need
times the 9 in-plane shifts give 36 input patches, each loaded once by TMA (what lies outside the volume arrives as
zeros, the convolution's padding) into a ring of 4 shared-memory buffers, and multiplied on the tensor cores
(asynchronous wgmma) into two [64 output channels, 128 voxels] fp32 accumulators, one per plane. The loads run 3
patches ahead over the program's whole sequence of (tile, patch) pairs, so the next tile's first patches arrive
while this one finishes and stores.

A tile's second plane is stored during the next tile's first 9 patches (which feed only the first plane), so the
tensor cores keep running while it is converted, staged and, with ``stats``, reduced. The statistics are the
per-channel count, mean and centred sum of squares of each plane's stored (fp16) values over the voxels inside the
volume, written to part ``2 * tile + plane``; tiles are numbered sample-major, so each sample's parts are
contiguous and :py:func:`~monai.networks.kernels.instance_norm.merge_parts_triton` merges them. Each part is written
by the one program that owns its tile.

With a ``residual`` (the SegResNet blocks' ``conv2(y) + x``), each plane's residual box is loaded by TMA into the
output staging buffer as soon as the previous store has read it out: a tile's first plane's during its input plane
p = 2 (18 patches before its epilogue), its second plane's during the next tile's second patch (7 patches before).
The epilogue reads it back in the accumulator's layout (``ldmatrix``, mirroring the store's ``stmatrix``), adds it in
fp32 and overwrites it with the sum, each thread the elements it read, so the residual takes no shared memory of its
own (one more barrier) and no registers while the products run. Loading it into registers by pointer instead would
keep 64 fp16 values per thread beside the two 64-register accumulators through the last patches (one 2-byte load per
value: a thread's accumulator holds pairs of voxels of a channel, 128 B apart), and a coalesced load converted to
that layout needs a 16 KB scratch buffer the shared memory does not have. Without a residual the kernel is the same
as before it had one (``r_desc`` is then ``None``, a constexpr).

Measured on the H200, 14 x 48 x 128^3: 9.20 ms (397 TFLOP/s), 9.75 with statistics, 10.53 with statistics and a
residual, against 10.66 / 11.04 / 11.21 ms for the Triton kernel's launch on the fused path (docs/benchmarks.md).
Not here: other channel counts (96 channels' weights, 498 KB, do not fit). Shared memory: 165,888 B of weights,
4 x 12,288 B of input ring, a 16 KB output staging buffer (231,464 B of the 232,448 B an H100/H200 block may have;
231,480 B with the residual's barrier).

The warp-specialized form (``WARP_SPECIALIZED``, the default) runs the same tiles, patches and products in three
partitions: one warp loads the patches into the ring, one warpgroup multiplies and stores each tile's first output
plane (patches 0-26) and another its second (patches 9-35). So each warpgroup's epilogue (conversion, staging, TMA
store, statistics, residual) runs while the other multiplies the 9 patches only its own plane uses, the loads never
wait for an epilogue, and the two planes share the one staging buffer in turn. Its outputs and statistics equal the
single warpgroup's bit for bit (same products in the same order per plane); 14 x 48 x 128^3 on the H200: 8.62 ms
(424 TFLOP/s), 8.98 with statistics, 9.99 with statistics and residual, against 9.27 / 9.69 / 10.62 for one warpgroup.

Written for Triton 3.6's Gluon (``triton.experimental.gluon``, an experimental API; it also compiles with 3.9);
:py:func:`resident_unavailable_reason` says where this kernel cannot run.
"""

from __future__ import annotations

import torch

from monai.networks.kernels.instance_norm import merge_parts_triton
from monai.utils.triton_support import interpreting, triton

__all__ = ["conv3x3x3_resident", "resident_unavailable_reason"]

_GLUON_MISSING: str | None = None
if triton is None:
    _GLUON_MISSING = "Triton is not installed (it ships with the CUDA builds of PyTorch)"
else:
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import (
            fence_async_shared,
            mbarrier,
            tma,
            warpgroup_mma,
            warpgroup_mma_wait,
        )
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        # newer Tritons (3.9) name the TMA copies async_load / async_store and make the old names raise; 3.5-3.6
        # have only the old ones
        _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
        _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    except ImportError as e:  # a Triton without Gluon's Hopper API; the fused path then keeps the Triton kernel
        _GLUON_MISSING = f"Triton {triton.__version__} has no usable Gluon ({e})"

_C_IN = 48  # input channels read, as two power-of-two pieces (the MMA's K): channels 0-31 and 32-47
_K0, _K1 = 32, 16
_N = 64  # output channels written (48 real + 16 zero padding): the weights' columns, the MMA's M
_BLOCK_H, _BLOCK_W = 8, 16  # a tile's voxels per plane: the MMA's N = 128
_STAGES = 4  # input patches in flight: the most the shared memory holds beside the weights
_NUM_WARPS = 4  # one warpgroup: both accumulators fit its registers without spills
# the warp-specialized form: 12 warps (3 warpgroups: two consumers, the producer's warp padded to one) at most
# _MAXNREG registers each on average; the producer's takes 24 and the second consumer CONSUMER_REGS, the first the rest
WARP_SPECIALIZED = True
_MAXNREG = 168
_CONSUMER_REGS = 232
_PRODUCER_REGS = 24
SHARED_LIMIT = 232448  # bytes of shared memory one block may use on compute capability 9.0
_DESCRIPTORS = ("x0_desc", "x1_desc", "w0_desc", "w1_desc", "y_desc", "r_desc")  # the kernel's, in its order


def resident_unavailable_reason(device: torch.device | str) -> str | None:
    """``None`` where :py:func:`conv3x3x3_resident` runs on ``device``, else the reason in a few words.

    It needs Triton's Gluon with its Hopper API (wgmma, TMA) and a CUDA GPU of compute capability 9.x; Triton's CPU
    interpreter does not run Gluon kernels.
    """
    device = torch.device(device)
    if _GLUON_MISSING is not None:
        return _GLUON_MISSING
    if interpreting():
        return "the Triton interpreter (TRITON_INTERPRET=1) does not run Gluon kernels"
    if device.type != "cuda":
        return f"the resident-weight convolution runs on CUDA GPUs, not on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"the resident-weight convolution needs compute capability 9.x (Hopper), this GPU is {major}.{minor}"
    return None


if _GLUON_MISSING is None:

    @gluon.jit
    def _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr):
        # (sample, first output plane, first row, first column) of `tile`: columns vary fastest, then rows, plane
        # pairs, samples, so the tiles (and their statistics' parts) of one sample are consecutive
        tw = tile % tiles_w
        rest = tile // tiles_w
        th = rest % tiles_h
        rest = rest // tiles_h
        return rest // tiles_d, (rest % tiles_d) * 2, th * BLOCK_H, tw * BLOCK_W

    @gluon.jit
    def _load_patch(x0_desc, x1_desc, x0_s, x1_s, ready, stage, b, d0, h0, w0, patch, K0: gl.constexpr):
        # patch = 9 * p + s of the tile at (b, d0, h0, w0): input plane d0 - 1 + p shifted by s (row offset
        # s // 3 - 1, column offset s % 3 - 1), both channel pieces, into ring buffer `stage`
        dd = d0 + patch // 9 - 1
        hs = h0 + (patch % 9) // 3 - 1
        ws = w0 + patch % 3 - 1
        bar = ready.index(stage)
        mbarrier.expect(bar, x0_desc.block_type.nbytes + x1_desc.block_type.nbytes)
        _tma_load(x0_desc, [b, dd, hs, ws, 0], bar, x0_s.index(stage))
        _tma_load(x1_desc, [b, dd, hs, ws, K0], bar, x1_s.index(stage))

    @gluon.jit
    def _plane_stats(out, count_ptr, mean_ptr, m2_ptr, part, d, h0, w0, D, H, W,
                     N: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr,
                     acc_layout: gl.constexpr):  # fmt: skip
        # count, per-channel mean and centred sum of squares of one stored plane `out` [N, voxels] over its voxels
        # inside the volume, into part `part`; a plane past the last (odd D) has count 0 and zero statistics
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        i = gl.arange(0, BM, layout=gl.SliceLayout(0, acc_layout))
        inside = ((h0 + i // BLOCK_W) < H) & ((w0 + i % BLOCK_W) < W) & (d < D)
        # a tile starts inside the volume's rows and columns, so the count is the clipped rectangle
        count = gl.minimum(H - h0, BLOCK_H) * gl.minimum(W - w0, BLOCK_W)
        count = gl.where(d < D, count, 0).to(gl.float32)
        vals = gl.where(inside[None, :], out.to(gl.float32), 0.0)
        mean = gl.sum(vals, axis=1) / gl.maximum(count, 1.0)
        centred = gl.where(inside[None, :], vals - mean[:, None], 0.0)
        m2 = gl.sum(centred * centred, axis=1)
        cols = part.to(gl.int64) * N + gl.arange(0, N, layout=gl.SliceLayout(1, acc_layout))
        gl.store(mean_ptr + cols, mean)
        gl.store(m2_ptr + cols, m2)
        gl.store(count_ptr + part, count)

    @gluon.jit
    def _load_residual(r_desc, y_s, r_bar, b, d, h0, w0):
        # the residual box of output plane d into the staging buffer, once its previous store has read it out; the
        # plane's epilogue waits on r_bar (what lies outside the volume arrives as zeros and is never stored)
        tma.store_wait(pendings=0)
        mbarrier.expect(r_bar, r_desc.block_type.nbytes)
        _tma_load(r_desc, [b, d, h0, w0, 0], r_bar, y_s)

    @gluon.jit
    def _store_plane(y_desc, y_s, acc, r_bar, count_ptr, mean_ptr, m2_ptr, part, b, d, h0, w0, D, H, W,
                     N: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr, STATS: gl.constexpr,
                     RESIDUAL: gl.constexpr, R_PHASE: gl.constexpr, acc_layout: gl.constexpr):  # fmt: skip
        # accumulator [N, voxels] (+ the residual the staging buffer holds, RESIDUAL) -> fp16 output plane d through
        # the staging buffer (TMA clips what lies outside the volume), then its statistics while the store runs
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        if RESIDUAL:
            # _load_residual waited for the previous store; each thread reads the residual's elements of its own
            # accumulator registers and overwrites exactly those below, so no thread clobbers another's
            mbarrier.wait(r_bar, R_PHASE)
            acc = acc + y_s.reshape([BM, N]).permute((1, 0)).load(acc_layout).to(gl.float32)
            out = acc.to(gl.float16)
        else:
            out = acc.to(gl.float16)
            tma.store_wait(pendings=0)  # the staging buffer's previous store has been read out
        y_s.reshape([BM, N]).store(gl.permute(out, (1, 0)))
        fence_async_shared()
        _tma_store(y_desc, [b, d, h0, w0, 0], y_s)
        if STATS:
            _plane_stats(out, count_ptr, mean_ptr, m2_ptr, part, d, h0, w0, D, H, W, N, BLOCK_H, BLOCK_W, acc_layout)

    @gluon.jit
    def _resident_conv_kernel(
        x0_desc,
        x1_desc,
        w0_desc,
        w1_desc,
        y_desc,
        r_desc,
        count_ptr,
        mean_ptr,
        m2_ptr,
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
        STATS: gl.constexpr,
        RESIDUAL: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        # one persistent program per SM (never more than n_tiles: a program without a tile would leave its first
        # loads in flight); tile t of the program runs 36 patches, patch 9 * p + s: input plane d0 - 1 + p, shift s.
        # It feeds output plane d0 through tap (depth p, shift s) for p <= 2 and plane d0 + 1 through tap
        # (depth p - 1, shift s) for p >= 1. RESIDUAL: r_desc reads the residual (None without), which each plane's
        # TMA load puts into the staging buffer well before its epilogue adds it
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        PATCHES: gl.constexpr = 36
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        # the weights, once per program: tap 9 * depth + shift as a [K0, N] and a [K1, N] block
        w0_s = gl.allocate_shared_memory(gl.float16, [27, K0, N], w0_desc.layout)
        w1_s = gl.allocate_shared_memory(gl.float16, [27, K1, N], w1_desc.layout)
        w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(w_bar, count=1)
        mbarrier.expect(w_bar, 27 * (w0_desc.block_type.nbytes + w1_desc.block_type.nbytes))
        for tap in gl.static_range(27):
            _tma_load(w0_desc, [tap * (K0 + K1), 0], w_bar, w0_s.index(tap))
            _tma_load(w1_desc, [tap * (K0 + K1) + K0, 0], w_bar, w1_s.index(tap))
        # the ring of input patches, one barrier per buffer, and the output staging buffer
        x0_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K0], x0_desc.layout)
        x1_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K1], x1_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        y_s = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_H, BLOCK_W, N], y_desc.layout)
        if RESIDUAL:
            # a plane's residual load completes this barrier's phase 0 for a first plane, phase 1 for a second: each
            # tile loads its first plane's residual, then (during the next tile) its second plane's
            r_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(r_bar, count=1)
        else:
            r_bar = w_bar  # never waited on: the kernel without a residual is the same as before it had one

        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16]
        )
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        tiles_d = gl.cdiv(D, 2)
        # the program's (tile, patch) sequence starts with its first tile's first STAGES - 1 patches (loading while
        # the weights arrive); from then on consuming patch `count` issues patch count + STAGES - 1 into the buffer
        # patch count - 1 has just released
        b, d0, h0, w0 = _tile_origin(pid, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
        for q in gl.static_range(STAGES - 1):
            _load_patch(x0_desc, x1_desc, x0_s, x1_s, ready, q, b, d0, h0, w0, q, K0)
        mbarrier.wait(w_bar, 0)

        count = 0  # patches consumed so far: the ring position and the barriers' phase
        acc1 = gl.zeros([N, BM], gl.float32, acc_layout)  # the previous tile's second plane, until stored
        prev = pid  # that tile, and where its second plane goes
        pb, pd, ph, pw = b, d0 + 1, h0, w0
        for tile in range(pid, n_tiles, n_prog):
            b, d0, h0, w0 = _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            nxt = tile + n_prog  # the tile the look-ahead runs into near the end of this one
            nb, nd0, nh0, nw0 = _tile_origin(nxt, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            acc0 = gl.zeros([N, BM], gl.float32, acc_layout)
            for p in gl.static_range(4):
                if p == 1:
                    # the previous tile's second plane, now that the first plane's store has long left the staging
                    # buffer (no wait); the last plane-0 patch's products still run meanwhile
                    if tile != pid:
                        _store_plane(y_desc, y_s, acc1, r_bar, count_ptr, mean_ptr, m2_ptr, 2 * prev + 1, pb, pd, ph,
                                     pw, D, H, W, N, BLOCK_H, BLOCK_W, STATS, RESIDUAL, 1, acc_layout)  # fmt: skip
                    acc1 = gl.zeros([N, BM], gl.float32, acc_layout)
                if RESIDUAL and p == 2:
                    # this tile's first plane's residual: the second plane's store above has long been read out, and
                    # the load has 18 patches' products (~5 us) to arrive
                    _load_residual(r_desc, y_s, r_bar, b, d0, h0, w0)
                for s in range(9):
                    stage = count % STAGES
                    mbarrier.wait(ready.index(stage), (count // STAGES) & 1)
                    a0 = x0_s.index(stage).reshape([BM, K0]).permute((1, 0))
                    a1 = x1_s.index(stage).reshape([BM, K1]).permute((1, 0))
                    if p <= 2:
                        acc0 = warpgroup_mma(w0_s.index(9 * p + s).permute((1, 0)), a0, acc0, is_async=True)
                        acc0 = warpgroup_mma(w1_s.index(9 * p + s).permute((1, 0)), a1, acc0, is_async=True)
                    if p >= 1:
                        acc1 = warpgroup_mma(w0_s.index(9 * p - 9 + s).permute((1, 0)), a0, acc1, is_async=True)
                        acc1 = warpgroup_mma(w1_s.index(9 * p - 9 + s).permute((1, 0)), a1, acc1, is_async=True)
                    # only this patch's 2 or 4 products may still run: the previous patch's buffer is free
                    if p == 0:
                        acc0 = warpgroup_mma_wait(num_outstanding=2, deps=(acc0,))
                    elif p == 3:
                        acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc1,))
                    else:
                        acc0, acc1 = warpgroup_mma_wait(num_outstanding=4, deps=(acc0, acc1))
                    nstage = (count + STAGES - 1) % STAGES
                    ahead = 9 * p + s + STAGES - 1
                    if 9 * p + 8 + STAGES - 1 < PATCHES:  # compile time: this plane's look-ahead stays in the tile
                        _load_patch(x0_desc, x1_desc, x0_s, x1_s, ready, nstage, b, d0, h0, w0, ahead, K0)
                    elif ahead < PATCHES:
                        _load_patch(x0_desc, x1_desc, x0_s, x1_s, ready, nstage, b, d0, h0, w0, ahead, K0)
                    elif nxt < n_tiles:  # the next tile's first patches load during this tile's end and epilogue
                        _load_patch(x0_desc, x1_desc, x0_s, x1_s, ready, nstage, nb, nd0, nh0, nw0, ahead - PATCHES,
                                    K0)  # fmt: skip
                    if RESIDUAL and p == 0:
                        if (s == 1) & (tile != pid):
                            # the previous tile's second plane's residual, once the first plane's store (issued at
                            # that tile's end, a patch's products ago) has left the staging buffer; 7 patches (~2 us)
                            # to arrive before that plane's epilogue at p == 1. Earlier, the wait for the store would
                            # stall the warpgroup while no products run
                            _load_residual(r_desc, y_s, r_bar, pb, pd, ph, pw)
                    count += 1
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
            _store_plane(y_desc, y_s, acc0, r_bar, count_ptr, mean_ptr, m2_ptr, 2 * tile, b, d0, h0, w0, D, H, W,
                         N, BLOCK_H, BLOCK_W, STATS, RESIDUAL, 0, acc_layout)  # fmt: skip
            prev = tile
            pb, pd, ph, pw = b, d0 + 1, h0, w0
        # the last tile's second plane (its residual's latency shows here, once per program)
        if RESIDUAL:
            _load_residual(r_desc, y_s, r_bar, pb, pd, ph, pw)
        _store_plane(y_desc, y_s, acc1, r_bar, count_ptr, mean_ptr, m2_ptr, 2 * prev + 1, pb, pd, ph, pw, D, H, W,
                     N, BLOCK_H, BLOCK_W, STATS, RESIDUAL, 1, acc_layout)  # fmt: skip
        tma.store_wait(pendings=0)

    # ---- the warp-specialized form: a producer warp and one consumer warpgroup per output plane ----
    _GROUP_BOUNDS = ((0, 9), (9, 27), (27, 36))

    @gluon.constexpr_function
    def _patch_group(j):
        # a tile's patches by the output planes they feed: 0-8 (input plane d0 - 1) only the first, 9-26 both,
        # 27-35 (input plane d0 + 2) only the second
        return 0 if j < 9 else (1 if j < 27 else 2)

    @gluon.constexpr_function
    def _ready_uses(j, stages, before):
        # patch j's ready barrier (one per group and ring buffer) completes once for each patch of its group that
        # lands in buffer j % stages: how many such patches a tile has (before=False), or come before j (True)
        lo, hi = _GROUP_BOUNDS[_patch_group(j)]
        return sum(q % stages == j % stages for q in range(lo, j if before else hi))

    @gluon.jit
    def _produce_patches(x0_desc, x1_desc, x0_s, x1_s, ready, empty, D, H, W, n_tiles,
                         K0: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr,
                         STAGES: gl.constexpr):  # fmt: skip
        # the producer warp: every tile's 36 patches in order into the ring; patch j of a tile goes to buffer
        # j % STAGES (36 is a multiple of STAGES, so the same buffer in every tile) once both planes' consumers
        # have released that buffer's previous patch, and signals its group's barrier for that buffer
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        tiles_d = gl.cdiv(D, 2)
        i = 0
        for tile in range(pid, n_tiles, n_prog):
            b, d0, h0, w0 = _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            for j in gl.static_range(36):
                s = j % STAGES
                # the buffer's use number i * (36 // STAGES) + j // STAGES waits for the one before to be released
                # (a fresh barrier passes the wait for parity 1)
                mbarrier.wait(empty.index(s), ((i * (36 // STAGES) + j // STAGES) & 1) ^ 1)
                bar = ready.index(_patch_group(j) * STAGES + s)
                mbarrier.expect(bar, x0_desc.block_type.nbytes + x1_desc.block_type.nbytes)
                dd = d0 + j // 9 - 1
                hs = h0 + (j % 9) // 3 - 1
                ws = w0 + j % 3 - 1
                _tma_load(x0_desc, [b, dd, hs, ws, 0], bar, x0_s.index(s))
                _tma_load(x1_desc, [b, dd, hs, ws, K0], bar, x1_s.index(s))
            i += 1

    @gluon.jit
    def _release_patch(empty, j: gl.constexpr, STAGES: gl.constexpr):
        # patch j's buffer back to the producer: a patch both planes use needs both consumers' arrivals (the
        # barrier counts 2), one only this plane uses is released for both
        if _patch_group(j) == 1:
            mbarrier.arrive(empty.index(j % STAGES), count=1)
        else:
            mbarrier.arrive(empty.index(j % STAGES), count=2)

    @gluon.jit
    def _consume_plane(x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, y_bar, y_desc, r_desc,
                       count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                       PLANE: gl.constexpr, K0: gl.constexpr, K1: gl.constexpr, N: gl.constexpr,
                       BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr, STAGES: gl.constexpr, STATS: gl.constexpr,
                       RESIDUAL: gl.constexpr):  # fmt: skip
        # one warpgroup: output plane d0 + PLANE of each tile, from the tile's patches 9 * PLANE ... 9 * PLANE + 26
        # (input planes d0 - 1 + PLANE ... d0 + 1 + PLANE through taps 0 ... 26). Its epilogue runs while the other
        # plane's warpgroup multiplies the patches only that plane uses, then it hands over the one staging buffer:
        # the first plane's consumer to the second's, the second's to the next tile's first (with a residual, by
        # loading that plane's residual into it)
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        FIRST: gl.constexpr = 9 * PLANE
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BM, 16])  # fmt: skip
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        tiles_d = gl.cdiv(D, 2)
        mbarrier.wait(w_bar, 0)
        i = 0
        for tile in range(pid, n_tiles, n_prog):
            b, d0, h0, w0 = _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            acc = gl.zeros([N, BM], gl.float32, acc_layout)
            for j in gl.static_range(FIRST, FIRST + 27):
                s = j % STAGES
                phase = (i * _ready_uses(j, STAGES, False) + _ready_uses(j, STAGES, True)) & 1
                mbarrier.wait(ready.index(_patch_group(j) * STAGES + s), phase)
                a0 = x0_s.index(s).reshape([BM, K0]).permute((1, 0))
                a1 = x1_s.index(s).reshape([BM, K1]).permute((1, 0))
                acc = warpgroup_mma(w0_s.index(j - FIRST).permute((1, 0)), a0, acc, is_async=True)
                acc = warpgroup_mma(w1_s.index(j - FIRST).permute((1, 0)), a1, acc, is_async=True)
                if j > FIRST:  # only this patch's two products may still run: the previous patch's buffer is free
                    acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc,))
                    _release_patch(empty, j - 1, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _release_patch(empty, FIRST + 26, STAGES)
            # the epilogue: the staging buffer is this plane's (holding its residual) once y_bar says so
            mbarrier.wait(y_bar.index(PLANE), i & 1)
            if RESIDUAL:
                acc = acc + y_s.reshape([BM, N]).permute((1, 0)).load(acc_layout).to(gl.float32)
            out = acc.to(gl.float16)
            y_s.reshape([BM, N]).store(gl.permute(out, (1, 0)))
            fence_async_shared()
            _tma_store(y_desc, [b, d0 + PLANE, h0, w0, 0], y_s)
            if STATS:  # while the store reads the staging buffer out
                _plane_stats(out, count_ptr, mean_ptr, m2_ptr, 2 * tile + PLANE, d0 + PLANE, h0, w0, D, H, W,
                             N, BLOCK_H, BLOCK_W, acc_layout)  # fmt: skip
            tma.store_wait(pendings=0)
            if PLANE == 0:  # to this tile's second plane
                hb, hd, hh, hw = b, d0 + 1, h0, w0
                more: gl.constexpr = True
            else:  # to the next tile's first plane, if the program has one
                hb, hd, hh, hw = _tile_origin(tile + n_prog, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
                more = tile + n_prog < n_tiles
            if RESIDUAL:
                if more:
                    mbarrier.expect(y_bar.index(1 - PLANE), r_desc.block_type.nbytes)
                    _tma_load(r_desc, [hb, hd, hh, hw, 0], y_bar.index(1 - PLANE), y_s)
            else:
                mbarrier.arrive(y_bar.index(1 - PLANE), count=1)
            i += 1

    @gluon.jit
    def _resident_conv_ws_kernel(
        x0_desc,
        x1_desc,
        w0_desc,
        w1_desc,
        y_desc,
        r_desc,
        count_ptr,
        mean_ptr,
        m2_ptr,
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
        STATS: gl.constexpr,
        RESIDUAL: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        # the same tiles, patches and products as _resident_conv_kernel, in three partitions: the default warpgroup
        # computes each tile's first output plane, a second warpgroup its second plane, one warp loads the patches
        gl.static_assert(36 % STAGES == 0, "a tile's 36 patches must fill the ring a whole number of times")
        w0_s = gl.allocate_shared_memory(gl.float16, [27, K0, N], w0_desc.layout)
        w1_s = gl.allocate_shared_memory(gl.float16, [27, K1, N], w1_desc.layout)
        w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(w_bar, count=1)
        mbarrier.expect(w_bar, 27 * (w0_desc.block_type.nbytes + w1_desc.block_type.nbytes))
        for tap in gl.static_range(27):
            _tma_load(w0_desc, [tap * (K0 + K1), 0], w_bar, w0_s.index(tap))
            _tma_load(w1_desc, [tap * (K0 + K1) + K0, 0], w_bar, w1_s.index(tap))
        x0_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K0], x0_desc.layout)
        x1_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K1], x1_desc.layout)
        # ready: one barrier per patch group and buffer (a consumer then sees every phase of the barriers it waits
        # on, though it skips the patches only the other plane uses); empty: both consumers' releases per buffer
        ready = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(3 * STAGES):
            mbarrier.init(ready.index(q), count=1)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(STAGES):
            mbarrier.init(empty.index(q), count=2)
        y_s = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_H, BLOCK_W, N], y_desc.layout)
        # y_bar[plane]: the staging buffer is that plane's consumer's (and holds its residual)
        y_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(y_bar.index(0), count=1)
        mbarrier.init(y_bar.index(1), count=1)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        b, d0, h0, w0 = _tile_origin(gl.program_id(0), tiles_w, tiles_h, gl.cdiv(D, 2), BLOCK_H, BLOCK_W)
        if RESIDUAL:
            mbarrier.expect(y_bar.index(0), r_desc.block_type.nbytes)
            _tma_load(r_desc, [b, d0, h0, w0, 0], y_bar.index(0), y_s)
        else:
            mbarrier.arrive(y_bar.index(0), count=1)
        # (a worker partition takes no distributed tensors: each consumer builds its accumulator itself)
        gl.warp_specialize(
            [
                (_consume_plane, (x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, y_bar, y_desc, r_desc, count_ptr,
                                  mean_ptr, m2_ptr, D, H, W, n_tiles, 0, K0, K1, N, BLOCK_H, BLOCK_W, STAGES, STATS,
                                  RESIDUAL)),
                (_consume_plane, (x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, y_bar, y_desc, r_desc, count_ptr,
                                  mean_ptr, m2_ptr, D, H, W, n_tiles, 1, K0, K1, N, BLOCK_H, BLOCK_W, STAGES, STATS,
                                  RESIDUAL)),
                (_produce_patches, (x0_desc, x1_desc, x0_s, x1_s, ready, empty, D, H, W, n_tiles, K0, BLOCK_H,
                                    BLOCK_W, STAGES)),
            ],  # fmt: skip
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )

    def _layout(block: list[int]) -> gl.NVMMASharedLayout:
        return gl.NVMMASharedLayout.get_default_for(block, gl.float16)

    def _constexprs(stats: bool, stages: int, residual: bool = False, warp_specialized: bool = False) -> dict:
        const = dict(K0=_K0, K1=_K1, N=_N, BLOCK_H=_BLOCK_H, BLOCK_W=_BLOCK_W, STAGES=stages, STATS=stats)
        const.update(RESIDUAL=residual, num_warps=_NUM_WARPS)
        if warp_specialized:
            const.update(CONSUMER_REGS=_CONSUMER_REGS, PRODUCER_REGS=_PRODUCER_REGS)
        return const

    def _boxes() -> dict[str, list[int]]:
        # the TMA boxes of the kernel's six descriptors: two input channel pieces, two weight blocks, the output and
        # the residual (the output's box: it lands in the output's staging buffer)
        return {
            "x0_desc": [1, 1, _BLOCK_H, _BLOCK_W, _K0],
            "x1_desc": [1, 1, _BLOCK_H, _BLOCK_W, _K1],
            "w0_desc": [_K0, _N],
            "w1_desc": [_K1, _N],
            "y_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N],
            "r_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N],
        }

    def compile_for_sm90(stats: bool = True, stages: int = _STAGES, residual: bool = False,
                         warp_specialized: bool | None = None):
        """The kernel compiled for compute capability 9.0 without a GPU (Triton's ``CompiledKernel``: shared bytes in
        ``metadata.shared``, the PTX in ``asm["ptx"]``), for the compile checks of the tests and the experiments."""
        from triton.backends.compiler import GPUTarget
        from triton.experimental.gluon._runtime import GluonASTSource

        boxes = _boxes()
        sig = {k: f"tensordesc<fp16{boxes[k]},{_layout(boxes[k])!r}>".replace(" ", "") for k in _DESCRIPTORS}
        # without a residual r_desc is None, a constexpr as the launcher specialises it: no kernel parameter
        sig["r_desc"] = sig["y_desc"] if residual else "constexpr"
        sig.update({"count_ptr": "*fp32", "mean_ptr": "*fp32", "m2_ptr": "*fp32"})
        sig.update({"D": "i32", "H": "i32", "W": "i32", "n_tiles": "i32"})
        ws = WARP_SPECIALIZED if warp_specialized is None else warp_specialized
        const = _constexprs(stats, stages, residual, ws)
        sig.update({k: "constexpr" for k in const})
        if not residual:
            const["r_desc"] = None
        src = GluonASTSource(fn=_resident_conv_ws_kernel if ws else _resident_conv_kernel, signature=sig,
                             constexprs=const)  # fmt: skip
        options = dict(num_warps=_NUM_WARPS, maxnreg=_MAXNREG) if ws else dict(num_warps=_NUM_WARPS)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _check_inputs(x: torch.Tensor, weights: torch.Tensor, programs: int | None, residual: torch.Tensor | None) -> None:
    """Raise ``ValueError`` for anything :py:func:`conv3x3x3_resident` does not take; runs before any GPU work."""
    name = "conv3x3x3_resident"
    if x.ndim != 5 or x.dtype != torch.float16 or not x.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(
            f"{name} takes a channels-last [B, C, D, H, W] fp16 tensor, got {x.dtype} of shape {tuple(x.shape)} "
            f"with strides {x.stride()}."
        )
    if x.shape[1] < _C_IN or x.shape[1] % 8:
        raise ValueError(f"{name} reads 48 input channels of a multiple of 8 (e.g. 64), got {x.shape[1]} channels.")
    if x.numel() == 0:
        raise ValueError(f"{name} takes a non-empty tensor, got shape {tuple(x.shape)}.")
    if x.data_ptr() % 16 or weights.data_ptr() % 16:
        raise ValueError(f"{name} reads its input and weights by TMA, which needs 16-byte aligned storage.")
    if weights.shape != (27 * _C_IN, _N) or weights.dtype != torch.float16 or not weights.is_contiguous():
        raise ValueError(
            f"{name} takes contiguous fp16 weights of shape (1296, 64), got {weights.dtype} of shape "
            f"{tuple(weights.shape)}: build them with conv3x3x3_weights(weight, out_columns=64, planes=1)."
        )
    if weights.device != x.device:
        raise ValueError(f"{name}: the weights are on {weights.device}, the input on {x.device}.")
    if programs is not None and programs < 1:
        raise ValueError(f"{name} takes programs >= 1 (or None: one per SM), got {programs}.")
    if residual is not None:
        out_shape = (x.shape[0], _N, *x.shape[2:])
        if tuple(residual.shape) != out_shape:
            raise ValueError(
                f"{name}: the residual must have the output's shape {out_shape}, got {tuple(residual.shape)}."
            )
        if residual.dtype != torch.float16 or not residual.is_contiguous(memory_format=torch.channels_last_3d):
            raise ValueError(
                f"{name} takes a channels-last fp16 residual, got {residual.dtype} with strides {residual.stride()}."
            )
        if residual.device != x.device:
            raise ValueError(f"{name}: the residual is on {residual.device}, the input on {x.device}.")
        if residual.data_ptr() % 16:
            raise ValueError(f"{name} reads the residual by TMA, which needs 16-byte aligned storage.")
    reason = resident_unavailable_reason(x.device)
    if reason is not None:
        raise ValueError(f"{name} cannot run on {x.device}: {reason}.")


def conv3x3x3_resident(
    x: torch.Tensor,
    weights: torch.Tensor,
    stats: bool = False,
    programs: int | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """3x3x3 convolution, stride 1, zero padding 1, no bias, of 48 channels to 48 (written as 64, the last 16
    zeros), of a channels-last fp16 tensor on a Hopper GPU, plus an optional residual.

    Args:
        x: ``[B, C, D, H, W]`` fp16 in ``torch.channels_last_3d`` on a GPU :py:func:`resident_unavailable_reason`
            accepts, ``C >= 48`` a multiple of 8; channels 0-47 are read (the rest may be zero padding).
        weights: ``[1296, 64]`` fp16 from ``conv3x3x3_weights(weight, out_columns=64, planes=1)`` of a ``Conv3d``
            weight ``[48, 48, 3, 3, 3]``.
        stats: also return the output's per-(sample, channel) ``(mean, var)``, each ``[B, 64]`` float32 (biased
            variance), of the values as stored.
        programs: the persistent grid; one program per SM when ``None`` (never more than the tiles). Fewer make each
            program walk more tiles (the tests use this).
        residual: added to the convolution before the fp16 rounding (in fp32, as
            :py:func:`~monai.networks.kernels.conv3d.conv3x3x3` adds it) and the statistics: ``[B, 64, D, H, W]``
            channels-last fp16 on ``x``'s device, channels 48-63 zero (they are added to the output's zero padding).

    Returns:
        ``(y, stats)``: ``y`` ``[B, 64, D, H, W]`` channels-last fp16; the statistics or ``None``.
    """
    _check_inputs(x, weights, programs, residual)
    n_b, _, d, h, w = x.shape
    y = torch.empty((n_b, _N, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    n_tiles = n_b * triton.cdiv(d, 2) * triton.cdiv(h, _BLOCK_H) * triton.cdiv(w, _BLOCK_W)
    grid = min(programs or torch.cuda.get_device_properties(x.device).multi_processor_count, n_tiles)
    count = mean = m2 = y  # stand-ins the kernel never reads when no statistics are asked for
    if stats:
        # part 2 * tile + plane; sample b's tiles are the b-th n_tiles / B consecutive ones
        mean = torch.empty((2 * n_tiles, _N), device=x.device, dtype=torch.float32)
        m2 = torch.empty_like(mean)
        count = torch.empty(2 * n_tiles, device=x.device, dtype=torch.float32)
    boxes = _boxes()
    xv, yv = x.permute(0, 2, 3, 4, 1), y.permute(0, 2, 3, 4, 1)  # [B, D, H, W, C] views: channels innermost
    # without a residual r_desc is None, which the launcher specialises as a constexpr: the kernel it runs then has
    # neither the parameter nor any of the residual's work
    rv = residual.permute(0, 2, 3, 4, 1) if residual is not None else None
    tensors = (xv, xv, weights, weights, yv, rv)
    descs = [
        TensorDescriptor.from_tensor(t, boxes[k], _layout(boxes[k])) if t is not None else None
        for t, k in zip(tensors, _DESCRIPTORS)
    ]
    if WARP_SPECIALIZED:
        const = _constexprs(stats, _STAGES, residual is not None, True)
        _resident_conv_ws_kernel[(grid,)](*descs, count, mean, m2, d, h, w, n_tiles, **const, maxnreg=_MAXNREG)
    else:
        const = _constexprs(stats, _STAGES, residual is not None)
        _resident_conv_kernel[(grid,)](*descs, count, mean, m2, d, h, w, n_tiles, **const)
    if not stats:
        return y, None
    return y, merge_parts_triton(count.view(n_b, -1), mean.view(n_b, -1, _N), m2.view(n_b, -1, _N))
