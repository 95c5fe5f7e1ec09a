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
(117 x 512^3 x 4 bytes = 63 GB for "everything") only to reduce them to one label per voxel. Here the volume is
cut into *tiles* at every window border; a tile's blended logits are accumulated while windows arrive and turned
into labels as soon as its last window has been added, then freed. Windows are visited slab by slab along
``slab_dim``, so only the tiles of the slabs still receiving windows are held.

Exactness: for every voxel the weighted window outputs are summed in the same order, with the same operations
and dtype as :func:`monai.inferers.sliding_window_inference`, and divided by the same weight sum, so the labels
equal those of the full blended logits bit for bit (as long as the predictor's output for a window does not
depend on the other windows of its batch). With ``slab_dim=0`` the visiting order is the reference order and
every tile is accumulated directly. For another ``slab_dim`` a voxel covered by windows of two slabs would be
summed in another order, so such tiles keep the weighted-out parts of their windows and sum them in the
reference order when complete (more memory for those overlap tiles, still bounded by the slab size).

Accumulators take the dtype of ``inputs``, as in :func:`sliding_window_inference`: pass a float32 image for the
exact labels, a float16 one to halve the held tiles (sums rounded to fp16, so labels can flip where two classes
are within fp16 rounding of each other). On CUDA under fp16 autocast the labels also depend on the window batch
size, for both paths alike: cuDNN picks other kernels for other batch shapes, and the last bits of the logits
move. Compare with the full-logits path at the same ``sw_batch_size``.

Per-class masks (``return_masks``): each complete tile is also thresholded class by class (logit > 0, the rule
the label map applies to a class) and packed 8 classes a byte into a ``[N, ceil(C / 8), *spatial]`` uint8 volume
(:func:`~monai.apps.vista3d.postprocess.pack_masks`), so a voxel may be in several masks. They are exactly the
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

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from monai.inferers.batch_size import AutoBatchSize, auto_cache_key, check_sw_batch_size
from monai.inferers.sliding_window import SlidingWindowSettings, pad_and_weight
from monai.inferers.windows import plan_sliding_windows
from monai.utils import BlendMode, PytorchPadMode
from .postprocess import logits_to_labels, pack_masks, packed_channels

__all__ = ["sliding_window_label_inference", "logits_to_labels"]  # the post-transform is re-exported


def _label_dtype(max_id: int) -> torch.dtype:
    if max_id <= 255:
        return torch.uint8
    if max_id <= 32767:
        return torch.int16
    return torch.int32


class _Tiling:
    """Tiles of the padded volume cut at every window border, and which windows cover each tile."""

    def __init__(self, slices: Sequence[tuple[slice, ...]], size: Sequence[int], order: Sequence[int]):
        ndim = len(size)
        self.bounds = []
        for d in range(ndim):
            cuts = {0, int(size[d])} | {s[d].start for s in slices} | {s[d].stop for s in slices}
            self.bounds.append(sorted(cuts))
        position = {w: p for p, w in enumerate(order)}
        # per window: the range of tile indices it covers along each axis
        self.window_tiles: list[list[tuple[int, ...]]] = []
        cover: dict[tuple[int, ...], list[int]] = {}
        for w, sl in enumerate(slices):
            ranges = [range(self.bounds[d].index(sl[d].start), self.bounds[d].index(sl[d].stop)) for d in range(ndim)]
            tiles = list(itertools.product(*ranges))
            self.window_tiles.append(tiles)
            for t in tiles:
                cover.setdefault(t, []).append(w)
        # a tile is complete after the last of its windows in the visiting order
        self.last = {t: max(ws, key=position.__getitem__) for t, ws in cover.items()}
        # direct accumulation is exact where the visiting order of a tile's windows is the reference (plan) order
        self.direct = {t: sorted(ws, key=position.__getitem__) == sorted(ws) for t, ws in cover.items()}

    def box(self, t: tuple[int, ...]) -> list[tuple[int, int]]:
        return [(self.bounds[d][i], self.bounds[d][i + 1]) for d, i in enumerate(t)]


