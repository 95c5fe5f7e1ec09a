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
"""Point-prompt helpers used by VISTA3D: point sampling, point discs and connected-component filtering.

Connected components are labelled with ``scipy.ndimage.label`` for CPU tensors when scipy is installed, and
otherwise with a plain-torch label propagation that runs on the tensor's own device. Both number the
components in raster (C) order of their first voxel, which is also scikit-image's numbering, so every
function here gives the same result whichever labeller runs.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import torch
import torch.nn.functional as F

from monai.utils.module import optional_import

__all__ = [
    "get_largest_connected_component_mask",
    "keep_merge_components_with_points",
    "keep_components_with_positive_points",
    "convert_points_to_disc",
    "sample_points_from_label",
    "erode",
]


# --------------------------------------------------------------------------------------------------------------
# connected-component labelling
# --------------------------------------------------------------------------------------------------------------


def _scipy_ndimage() -> Any | None:
    """``scipy.ndimage`` when it can be imported, else ``None`` (the torch labeller is used instead)."""
    ndimage, ok = optional_import("scipy.ndimage")
    return ndimage if ok else None


def _min_filter_axis(x: torch.Tensor, axis: int) -> torch.Tensor:
    """Minimum over the 3-neighbourhood ``{-1, 0, +1}`` along one axis (edges see only the inside)."""
    n = x.shape[axis]
    out = x.clone()
    if n > 1:
        lo, hi = x.narrow(axis, 0, n - 1), x.narrow(axis, 1, n - 1)
        out.narrow(axis, 0, n - 1).copy_(torch.minimum(lo, hi))
        tail = out.narrow(axis, 1, n - 1)
        tail.copy_(torch.minimum(tail, lo))
    return out


def _neighbourhood_min(x: torch.Tensor, axis_groups: list[tuple[int, ...]]) -> torch.Tensor:
    """Minimum over the union of the unit cubes spanned by each axis group.

    An offset reaches at most ``c`` orthogonal hops exactly when its non-zero entries lie within some ``c``
    axes, so the ``c``-connectivity neighbourhood is the union over all ``c``-subsets of axes of the 3^c cube
    on them; each cube minimum is separable (one 1D pass per axis).
    """
    result = None
    for group in axis_groups:
        y = x
        for ax in group:
            y = _min_filter_axis(y, ax)
        result = y if result is None else torch.minimum(result, y)
    return x if result is None else result


def _bounding_box(m: torch.Tensor) -> tuple[slice, ...] | None:
    """The smallest box (one slice per axis) holding every ``True`` of a boolean tensor, ``None`` when there is
    none; the tensor's device is asked once (one copy of each axis's profile), not once per axis and end."""
    if m.numel() == 0:
        return None
    if m.ndim == 0:
        return () if bool(m) else None
    profiles = [m.amax(dim=[d for d in range(m.ndim) if d != axis]) if m.ndim > 1 else m for axis in range(m.ndim)]
    flat = torch.cat(profiles).cpu().numpy()
    box, start = [], 0
    for size in m.shape:
        hit = np.flatnonzero(flat[start : start + size])
        if not len(hit):
            return None
        box.append(slice(int(hit[0]), int(hit[-1]) + 1))
        start += size
    return tuple(box)


def _root_labels(m: torch.Tensor, connectivity: int, axes: Sequence[int] | None = None) -> torch.Tensor:
    """Each voxel of ``m`` labelled with the flat index of its component's first voxel (raster order); background
    holds ``m.numel()``. Neighbours differ along ``axes`` only (default: every axis), in at most ``connectivity``
    of them.

    Pointer hooking and jumping (as in Shiloach-Vishkin; on a GPU with Triton, the same rounds as two kernels:
    :py:mod:`monai.utils.label_rounds`): a voxel's label is the flat index of a voxel of its
    component; each round a voxel lowers its label and its label's own label to the smallest label in its
    neighbourhood (a whole tree moves at once, not one voxel a round), then every label is replaced by its
    label's label twice. A round that changes nothing leaves each component on its smallest index; the rounds run in
    pairs, and the second of a pair is compared with its start.
    """
    if m.is_cuda:
        # on a GPU the rounds are two Triton kernels where they run (imported here: CPU runs never load Triton)
        from monai.utils.label_rounds import root_labels_triton, root_labels_triton_supported
        from monai.utils.triton_support import unavailable_reason

        if root_labels_triton_supported(m) and unavailable_reason(m.device) is None:
            return root_labels_triton(m, connectivity, axes)
    numel = m.numel()
    index_dtype = torch.int32 if numel < 2**31 - 1 else torch.int64
    axis_groups = list(itertools.combinations(range(m.ndim) if axes is None else axes, connectivity))
    big = torch.tensor(numel, dtype=index_dtype, device=m.device)
    flat_m = m.reshape(-1)
    positions = torch.arange(numel, device=m.device)
    # labels of every voxel, and one more slot: the background's label points there, at itself
    labels = torch.cat([torch.where(flat_m, positions.to(index_dtype), big), big[None]])
    while True:
        for _ in range(2):  # two rounds a check: the check waits on the device, a round at the fixed point is a no-op
            before = labels.clone()
            near = torch.where(m, _neighbourhood_min(labels[:numel].view(m.shape), axis_groups), big).reshape(-1)
            labels[:numel] = torch.minimum(labels[:numel], near)
            # hook the voxel's old label too; a voxel that saw nothing lower (the background, and most voxels after
            # the first rounds) hooks its own slot, a no-op, so that millions do not contend for one address on a GPU
            lower = near < before[:numel]
            labels.scatter_reduce_(0, torch.where(lower, before[:numel].long(), positions), near, reduce="amin")
            labels = labels[labels.long()]
            labels = labels[labels.long()]
        if torch.equal(labels, before):  # the second round changed nothing
            return labels[:numel].view(m.shape)


def _label_torch(mask: torch.Tensor, connectivity: int, items: bool = False) -> tuple[torch.Tensor, int]:
    """Label connected components with plain torch operations on the mask's own device (``items``: see
    :func:`_label`)."""
    shape = mask.shape
    # size-1 axes have no neighbours along them, dropping them leaves the components unchanged
    m = mask.reshape([s for i, s in enumerate(shape) if s > 1 or (items and i == 0)])
    ids = torch.zeros(m.shape, dtype=torch.int64, device=mask.device)
    # every component lies inside the foreground's box, and raster order inside the box is the volume's
    box = _bounding_box(m)
    if box is None:
        return ids.reshape(shape), 0
    sub = m[box].contiguous()  # copied once: the rounds and the numbering read it flat
    axes = list(range(1 if items else 0, sub.ndim))
    roots = _root_labels(sub, max(1, min(connectivity, len(axes))), axes).reshape(-1)
    # a component's root is the one voxel labelled with its own index; numbering the roots in index order (a
    # running count) numbers the components in raster order, without sorting the labels
    flat_sub = sub.view(-1)
    is_root = roots == torch.arange(flat_sub.numel(), device=roots.device)
    rank = torch.cumsum(is_root, 0)
    ids[box] = torch.where(flat_sub, rank[torch.where(flat_sub, roots, 0).long()], 0).view(sub.shape)
    return ids.reshape(shape), int(rank[-1])


def _label(mask: torch.Tensor, connectivity: int | None = None, items: bool = False) -> tuple[torch.Tensor, int]:
    """Connected components of a boolean tensor of any dimension.

    Args:
        mask: boolean tensor; non-zero values of other dtypes count as foreground.
        connectivity: maximum number of orthogonal hops between neighbours, 1 to ``mask.ndim``
            (``None``: ``mask.ndim``, e.g. 26-connectivity in 3D), as in ``skimage.measure.label``.
        items: the first axis stacks separate items: no component crosses it (the connectivity counts the other
            axes, up to ``mask.ndim - 1``); the ids still run in raster order through the whole tensor.

    Returns:
        ``(labels, num)``: int64 tensor on ``mask.device`` with 0 for background and 1..num numbered in
        raster order of each component's first voxel; the number of components.
    """
    mask = mask if mask.dtype == torch.bool else mask != 0
    nd = mask.ndim - 1 if items else mask.ndim  # the axes components extend along
    connectivity = nd if connectivity is None else int(connectivity)
    if items and nd < 1:
        raise ValueError(f"items=True needs at least 2 axes (items, then the image's), got shape {tuple(mask.shape)}.")
    if nd > 0 and not 1 <= connectivity <= nd:
        raise ValueError(f"connectivity must be in [1, {nd}] for a {nd}D input, got {connectivity}.")
    ndimage = _scipy_ndimage() if mask.device.type == "cpu" else None
    if ndimage is None or nd == 0:
        return _label_torch(mask, connectivity, items)
    structure = ndimage.generate_binary_structure(nd, connectivity)
    if items:  # the same neighbourhood in each item, none across: the structure's middle slice along the items
        structure = np.stack([np.zeros_like(structure), structure, np.zeros_like(structure)])
    labels, num = ndimage.label(mask.numpy(), structure=structure)
    return torch.from_numpy(labels.astype(np.int64, copy=False)), int(num)


# --------------------------------------------------------------------------------------------------------------
# morphology and component filters
# --------------------------------------------------------------------------------------------------------------


def erode(mask: torch.Tensor, filter_size: int = 3, pad_value: float = 1.0) -> torch.Tensor:
    """Binary erosion with a cubic structuring element.

    Args:
        mask: binary mask, ``[N, C, H, W]`` or ``[N, C, H, W, D]``.
        filter_size: odd edge length of the structuring element.
        pad_value: value assumed outside the image (1: the border does not erode the mask).

    Returns:
        float tensor of 0/1 with the shape of ``mask``.
    """
    if mask.ndim not in (4, 5):
        raise ValueError(f"erode expects a [N, C, H, W] or [N, C, H, W, D] mask, got shape {tuple(mask.shape)}.")
    if filter_size % 2 == 0:
        raise ValueError(f"filter_size must be odd, got {filter_size}.")
    x = F.pad(mask.float(), [filter_size // 2] * (2 * (mask.ndim - 2)), mode="constant", value=float(pad_value))
    pool = F.max_pool2d if mask.ndim == 4 else F.max_pool3d
    # minimum pooling: a voxel survives only if its whole neighbourhood is foreground
    return (pool(-x, kernel_size=filter_size, stride=1) == -1.0).float()


def _to_tensor(x: Any) -> tuple[torch.Tensor, bool]:
    if isinstance(x, torch.Tensor):
        return x, False
    return torch.as_tensor(np.asarray(x)), True


def get_largest_connected_component_mask(img: Any, connectivity: int | None = None, num_components: int = 1) -> Any:
    """Mask of the largest connected component(s) of an image.

    Args:
        img: ``[H, W[, D]]`` tensor or array; non-zero voxels are foreground.
        connectivity: maximum number of orthogonal hops between neighbours, 1 to ``img.ndim``
            (``None``: full connectivity).
        num_components: how many of the largest components to keep.

    Returns:
        boolean mask, a tensor on ``img``'s device for a tensor input, an array for an array input.
    """
    t, was_numpy = _to_tensor(img)
    features, num = _label(t, connectivity)
    if num <= num_components:
        out = t != 0
    else:
        counts = torch.bincount(features.reshape(-1), minlength=num + 1)
        counts[0] = 0
        # rank on the host with numpy's argsort so ties between equal-sized components resolve as upstream
        order = np.argsort(counts.cpu().numpy())[::-1][:num_components]
        keep = torch.zeros(num + 1, dtype=torch.bool, device=features.device)
        keep[torch.as_tensor(order.copy(), device=features.device)] = True
        out = keep[features]
    return out.cpu().numpy() if was_numpy else out


@overload
def keep_merge_components_with_points(
    img_pos: torch.Tensor,
    img_neg: torch.Tensor | np.ndarray,
    point_coords: torch.Tensor | np.ndarray,
    point_labels: torch.Tensor | np.ndarray,
    pos_val: Sequence[int] = ...,
    neg_val: Sequence[int] = ...,
    margins: int = ...,
) -> torch.Tensor: ...


@overload
def keep_merge_components_with_points(
    img_pos: np.ndarray,
    img_neg: torch.Tensor | np.ndarray,
    point_coords: torch.Tensor | np.ndarray,
    point_labels: torch.Tensor | np.ndarray,
    pos_val: Sequence[int] = ...,
    neg_val: Sequence[int] = ...,
    margins: int = ...,
) -> np.ndarray: ...


def keep_merge_components_with_points(
    img_pos: torch.Tensor | np.ndarray,
    img_neg: torch.Tensor | np.ndarray,
    point_coords: torch.Tensor | np.ndarray,
    point_labels: torch.Tensor | np.ndarray,
    pos_val: Sequence[int] = (1, 3),
    neg_val: Sequence[int] = (0, 2),
    margins: int = 3,
) -> torch.Tensor | np.ndarray:
    """Keep the components of ``img_pos`` / ``img_neg`` touched by the positive / negative points.

    VISTA3D uses this to decide which parts of the automatic segmentation the point branch may overwrite.
    Components are found on the whole ``[B, 1, H, W, D]`` array at once with connectivity 3 (as upstream
    does), so a component may link voxels of neighbouring batch items. A point takes the component with the
    highest id inside the cube of half-width ``m`` around it, for the smallest ``m < margins`` that meets one.

    Args:
        img_pos: boolean ``[B, 1, H, W, D]`` candidate regions for the positive points.
        img_neg: boolean ``[B, 1, H, W, D]`` candidate regions for the negative points.
        point_coords: ``[B, N, 3]`` point coordinates (voxels).
        point_labels: ``[B, N]`` point labels; values outside ``pos_val`` and ``neg_val`` (e.g. -1) are skipped.
        pos_val: labels of positive points.
        neg_val: labels of negative points.
        margins: number of cube sizes tried around a point that is not inside a component.

    Returns:
        boolean ``[B, 1, H, W, D]`` tensor on ``img_pos``'s device (a numpy array when ``img_pos`` is one).
    """
    as_numpy = isinstance(img_pos, np.ndarray)
    img_pos, img_neg = torch.as_tensor(img_pos), torch.as_tensor(img_neg)
    if img_pos.shape != img_neg.shape or img_pos.ndim != 5:
        raise ValueError(
            f"img_pos and img_neg must both be [B, 1, H, W, D], got {tuple(img_pos.shape)} and {tuple(img_neg.shape)}."
        )
    if img_pos.dtype != torch.bool or img_neg.dtype != torch.bool:
        raise ValueError(f"img_pos and img_neg must be bool tensors, got {img_pos.dtype} and {img_neg.dtype}.")
    # both masks labelled in one pass (half the device round trips of the labeller), stacked along the batch axis;
    # the ids of each part keep their raster order
    b = img_pos.shape[0]
    if b == 1:  # one item each: two separate 3D items
        features, _ = _label(torch.cat([img_pos, img_neg.to(img_pos.device)]), connectivity=3, items=True)
        features_pos, features_neg = features[:1], features[1:]
    else:  # components cross neighbouring items (as upstream), not the empty item between the two masks
        both = torch.cat([img_pos, torch.zeros_like(img_pos[:1]), img_neg.to(img_pos.device)])
        features, _ = _label(both, connectivity=3)
        features_pos, features_neg = features[:b], features[b + 1 :]
    outs = torch.zeros(img_pos.shape, dtype=torch.bool, device=img_pos.device)
    coords = torch.as_tensor(point_coords).detach().float().round().int().cpu().tolist()
    labels = torch.as_tensor(point_labels).detach().cpu().tolist()
    size = features_pos.shape[-3:]
    # the highest id in each (point, margin) window, read from the device in one copy, not one read a window
    windows, maxima = [], []
    for bs, (pts, lbs) in enumerate(zip(coords, labels)):
        for j, ((x, y, z), lb) in enumerate(zip(pts, lbs)):
            if lb not in pos_val and lb not in neg_val:
                continue
            features = features_pos if lb in pos_val else features_neg
            for margin in range(margins):
                # python slice semantics (including negative stops) as upstream
                window = features[
                    bs,
                    0,
                    max(x - margin, 0) : min(x + margin + 1, size[0]),
                    max(y - margin, 0) : min(y + margin + 1, size[1]),
                    max(z - margin, 0) : min(z + margin + 1, size[2]),
                ]
                if window.numel():
                    windows.append((bs, j, features))
                    maxima.append(window.max())
    decided: set[tuple[int, int]] = set()
    for (bs, j, features), index in zip(windows, torch.stack(maxima).tolist() if maxima else []):
        if (bs, j) not in decided and index > 0:  # a point's smallest margin that meets a component decides
            decided.add((bs, j))
            outs[bs] |= features[bs] == index
    return outs.numpy() if as_numpy else outs


def keep_components_with_positive_points(
    img: torch.Tensor, point_coords: torch.Tensor, point_labels: torch.Tensor
) -> torch.Tensor:
    """Suppress foreground components that contain no positive point (point-only post-processing).

    For each prompt with at least one positive point (label 1 or 3), the foreground (``img > 0``) components
    (26-connectivity) hit by a positive point are kept; every other foreground voxel is set to the mean of
    the non-NaN values outside the kept components. ``img`` is modified in place.

    Args:
        img: ``[1, B, H, W, D]`` VISTA3D logits (may hold NaN).
        point_coords: ``[B, N, 3]`` point coordinates.
        point_labels: ``[B, N]`` point labels.

    Returns:
        ``img``.
    """
    for c in range(len(point_coords)):
        lbs = point_labels[c]
        pos = (lbs == 3) | (lbs == 1)
        if not bool(pos.any()):
            continue
        # label-3 points first, then label-1, matching upstream's lookup order
        coords = point_coords[c, lbs == 3].tolist() + point_coords[c, lbs == 1].tolist()
        chan = img[0, c]
        not_nan = ~torch.isnan(chan)
        fg = chan > 0  # NaN compares False
        features, _ = _label(fg, connectivity=3)
        features = features.to(chan.device)
        at = torch.tensor([[round(v) for v in p[:3]] for p in coords], device=features.device)
        # a point in the last half voxel rounds to one past the end (MONAI 1.6.1 raises IndexError there): it lies
        # in the last voxel, as in the network's merge
        at = torch.minimum(at.clamp(min=0), torch.tensor(features.shape[-3:], device=features.device) - 1)
        hit = features[at[:, 0], at[:, 1], at[:, 2]]  # the components under the positive points (0: none)
        keep = torch.isin(features, hit) & (features > 0)
        outside = ~keep & not_nan
        fill_in = chan[outside].mean()
        chan.masked_fill_(fg & ~keep, fill_in)
    return img


# --------------------------------------------------------------------------------------------------------------
# point prompts
# --------------------------------------------------------------------------------------------------------------


def convert_points_to_disc(
    image_size: Sequence[int], point: torch.Tensor, point_label: torch.Tensor, radius: int = 2, disc: bool = False
) -> torch.Tensor:
    """Render 3D points as balls: channel 0 for negative points, channel 1 for positive points.

    Args:
        image_size: spatial size ``(H, W, D)`` of the output.
        point: ``[B, N, 3]`` point coordinates.
        point_label: ``[B, N]`` labels; 0 and 2 are negative, -1 is padding (skipped), others positive.
        radius: ball radius (gaussian sigma when ``disc`` is False).
        disc: hard balls (squared distance < ``radius**2``) instead of gaussians ``exp(-d^2 / (2 radius^2))``.

    Returns:
        float32 ``[B, 2, H, W, D]`` on ``point``'s device, the sum of the balls of each channel.
    """
    size = [int(s) for s in image_size]
    if len(size) != 3:
        raise ValueError(f"image_size must have 3 entries (H, W, D), got {image_size}.")
    bsz, npts = point.shape[:2]
    masks = torch.zeros([bsz, 2, *size], device=point.device)
    axes = [torch.arange(s, dtype=torch.float32, device=point.device) for s in size]
    if torch.compiler.is_exporting():  # the labels are not known while tracing: every click at once
        return _discs_at_once(axes, point, point_label, radius, disc)
    labels = point_label.detach().cpu().tolist()
    for b in range(bsz):
        for n in range(npts):
            lb = labels[b][n]
            if not lb > -1:
                continue
            channel = 0 if lb in (0, 2) else 1
            p = point[b, n]
            # separable squared distance: no [3, H, W, D] coordinate grid is built
            dist2 = (axes[0] - p[0:1]).pow(2).view(-1, 1, 1) + (axes[1] - p[1:2]).pow(2).view(1, -1, 1)
            dist2 = dist2 + (axes[2] - p[2:3]).pow(2).view(1, 1, -1)
            if disc:
                masks[b, channel] += dist2 < radius**2
            else:
                masks[b, channel] += torch.exp(-dist2 / (2 * radius**2))
    return masks


def _discs_at_once(
    axes: list[torch.Tensor], point: torch.Tensor, point_label: torch.Tensor, radius: int, disc: bool
) -> torch.Tensor:
    """:func:`convert_points_to_disc` without reading the labels in Python (for ``torch.export``): the balls of
    all ``B x N`` clicks are built at once, so it takes ``N`` times the memory of one output channel."""
    p = point.to(torch.float32)
    dist2 = (axes[0] - p[..., 0:1]).pow(2)[..., :, None, None] + (axes[1] - p[..., 1:2]).pow(2)[..., None, :, None]
    dist2 = dist2 + (axes[2] - p[..., 2:3]).pow(2)[..., None, None, :]  # [B, N, H, W, D]
    balls = (dist2 < radius**2).to(torch.float32) if disc else torch.exp(-dist2 / (2 * radius**2))
    negative = (point_label == 0) | (point_label == 2)
    positive = (point_label > -1) & ~negative
    weights = torch.stack([negative, positive], dim=2).to(torch.float32)  # [B, N, 2]
    return torch.einsum("bnc,bnhwd->bchwd", weights, balls)


def sample_points_from_label(
    labels: torch.Tensor,
    label_set: Sequence[int],
    max_ppoint: int = 1,
    max_npoint: int = 0,
    device: torch.device | str | None = "cpu",
    use_center: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample point prompts for each label id from a label map.

    Positive points come from the largest component of the eroded label (the whole label when erosion
    removes it); negative points anywhere outside the label. Randomness comes from python's ``random``
    module (``random.seed`` makes it reproducible), drawn in the same order as upstream MONAI.

    Args:
        labels: ``[1, 1, H, W, D]`` label map.
        label_set: label ids to sample for, one prompt each.
        max_ppoint: number of positive points per prompt (fewer if the label is smaller).
        max_npoint: number of negative points per prompt (drawn with replacement).
        device: device of the returned tensors (``None``: cuda when available, else cpu).
        use_center: take the positive points closest to the label's centroid instead of random ones.

    Returns:
        ``(point, point_label)``: ``[B, N, 3]`` coordinates and ``[B, N]`` labels (1 positive, 0 negative,
        -1 padding at coordinate 0), ``B = len(label_set)`` and ``N = max_ppoint + max_npoint``. A label id
        absent from ``labels`` gives a prompt of padding only.
    """
    if labels.ndim != 5 or labels.shape[0] != 1 or labels.shape[1] != 1:
        raise ValueError(f"labels must be [1, 1, H, W, D] (batch size 1), got shape {tuple(labels.shape)}.")
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lab = labels[0, 0]
    present = lab.unique().cpu().tolist()
    npts = max_ppoint + max_npoint
    points, point_labels = [], []
    for label_id in label_set:
        if label_id not in present:
            points.append(torch.zeros(npts, 3).to(device))
            point_labels.append(torch.zeros(npts).to(device) - 1)
            continue
        pmask = lab == int(label_id)
        core = get_largest_connected_component_mask(erode(pmask[None, None])[0, 0])
        ppts = torch.nonzero(core).to(device)
        if len(ppts) == 0:
            ppts = torch.nonzero(pmask).to(device)
        npts_all = torch.nonzero(~pmask).to(device)
        num_p = min(len(ppts), max_ppoint)
        num_n = min(len(npts_all), max_npoint)
        pad = npts - num_p - num_n
        if use_center:
            dist = ((ppts - ppts.float().mean(0)) ** 2).sum(-1)
            order = torch.sort(dist)[1][:num_p]
        else:
            perm = list(range(len(ppts)))
            random.shuffle(perm)
            order = torch.tensor(perm[:num_p], dtype=torch.int64)
        neg_idx = random.choices(range(len(npts_all)), k=num_n)
        rows = [ppts[order.to(ppts.device)], npts_all[torch.tensor(neg_idx, dtype=torch.int64).to(ppts.device)]]
        rows.append(torch.zeros(pad, 3, dtype=ppts.dtype, device=ppts.device))
        points.append(torch.cat(rows))
        point_labels.append(torch.tensor([1] * num_p + [0] * num_n + [-1] * pad).to(device))
    return torch.stack(points), torch.stack(point_labels)
