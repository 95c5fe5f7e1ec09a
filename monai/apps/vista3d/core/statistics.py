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
"""Per-structure statistics of a label map over its CT: voxels, volume, HU mean / median / std / min / max,
centroid, bounding box, and whether the structure touches the image border.

Everything is computed where the label map is (the GPU after a segmentation), for all structures at once: the
volume is walked in slabs of ``x``-planes, each slab adding to per-label histograms (``bincount``) and
``scatter`` reductions, so the cost grows with the voxels, not with the number of structures. The median is exact:
a histogram of (label, HU) when the values are integers (a CT's always are), else one sort of (label, value) keys.

The definitions follow TotalSegmentator's ``get_basic_statistics`` where it has them, so that the numbers agree:
the volume is the voxel count times the voxel volume (mm³), the intensity mean is the plain mean of the CT's values
over the structure. Two differences: TotalSegmentator casts the CT to int16 before averaging (the same for the
integer values of a CT); and it drops (volume and intensity 0) every structure within 3 voxels of any face of the
image by default, where this module reports ``touches_border`` (a voxel on a face) and drops a structure only with
``exclude_border_structures`` (then by TotalSegmentator's 3-voxel rule, its values ``null`` rather than 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from monai.apps.vista3d.labels import label_names

__all__ = ["structure_statistics", "statistics_document", "label_centroids", "gather_totals", "StructureTotals",
           "BORDER_MARGIN", "SLAB_VOXELS"]

#: TotalSegmentator's border band: a structure with a voxel this close to a face is left out by its rule
BORDER_MARGIN = 3
#: voxels per slab of the walk (each slab's keys and float64 copies are a few hundred MB at most)
SLAB_VOXELS = 1 << 24
#: widest range of integer values whose median is taken from a histogram rather than a sort
_HISTOGRAM_RANGE = 1 << 16


@dataclass
class StructureTotals:
    """What one walk over the volume gathers, per label id (index) on the label map's device.

    Attributes:
        axis_counts: per axis, ``[K, N_axis]`` voxel counts of each label in each plane across that axis.
        sums: ``[K]`` float64 sums of the values.
        squares: ``[K]`` float64 sums of the squared values.
        mins: ``[K]`` smallest value (``+inf`` where absent).
        maxs: ``[K]`` largest value (``-inf`` where absent).
        medians: ``[K]`` float64 median (NaN where absent or for the background).
    """

    axis_counts: list[torch.Tensor]
    sums: torch.Tensor
    squares: torch.Tensor
    mins: torch.Tensor
    maxs: torch.Tensor
    medians: torch.Tensor

    @property
    def counts(self) -> torch.Tensor:
        return self.axis_counts[0].sum(dim=1)


def structure_statistics(
    image: torch.Tensor,
    labels: torch.Tensor,
    affine: np.ndarray,
    names: Mapping[int, str] | None = None,
    exclude_border_structures: bool = False,
) -> dict[str, Any]:
    """The statistics of every structure present in ``labels`` (every id but 0), as ``statistics.json`` holds them.

    Args:
        image: the CT, ``[X, Y, Z]`` or ``[1, X, Y, Z]``, in HU; moved to ``labels``' device when elsewhere.
        labels: the label map on the same grid, integer ids (any integer or floating type holding integers).
        affine: the grid's ``[4, 4]`` voxel-to-world (RAS mm) matrix.
        names: label id -> structure name (VISTA3D's by default); an id without one is ``label_<id>``.
        exclude_border_structures: TotalSegmentator's rule: a structure within :data:`BORDER_MARGIN` voxels of a face
            is reported with ``excluded_at_border: true`` and ``null`` volume and intensities.

    Returns:
        ``{"spacing_mm", "voxel_volume_mm3", "units", "border_rule", "structures": {name: {...}}}``; each structure
        has ``id``, ``voxels``, ``volume_mm3``, ``mean``, ``median``, ``std``, ``min``, ``max`` (HU; std is the
        population's, as numpy's), ``centroid`` (``voxel`` indices and ``world`` RAS mm), ``bbox`` (inclusive
        ``min`` and ``max`` voxel indices) and ``touches_border`` (a voxel on a face of the image).

    Raises:
        ValueError: image and label map of different shapes, or negative label ids.
    """
    labels = labels[0] if labels.ndim == 4 else labels
    image = image[0] if image.ndim == 4 else image
    if tuple(image.shape) != tuple(labels.shape) or labels.ndim != 3:
        raise ValueError(f"the label map {tuple(labels.shape)} and the image {tuple(image.shape)} are not on one grid; "
                         "give the label map written for this image.")
    totals = gather_totals(image.to(labels.device), labels)
    shape = (labels.shape[0], labels.shape[1], labels.shape[2])
    return _report(totals, shape, np.asarray(affine, dtype=np.float64),
                   label_names() if names is None else dict(names), exclude_border_structures)


def gather_totals(image: torch.Tensor, labels: torch.Tensor) -> StructureTotals:
    """One walk over the volume in slabs of ``x``-planes: per-label plane counts along each axis, and per label
    either a histogram of its (integer) values, from which every intensity statistic is read exactly, or sums,
    squares, extremes and the values themselves for their medians."""
    dev = labels.device
    k = _label_count(labels)
    if labels.numel() and int(labels.min()) < 0:
        raise ValueError("the label map has negative ids; label ids are 0 (background) and up.")
    slabs = _slabs(labels.shape)
    vmin, vmax = (float(v) for v in torch.aminmax(image)) if image.numel() else (0.0, 0.0)
    width = int(vmax - vmin) + 1 if math.isfinite(vmax - vmin) and vmax - vmin < _HISTOGRAM_RANGE else 0
    if width and image.dtype.is_floating_point:
        width *= all(bool(torch.equal(image[a:b], torch.round(image[a:b]))) for a, b in slabs)
    planes = _PlaneCounts(labels.shape, k, dev)
    acc = _Histogram(k, width, vmin, dev) if width else _Moments(k, dev)
    for x0, x1 in slabs:
        lab = labels[x0:x1].to(torch.int32)
        planes.add(lab, x0)
        acc.add(lab.reshape(-1), image[x0:x1].reshape(-1))
    return acc.totals(planes.per_label())


def statistics_document(image: str | None, label_map: str, stats: dict[str, Any]) -> bytes:
    """The statistics file (``--statistics``, ``vista3d statistics -o``): the CT's and the label map's paths, then
    ``stats``, as indented JSON."""
    return json.dumps({"image": image, "label_map": label_map, **stats}, indent=1).encode()


def label_centroids(labels: torch.Tensor) -> torch.Tensor:
    """``[K, 3]`` voxel centroid of every label id below ``K = max + 1`` (NaN where absent), from the same per-plane
    counts as the statistics: no intensity work, no loop over labels."""
    labels = labels[0] if labels.ndim == 4 else labels
    planes = _PlaneCounts(labels.shape, _label_count(labels), labels.device)
    for x0, x1 in _slabs(labels.shape):
        planes.add(labels[x0:x1].to(torch.int32), x0)
    counts = planes.per_label()
    present = (counts[0].sum(dim=1) > 0)[:, None]
    return torch.where(present, _centroids(counts), math.nan)


def _label_count(labels: torch.Tensor) -> int:
    """``K``: the label ids ``0 .. K - 1`` that the per-label tensors of a walk over ``labels`` index."""
    return int(labels.max()) + 1 if labels.numel() else 1


def _slabs(shape: Any) -> list[tuple[int, int]]:
    """The ``[x0, x1)`` slabs of ``x``-planes a walk takes, :data:`SLAB_VOXELS` voxels at most (one plane at least)."""
    nx, ny, nz = shape
    step = max(1, SLAB_VOXELS // max(1, ny * nz))
    return [(x0, min(nx, x0 + step)) for x0 in range(0, nx, step)]


def _centroids(axis_counts: list[torch.Tensor]) -> torch.Tensor:
    """``[K, 3]`` mean voxel index per label from its per-plane counts along each axis."""
    total = axis_counts[0].sum(dim=1).clamp(min=1).to(torch.float64)
    return torch.stack([(c.to(torch.float64) * torch.arange(c.shape[1], device=c.device)).sum(dim=1)
                        for c in axis_counts], dim=1) / total[:, None]


class _PlaneCounts:
    """Voxel counts of each label in each plane across each axis, added slab by slab of ``x``-planes: one keyed
    ``bincount`` per axis (key = label + K * plane)."""

    def __init__(self, shape: Any, k: int, dev: torch.device):
        self.shape, self.k = tuple(shape), k
        self.counts = [torch.zeros(n * k, dtype=torch.int64, device=dev) for n in self.shape]
        nx, ny, nz = self.shape
        self.planes = [(k * torch.arange(n, dtype=torch.int32, device=dev)).view(view) for n, view in
                       ((nx, (-1, 1, 1)), (ny, (1, ny, 1)), (nz, (1, 1, nz)))]

    def add(self, lab: torch.Tensor, x0: int) -> None:
        x1 = x0 + lab.shape[0]
        for counts, plane in zip(self.counts, (self.planes[0][x0:x1], self.planes[1], self.planes[2])):
            counts += torch.bincount((lab + plane).reshape(-1), minlength=counts.numel())

    def per_label(self) -> list[torch.Tensor]:
        """Per axis, ``[K, N_axis]``."""
        return [c.view(n, self.k).T for c, n in zip(self.counts, self.shape)]


class _Histogram:
    """Per-label histograms of integer values in ``[vmin, vmin + width)``: sums, squares, extremes and exact
    medians are all read from them (one ``bincount`` per slab)."""

    def __init__(self, k: int, width: int, vmin: float, dev: torch.device):
        self.k, self.width, self.vmin = k, width, vmin
        self.hist = torch.zeros(k * width, dtype=torch.int64, device=dev)

    def add(self, lab: torch.Tensor, val: torch.Tensor) -> None:
        offset = (val - self.vmin).to(torch.int32)
        self.hist += torch.bincount(torch.add(offset, lab, alpha=self.width), minlength=self.hist.numel())

    def totals(self, axis_counts: list[torch.Tensor]) -> StructureTotals:
        hist = self.hist.view(self.k, self.width)
        values = self.vmin + torch.arange(self.width, dtype=torch.float64, device=hist.device)
        weights = hist.to(torch.float64)
        first, last = _first_last(hist)  # the smallest and largest value bins in use
        first, last = first.clamp(max=self.width - 1), last.clamp(min=0)
        counts = hist.sum(dim=1)
        running = hist.cumsum(dim=1)
        ranks = torch.stack([(counts - 1) // 2, counts // 2], dim=1).clamp(min=0)
        at = torch.searchsorted(running, ranks, right=True).clamp(max=self.width - 1)
        medians = torch.where(counts > 0, self.vmin + at.to(torch.float64).mean(dim=1), math.nan)
        medians[0] = math.nan
        return StructureTotals(axis_counts, weights @ values, weights @ (values * values),
                               (self.vmin + first).to(torch.float32), (self.vmin + last).to(torch.float32), medians)


class _Moments:
    """Sums, squares and extremes per label by ``scatter``, and the foreground's values kept for one sort: for
    values that are not integers in a short range."""

    def __init__(self, k: int, dev: torch.device):
        self.sums = torch.zeros(k, dtype=torch.float64, device=dev)
        self.squares = torch.zeros(k, dtype=torch.float64, device=dev)
        self.mins = torch.full((k,), math.inf, dtype=torch.float32, device=dev)
        self.maxs = torch.full((k,), -math.inf, dtype=torch.float32, device=dev)
        self.fg_labels: list[torch.Tensor] = []
        self.fg_values: list[torch.Tensor] = []

    def add(self, lab: torch.Tensor, val: torch.Tensor) -> None:
        lab, val = lab.to(torch.int64), val.to(torch.float32)
        wide = val.to(torch.float64)
        self.sums.index_add_(0, lab, wide)
        self.squares.index_add_(0, lab, wide * wide)
        self.mins.scatter_reduce_(0, lab, val, "amin")
        self.maxs.scatter_reduce_(0, lab, val, "amax")
        fg = lab > 0
        self.fg_labels.append(lab[fg])
        self.fg_values.append(val[fg])

    def totals(self, axis_counts: list[torch.Tensor]) -> StructureTotals:
        counts = axis_counts[0].sum(dim=1)
        medians = _medians(torch.cat(self.fg_labels), torch.cat(self.fg_values), counts)
        return StructureTotals(axis_counts, self.sums, self.squares, self.mins, self.maxs, medians)


def _medians(lab: torch.Tensor, val: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Exact per-label medians (numpy's: the mean of the two middle values for an even count) of the foreground
    values; NaN for labels without voxels."""
    k = counts.numel()
    out = torch.full((k,), math.nan, dtype=torch.float64, device=val.device)
    if not val.numel():
        return out
    fg_counts = counts.clone()
    fg_counts[0] = 0
    present = fg_counts > 0
    lo_rank, hi_rank = (fg_counts - 1) // 2, fg_counts // 2
    # one sort of (label, value) keys: the label in the high 32 bits, the value's bits made order-preserving
    bits = val.contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits) + (1 << 31)
    keys = torch.sort(lab * (1 << 32) + ordered).values
    low = (keys & 0xFFFFFFFF) - (1 << 31)
    sorted_vals = torch.where(low < 0, low ^ 0x7FFFFFFF, low).to(torch.int32).view(torch.float32)
    start = torch.cumsum(fg_counts, 0) - fg_counts
    last = max(0, sorted_vals.numel() - 1)
    lo = sorted_vals[(start + lo_rank).clamp(0, last)].to(torch.float64)
    hi = sorted_vals[(start + hi_rank).clamp(0, last)].to(torch.float64)
    med = (lo + hi) / 2
    return torch.where(present, med, out)


