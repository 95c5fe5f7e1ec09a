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
"""Sliding-window inference and the window / weight-map helpers it is built from.

The window loop is split into four stages so that each can be timed, tuned or reused on its own:

1. *prepare*: check the arguments, pad the input, enumerate the windows (:func:`plan_sliding_windows`) and
   group them into forward batches; per batch, slice the windows out and copy them to ``sw_device``;
2. *forward*: call the predictor on one batch of windows;
3. *stitch*: weight each window output by the importance map and add it into the result (:class:`WindowStitcher`);
4. *finalize*: divide by the summed weights and crop the padding away.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from monai.utils import BlendMode, PytorchPadMode, ensure_tuple, ensure_tuple_rep, look_up_option, optional_import
from monai.inferers.batch_size import AutoBatchSize, check_sw_batch_size
from monai.utils.profiling import StageTimer, cuda_active

tqdm, has_tqdm = optional_import("tqdm", name="tqdm")

__all__ = [
    "sliding_window_inference",
    "compute_importance_map",
    "dense_patch_slices",
    "get_valid_patch_size",
    "get_scan_interval",
    "SlidingWindowPlan",
    "plan_sliding_windows",
    "WindowStitcher",
]

# Nearest-neighbour mode used to resize the importance map to outputs at another scale than the input.
_NEAREST_MODE = "nearest-exact"


# --------------------------------------------------------------------------------------------------------------------
# Window and weight-map helpers (upstream keeps these in monai.data.utils)
# --------------------------------------------------------------------------------------------------------------------


def get_valid_patch_size(image_size: Sequence[int], patch_size: Sequence[int] | int) -> tuple[int, ...]:
    """Clip ``patch_size`` to ``image_size``; ``None`` or 0 entries (or missing trailing ones) take the image size.

    Args:
        image_size: spatial size of the image, e.g. ``(H, W, D)``.
        patch_size: one size for every dimension or one per dimension.

    Returns:
        a tuple of ``len(image_size)`` patch sizes, each at most the image size.
    """
    ndim = len(image_size)
    if isinstance(patch_size, int) or not isinstance(patch_size, Sequence) and not hasattr(patch_size, "__len__"):
        sizes: list = [patch_size] * ndim
    else:
        sizes = list(patch_size)[:ndim]
        sizes += [None] * (ndim - len(sizes))
    return tuple(min(int(img), int(p) if p else int(img)) for img, p in zip(image_size, sizes))


def get_scan_interval(
    image_size: Sequence[int], roi_size: Sequence[int], num_spatial_dims: int, overlap: Sequence[float]
) -> tuple[int, ...]:
    """Step between window starts, per spatial dimension.

    The step is ``int(roi_size * (1 - overlap))`` (at least 1); a window as large as the image has a step equal to
    its size (a single window along that dimension).

    Args:
        image_size: spatial size of the (padded) image.
        roi_size: window size, at most ``image_size``.
        num_spatial_dims: number of spatial dimensions.
        overlap: fraction of overlap per dimension, each in ``[0, 1)``.

    Raises:
        ValueError: when the sizes do not have ``num_spatial_dims`` entries.
    """
    if len(image_size) != num_spatial_dims or len(roi_size) != num_spatial_dims or len(overlap) != num_spatial_dims:
        raise ValueError(
            f"image_size {tuple(image_size)}, roi_size {tuple(roi_size)} and overlap {tuple(overlap)} must each have "
            f"{num_spatial_dims} entries (one per spatial dimension)."
        )
    steps = []
    for img, roi, ovl in zip(image_size, roi_size, overlap):
        if roi == img:
            steps.append(int(roi))
        else:
            steps.append(max(int(roi * (1 - ovl)), 1))
    return tuple(steps)


# Upstream's (private) name of the same helper.
_get_scan_interval = get_scan_interval


def _window_starts(image: int, patch: int, step: int) -> list[int]:
    """Starts of the windows along one dimension: every ``step``, the last one shifted back to end at the border."""
    if step <= 0:
        return [0]
    starts = []
    for i in range(max(int(math.ceil(image / step)), 1)):
        start = i * step
        last = start + patch >= image
        starts.append(min(start, image - patch) if last else start)
        if last:
            break
    return starts


def dense_patch_slices(
    image_size: Sequence[int], patch_size: Sequence[int], scan_interval: Sequence[int], return_slice: bool = True
) -> list[tuple]:
    """Enumerate the windows of ``patch_size`` that cover an image of ``image_size``.

    Windows start every ``scan_interval`` along each dimension; the last window of a dimension is moved back so
    that it ends at the border. The order is row-major (the last dimension varies fastest).

    Args:
        image_size: spatial size of the image.
        patch_size: window size (clipped to the image size).
        scan_interval: step between window starts per dimension (0: one window).
        return_slice: return ``slice`` objects (default), otherwise ``(start, stop)`` pairs.

    Returns:
        one tuple per window with one ``slice`` (or ``(start, stop)``) per spatial dimension.
    """
    ndim = len(image_size)
    patch = get_valid_patch_size(image_size, patch_size)
    steps = ensure_tuple(scan_interval)
    steps = tuple(steps[:ndim]) + (0,) * (ndim - len(steps))
    per_dim = [_window_starts(int(image_size[d]), patch[d], int(steps[d])) for d in range(ndim)]
    out: list[tuple] = []
    for starts in _product(per_dim):
        if return_slice:
            out.append(tuple(slice(s, s + patch[d]) for d, s in enumerate(starts)))
        else:
            out.append(tuple((s, s + patch[d]) for d, s in enumerate(starts)))
    return out


def _product(lists: list[list[int]]) -> list[tuple[int, ...]]:
    """Cartesian product, last list varying fastest."""
    combos: list[tuple[int, ...]] = [()]
    for values in lists:
        combos = [c + (v,) for c in combos for v in values]
    return combos


def compute_importance_map(
    patch_size: tuple[int, ...],
    mode: BlendMode | str = BlendMode.CONSTANT,
    sigma_scale: Sequence[float] | float = 0.125,
    device: torch.device | int | str = "cpu",
    dtype: torch.dtype | str | None = torch.float32,
) -> torch.Tensor:
    """Weight of each voxel of a window when overlapping windows are blended.

    Args:
        patch_size: window size ``(H, W[, D])``.
        mode: ``"constant"`` (all ones) or ``"gaussian"`` (a separable Gaussian centred on the window, so that
            window borders count less).
        sigma_scale: Gaussian sigma as a fraction of the window size, one value or one per dimension.
        device: device of the map.
        dtype: dtype of the map.

    Returns:
        a ``patch_size`` tensor of positive weights (at least ``1e-3``).

    Raises:
        ValueError: for an unknown ``mode``.
    """
    mode = look_up_option(mode, BlendMode)
    device = torch.device(device)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if mode == BlendMode.CONSTANT:
        weights = torch.ones(tuple(patch_size), dtype=torch.float32, device=device)
    else:
        sigmas = [s * scale for s, scale in zip(patch_size, ensure_tuple_rep(sigma_scale, len(patch_size)))]
        weights = torch.ones((), dtype=torch.float32, device=device)
        for d, (size, sigma) in enumerate(zip(patch_size, sigmas)):
            x = torch.arange(size, dtype=torch.float32, device=device) - (size - 1) / 2.0
            g = torch.exp(-(x**2) / (2 * sigma**2))
            weights = weights.unsqueeze(-1) * g if d > 0 else g
    # Far window corners of a narrow Gaussian underflow; a floor keeps the weighted average defined everywhere.
    floor = max(weights.min().item(), 1e-3)
    return weights.clamp_(min=floor).to(dtype)


# --------------------------------------------------------------------------------------------------------------------
# Window plan: padding and window enumeration
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class SlidingWindowPlan:
    """Where the windows of one sliding-window pass lie.

    Attributes:
        image_size: spatial size of the input before padding.
        padded_size: spatial size after padding (at least ``roi_size`` everywhere).
        roi_size: the window size, with ``None`` / non-positive entries resolved.
        scan_interval: step between window starts per dimension.
        pad_size: padding in ``torch.nn.functional.pad`` order (last dimension first, low then high side).
        slices: spatial slices of each window of one image, in the padded image.
        batch_size: number of images in the input batch.
    """

    image_size: tuple[int, ...]
    padded_size: tuple[int, ...]
    roi_size: tuple[int, ...]
    scan_interval: tuple[int, ...]
    pad_size: list[int]
    slices: list[tuple[slice, ...]]
    batch_size: int = 1

    @property
    def num_windows(self) -> int:
        """Windows per image."""
        return len(self.slices)

    @property
    def total_windows(self) -> int:
        """Windows over the whole batch."""
        return len(self.slices) * self.batch_size

    @property
    def padded(self) -> bool:
        """Whether the input needs padding."""
        return any(self.pad_size)

    def pad_before(self, dim: int) -> int:
        """Padding on the low side of spatial dimension ``dim``."""
        return self.pad_size[2 * (len(self.image_size) - 1 - dim)]

    def coords(self, index: int) -> list[slice]:
        """Index of window ``index`` (over the batch) into an ``[N, C, *spatial]`` tensor: ``[b, :, *spatial]``."""
        b, w = divmod(index, len(self.slices))
        return [slice(b, b + 1), slice(None), *self.slices[w]]


def _resolve_roi(roi_size: Sequence[int | None] | int | None, image_size: Sequence[int]) -> tuple[int, ...]:
    ndim = len(image_size)
    if roi_size is None:
        return tuple(int(s) for s in image_size)
    if isinstance(roi_size, torch.Tensor):
        roi_size = roi_size.tolist()
    if isinstance(roi_size, (int, float)):
        roi = [roi_size] * ndim
    else:
        roi = list(roi_size)
        if len(roi) != ndim:
            raise ValueError(
                f"roi_size {tuple(roi)} has {len(roi)} entries but the input has {ndim} spatial dimensions "
                f"(inputs must be [N, C, *spatial], got spatial size {tuple(image_size)}); give one size per spatial "
                "dimension or a single int. If the data is channel-last, move the channels to dimension 1 first."
            )
    return tuple(int(s) if s is not None and s > 0 else int(i) for s, i in zip(roi, image_size))


def plan_sliding_windows(
    image_size: Sequence[int],
    roi_size: Sequence[int | None] | int | None,
    overlap: Sequence[float] | float = 0.25,
    batch_size: int = 1,
    padding_mode: PytorchPadMode | str = PytorchPadMode.CONSTANT,
) -> SlidingWindowPlan:
    """Resolve the window size, the padding and the windows of a sliding-window pass.

    Args:
        image_size: spatial size of the input ``(H, W[, D])``.
        roi_size: window size; one int, one entry per dimension, and ``None`` / non-positive entries for the
            whole extent of that dimension.
        overlap: fraction of overlap between neighbouring windows, one value or one per dimension, in ``[0, 1)``.
        batch_size: number of images in the input.
        padding_mode: padding used where the window is larger than the image (checked for feasibility).

    Raises:
        ValueError: for a wrong number of entries, an overlap outside ``[0, 1)``, or a window that the chosen
            padding mode cannot reach (reflect / circular padding larger than the image).
    """
    image_size = tuple(int(s) for s in image_size)
    ndim = len(image_size)
    roi = _resolve_roi(roi_size, image_size)
    if isinstance(overlap, torch.Tensor):
        overlap = overlap.tolist()
    if isinstance(overlap, Sequence) and len(overlap) != ndim:
        raise ValueError(f"overlap {tuple(overlap)} must be one float or {ndim} floats (one per spatial dimension).")
    overlaps = tuple(float(o) for o in ensure_tuple_rep(overlap, ndim))
    if any(not 0 <= o < 1 for o in overlaps):
        raise ValueError(f"overlap must be >= 0 and < 1 in every dimension, got {overlaps}.")
    mode = look_up_option(padding_mode, PytorchPadMode)
    pad_size: list[int] = []
    for d in reversed(range(ndim)):  # F.pad order: last dimension first
        diff = max(roi[d] - image_size[d], 0)
        lo, hi = diff // 2, diff - diff // 2
        if mode == PytorchPadMode.REFLECT and max(lo, hi) >= image_size[d]:
            raise ValueError(
                f"roi_size {roi} needs padding {max(lo, hi)} on spatial dimension {d} of size {image_size[d]}, but "
                "reflect padding must be smaller than the dimension; use padding_mode='constant' or 'replicate', "
                "or a smaller roi_size."
            )
        if mode == PytorchPadMode.CIRCULAR and max(lo, hi) > image_size[d]:
            raise ValueError(
                f"roi_size {roi} needs padding {max(lo, hi)} on spatial dimension {d} of size {image_size[d]}, but "
                "circular padding cannot exceed the dimension; use padding_mode='constant' or 'replicate', "
                "or a smaller roi_size."
            )
        pad_size += [lo, hi]
    padded = tuple(max(i, r) for i, r in zip(image_size, roi))
    steps = get_scan_interval(padded, roi, ndim, overlaps)
    slices = dense_patch_slices(padded, roi, steps)
    return SlidingWindowPlan(image_size, padded, roi, steps, pad_size, slices, int(batch_size))


def pad_and_weight(
    inputs: torch.Tensor,
    condition: torch.Tensor | None,
    plan: SlidingWindowPlan,
    padding_mode: PytorchPadMode,
    cval: float,
    roi_weight_map: torch.Tensor | None,
    mode: BlendMode | str,
    sigma_scale: Sequence[float] | float,
    sw_device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Pad ``inputs`` (and a ``condition`` tensor shaped like it) to ``plan``'s padded size; build the window weight.

    Returns:
        ``(padded inputs, padded condition or None, weight of one window as [*roi_size] or the given map)``.
    """
    if plan.padded:
        pad_kw = {"value": cval} if padding_mode == PytorchPadMode.CONSTANT else {}  # cval only for constant
        inputs = F.pad(inputs, plan.pad_size, mode=padding_mode.value, **pad_kw)
        if condition is not None:
            condition = F.pad(condition, plan.pad_size, mode=padding_mode.value, **pad_kw)
    if roi_weight_map is not None:
        weight = torch.as_tensor(roi_weight_map).to(device=sw_device, dtype=dtype)
    else:
        weight = compute_importance_map(plan.roi_size, mode, sigma_scale, device=sw_device, dtype=dtype)
    return inputs, condition, weight


