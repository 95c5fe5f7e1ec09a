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
"""How fast the tensor cores multiply a 48 -> 48 channel tap in each operand form, with nothing else in the loop: the
question before a resident convolution that does not pay for 16 padding channels (issue 50, item 4; not on any path).

The resident kernel (:py:mod:`monai.networks.kernels.conv3d_resident`) multiplies ``[64 output channels (48 real),
K] x [K, 128 voxels]``, both operands in shared memory: a quarter of its MMA work is padding. Gluon tensors have
power-of-two shapes, so 48 output channels as the MMA's N take two accumulators, 32 + 16, which read the voxel
operand twice from shared memory unless it sits in registers. Forms (one warpgroup, K = 32 + 16 input channels):

* ``padded_ss``: the resident kernel's, M = 64 output channels, N = 128 voxels, both operands in shared memory.
* ``n48_ss``: M = 128 voxels, N = 32 + 16 output channels, both operands in shared memory.
* ``n48_rs``: the same with the voxels loaded into registers once per product (``ldmatrix``) and used by both.
* ``n64_rs``: M = 128 voxels, N = 64 (48 real), the voxels in registers.

Each program loads its operands once and then repeats the products ``ITERS`` times, three a round (a slab's three row
shifts in the resident kernel) with a wait for them at the round's end, the same discipline in every form (a register
operand must stay alive until its products finish). The operands stay put, so this is the MMA's own rate in each
form, the upper bound of a convolution in it. Compile for sm_90 here (no GPU needed; prints
registers, spills and the wgmma instructions)::

    python tests/benchmarks/experiments/gluon_conv3d/mma_forms.py --compile-only

On a Hopper GPU (each form checked against torch, then timed; TFLOP/s of the 48 real output channels)::

    python tests/benchmarks/experiments/gluon_conv3d/mma_forms.py
"""

# ruff: noqa: N803, N806 (Gluon's constexpr parameters and values are upper case, as in monai/networks/kernels)
from __future__ import annotations

import argparse

import torch
import triton

from monai.networks.kernels.gluon_compat import GLUON_MISSING

if GLUON_MISSING is None:
    from monai.networks.kernels.gluon_compat import (
        ast_source,
        fence_async_shared,
        gl,
        gluon,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

FORMS = ("padded_ss", "n48_ss", "n48_rs", "n64_rs")
_BM, _K0, _K1 = 128, 32, 16  # voxels per product; input channels in two power-of-two pieces
_ITERS = 256

if GLUON_MISSING is None:

    @gluon.jit
    def _to_shared(ptr, ROWS: gl.constexpr, COLS: gl.constexpr):
        # a row-major [ROWS, COLS] fp16 matrix from global memory into an MMA-ready shared buffer
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        values = gl.load(ptr + r[:, None] * COLS + c[None, :])
        shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, COLS], gl.float16)
        buffer = gl.allocate_shared_memory(gl.float16, [ROWS, COLS], shared)
        buffer.store(values)
        return buffer

    @gluon.jit
    def _store(out_ptr, acc, ROWS: gl.constexpr, COLS: gl.constexpr, layout: gl.constexpr):
        r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        gl.store(out_ptr + gl.program_id(0) * ROWS * COLS + r[:, None] * COLS + c[None, :], acc)

    @gluon.jit
    def _mma_kernel(x0_ptr, x1_ptr, w0_ptr, w1_ptr, v0_ptr, v1_ptr, u0_ptr, u1_ptr, out_ptr, out2_ptr,
                    FORM: gl.constexpr, ITERS: gl.constexpr):  # fmt: skip
        # x: voxels [128, K] (two pieces); w: weights [K, 64] (48 real + 16 zero columns); v / u: the weights'
        # columns 0-31 / 32-47 as [K, 32] / [K, 16]
        BM: gl.constexpr = 128
        x0_s = _to_shared(x0_ptr, BM, 32)
        x1_s = _to_shared(x1_ptr, BM, 16)
        if FORM == 0:  # padded_ss: acc [64 out, 128 voxels] += W^T X^T
            w0_s = _to_shared(w0_ptr, 32, 64)
            w1_s = _to_shared(w1_ptr, 16, 64)
            fence_async_shared()
            layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], instr_shape=[16, BM, 16])
            acc = gl.zeros([64, BM], gl.float32, layout)
            for _ in range(ITERS):
                for _r in gl.static_range(3):
                    acc = warpgroup_mma(w0_s.permute((1, 0)), x0_s.permute((1, 0)), acc, is_async=True)
                    acc = warpgroup_mma(w1_s.permute((1, 0)), x1_s.permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _store(out_ptr, acc, 64, BM, layout)
        elif FORM == 3:  # n64_rs: acc [128 voxels, 64 out] += X W, X from registers
            w0_s = _to_shared(w0_ptr, 32, 64)
            w1_s = _to_shared(w1_ptr, 16, 64)
            fence_async_shared()
            layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], instr_shape=[16, 64, 16])
            a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=2)
            acc = gl.zeros([BM, 64], gl.float32, layout)
            for _ in range(ITERS):
                for _r in gl.static_range(3):
                    acc = warpgroup_mma(x0_s.load(a_layout), w0_s, acc, is_async=True)
                    acc = warpgroup_mma(x1_s.load(a_layout), w1_s, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _store(out_ptr, acc, BM, 64, layout)
        else:  # n48: acc32 [128, 32] += X V, acc16 [128, 16] += X U
            v0_s = _to_shared(v0_ptr, 32, 32)
            v1_s = _to_shared(v1_ptr, 16, 32)
            u0_s = _to_shared(u0_ptr, 32, 16)
            u1_s = _to_shared(u1_ptr, 16, 16)
            fence_async_shared()
            l32: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], instr_shape=[16, 32, 16])
            l16: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], instr_shape=[16, 16, 16])
            a32: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l32, k_width=2)
            a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l16, k_width=2)
            acc32 = gl.zeros([BM, 32], gl.float32, l32)
            acc16 = gl.zeros([BM, 16], gl.float32, l16)
            for _ in range(ITERS):
                for _r in gl.static_range(3):
                    if FORM == 1:
                        acc32 = warpgroup_mma(x0_s, v0_s, acc32, is_async=True)
                        acc16 = warpgroup_mma(x0_s, u0_s, acc16, is_async=True)
                        acc32 = warpgroup_mma(x1_s, v1_s, acc32, is_async=True)
                        acc16 = warpgroup_mma(x1_s, u1_s, acc16, is_async=True)
                    else:  # (the layout conversion is free: the A operand's registers do not depend on N)
                        r0 = x0_s.load(a32)
                        r1 = x1_s.load(a32)
                        acc32 = warpgroup_mma(r0, v0_s, acc32, is_async=True)
                        acc16 = warpgroup_mma(gl.convert_layout(r0, a16), u0_s, acc16, is_async=True)
                        acc32 = warpgroup_mma(r1, v1_s, acc32, is_async=True)
                        acc16 = warpgroup_mma(gl.convert_layout(r1, a16), u1_s, acc16, is_async=True)
                acc32, acc16 = warpgroup_mma_wait(num_outstanding=0, deps=(acc32, acc16))
            _store(out_ptr, acc32, BM, 32, l32)
            _store(out2_ptr, acc16, BM, 16, l16)


