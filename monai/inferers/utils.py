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
"""Sliding-window inference (upstream's ``monai.inferers.utils``).

The work is done in three modules, each re-exported here under upstream's names:
:mod:`monai.inferers.windows` (where the windows lie, the weight map, the forward batches),
:mod:`monai.inferers.stitcher` (blending window outputs) and :mod:`monai.inferers.sliding_window` (the loop and
its :class:`~monai.inferers.sliding_window.SlidingWindowSettings`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from monai.inferers.sliding_window import SlidingWindowSettings, pad_and_weight, run_sliding_window
from monai.inferers.stitcher import WindowOutputs, WindowStitcher
from monai.inferers.windows import (
    SlidingWindowPlan,
    compute_importance_map,
    dense_patch_slices,
    get_scan_interval,
    get_valid_patch_size,
    plan_sliding_windows,
)
from monai.utils import BlendMode, PytorchPadMode

__all__ = [
    "sliding_window_inference",
    "compute_importance_map",
    "dense_patch_slices",
    "get_valid_patch_size",
    "get_scan_interval",
    "SlidingWindowPlan",
    "plan_sliding_windows",
    "WindowStitcher",
    "SlidingWindowSettings",
    "pad_and_weight",
]

# Upstream's (private) name of the scan-interval helper.
_get_scan_interval = get_scan_interval


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
) -> WindowOutputs:
    """Run ``predictor`` on overlapping windows of ``inputs`` and blend the window outputs.

    The predictor may return a tensor, a tuple or a dict of tensors, each ``[n, C_k, *spatial_k]`` for ``n``
    windows; outputs may be at another scale than the input (e.g. half resolution), in which case
    ``roi_size * (1 - overlap) * scale`` should be an integer. Where the window is larger than the image, the
    input is padded and the result cropped back.

    Args:
        inputs: ``[N, C, *spatial]`` input (2D or 3D spatial).
        roi_size: window size, one int or one per spatial dimension; ``None`` / non-positive entries take the whole
            extent of that dimension.
        sw_batch_size: number of windows per predictor call, or ``"auto"`` (see :mod:`monai.inferers.batch_size`).
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
    settings = SlidingWindowSettings.from_values(locals())  # the arguments named like a settings field
    return run_sliding_window(inputs, predictor, settings, args, kwargs)
