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
Gluon: the 27 taps' weights resident in shared memory, warp-specialized, the next instance norm's statistics and the
block's residual in its epilogue.

The Triton kernel of :py:mod:`monai.networks.kernels.conv3d` fetches every tap's weights from L2 once per program,
half of its L2 traffic. Here one program per SM loads the weights once (27 x [48, 64] fp16, 166 KB) and then walks
its share of the tiles. A tile is two consecutive output planes of 8 x 16 voxels, made from four input planes. For
each input plane and column shift one TMA load brings a slab of 10 x 16 voxels (the tile's rows and one above and
below; what lies outside the volume arrives as zeros, the convolution's padding); the three row shifts are views of
it, 8 rows from row 0, 1 or 2. So a tile takes 12 slab loads (184 KB) where single shifted patches took 36 (442 KB):
with patches the L2 ran at 80-85 % of its throughput and was what held the kernel back (ncu).

Three partitions (``gl.warp_specialize``) share the work: one warp loads the slabs into a ring of 3 buffers; one
warpgroup multiplies each tile's first output plane (slabs of input planes d0 - 1 ... d0 + 1) and another its second
(d0 ... d0 + 2), asynchronous wgmmas into a [64 output channels, 128 voxels] fp32 accumulator each. Each warpgroup's
epilogue (fp16 conversion, staging, TMA store, statistics, residual) runs while the other multiplies the three
slabs only its own plane uses, and the two planes take the one staging buffer in turn.

The statistics are the per-channel count, mean and centred sum of squares of each plane's stored (fp16) values over
the voxels inside the volume, written to part ``2 * tile + plane``; tiles are numbered sample-major, so each
sample's parts are contiguous and :py:func:`~monai.networks.kernels.instance_norm.merge_parts_triton` merges them.
With a ``residual`` (the SegResNet blocks' ``conv2(y) + x``), each plane's residual box is loaded by TMA into the
staging buffer when the buffer is handed to that plane's warpgroup, read back in the accumulator's layout
(``ldmatrix``, mirroring the store's ``stmatrix``) and added in fp32 before the rounding, so it takes no shared
memory of its own.

The statistics take one pass over the plane, shifted by the warpgroup's previous plane's means (near this plane's,
so the shifted sum of squares keeps its precision): the two-pass form kept 64 values per thread alive across the
mean's reduction and spilled. They run after the plane hands the staging buffer on, off the path the two planes'
epilogues take in turn (H100, 14 x 48 x 128^3: 8.18 ms against 8.31 with them between the store and its wait).

Measured on the H200, 14 x 48 x 128^3: 6.90 ms (530 TFLOP/s), 7.79 with statistics, 8.15 with statistics and a
residual, against 9.23 / 9.68 / 10.59 for the earlier single-warpgroup form with patch loads and 10.60 / 11.08 /
11.16 for the Triton kernel (docs/benchmarks.md).
Not here: other channel counts (96 channels' weights, 498 KB, do not fit). Shared memory: 165,888 B of weights,
3 slabs of 15,360 B in a ring of 32 rows (48 KB: a view's shape must be a power of two), a 16 KB output staging
buffer, barriers: about 231.8 KB of the 232,448 B an H100/H200 block may have.

Written for Triton's Gluon (``triton.experimental.gluon``, an experimental API). The slab views build on Triton 3.6
(PyTorch 2.11's CUDA builds) and 3.7 (2.13's); 3.8 and 3.9 refuse them (a view may not reach past the slice it
comes from). Which form runs is a table of measured releases (:py:data:`SLAB_TRITONS`), read when the fused path is
configured, never a compile at run time: elsewhere the kernel loads per-shift patches (36 loads of 8 x 16 voxels per
tile into a ring of 4, one row shift each), the measured form before the slabs (8.6 ms at 14 x 48 x 128^3 on the
H200 with Triton 3.6). :py:func:`resident_unavailable_reason` says where the kernel cannot run at all (Triton older
than 3.6 does not build it).
"""

from __future__ import annotations

import torch

from monai.networks.kernels.gluon_compat import GLUON_EXPECTED_FROM as OLDEST_TRITON
from monai.networks.kernels.gluon_compat import GLUON_MISSING as _GLUON_MISSING
from monai.networks.kernels.gluon_compat import triton_release
from monai.networks.kernels.instance_norm import StatsParts
from monai.utils.triton_support import interpreting, triton

__all__ = [
    "SLAB_TRITONS",
    "conv3x3x3_resident",
    "resident_unavailable_reason",
    "slab_loads_supported",
    "triton_release",
]

if _GLUON_MISSING is None:
    from monai.networks.kernels.gluon_compat import (
        NEW_REINTERPRET,
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

_C_IN = 48  # input channels read, as two power-of-two pieces (the MMA's K): channels 0-31 and 32-47
_K0, _K1 = 32, 16
_N = 64  # output channels written (48 real + 16 zero padding): the weights' columns, the MMA's M
_BLOCK_H, _BLOCK_W = 8, 16  # a tile's voxels per plane: the MMA's N = 128
# loads in flight, the most the shared memory holds beside the weights: 3 slabs (10 rows of 16 voxels, 15,360 B) or
# 4 patches (8 rows, 12,288 B)
_STAGES = {True: 3, False: 4}
# the Triton releases (major, minor) whose compiler builds the slab loads' views, measured by compiling all eight forms
# (slabs or patches, with or without statistics and a residual) for sm_90 with compile_for_sm90: 3.6.0 and 3.7.1
# build all eight (3.7.0 checked with statistics and a residual); 3.8.0 and 3.9.0 refuse the slab views (3.8: "source
# and result must not be subviews", 3.9: "result shared-memory footprint includes offsets not owned by the source
# subview") and build the four patch forms; 3.5.1 builds neither. tests/networks/kernels/test_conv3d_resident.py
# holds the installed Triton (and, where it can install it, 3.6) to this table.
SLAB_TRITONS = ((3, 6), (3, 7))
_NUM_WARPS = 4  # the default partition: the first plane's warpgroup
# 12 warps (3 warpgroups: two consumers, the producer's one warp padded to four) of at most _MAXNREG registers on
# average: the producer's warpgroup takes 24, the second consumer _CONSUMER_REGS, the first the rest (248)
_MAXNREG = 168
_CONSUMER_REGS = 232
_PRODUCER_REGS = 24
SHARED_LIMIT = 232448  # bytes of shared memory one block may use on compute capability 9.0


def slab_loads_supported(version: str | None = None) -> bool:
    """Whether Triton ``version`` (the installed one when ``None``) builds the kernel's slab loads, by the measured
    table :py:data:`SLAB_TRITONS`; a release outside it takes the patch loads. Reads no compiler."""
    return triton_release(version) in SLAB_TRITONS


def resident_unavailable_reason(device: torch.device | str) -> str | None:
    """``None`` where :py:func:`conv3x3x3_resident` runs on ``device``, else the reason in a few words.

    It needs Triton 3.6 or newer with Gluon's Hopper API (wgmma, TMA) and a CUDA GPU of compute capability 9.x;
    Triton's CPU interpreter does not run Gluon kernels.
    """
    device = torch.device(device)
    if _GLUON_MISSING is not None:
        return _GLUON_MISSING
    release = triton_release()
    if release is not None and release < OLDEST_TRITON:
        return f"Triton {triton.__version__} does not build the resident-weight convolution (3.6 or newer does)"
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

    # A tile's loads ("units") go in order, `unit` per input plane d0 - 1 + p (p = 0..3): with slabs 3 (one per
    # column shift), with patches 9 (one per row and column shift). Plane p = 0 feeds only the first output plane,
    # p = 1, 2 both, p = 3 only the second: the units' three groups.

    @gluon.constexpr_function
    def _unit_group(u, unit):
        return 0 if u < unit else (1 if u < 3 * unit else 2)

    @gluon.constexpr_function
    def _ready_uses(u, unit, stages, before):
        # unit u's ready barrier (one per group and ring buffer) completes once for each unit of its group that lands
        # in buffer u % stages: how many such units a tile has (before=False), or come before u in it (True)
        lo, hi = ((0, unit), (unit, 3 * unit), (3 * unit, 4 * unit))[_unit_group(u, unit)]
        return sum(q % stages == u % stages for q in range(lo, u if before else hi))

    @gluon.jit
    def _ring_row(ring, row: gl.constexpr):
        # row `row` of the slab ring (a row: 16 voxels x K channels), [16, K]. The ring is [voxels, K] (rows of 16
        # voxels back to back) or [rows, 16, K] (an experiment's ring of a row count that is no power of two)
        if len(ring.shape) == 3:
            return ring.index(row)
        else:
            return ring.slice(row * 16, 16)

    @gluon.jit
    def _ring_rows(ring, row: gl.constexpr, rows: gl.constexpr):
        # `rows` rows of the slab ring from its row `row` on, as [voxels, K]. A slice must start at a multiple of its
        # own size, so this takes one row and reinterprets it as the longer view; rows are whole swizzle atoms, so
        # the bytes are where that view expects them
        start = _ring_row(ring, row)
        if NEW_REINTERPRET:
            return start.reinterpret(gl.float16, [rows * 16, start.shape[1]], ring.layout)
        else:
            return start._reinterpret(gl.float16, [rows * 16, start.shape[1]], ring.layout)

    @gluon.jit
    def _ring_box(ring, row: gl.constexpr, desc):
        # the ring's rows from `row` on as the box of `desc` ([rows, 1, 1, 16, K]), for its TMA load
        start = _ring_row(ring, row)
        if NEW_REINTERPRET:
            return start.reinterpret(gl.float16, desc.block_type.shape, desc.layout)
        else:
            return start._reinterpret(gl.float16, desc.block_type.shape, desc.layout)

    @gluon.jit
    def _produce_units(x0_desc, x1_desc, x0h_desc, x1h_desc, x0_s, x1_s, ready, empty, D, H, W, n_tiles,
                       K0: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr,
                       STAGES: gl.constexpr, SLABS: gl.constexpr):  # fmt: skip
        # the producer warp: every tile's units in order into the ring; unit u goes to buffer u % STAGES (the same in
        # every tile: the units per tile are a multiple of STAGES) once both planes' consumers have released that
        # buffer's previous unit, and completes its group's barrier for that buffer. A slab u = 3 * p + c: input
        # plane d0 - 1 + p, rows h0 - 1 ... h0 + BLOCK_H, columns shifted by c - 1, read through the input's
        # [H, B, D, W, C] view as BLOCK_H rows and the last two (a box's sizes are powers of two); a patch
        # u = 9 * p + 3 * r + c: the tile's rows and columns shifted by r - 1 and c - 1
        UNIT: gl.constexpr = 3 if SLABS else 9
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        tiles_d = gl.cdiv(D, 2)
        i = 0
        for tile in range(pid, n_tiles, n_prog):
            b, d0, h0, w0 = _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            for u in gl.static_range(4 * UNIT):
                # use i * 4 * UNIT // STAGES + u // STAGES of the buffer waits for the one before to be released (a
                # fresh barrier passes the wait for parity 1)
                mbarrier.wait(empty.index(u % STAGES), ((i * (4 * UNIT // STAGES) + u // STAGES) & 1) ^ 1)
                bar = ready.index(_unit_group(u, UNIT) * STAGES + u % STAGES)
                dd = d0 + u // UNIT - 1
                ws = w0 + u % 3 - 1
                if SLABS:
                    mbarrier.expect(bar, x0_desc.block_type.nbytes + x0h_desc.block_type.nbytes
                                    + x1_desc.block_type.nbytes + x1h_desc.block_type.nbytes)  # fmt: skip
                    # (the slab's first ring row as an expression: a variable assigned in the unrolled loop would be
                    # a run-time integer, and a view's offset must be known when compiling)
                    tma_load(x0_desc, [h0 - 1, b, dd, ws, 0], bar,
                              _ring_box(x0_s, (u % STAGES) * (BLOCK_H + 2), x0_desc))
                    tma_load(x0h_desc, [h0 - 1 + BLOCK_H, b, dd, ws, 0], bar,
                              _ring_box(x0_s, (u % STAGES) * (BLOCK_H + 2) + BLOCK_H, x0h_desc))
                    tma_load(x1_desc, [h0 - 1, b, dd, ws, K0], bar,
                              _ring_box(x1_s, (u % STAGES) * (BLOCK_H + 2), x1_desc))
                    tma_load(x1h_desc, [h0 - 1 + BLOCK_H, b, dd, ws, K0], bar,
                              _ring_box(x1_s, (u % STAGES) * (BLOCK_H + 2) + BLOCK_H, x1h_desc))  # fmt: skip
                else:
                    mbarrier.expect(bar, x0_desc.block_type.nbytes + x1_desc.block_type.nbytes)
                    hs = h0 + (u % 9) // 3 - 1
                    tma_load(x0_desc, [b, dd, hs, ws, 0], bar, x0_s.index(u % STAGES))
                    tma_load(x1_desc, [b, dd, hs, ws, K0], bar, x1_s.index(u % STAGES))
            i += 1

    @gluon.jit
    def _release_unit(empty, u: gl.constexpr, UNIT: gl.constexpr, STAGES: gl.constexpr):
        # unit u's buffer back to the producer: a unit both planes use needs both consumers' arrivals (the barrier
        # counts 2), one only this plane uses is released for both
        if _unit_group(u, UNIT) == 1:
            mbarrier.arrive(empty.index(u % STAGES), count=1)
        else:
            mbarrier.arrive(empty.index(u % STAGES), count=2)

    @gluon.jit
    def _plane_stats(out, shift, count_ptr, mean_ptr, m2_ptr, part, d, h0, w0, D, H, W,
                     N: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr,
                     acc_layout: gl.constexpr):  # fmt: skip
        # count, per-channel mean and centred sum of squares of one stored plane `out` [N, voxels] over its voxels
        # inside the volume, into part `part`; a plane past the last (odd D) has count 0 and zero statistics.
        # Returns the means (the next plane's shift)
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        # a tile starts inside the volume's rows and columns, so the count is the clipped rectangle
        count = gl.minimum(H - h0, BLOCK_H) * gl.minimum(W - w0, BLOCK_W)
        count = gl.where(d < D, count, 0).to(gl.float32)
        # one pass, shifted by `shift` (the consumer's previous plane's means: near this plane's, so the shifted sum
        # of squares loses no precision to the mean) so no value waits in registers for the mean's reduction
        t = out.to(gl.float32) - shift[:, None]
        if (h0 + BLOCK_H > H) | (w0 + BLOCK_W > W) | (d >= D):
            # only a tile on the volume's far edges masks voxels (none where the edges are multiples of the tile's)
            i = gl.arange(0, BM, layout=gl.SliceLayout(0, acc_layout))
            inside = ((h0 + i // BLOCK_W) < H) & ((w0 + i % BLOCK_W) < W) & (d < D)
            t = gl.where(inside[None, :], t, 0.0)
        s1 = gl.sum(t, axis=1)
        s2 = gl.sum(t * t, axis=1)
        n = gl.maximum(count, 1.0)
        mean = gl.where(count > 0, shift + s1 / n, 0.0)
        m2 = gl.maximum(s2 - s1 * s1 / n, 0.0)
        cols = part.to(gl.int64) * N + gl.arange(0, N, layout=gl.SliceLayout(1, acc_layout))
        gl.store(mean_ptr + cols, mean)
        gl.store(m2_ptr + cols, m2)
        gl.store(count_ptr + part, count)
        return mean

    @gluon.jit
    def _consume_plane(x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, y_bar, y_desc, r_desc,
                       count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                       PLANE: gl.constexpr, K0: gl.constexpr, K1: gl.constexpr, N: gl.constexpr,
                       BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr, STAGES: gl.constexpr, STATS: gl.constexpr,
                       RESIDUAL: gl.constexpr, SLABS: gl.constexpr):  # fmt: skip
        # one warpgroup: output plane d0 + PLANE of each tile, from the units of input planes d0 - 1 + PLANE ...
        # d0 + 1 + PLANE (a slab through its three row shifts, a patch as it is): 27 products [N, K] x [K, BM] per
        # channel piece. Its epilogue runs while the other plane's warpgroup multiplies the slabs only that plane
        # uses; then it hands over the one staging buffer: the first plane's consumer to the second's, the second's
        # to the next tile's first (with a residual, by loading that plane's residual into it)
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        UNIT: gl.constexpr = 3 if SLABS else 9
        FIRST: gl.constexpr = UNIT * PLANE
        PRODUCTS: gl.constexpr = 3 if SLABS else 1  # per unit, each two wgmmas (channels 0-31, 32-47)
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BM, 16])  # fmt: skip
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        tiles_d = gl.cdiv(D, 2)
        mbarrier.wait(w_bar, 0)
        shift = gl.zeros([N], gl.float32, gl.SliceLayout(1, acc_layout))
        i = 0
        for tile in range(pid, n_tiles, n_prog):
            b, d0, h0, w0 = _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            acc = gl.zeros([N, BM], gl.float32, acc_layout)
            for u in gl.static_range(FIRST, FIRST + 3 * UNIT):
                phase = (i * _ready_uses(u, UNIT, STAGES, False) + _ready_uses(u, UNIT, STAGES, True)) & 1
                mbarrier.wait(ready.index(_unit_group(u, UNIT) * STAGES + u % STAGES), phase)
                for r in gl.static_range(PRODUCTS):
                    if SLABS:
                        # the slab's rows r ... r + BLOCK_H - 1 (row shift r - 1), column shift u % 3 - 1, depth
                        # u // 3 - PLANE: tap 9 * depth + 3 * r + u % 3
                        tap = 9 * (u // 3 - PLANE) + 3 * r + u % 3
                        a0 = _ring_rows(x0_s, (u % STAGES) * (BLOCK_H + 2) + r, BLOCK_H).permute((1, 0))
                        a1 = _ring_rows(x1_s, (u % STAGES) * (BLOCK_H + 2) + r, BLOCK_H).permute((1, 0))
                    else:  # patch u = 9 * p + shift: tap 9 * (p - PLANE) + shift
                        tap = u - FIRST
                        a0 = x0_s.index(u % STAGES).reshape([BM, K0]).permute((1, 0))
                        a1 = x1_s.index(u % STAGES).reshape([BM, K1]).permute((1, 0))
                    acc = warpgroup_mma(w0_s.index(tap).permute((1, 0)), a0, acc, is_async=True)
                    acc = warpgroup_mma(w1_s.index(tap).permute((1, 0)), a1, acc, is_async=True)
                if u > FIRST:  # only this unit's products may still run: the previous unit's buffer is free
                    acc = warpgroup_mma_wait(num_outstanding=2 * PRODUCTS, deps=(acc,))
                    _release_unit(empty, u - 1, UNIT, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _release_unit(empty, FIRST + 3 * UNIT - 1, UNIT, STAGES)
            # the epilogue: the staging buffer is this plane's (holding its residual) once y_bar says so
            mbarrier.wait(y_bar.index(PLANE), i & 1)
            if RESIDUAL:
                # each thread reads the residual's elements of its own accumulator registers (ldmatrix, mirroring
                # the store's stmatrix) and overwrites exactly those below, so no thread clobbers another's
                acc = acc + y_s.reshape([BM, N]).permute((1, 0)).load(acc_layout).to(gl.float32)
            out = acc.to(gl.float16)
            y_s.reshape([BM, N]).store(gl.permute(out, (1, 0)))
            fence_async_shared()
            tma_store(y_desc, [b, d0 + PLANE, h0, w0, 0], y_s)
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
                    tma_load(r_desc, [hb, hd, hh, hw, 0], y_bar.index(1 - PLANE), y_s)
            else:
                mbarrier.arrive(y_bar.index(1 - PLANE), count=1)
            if STATS:  # after the hand-over, off the path the two planes' epilogues take in turn
                shift = _plane_stats(out, shift, count_ptr, mean_ptr, m2_ptr, 2 * tile + PLANE, d0 + PLANE, h0, w0,
                                     D, H, W, N, BLOCK_H, BLOCK_W, acc_layout)  # fmt: skip
            i += 1

    @gluon.jit
    def _resident_conv_kernel(
        x0_desc,
        x1_desc,
        x0h_desc,
        x1h_desc,
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
        SLABS: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        # one persistent program per SM (never more than n_tiles); the default warpgroup computes each tile's first
        # output plane, a worker warpgroup its second, a worker warp loads the input. RESIDUAL: r_desc reads the
        # residual (None without), loaded into the staging buffer before each plane's epilogue adds it
        UNIT: gl.constexpr = 3 if SLABS else 9
        gl.static_assert((4 * UNIT) % STAGES == 0, "a tile's units must fill the ring a whole number of times")
        gl.static_assert(BLOCK_W == 16, "the ring's views take rows of 16 voxels")
        # the weights, once per program: tap 9 * depth + 3 * row shift + column shift as a [K0, N] and a [K1, N] block
        w0_s = gl.allocate_shared_memory(gl.float16, [27, K0, N], w0_desc.layout)
        w1_s = gl.allocate_shared_memory(gl.float16, [27, K1, N], w1_desc.layout)
        w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(w_bar, count=1)
        mbarrier.expect(w_bar, 27 * (w0_desc.block_type.nbytes + w1_desc.block_type.nbytes))
        for tap in gl.static_range(27):
            tma_load(w0_desc, [tap * (K0 + K1), 0], w_bar, w0_s.index(tap))
            tma_load(w1_desc, [tap * (K0 + K1) + K0, 0], w_bar, w1_s.index(tap))
        if SLABS:
            # the slab ring: voxels x channels in the boxes' swizzle (a voxel's K fp16 channels are 2 * K bytes), the
            # STAGES slabs' (BLOCK_H + 2) rows of BLOCK_W voxels rounded up to a power of two (3 x 10 -> 32 rows)
            voxels: gl.constexpr = 32 * BLOCK_W
            gl.static_assert(STAGES * (BLOCK_H + 2) <= 32, "the slabs do not fit the ring")
            x0_s = gl.allocate_shared_memory(gl.float16, [voxels, K0], gl.NVMMASharedLayout(2 * K0, 16))
            x1_s = gl.allocate_shared_memory(gl.float16, [voxels, K1], gl.NVMMASharedLayout(2 * K1, 16))
        else:  # the patch ring: STAGES boxes
            x0_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K0], x0_desc.layout)
            x1_s = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_H, BLOCK_W, K1], x1_desc.layout)
        # ready: one barrier per unit group and buffer (a consumer then sees every phase of the barriers it waits
        # on, though it skips the units only the other plane uses); empty: both consumers' releases per buffer
        ready = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(3 * STAGES):
            mbarrier.init(ready.index(q), count=1)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(STAGES):
            mbarrier.init(empty.index(q), count=2)
        # the output staging buffer, and y_bar[plane]: it is that plane's consumer's (and holds its residual)
        y_s = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_H, BLOCK_W, N], y_desc.layout)
        y_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(y_bar.index(0), count=1)
        mbarrier.init(y_bar.index(1), count=1)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        b, d0, h0, w0 = _tile_origin(gl.program_id(0), tiles_w, tiles_h, gl.cdiv(D, 2), BLOCK_H, BLOCK_W)
        if RESIDUAL:
            mbarrier.expect(y_bar.index(0), r_desc.block_type.nbytes)
            tma_load(r_desc, [b, d0, h0, w0, 0], y_bar.index(0), y_s)
        else:
            mbarrier.arrive(y_bar.index(0), count=1)
        # (a worker partition takes no distributed tensors: each consumer builds its accumulator itself)
        gl.warp_specialize(
            [
                (_consume_plane, (x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, y_bar, y_desc, r_desc, count_ptr,
                                  mean_ptr, m2_ptr, D, H, W, n_tiles, 0, K0, K1, N, BLOCK_H, BLOCK_W, STAGES, STATS,
                                  RESIDUAL, SLABS)),
                (_consume_plane, (x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, y_bar, y_desc, r_desc, count_ptr,
                                  mean_ptr, m2_ptr, D, H, W, n_tiles, 1, K0, K1, N, BLOCK_H, BLOCK_W, STAGES, STATS,
                                  RESIDUAL, SLABS)),
                (_produce_units, (x0_desc, x1_desc, x0h_desc, x1h_desc, x0_s, x1_s, ready, empty, D, H, W, n_tiles,
                                  K0, BLOCK_H, BLOCK_W, STAGES, SLABS)),
            ],  # fmt: skip
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )

    def _layout(block: list[int]) -> gl.NVMMASharedLayout:
        return gl.NVMMASharedLayout.get_default_for(block, gl.float16)

    def _constexprs(stats: bool, residual: bool, slabs: bool) -> dict:
        const = dict(K0=_K0, K1=_K1, N=_N, BLOCK_H=_BLOCK_H, BLOCK_W=_BLOCK_W, STAGES=_STAGES[slabs], STATS=stats)
        const.update(RESIDUAL=residual, CONSUMER_REGS=_CONSUMER_REGS, PRODUCER_REGS=_PRODUCER_REGS, SLABS=slabs)
        return dict(const, num_warps=_NUM_WARPS)

    def _boxes(slabs: bool) -> dict[str, list[int]]:
        # the TMA boxes of the kernel's descriptors: the two input channel pieces (slabs: a slab's first BLOCK_H rows
        # and its last two, over the input's [H, B, D, W, C] view; patches: over [B, D, H, W, C]), two weight
        # blocks, the output and the residual (the output's box: it lands in the output's staging buffer)
        rows = [_BLOCK_H, 1, 1] if slabs else [1, 1, _BLOCK_H]
        return {
            "x0_desc": rows + [_BLOCK_W, _K0],
            "x1_desc": rows + [_BLOCK_W, _K1],
            "x0h_desc": [2, 1, 1, _BLOCK_W, _K0],
            "x1h_desc": [2, 1, 1, _BLOCK_W, _K1],
            "w0_desc": [_K0, _N],
            "w1_desc": [_K1, _N],
            "y_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N],
            "r_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N],
        }

    def compile_for_sm90(stats: bool = True, residual: bool = False, slabs: bool = True):
        """The kernel compiled for compute capability 9.0 without a GPU (Triton's ``CompiledKernel``: shared bytes in
        ``metadata.shared``, the PTX in ``asm["ptx"]``), for the compile checks of the tests, CI and the experiments;
        ``slabs``: the slab loads (else per-shift patches).

        Not on the production path (Gluon's AST source: :py:func:`~.gluon_compat.ast_source`).
        """
        from triton.backends.compiler import GPUTarget

        source = ast_source()
        boxes = _boxes(slabs)
        sig = {k: f"tensordesc<fp16{v},{_layout(v)!r}>".replace(" ", "") for k, v in boxes.items()}
        # a descriptor the kernel does not use is None, a constexpr as the launcher specialises it: no parameter
        sig.update({"count_ptr": "*fp32", "mean_ptr": "*fp32", "m2_ptr": "*fp32"})
        sig.update({"D": "i32", "H": "i32", "W": "i32", "n_tiles": "i32"})
        const = _constexprs(stats, residual, slabs)
        sig.update({k: "constexpr" for k in const})
        for name, used in (("r_desc", residual), ("x0h_desc", slabs), ("x1h_desc", slabs)):
            if not used:
                sig[name], const[name] = "constexpr", None
        src = source(fn=_resident_conv_kernel, signature=sig, constexprs=const)
        options = dict(num_warps=_NUM_WARPS, maxnreg=_MAXNREG)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _channels_innermost(t: torch.Tensor) -> bool:
    """Whether TMA reads ``t`` ``[B, C, D, H, W]`` as it is laid out: channels innermost (a channels-last tensor, or a
    channel slice of one) and the other strides whole 16-byte units (its storage's alignment is checked apart)."""
    return t.ndim == 5 and t.stride(1) == 1 and all(t.stride(i) % 8 == 0 for i in (0, 2, 3, 4))


def _check_operand(t: torch.Tensor, x: torch.Tensor, what: str) -> None:
    """Raise ``ValueError`` unless ``t`` (the residual or the output) has the output's shape and TMA reads it."""
    name = "conv3x3x3_resident"
    out_shape = (x.shape[0], _N, *x.shape[2:])
    if tuple(t.shape) != out_shape:
        raise ValueError(f"{name}: the {what} must have the output's shape {out_shape}, got {tuple(t.shape)}.")
    if t.dtype != torch.float16 or not _channels_innermost(t):
        raise ValueError(
            f"{name} takes a channels-last fp16 {what}, got {t.dtype} with strides {t.stride()} (a channel slice of "
            "a channels-last tensor is taken too)."
        )
    if t.device != x.device:
        raise ValueError(f"{name}: the {what} is on {t.device}, the input on {x.device}.")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} reads the {what} by TMA, which needs 16-byte aligned storage.")


def _check_inputs(
    x: torch.Tensor,
    weights: torch.Tensor,
    programs: int | None,
    residual: torch.Tensor | None,
    out: torch.Tensor | None = None,
) -> None:
    """Raise ``ValueError`` for anything :py:func:`conv3x3x3_resident` does not take; runs before any GPU work."""
    name = "conv3x3x3_resident"
    if x.ndim != 5 or x.dtype != torch.float16 or x.stride(1) != 1:
        raise ValueError(
            f"{name} takes a channels-last [B, C, D, H, W] fp16 tensor, got {x.dtype} of shape {tuple(x.shape)} "
            f"with strides {x.stride()} (a channel slice of a channels-last tensor is taken too)."
        )
    if x.shape[1] < _C_IN or x.shape[1] % 8:
        raise ValueError(f"{name} reads 48 input channels of a multiple of 8 (e.g. 64), got {x.shape[1]} channels.")
    if not _channels_innermost(x):
        raise ValueError(f"{name} reads its input by TMA: its strides {x.stride()} must be multiples of 8 elements.")
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
        _check_operand(residual, x, "residual")
    if out is not None:
        _check_operand(out, x, "output")
    reason = resident_unavailable_reason(x.device)
    if reason is not None:
        raise ValueError(f"{name} cannot run on {x.device}: {reason}.")


def conv3x3x3_resident(
    x: torch.Tensor,
    weights: torch.Tensor,
    stats: bool = False,
    programs: int | None = None,
    residual: torch.Tensor | None = None,
    slabs: bool | None = None,
    out: torch.Tensor | None = None,
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
        slabs: load slabs (``True``) or per-shift patches (``False``); ``None``: slabs where the installed Triton
            builds them (:py:func:`slab_loads_supported`). The fused path passes the form its configuration chose.
        out: where to write the output, ``[B, 64, D, H, W]`` fp16: a channels-last tensor or a channel slice of one
            (``x`` and ``residual`` may be channel slices too); a new tensor when ``None``.

    Returns:
        ``(y, stats)``: ``y`` ``[B, 64, D, H, W]`` channels-last fp16; the statistics or ``None``.
    """
    _check_inputs(x, weights, programs, residual, out)
    n_b, _, d, h, w = x.shape
    y = out
    if y is None:
        y = torch.empty((n_b, _N, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    n_tiles = n_b * triton.cdiv(d, 2) * triton.cdiv(h, _BLOCK_H) * triton.cdiv(w, _BLOCK_W)
    grid = min(programs or torch.cuda.get_device_properties(x.device).multi_processor_count, n_tiles)
    # part 2 * tile + plane; sample b's tiles are the b-th n_tiles / B consecutive ones
    parts = StatsParts.allocate(2 * n_tiles, _N, y, stats)
    if slabs is None:
        slabs = slab_loads_supported()
    boxes = _boxes(slabs)
    # [B, D, H, W, C] views (channels innermost) for the output, the residual and the patches, [H, B, D, W, C] for
    # the slabs (a slab's rows are its boxes' outermost dimension). A descriptor left None (the residual's without
    # one, the slabs' last rows for patches) is a constexpr to the launcher: the kernel it runs has no such work
    yv = y.permute(0, 2, 3, 4, 1)
    xv = x.permute(3, 0, 2, 4, 1) if slabs else x.permute(0, 2, 3, 4, 1)
    rv = residual.permute(0, 2, 3, 4, 1) if residual is not None else None
    tensors = dict(x0_desc=xv, x1_desc=xv, x0h_desc=xv if slabs else None, x1h_desc=xv if slabs else None)
    tensors.update(w0_desc=weights, w1_desc=weights, y_desc=yv, r_desc=rv)
    descs = {
        k: None if t is None else TensorDescriptor.from_tensor(t, boxes[k], _layout(boxes[k]))
        for k, t in tensors.items()
    }
    const = _constexprs(stats, residual is not None, slabs)
    _resident_conv_kernel[(grid,)](**descs, count_ptr=parts.count, mean_ptr=parts.mean, m2_ptr=parts.m2, D=d, H=h,
                                   W=w, n_tiles=n_tiles, **const, maxnreg=_MAXNREG)  # fmt: skip
    return y, parts.merged(n_b)