def compile_for_sm90(form: str):
    """The kernel in ``form`` compiled for compute capability 9.0 without a GPU."""
    from triton.backends.compiler import GPUTarget

    names = ("x0_ptr", "x1_ptr", "w0_ptr", "w1_ptr", "v0_ptr", "v1_ptr", "u0_ptr", "u1_ptr")
    sig = {k: "*fp16" for k in names}
    sig.update({"out_ptr": "*fp32", "out2_ptr": "*fp32", "FORM": "constexpr", "ITERS": "constexpr"})
    src = ast_source()(fn=_mma_kernel, signature=sig, constexprs={"FORM": FORMS.index(form), "ITERS": _ITERS})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def run(programs: int = 132 * 8) -> None:
    """On a Hopper GPU: each form against torch, then its time and rate (48 real output channels)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(_BM, 48, generator=g) / 8).cuda().half()
    w = torch.zeros(48, 64)
    w[:, :48] = torch.randn(48, 48, generator=g) / 8
    w = w.cuda().half()
    ops = {  # the kernel's operands in its argument order
        "x0": x[:, :32], "x1": x[:, 32:], "w0": w[:32], "w1": w[32:],
        "v0": w[:32, :32], "v1": w[32:, :32], "u0": w[:32, 32:48], "u1": w[32:, 32:48],
    }  # fmt: skip
    ops = {k: t.contiguous() for k, t in ops.items()}
    expected = 3 * _ITERS * (x.float() @ w.float())  # [128 voxels, 64]
    flop = 2 * _BM * 48 * 48 * 3 * _ITERS * programs
    for form in FORMS:
        out = torch.empty(programs, _BM * 64, device="cuda")
        out2 = torch.empty(programs, _BM * 16, device="cuda")

        def launch(form=form, out=out, out2=out2):
            _mma_kernel[(programs,)](*ops.values(), out, out2, FORM=FORMS.index(form), ITERS=_ITERS, num_warps=4)

        launch()
        torch.cuda.synchronize()
        if form == "padded_ss":
            got = out[0].view(64, _BM).t()
        elif form == "n64_rs":
            got = out[0].view(_BM, 64)
        else:
            got = torch.cat([out[0, : _BM * 32].view(_BM, 32), out2[0].view(_BM, 16)], dim=1)
        err = ((got[:, :48] - expected[:, :48]).norm() / expected[:, :48].norm()).item()
        ms = triton.testing.do_bench(launch)
        print(f"{form:10s} {ms:8.3f} ms {flop / ms / 1e9:7.0f} TFLOP/s (48 real channels)  rel. error {err:.1e}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile-only", action="store_true", help="compile each form for sm_90 here (no GPU needed)")
    a = p.parse_args()
    if GLUON_MISSING is not None:
        raise SystemExit(f"needs Gluon: {GLUON_MISSING}")
    if a.compile_only:
        from tests.benchmarks.experiments.gluon_conv3d.resident_weights import resources

        for name in FORMS:
            try:
                print(f"{name:10s} {resources(compile_for_sm90(name))}")
            except Exception as e:  # report each form's compile error and go on to the next
                print(f"{name:10s} does not build: {(str(e).splitlines() or [type(e).__name__])[0]}")
    else:
        run()
