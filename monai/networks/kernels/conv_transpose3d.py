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
"""The SegResNet decoders' upsampling in Triton: a 3x3x3 transposed convolution of stride 2 (padding 1, output
padding 1, no bias) of a channels-last fp16 tensor, with the skip connection added and the next instance norm's
statistics computed in its epilogue.

Output voxel ``2m + a`` (per dimension, ``a`` in {0, 1}) receives input voxel ``m`` through tap ``1`` when ``a = 0``,
and input voxels ``m`` and ``m + 1`` through taps ``2`` and ``0`` when ``a = 1`` (tap ``1 + a - 2s`` for input
``m + s``). So the output splits into eight sub-lattices of the input's size, one per parity ``(a_d, a_h, a_w)``,
each a small convolution of the input with 1, 2, 4 or 8 taps (27 in all). A program takes a ``BLOCK_H x BLOCK_W``
patch of one input plane and one in-plane parity ``(a_h, a_w)``, and computes its two depth parities side by side
as one product of ``2 N`` columns (the weight blocks stacked as the 3x3x3 kernel stacks its planes), so each input
patch it needs, 2 to 8, is loaded once; the loop over them is a loop Triton pipelines. The sub-lattices are
written through a view of the output that splits each fine row and column into (coarse index, parity), one TMA
box each.

cuDNN runs this as a "dgrad" kernel and the skip add is a second pass over the full-resolution output; at VISTA3D's
top level (96 -> 48 channels, 64^3 -> 128^3) that was 0.36 + 0.27 ms per window on an H100. Measured and left out:
the eight sub-lattices of a patch in one program, its loops unrolled at compile time (Triton pipelines no such loop:
the forward 0.3-1.0 ms slower per window than cuDNN and the add).
"""

from __future__ import annotations

import torch

from monai.networks.kernels.conv3d import ConvLaunch, channel_pieces
from monai.networks.kernels.instance_norm import StatsParts
from monai.utils.triton_support import check_kernel_input, tl, triton

__all__ = ["UPSAMPLE_LAUNCH", "conv_transpose3x3x3", "conv_transpose3x3x3_weights", "plain_upsample"]

# the launch the fused forward gives this kernel (one input plane per program; swap: output channels as the MMA's
# M side). 8 x 16 voxels on 4 warps in 2 stages fit two programs per SM (16 x 16 on 8 warps in 3 stages took 221 KB
# of shared memory: one), so one program's epilogue runs beside another's products. Measured on an H100 at VISTA3D's
# top level, 14 windows: the kernel 4.89 against 6.90 ms (8 x 8 in 2 stages 5.70, cuDNN and the add 13.03); the
# forward per window at 14 / 1 windows 10.96 / 11.66 against 11.13 / 11.83 ms
UPSAMPLE_LAUNCH = ConvLaunch(8, 16, num_warps=4, num_stages=2, swap=True)


def plain_upsample(conv: torch.nn.Module) -> bool:
    """Whether ``conv`` is the transposed convolution this kernel computes: 3x3x3, stride 2, padding 1, output
    padding 1, no bias, dilation or groups."""
    if not isinstance(conv, torch.nn.ConvTranspose3d):
        return False
    shape = conv.kernel_size == (3, 3, 3) and conv.stride == (2, 2, 2) and conv.padding == (1, 1, 1)
    plain = conv.output_padding == (1, 1, 1) and conv.dilation == (1, 1, 1) and conv.groups == 1
    return shape and plain and conv.bias is None


