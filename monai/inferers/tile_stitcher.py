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
"""Stitching tile by tile: each part of the volume is reduced as soon as its windows are in, then freed.

Blending every window into full-size outputs holds ``C`` full-size channels when often only a reduction of them is
wanted (a label map, a maximum). :class:`TileStitcher` cuts the padded volume into *tiles* at window borders (at
least half a window apart), accumulates the parts of the windows that overlap a tile while they arrive, and hands
the tile to a :class:`TileReduction` as soon as its last window has been added, then frees it. Windows run slab by
slab along ``slab_dim``, so only the tiles of the slabs still receiving windows are held. The bookkeeping is in
closed form over the plan's grid of window starts: its size, and the memory held, do not grow with the number of
windows (a high overlap), only with the volume and the window size.

Exactness: for every voxel the weighted window outputs are summed in the same order, with the same operations and
dtype as :class:`~monai.inferers.stitcher.WindowStitcher`, and divided by the same weight sum, so a tile holds
the full blended outputs bit for bit (as long as the predictor's output for a window does not depend on the other
windows of its batch). With ``slab_dim=0`` the running order is the plan's order and every tile is accumulated
directly. For another ``slab_dim`` a voxel covered by windows of two slabs would be summed in another order, so
such tiles keep the weighted-out parts of their windows and sum them in the plan's order when complete (more
memory for those tiles, growing with the overlap; the VISTA3D pipeline streams with ``slab_dim=0``).
Accumulators take the input's dtype.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from monai.inferers.windows import SlidingWindowPlan

__all__ = ["TileReduction", "TileStitcher", "Tiling"]

Tile = tuple[int, ...]


class TileReduction(Protocol):
    """What :class:`TileStitcher` hands each complete tile to."""

    def add(self, image: int, region: tuple[slice, ...], outputs: torch.Tensor) -> None:
        """The blended ``[C, *tile]`` outputs of ``region`` (spatial slices of the unpadded input) of ``image``."""
        ...

    def finish(self) -> Any:
        """The result of the pass, once every tile has been added."""
        ...


class Tiling:
    """Tiles of the padded volume, and which windows overlap each tile, in closed form.

    The windows of a plan lie on a grid (every combination of the starts along each dimension), so which windows
    overlap a tile, and which of them runs last, follow from the starts along each dimension alone: nothing is
    stored per window or per (window, tile) pair, and the bookkeeping's size depends only on the volume and the
    window size, not on the number of windows (an overlap of 0.99 has thousands of windows per slab). Tiles are cut
    at window borders at least half a window apart, so they stay few even when the windows start every voxel.

    Args:
        slices: spatial slices of each window in the padded volume.
        size: spatial size of the padded volume.
        slab_dim: the spatial dimension whose window starts lead the running order (then the plan's order).
    """

    def __init__(self, slices: Sequence[tuple[slice, ...]], size: Sequence[int], slab_dim: int = 0):
        ndim = len(size)
        self.slab_dim = slab_dim % ndim
        self.roi = [slices[0][d].stop - slices[0][d].start for d in range(ndim)]
        self.starts = [sorted({s[d].start for s in slices}) for d in range(ndim)]
        self.bounds = [self._cuts(d, int(size[d])) for d in range(ndim)]
        # per dimension and tile index: the last window start overlapping the tile, and how many starts do
        self.last_start: list[list[int]] = []
        self.count: list[list[int]] = []
        for d in range(ndim):
            firsts = [bisect.bisect_right(self.starts[d], a - self.roi[d]) for a in self.bounds[d][:-1]]
            stops = [bisect.bisect_left(self.starts[d], e) for e in self.bounds[d][1:]]
            self.last_start.append([self.starts[d][j - 1] for j in stops])
            self.count.append([j - i for i, j in zip(firsts, stops)])

    def _cuts(self, d: int, size: int) -> list[int]:
        """Window borders along ``d``, each at least half a window after the one before (and the volume's ends)."""
        gap = max(1, self.roi[d] // 2)
        borders = sorted({0, size} | set(self.starts[d]) | {s + self.roi[d] for s in self.starts[d]})
        cuts = [0]
        for b in borders[1:-1]:
            if b - cuts[-1] >= gap and size - b >= gap:
                cuts.append(b)
        return cuts + [size]

    def window_tiles(self, sl: tuple[slice, ...]) -> Iterator[Tile]:
        """The tiles that the window at ``sl`` overlaps."""
        ranges = [
            range(bisect.bisect_right(b, s.start) - 1, bisect.bisect_left(b, s.stop))
            for b, s in zip(self.bounds, sl)
        ]
        return itertools.product(*ranges)

    def is_last(self, t: Tile, sl: tuple[slice, ...]) -> bool:
        """Whether the window at ``sl`` is the last of tile ``t``'s windows to run.

        The running order sorts by the start along ``slab_dim``, then by the plan's row-major order; over a grid
        of windows both put last the window with the highest start along every dimension.
        """
        return all(s.start == self.last_start[d][i] for d, (i, s) in enumerate(zip(t, sl)))

    def direct(self, t: Tile) -> bool:
        """Whether tile ``t``'s windows run in the plan's order (then they are summed as they arrive).

        The orders differ only where two of the tile's windows differ in start along a dimension before
        ``slab_dim``.
        """
        return all(self.count[d][t[d]] == 1 for d in range(self.slab_dim))

    def box(self, t: Tile) -> list[tuple[int, int]]:
        """``(start, stop)`` of tile ``t`` along each spatial dimension of the padded volume."""
        return [(self.bounds[d][i], self.bounds[d][i + 1]) for d, i in enumerate(t)]


class TileStitcher:
    """A :class:`~monai.inferers.stitcher.Stitcher` that reduces each tile of blended outputs once complete.

    The predictor must return one ``[n, C, *roi_size]`` tensor per batch. Each image runs as one segment, its
    windows ordered by their start along ``slab_dim``.

    Args:
        reduction: receives each complete tile and gives the result.
        plan: the window plan.
        weight: the weight of one window (``[*roi_size]`` or ``[1, 1, *roi_size]``), in the accumulators' dtype.
        device: device of the result (kept by the reduction; tiles are held where the predictor's outputs are).
        dtype: dtype of the accumulators.
        slab_dim: spatial dimension along which the volume is completed slab by slab (0: the first).

    Raises:
        ValueError: for a ``slab_dim`` out of range.
    """

    def __init__(
        self,
        reduction: TileReduction,
        plan: SlidingWindowPlan,
        weight: torch.Tensor,
        device: torch.device,
        dtype: torch.dtype,
        slab_dim: int = 0,
    ):
        ndim = len(plan.roi_size)
        if not -ndim <= slab_dim < ndim:
            raise ValueError(
                f"slab_dim must be in [{-ndim}, {ndim - 1}] for {ndim} spatial dimensions, got {slab_dim}."
            )
        self.plan, self.device, self.dtype, self.reduction = plan, torch.device(device), dtype, reduction
        while weight.ndim < ndim + 2:
            weight = weight[None]
        self.weight = weight
        slices = plan.slices
        self.order = sorted(range(len(slices)), key=lambda i: (slices[i][slab_dim % ndim].start, i))
        self.tiling = Tiling(slices, plan.padded_size, slab_dim)
        self.result_voxels = math.prod(plan.padded_size)  # keys the batch kept per size; nothing is reserved
        self._acc: dict[Tile, torch.Tensor] = {}
        self._cnt: dict[Tile, torch.Tensor] = {}
        self._parts: dict[Tile, list[tuple[int, tuple[slice, ...], torch.Tensor, torch.Tensor]]] = {}

    @property
    def held_tiles(self) -> set[Tile]:
        """The tiles with windows added but not yet complete."""
        return set(self._acc) | set(self._parts)

    def segments(self) -> list[tuple[Any, Sequence[int]]]:
        """One segment per image: its windows (indices over the batch) slab by slab."""
        n = self.plan.num_windows
        return [(b, [b * n + w for w in self.order]) for b in range(self.plan.batch_size)]

    def stitches_on(self, device: torch.device) -> bool:
        """Never: only tiles are held, no full-size result."""
        return False

    def begin_segment(self, key: Any) -> None:
        """Nothing to do: an image's tiles are all complete by the end of its segment."""

    def end_segment(self) -> None:
        """Nothing to do (see :meth:`begin_segment`)."""

    def result_bytes(self, device: torch.device) -> int:
        """Nothing full-size is held."""
        return 0

    def add(self, out: Any, batch: Sequence[int], coords: Sequence[Sequence[slice]], windows: torch.Tensor) -> None:
        """Accumulate one batch of window outputs into its tiles; reduce and free the tiles it completes.

        Raises:
            ValueError: when ``out`` is not one ``[len(batch), C, *roi_size]`` tensor.
        """
        roi = self.plan.roi_size
        if not isinstance(out, torch.Tensor) or out.shape[0] != len(batch) or tuple(out.shape[2:]) != roi:
            raise ValueError(
                "tile-by-tile stitching needs the predictor to return one [n, C, *roi_size] tensor for n windows; "
                f"got {type(out).__name__} {tuple(getattr(out, 'shape', ()))} for {len(batch)} windows of size "
                f"{roi}. Use monai.inferers.sliding_window_inference for other outputs."
            )
        weight = self.weight.to(out.device)
        for j, i in enumerate(batch):
            image, w = divmod(i, self.plan.num_windows)
            sl = self.plan.slices[w]
            for t in self.tiling.window_tiles(sl):
                self._add_part(t, w, out[j : j + 1], weight)
                if self.tiling.is_last(t, sl):
                    self._complete(t, image)

    def _add_part(self, t: Tile, w: int, p: torch.Tensor, weight: torch.Tensor) -> None:
        """Add the part of window ``w``'s output ``p`` (weighted by ``weight``) within tile ``t``, or keep it for a
        replay."""
        src, dst = [slice(None)] * 2, [slice(None)] * 2
        for (a, e), s in zip(self.tiling.box(t), self.plan.slices[w]):
            lo, hi = max(a, s.start), min(e, s.stop)
            src.append(slice(lo - s.start, hi - s.start))
            dst.append(slice(lo - a, hi - a))
        src_i, dst_i = tuple(src), tuple(dst)
        if not self.tiling.direct(t):
            self._parts.setdefault(t, []).append((w, dst_i, p[src_i].clone(), weight[src_i]))
            return
        if t not in self._acc:
            self._new_accumulator(t, p)
        self._acc[t][dst_i].addcmul_(p[src_i], weight[src_i])
        self._cnt[t][dst_i].add_(weight[src_i])

    def _new_accumulator(self, t: Tile, p: torch.Tensor) -> None:
        shape = [e - a for a, e in self.tiling.box(t)]
        self._acc[t] = torch.zeros((1, p.shape[1], *shape), dtype=self.dtype, device=p.device)
        self._cnt[t] = torch.zeros((1, 1, *shape), dtype=self.dtype, device=p.device)

    def _complete(self, t: Tile, image: int) -> None:
        """Tile ``t`` of ``image`` has all its windows: normalise, crop the padding, reduce and free it."""
        if t in self._parts:  # replay the window parts in the plan's order
            parts = sorted(self._parts.pop(t), key=lambda x: x[0])
            self._new_accumulator(t, parts[0][2])
            for _, part_dst, part, weight in parts:
                self._acc[t][part_dst].addcmul_(part, weight)
                self._cnt[t][part_dst].add_(weight)
        outputs = self._acc.pop(t)[0] / self._cnt.pop(t)[0]
        src: list[slice] = []
        dst: list[slice] = []
        for d, (a, e) in enumerate(self.tiling.box(t)):
            lo, n = self.plan.pad_before(d), self.plan.image_size[d]
            start, stop = max(a - lo, 0), min(e - lo, n)
            if start >= stop:
                return  # the tile lies in the padding
            src.append(slice(start + lo - a, stop + lo - a))
            dst.append(slice(start, stop))
        # the index as a name: mypy takes a starred tuple inside brackets for 3.11's `x[a, *b]`
        index = (slice(None), *src)
        self.reduction.add(image, tuple(dst), outputs[index])

    def finish(self) -> Any:
        """The reduction's result."""
        return self.reduction.finish()
