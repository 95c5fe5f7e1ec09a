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
"""Window planning: where the windows of a sliding-window pass lie and in which batches they run.

Upstream keeps the first helpers (``dense_patch_slices``, ``compute_importance_map``, ...) in
``monai.data.utils``; :mod:`monai.inferers.utils` re-exports them under their upstream names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from monai.utils import BlendMode, PytorchPadMode, ensure_tuple, ensure_tuple_rep, look_up_option

__all__ = [
    "get_valid_patch_size",
    "get_scan_interval",
    "dense_patch_slices",
    "compute_importance_map",
    "SlidingWindowPlan",
    "plan_sliding_windows",
    "Band",
    "buffered_bands",
    "schedule_batches",
]


def get_valid_patch_size(image_size: Sequence[int], patch_size: Sequence[int | None] | int) -> tuple[int, ...]:
    """Clip ``patch_size`` to ``image_size``; ``None`` or 0 entries (or missing trailing ones) take the image size.

    Args:
        image_size: spatial size of the image, e.g. ``(H, W, D)``.
        patch_size: one size for every dimension or one per dimension.

    Returns:
        a tuple of ``len(image_size)`` patch sizes, each at most the image size.
    """
    ndim = len(image_size)
    sizes: list[int | None]
    if isinstance(patch_size, int) or not isinstance(patch_size, Sequence) and not hasattr(patch_size, "__len__"):
        sizes = [patch_size] * ndim
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
    roi: list[int | float | None]
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



@dataclass
class Band:
    """A band of buffered stitching: windows ``[first, stop)`` (over the batch) covering ``[start, end)`` along
    the buffer dimension of image ``image``."""

    image: int
    start: int
    end: int
    first: int
    stop: int


def buffered_bands(plan: SlidingWindowPlan, buffer_steps: int, buffer_dim: int) -> list[Band]:
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
            bands.append(Band(b, start, end, offset + lo, offset + hi))
    return bands


def schedule_batches(segments: Sequence[tuple[Any, Sequence[int]]], next_size: Callable[[int], int]):
    """Yield ``(segment key, window indices, last of segment)`` per forward batch; batches never cross a segment.

    Args:
        segments: ``(key, window indices)`` in running order (e.g. one segment over every image, or one per band).
        next_size: windows of the next batch given the windows left in the segment.
    """
    for key, indices in segments:
        i, total = 0, len(indices)
        while i < total:
            n = max(1, min(int(next_size(total - i)), total - i))
            yield key, indices[i : i + n], i + n >= total
            i += n
