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
"""The resident 48 -> 48 convolution with its weights in 40 KB less shared memory, spent on a deeper load ring and a
staging buffer per plane (issue 50, item 4; an experiment, not on any path).

:py:mod:`monai.networks.kernels.conv3d_resident` keeps each tap's weights as ``[K, 64 output channels]`` (the MMA's
A transposed, 16 zero columns so that M = 64): 27 x 6 KB = 166 KB. Here they are stored K-major, one row per output
channel, the taps' 48 rows back to back (``[27 * 48 + 16, 48]``, the last 16 rows zeros): 126 KB. Tap ``t``'s A is
the 64 rows from row ``48 t`` on; its last 16 rows are the next tap's first, so accumulator rows 48-63 hold products
nobody wants and the epilogue writes zeros there instead (the same zero padding channels the resident kernel writes).

What the 40 KB buy, the two limits the resident kernel's measurements pointed at (docs/benchmarks.md, section 1):

* a ring of 4 slabs instead of 3: the second plane's warpgroup trails the first by one input plane (3 slabs), so with
  3 in flight the producer can rarely load ahead;
* a staging buffer per plane: no hand-over of one buffer between the planes' epilogues, and each plane's next
  residual is loaded into its own buffer as soon as its store has read the buffer out, a tile ahead of its use.

Everything else is the resident kernel's (its producer warp, ring views, tile order, unit groups and statistics are
imported).
Shared memory: 125,952 B of weights, 4 slabs in a ring of 40 rows (61,440 B), 2 staging buffers (32,768 B). A shape's
last two sizes must be powers of two (Triton 3.6 asserts it), so the weights are allocated as 41 boxes of 32 rows and
the ring as 40 rows of 16 voxels; a view starts at one of them and reaches on, as the resident kernel's slab views do.

Status (2026-12-08): compiled for sm_90 with Triton 3.6 on the CPU (``--compile-only``: 220,528 B of shared memory
with 4 slabs, 205,152 with 3; ptxas spills 44 / 112 / 280 B with 4 slabs and 0 / 8 / 152 with 3 for the plain, the
statistics and the statistics + residual forms, against the resident kernel's 8 / 0 / 124); not yet run on a GPU (none
was lent that session). ``run_h200.sh overlap_taps`` runs the check and the timing.

Compile for sm_90 here (no GPU; needs Triton 3.6 or 3.7, whose compilers build the slab views)::

    python tests/benchmarks/experiments/gluon_conv3d/overlap_taps.py --compile-only

On a Hopper GPU: checked against float64 and timed beside the resident kernel (``resident_weights.run``)::

    python tests/benchmarks/experiments/gluon_conv3d/overlap_taps.py
"""

# ruff: noqa: N803, N806 (Gluon's constexpr parameters and values are upper case, as in monai/networks/kernels)
from __future__ import annotations

import argparse
import functools

import torch
import triton

from monai.networks.kernels.gluon_compat import GLUON_MISSING

if GLUON_MISSING is None:
    from monai.networks.kernels.conv3d_resident import (
        _plane_stats,
        _produce_units,
        _ready_uses,
        _release_unit,
        _ring_rows,
        _tile_origin,
        _unit_group,
    )
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

_C = 48  # real input and output channels
_K0, _K1 = 32, 16  # input channels as two power-of-two pieces (the MMA's K)
_N = 64  # output channels written (the MMA's M): 48 real, 16 zeros
_ROWS = 27 * _C + 16  # the weights' rows: tap t's output channels at 48 t ... 48 t + 47, then 16 zero rows
_W_BOX = 32  # weight rows per TMA load (the rows are 41 such boxes)
_BLOCK_H, _BLOCK_W = 8, 16
_STAGES = 4  # slabs in flight
_NUM_WARPS = 4
_MAXNREG = 168
_CONSUMER_REGS = 232
_PRODUCER_REGS = 24