def _first_last(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per label (row), the first and last plane holding one of its voxels."""
    n = counts.shape[1]
    idx = torch.arange(n, device=counts.device)
    has = counts > 0
    first = torch.where(has, idx, n).amin(dim=1)
    last = torch.where(has, idx, -1).amax(dim=1)
    return first, last


def _report(
    totals: StructureTotals, shape: tuple[int, int, int], affine: np.ndarray, names: dict[int, str], exclude: bool
) -> dict[str, Any]:
    """The JSON-ready statistics from the walk's totals (a few hundred numbers moved to the host)."""
    counts = totals.counts
    centroid = _centroids(totals.axis_counts)
    bounds = [_first_last(c) for c in totals.axis_counts]
    host = {name: t.cpu().numpy() for name, t in {
        "counts": counts, "sums": totals.sums, "squares": totals.squares, "mins": totals.mins, "maxs": totals.maxs,
        "medians": totals.medians, "centroid": centroid,
        "first": torch.stack([b[0] for b in bounds], dim=1), "last": torch.stack([b[1] for b in bounds], dim=1),
    }.items()}
    voxel_volume = float(abs(np.linalg.det(affine[:3, :3])))
    size = np.asarray(shape)
    structures: dict[str, Any] = {}
    for label_id in np.flatnonzero(host["counts"]):
        if label_id == 0:
            continue
        n = int(host["counts"][label_id])
        first, last = host["first"][label_id], host["last"][label_id]
        mean = host["sums"][label_id] / n
        var = max(0.0, host["squares"][label_id] / n - mean * mean)
        cut = bool(np.any(first < BORDER_MARGIN) or np.any(last > size - 1 - BORDER_MARGIN))
        voxel = host["centroid"][label_id]
        entry: dict[str, Any] = {
            "id": int(label_id), "voxels": n, "volume_mm3": round(n * voxel_volume, 4),
            "mean": round(float(mean), 5), "median": round(float(host["medians"][label_id]), 5),
            "std": round(math.sqrt(var), 5), "min": float(host["mins"][label_id]), "max": float(host["maxs"][label_id]),
            "centroid": {"voxel": [round(float(v), 3) for v in voxel],
                         "world": [round(float(v), 3) for v in (affine @ np.append(voxel, 1.0))[:3]]},
            "bbox": {"min": [int(v) for v in first], "max": [int(v) for v in last]},
            "touches_border": bool(np.any(first == 0) or np.any(last == size - 1)),
        }
        if exclude:
            entry["excluded_at_border"] = cut
            if cut:
                entry.update({key: None for key in ("volume_mm3", "mean", "median", "std", "min", "max")})
        name = names.get(int(label_id), f"label_{int(label_id)}")
        structures[name if name not in structures else f"{name} ({int(label_id)})"] = entry
    spacing = np.linalg.norm(affine[:3, :3], axis=0)
    rule = (f"excluded_at_border: a voxel within {BORDER_MARGIN} voxels of a face (TotalSegmentator's rule); such "
            "structures have null volume and intensities" if exclude else "touches_border: a voxel on a face")
    return {"spacing_mm": [round(float(s), 6) for s in spacing], "voxel_volume_mm3": round(voxel_volume, 6),
            "units": {"volume": "mm3", "intensity": "HU", "centroid.world": "RAS mm", "bbox": "voxel indices"},
            "border_rule": rule, "structures": structures}
