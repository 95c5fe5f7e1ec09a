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
"""A 3x3x3 convolution (stride 1, zero padding 1) of channels-last fp16 tensors as an implicit GEMM in Triton, with
the instance norm before and after it folded in.

One program computes a ``BLOCK_H x BLOCK_W`` patch of one output plane for all output channels: for each of the 27
taps it loads the shifted input patch with rank-5 tensor descriptors (TMA on Hopper; what lies outside the volume
arrives as zeros, which is the convolution's padding) and multiplies it by that tap's ``[C_in, C_out]`` weights.

Channel counts that are not a power of two (VISTA3D's 48 and 96) run as two power-of-two pieces (32 + 16, 64 + 32)
on both sides of the GEMM, so no work is spent on padding channels; the tensors themselves may still carry zero
padding channels (the layout cuDNN's kernels want), which are then never read and written as zeros.

Folded in:

- ``prologue``: the preceding norm's affine map and activation, applied to the input as it is loaded (the norm's
  apply pass disappears);
- ``residual``: a tensor added to the output in the epilogue (the residual add's pass disappears);
- ``stats``: the per-(sample, channel) mean and variance of the output as stored, from per-patch statistics the
  epilogue writes (the next norm's statistics pass disappears).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from monai.networks.kernels.instance_norm import merge_parts
from monai.networks.kernels.triton_support import check_kernel_input, tl, triton

__all__ = ["ConvLaunch", "conv3x3x3", "conv3x3x3_weights", "conv3x3x3_single_channel", "channel_pieces"]


@dataclass(frozen=True)
class ConvLaunch:
    """Launch configuration of :py:func:`conv3x3x3`: voxels per program (``block_h x block_w`` of one plane), warps
    and software-pipeline stages. 16 x 16, 4 warps, 3 stages was the fastest measured for 64 channels on the H200."""

    block_h: int = 16
    block_w: int = 16
    num_warps: int = 4
    num_stages: int = 3


def channel_pieces(n: int) -> tuple[int, int]:
    """``n`` channels as one or two power-of-two pieces of at least 16 (48 -> (32, 16), 64 -> (64, 0)), the shapes
    the tensor-core dot takes; ``ValueError`` for counts that do not split so."""
    first = 1 << (n.bit_length() - 1) if n > 0 else 0
    rest = n - first
    if first < 16 or (rest and (rest < 16 or rest & (rest - 1))):
        raise ValueError(f"conv3x3x3 takes 16, 32, 48, 64, 96, 128, ... channels (two powers of two >= 16), got {n}.")
    return first, rest


if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def _activate_loaded(a, scale_ptr, shift_ptr, inside, negative_slope, K: tl.constexpr):
        # normalise + LeakyReLU (ReLU: slope 0), then zero what lies outside the volume again: the convolution pads
        # the activated tensor with zeros, not the raw one
        ci = tl.arange(0, K)
        v = a.to(tl.float32) * tl.load(scale_ptr + ci)[None, :] + tl.load(shift_ptr + ci)[None, :]
        v = tl.where(v > 0, v, v * negative_slope)
        return tl.where(inside[:, None], v, 0.0).to(tl.float16)

    @triton.jit
    def _patch_stats(out, inside, n, mean_ptr, m2_ptr, N: tl.constexpr):
        # mean and centred sum of squares of the stored (fp16) values, over the patch voxels inside the volume
        vals = tl.where(inside[:, None], out.to(tl.float32), 0.0)
        mean = tl.sum(vals, axis=0) / n
        centred = tl.where(inside[:, None], vals - mean[None, :], 0.0)
        cols = tl.arange(0, N)
        tl.store(mean_ptr + cols, mean)
        tl.store(m2_ptr + cols, tl.sum(centred * centred, axis=0))

    @triton.jit
    def _conv_kernel(
        x0_desc,
        x1_desc,
        w00_desc,
        w01_desc,
        w10_desc,
        w11_desc,
        y0_desc,
        y1_desc,
        zero_desc,
        r0_desc,
        r1_desc,
        mean_ptr,
        m2_ptr,
        scale_ptr,
        shift_ptr,
        D,
        H,
        W,
        negative_slope,
        K0: tl.constexpr,
        K1: tl.constexpr,
        N0: tl.constexpr,
        N1: tl.constexpr,
        ZERO_N: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_W: tl.constexpr,
        STATS: tl.constexpr,
        PROLOGUE: tl.constexpr,
        RESIDUAL: tl.constexpr,
    ):
        # K0 (+ K1) input channels and N0 (+ N1) output channels: the pieces of each side; a piece of 0 is absent
        BM: tl.constexpr = BLOCK_H * BLOCK_W
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
        i = tl.arange(0, BM)
        acc0 = tl.zeros([BM, N0], dtype=tl.float32)
        if N1 > 0:
            acc1 = tl.zeros([BM, N1], dtype=tl.float32)
        for tap in range(27):
            kd = tap // 9
            kh = (tap // 3) % 3
            kw = tap % 3
            a0 = x0_desc.load([b, d + kd - 1, h0 + kh - 1, w0 + kw - 1, 0]).reshape(BM, K0)
            if K1 > 0:
                a1 = x1_desc.load([b, d + kd - 1, h0 + kh - 1, w0 + kw - 1, K0]).reshape(BM, K1)
            if PROLOGUE:
                hh = h0 + i // BLOCK_W + kh - 1
                ww = w0 + i % BLOCK_W + kw - 1
                dd = d + kd - 1
                inside = (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W) & (dd >= 0) & (dd < D)
                sb = b * (K0 + K1)
                a0 = _activate_loaded(a0, scale_ptr + sb, shift_ptr + sb, inside, negative_slope, K0)
                if K1 > 0:
                    a1 = _activate_loaded(a1, scale_ptr + sb + K0, shift_ptr + sb + K0, inside, negative_slope, K1)
            row = tap * (K0 + K1)
            acc0 = tl.dot(a0, w00_desc.load([row, 0]), acc0)
            if K1 > 0:
                acc0 = tl.dot(a1, w10_desc.load([row + K0, 0]), acc0)
            if N1 > 0:
                acc1 = tl.dot(a0, w01_desc.load([row, N0]), acc1)
                if K1 > 0:
                    acc1 = tl.dot(a1, w11_desc.load([row + K0, N0]), acc1)
        if RESIDUAL:
            acc0 += r0_desc.load([b, d, h0, w0, 0]).reshape(BM, N0).to(tl.float32)
            if N1 > 0:
                acc1 += r1_desc.load([b, d, h0, w0, N0]).reshape(BM, N1).to(tl.float32)
        out0 = acc0.to(tl.float16)
        y0_desc.store([b, d, h0, w0, 0], out0.reshape(1, 1, BLOCK_H, BLOCK_W, N0))
        if N1 > 0:
            out1 = acc1.to(tl.float16)
            y1_desc.store([b, d, h0, w0, N0], out1.reshape(1, 1, BLOCK_H, BLOCK_W, N1))
        if ZERO_N > 0:  # the output's padding channels
            zero_desc.store([b, d, h0, w0, N0 + N1], tl.zeros([1, 1, BLOCK_H, BLOCK_W, ZERO_N], dtype=tl.float16))
        if STATS:
            inside = ((h0 + i // BLOCK_W) < H) & ((w0 + i % BLOCK_W) < W)
            n = tl.sum(inside.to(tl.float32), axis=0)
            base = pid.to(tl.int64) * (N0 + N1)
            _patch_stats(out0, inside, n, mean_ptr + base, m2_ptr + base, N0)
            if N1 > 0:
                _patch_stats(out1, inside, n, mean_ptr + base + N0, m2_ptr + base + N0, N1)

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


def conv3x3x3_weights(
    weight: torch.Tensor, in_channels: int | None = None, out_columns: int | None = None
) -> torch.Tensor:
    """The ``[27 * in_channels, out_columns]`` fp16 GEMM operand of :py:func:`conv3x3x3` from a ``Conv3d`` weight
    ``[C_out, C_in, 3, 3, 3]``.

    Args:
        weight: the convolution's weight.
        in_channels: input channels the GEMM reads (``C_in`` by default; fewer drops trailing zero channels of a
            padded weight).
        out_columns: output columns (``C_out`` by default; more adds zero columns, so the output's padding channels
            are computed as zeros instead of written apart).
    """
    c_out, c_in = weight.shape[:2]
    k = c_in if in_channels is None else in_channels
    n = c_out if out_columns is None else out_columns
    gemm = torch.zeros(27, k, n, device=weight.device, dtype=torch.float16)
    kk, nn = min(k, c_in), min(n, c_out)
    gemm[:, :kk, :nn] = weight.detach()[:nn, :kk].permute(2, 3, 4, 1, 0).reshape(27, kk, nn)
    return gemm.reshape(27 * k, n)


def _patch_counts(d: int, h: int, w: int, launch: ConvLaunch, device: torch.device) -> torch.Tensor:
    """Voxels inside the volume of each patch of one sample, in program order (built on the device: no host copy,
    so legal inside CUDA graph capture)."""
    hs = (h - launch.block_h * torch.arange(triton.cdiv(h, launch.block_h), device=device)).clamp(max=launch.block_h)
    ws = (w - launch.block_w * torch.arange(triton.cdiv(w, launch.block_w), device=device)).clamp(max=launch.block_w)
    return (hs[:, None] * ws[None, :]).flatten().repeat(d).float()


def conv3x3x3(
    x: torch.Tensor,
    weights: torch.Tensor,
    out_channels: int | None = None,
    stats: bool = False,
    prologue: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    residual: torch.Tensor | None = None,
    launch: ConvLaunch = ConvLaunch(),
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """3x3x3 convolution, stride 1, zero padding 1, no bias, of a channels-last fp16 tensor.

    Args:
        x: ``[B, C, D, H, W]`` fp16 in ``torch.channels_last_3d``; only its first ``weights.shape[0] // 27`` channels
            are read (the rest may be zero padding).
        weights: from :py:func:`conv3x3x3_weights`; its row and column counts split by :py:func:`channel_pieces`.
        out_channels: channels of the output tensor (``weights.shape[1]`` by default); those beyond the weights'
            columns are written as zeros.
        stats: also return the output's per-(sample, channel) ``(mean, var)``, each ``[B, weights.shape[1]]``
            float32, of the values as stored.
        prologue: ``(scale, shift, negative_slope)``: convolve ``leaky_relu(x * scale + shift)`` (``scale`` and
            ``shift`` ``[B, weights.shape[0] // 27]`` float32, e.g. an instance norm's ``rstd * weight`` and
            ``bias - mean * scale``; slope 0 is ReLU) instead of ``x``, the zero padding applied after the activation.
        residual: a tensor of the output's shape and layout added to the convolution (before the statistics).
        launch: the launch configuration.

    Returns:
        ``(y, stats)``: ``y`` ``[B, out_channels, D, H, W]`` channels-last fp16; the statistics or ``None``.
    """
    if x.dtype != torch.float16 or not x.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(f"conv3x3x3 takes a channels-last fp16 tensor, got {x.dtype} with strides {x.stride()}.")
    check_kernel_input(x, "conv3x3x3")
    n_b, c_in, d, h, w = x.shape
    k_real, n_real = weights.shape[0] // 27, weights.shape[1]
    if weights.shape[0] % 27 or k_real > c_in:
        raise ValueError(f"weights of shape {tuple(weights.shape)} do not fit an input of {c_in} channels.")
    (k0, k1), (n0, n1) = channel_pieces(k_real), channel_pieces(n_real)
    c_out = n_real if out_channels is None else out_channels
    zero_n = c_out - n_real
    if zero_n < 0 or (zero_n and (zero_n < 16 or zero_n & (zero_n - 1))):
        raise ValueError(
            f"{c_out} output channels do not fit weights of {n_real} columns (the rest must be 16, 32, ...)."
        )
    y = torch.empty((n_b, c_out, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    if residual is not None and (residual.shape != y.shape or residual.stride() != y.stride()):
        raise ValueError(f"the residual must be a channels-last tensor of shape {tuple(y.shape)}.")
    bh, bw = launch.block_h, launch.block_w

    def descriptor(t: torch.Tensor, channels: int):
        return TensorDescriptor.from_tensor(t.permute(0, 2, 3, 4, 1), [1, 1, bh, bw, max(channels, 16)])

    def weight_descriptor(k: int, n: int):
        return TensorDescriptor.from_tensor(weights, [max(k, 16), max(n, 16)])

    x0, x1 = descriptor(x, k0), descriptor(x, k1)
    y0, y1, zero = descriptor(y, n0), descriptor(y, n1), descriptor(y, zero_n)
    r = residual if residual is not None else y
    r0, r1 = descriptor(r, n0), descriptor(r, n1)
    w00, w01, w10, w11 = (weight_descriptor(k, n) for k in (k0, k1) for n in (n0, n1))
    n_tiles = n_b * d * triton.cdiv(h, bh) * triton.cdiv(w, bw)
    mean = m2 = y  # stand-ins the kernel never reads when no statistics are asked for
    if stats:
        mean = torch.empty((n_tiles, n_real), device=x.device, dtype=torch.float32)
        m2 = torch.empty_like(mean)
    scale, shift, slope = prologue if prologue is not None else (y, y, 0.0)
    if prologue is not None and (scale.shape != (n_b, k_real) or shift.shape != (n_b, k_real)):
        raise ValueError(f"the prologue's scale and shift must be [{n_b}, {k_real}], got {tuple(scale.shape)}.")
    # fmt: off
    _conv_kernel[(n_tiles,)](
        x0, x1, w00, w01, w10, w11, y0, y1, zero, r0, r1,
        mean, m2,
        scale.contiguous() if prologue is not None else y,
        shift.contiguous() if prologue is not None else y,
        d, h, w, slope,
        K0=k0, K1=k1, N0=n0, N1=n1, ZERO_N=zero_n,
        BLOCK_H=bh, BLOCK_W=bw,
        STATS=stats, PROLOGUE=prologue is not None, RESIDUAL=residual is not None,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    # fmt: on
    if not stats:
        return y, None
    counts = _patch_counts(d, h, w, launch, x.device)
    return y, merge_parts(mean.view(n_b, -1, n_real), m2.view(n_b, -1, n_real), counts)
