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
"""Inference on windows placed around the point prompts of one object (VISTA3D interactive segmentation)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["point_based_window_inferer"]


def _pad_to_roi(x: torch.Tensor, roi_size: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
    """Zero-pad the last three axes of ``x`` up to ``roi_size``, half before and half (rounded up) after.

    Returns:
        the padded tensor (``x`` itself when no padding is needed) and the pad amounts in ``F.pad`` order
        ``[d_lo, d_hi, w_lo, w_hi, h_lo, h_hi]``.
    """
    pad: list[int] = []
    for axis in (-1, -2, -3):
        extra = max(int(roi_size[axis]) - x.shape[axis], 0)
        pad += [extra // 2, extra - extra // 2]
    return (F.pad(x, pad) if any(pad) else x), pad


def _window_starts_stops(p: float, roi: int, size: int, center_only: bool, margin: int) -> list[tuple[int, int]]:
    """Window ``(start, stop)`` pairs along one axis for a point at ``p`` (``size >= roi``).

    The centred window is ``[int(p) - roi // 2, int(p) + roi // 2)`` shifted inside ``[0, size)`` when it would
    cross an edge (so for an odd ``roi`` an unshifted centred window is one voxel short, as upstream). Without
    ``center_only``, two more windows put the point ``margin`` voxels from their far and near ends.
    """
    if p - roi // 2 < 0:
        centre = (0, roi)
    elif p + roi // 2 > size:
        centre = (size - roi, size)
    else:
        centre = (int(p) - roi // 2, int(p) + roi // 2)
    if center_only:
        return [centre]
    lo = max(0, p - roi + margin)
    hi = min(size, p + roi - margin)
    # Near an edge these windows would leave the image: upstream then slices an empty or truncated window
    # (which a network such as VISTA3D cannot run on); here they are shifted inside the image instead.
    after = (int(lo), int(lo + roi)) if lo + roi <= size else (size - roi, size)
    before = (int(hi - roi), int(hi)) if hi - roi >= 0 else (0, roi)
    return [after, before, centre]


def point_based_window_inferer(
    inputs: torch.Tensor,
    roi_size: Sequence[int],
    predictor: Callable[..., Any],
    point_coords: torch.Tensor,
    point_labels: torch.Tensor,
    class_vector: torch.Tensor | None = None,
    prompt_class: torch.Tensor | None = None,
    prev_mask: torch.Tensor | None = None,
    point_start: int = 0,
    center_only: bool = True,
    margin: int = 5,
    device: torch.device | str | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Segment one object by running ``predictor`` only on windows around its point prompts.

    Every window gets the whole prompt (``point_coords`` in image space) and ``patch_coords=[window]``, so a
    VISTA3D predictor maps the points into the window itself. Window outputs are added into one buffer, on the
    CPU unless ``device`` says otherwise (overlapping windows sum, as upstream); voxels no window covers are NaN,
    or ``prev_mask`` when given.
    Images smaller than ``roi_size`` are zero-padded for inference and the padding cropped from the result.

    Args:
        inputs: ``[1, C, H, W, D]`` image.
        roi_size: window size ``(h, w, d)``.
        predictor: called as ``predictor(window, point_coords=, point_labels=, class_vector=, prompt_class=,
            patch_coords=, prev_mask=, **kwargs)`` and returning ``[1, B, h, w, d]`` (use ``transpose=True``
            in ``kwargs`` for VISTA3D).
        point_coords: ``[1, N, 3]`` point coordinates of the single object (voxels of ``inputs``).
        point_labels: ``[1, N]`` point labels (0/1 negative/positive, 2/3 for special classes, -1 padding).
        class_vector: ``[1]`` or ``[1, 1]`` class for the automatic branch, or None.
        prompt_class: ``[1]`` or ``[1, 1]`` class of the points (supported or zero-shot), or None.
        prev_mask: ``[1, B, H, W, D]`` earlier logits (before sigmoid), given to the predictor and kept where
            no window lands.
        point_start: windows are placed only for points from this index on (earlier points already shaped
            ``prev_mask``); the predictor still gets all points.
        center_only: one window centred on each point; otherwise 3 placements per axis (27 windows per point):
            centred, and with the point ``margin`` voxels from the window's start or end. Unlike upstream, those
            windows are kept inside the image near its edges (upstream gives an empty or truncated window).
        margin: without ``center_only``, the distance from the point to the far window ends.
        device: where the windows are stitched and the result is returned; ``None``: the CPU (as MONAI 1.6.1).
            A session of clicks on a GPU keeps it there: the click-only post-processing and the next click's
            ``prev_mask`` then never cross to the host.
        kwargs: passed on to ``predictor``.

    Returns:
        ``[1, B, H, W, D]`` float logits on ``device``.
    """
    _check_inputs(inputs, roi_size, point_coords)
    roi = [int(r) for r in roi_size]
    image, pad = _pad_to_roi(inputs, roi)
    # pad is [d_lo, d_hi, w_lo, w_hi, h_lo, h_hi]; points are (h, w, d)
    point_coords = point_coords + torch.tensor([pad[4], pad[2], pad[0]]).to(point_coords.device)
    padded_prev = _pad_to_roi(prev_mask, roi)[0] if prev_mask is not None else None
    size = image.shape[-3:]
    device = torch.device("cpu") if device is None else torch.device(device)

    stitched: torch.Tensor | None = None
    covered = torch.zeros(size, dtype=torch.bool, device=device)
    for window in _point_windows(point_coords[0, point_start:].tolist(), roi, size, center_only, margin):
        output = predictor(
            image[window],
            point_coords=point_coords,
            point_labels=point_labels,
            class_vector=class_vector,
            prompt_class=prompt_class,
            patch_coords=[window],
            prev_mask=padded_prev,
            **kwargs,
        )
        if stitched is None:
            stitched = torch.zeros([1, output.shape[1], *size], device=device)
        stitched[window] += output.to(device)
        covered[window[2:]] = True
    if stitched is None:
        raise ValueError(
            f"No window was placed: point_coords[0, {point_start}:] is empty. Give at least one point at or "
            "after point_start."
        )
    return _cropped_and_filled(stitched, covered, pad, padded_prev)


def _check_inputs(inputs: torch.Tensor, roi_size: Sequence[int], point_coords: torch.Tensor) -> None:
    """Refuse what :func:`point_based_window_inferer` cannot run on, with the shape it needs."""
    if point_coords.shape[0] != 1:
        raise ValueError(
            f"point_based_window_inferer segments one object at a time: point_coords must be [1, N, 3], "
            f"got {tuple(point_coords.shape)}. Call it once per object."
        )
    if inputs.ndim != 5:
        raise ValueError(f"inputs must be a 5D [1, C, H, W, D] tensor, got shape {tuple(inputs.shape)}.")
    if len(roi_size) != 3:
        raise ValueError(f"roi_size must have 3 entries (h, w, d), got {roi_size}.")


def _point_windows(
    points: list[list[float]], roi: list[int], size: Sequence[int], center_only: bool, margin: int
) -> Iterator[tuple[slice, ...]]:
    """The ``[:, :, h, w, d]`` slices of every window placed around each of ``points`` (see
    :func:`_window_starts_stops`), point by point."""
    for p in points:
        per_axis = [_window_starts_stops(p[a], roi[a], size[a], center_only, margin) for a in range(3)]
        for (lx, rx), (ly, ry), (lz, rz) in itertools.product(*per_axis):
            yield (slice(None), slice(None), slice(lx, rx), slice(ly, ry), slice(lz, rz))


def _cropped_and_filled(
    stitched: torch.Tensor, covered: torch.Tensor, pad: list[int], padded_prev: torch.Tensor | None
) -> torch.Tensor:
    """``stitched`` without the padding to ``roi_size``; voxels no window covered are ``prev_mask``, else NaN."""
    size = stitched.shape[-3:]
    crop = tuple(slice(lo, s - hi) for lo, hi, s in zip(pad[4::-2], pad[5::-2], size))
    batch_crop = (slice(None), slice(None), *crop)  # (a named tuple: mypy reads x[(a, *b)] as 3.11 syntax)
    stitched, covered = stitched[batch_crop], covered[crop]
    if padded_prev is not None:
        elsewhere = padded_prev[batch_crop].to(stitched.device, stitched.dtype)
    else:
        elsewhere = torch.tensor(float("nan"), device=stitched.device)
    return torch.where(covered, stitched, elsewhere)
