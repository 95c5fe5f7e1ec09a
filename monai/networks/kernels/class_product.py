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
"""The class head's product with the class features' last norm applied as they are loaded, in Triton.

The class features are the output of the class head's last residual block, ``act(norm(y) + residual)``, and the
logits their product with the class embeddings. Written out, the features are one full-resolution pass (read ``y``
and the residual, write the features) and the product reads them again; here one kernel reads ``y`` and the
residual, normalizes, adds and activates a block of voxels in registers, rounds to the features' dtype (as the
pass stores them) and multiplies by the embeddings, so the features never reach memory.
"""

from __future__ import annotations

import torch

from monai.networks.kernels.instance_norm import _ACTS, NormAct, _norm_operands, as_rows
from monai.utils.triton_support import check_kernel_input, tl, triton

__all__ = ["norm_act_product", "norm_act_product_reference"]

if triton is not None:
    from monai.networks.kernels.instance_norm import _norm_act_tile

    @triton.jit
    def _norm_product_kernel(x_ptr, res_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, e_ptr, out_ptr, N, K, real_channels,
                             eps, negative_slope, C: tl.constexpr, HAS_AFFINE: tl.constexpr,
                             HAS_RESIDUAL: tl.constexpr, ACT: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):  # fmt: skip
        # one program: BLOCK_N voxels of sample b, all their channels (C, the padded count) and all K classes
        nb = tl.program_id(0)
        b = tl.program_id(1)
        rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, C)
        valid = rows < N
        real = valid[:, None] & (cols < real_channels)[None, :]  # padding channels are neither read nor used
        offs = b.to(tl.int64) * N * C + rows.to(tl.int64)[:, None] * C + cols[None, :]
        y = _norm_act_tile(x_ptr, res_ptr, offs, real, mean_ptr, var_ptr, w_ptr, b_ptr, b * C + cols, cols, eps,
                           negative_slope, HAS_AFFINE, HAS_RESIDUAL, ACT)  # fmt: skip
        features = y.to(e_ptr.dtype.element_ty)  # the features as the norm's pass stores them
        for kb in range(0, K, BLOCK_K):
            k = kb + tl.arange(0, BLOCK_K)
            emb = tl.load(e_ptr + k[:, None] * C + cols[None, :], mask=(k < K)[:, None], other=0.0)
            logits = tl.dot(emb, tl.trans(features))  # [BLOCK_K, BLOCK_N], float32 accumulation
            out = b.to(tl.int64) * K * N + k.to(tl.int64)[:, None] * N + rows[None, :]
            tl.store(out_ptr + out, logits.to(out_ptr.dtype.element_ty), mask=(k < K)[:, None] & valid[None, :])


def norm_act_product_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    spec: NormAct,
    embedding: torch.Tensor,
    residual: torch.Tensor | None = None,
    real_channels: int | None = None,
) -> torch.Tensor:
    """What :py:func:`norm_act_product` computes, in two steps: the norm's pass
    (:py:func:`~monai.networks.kernels.instance_norm.norm_act_reference`) and the product, in ``embedding``'s dtype."""
    from monai.networks.kernels.instance_norm import norm_act_reference

    features = norm_act_reference(x, weight, bias, spec, residual, real_channels).to(embedding.dtype)
    rows = features.flatten(2)  # [B, C, N]
    return torch.matmul(embedding, rows)


def norm_act_product(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    spec: NormAct,
    embedding: torch.Tensor,
    residual: torch.Tensor | None = None,
    real_channels: int | None = None,
    stats: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_n: int = 128,
    num_warps: int = 4,
) -> torch.Tensor:
    """``embedding @ act(instance_norm(x) * weight + bias + residual)`` for each sample: ``[B, K, N]`` logits
    (``N`` the voxels in ``x``'s spatial order), the features rounded to ``embedding``'s dtype before the product.

    Args:
        x: ``[B, C, *spatial]`` channels-last, ``C`` 64 or 128 (the padded channels).
        weight, bias: ``[C]`` affine parameters (zero on padding channels), or ``None`` for none.
        spec: eps and activation.
        embedding: ``[K, C]`` fp16 class embeddings, zero on the padding channels; the logits' dtype.
        residual: optional channels-last tensor of ``x``'s shape added before the activation.
        real_channels: channels from this index on are padding (neither read nor multiplied); ``None``: all real.
        stats: ``x``'s ``(mean, var)`` when already known (e.g. from the convolution that wrote it); computed when
            ``None``.
        block_n: voxels per program (a power of two); ``num_warps``: warps per program.
    """
    rows = as_rows(x)
    check_kernel_input(rows, "norm_act_product")
    n_batch, n_vox, n_chan = rows.shape
    if n_chan not in (64, 128):
        raise ValueError(f"norm_act_product takes 64 or 128 (padded) channels, got {n_chan}: pad the channels.")
    if embedding.ndim != 2 or embedding.shape[1] != n_chan or embedding.dtype != torch.float16:
        raise ValueError(
            f"norm_act_product takes fp16 class embeddings [K, {n_chan}], got {embedding.dtype} of shape "
            f"{tuple(embedding.shape)}."
        )
    res_rows, mean, var, w, b = _norm_operands(x, rows, weight, bias, residual, stats)
    n_classes = embedding.shape[0]
    out = torch.empty((n_batch, n_classes, n_vox), device=x.device, dtype=embedding.dtype)
    _norm_product_kernel[(triton.cdiv(n_vox, block_n), n_batch)](
        rows,
        res_rows,
        mean,
        var,
        w,
        b,
        embedding.contiguous(),
        out,
        n_vox,
        n_classes,
        n_chan if real_channels is None else real_channels,
        spec.eps,
        spec.negative_slope,
        C=n_chan,
        HAS_AFFINE=weight is not None,
        HAS_RESIDUAL=residual is not None,
        ACT=_ACTS[spec.act],
        BLOCK_N=block_n,
        BLOCK_K=min(128, max(16, triton.next_power_of_2(n_classes))),
        num_warps=num_warps,
    )
    return out
