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
"""A Triton implicit-GEMM kernel for 3x3x3, stride-1, padding-1 ``Conv3d`` on NCDHW fp16/bf16 tensors."""

from __future__ import annotations

import torch

from monai.utils import optional_import

triton, has_triton = optional_import("triton")
tl, _ = optional_import("triton.language")

__all__ = ["has_triton", "conv3d_3x3x3"]

if has_triton:

    def _configs():
        out = []
        for bh, bw in ((1, 128), (2, 64), (2, 128)):
            for bn in (64, 32, 16):
                for warps in (4, 8):
                    for stages in (2, 3):
                        out.append(
                            triton.Config({"BLOCK_H": bh, "BLOCK_W": bw, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
                        )
        return out

    @triton.autotune(configs=_configs(), key=["C_in", "C_out", "D", "H", "W"])
    @triton.jit
    def _conv3x3x3_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        C_in,
        C_out,
        D,
        H,
        W,
        HAS_BIAS: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_W: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        tiles_w = tl.cdiv(W, BLOCK_W)
        tiles_h = tl.cdiv(H, BLOCK_H)
        tw = pid_m % tiles_w
        t = pid_m // tiles_w
        th = t % tiles_h
        t = t // tiles_h
        d = t % D
        b = t // D
        BM: tl.constexpr = BLOCK_H * BLOCK_W
        m = tl.arange(0, BM)
        h = th * BLOCK_H + m // BLOCK_W
        w = tw * BLOCK_W + m % BLOCK_W
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K)
        dhw = D.to(tl.int64) * H * W
        x_b = x_ptr + b.to(tl.int64) * C_in * dhw
        acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
        for tap in range(27):
            dd = d + tap // 9 - 1
            hh = h + (tap // 3) % 3 - 1
            ww = w + tap % 3 - 1
            ok = (dd >= 0) & (dd < D) & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
            sp = (dd * H + hh) * W + ww
            for c0 in range(0, C_in, BLOCK_K):
                c = c0 + k
                a = tl.load(
                    x_b + c[None, :].to(tl.int64) * dhw + sp[:, None],
                    mask=ok[:, None] & (c[None, :] < C_in),
                    other=0.0,
                )
                bw = tl.load(
                    w_ptr + (tap * C_in + c[:, None]) * C_out + n[None, :],
                    mask=(c[:, None] < C_in) & (n[None, :] < C_out),
                    other=0.0,
                )
                acc = tl.dot(a, bw, acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n < C_out, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + b.to(tl.int64) * C_out * dhw + n[None, :].to(tl.int64) * dhw + ((d * H + h) * W + w)[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=((h < H) & (w < W))[:, None] & (n[None, :] < C_out))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[C_out, C_in, 3, 3, 3]`` → ``[27, C_in, C_out]`` contiguous, the layout the kernel reads."""
    return weight.permute(2, 3, 4, 1, 0).reshape(27, weight.shape[1], weight.shape[0]).contiguous()


def conv3d_3x3x3(x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.conv3d(x, weight, bias, padding=1)`` for a 3x3x3 kernel, with ``packed_weight = pack_weight(weight)``.

    Args:
        x: ``[B, C_in, D, H, W]`` contiguous, fp16 or bf16 (the same dtype as ``packed_weight``).
        packed_weight: ``[27, C_in, C_out]``.
        bias: ``[C_out]`` or None.
    """
    if not has_triton:
        raise RuntimeError("conv3d_3x3x3 needs the 'triton' package (pip install triton).")
    x = x.contiguous()
    b, cin, d, h, w = x.shape
    cout = packed_weight.shape[2]
    y = torch.empty((b, cout, d, h, w), device=x.device, dtype=x.dtype)
    block_k = 16 if cin % 32 else 32

    def grid(meta):
        return (b * d * triton.cdiv(h, meta["BLOCK_H"]) * triton.cdiv(w, meta["BLOCK_W"]), triton.cdiv(cout, meta["BLOCK_N"]))

    _conv3x3x3_kernel[grid](
        x, packed_weight, bias if bias is not None else x, y, cin, cout, d, h, w,
        HAS_BIAS=bias is not None, BLOCK_K=block_k,
    )
    return y