def sliding_window_label_inference(
    inputs: torch.Tensor,
    roi_size: Sequence[int] | int,
    sw_batch_size: int | str,
    predictor: Callable[..., torch.Tensor],
    overlap: Sequence[float] | float = 0.25,
    mode: BlendMode | str = BlendMode.CONSTANT,
    sigma_scale: Sequence[float] | float = 0.125,
    padding_mode: PytorchPadMode | str = PytorchPadMode.CONSTANT,
    cval: float = 0.0,
    sw_device: torch.device | str | None = None,
    device: torch.device | str | None = None,
    roi_weight_map: torch.Tensor | None = None,
    with_coord: bool = False,
    slab_dim: int = 0,
    label_ids: Sequence[int] | torch.Tensor | None = None,
    return_max_prob: bool = False,
    *args: Any,
    auto_cache: dict | None = None,
    return_masks: bool = False,
    **kwargs: Any,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Sliding-window inference straight to a label map, holding only the slabs that still receive windows.

    The labels equal ``logits_to_labels`` of ``sliding_window_inference(inputs, roi_size, sw_batch_size,
    predictor, overlap, mode, sigma_scale, padding_mode, cval, ...)`` on every voxel (see the module notes).

    Args:
        inputs: ``[N, C_in, *spatial]`` image (2D or 3D spatial).
        roi_size: window size, one int or one per spatial dimension (``None`` / non-positive: the whole extent).
        sw_batch_size: windows per predictor call, or ``"auto"`` (see :mod:`monai.inferers.batch_size`).
        predictor: called as ``predictor(windows, *args, **kwargs)`` (``predictor(windows, patch_coords, *args,
            **kwargs)`` with ``with_coord``), returning ``[n, C, *roi_size]`` logits for ``n`` windows.
        overlap: overlap fraction of neighbouring windows, one value or one per dimension, in ``[0, 1)``.
        mode: ``"constant"`` or ``"gaussian"`` blending.
        sigma_scale: Gaussian sigma as a fraction of the window size (``mode="gaussian"``).
        padding_mode: padding of inputs smaller than the window (``"constant"``, ``"reflect"``, ``"replicate"``,
            ``"circular"``).
        cval: fill value of constant padding.
        sw_device: device of the windows and of the tile accumulators (default: that of ``inputs``).
        device: device of the returned maps (default: that of ``inputs``).
        roi_weight_map: precomputed ``[*roi_size]`` window weights instead of ``mode`` / ``sigma_scale``.
        with_coord: pass the window coordinates (``[slice(b, b + 1), slice(None), *spatial]`` per window, in the
            padded input) to the predictor, as VISTA3D needs.
        slab_dim: spatial dimension along which the volume is completed slab by slab (0: first spatial one).
            Choose the longest one to hold the least; 0 needs the least extra bookkeeping.
        label_ids: label of each output channel (default ``1..C``); 0 is background.
        return_max_prob: also return the per-voxel maximum class probability (sigmoid of the highest logit).
        args: extra positional arguments of the predictor.
        auto_cache: keeps the measured per-window memory of ``sw_batch_size="auto"`` across calls.
        return_masks: also return one mask per class, each class thresholded on its own (logit > 0), bit-packed
            along the class axis (see the module notes); ``ClassMasks(masks[b], label_ids)`` reads image ``b``'s.
        kwargs: extra keyword arguments of the predictor (a ``condition`` tensor shaped like ``inputs`` is
            windowed with it).

    Returns:
        ``[N, 1, *spatial]`` labels on ``device`` (uint8 when every label id fits, else int16 / int32); with
        ``return_max_prob`` or ``return_masks`` a tuple of the labels, then the ``[N, 1, *spatial]`` float
        probabilities (dtype of ``inputs``) if asked for, then the ``[N, ceil(C / 8), *spatial]`` uint8 packed
        masks (class ``i`` in bit ``i % 8`` of channel ``i // 8``) if asked for.

    Raises:
        ValueError: for arguments that do not fit the input, a ``slab_dim`` out of range, or a predictor output
            that is not one ``[n, C, *roi_size]`` tensor.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.ndim < 3:
        raise ValueError(f"inputs must be a [N, C, *spatial] tensor, got {getattr(inputs, 'shape', type(inputs))}.")
    sw_batch_size = check_sw_batch_size(sw_batch_size)
    ndim = inputs.ndim - 2
    if not -ndim <= slab_dim < ndim:
        raise ValueError(f"slab_dim must be in [{-ndim}, {ndim - 1}] for {ndim} spatial dimensions, got {slab_dim}.")
    slab_dim %= ndim
    settings = SlidingWindowSettings(
        roi_size=roi_size,
        sw_batch_size=sw_batch_size,
        overlap=overlap,
        mode=mode,
        sigma_scale=sigma_scale,
        padding_mode=padding_mode,
        cval=cval,
        sw_device=sw_device,
        device=device,
        roi_weight_map=roi_weight_map,
        with_coord=with_coord,
    )
    device, sw_device = settings.result_device(inputs), settings.window_device(inputs)
    dtype = inputs.dtype
    kwargs = dict(kwargs)
    condition = kwargs.pop("condition", None)

    plan = plan_sliding_windows(inputs.shape[2:], roi_size, overlap, 1, padding_mode)
    inputs, condition, weight = pad_and_weight(inputs, condition, plan, settings)
    while weight.ndim < ndim + 2:
        weight = weight[None]

    slices = plan.slices
    order = sorted(range(len(slices)), key=lambda i: (slices[i][slab_dim].start, i))
    tiling = _Tiling(slices, plan.padded_size, order)
    pad_lo = [plan.pad_before(d) for d in range(ndim)]
    ids = None if label_ids is None else torch.as_tensor(label_ids, dtype=torch.int64).reshape(-1)
    n_img = inputs.shape[0]
    labels: torch.Tensor | None = None
    max_prob: torch.Tensor | None = None
    masks: torch.Tensor | None = None

    auto = None
    if sw_batch_size == "auto":  # tiles are small: no room reserved for a result on the device
        key = auto_cache_key(predictor, plan.roi_size, inputs, sw_device, args, kwargs)
        # the volume's size only keys the batch kept per size (see AutoBatchSize): nothing is reserved for it
        auto = AutoBatchSize(sw_device, auto_cache, key, math.prod(plan.padded_size), stitch_on_device=False)

    for b in range(n_img):
        acc: dict[tuple[int, ...], torch.Tensor] = {}
        cnt: dict[tuple[int, ...], torch.Tensor] = {}
        parts: dict[tuple[int, ...], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
        first = 0
        while first < len(order):
            left = len(order) - first
            n = max(1, min(auto.next(left), left)) if auto is not None else sw_batch_size
            batch = order[first : first + n]
            first += len(batch)
            coords = [[slice(b, b + 1), slice(None), *slices[w]] for w in batch]
            windows = torch.cat([inputs[tuple(c)] for c in coords]).to(sw_device)
            if condition is not None:
                kwargs["condition"] = torch.cat([condition[tuple(c)] for c in coords]).to(sw_device)
            if auto is not None:
                auto.before_forward(len(batch))
            out = predictor(windows, coords, *args, **kwargs) if with_coord else predictor(windows, *args, **kwargs)
            if auto is not None:
                auto.after_forward()
            if not isinstance(out, torch.Tensor) or out.shape[0] != len(batch) or tuple(out.shape[2:]) != plan.roi_size:
                raise ValueError(
                    "streaming label inference needs the predictor to return one [n, C, *roi_size] tensor for n "
                    f"windows; got {type(out).__name__} {tuple(getattr(out, 'shape', ()))} for {len(batch)} windows "
                    f"of size {plan.roi_size}. Use monai.inferers.sliding_window_inference for other outputs."
                )
            if labels is None:
                n_cls = out.shape[1]
                if ids is None:
                    ids = torch.arange(1, n_cls + 1)
                if ids.numel() != n_cls:
                    raise ValueError(f"label_ids has {ids.numel()} entries but the predictor returns {n_cls} channels.")
                lab_dtype = _label_dtype(int(ids.max()) if ids.numel() else 0)
                labels = torch.zeros((n_img, 1, *plan.image_size), dtype=lab_dtype, device=device)
                if return_max_prob:
                    max_prob = torch.zeros((n_img, 1, *plan.image_size), dtype=dtype, device=device)
                if return_masks:
                    shape = (n_img, packed_channels(n_cls), *plan.image_size)
                    masks = torch.zeros(shape, dtype=torch.uint8, device=device)
                ids = ids.to(sw_device)
            w_dev = weight.to(out.device)
            for j, w in enumerate(batch):
                p = out[j : j + 1]
                for t in tiling.window_tiles[w]:
                    box = tiling.box(t)
                    within = (slice(a - s.start, e - s.start) for (a, e), s in zip(box, slices[w]))
                    local = (slice(None), slice(None), *within)
                    if tiling.direct[t]:
                        if t not in acc:
                            shape = [e - a for a, e in box]
                            acc[t] = torch.zeros((1, p.shape[1], *shape), dtype=dtype, device=p.device)
                            cnt[t] = torch.zeros((1, 1, *shape), dtype=dtype, device=p.device)
                        acc[t].addcmul_(p[local], w_dev[local])
                        cnt[t].add_(w_dev[local])
                    else:
                        parts.setdefault(t, []).append((w, p[local].clone(), w_dev[local]))
                    if tiling.last[t] == w:
                        if t in parts:  # replay the window parts in the reference order
                            shape = [e - a for a, e in box]
                            acc[t] = torch.zeros((1, p.shape[1], *shape), dtype=dtype, device=p.device)
                            cnt[t] = torch.zeros((1, 1, *shape), dtype=dtype, device=p.device)
                            for _, pp, ww in sorted(parts.pop(t), key=lambda x: x[0]):
                                acc[t].addcmul_(pp, ww)
                                cnt[t].add_(ww)
                        _emit(
                            acc.pop(t)[0] / cnt.pop(t)[0], box, pad_lo, plan.image_size, b, ids, labels, max_prob, masks
                        )
            del out, p
            if auto is not None:
                auto.after_stitch()
    assert labels is not None
    if max_prob is None and masks is None:
        return labels
    extra: list[torch.Tensor] = []
    if max_prob is not None:
        # sigmoid once over the whole map: per-tile calls could round differently (vectorised vs scalar tails)
        extra.append(max_prob.sigmoid_())
    if masks is not None:
        extra.append(masks)
    return (labels, *extra)


def _emit(
    logits: torch.Tensor,
    box: list[tuple[int, int]],
    pad_lo: list[int],
    image_size: Sequence[int],
    b: int,
    ids: torch.Tensor,
    labels: torch.Tensor,
    max_prob: torch.Tensor | None,
    masks: torch.Tensor | None = None,
) -> None:
    """Write the labels (and highest logit, packed masks) of one complete tile, cropped to the unpadded image."""
    src, dst = [], []
    for (a, e), lo, n in zip(box, pad_lo, image_size):
        start, stop = max(a - lo, 0), min(e - lo, n)
        if start >= stop:
            return  # the tile lies in the padding
        src.append(slice(start + lo - a, stop + lo - a))
        dst.append(slice(start, stop))
    logits = logits[(slice(None), *src)]
    labels[(b, 0, *dst)] = logits_to_labels(logits, ids, dtype=torch.int64).to(device=labels.device, dtype=labels.dtype)
    if max_prob is not None:
        max_prob[(b, 0, *dst)] = logits.max(0).values.to(max_prob.device)
    if masks is not None:
        masks[(b, slice(None), *dst)] = pack_masks(logits).to(masks.device)
