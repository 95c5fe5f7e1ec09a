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
"""Stitching: blending the outputs of overlapping windows into full-size results.

The window loop (:func:`monai.inferers.sliding_window.run_sliding_window`) drives a :class:`Stitcher`: it runs the
stitcher's segments of windows in order, batch by batch, hands it each batch's predictor output and returns
what :meth:`Stitcher.finish` returns. :class:`WindowStitcher` adds each batch of weighted window outputs into the
result (directly, or band by band on the predictor's device for buffered stitching) and divides by the summed
weights at the end; :class:`~monai.inferers.tile_stitcher.TileStitcher` hands each part of the volume to a
reduction as soon as its windows are in, never holding the whole result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, Union

import torch
import torch.nn.functional as F

from monai.inferers.windows import Band, SlidingWindowPlan, buffered_bands
from monai.utils import ensure_tuple

__all__ = ["Stitcher", "StitcherFactory", "WindowOutputs", "WindowStitcher", "flatten_outputs", "pack_outputs"]

# what a stitcher's finish returns (covariant in the protocol, plain for the factories and the window loop)
ResultT_co = TypeVar("ResultT_co", covariant=True)
ResultT = TypeVar("ResultT")

# the blended results shaped as the predictor output: a tensor, a tuple or a dict of tensors (what
# sliding_window_inference returns)
WindowOutputs = Union[torch.Tensor, tuple[torch.Tensor, ...], dict[Any, torch.Tensor]]

# Nearest-neighbour mode used to resize the importance map to outputs at another scale than the input.
_NEAREST_MODE = "nearest-exact"


def flatten_outputs(out: Any) -> tuple[list | None, tuple[torch.Tensor, ...]]:
    """Predictor output as a tuple of tensors, plus the sorted dict keys when it was a mapping."""
    if isinstance(out, torch.Tensor):
        return None, (out,)
    if isinstance(out, Mapping):
        keys = sorted(out.keys())
        return keys, tuple(out[k] for k in keys)
    if isinstance(out, (list, tuple)):
        return None, tuple(out)
    raise TypeError(f"the predictor must return a tensor, a tuple/list or a dict of tensors, got {type(out).__name__}.")


def pack_outputs(outs: list[torch.Tensor], keys: list | None) -> WindowOutputs:
    if keys is not None:
        return dict(zip(keys, outs))
    return outs[0] if len(outs) == 1 else tuple(outs)


class Stitcher(Protocol[ResultT_co]):
    """What the window loop needs of a way to stitch window outputs.

    Attributes:
        result_voxels: voxels per channel of what the stitcher holds at most (keys the batch size kept for a
            volume size by ``sw_batch_size="auto"``, and sizes the room it reserves when :meth:`stitches_on`).
    """

    result_voxels: int

    def segments(self) -> list[tuple[Any, Sequence[int]]]:
        """``(key, window indices)`` in the order to run them; a forward batch never spans two segments."""
        ...

    def stitches_on(self, device: torch.device) -> bool:
        """Whether the stitched result is held in ``device`` memory (room is then reserved for it)."""
        ...

    def begin_segment(self, key: Any) -> None:
        """Before the first batch of the segment ``key``."""
        ...

    def add(self, out: Any, batch: Sequence[int], coords: Sequence[Sequence[slice]], windows: torch.Tensor) -> None:
        """Add the predictor output ``out`` of the windows ``batch`` (indices over the input batch, ``coords`` their
        ``plan.coords``, ``windows`` the predictor's input)."""
        ...

    def end_segment(self) -> None:
        """After the last batch of the current segment."""
        ...

    def result_bytes(self, device: torch.device) -> int:
        """Bytes held on ``device`` so far."""
        ...

    def finish(self) -> ResultT_co:
        """The result of the pass."""
        ...


# Builds the stitcher of one pass, called with the keywords plan, weight (of one window), device and dtype (of the
# result).
StitcherFactory = Callable[..., Stitcher[ResultT]]


class WindowStitcher:
    """Accumulates weighted window outputs into full-size results, one per predictor output.

    Outputs may be at another scale than the input (``zoom = output window size / roi_size`` per dimension). With a
    fixed weight map the normalising weight sum is built once per call; with a ``process_fn`` (whose weights may
    change per window) it is accumulated window by window.

    Args:
        plan: the window plan (buffered stitching reorders its windows along ``buffer_dim``).
        weight: importance map ``[1, 1, *roi_size]`` (or ``[*roi_size]``).
        device: device of the stitched results.
        dtype: dtype of the results.
        buffer_steps: buffered stitching in bands of this many window positions (``None`` / non-positive: off).
        buffer_dim: spatial dimension of the bands.
        process_fn: ``process_fn(outputs, windows, weight) -> (outputs, weight)`` applied to each batch before it is
            added; the weight sum is then accumulated window by window.
        window_add: add windows into CUDA results with the Triton kernel of :mod:`monai.inferers.window_add` where
            it takes the tensors (a setting of the fused VISTA3D path, ``FusedConfig.window_add``); off: PyTorch.

    Raises:
        ValueError: for a ``buffer_dim`` out of range when buffered.
    """

    def __init__(
        self,
        plan: SlidingWindowPlan,
        weight: torch.Tensor,
        device: torch.device,
        dtype: torch.dtype,
        buffer_steps: int | None = None,
        buffer_dim: int = -1,
        process_fn: Callable | None = None,
        window_add: bool = False,
    ):
        self.plan = plan
        self.window_add = window_add
        self.ndim = len(plan.roi_size)
        self.window_weight = weight  # as given, for process_fn
        self.weight = _as_5d_weight(weight, self.ndim)
        self.device = torch.device(device)
        self.dtype = dtype
        self.process_fn = process_fn
        self.per_window_weights = process_fn is not None
        self.result_voxels = plan.batch_size * math.prod(plan.padded_size)
        self.outputs: list[torch.Tensor] = []
        self.counts: list[torch.Tensor] = []
        self.zooms: list[tuple[float, ...]] = []
        self.keys: list | None = None  # the sorted keys of a dict output
        # (output index, device) -> resized weight map
        self._weights: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._buffers: list[torch.Tensor] | None = None
        self._band: Band | None = None
        self.buffer_dim: int | None = None
        self._segments: list[tuple[Any, Sequence[int]]] = [(None, range(plan.total_windows))]
        if buffer_steps is not None and buffer_steps > 0:
            if not -self.ndim <= buffer_dim < self.ndim:
                raise ValueError(
                    f"buffer_dim must be in [{-self.ndim}, {self.ndim - 1}] for {self.ndim} spatial dimensions, "
                    f"got {buffer_dim}."
                )
            self.buffer_dim = buffer_dim % self.ndim
            bands = buffered_bands(plan, int(buffer_steps), self.buffer_dim)
            self._segments = [(b, range(b.first, b.stop)) for b in bands]

    def segments(self) -> list[tuple[Any, Sequence[int]]]:
        """One segment over the whole batch, or one per buffered band."""
        return self._segments

    def stitches_on(self, device: torch.device) -> bool:
        """Whether the results are stitched on ``device``."""
        return self.device == torch.device(device)

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
                    # the index as a name: mypy takes a starred tuple inside brackets for 3.11's `x[a, *b]`
                    index = (slice(None), slice(None), *(self._out_slice(k, s, d) for d, s in enumerate(sl)))
                    count[index].add_(w)
                self.counts.append(count)

    # -- accumulation --------------------------------------------------------------------------------------------------
    def begin_segment(self, key: Band | None) -> None:
        """Start the buffered band ``key`` (``None``: unbuffered); nothing happens when it is the current one."""
        if self._band is key:
            return
        self._band = key
        self._buffers = None

    def add(self, out: Any, batch: Sequence[int], coords: Sequence[Sequence[slice]], windows: torch.Tensor) -> None:
        """Add the predictor output of one batch of windows (a tensor, a tuple/list or a dict of tensors)."""
        self.keys, outs = flatten_outputs(out)
        w = None
        if self.process_fn is not None:
            outs, w = self.process_fn(outs, windows, self.window_weight)
            outs = ensure_tuple(outs)
        self.add_outputs(outs, coords, w)

    def add_outputs(
        self, outs: Sequence[torch.Tensor], coords: Sequence[Sequence[slice]], weight: torch.Tensor | None = None
    ) -> None:
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
                wj = None if wsrc is None else wsrc[j : j + 1] if wsrc.shape[0] > 1 else wsrc
                _add_weighted(target[idx], pj, wj, self.window_add)
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
            d, band = self._band_extent(kk, self._band)
            shape[2 + d] = band.stop - band.start
            self._buffers.append(torch.zeros(shape, dtype=self.dtype, device=p.device))
        return self._buffers[k], self._buffers[k].device

    def _band_extent(self, k: int, band: Band) -> tuple[int, slice]:
        """The bands' spatial dimension and the extent of ``band`` along it in output ``k``."""
        if self.buffer_dim is None:
            raise ValueError("begin_segment was given a band, but this stitcher was made without buffer_steps.")
        return self.buffer_dim, self._out_slice(k, slice(band.start, band.end), self.buffer_dim)

    def _output_index(self, k: int, c: Sequence[slice]) -> tuple:
        return (c[0], slice(None), *(self._out_slice(k, s, d) for d, s in enumerate(c[2:])))

    def _target_index(self, k: int, c: Sequence[slice]) -> tuple:
        idx = list(self._output_index(k, c))
        if self._band is not None:
            d, band = self._band_extent(k, self._band)
            s = idx[2 + d]
            idx[0] = slice(0, 1)
            idx[2 + d] = slice(s.start - band.start, s.stop - band.start)
        return tuple(idx)

    def end_segment(self) -> None:
        """Write the finished band (if buffered) into the results on ``device``."""
        if self._band is None or self._buffers is None:
            self._band = None
            return
        for k, buf in enumerate(self._buffers):
            d, band = self._band_extent(k, self._band)
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
    def finish(self) -> WindowOutputs:
        """The stitched results on ``device`` in ``dtype``, shaped as the predictor output (tensor, tuple or dict)."""
        results = [r.to(device=self.device, dtype=self.dtype) for r in self.finalize()]
        return pack_outputs(results, self.keys)

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


def _add_weighted(target: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, kernel: bool) -> None:
    """``target += src * weight`` (``+= src`` without a weight): with ``kernel``, through the window-add kernel where it
    takes the tensors (PyTorch's mixed-dtype path over a strided slice is slow on a GPU), else in PyTorch."""
    if kernel:
        # Triton, imported only when the kernel is asked for (a CPU or module-path run never pays its import)
        from monai.inferers.window_add import add_window, add_window_supported

        if add_window_supported(target, src, weight):
            add_window(target, src, weight)
            return
    if weight is None:
        target.add_(src)
    else:
        target.addcmul_(src, weight)


def _as_5d_weight(w: torch.Tensor, ndim: int) -> torch.Tensor:
    """A weight map as ``[n, c, *spatial]``."""
    w = torch.as_tensor(w)
    while w.ndim < ndim + 2:
        w = w[None]
    return w