@dataclass
class _Buffer:
    """A band of buffered stitching: windows ``[first, stop)`` (over the batch) covering ``[start, end)`` along
    the buffer dim of image ``image``."""

    image: int
    start: int
    end: int
    first: int
    stop: int


def _buffered_bands(plan: SlidingWindowPlan, buffer_steps: int, buffer_dim: int) -> list[_Buffer]:
    """Order the windows along ``buffer_dim`` and cut them into bands of ``buffer_steps`` window positions.

    ``plan.slices`` is reordered in place (stable sort by start along ``buffer_dim``) so that window indices
    refer to the sorted windows.
    """
    order = sorted(range(plan.num_windows), key=lambda i: plan.slices[i][buffer_dim].start)
    plan.slices = [plan.slices[i] for i in order]
    starts = [s[buffer_dim].start for s in plan.slices]
    # index where each distinct start along buffer_dim begins, then every buffer_steps-th of them
    firsts = [i for i in range(len(starts)) if i == 0 or starts[i] != starts[i - 1]]
    bounds = firsts[:: max(1, int(buffer_steps))] + [len(starts)]
    bands = []
    for b in range(plan.batch_size):
        offset = b * plan.num_windows
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            start, end = plan.slices[lo][buffer_dim].start, plan.slices[hi - 1][buffer_dim].stop
            bands.append(_Buffer(b, start, end, offset + lo, offset + hi))
    return bands