if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    from monai.networks.kernels.conv3d import _tap
    from monai.networks.kernels.instance_norm import _store_part

    @triton.jit
    def _sublattice_epilogue(acc, s_desc, y_desc, count_ptr, mean_ptr, m2_ptr, plane, h0, w0, ah, aw, H, W, part,
                             N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, STATS: tl.constexpr,
                             SKIP: tl.constexpr):  # fmt: skip
        # one sub-lattice's box [voxels, N]: output plane `plane` (sample-major), rows 2 (h0 + i) + ah, columns
        # 2 (w0 + j) + aw
        BM: tl.constexpr = BLOCK_H * BLOCK_W
        if SKIP:
            acc += s_desc.load([plane, h0, ah, w0, aw * N]).reshape(BM, N).to(tl.float32)
        out = acc.to(tl.float16)
        y_desc.store([plane, h0, ah, w0, aw * N], out.reshape(1, BLOCK_H, 1, BLOCK_W, N))  # TMA clips the outside
        if STATS:
            i = tl.arange(0, BM)
            inside = ((h0 + i // BLOCK_W) < H) & ((w0 + i % BLOCK_W) < W)
            _store_part(out, inside, count_ptr, mean_ptr, m2_ptr, part, N)

    @triton.jit
    def _upsample_kernel(x0_desc, x1_desc, w0_desc, w1_desc, y_desc, s_desc, count_ptr, mean_ptr, m2_ptr, D, H, W,
                         K0: tl.constexpr, K1: tl.constexpr, N: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_W: tl.constexpr, STATS: tl.constexpr, SKIP: tl.constexpr,
                         SWAP: tl.constexpr):  # fmt: skip
        # D, H, W: the input's (coarse) sizes. Program 4 * tile + g: in-plane parity g = (a_h, a_w) of the tile,
        # output planes 2 md and 2 md + 1 side by side in one [BM, 2N] accumulator
        BM: tl.constexpr = BLOCK_H * BLOCK_W
        K: tl.constexpr = K0 + K1
        pid = tl.program_id(0)
        g = pid % 4
        tile = pid // 4
        tiles_w = tl.cdiv(W, BLOCK_W)
        tiles_h = tl.cdiv(H, BLOCK_H)
        w0 = (tile % tiles_w) * BLOCK_W
        rest = tile // tiles_w
        h0 = (rest % tiles_h) * BLOCK_H
        rest = rest // tiles_h
        md = rest % D
        b = rest // D
        ah = g // 2
        aw = g % 2
        # the group's loads: 2, 4, 4 or 8 (depth shift fastest, then column, then row shift); its weight blocks
        # start at block 0, 2, 6 or 10
        loads = 2 * (ah + 1) * (aw + 1)
        first = 2 * g + 2 * (g >= 2).to(tl.int32) + 2 * (g >= 3).to(tl.int32)
        acc = tl.zeros([2 * N, BM] if SWAP else [BM, 2 * N], dtype=tl.float32)
        for t in range(loads):
            sd = t % 2
            sw = (t // 2) % (aw + 1)
            sh = t // (2 * (aw + 1))
            a0 = x0_desc.load([b, md + sd, h0 + sh, w0 + sw, 0]).reshape(BM, K0)  # md + 1 = D reads zeros
            a1 = a0
            if K1 > 0:
                a1 = x1_desc.load([b, md + sd, h0 + sh, w0 + sw, K0]).reshape(BM, K1)
            acc = _tap(acc, a0, a1, w0_desc, w1_desc, (first + t) * K, K0, K1, SWAP)
        if SWAP:
            acc = tl.trans(acc)
        # [voxels, plane * N + channel] -> the two planes' [voxels, N]
        acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, [BM, 2, N]), (0, 2, 1)))
        plane = b * 2 * D + 2 * md
        _sublattice_epilogue(acc0, s_desc, y_desc, count_ptr, mean_ptr, m2_ptr, plane, h0, w0, ah, aw, H, W,
                             2 * pid, N, BLOCK_H, BLOCK_W, STATS, SKIP)  # fmt: skip
        _sublattice_epilogue(acc1, s_desc, y_desc, count_ptr, mean_ptr, m2_ptr, plane + 1, h0, w0, ah, aw, H, W,
                             2 * pid + 1, N, BLOCK_H, BLOCK_W, STATS, SKIP)  # fmt: skip


def conv_transpose3x3x3_weights(
    weight: torch.Tensor, in_channels: int | None = None, out_columns: int | None = None
) -> torch.Tensor:
    """The fp16 GEMM operand of :py:func:`conv_transpose3x3x3` from a ``ConvTranspose3d`` weight ``[C_in, C_out, 3, 3,
    3]``: ``[18 * in_channels, 2 * out_columns]``, one ``[in_channels, 2 * out_columns]`` block per input patch a
    program multiplies.

    Block ``first(g) + t`` serves in-plane parity ``g = 2 a_h + a_w`` (its blocks start at 0, 2, 6, 10) and its
    load ``t``: depth shift ``t % 2``, column shift ``(t // 2) % (a_w + 1)``, row shift ``t // (2 (a_w + 1))``.
    Its first ``out_columns`` columns hold the tap that feeds the even output plane (none for depth shift 1: zeros),
    the last ``out_columns`` the tap that feeds the odd one.

    Args:
        weight: the transposed convolution's weight.
        in_channels: input channels the GEMM reads (``C_in`` by default; fewer drops trailing zero channels).
        out_columns: output columns per plane, a power of two (``C_out`` by default; more adds zero columns, which
            become the output's zero padding channels).
    """
    if weight.ndim != 5 or tuple(weight.shape[2:]) != (3, 3, 3):
        raise ValueError(
            f"conv_transpose3x3x3_weights takes a [C_in, C_out, 3, 3, 3] weight, got {tuple(weight.shape)}."
        )
    c_in, c_out = weight.shape[:2]
    k = c_in if in_channels is None else in_channels
    n = c_out if out_columns is None else out_columns
    kk, nn = min(k, c_in), min(n, c_out)
    taps = weight.detach()[:kk, :nn].to(torch.float16)  # [in, out, depth tap, row tap, column tap]
    gemm = torch.zeros(18, k, 2, n, device=weight.device, dtype=torch.float16)
    block = 0
    for ah, aw in ((0, 0), (0, 1), (1, 0), (1, 1)):
        for sh in range(ah + 1):
            for sw in range(aw + 1):
                th, tw = 1 + ah - 2 * sh, 1 + aw - 2 * sw  # tap 1 + a - 2 s for input m + s
                gemm[block, :kk, 0, :nn] = taps[:, :, 1, th, tw]  # depth shift 0: even plane through tap 1,
                gemm[block, :kk, 1, :nn] = taps[:, :, 2, th, tw]  # odd plane through tap 2
                gemm[block + 1, :kk, 1, :nn] = taps[:, :, 0, th, tw]  # depth shift 1: odd plane through tap 0
                block += 2
    return gemm.reshape(18 * k, 2 * n)


