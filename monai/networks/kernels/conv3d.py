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
"""A 3x3x3 convolution (stride 1, zero padding 1) of channels-last fp16 tensors as an implicit GEMM in Triton,
optionally emitting the per-(sample, channel) statistics of its output for the instance norm that follows.

One program computes a ``BLOCK_H x BLOCK_W`` patch of one output plane for all output channels: for each of the 27
taps it loads the shifted input patch with a rank-5 tensor descriptor (TMA on Hopper; what lies outside the volume
arrives as zeros, which is the convolution's padding) and multiplies it by that tap's ``[C_in, C_out]`` weights.
With ``stats`` the epilogue also writes the patch's mean and centred sum of squares per channel, so the norm's
statistics pass (a full read of the output) disappears; with ``prologue`` the preceding norm's affine map and
activation are applied to the input as it is loaded, so the norm's apply pass disappears. Not yet on VISTA3D's
fused path: it runs beside cuDNN in ``tests/benchmarks/vista3d_fused.py --conv`` until it beats cuDNN's padded
kernel.
"""

from __future__ import annotations

import torch

from monai.networks.kernels.triton_support import check_kernel_input, tl, triton

__all__ = ["conv3x3x3", "conv3x3x3_weights", "conv3x3x3_single_channel"]

if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def _conv_kernel(
        x_desc,
        w_desc,
        y_desc,
        mean_ptr,
        m2_ptr,
        scale_ptr,
        shift_ptr,
        D,
        H,
        W,
        negative_slope,
        C_IN: tl.constexpr,
        C_OUT: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_W: tl.constexpr,
        STATS: tl.constexpr,
        PROLOGUE: tl.constexpr,
    ):
        pid = tl.program_id(0)
        tiles_w = tl.cdiv(W, BLOCK_W)
        tiles_h = tl.cdiv(H, BLOCK_H)
        tw = pid % tiles_w
        rest = pid // tiles_w
        th = rest % tiles_h
        rest = rest // tiles_h
        d = rest % D
        b = rest // D
        h0 = th * BLOCK_H
        w0 = tw * BLOCK_W
        acc = tl.zeros([BLOCK_H * BLOCK_W, C_OUT], dtype=tl.float32)
        if PROLOGUE:  # the preceding norm's per-(sample, channel) affine map, applied to the input as it is loaded
            ci = tl.arange(0, C_IN)
            scale = tl.load(scale_ptr + b * C_IN + ci)
            shift = tl.load(shift_ptr + b * C_IN + ci)
            i = tl.arange(0, BLOCK_H * BLOCK_W)
        for tap in range(27):
            kd = tap // 9
            kh = (tap // 3) % 3
            kw = tap % 3
            a = x_desc.load([b, d + kd - 1, h0 + kh - 1, w0 + kw - 1, 0]).reshape(BLOCK_H * BLOCK_W, C_IN)
            if PROLOGUE:
                # normalise + LeakyReLU (ReLU with slope 0), then zero what lies outside the volume again: the
                # convolution pads the activated tensor with zeros, not the raw one
                hh = h0 + i // BLOCK_W + kh - 1
                ww = w0 + i % BLOCK_W + kw - 1
                dd = d + kd - 1
                inside = (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W) & (dd >= 0) & (dd < D)
                v = a.to(tl.float32) * scale[None, :] + shift[None, :]
                v = tl.where(v > 0, v, v * negative_slope)
                a = tl.where(inside[:, None], v, 0.0).to(tl.float16)
            w = w_desc.load([tap * C_IN, 0])
            acc = tl.dot(a, w, acc)
        out = acc.to(tl.float16)
        y_desc.store([b, d, h0, w0, 0], out.reshape(1, 1, BLOCK_H, BLOCK_W, C_OUT))
        if STATS:
            # statistics of the values as stored (fp16), over the patch voxels inside the volume
            i = tl.arange(0, BLOCK_H * BLOCK_W)
            inside = ((h0 + i // BLOCK_W) < H) & ((w0 + i % BLOCK_W) < W)
            vals = tl.where(inside[:, None], out.to(tl.float32), 0.0)
            n = tl.sum(inside.to(tl.float32), axis=0)
            mean = tl.sum(vals, axis=0) / n
            centred = tl.where(inside[:, None], vals - mean[None, :], 0.0)
            cols = tl.arange(0, C_OUT)
            tl.store(mean_ptr + pid.to(tl.int64) * C_OUT + cols, mean)
            tl.store(m2_ptr + pid.to(tl.int64) * C_OUT + cols, tl.sum(centred * centred, axis=0))

    @triton.jit
    def _single_channel_kernel(x_ptr, w_ptr, y_ptr, D, H, W, C_OUT: tl.constexpr, BLOCK_V: tl.constexpr):
        # the 27 taps are the GEMM's K (padded to 32): each program gathers a [BLOCK_V, 32] patch of shifted voxels
        # (zero outside the volume) and multiplies it by the [32, C_OUT] weights on the tensor cores
        pid = tl.program_id(0)
        b = tl.program_id(1)
        n_vox = D * H * W
        v = pid * BLOCK_V + tl.arange(0, BLOCK_V)
        d = v // (H * W)
        h = (v // W) % H
        w = v % W
        t = tl.arange(0, 32)
        dd = d[:, None] + (t // 9 - 1)[None, :]
        hh = h[:, None] + ((t // 3) % 3 - 1)[None, :]
        ww = w[:, None] + (t % 3 - 1)[None, :]
        inside = (v < n_vox)[:, None] & (t < 27)[None, :]
        inside &= (dd >= 0) & (dd < D) & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
        base = x_ptr + b.to(tl.int64) * n_vox
        a = tl.load(base + (dd * H + hh) * W + ww, mask=inside, other=0.0).to(tl.float16)
        co = tl.arange(0, C_OUT)
        weights = tl.load(w_ptr + t[:, None] * C_OUT + co[None, :])
        acc = tl.dot(a, weights)
        rows = b.to(tl.int64) * n_vox + v.to(tl.int64)
        tl.store(y_ptr + rows[:, None] * C_OUT + co[None, :], acc.to(tl.float16), mask=(v < n_vox)[:, None])


def conv3x3x3_single_channel(
    x: torch.Tensor, weight: torch.Tensor, out_channels: int, block_v: int = 128
) -> torch.Tensor:
    """3x3x3 convolution (stride 1, zero padding 1, no bias) of a one-channel volume, written channels-last in fp16.

    cuDNN cannot tell the layout of a one-channel input and either returns channels-first (a conversion follows) or,
    with the input padded to 8 channels, runs as slowly as a 64-channel layer; here the 27 taps form the GEMM's K.

    Args:
        x: ``[B, 1, D, H, W]``, contiguous, any float dtype (read as fp16).
        weight: ``Conv3d`` weight ``[C, 1, 3, 3, 3]``.
        out_channels: channels of the output (a power of two >= ``C``); those beyond ``C`` are zeros.
        block_v: voxels per program.
    """
    if x.ndim != 5 or x.shape[1] != 1 or not x.is_contiguous():
        raise ValueError(
            f"conv3x3x3_single_channel takes a contiguous [B, 1, D, H, W] tensor, got shape {tuple(x.shape)}."
        )
    check_kernel_input(x, "conv3x3x3_single_channel")
    n_b, _, d, h, w = x.shape
    gemm = torch.zeros(32, out_channels, device=x.device, dtype=torch.float16)
    gemm[:27, : weight.shape[0]] = weight.detach().reshape(weight.shape[0], 27).t()
    y = torch.empty(
        (n_b, out_channels, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d
    )
    _single_channel_kernel[(triton.cdiv(d * h * w, block_v), n_b)](
        x, gemm, y, d, h, w, C_OUT=out_channels, BLOCK_V=block_v
    )
    return y


def conv3x3x3_weights(weight: torch.Tensor) -> torch.Tensor:
    """The ``[27 * C_in, C_out]`` fp16 operand of :py:func:`conv3x3x3` from a ``Conv3d`` weight
    ``[C_out, C_in, 3, 3, 3]``."""
    c_out, c_in = weight.shape[:2]
    return weight.detach().permute(2, 3, 4, 1, 0).reshape(27 * c_in, c_out).to(torch.float16).contiguous()


def conv3x3x3(
    x: torch.Tensor,
    weights: torch.Tensor,
    stats: bool = False,
    prologue: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    block_h: int = 16,
    block_w: int = 16,
    num_warps: int = 4,
    num_stages: int = 3,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """3x3x3 convolution, stride 1, zero padding 1, no bias, of a channels-last fp16 tensor.

    Args:
        x: ``[B, C_in, D, H, W]`` fp16 in ``torch.channels_last_3d``; ``C_in`` a power of two from 16 to 128.
        weights: from :py:func:`conv3x3x3_weights`, ``C_out`` a power of two from 16 to 128.
        stats: also return the per-patch ``(mean, m2)`` of the output, each ``[B * D * tiles, C_out]`` float32
            (merge them with :py:func:`monai.networks.kernels.instance_norm.merge_parts`).
        prologue: ``(scale, shift, negative_slope)``: convolve ``leaky_relu(x * scale + shift)`` (``scale`` and
            ``shift`` ``[B, C_in]`` float32, e.g. an instance norm's ``rstd * weight`` and ``bias - mean * scale``;
            slope 0 is ReLU) instead of ``x``, with the zero padding applied after the activation.
        block_h, block_w, num_warps, num_stages: the launch configuration (16 x 16 voxels, 4 warps, 3 stages was the
            fastest of those measured for 64 channels on the H200).

    Returns:
        ``(y, parts)``: ``y`` ``[B, C_out, D, H, W]`` channels-last fp16, ``parts`` the statistics or ``None``.
    """
    if x.dtype != torch.float16 or not x.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(f"conv3x3x3 takes a channels-last fp16 tensor, got {x.dtype} with strides {x.stride()}.")
    check_kernel_input(x, "conv3x3x3")
    n_b, c_in, d, h, w = x.shape
    c_out = weights.shape[1]
    if weights.shape[0] != 27 * c_in:
        raise ValueError(f"weights of shape {tuple(weights.shape)} do not fit {c_in} input channels.")
    y = torch.empty((n_b, c_out, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    x5 = x.permute(0, 2, 3, 4, 1)  # [B, D, H, W, C], contiguous
    y5 = y.permute(0, 2, 3, 4, 1)
    x_desc = TensorDescriptor.from_tensor(x5, [1, 1, block_h, block_w, c_in])
    y_desc = TensorDescriptor.from_tensor(y5, [1, 1, block_h, block_w, c_out])
    w_desc = TensorDescriptor.from_tensor(weights, [c_in, c_out])
    n_tiles = n_b * d * triton.cdiv(h, block_h) * triton.cdiv(w, block_w)
    mean = m2 = y  # placeholders when no statistics are asked for
    scale, shift, slope = prologue if prologue is not None else (y, y, 0.0)
    if stats:
        mean = torch.empty((n_tiles, c_out), device=x.device, dtype=torch.float32)
        m2 = torch.empty_like(mean)
    _conv_kernel[(n_tiles,)](
        x_desc,
        w_desc,
        y_desc,
        mean,
        m2,
        scale,
        shift,
        d,
        h,
        w,
        slope,
        C_IN=c_in,
        C_OUT=c_out,
        BLOCK_H=block_h,
        BLOCK_W=block_w,
        STATS=stats,
        PROLOGUE=prologue is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return y, ((mean, m2) if stats else None)