def _schedule(segments: Sequence[tuple[_Buffer | None, int, int]], next_size: Callable[[int], int]):
    """Yield ``(band, window indices, last of band)`` per forward batch; batches never cross a segment.

    Args:
        segments: ``(band or None, first, stop)`` window index ranges (one unbuffered segment spans every image).
        next_size: windows of the next batch given the windows left in the segment.
    """
    for band, lo, hi in segments:
        i = lo
        while i < hi:
            n = max(1, min(int(next_size(hi - i)), hi - i))
            yield band, range(i, i + n), band is not None and i + n >= hi
            i += n


# --------------------------------------------------------------------------------------------------------------------
# Stitching
# --------------------------------------------------------------------------------------------------------------------


def _flatten_outputs(out: Any) -> tuple[list | None, tuple[torch.Tensor, ...]]:
    """Predictor output as a tuple of tensors, plus the sorted dict keys when it was a mapping."""
    if isinstance(out, torch.Tensor):
        return None, (out,)
    if isinstance(out, Mapping):
        keys = sorted(out.keys())
        return keys, tuple(out[k] for k in keys)
    if isinstance(out, (list, tuple)):
        return None, tuple(out)
    raise TypeError(f"the predictor must return a tensor, a tuple/list or a dict of tensors, got {type(out).__name__}.")


