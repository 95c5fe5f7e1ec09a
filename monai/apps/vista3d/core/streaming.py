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
"""Sliding-window inference that streams a label map instead of holding the logits of every class.

:func:`sliding_window_inference` followed by the VISTA3D post-transform keeps ``C`` full-size float channels
(117 x 512^3 x 4 bytes = 63 GB for "everything") only to reduce them to one label per voxel. Here the shared
window loop (:func:`monai.inferers.sliding_window.run_sliding_window`) stitches tile by tile
(:class:`~monai.inferers.tile_stitcher.TileStitcher`): each tile of blended logits is turned into labels by
:class:`LabelMapReduction` as soon as its last window has been added, then freed, slab by slab along ``slab_dim``.
The labels equal those of the full blended logits bit for bit (see :mod:`monai.inferers.tile_stitcher`).

Accumulators take the dtype of ``inputs``, as in :func:`sliding_window_inference`: pass a float32 image for the
exact labels, a float16 one to halve the held tiles (sums rounded to fp16, so labels can flip where two classes
are within fp16 rounding of each other). On CUDA under fp16 autocast the labels also depend on the window batch
size, for both paths alike: cuDNN picks other kernels for other batch shapes, and the last bits of the logits
move. Compare with the full-logits path at the same ``sw_batch_size``.

Per-class masks (``return_masks``): each complete tile is also thresholded class by class (logit > 0, the rule
the label map applies to a class) and packed 8 classes a byte into a ``[N, ceil(C / 8), *spatial]`` uint8 volume
(:func:`~monai.apps.vista3d.core.postprocess.pack_masks`), so a voxel may be in several masks. They are exactly the
thresholded full blended logits, for the same reason as the labels. Bit-packing along the class axis rather than
one uint8 per class keeps the result at ``ceil(C / 8)`` bytes a voxel: 15 for the 117 classes of "everything"
(2.0 GB at 512^3, against 15.7 GB unpacked), the only memory the masks add to the label map's peak; and the
packed volume is inverted onto the input grid as it is, since nearest-neighbour resampling moves whole bytes.

Memory: besides the input, the peak is the held tiles (at 512^3 with 128^3 windows and overlap 0.25, about
11 M voxels x classes x accumulator bytes) plus the network's working set for one window batch (about 1.4 GiB per
window for ``vista3d132`` in fp16). 512^3 with all 117 classes peaks at 7.6 GiB with float32 accumulators at
``sw_batch_size=1`` and 6.8 GiB with float16 ones at 2, against 84 GiB for the full logits (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from monai.apps.vista3d.config import DEFAULT_OVERLAP
from monai.inferers.sliding_window import SlidingWindowSettings, run_sliding_window
from monai.inferers.tile_stitcher import TileStitcher
from monai.utils import BlendMode

from .postprocess import logits_to_labels, pack_masks, packed_channels

__all__ = ["sliding_window_label_inference", "LabelMapReduction", "first_streamed_pass"]  # post-transform re-exported

# Settings of the full blended outputs that tile-by-tile stitching has no use for.
_NOT_STREAMED = ("process_fn", "buffer_steps", "buffer_dim")


def _label_dtype(max_id: int) -> torch.dtype:
    if max_id <= 255:
        return torch.uint8
    if max_id <= 32767:
        return torch.int16
    return torch.int32


class LabelMapReduction:
    """VISTA3D's post-transform of each complete tile: the label map, and on request the highest class probability
    and the bit-packed per-class masks (a :class:`~monai.inferers.tile_stitcher.TileReduction`).

    Args:
        inputs: the ``[N, C_in, *spatial]`` input (its batch size, spatial size and dtype size the results).
        device: device of the results.
        label_ids: label of each output channel (default ``1..C``); 0 is background.
        max_prob: also keep the per-voxel highest logit (its sigmoid is returned).
        masks: also keep one mask per class (logit > 0), packed 8 classes a byte.
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        device: torch.device,
        label_ids: Sequence[int] | torch.Tensor | None = None,
        max_prob: bool = False,
        masks: bool = False,
    ):
        self.shape = (inputs.shape[0], 1, *inputs.shape[2:])
        self.device, self.dtype = torch.device(device), inputs.dtype
        self.ids = None if label_ids is None else torch.as_tensor(label_ids, dtype=torch.int64).reshape(-1)
        self.want_max_prob, self.want_masks = max_prob, masks
        self.labels: torch.Tensor | None = None
        self.max_prob: torch.Tensor | None = None
        self.masks: torch.Tensor | None = None

    def _allocate(self, channels: int, logits_device: torch.device) -> None:
        """First tile: check the label ids against the channels and allocate the results."""
        ids = torch.arange(1, channels + 1) if self.ids is None else self.ids
        if ids.numel() != channels:
            raise ValueError(f"label_ids has {ids.numel()} entries but the predictor returns {channels} channels.")
        lab_dtype = _label_dtype(int(ids.max()) if ids.numel() else 0)
        self.labels = torch.zeros(self.shape, dtype=lab_dtype, device=self.device)
        if self.want_max_prob:
            self.max_prob = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        if self.want_masks:
            shape = (self.shape[0], packed_channels(channels), *self.shape[2:])
            self.masks = torch.zeros(shape, dtype=torch.uint8, device=self.device)
        self.ids = ids.to(logits_device)

    def add(self, image: int, region: tuple[slice, ...], outputs: torch.Tensor) -> None:
        """Write the labels (and highest logit, packed masks) of one complete tile of ``[C, *tile]`` logits."""
        if self.labels is None:
            self._allocate(outputs.shape[0], outputs.device)
        assert self.labels is not None  # allocated on the first tile
        labels = logits_to_labels(outputs, self.ids, dtype=torch.int64)
        tile: tuple[int | slice, ...] = (image, 0, *region)  # (named: mypy reads x[(a, *b)] as 3.11 syntax)
        self.labels[tile] = labels.to(device=self.device, dtype=self.labels.dtype)
        if self.max_prob is not None:
            self.max_prob[tile] = outputs.max(0).values.to(self.device)
        if self.masks is not None:
            every_class: tuple[int | slice, ...] = (image, slice(None), *region)
            self.masks[every_class] = pack_masks(outputs).to(self.device)

    def finish(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The labels, or a tuple of the labels, then the probabilities and the packed masks where asked for."""
        if self.labels is None:
            raise RuntimeError("the label map reduction received no tile")
        if self.max_prob is None and self.masks is None:
            return self.labels
        extra: list[torch.Tensor] = []
        if self.max_prob is not None:
            # sigmoid once over the whole map: per-tile calls could round differently (vectorised vs scalar tails)
            extra.append(self.max_prob.sigmoid_())
        if self.masks is not None:
            extra.append(self.masks)
        return (self.labels, *extra)


def sliding_window_label_inference(
    inputs: torch.Tensor,
    roi_size: Sequence[int] | int,
    sw_batch_size: int | str,
    predictor: Callable[..., torch.Tensor],
    overlap: Sequence[float] | float = DEFAULT_OVERLAP,
    mode: BlendMode | str = BlendMode.CONSTANT,
    *args: Any,
    slab_dim: int = 0,
    label_ids: Sequence[int] | torch.Tensor | None = None,
    return_max_prob: bool = False,
    return_masks: bool = False,
    auto_cache: dict | None = None,
    **kwargs: Any,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Sliding-window inference straight to a label map, holding only the slabs that still receive windows.

    The labels equal ``logits_to_labels`` of ``sliding_window_inference(inputs, roi_size, sw_batch_size,
    predictor, overlap, mode, ...)`` with the same settings on every voxel (see the module notes).

    Args:
        inputs: ``[N, C_in, *spatial]`` image (2D or 3D spatial).
        roi_size: window size, one int or one per spatial dimension (``None`` / non-positive: the whole extent).
        sw_batch_size: windows per predictor call, or ``"auto"`` (see :mod:`monai.inferers.batch_size`).
        predictor: called as ``predictor(windows, *args, **kwargs)`` (``predictor(windows, patch_coords, *args,
            **kwargs)`` with ``with_coord``), returning ``[n, C, *roi_size]`` logits for ``n`` windows.
        overlap: overlap fraction of neighbouring windows, one value or one per dimension, in ``[0, 1)``.
        mode: ``"constant"`` or ``"gaussian"`` blending.
        args: extra positional arguments of the predictor.
        slab_dim: spatial dimension along which the volume is completed slab by slab (0: first spatial one).
            Choose the longest one to hold the least; 0 needs the least extra bookkeeping.
        label_ids: label of each output channel (default ``1..C``); 0 is background.
        return_max_prob: also return the per-voxel maximum class probability (sigmoid of the highest logit).
        return_masks: also return one mask per class, each class thresholded on its own (logit > 0), bit-packed
            along the class axis (see :mod:`~monai.apps.vista3d.core.postprocess`); ``ClassMasks(masks[b], label_ids)``
            reads image ``b``'s.
        auto_cache: keeps the measured per-window memory of ``sw_batch_size="auto"`` across calls.
        kwargs: the other :class:`~monai.inferers.sliding_window.SlidingWindowSettings` by name (``sigma_scale``,
            ``padding_mode``, ``cval``, ``sw_device``, ``device`` of the returned maps, ``progress``,
            ``roi_weight_map``, ``with_coord``); the rest are keyword arguments of the predictor (a ``condition``
            tensor shaped like ``inputs`` is windowed with it).

    Returns:
        ``[N, 1, *spatial]`` labels on ``device`` (uint8 when every label id fits, else int16 / int32); with
        ``return_max_prob`` or ``return_masks`` a tuple of the labels, then the ``[N, 1, *spatial]`` float
        probabilities (dtype of ``inputs``) if asked for, then the ``[N, ceil(C / 8), *spatial]`` uint8 packed
        masks (class ``i`` in bit ``i % 8`` of channel ``i // 8``) if asked for.

    Raises:
        ValueError: for arguments that do not fit the input, a ``slab_dim`` out of range, settings of the full
            blended outputs (``process_fn``, ``buffer_steps``, ``buffer_dim``), or a predictor output that is not
            one ``[n, C, *roi_size]`` tensor.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.ndim < 3:
        raise ValueError(f"inputs must be a [N, C, *spatial] tensor, got {getattr(inputs, 'shape', type(inputs))}.")
    window, kwargs = SlidingWindowSettings.split(kwargs)
    unused = [k for k in _NOT_STREAMED if k in window]
    if unused:
        raise ValueError(f"{unused} apply to the full blended outputs, not to the streamed label map.")
    settings = SlidingWindowSettings(
        roi_size=roi_size, sw_batch_size=sw_batch_size, overlap=overlap, mode=mode, **window
    )
    reduction = LabelMapReduction(inputs, settings.result_device(inputs), label_ids, return_max_prob, return_masks)
    stitcher = functools.partial(TileStitcher, slab_dim=slab_dim, reduction=reduction)
    result: torch.Tensor | tuple[torch.Tensor, ...] = run_sliding_window(
        inputs, predictor, settings, args, kwargs, auto_cache=auto_cache, stitcher=stitcher
    )
    return result


def first_streamed_pass(device: torch.device, amp: bool) -> None:
    """A streamed pass over a tiny image on ``device`` with the types of a pipeline's (a float32 image, float16
    logits under ``amp``, int64 label ids, overlapping windows cut into tiles): the launches a CT's pass makes besides
    its network's.

    A process's first launch of each loads its code: under ``torch.profiler`` a fresh process's pass of a CT on an
    H100 left the GPU idle 20 ms at its first ``addcmul_`` (float16 window parts into float32 tiles) and 40, 12 and
    5.5 ms at the label map's first ``masked_fill_``, index and ``argmax``. A pipeline runs this on a thread while
    its network loads (:func:`~monai.utils.cuda_libraries.start_first_calls`).
    """
    dtype = torch.float16 if amp else torch.float32

    def logits(windows: torch.Tensor, coords: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        # (not random: the process's CUDA generator stays where it was)
        return torch.zeros((windows.shape[0], 2, *windows.shape[2:]), dtype=dtype, device=windows.device)

    # windows of 4 voxels: over 7 x 7 x 8, tiles inside, across and equal to windows (contiguous and strided parts,
    # as a CT's 128^3 windows at any overlap give); over 7 x 3 x 3, an image the window pads and the labels crop.
    # 14 windows in all (tests/apps/vista3d/test_streaming.py compares with larger passes)
    autocast = torch.autocast("cuda", torch.float16, enabled=amp and device.type == "cuda")
    with autocast:
        for shape in ((7, 7, 8), (7, 3, 3)):
            image = torch.zeros((1, 1, *shape), device=device)
            sliding_window_label_inference(image, 4, 1, logits, overlap=0.25, with_coord=True,
                                           label_ids=torch.as_tensor([1, 2]))