def conv_transpose3x3x3(
    x: torch.Tensor,
    weights: torch.Tensor,
    skip: torch.Tensor | None = None,
    stats: bool = False,
    launch: ConvLaunch = UPSAMPLE_LAUNCH,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """3x3x3 transposed convolution, stride 2, padding 1, output padding 1, no bias, of a channels-last fp16 tensor
    (``[B, C, D, H, W]`` -> ``[B, C_out, 2D, 2H, 2W]``), plus ``skip``.

    Args:
        x: ``[B, C, D, H, W]`` fp16 in ``torch.channels_last_3d``; only the input channels the weights hold are read.
        weights: from :py:func:`conv_transpose3x3x3_weights`: input channels split by
            :py:func:`~monai.networks.kernels.conv3d.channel_pieces`, 16 to 128 output columns (a power of two).
        skip: a channels-last tensor of the output's shape added to it before the rounding to fp16 (the decoder's
            skip connection).
        stats: also return the output's per-(sample, channel) ``(mean, var)``, each ``[B, C_out]`` float32, of the
            values as stored.
        launch: voxels per program (``block_h x block_w`` of one input plane), warps, stages and ``swap``;
            ``planes`` must be 1.

    Returns:
        ``(y, stats)``: ``y`` channels-last fp16; the statistics or ``None``.
    """
    if x.dtype != torch.float16 or x.ndim != 5 or not x.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(
            f"conv_transpose3x3x3 takes a channels-last fp16 [B, C, D, H, W] tensor, got {x.dtype} of shape "
            f"{tuple(x.shape)} with strides {x.stride()}."
        )
    check_kernel_input(x, "conv_transpose3x3x3")
    if launch.planes != 1:
        raise ValueError(f"conv_transpose3x3x3 takes one input plane per program, the launch has {launch.planes}.")
    n_b, c_in, d, h, w = x.shape
    rows, cols = weights.shape
    if rows % 18 or cols % 2 or rows // 18 > c_in:
        raise ValueError(
            f"weights of shape {tuple(weights.shape)} do not fit an input of {c_in} channels: build them with "
            "conv_transpose3x3x3_weights."
        )
    k0, k1 = channel_pieces(rows // 18)
    c_out = cols // 2
    if c_out not in (16, 32, 64, 128):
        raise ValueError(f"conv_transpose3x3x3 writes 16, 32, 64 or 128 output channels, the weights have {c_out}.")
    y = torch.empty(
        (n_b, c_out, 2 * d, 2 * h, 2 * w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d
    )
    if skip is not None and (skip.shape != y.shape or skip.stride() != y.stride() or skip.dtype != y.dtype):
        raise ValueError(
            f"the skip must be a channels-last fp16 tensor of shape {tuple(y.shape)}, got {skip.dtype} of shape "
            f"{tuple(skip.shape)} with strides {skip.stride()}."
        )
    bh, bw = launch.block_h, launch.block_w

    def input_box(channels: int):
        return TensorDescriptor.from_tensor(x.permute(0, 2, 3, 4, 1), [1, 1, bh, bw, max(channels, 16)])

    def sublattices(t: torch.Tensor):
        # [B * 2D, H, 2, W, 2 * C]: an output row and column as (coarse index, parity), parity then channel last
        view = t.permute(0, 2, 3, 4, 1).reshape(n_b * 2 * d, h, 2, w, 2 * c_out)
        return TensorDescriptor.from_tensor(view, [1, bh, 1, bw, c_out])

    n_programs = 4 * n_b * d * triton.cdiv(h, bh) * triton.cdiv(w, bw)  # four in-plane parities per tile
    parts = StatsParts.allocate(n_programs * 2, c_out, y, stats)  # a part per program and output plane
    _upsample_kernel[(n_programs,)](
        input_box(k0),
        input_box(k1),
        TensorDescriptor.from_tensor(weights, [k0, cols]),
        TensorDescriptor.from_tensor(weights, [max(k1, 16), cols]),
        sublattices(y),
        sublattices(skip if skip is not None else y),
        parts.count,
        parts.mean,
        parts.m2,
        d,
        h,
        w,
        K0=k0,
        K1=k1,
        N=c_out,
        BLOCK_H=bh,
        BLOCK_W=bw,
        STATS=stats,
        SKIP=skip is not None,
        SWAP=launch.swap,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    return y, parts.merged(n_b)
