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
channels. It walks the ``PLANES + 2`` input planes those outputs need, and for each of the 9 in-plane shifts loads
the shifted input patch once with a rank-5 tensor descriptor (TMA on Hopper; what lies outside the volume arrives as
zeros, which is the convolution's padding) and multiplies it by one ``[C_in, PLANES * C_out]`` block of "stacked"
weights: column block ``j`` holds the tap that input plane feeds output plane ``j`` through (zeros where it feeds
none). So each input patch is read, and its weights fetched, once for all the output planes it serves, in one
product of ``PLANES * C_out`` rows (two chained 64-row products per patch, the earlier form, fetched each tap's
weights once per plane and on 8 warps got two MMA layouts with a conversion between them).

An input channel count that is not a power of two (VISTA3D's 48 and 96) is read as two power-of-two pieces (32 + 16,
64 + 32), so the zero padding channels of the input tensor are neither read nor multiplied. The output side is one
power-of-two piece: the weights' zero columns give the output's padding channels.

Folded in: ``residual``, a tensor added to the output in the epilogue (the residual add's pass disappears), and
``stats``, the per-(sample, channel) mean and variance of the output as stored, from per-patch statistics the
epilogue writes (the next norm's statistics pass disappears).

Measured and left out (H200): applying the preceding norm and activation to the input as it is loaded (a
"prologue") made the convolution 2.3x slower, because every input value is loaded, normalised and activated once per
tap on the CUDA cores; pointer loads meant to hit L1 where the shifted patches overlap were 1.3x slower than TMA
(Triton stages them with ``cp.async``, which bypasses L1: 0 % hit rate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from monai.networks.kernels.instance_norm import StatsParts
from monai.utils.triton_support import check_kernel_input, tl, triton

__all__ = [
    "ConvLaunch",
    "FUSED_LAUNCHES",
    "conv3x3x3",
    "conv3x3x3_weights",
    "conv3x3x3_single_channel",
    "single_channel_weights",
    "channel_pieces",
]


@dataclass(frozen=True)
class ConvLaunch:
    """Launch configuration of :py:func:`conv3x3x3`: voxels per program (``block_h x block_w`` of ``planes``
    consecutive planes: 1, 2 or 4, the ``planes`` the weights were stacked for), warps, software-pipeline stages,
    and ``swap``: compute the transposed product (output channels as the MMA's M side, voxels as its N side)."""

    block_h: int = 16
    block_w: int = 16
    num_warps: int = 4
    num_stages: int = 3
    planes: int = 1
    swap: bool = False

    def __post_init__(self):
        if self.planes not in (1, 2, 4):
            raise ValueError(f"ConvLaunch planes must be 1, 2 or 4, got {self.planes}.")


# the launches the fused forward gives this kernel, by padded output width (48 -> 64, 96 -> 128 channels); widths not
# listed run on cuDNN (measured on the H200: stage 2 of docs/CHANGELOG.md). Read-only:
# a different table goes into the fused path's configuration (monai.networks.kernels.dispatch.FusedConfig)
FUSED_LAUNCHES: Mapping[int, ConvLaunch] = MappingProxyType(
    {
        64: ConvLaunch(8, 16, num_warps=4, num_stages=3, planes=2, swap=True),
        128: ConvLaunch(16, 16, num_warps=8, num_stages=3, swap=True),
    }
)


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

    from monai.networks.kernels.instance_norm import _store_part

    @triton.jit
    def _tap(acc, a0, a1, w0_desc, w1_desc, row, K0: tl.constexpr, K1: tl.constexpr, SWAP: tl.constexpr):
        # acc += [a0 | a1] @ the [K0 + K1, columns] weight block at `row`; SWAP: the transposed product, acc
        # [columns, voxels], with the output channels as the MMA's M side and the voxels as its wide N side
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
    def _epilogue(acc, r_desc, y_desc, count_ptr, mean_ptr, m2_ptr, b, d0, h0, w0, D, H, W, pid,
                  N: tl.constexpr, PLANES: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                  STATS: tl.constexpr, RESIDUAL: tl.constexpr, SWAP: tl.constexpr):  # fmt: skip
        BM: tl.constexpr = BLOCK_H * BLOCK_W
        if SWAP:
            acc = tl.trans(acc)
        # [voxels, plane * N + channel] -> [plane, voxels, channel], the order of the output box
        acc = tl.permute(tl.reshape(acc, [BM, PLANES, N]), (1, 0, 2))
        if RESIDUAL:
            acc += r_desc.load([b, d0, h0, w0, 0]).reshape(PLANES, BM, N).to(tl.float32)
        out = acc.to(tl.float16)
        y_desc.store([b, d0, h0, w0, 0], out.reshape(1, PLANES, BLOCK_H, BLOCK_W, N))  # TMA clips what lies outside
        if STATS:
            # per plane: mean and centred sum of squares of the stored values, over the patch voxels inside the
            # volume (none for a plane past the end: its part then has count 0 and zero statistics)
            i = tl.arange(0, BM)
            j = tl.arange(0, PLANES)
            inside = (((h0 + i // BLOCK_W) < H) & ((w0 + i % BLOCK_W) < W))[None, :] & ((d0 + j) < D)[:, None]
            count = tl.sum(inside.to(tl.float32), axis=1)
            n = tl.maximum(count, 1.0)
            vals = tl.where(inside[:, :, None], out.to(tl.float32), 0.0)
            mean = tl.sum(vals, axis=1) / n[:, None]
            centred = tl.where(inside[:, :, None], vals - mean[:, None, :], 0.0)
            cols = (pid * PLANES + j).to(tl.int64)[:, None] * N + tl.arange(0, N)[None, :]
            tl.store(mean_ptr + cols, mean)
            tl.store(m2_ptr + cols, tl.sum(centred * centred, axis=1))
            tl.store(count_ptr + pid * PLANES + j, count)

    @triton.jit
    def _conv_kernel(
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
        K0: tl.constexpr,
        K1: tl.constexpr,
        N: tl.constexpr,
        PLANES: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_W: tl.constexpr,
        STATS: tl.constexpr,
        RESIDUAL: tl.constexpr,
        SWAP: tl.constexpr,
    ):
        # K0 (+ K1) input channels in two pieces (K1 = 0: one piece), N output channels per plane
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
        acc = tl.zeros([PLANES * N, BM] if SWAP else [BM, PLANES * N], dtype=tl.float32)
        for t in range((PLANES + 2) * 9):  # input plane d0 - 1 + t // 9, in-plane shift t % 9
            dd = d0 + t // 9 - 1
            hs = h0 + (t % 9) // 3 - 1
            ws = w0 + t % 3 - 1
            a0 = x0_desc.load([b, dd, hs, ws, 0]).reshape(BM, K0)
            a1 = a0
            if K1 > 0:
                a1 = x1_desc.load([b, dd, hs, ws, K0]).reshape(BM, K1)
            acc = _tap(acc, a0, a1, w0_desc, w1_desc, t * (K0 + K1), K0, K1, SWAP)
        _epilogue(acc, r_desc, y_desc, count_ptr, mean_ptr, m2_ptr, b, d0, h0, w0, D, H, W, pid,
                  N, PLANES, BLOCK_H, BLOCK_W, STATS, RESIDUAL, SWAP)  # fmt: skip

    @triton.jit
    def _single_channel_kernel(x_ptr, w_ptr, y_ptr, count_ptr, mean_ptr, m2_ptr, D, H, W, C_OUT: tl.constexpr,
                               BLOCK_V: tl.constexpr, STATS: tl.constexpr):  # fmt: skip
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
        out = tl.dot(a, weights).to(tl.float16)
        rows = b.to(tl.int64) * n_vox + v.to(tl.int64)
        tl.store(y_ptr + rows[:, None] * C_OUT + co[None, :], out, mask=(v < n_vox)[:, None])
        if STATS:  # this program's part of the next norm's statistics, sample-major as the merge reads them
            _store_part(out, v < n_vox, count_ptr, mean_ptr, m2_ptr, b * tl.num_programs(0) + pid, C_OUT)


def single_channel_weights(weight: torch.Tensor, out_channels: int) -> torch.Tensor:
    """The fp16 ``[32, out_channels]`` GEMM operand of :py:func:`conv3x3x3_single_channel` from a ``Conv3d`` weight
    ``[C, 1, 3, 3, 3]``: row ``t`` holds tap ``t``'s weights, rows 27-31 and the columns from ``C`` on are zeros."""
    if weight.ndim != 5 or tuple(weight.shape[1:]) != (1, 3, 3, 3) or weight.shape[0] > out_channels:
        raise ValueError(
            f"single_channel_weights takes a [C, 1, 3, 3, 3] weight with C <= out_channels ({out_channels}), "
            f"got shape {tuple(weight.shape)}."
        )
    if out_channels & (out_channels - 1):
        raise ValueError(f"single_channel_weights writes a power-of-two number of channels, got {out_channels}.")
    gemm = torch.zeros(32, out_channels, device=weight.device, dtype=torch.float16)
    gemm[:27, : weight.shape[0]] = weight.detach().reshape(weight.shape[0], 27).t()
    return gemm


def conv3x3x3_single_channel(
    x: torch.Tensor, weights: torch.Tensor, stats: bool = False, block_v: int = 128
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """3x3x3 convolution (stride 1, zero padding 1, no bias) of a one-channel volume, written channels-last in fp16.

    cuDNN cannot tell the layout of a one-channel input and either returns channels-first (a conversion follows) or,
    with the input padded to 8 channels, runs as slowly as a 64-channel layer; here the 27 taps form the GEMM's K.

    Args:
        x: ``[B, 1, D, H, W]``, contiguous, any float dtype (read as fp16).
        weights: ``[32, C_out]`` fp16 from :py:func:`single_channel_weights`; ``C_out`` output channels are written.
        stats: also return the output's per-(sample, channel) ``(mean, var)``, each ``[B, C_out]`` float32, of the
            values as stored (the first block's norm reads them; a pass over the output spared).
        block_v: voxels per program.

    Returns:
        ``(y, stats)``: ``y`` ``[B, C_out, D, H, W]`` channels-last fp16; the statistics or ``None``.
    """
    if x.ndim != 5 or x.shape[1] != 1 or not x.is_contiguous():
        raise ValueError(
            f"conv3x3x3_single_channel takes a contiguous [B, 1, D, H, W] tensor, got shape {tuple(x.shape)}."
        )
    if weights.ndim != 2 or weights.shape[0] != 32 or weights.dtype != torch.float16 or not weights.is_contiguous():
        raise ValueError(
            f"conv3x3x3_single_channel takes contiguous fp16 weights [32, C_out], got {weights.dtype} of shape "
            f"{tuple(weights.shape)}: build them with single_channel_weights(weight, out_channels)."
        )
    check_kernel_input(x, "conv3x3x3_single_channel")
    n_b, _, d, h, w = x.shape
    out_channels = weights.shape[1]
    y = torch.empty(
        (n_b, out_channels, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d
    )
    n_programs = triton.cdiv(d * h * w, block_v)
    parts = StatsParts.allocate(n_b * n_programs, out_channels, y, stats)
    _single_channel_kernel[(n_programs, n_b)](
        x, weights, y, parts.count, parts.mean, parts.m2, d, h, w, C_OUT=out_channels, BLOCK_V=block_v, STATS=stats
    )
    return y, parts.merged(n_b)


def conv3x3x3_weights(
    weight: torch.Tensor, in_channels: int | None = None, out_columns: int | None = None, planes: int = 1
) -> torch.Tensor:
    """The fp16 GEMM operand of :py:func:`conv3x3x3` from a ``Conv3d`` weight ``[C_out, C_in, 3, 3, 3]``, stacked for
    ``planes`` output planes per program: ``[(planes + 2) * 9 * in_channels, planes * out_columns]``.

    Row block ``(p, s)`` (input plane ``p`` of the ``planes + 2`` a program reads, in-plane shift ``s``) holds in
    column block ``j`` the tap through which that input feeds output plane ``j`` (depth offset ``p - j``), or zeros.
    With one plane this is the plain ``[27 * in_channels, out_columns]`` matrix of the 27 taps.

    Args:
        weight: the convolution's weight.
        in_channels: input channels the GEMM reads (``C_in`` by default; fewer drops trailing zero channels of a
            padded weight).
        out_columns: output columns per plane, a power of two (``C_out`` by default; more adds zero columns, which
            become the output's zero padding channels).
        planes: output planes per program, the ``planes`` of the :py:class:`ConvLaunch` it is used with.
    """
    c_out, c_in = weight.shape[:2]
    k = c_in if in_channels is None else in_channels
    n = c_out if out_columns is None else out_columns
    kk, nn = min(k, c_in), min(n, c_out)
    taps = weight.detach()[:nn, :kk].permute(2, 3, 4, 1, 0).reshape(3, 9, kk, nn)  # [depth, shift, in, out]
    gemm = torch.zeros(planes + 2, 9, k, planes, n, device=weight.device, dtype=torch.float16)
    for j in range(planes):
        gemm[j : j + 3, :, :kk, j, :nn] = taps
    return gemm.reshape((planes + 2) * 9 * k, planes * n)


def conv3x3x3(
    x: torch.Tensor,
    weights: torch.Tensor,
    stats: bool = False,
    residual: torch.Tensor | None = None,
    launch: ConvLaunch = ConvLaunch(),
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """3x3x3 convolution, stride 1, zero padding 1, no bias, of a channels-last fp16 tensor.

    Args:
        x: ``[B, C, D, H, W]`` fp16 in ``torch.channels_last_3d``; only the input channels the weights hold are read
            (the rest may be zero padding).
        weights: from :py:func:`conv3x3x3_weights` with ``planes=launch.planes``: input channels split by
            :py:func:`channel_pieces`, output columns per plane a power of two from 16 to 128.
        stats: also return the output's per-(sample, channel) ``(mean, var)``, each ``[B, C_out]`` float32, of the
            values as stored.
        residual: a tensor of the output's shape and layout added to the convolution (before the statistics).
        launch: the launch configuration.

    Returns:
        ``(y, stats)``: ``y`` ``[B, weights.shape[1] // launch.planes, D, H, W]`` channels-last fp16; the statistics
        or ``None``.
    """
    if x.dtype != torch.float16 or not x.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(f"conv3x3x3 takes a channels-last fp16 tensor, got {x.dtype} with strides {x.stride()}.")
    check_kernel_input(x, "conv3x3x3")
    n_b, c_in, d, h, w = x.shape
    planes, bh, bw = launch.planes, launch.block_h, launch.block_w
    rows, cols = weights.shape
    if rows % ((planes + 2) * 9) or cols % planes or rows // ((planes + 2) * 9) > c_in:
        raise ValueError(
            f"weights of shape {tuple(weights.shape)} do not fit an input of {c_in} channels and {planes} plane(s) per "
            "program: build them with conv3x3x3_weights(..., planes=launch.planes)."
        )
    k0, k1 = channel_pieces(rows // ((planes + 2) * 9))
    c_out = cols // planes
    if c_out not in (16, 32, 64, 128):
        raise ValueError(f"conv3x3x3 writes 16, 32, 64 or 128 output channels, the weights have {c_out} per plane.")
    y = torch.empty((n_b, c_out, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    if residual is not None and (residual.shape != y.shape or residual.stride() != y.stride()):
        raise ValueError(f"the residual must be a channels-last tensor of shape {tuple(y.shape)}.")

    def descriptor(t: torch.Tensor, box_planes: int, channels: int):
        return TensorDescriptor.from_tensor(t.permute(0, 2, 3, 4, 1), [1, box_planes, bh, bw, max(channels, 16)])

    n_programs = n_b * triton.cdiv(d, planes) * triton.cdiv(h, bh) * triton.cdiv(w, bw)
    parts = StatsParts.allocate(n_programs * planes, c_out, y, stats)
    _conv_kernel[(n_programs,)](
        descriptor(x, 1, k0),
        descriptor(x, 1, k1),
        TensorDescriptor.from_tensor(weights, [k0, cols]),
        TensorDescriptor.from_tensor(weights, [max(k1, 16), cols]),
        descriptor(y, planes, c_out),
        descriptor(residual if residual is not None else y, planes, c_out),
        parts.count,
        parts.mean,
        parts.m2,
        d,
        h,
        w,
        K0=k0,
        K1=k1,
        N=c_out,
        PLANES=planes,
        BLOCK_H=bh,
        BLOCK_W=bw,
        STATS=stats,
        RESIDUAL=residual is not None,
        SWAP=launch.swap,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    return y, parts.merged(n_b)
