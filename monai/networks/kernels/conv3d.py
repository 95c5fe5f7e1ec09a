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
the residual add after it and the statistics of the instance norm that follows folded in.

One program computes a ``BLOCK_H x BLOCK_W`` patch of ``PLANES`` consecutive output planes for all output
channels. It walks the input planes those outputs need, and for each of the 9 in-plane shifts loads the shifted
input patch once with a rank-5 tensor descriptor (TMA on Hopper; what lies outside the volume arrives as zeros,
which is the convolution's padding) and multiplies it by the tap's ``[C_in, C_out]`` weights of every output plane
it feeds: with two planes an input patch serves up to two taps, 18 loads per output plane instead of 27.

An input channel count that is not a power of two (VISTA3D's 48 and 96) is read as two power-of-two pieces (32 + 16,
64 + 32), so the zero padding channels of the input tensor are neither read nor multiplied. The output side is one
power-of-two piece: the weights' zero columns give the output's padding channels.

Folded in: ``residual``, a tensor added to the output in the epilogue (the residual add's pass disappears), and
``stats``, the per-(sample, channel) mean and variance of the output as stored, from per-patch statistics the
epilogue writes (the next norm's statistics pass disappears).

Measured and left out: applying the preceding norm and activation to the input as it is loaded (a "prologue")
made the convolution 2.3x slower on the H200, because every input value is loaded, normalised and activated once
per tap (18-27 times) on the CUDA cores, as much time as the tensor cores spend on the GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from monai.networks.kernels.instance_norm import merge_parts
from monai.networks.kernels.triton_support import check_kernel_input, tl, triton

__all__ = ["ConvLaunch", "conv3x3x3", "conv3x3x3_weights", "conv3x3x3_single_channel", "channel_pieces"]


@dataclass(frozen=True)
class ConvLaunch:
    """Launch configuration of :py:func:`conv3x3x3`: voxels per program (``block_h x block_w`` of ``planes``
    consecutive planes, 1 or 2), warps, software-pipeline stages, ``swap``: compute the transposed product
    (output channels as the MMA's M side, voxels as its N side), and ``loads``: how input patches arrive, ``"tma"``
    (tensor descriptors, through L2 only) or ``"l1"`` (pointer loads cached in L1, where the 27 taps' shifted
    patches overlap)."""

    block_h: int = 16
    block_w: int = 16
    num_warps: int = 4
    num_stages: int = 3
    planes: int = 1
    swap: bool = False
    loads: str = "tma"

    def __post_init__(self):
        if self.planes not in (1, 2):
            raise ValueError(f"ConvLaunch planes must be 1 or 2, got {self.planes}.")
        if self.loads not in ("tma", "l1"):
            raise ValueError(f"ConvLaunch loads must be 'tma' or 'l1', got {self.loads!r}.")


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
    def _load_patch(x_ptr, b, dd, hs, ws, D, H, W, C, c0, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                    K: tl.constexpr):  # fmt: skip
        # the [BLOCK_H * BLOCK_W, K] patch of channels c0 .. c0 + K at plane dd, rows hs.., columns ws.. (zeros
        # outside the volume) by pointer loads that keep lines in L1, where the taps' shifted patches overlap
        i = tl.arange(0, BLOCK_H * BLOCK_W)
        hh = hs + i // BLOCK_W
        ww = ws + i % BLOCK_W
        plane = dd + 0 * i  # as a vector: in Triton 3.9's interpreter a scalar comparison made the mask int32
        inside = (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W) & (plane >= 0) & (plane < D)
        row = ((b.to(tl.int64) * D + dd) * H + hh) * W + ww
        ptrs = x_ptr + row[:, None] * C + c0 + tl.arange(0, K)[None, :]
        return tl.load(ptrs, mask=inside[:, None], other=0.0, cache_modifier=".ca")

    @triton.jit
    def _load_input(x_ptr, desc, b, dd, hs, ws, D, H, W, C, c0, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                    K: tl.constexpr, L1_LOADS: tl.constexpr):  # fmt: skip
        # the [BLOCK_H * BLOCK_W, K] input patch of channels c0 .. c0 + K: by TMA, or by L1-cached pointer loads
        if L1_LOADS:
            return _load_patch(x_ptr, b, dd, hs, ws, D, H, W, C, c0, BLOCK_H, BLOCK_W, K)
        return desc.load([b, dd, hs, ws, c0]).reshape(BLOCK_H * BLOCK_W, K)

    @triton.jit
    def _tap(acc, a0, a1, w0_desc, w1_desc, tap, K0: tl.constexpr, K1: tl.constexpr, SWAP: tl.constexpr):
        # acc += [a0 | a1] @ the tap's [K0 + K1, N] weights; SWAP: the transposed product, acc [N, voxels], with the
        # output channels as the MMA's M side and the voxels as its wide N side
        row = tap * (K0 + K1)
        if SWAP:
            acc = tl.dot(tl.trans(w0_desc.load([row, 0])), tl.trans(a0), acc)
            if K1 > 0:
                acc = tl.dot(tl.trans(w1_desc.load([row + K0, 0])), tl.trans(a1), acc)
        else:
            acc = tl.dot(a0, w0_desc.load([row, 0]), acc)
            if K1 > 0:
                acc = tl.dot(a1, w1_desc.load([row + K0, 0]), acc)
        return acc

    @triton.jit
    def _epilogue(acc, r_desc, y_desc, mean_ptr, m2_ptr, b, d, h0, w0, D, H, W, part,
                  N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                  STATS: tl.constexpr, RESIDUAL: tl.constexpr, SWAP: tl.constexpr):  # fmt: skip
        if SWAP:
            acc = tl.trans(acc)
        if RESIDUAL:
            acc += r_desc.load([b, d, h0, w0, 0]).reshape(BLOCK_H * BLOCK_W, N).to(tl.float32)
        out = acc.to(tl.float16)
        y_desc.store([b, d, h0, w0, 0], out.reshape(1, 1, BLOCK_H, BLOCK_W, N))  # TMA clips what lies outside
        if STATS:
            # mean and centred sum of squares of the stored values, over the patch voxels inside the volume (none
            # for a plane past the end: its part then has count 0 and zero statistics)
            i = tl.arange(0, BLOCK_H * BLOCK_W)
            inside = ((h0 + i // BLOCK_W) < H) & ((w0 + i % BLOCK_W) < W) & (d < D)
            n = tl.maximum(tl.sum(inside.to(tl.float32), axis=0), 1.0)
            vals = tl.where(inside[:, None], out.to(tl.float32), 0.0)
            mean = tl.sum(vals, axis=0) / n
            centred = tl.where(inside[:, None], vals - mean[None, :], 0.0)
            cols = part.to(tl.int64) * N + tl.arange(0, N)
            tl.store(mean_ptr + cols, mean)
            tl.store(m2_ptr + cols, tl.sum(centred * centred, axis=0))

    @triton.jit
    def _conv_kernel(
        x_ptr,
        x0_desc,
        x1_desc,
        w0_desc,
        w1_desc,
        y_desc,
        r_desc,
        mean_ptr,
        m2_ptr,
        D,
        H,
        W,
        C,
        K0: tl.constexpr,
        K1: tl.constexpr,
        N: tl.constexpr,
        PLANES: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_W: tl.constexpr,
        STATS: tl.constexpr,
        RESIDUAL: tl.constexpr,
        SWAP: tl.constexpr,
        L1_LOADS: tl.constexpr,
    ):
        # K0 (+ K1) input channels in two pieces (K1 = 0: one piece), N output channels
        BM: tl.constexpr = BLOCK_H * BLOCK_W
        pid = tl.program_id(0)
        tiles_w = tl.cdiv(W, BLOCK_W)
        tiles_h = tl.cdiv(H, BLOCK_H)
        tiles_d = tl.cdiv(D, PLANES)
        tw = pid % tiles_w
        rest = pid // tiles_w
        th = rest % tiles_h
        rest = rest // tiles_h
        d0 = (rest % tiles_d) * PLANES
        b = rest // tiles_d
        h0 = th * BLOCK_H
        w0 = tw * BLOCK_W
        ACC_SHAPE: tl.constexpr = [N, BM] if SWAP else [BM, N]
        acc0 = tl.zeros(ACC_SHAPE, dtype=tl.float32)
        acc1 = tl.zeros(ACC_SHAPE, dtype=tl.float32)  # the second plane's (unused with one plane)
        for p in tl.static_range(PLANES + 2):  # input plane d0 - 1 + p
            for shift in range(9):
                kh = shift // 3
                kw = shift % 3
                dd, hs, ws = d0 + p - 1, h0 + kh - 1, w0 + kw - 1
                a0 = _load_input(x_ptr, x0_desc, b, dd, hs, ws, D, H, W, C, 0, BLOCK_H, BLOCK_W, K0, L1_LOADS)
                a1 = a0
                if K1 > 0:
                    a1 = _load_input(x_ptr, x1_desc, b, dd, hs, ws, D, H, W, C, K0, BLOCK_H, BLOCK_W, K1, L1_LOADS)
                if p <= 2:  # feeds output plane d0 through tap (p, kh, kw)
                    acc0 = _tap(acc0, a0, a1, w0_desc, w1_desc, p * 9 + shift, K0, K1, SWAP)
                if PLANES == 2 and p >= 1:  # and output plane d0 + 1 through tap (p - 1, kh, kw)
                    acc1 = _tap(acc1, a0, a1, w0_desc, w1_desc, (p - 1) * 9 + shift, K0, K1, SWAP)
        part = pid * PLANES
        _epilogue(acc0, r_desc, y_desc, mean_ptr, m2_ptr, b, d0, h0, w0, D, H, W, part, N, BLOCK_H, BLOCK_W, STATS,
                  RESIDUAL, SWAP)  # fmt: skip
        if PLANES == 2:
            _epilogue(acc1, r_desc, y_desc, mean_ptr, m2_ptr, b, d0 + 1, h0, w0, D, H, W, part + 1, N, BLOCK_H,
                      BLOCK_W, STATS, RESIDUAL, SWAP)  # fmt: skip

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
        out_columns: output columns, a power of two (``C_out`` by default; more adds zero columns, which become the
            output's zero padding channels).
    """
    c_out, c_in = weight.shape[:2]
    k = c_in if in_channels is None else in_channels
    n = c_out if out_columns is None else out_columns
    gemm = torch.zeros(27, k, n, device=weight.device, dtype=torch.float16)
    kk, nn = min(k, c_in), min(n, c_out)
    gemm[:, :kk, :nn] = weight.detach()[:nn, :kk].permute(2, 3, 4, 1, 0).reshape(27, kk, nn)
    return gemm.reshape(27 * k, n)


def _part_counts(d: int, h: int, w: int, launch: ConvLaunch, device: torch.device) -> torch.Tensor:
    """Voxels inside the volume of each statistics part of one sample (a patch of one plane), in the kernel's
    order; built on the device (no host copy, so legal inside CUDA graph capture)."""
    bh, bw, planes = launch.block_h, launch.block_w, launch.planes
    hs = (h - bh * torch.arange(triton.cdiv(h, bh), device=device)).clamp(max=bh)
    ws = (w - bw * torch.arange(triton.cdiv(w, bw), device=device)).clamp(max=bw)
    valid = (torch.arange(triton.cdiv(d, planes) * planes, device=device) < d).view(-1, 1, planes)
    return (valid * (hs[:, None] * ws[None, :]).view(1, -1, 1)).flatten().float()


def conv3x3x3(
    x: torch.Tensor,
    weights: torch.Tensor,
    stats: bool = False,
    residual: torch.Tensor | None = None,
    launch: ConvLaunch = ConvLaunch(),
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """3x3x3 convolution, stride 1, zero padding 1, no bias, of a channels-last fp16 tensor.

    Args:
        x: ``[B, C, D, H, W]`` fp16 in ``torch.channels_last_3d``; only its first ``weights.shape[0] // 27`` channels
            are read (the rest may be zero padding).
        weights: from :py:func:`conv3x3x3_weights`: rows split by :py:func:`channel_pieces`, columns a power of two
            from 16 to 128.
        stats: also return the output's per-(sample, channel) ``(mean, var)``, each ``[B, C_out]`` float32, of the
            values as stored.
        residual: a tensor of the output's shape and layout added to the convolution (before the statistics).
        launch: the launch configuration.

    Returns:
        ``(y, stats)``: ``y`` ``[B, weights.shape[1], D, H, W]`` channels-last fp16; the statistics or ``None``.
    """
    if x.dtype != torch.float16 or not x.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(f"conv3x3x3 takes a channels-last fp16 tensor, got {x.dtype} with strides {x.stride()}.")
    check_kernel_input(x, "conv3x3x3")
    n_b, c_in, d, h, w = x.shape
    k_real, c_out = weights.shape[0] // 27, weights.shape[1]
    if weights.shape[0] % 27 or k_real > c_in:
        raise ValueError(f"weights of shape {tuple(weights.shape)} do not fit an input of {c_in} channels.")
    k0, k1 = channel_pieces(k_real)
    if c_out not in (16, 32, 64, 128):
        raise ValueError(f"conv3x3x3 writes 16, 32, 64 or 128 output channels, the weights have {c_out} columns.")
    y = torch.empty((n_b, c_out, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    if residual is not None and (residual.shape != y.shape or residual.stride() != y.stride()):
        raise ValueError(f"the residual must be a channels-last tensor of shape {tuple(y.shape)}.")
    bh, bw = launch.block_h, launch.block_w

    def descriptor(t: torch.Tensor, channels: int):
        return TensorDescriptor.from_tensor(t.permute(0, 2, 3, 4, 1), [1, 1, bh, bw, max(channels, 16)])

    n_programs = n_b * triton.cdiv(d, launch.planes) * triton.cdiv(h, bh) * triton.cdiv(w, bw)
    mean = m2 = y  # stand-ins the kernel never reads when no statistics are asked for
    if stats:
        mean = torch.empty((n_programs * launch.planes, c_out), device=x.device, dtype=torch.float32)
        m2 = torch.empty_like(mean)
    _conv_kernel[(n_programs,)](
        x,
        descriptor(x, k0),
        descriptor(x, k1),
        TensorDescriptor.from_tensor(weights, [k0, c_out]),
        TensorDescriptor.from_tensor(weights, [max(k1, 16), c_out]),
        descriptor(y, c_out),
        descriptor(residual if residual is not None else y, c_out),
        mean,
        m2,
        d,
        h,
        w,
        c_in,
        K0=k0,
        K1=k1,
        N=c_out,
        PLANES=launch.planes,
        BLOCK_H=bh,
        BLOCK_W=bw,
        STATS=stats,
        RESIDUAL=residual is not None,
        SWAP=launch.swap,
        L1_LOADS=launch.loads == "l1",
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    if not stats:
        return y, None
    counts = _part_counts(d, h, w, launch, x.device)
    return y, merge_parts(mean.view(n_b, -1, c_out), m2.view(n_b, -1, c_out), counts)