def _pack_outputs(outs: list[torch.Tensor], keys: list | None) -> Any:
    if keys is not None:
        return dict(zip(keys, outs))
    return outs[0] if len(outs) == 1 else tuple(outs)


class WindowStitcher:
    """Accumulates weighted window outputs into full-size results, one per predictor output.

    Outputs may be at another scale than the input (``zoom = output window size / roi_size`` per dimension). With a
    fixed weight map the normalising weight sum is built once per call; with a ``process_fn`` (whose weights may
    change per window) it is accumulated window by window.

    Args:
        plan: the window plan.
        weight: importance map ``[1, 1, *roi_size]`` (or ``[*roi_size]``).
        device: device of the stitched results.
        dtype: dtype of the results.
        buffer_dim: spatial dimension of the bands when stitching is buffered, else ``None``.
        per_window_weights: accumulate the weight sum per window (needed with a ``process_fn``).
    """

    def __init__(
        self,
        plan: SlidingWindowPlan,
        weight: torch.Tensor,
        device: torch.device,
        dtype: torch.dtype,
        buffer_dim: int | None = None,
        per_window_weights: bool = False,
    ):
        self.plan = plan
        self.ndim = len(plan.roi_size)
        self.weight = _as_5d_weight(weight, self.ndim)
        self.device = torch.device(device)
        self.dtype = dtype
        self.buffer_dim = buffer_dim
        self.per_window_weights = per_window_weights
        self.outputs: list[torch.Tensor] = []
        self.counts: list[torch.Tensor] = []
        self.zooms: list[tuple[float, ...]] = []
        self._weights: dict = {}  # (output index, device) -> resized weight map
        self._buffers: list[torch.Tensor] | None = None
        self._band: _Buffer | None = None

    # -- geometry -----------------------------------------------------------------------------------------------------
    def _out_slice(self, k: int, sl: slice, d: int) -> slice:
        z = self.zooms[k][d]
        return slice(int(sl.start * z), int(sl.stop * z)) if z != 1 else sl

    def _resized_weight(self, k: int, device: torch.device, w: torch.Tensor | None = None) -> torch.Tensor:
        if w is None:
            key = (k, device)
            if key not in self._weights:
                self._weights[key] = self._resize(self.weight, k).to(device=device, dtype=self.dtype)
            return self._weights[key]
        return self._resize(_as_5d_weight(w, self.ndim), k).to(device=device)

    def _resize(self, w: torch.Tensor, k: int) -> torch.Tensor:
        size = tuple(int(r * z) for r, z in zip(self.plan.roi_size, self.zooms[k]))
        if tuple(w.shape[2:]) == size:
            return w
        return F.interpolate(w.to(torch.float32), size, mode=_NEAREST_MODE).to(w.dtype)

    def _allocate(self, outs: Sequence[torch.Tensor]) -> None:
        """First batch: learn the channels and scale of each output and allocate results and weight sums."""
        for k, p in enumerate(outs):
            if p.ndim != self.ndim + 2:
                raise ValueError(
                    f"predictor output {k} has shape {tuple(p.shape)}; expected [windows, channels, *spatial] with "
                    f"{self.ndim} spatial dimensions."
                )
            zoom = tuple(float(o) / r for o, r in zip(p.shape[2:], self.plan.roi_size))
            self.zooms.append(zoom)
            for d, z in enumerate(zoom):
                if z == 1:
                    continue
                lengths = {(lambda o: o.stop - o.start)(self._out_slice(k, w[d], d)) for w in self.plan.slices}
                if lengths != {p.shape[2 + d]}:
                    raise ValueError(
                        f"predictor output {k} is at scale {zoom} of the input window, but the scaled windows along "
                        f"spatial dimension {d} do not all have size {p.shape[2 + d]}. Choose roi_size and overlap "
                        "so that roi_size * (1 - overlap) * scale is an integer."
                    )
            size = [int(s * z) for s, z in zip(self.plan.padded_size, zoom)]
            shape = [self.plan.batch_size, p.shape[1], *size]
            self.outputs.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
            if self.per_window_weights:
                self.counts.append(torch.zeros([self.plan.batch_size, 1, *size], dtype=self.dtype, device=self.device))
            else:
                count = torch.zeros([1, 1, *size], dtype=self.dtype, device=self.device)
                w = self._resized_weight(k, self.device)
                for sl in self.plan.slices:
                    count[(slice(None), slice(None), *(self._out_slice(k, s, d) for d, s in enumerate(sl)))].add_(w)
                self.counts.append(count)

    # -- accumulation --------------------------------------------------------------------------------------------------
    def begin_band(self, band: _Buffer) -> None:
        """Start a buffered band (buffered stitching only)."""
        self._band = band
        self._buffers = None

    def add(self, outs: Sequence[torch.Tensor], coords: Sequence[Sequence[slice]], weight: torch.Tensor | None = None):
        """Add the outputs of one batch of windows.

        Args:
            outs: one ``[n, C_k, *spatial_k]`` tensor per predictor output, ``n == len(coords)``.
            coords: ``plan.coords(i)`` of each window of the batch.
            weight: per-batch weight from a ``process_fn`` (``[*roi]``, ``[1|n, 1|C, *roi]``), else ``None``.
        """
        if not self.outputs:
            self._allocate(outs)
        for k, p in enumerate(outs):
            if p.shape[0] != len(coords):
                raise ValueError(
                    f"predictor output {k} has {p.shape[0]} windows for a batch of {len(coords)}; the predictor must "
                    "return one output per input window along dimension 0."
                )
            target, dst = self._target(k, p)
            w = self._resized_weight(k, p.device, weight)
            if dst != p.device:
                p = (p * w).to(dst)  # weight on the predictor's device, then one copy per batch
                wsrc = None
            else:
                wsrc = w
            for j, c in enumerate(coords):
                idx = self._target_index(k, c)
                pj = p[j : j + 1]
                if wsrc is None:
                    target[idx].add_(pj)
                else:
                    wj = wsrc[j : j + 1] if wsrc.shape[0] > 1 else wsrc
                    target[idx].addcmul_(pj, wj)
                if self.per_window_weights:
                    wc = (w[j : j + 1] if w.shape[0] > 1 else w).to(self.device)
                    if wc.shape[1] > 1:
                        wc = wc[:, :1]
                    self.counts[k][self._output_index(k, c)].add_(wc)

    def _target(self, k: int, p: torch.Tensor) -> tuple[torch.Tensor, torch.device]:
        if self._band is None:
            return self.outputs[k], self.device
        if self._buffers is None:
            self._buffers = []
        while len(self._buffers) <= k:
            kk = len(self._buffers)
            shape = list(self.outputs[kk].shape)
            shape[0] = 1
            d = self.buffer_dim
            band = self._out_slice(kk, slice(self._band.start, self._band.end), d)
            shape[2 + d] = band.stop - band.start
            self._buffers.append(torch.zeros(shape, dtype=self.dtype, device=p.device))
        return self._buffers[k], self._buffers[k].device

    def _output_index(self, k: int, c: Sequence[slice]) -> tuple:
        return (c[0], slice(None), *(self._out_slice(k, s, d) for d, s in enumerate(c[2:])))

    def _target_index(self, k: int, c: Sequence[slice]) -> tuple:
        idx = list(self._output_index(k, c))
        if self._band is not None:
            d = self.buffer_dim
            band = self._out_slice(k, slice(self._band.start, self._band.end), d)
            s = idx[2 + d]
            idx[0] = slice(0, 1)
            idx[2 + d] = slice(s.start - band.start, s.stop - band.start)
        return tuple(idx)

    def end_band(self) -> None:
        """Write the finished band into the results on ``device``."""
        if self._band is None or self._buffers is None:
            self._band = None
            return
        d = self.buffer_dim
        for k, buf in enumerate(self._buffers):
            band = self._out_slice(k, slice(self._band.start, self._band.end), d)
            idx = [slice(self._band.image, self._band.image + 1), slice(None)] + [slice(None)] * self.ndim
            idx[2 + d] = band
            self.outputs[k][tuple(idx)] += buf.to(self.device)
        self._band, self._buffers = None, None

    def result_bytes(self, device: torch.device) -> int:
        """Bytes of the results and weight sums allocated so far on ``device``."""
        device = torch.device(device)
        total = 0
        for t in (*self.outputs, *self.counts):
            if t.device.type == device.type and (device.index is None or t.device.index == device.index):
                total += t.numel() * t.element_size()
        return total

    # -- finalize -----------------------------------------------------------------------------------------------------
    def finalize(self) -> list[torch.Tensor]:
        """Normalise by the weight sums and crop the padding; returns one tensor per predictor output."""
        results = []
        for k, (out, count) in enumerate(zip(self.outputs, self.counts)):
            out /= count
            if self.plan.padded:
                crop = [slice(None), slice(None)]
                for d in range(self.ndim):
                    lo = self.plan.pad_before(d)
                    if self.plan.padded_size[d] == self.plan.image_size[d]:
                        crop.append(slice(None))
                    else:
                        z = self.zooms[k][d]
                        crop.append(slice(int(round(lo * z)), int(round((lo + self.plan.image_size[d]) * z))))
                out = out[tuple(crop)]
            results.append(out)
        self.counts = []
        return results


