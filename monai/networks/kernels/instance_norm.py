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
"""Instance normalisation of channels-last activations, fused with its affine map, a residual add and the activation.

PyTorch has no channels-last path for ``InstanceNorm3d``: on an NDHWC tensor it converts the layout twice and runs
three to four times slower than on NCDHW. These kernels read the NDHWC buffer as ``[B, S, C]`` (``S`` voxels per
sample): one pass gathers per-(sample, channel) statistics, a second normalises, adds the residual, applies the
activation and writes fp16. Channels from ``real_channels`` on are written as zeros, so a tensor padded with zero
channels (the layout cuDNN's fast kernels want) stays padded with zeros.

:py:func:`norm_act_reference` is the same arithmetic in PyTorch, for any device and dtype; the tests hold the
kernels to it and it to ``nn.InstanceNorm3d``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from monai.utils.triton_support import check_kernel_input, tl, triton

__all__ = [
    "NormAct",
    "StatsParts",
    "instance_stats",
    "merge_parts",
    "merge_parts_triton",
    "norm_act",
    "norm_act_reference",
    "as_rows",
]

_ACTS = {"none": 0, "relu": 1, "leakyrelu": 2}


@dataclass(frozen=True)
class NormAct:
    """What runs after a convolution: ``act(norm(x) * weight + bias + residual)``.

    Args:
        eps: added to the variance, as ``nn.InstanceNorm3d``'s ``eps``.
        act: ``"relu"``, ``"leakyrelu"`` or ``"none"``.
        negative_slope: slope of ``"leakyrelu"`` below zero.
    """

    eps: float = 1e-5
    act: str = "relu"
    negative_slope: float = 0.01

    def __post_init__(self):
        if self.act not in _ACTS:
            raise ValueError(f"NormAct act must be one of {sorted(_ACTS)}, got {self.act!r}.")


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """The ``[B, S, C]`` view of a channels-last ``[B, C, *spatial]`` tensor (no copy)."""
    if x.ndim < 3 or not x.permute(0, *range(2, x.ndim), 1).is_contiguous():
        raise ValueError(
            "expected a channels-last [B, C, *spatial] tensor "
            "(e.g. x.contiguous(memory_format=torch.channels_last_3d)), "
            f"got shape {tuple(x.shape)} with strides {x.stride()}."
        )
    return x.permute(0, *range(2, x.ndim), 1).reshape(x.shape[0], -1, x.shape[1])


def _activate(y: torch.Tensor, spec: NormAct) -> torch.Tensor:
    if spec.act == "relu":
        return torch.relu(y)
    if spec.act == "leakyrelu":
        return torch.nn.functional.leaky_relu(y, spec.negative_slope)
    return y


def norm_act_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    spec: NormAct,
    residual: torch.Tensor | None = None,
    real_channels: int | None = None,
) -> torch.Tensor:
    """``act(instance_norm(x) * weight + bias + residual)`` in float32 arithmetic, returned in ``x``'s dtype and layout.

    Args:
        x: ``[B, C, *spatial]`` in any memory layout.
        weight, bias: ``[C]`` affine parameters, or ``None`` for none.
        spec: eps and activation.
        residual: optional tensor of ``x``'s shape added before the activation.
        real_channels: channels from this index on are set to zero (padding channels); ``None``: all are real.
    """
    dims = tuple(range(2, x.ndim))
    xf = x.float()
    var, mean = torch.var_mean(xf, dim=dims, unbiased=False, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + spec.eps)
    shape = (1, -1) + (1,) * len(dims)
    if weight is not None:
        y = y * weight.float().view(shape)
    if bias is not None:
        y = y + bias.float().view(shape)
    if residual is not None:
        y = y + residual.float()
    y = _activate(y, spec)
    if real_channels is not None and real_channels < x.shape[1]:
        y[:, real_channels:] = 0
    memory_format = torch.channels_last_3d if x.ndim == 5 and x.stride(1) == 1 else torch.contiguous_format
    return y.to(x.dtype).contiguous(memory_format=memory_format)


if triton is not None:

    @triton.jit
    def _stats_kernel(
        x_ptr,
        addend_ptr,
        count_ptr,
        mean_ptr,
        m2_ptr,
        S,
        C,
        n_parts,
        HAS_ADDEND: tl.constexpr,
        ROWS_PER_PART: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # one program: the rows [part * ROWS_PER_PART, ...) of one sample and BLOCK_C channels. Each thread sums its
        # own elements (no cross-thread reduction inside the loop); the values are shifted by the part's first row,
        # so the sum of squares does not cancel when the mean is large against the spread. With HAS_ADDEND the
        # kernel first adds the addend into x (a residual or skip connection) and takes the statistics of the sum
        # as stored, so the add and the statistics pass read the tensor once
        part = tl.program_id(0)
        cb = tl.program_id(1)
        b = tl.program_id(2)
        cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        offset = b.to(tl.int64) * S * C
        base = x_ptr + offset
        start = part * ROWS_PER_PART
        shift = tl.load(base + start.to(tl.int64) * C + cols)
        if HAS_ADDEND:
            shift = (shift.to(tl.float32) + tl.load(addend_ptr + offset + start.to(tl.int64) * C + cols)).to(
                shift.dtype
            )
        shift = shift.to(tl.float32)
        if HAS_ADDEND:
            # the loop below writes the sum into row `start`: no thread may store it before every thread has read
            # the shift from there (else some threads shift by x + 2 * addend and the statistics come out wrong)
            tl.debug_barrier()
        acc1 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        for r0 in range(0, ROWS_PER_PART, BLOCK_S):  # ROWS_PER_PART is a multiple of BLOCK_S
            rows = start + r0 + tl.arange(0, BLOCK_S)
            valid = (rows < S)[:, None]
            offs = rows.to(tl.int64)[:, None] * C + cols[None, :]
            x = tl.load(base + offs, mask=valid, other=0.0)
            if HAS_ADDEND:
                x = (x.to(tl.float32) + tl.load(addend_ptr + offset + offs, mask=valid, other=0.0)).to(x.dtype)
                tl.store(base + offs, x, mask=valid)
            d = tl.where(valid, x.to(tl.float32) - shift[None, :], 0.0)
            acc1 += d
            acc2 += d * d
        n = tl.minimum(S - start, ROWS_PER_PART).to(tl.float32)
        s1 = tl.sum(acc1, axis=0)
        s2 = tl.sum(acc2, axis=0)
        out = (b * n_parts + part).to(tl.int64) * C + cols
        tl.store(mean_ptr + out, shift + s1 / n)
        tl.store(m2_ptr + out, tl.maximum(s2 - s1 * s1 / n, 0.0))
        if cb == 0:
            tl.store(count_ptr + b * n_parts + part, n)

    @triton.jit
    def _merge_kernel(
        count_ptr,
        mean_ptr,
        m2_ptr,
        out_count_ptr,
        out_mean_ptr,
        out_m2_ptr,
        n_parts,
        C,
        CHUNK: tl.constexpr,
        FINAL: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # one program: CHUNK consecutive parts of one sample, BLOCK_C channels -> one part (FINAL: the sample's
        # mean and variance). The chunk is read once, into registers (a loop of dependent loads cost more than the
        # arithmetic); from it the count-weighted mean, then the parts' m2 plus their counts times their squared
        # distance to it (Chan et al.'s merge: no large sum of squares cancels)
        ck = tl.program_id(0)
        cb = tl.program_id(1)
        b = tl.program_id(2)
        cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        rows = ck * CHUNK + tl.arange(0, CHUNK)
        valid = rows < n_parts
        rows = b.to(tl.int64) * n_parts + rows
        offs = rows[:, None] * C + cols[None, :]
        n = tl.load(count_ptr + rows, mask=valid, other=0.0)
        m = tl.load(mean_ptr + offs, mask=valid[:, None], other=0.0)
        spread = tl.load(m2_ptr + offs, mask=valid[:, None], other=0.0)
        count = tl.sum(n, axis=0)
        mean = tl.sum(n[:, None] * m, axis=0) / tl.maximum(count, 1.0)  # a chunk of empty parts: mean 0, weight 0
        d = m - mean[None, :]
        spread += n[:, None] * d * d
        m2 = tl.sum(spread, axis=0)
        n_out = tl.num_programs(0)
        out = (b * n_out + ck).to(tl.int64) * C + cols
        tl.store(out_mean_ptr + out, mean)
        if FINAL:
            tl.store(out_m2_ptr + out, m2 / tl.maximum(count, 1.0))
        else:
            tl.store(out_m2_ptr + out, m2)
            if cb == 0:
                tl.store(out_count_ptr + b * n_out + ck, count)

    @triton.jit
    def _store_part(out, inside, count_ptr, mean_ptr, m2_ptr, part, N: tl.constexpr):
        # one part of a convolution epilogue's statistics (StatsParts): the count of the rows `inside` of a tile
        # `out` [rows, N], and per channel their mean and centred sum of squares, into part `part`
        count = tl.sum(inside.to(tl.float32), axis=0)
        vals = tl.where(inside[:, None], out.to(tl.float32), 0.0)
        mean = tl.sum(vals, axis=0) / tl.maximum(count, 1.0)
        centred = tl.where(inside[:, None], vals - mean[None, :], 0.0)
        cols = part.to(tl.int64) * N + tl.arange(0, N)
        tl.store(mean_ptr + cols, mean)
        tl.store(m2_ptr + cols, tl.sum(centred * centred, axis=0))
        tl.store(count_ptr + part, count)

    @triton.jit
    def _norm_act_tile(x_ptr, res_ptr, offs, real, mean_ptr, var_ptr, w_ptr, b_ptr, stat_offs, cols, eps,
                       negative_slope, HAS_AFFINE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       ACT: tl.constexpr):  # fmt: skip
        # act(norm(x) * w + b + residual) of one [rows, channels] tile in float32, zero where not `real` (padding
        # channels and rows past the end are not read); the statistics of the tile's sample at stat_offs
        x = tl.load(x_ptr + offs, mask=real, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + stat_offs)
        rstd = tl.rsqrt(tl.load(var_ptr + stat_offs) + eps)
        if HAS_AFFINE:
            scale = rstd * tl.load(w_ptr + cols)
            shift = tl.load(b_ptr + cols) - mean * scale
        else:
            scale = rstd
            shift = -mean * rstd
        y = x * scale[None, :] + shift[None, :]
        if HAS_RESIDUAL:
            y += tl.load(res_ptr + offs, mask=real, other=0.0).to(tl.float32)
        if ACT == 1:
            y = tl.maximum(y, 0.0)
        elif ACT == 2:
            y = tl.where(y > 0, y, y * negative_slope)
        return tl.where(real, y, 0.0)

    @triton.jit
    def _apply_kernel(
        x_ptr,
        res_ptr,
        y_ptr,
        mean_ptr,
        var_ptr,
        w_ptr,
        b_ptr,
        S,
        C,
        real_channels,
        eps,
        negative_slope,
        HAS_AFFINE: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
        ACT: tl.constexpr,
        WRITE_PADDING: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # padding channels (from real_channels on) are neither read nor, unless WRITE_PADDING, written: where the
        # output already holds their zeros, a 48-of-64-channel tensor then costs 3/4 of the memory traffic
        sb = tl.program_id(0)
        cb = tl.program_id(1)
        b = tl.program_id(2)
        rows = sb * BLOCK_S + tl.arange(0, BLOCK_S)
        cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        valid = (rows < S)[:, None]
        real = valid & (cols < real_channels)[None, :]
        offs = b.to(tl.int64) * S * C + rows.to(tl.int64)[:, None] * C + cols[None, :]
        y = _norm_act_tile(x_ptr, res_ptr, offs, real, mean_ptr, var_ptr, w_ptr, b_ptr, b * C + cols, cols, eps,
                           negative_slope, HAS_AFFINE, HAS_RESIDUAL, ACT)  # fmt: skip
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=valid if WRITE_PADDING else real)


_BLOCK_C = 64  # channels per program; every channel count the kernels take is a multiple of it
_STATS_ROWS = 4096  # the most rows a statistics program reduces before it writes a partial result
# below this many programs the statistics of the low-resolution levels left most SMs idle: at one window a 16^3
# level took 6 programs of 4096 rows each, ~40 us per pass (H200)
_STATS_PROGRAMS = 512


def _rows_per_part(n_rows: int, columns: int, block_s: int) -> int:
    """Rows per statistics program for ``n_rows`` rows in ``columns`` (channel blocks x samples) independent
    columns: ``_STATS_ROWS``, halved (down to ``block_s``) while the grid would have fewer than ``_STATS_PROGRAMS``
    programs."""
    rows = _STATS_ROWS
    while rows > block_s and -(-n_rows // rows) * columns < _STATS_PROGRAMS:
        rows //= 2
    return rows


def _check_rows(x: torch.Tensor) -> torch.Tensor:
    rows = as_rows(x)
    if rows.shape[2] % _BLOCK_C:
        raise ValueError(
            f"the fused norm kernels need a multiple of {_BLOCK_C} channels, got {rows.shape[2]}: pad the channels."
        )
    check_kernel_input(rows, "the fused norm kernels")
    return rows


def instance_stats(
    x: torch.Tensor, add: torch.Tensor | None = None, block_s: int = 64, num_warps: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(sample, channel) mean and (biased) variance of a channels-last tensor, both ``[B, C]`` float32.

    Args:
        x: ``[B, C, *spatial]`` channels-last, ``C`` a multiple of 64.
        add: optional tensor of ``x``'s shape and layout added into ``x`` in place first (``x += add``); the
            statistics are those of the sum, as stored.
        block_s: rows per tile (a power of two dividing 4096); ``num_warps``: warps per program.
    """
    rows = _check_rows(x)
    n_batch, n_rows, n_chan = rows.shape
    if add is not None and add.shape != x.shape:
        raise ValueError(f"the addend's shape {tuple(add.shape)} differs from the input's {tuple(x.shape)}.")
    rows_per_part = _rows_per_part(n_rows, n_chan // _BLOCK_C * n_batch, block_s)
    n_parts = triton.cdiv(n_rows, rows_per_part)
    part_mean = torch.empty(n_batch, n_parts, n_chan, device=x.device, dtype=torch.float32)
    part_m2 = torch.empty_like(part_mean)
    part_count = torch.empty(n_batch, n_parts, device=x.device, dtype=torch.float32)
    grid = (n_parts, n_chan // _BLOCK_C, n_batch)
    _stats_kernel[grid](
        rows,
        as_rows(add) if add is not None else rows,
        part_count,
        part_mean,
        part_m2,
        n_rows,
        n_chan,
        n_parts,
        HAS_ADDEND=add is not None,
        ROWS_PER_PART=rows_per_part,
        BLOCK_S=block_s,
        BLOCK_C=_BLOCK_C,
        num_warps=num_warps,
    )
    return merge_parts_triton(part_count, part_mean, part_m2)


def merge_parts(mean: torch.Tensor, m2: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (biased) variance per (sample, channel) from the statistics of parts of each sample.

    Args:
        mean, m2: ``[B, P, C]``: each part's mean and sum of squared deviations from it.
        counts: ``[P]`` values per part (the same for every sample and channel).
    """
    counts = counts.to(mean).view(1, -1, 1)
    total = counts.sum()
    # Chan et al.'s pairwise update, all parts at once: no sum of squares of large values cancels
    merged_mean = (mean * counts).sum(1) / total
    merged_m2 = m2.sum(1) + (counts * (mean - merged_mean[:, None]) ** 2).sum(1)
    return merged_mean, merged_m2 / total


_MERGE_CHUNK = 128  # parts one merge program folds into one: a sample's 16384 patches take two launches


def merge_parts_triton(
    count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:py:func:`merge_parts` as Triton launches (one per 128-fold reduction, no host synchronisation), for the
    partial statistics the kernels write.

    Args:
        count: ``[B, P]`` float32 values in each part (zero for a part outside the volume).
        mean, m2: ``[B, P, C]`` float32, contiguous, ``C`` a multiple of 16: each part's mean and sum of squared
            deviations from it.

    Returns:
        ``(mean, var)``, each ``[B, C]`` float32 (the biased variance).
    """
    n_batch, n_parts, n_chan = mean.shape
    if count.shape != (n_batch, n_parts) or m2.shape != mean.shape or n_chan % 16:
        raise ValueError(
            "merge_parts_triton takes counts [B, P] and statistics [B, P, C] with C a multiple of 16, "
            f"got {tuple(count.shape)}, {tuple(mean.shape)} and {tuple(m2.shape)}."
        )
    block_c = math.gcd(n_chan, _BLOCK_C)
    while True:
        final = n_parts <= _MERGE_CHUNK
        n_out = 1 if final else triton.cdiv(n_parts, _MERGE_CHUNK)
        out_mean = torch.empty(n_batch, n_out, n_chan, device=mean.device, dtype=torch.float32)
        out_m2 = torch.empty_like(out_mean)
        out_count = torch.empty(n_batch, n_out, device=mean.device, dtype=torch.float32) if not final else count
        _merge_kernel[(n_out, n_chan // block_c, n_batch)](
            count,
            mean,
            m2,
            out_count,
            out_mean,
            out_m2,
            n_parts,
            n_chan,
            CHUNK=_MERGE_CHUNK,
            FINAL=final,
            BLOCK_C=block_c,
            num_warps=8,
        )
        if final:
            return out_mean.view(n_batch, n_chan), out_m2.view(n_batch, n_chan)
        count, mean, m2, n_parts = out_count, out_mean, out_m2, n_out


@dataclass(frozen=True)
class StatsParts:
    """The partial statistics a convolution kernel writes in its epilogue: per part (a tile's voxels of one sample;
    a sample's parts consecutive) the count, and per channel the mean and centred sum of squares.

    :py:meth:`allocate` gives the three buffers, or where no statistics are wanted a stand-in tensor three times
    (the kernel, compiled without statistics, never reads it); :py:meth:`merged` reduces them to ``(mean, var)``.
    """

    count: torch.Tensor
    mean: torch.Tensor
    m2: torch.Tensor
    wanted: bool

    @classmethod
    def allocate(cls, n_parts: int, channels: int, stand_in: torch.Tensor, wanted: bool) -> StatsParts:
        """Buffers for ``n_parts`` parts (all samples') of ``channels`` channels on ``stand_in``'s device."""
        if not wanted:
            return cls(stand_in, stand_in, stand_in, False)
        mean = torch.empty((n_parts, channels), device=stand_in.device, dtype=torch.float32)
        count = torch.empty(n_parts, device=stand_in.device, dtype=torch.float32)
        return cls(count, mean, torch.empty_like(mean), True)

    def merged(self, n_batch: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each sample's ``(mean, var)``, ``[B, C]`` float32, or ``None`` where no statistics were wanted."""
        if not self.wanted:
            return None
        channels = self.mean.shape[1]
        return merge_parts_triton(
            self.count.view(n_batch, -1), self.mean.view(n_batch, -1, channels), self.m2.view(n_batch, -1, channels)
        )


def _norm_operands(
    x: torch.Tensor,
    rows: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    stats: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a kernel applying the norm to ``x`` (``rows``: its ``[B, S, C]`` view) reads besides it: ``(residual
    rows, mean, var, weight, bias)``. Without a residual ``rows`` stands in, without affine parameters the mean (the
    kernels, compiled without them, never read the stand-ins); the statistics are computed where not given."""
    res_rows = rows
    if residual is not None:
        res_rows = as_rows(residual)
        if res_rows.shape != rows.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} differs from the input's {tuple(x.shape)}.")
    if (weight is None) != (bias is None):
        raise ValueError("give both the norm's weight and bias, or neither.")
    mean, var = instance_stats(x) if stats is None else stats
    w = weight.float().contiguous() if weight is not None else mean
    b = bias.float().contiguous() if bias is not None else mean
    return res_rows, mean, var, w, b


def norm_act(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    spec: NormAct,
    residual: torch.Tensor | None = None,
    real_channels: int | None = None,
    out: torch.Tensor | None = None,
    stats: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_s: int = 128,
    num_warps: int = 4,
) -> torch.Tensor:
    """The Triton version of :py:func:`norm_act_reference` for channels-last CUDA tensors.

    Args:
        x: ``[B, C, *spatial]`` channels-last, ``C`` a multiple of 64.
        weight, bias: ``[C]`` affine parameters (zero on padding channels), or ``None`` for none.
        spec: eps and activation.
        residual: optional channels-last tensor of ``x``'s shape added before the activation.
        real_channels: channels from this index on are written as zeros; ``None``: all are real.
        out: where to write the result (may be ``x`` itself or ``residual``); a new tensor when ``None``. Its
            padding channels are written as zeros only when it is a new tensor: ``x`` and ``residual`` must hold
            zeros there already (the padded layout's invariant).
        stats: ``x``'s ``(mean, var)`` from :py:func:`instance_stats` when already known; computed when ``None``.
        block_s: rows per program (a power of two); ``num_warps``: warps per program.
    """
    rows = _check_rows(x)
    n_batch, n_rows, n_chan = rows.shape
    res_rows, mean, var, w, b = _norm_operands(x, rows, weight, bias, residual, stats)
    write_padding = out is None or (out is not x and out is not residual)
    if out is None:
        out = torch.empty_like(x)
    grid = (triton.cdiv(n_rows, block_s), n_chan // _BLOCK_C, n_batch)
    _apply_kernel[grid](
        rows,
        res_rows,
        as_rows(out),
        mean,
        var,
        w,
        b,
        n_rows,
        n_chan,
        n_chan if real_channels is None else real_channels,
        spec.eps,
        spec.negative_slope,
        HAS_AFFINE=weight is not None,
        HAS_RESIDUAL=residual is not None,
        ACT=_ACTS[spec.act],
        WRITE_PADDING=write_padding,
        BLOCK_S=block_s,
        BLOCK_C=_BLOCK_C,
        num_warps=num_warps,
    )
    return out