if GLUON_MISSING is None:

    @gluon.jit
    def _tap_rows(w_s, u: gl.constexpr, r: gl.constexpr, PLANE: gl.constexpr, N: gl.constexpr, C: gl.constexpr):
        # the A of the tap plane PLANE takes from slab u through row shift r - 1 (tap 9 * depth + 3 * r + column
        # shift, depth u // 3 - PLANE), [N, K]: rows C * tap ... C * tap + N - 1, the next tap's first N - C rows at
        # the end. A slice must start at a multiple of its own size, so this slices 16 rows and reinterprets them as
        # the longer view; C * tap rows are whole swizzle patterns (8 rows), so the bytes are where that view
        # expects them
        row: gl.constexpr = C * (9 * (u // 3 - PLANE) + 3 * r + u % 3)
        start = w_s.index(row // w_s.shape[1]).slice(row % w_s.shape[1], 16)
        if NEW_REINTERPRET:
            return start.reinterpret(gl.float16, [N, w_s.shape[2]], w_s.layout)
        else:
            return start._reinterpret(gl.float16, [N, w_s.shape[2]], w_s.layout)

    @gluon.jit
    def _consume_plane(x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, r_bar, y_desc, r_desc,
                       count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                       PLANE: gl.constexpr, C: gl.constexpr, N: gl.constexpr, BLOCK_H: gl.constexpr,
                       BLOCK_W: gl.constexpr, STAGES: gl.constexpr, STATS: gl.constexpr,
                       RESIDUAL: gl.constexpr):  # fmt: skip
        # one warpgroup: output plane d0 + PLANE of each tile from the slabs of input planes d0 - 1 + PLANE ...
        # d0 + 1 + PLANE, as the resident kernel's consumer, with its own staging buffer y_s[PLANE]
        BM: gl.constexpr = BLOCK_H * BLOCK_W
        UNIT: gl.constexpr = 3
        FIRST: gl.constexpr = UNIT * PLANE
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BM, 16])  # fmt: skip
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        tiles_w = gl.cdiv(W, BLOCK_W)
        tiles_h = gl.cdiv(H, BLOCK_H)
        tiles_d = gl.cdiv(D, 2)
        y = y_s.index(PLANE)
        mbarrier.wait(w_bar, 0)
        shift = gl.zeros([N], gl.float32, gl.SliceLayout(1, acc_layout))
        i = 0
        for tile in range(pid, n_tiles, n_prog):
            b, d0, h0, w0 = _tile_origin(tile, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
            acc = gl.zeros([N, BM], gl.float32, acc_layout)
            for u in gl.static_range(FIRST, FIRST + 3 * UNIT):
                phase = (i * _ready_uses(u, UNIT, STAGES, False) + _ready_uses(u, UNIT, STAGES, True)) & 1
                mbarrier.wait(ready.index(_unit_group(u, UNIT) * STAGES + u % STAGES), phase)
                for r in gl.static_range(3):
                    # the slab's rows r ... r + BLOCK_H - 1 (row shift r - 1), column shift u % 3 - 1
                    a0 = _ring_rows(x0_s, (u % STAGES) * (BLOCK_H + 2) + r, BLOCK_H).permute((1, 0))
                    a1 = _ring_rows(x1_s, (u % STAGES) * (BLOCK_H + 2) + r, BLOCK_H).permute((1, 0))
                    acc = warpgroup_mma(_tap_rows(w0_s, u, r, PLANE, N, C), a0, acc, is_async=True)
                    acc = warpgroup_mma(_tap_rows(w1_s, u, r, PLANE, N, C), a1, acc, is_async=True)
                if u > FIRST:  # only this unit's products may still run: the previous unit's buffer is free
                    acc = warpgroup_mma_wait(num_outstanding=6, deps=(acc,))
                    _release_unit(empty, u - 1, UNIT, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _release_unit(empty, FIRST + 3 * UNIT - 1, UNIT, STAGES)
            # rows C ... N - 1 multiplied the next tap's weights: the output's padding channels are zeros. (A
            # product by 0 / 1 rather than a select: the select spilled more; those rows are finite where the
            # input is, sums of 1296 fp16 products)
            real = gl.arange(0, N, layout=gl.SliceLayout(1, acc_layout)) < C
            acc = acc * real.to(gl.float32)[:, None]
            if RESIDUAL:  # this plane's residual, loaded into its staging buffer a tile ago
                mbarrier.wait(r_bar.index(PLANE), i & 1)
                acc = acc + y.reshape([BM, N]).permute((1, 0)).load(acc_layout).to(gl.float32)
            out = acc.to(gl.float16)
            y.reshape([BM, N]).store(gl.permute(out, (1, 0)))
            fence_async_shared()
            tma_store(y_desc, [b, d0 + PLANE, h0, w0, 0], y)
            if STATS:  # while the store reads the staging buffer out
                shift = _plane_stats(out, shift, count_ptr, mean_ptr, m2_ptr, 2 * tile + PLANE, d0 + PLANE, h0, w0,
                                     D, H, W, N, BLOCK_H, BLOCK_W, acc_layout)  # fmt: skip
            tma.store_wait(pendings=0)
            if RESIDUAL:  # the next tile's residual of this plane, into the buffer just read out
                nb, nd, nh, nw = _tile_origin(tile + n_prog, tiles_w, tiles_h, tiles_d, BLOCK_H, BLOCK_W)
                if tile + n_prog < n_tiles:
                    mbarrier.expect(r_bar.index(PLANE), r_desc.block_type.nbytes)
                    tma_load(r_desc, [nb, nd + PLANE, nh, nw, 0], r_bar.index(PLANE), y)
            i += 1

    @gluon.jit
    def _overlap_taps_kernel(x0_desc, x1_desc, x0h_desc, x1h_desc, w0_desc, w1_desc, y_desc, r_desc,
                             count_ptr, mean_ptr, m2_ptr, D, H, W, n_tiles,
                             K0: gl.constexpr, C: gl.constexpr, N: gl.constexpr, ROWS: gl.constexpr,
                             W_BOX: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_W: gl.constexpr,
                             STAGES: gl.constexpr, STATS: gl.constexpr, RESIDUAL: gl.constexpr,
                             CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                             num_warps: gl.constexpr):  # fmt: skip
        # the resident kernel's program: the weights once, then the producer warp and the two planes' warpgroups
        gl.static_assert(12 % STAGES == 0, "a tile's 12 slabs must fill the ring a whole number of times")
        gl.static_assert(ROWS % W_BOX == 0, "the weight rows are whole boxes")
        # [boxes, W_BOX, K]: a shape's last two sizes must be powers of two; the boxes lie back to back
        w0_s = gl.allocate_shared_memory(gl.float16, [ROWS // W_BOX, W_BOX, K0], w0_desc.layout)
        w1_s = gl.allocate_shared_memory(gl.float16, [ROWS // W_BOX, W_BOX, C - K0], w1_desc.layout)
        w_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(w_bar, count=1)
        mbarrier.expect(w_bar, (ROWS // W_BOX) * (w0_desc.block_type.nbytes + w1_desc.block_type.nbytes))
        for j in gl.static_range(ROWS // W_BOX):
            tma_load(w0_desc, [j * W_BOX, 0], w_bar, w0_s.index(j))
            tma_load(w1_desc, [j * W_BOX, K0], w_bar, w1_s.index(j))
        # the slab ring: STAGES slabs of BLOCK_H + 2 rows of BLOCK_W voxels, back to back, as [rows, 16 voxels, K]
        # (the resident kernel's ring views take either form)
        gl.static_assert(BLOCK_W == 16, "the ring's rows are 16 voxels")
        x0_s = gl.allocate_shared_memory(gl.float16, [STAGES * (BLOCK_H + 2), BLOCK_W, K0],
                                         gl.NVMMASharedLayout(2 * K0, 16))  # fmt: skip
        x1_s = gl.allocate_shared_memory(gl.float16, [STAGES * (BLOCK_H + 2), BLOCK_W, C - K0],
                                         gl.NVMMASharedLayout(2 * (C - K0), 16))  # fmt: skip
        ready = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(3 * STAGES):
            mbarrier.init(ready.index(q), count=1)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(STAGES):
            mbarrier.init(empty.index(q), count=2)
        # a staging buffer per plane, r_bar[plane]: its residual has landed
        y_s = gl.allocate_shared_memory(gl.float16, [2, 1, 1, BLOCK_H, BLOCK_W, N], y_desc.layout)
        r_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(r_bar.index(0), count=1)
        mbarrier.init(r_bar.index(1), count=1)
        if RESIDUAL:  # each plane's first residual
            b, d0, h0, w0 = _tile_origin(gl.program_id(0), gl.cdiv(W, BLOCK_W), gl.cdiv(H, BLOCK_H),
                                         gl.cdiv(D, 2), BLOCK_H, BLOCK_W)  # fmt: skip
            for p in gl.static_range(2):
                mbarrier.expect(r_bar.index(p), r_desc.block_type.nbytes)
                tma_load(r_desc, [b, d0 + p, h0, w0, 0], r_bar.index(p), y_s.index(p))
        gl.warp_specialize(
            [
                (_consume_plane, (x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, r_bar, y_desc, r_desc, count_ptr,
                                  mean_ptr, m2_ptr, D, H, W, n_tiles, 0, C, N, BLOCK_H, BLOCK_W, STAGES, STATS,
                                  RESIDUAL)),
                (_consume_plane, (x0_s, x1_s, w0_s, w1_s, y_s, ready, empty, w_bar, r_bar, y_desc, r_desc, count_ptr,
                                  mean_ptr, m2_ptr, D, H, W, n_tiles, 1, C, N, BLOCK_H, BLOCK_W, STAGES, STATS,
                                  RESIDUAL)),
                (_produce_units, (x0_desc, x1_desc, x0h_desc, x1h_desc, x0_s, x1_s, ready, empty, D, H, W, n_tiles,
                                  K0, BLOCK_H, BLOCK_W, STAGES, True)),
            ],  # fmt: skip
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )

    def _layout(block: list[int]) -> gl.NVMMASharedLayout:
        return gl.NVMMASharedLayout.get_default_for(block, gl.float16)

    def _constexprs(stats: bool, residual: bool, stages: int) -> dict:
        const = dict(K0=_K0, C=_C, N=_N, ROWS=_ROWS, W_BOX=_W_BOX, BLOCK_H=_BLOCK_H, BLOCK_W=_BLOCK_W)
        const.update(STAGES=stages, STATS=stats, RESIDUAL=residual)
        const.update(CONSUMER_REGS=_CONSUMER_REGS, PRODUCER_REGS=_PRODUCER_REGS)
        return dict(const, num_warps=_NUM_WARPS)

    # the TMA boxes: the slabs' (as the resident kernel's), the two weight pieces, the output and residual
    _BOXES = {
        "x0_desc": [_BLOCK_H, 1, 1, _BLOCK_W, _K0],
        "x1_desc": [_BLOCK_H, 1, 1, _BLOCK_W, _K1],
        "x0h_desc": [2, 1, 1, _BLOCK_W, _K0],
        "x1h_desc": [2, 1, 1, _BLOCK_W, _K1],
        "w0_desc": [_W_BOX, _K0],
        "w1_desc": [_W_BOX, _K1],
        "y_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N],
        "r_desc": [1, 1, _BLOCK_H, _BLOCK_W, _N],
    }

    def compile_for_sm90(stats: bool = True, residual: bool = False, stages: int = _STAGES):
        """The kernel compiled for compute capability 9.0 without a GPU."""
        from triton.backends.compiler import GPUTarget

        sig = {k: f"tensordesc<fp16{v},{_layout(v)!r}>".replace(" ", "") for k, v in _BOXES.items()}
        sig.update({"count_ptr": "*fp32", "mean_ptr": "*fp32", "m2_ptr": "*fp32"})
        sig.update({"D": "i32", "H": "i32", "W": "i32", "n_tiles": "i32"})
        const = _constexprs(stats, residual, stages)
        sig.update({k: "constexpr" for k in const})
        if not residual:
            sig["r_desc"], const["r_desc"] = "constexpr", None
        src = ast_source()(fn=_overlap_taps_kernel, signature=sig, constexprs=const)
        options = dict(num_warps=_NUM_WARPS, maxnreg=_MAXNREG)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def overlap_weights(gemm: torch.Tensor) -> torch.Tensor:
    """The kernel's ``[27 * 48 + 16, 48]`` weights (row ``48 tap + output channel``, column input channel, 16 zero
    rows at the end) from the resident kernel's ``[1296, 64]`` (row ``48 tap + input channel``, column output
    channel, 48-63 zeros)."""
    taps = gemm.view(27, _C, _N)[:, :, :_C].transpose(1, 2).reshape(27 * _C, _C)
    return torch.cat([taps, taps.new_zeros(_ROWS - 27 * _C, _C)]).contiguous()


_WEIGHTS: dict = {}  # the last [1296, 64] operand's layout, so a timed call does not rebuild it


def conv3x3x3_overlap_taps(
    x: torch.Tensor,
    weights: torch.Tensor,
    stats: bool = False,
    programs: int | None = None,
    residual: torch.Tensor | None = None,
    stages: int = _STAGES,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """:py:func:`~monai.networks.kernels.conv3d_resident.conv3x3x3_resident`'s call and result (slab loads), computed
    by this kernel with ``stages`` slabs in flight (3 or 4); checks its inputs as that function does."""
    from monai.networks.kernels.conv3d_resident import _check_inputs
    from monai.networks.kernels.instance_norm import StatsParts

    _check_inputs(x, weights, programs, residual)
    key = (weights.data_ptr(), weights._version)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()
        _WEIGHTS[key] = overlap_weights(weights)
    w = _WEIGHTS[key]
    n_b, _, d, h, w_ = x.shape
    y = torch.empty((n_b, _N, d, h, w_), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    n_tiles = n_b * triton.cdiv(d, 2) * triton.cdiv(h, _BLOCK_H) * triton.cdiv(w_, _BLOCK_W)
    grid = min(programs or torch.cuda.get_device_properties(x.device).multi_processor_count, n_tiles)
    parts = StatsParts.allocate(2 * n_tiles, _N, y, stats)
    xv = x.permute(3, 0, 2, 4, 1)
    yv = y.permute(0, 2, 3, 4, 1)
    rv = residual.permute(0, 2, 3, 4, 1) if residual is not None else None
    tensors = dict(x0_desc=xv, x1_desc=xv, x0h_desc=xv, x1h_desc=xv, w0_desc=w, w1_desc=w, y_desc=yv, r_desc=rv)
    descs = {
        k: None if t is None else TensorDescriptor.from_tensor(t, _BOXES[k], _layout(_BOXES[k]))
        for k, t in tensors.items()
    }
    const = _constexprs(stats, residual is not None, stages)
    _overlap_taps_kernel[(grid,)](**descs, count_ptr=parts.count, mean_ptr=parts.mean, m2_ptr=parts.m2, D=d, H=h,
                                  W=w_, n_tiles=n_tiles, **const, maxnreg=_MAXNREG)  # fmt: skip
    return y, parts.merged(n_b)


def compile_report() -> None:
    """Each variant compiled for sm_90: shared memory, registers, spills, instructions."""
    from tests.benchmarks.experiments.gluon_conv3d.resident_weights import FORMS, label, resources

    for stages in (3, 4):
        for stats, res in FORMS:
            c = compile_for_sm90(stats=stats, residual=res, stages=stages)
            print(f"{label(stats, res)}, overlapping taps, {stages} slabs: {resources(c)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile-only", action="store_true", help="compile the kernel for sm_90 here (no GPU needed)")
    a = p.parse_args()
    if GLUON_MISSING is not None:
        raise SystemExit(f"needs Gluon: {GLUON_MISSING}")
    from monai.networks.kernels.conv3d_resident import slab_loads_supported

    if not slab_loads_supported():
        raise SystemExit(f"needs Triton 3.6 or 3.7, whose compilers build its views; this is {triton.__version__}")
    if a.compile_only:
        compile_report()
    else:
        from tests.benchmarks.experiments.gluon_conv3d import resident_weights

        # 3 slabs first: the resident kernel's ring with only the layout and the buffers changed, so its lines print
        # even if the 4-slab form were to fail on the GPU
        variants = [(f"overlapping taps, {n} slabs", functools.partial(conv3x3x3_overlap_taps, stages=n))
                    for n in (3, 4)]
        resident_weights.run(extras=variants, patches=False)