def _as_5d_weight(w: torch.Tensor, ndim: int) -> torch.Tensor:
    """A weight map as ``[n, c, *spatial]``."""
    w = torch.as_tensor(w)
    while w.ndim < ndim + 2:
        w = w[None]
    return w


# --------------------------------------------------------------------------------------------------------------------
# The window loop
# --------------------------------------------------------------------------------------------------------------------


class _NoTimer:
    """Stands in for a :class:`~monai.utils.profiling.StageTimer` when nothing is measured nor marked."""

    enabled = False
    _ctx = nullcontext()

    def stage(self, name: str):  # noqa: D102
        return self._ctx

    range = stage

    def count(self, name: str, n: int = 1) -> None:  # noqa: D102
        pass

    def set(self, name: str, value: Any) -> None:  # noqa: D102
        pass


_NO_TIMER = _NoTimer()


def _default_timer():
    """No timing; NVTX ranges only where CUDA is usable (so that a profiler sees the stages)."""
    return StageTimer(enabled=False) if cuda_active() else _NO_TIMER


class _TextProgress:
    """Minimal progress bar on stderr, used when ``tqdm`` is not installed."""

    def __init__(self, items: Iterable, desc: str = "sliding window"):
        self.items, self.desc = items, desc

    def __iter__(self):
        n = f"/{len(self.items)}" if hasattr(self.items, "__len__") else ""  # "auto" batches are not known ahead
        for i, item in enumerate(self.items):
            yield item
            sys.stderr.write(f"\r{self.desc}: {i + 1}{n} batches")
        sys.stderr.write("\n")
        sys.stderr.flush()


def _progress(items: Iterable, enabled: bool):
    if not enabled:
        return items
    if has_tqdm:
        return tqdm(items)
    return _TextProgress(items)


def _identity(predictor: Any) -> tuple:
    """Same for every access to one bound method (``obj.method`` builds a new object each time)."""
    owner, func = getattr(predictor, "__self__", None), getattr(predictor, "__func__", None)
    return (id(owner), id(func)) if owner is not None and func is not None else (id(predictor),)


def _signature(args: tuple, kwargs: dict) -> tuple:
    """What of the predictor's extra arguments can change its memory use: tensor shapes, sequence lengths."""

    def sig(v):
        if isinstance(v, torch.Tensor):
            return ("tensor", tuple(v.shape), str(v.dtype))
        if isinstance(v, (list, tuple)):
            return ("seq", len(v))
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return type(v).__name__

    return tuple(sig(a) for a in args) + tuple((k, sig(v)) for k, v in sorted(kwargs.items()))


def sliding_window_inference(
    inputs: torch.Tensor,
    roi_size: Sequence[int] | int,
    sw_batch_size: int | str,
    predictor: Callable[..., torch.Tensor | Sequence[torch.Tensor] | dict[Any, torch.Tensor]],
    overlap: Sequence[float] | float = 0.25,
    mode: BlendMode | str = BlendMode.CONSTANT,
    sigma_scale: Sequence[float] | float = 0.125,
    padding_mode: PytorchPadMode | str = PytorchPadMode.CONSTANT,
    cval: float = 0.0,
    sw_device: torch.device | str | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
    roi_weight_map: torch.Tensor | None = None,
    process_fn: Callable | None = None,
    buffer_steps: int | None = None,
    buffer_dim: int = -1,
    with_coord: bool = False,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor | tuple[torch.Tensor, ...] | dict[Any, torch.Tensor]:
    """Run ``predictor`` on overlapping windows of ``inputs`` and blend the window outputs.

    The predictor may return a tensor, a tuple or a dict of tensors, each ``[n, C_k, *spatial_k]`` for ``n``
    windows; outputs may be at another scale than the input (e.g. half resolution), in which case
    ``roi_size * (1 - overlap) * scale`` should be an integer. Where the window is larger than the image, the
    input is padded and the result cropped back.

    Args:
        inputs: ``[N, C, *spatial]`` input (2D or 3D spatial).
        roi_size: window size, one int or one per spatial dimension; ``None`` / non-positive entries take the whole
            extent of that dimension.
        sw_batch_size: number of windows per predictor call, or ``"auto"`` (CUDA: the largest batch that fits the
            free GPU memory, measured on a one-window probe batch; elsewhere up to 4; split evenly over the
            windows, see :mod:`monai.inferers.batch_size`).
        predictor: called as ``predictor(windows, *args, **kwargs)`` with ``windows`` ``[n, C, *roi_size]``, or as
            ``predictor(windows, patch_coords, *args, **kwargs)`` when ``with_coord``.
        overlap: overlap fraction between neighbouring windows, one value or one per dimension, in ``[0, 1)``.
        mode: ``"constant"`` or ``"gaussian"`` blending of overlapping windows.
        sigma_scale: Gaussian sigma as a fraction of the window size (``mode="gaussian"``).
        padding_mode: ``"constant"``, ``"reflect"``, ``"replicate"`` or ``"circular"`` padding of small inputs.
        cval: fill value for ``padding_mode="constant"`` (ignored by the other modes).
        sw_device: device of the windows given to the predictor (default: that of ``inputs``).
        device: device of the stitched result (default: that of ``inputs``).
        progress: show a progress bar (``tqdm`` when installed, else a line on stderr).
        roi_weight_map: precomputed ``[*roi_size]`` weight map to use instead of ``mode`` / ``sigma_scale``.
        process_fn: ``process_fn(outputs, windows, weight) -> (outputs, weight)`` applied to each batch of window
            outputs (a tuple of tensors) before stitching; it may change the outputs and return per-window weights.
            The normalising weight sum then accumulates the weights returned for each window (upstream reuses
            the first batch's weights for every window).
        buffer_steps: when positive, stitch bands of ``buffer_steps`` window positions along ``buffer_dim`` on
            ``sw_device`` before adding them to the result on ``device`` (fewer transfers when stitching on CPU).
        buffer_dim: spatial dimension of the bands (0 is the first spatial dimension; -1 the last).
        with_coord: pass the window coordinates to the predictor: a list, one entry per window, of
            ``[slice(b, b + 1), slice(None), *spatial_slices]`` indexing the padded ``[N, C, *spatial]`` input.
        args: extra positional arguments of the predictor.
        kwargs: extra keyword arguments of the predictor. A ``condition`` tensor shaped like ``inputs`` is padded
            and windowed with the inputs and passed as ``condition=``.

    Returns:
        tensor, tuple or dict (as the predictor returns) of ``[N, C_k, *spatial * scale_k]`` results on ``device``,
        in the dtype of ``inputs``.

    Raises:
        ValueError: for arguments that do not fit the input (see :func:`plan_sliding_windows`), a non-positive
            ``sw_batch_size``, an unknown ``mode`` or ``padding_mode``, or a ``buffer_dim`` out of range.
    """
    return _sliding_window(
        inputs,
        roi_size,
        sw_batch_size,
        predictor,
        overlap,
        mode,
        sigma_scale,
        padding_mode,
        cval,
        sw_device,
        device,
        progress,
        roi_weight_map,
        process_fn,
        buffer_steps,
        buffer_dim,
        with_coord,
        args,
        kwargs,
    )


def _sliding_window(
    inputs: torch.Tensor,
    roi_size: Sequence[int] | int,
    sw_batch_size: int,
    predictor: Callable,
    overlap: Sequence[float] | float,
    mode: BlendMode | str,
    sigma_scale: Sequence[float] | float,
    padding_mode: PytorchPadMode | str,
    cval: float,
    sw_device: torch.device | str | None,
    device: torch.device | str | None,
    progress: bool,
    roi_weight_map: torch.Tensor | None,
    process_fn: Callable | None,
    buffer_steps: int | None,
    buffer_dim: int,
    with_coord: bool,
    args: tuple,
    kwargs: dict,
    timer: Any = None,
    auto_cache: dict | None = None,
) -> Any:
    """The window loop behind :func:`sliding_window_inference`.

    ``timer`` (a :class:`~monai.utils.profiling.StageTimer`) receives the stages ``prepare``, ``forward``,
    ``stitch``, ``finalize`` and ``total``, the unaccounted rest as ``other``, and the counts ``windows``
    and ``batches``. ``auto_cache`` keeps the measured per-window memory of ``sw_batch_size="auto"`` across
    calls (see :class:`~monai.inferers.batch_size.AutoBatchSize`).
    """
    timer = timer or _default_timer()
    with timer.stage("total"):
        result = _window_loop(
            inputs, roi_size, sw_batch_size, predictor, overlap, mode, sigma_scale, padding_mode, cval, sw_device,
            device, progress, roi_weight_map, process_fn, buffer_steps, buffer_dim, with_coord, args, kwargs, timer,
            auto_cache,
        )
    if timer.enabled:
        t = timer.timings
        t["other"] = max(t["total"] - sum(t.get(k, 0.0) for k in ("prepare", "forward", "stitch", "finalize")), 0.0)
    return result


def _window_loop(
    inputs, roi_size, sw_batch_size, predictor, overlap, mode, sigma_scale, padding_mode, cval, sw_device, device,
    progress, roi_weight_map, process_fn, buffer_steps, buffer_dim, with_coord, args, kwargs, timer, auto_cache,
):
    kwargs = dict(kwargs)
    with timer.stage("prepare"):
        if not isinstance(inputs, torch.Tensor):
            inputs = torch.as_tensor(inputs)
        if inputs.ndim < 3:
            raise ValueError(
                f"inputs must be [N, C, *spatial] with at least one spatial dimension, got {tuple(inputs.shape)}."
            )
        ndim = inputs.ndim - 2
        sw_batch_size = check_sw_batch_size(sw_batch_size)
        mode = look_up_option(mode, BlendMode)
        pad_mode = look_up_option(padding_mode, PytorchPadMode)
        buffered = buffer_steps is not None and buffer_steps > 0
        if buffered:
            if not -ndim <= buffer_dim < ndim:
                raise ValueError(
                    f"buffer_dim must be in [{-ndim}, {ndim - 1}] for {ndim} spatial dimensions, got {buffer_dim}."
                )
            buffer_dim = buffer_dim % ndim
        device = torch.device(device) if device is not None else inputs.device
        sw_device = torch.device(sw_device) if sw_device is not None else inputs.device
        dtype = inputs.dtype
        condition = kwargs.pop("condition", None)

        plan = plan_sliding_windows(inputs.shape[2:], roi_size, overlap, inputs.shape[0], pad_mode)
        inputs, condition, weight = pad_and_weight(
            inputs, condition, plan, pad_mode, cval, roi_weight_map, mode, sigma_scale, sw_device, dtype
        )

        if buffered:
            segments = [(b, b.first, b.stop) for b in _buffered_bands(plan, int(buffer_steps), buffer_dim)]
        else:
            segments = [(None, 0, plan.total_windows)]
        stitcher = WindowStitcher(
            plan, weight, device, dtype, buffer_dim if buffered else None, per_window_weights=process_fn is not None
        )
        auto = None
        if sw_batch_size == "auto":
            voxels = plan.batch_size * math.prod(plan.padded_size)
            key = (_identity(predictor), plan.roi_size, inputs.shape[1], str(dtype), str(sw_device))
            key += _signature(args, kwargs)
            auto = AutoBatchSize(sw_device, auto_cache, key, voxels, stitch_on_device=device == sw_device)
            steps: Any = _schedule(segments, auto.next)
        else:
            bs = int(sw_batch_size)
            steps = list(_schedule(segments, lambda remaining: bs))
        timer.count("windows", plan.total_windows)
        timer.set("sw_batch_size", sw_batch_size)

    keys = None
    with timer.range("loop"):
        for band, batch, last_of_band in _progress(steps, progress):
            with timer.stage("prepare"):
                coords = [plan.coords(i) for i in batch]
                windows = torch.cat([inputs[tuple(c)] for c in coords]).to(sw_device)
                if condition is not None:
                    kwargs["condition"] = torch.cat([condition[tuple(c)] for c in coords]).to(sw_device)
            with timer.stage("forward"):
                if auto is not None:
                    auto.before_forward(len(coords))
                out = predictor(windows, coords, *args, **kwargs) if with_coord else predictor(windows, *args, **kwargs)
                if auto is not None:
                    auto.after_forward()
                timer.count("batches")
            with timer.stage("stitch"):
                keys, outs = _flatten_outputs(out)
                w = None
                if process_fn is not None:
                    outs, w = process_fn(outs, windows, weight)
                    outs = ensure_tuple(outs)
                if band is not None and stitcher._band is not band:
                    stitcher.begin_band(band)
                stitcher.add(outs, coords, w)
                if last_of_band:
                    stitcher.end_band()
                if auto is not None:
                    auto.after_stitch(stitcher.result_bytes(sw_device))

    if auto is not None:
        timer.set("sw_batch_size", "auto")
        timer.set("auto_batch", dict(auto.info))
    with timer.stage("finalize"):
        results = stitcher.finalize()
        results = [r.to(device=device, dtype=dtype) for r in results]
        return _pack_outputs(results, keys)
