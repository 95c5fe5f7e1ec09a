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
"""``sw_batch_size="auto"``: how many windows go into one predictor call.

This is the one definition of ``"auto"``, used by the one window loop
(:func:`~monai.inferers.sliding_window.run_sliding_window`) whatever the stitcher, so the same for
:func:`~monai.inferers.sliding_window_inference`, the inferers and tile-by-tile stitching:

- on CUDA, the first batch is a one-window probe: ``torch.cuda.max_memory_allocated`` after that forward
  call less the memory allocated before it, times ``SAFETY_FACTOR``, is the per-window cost (kept in a cache
  across calls, keyed by the predictor, the window size and the shapes of its extra arguments). Then each
  batch is the largest that fits the available memory (``torch.cuda.mem_get_info`` plus what PyTorch's
  allocator holds unused), less ``RESERVE_FRACTION`` of the card and, when the result is stitched on the GPU
  and not allocated yet, room for it;
- elsewhere, ``CPU_AUTO_BATCH`` windows: batching more brings little on a CPU and only raises the peak memory;
- either way never more windows than remain, split evenly: 18 windows that fit 14 at a time run as two
  batches of 9, not 14 + 4;
- the batch chosen for one size of the stitched result is kept in the cache too: a later image of that size
  gets the same batches whatever the free memory is then, so it runs the shapes the first one compiled and
  autotuned for.

A predictor may name what its memory use depends on in an ``auto_batch_key`` attribute (a tuple of plain values:
the network's kind, width and precision, the GPU model): the cache then keys its cost by that instead of by the
predictor object, so two wrappers of one network share a probe and a cache written to disk can serve a later
process.

The probe leaves the caller's peak-memory statistics alone (no reset): when a peak of theirs from before the probe
is higher than the probe's, it bounds the probe's cost from above, so the batch comes out smaller, never too large;
``info["probe_peak"]`` says ``"exact"`` or ``"upper bound"``. Reset the peak before the call for an exact probe.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "choose_sw_batch_size",
    "even_batch_size",
    "AutoBatchSize",
    "CPU_AUTO_BATCH",
    "check_sw_batch_size",
    "auto_cache_key",
]

# Windows per predictor call with sw_batch_size="auto" off CUDA.
CPU_AUTO_BATCH = 4
# The measured per-window memory is multiplied by this (allocator fragmentation, stitching temporaries).
SAFETY_FACTOR = 1.25
# Fraction of the available GPU memory left unused.
RESERVE_FRACTION = 0.1


def check_sw_batch_size(sw_batch_size: Any) -> int | str:
    """A positive int, or ``"auto"``: the one rule of the window batch, wherever it is given.

    A string may spell either (``" AUTO "``, ``"4"``, as a command line or a JSON file gives them); ``True`` and
    ``2.0`` are no window counts.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(sw_batch_size, str):
        text = sw_batch_size.strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit() and int(text) >= 1:
            return int(text)
    elif isinstance(sw_batch_size, numbers.Integral) and not isinstance(sw_batch_size, bool):
        if int(sw_batch_size) >= 1:
            return int(sw_batch_size)
    raise ValueError(f"sw_batch_size must be a positive int or 'auto', got {sw_batch_size!r}.")


def even_batch_size(num_windows: int, max_batch: int) -> int:
    """The smallest batch that needs as few calls as batches of ``max_batch`` would: ``(18, 14) -> 9``."""
    if num_windows <= 0:
        return 1
    max_batch = max(1, min(int(max_batch), num_windows))
    calls = math.ceil(num_windows / max_batch)
    return math.ceil(num_windows / calls)


def choose_sw_batch_size(
    num_windows: int,
    window_bytes: float,
    free_bytes: float,
    reserve_bytes: float = 0.0,
    max_batch: int | None = None,
) -> int:
    """Windows per call that fit ``free_bytes``, split evenly over ``num_windows``.

    Args:
        num_windows: windows still to run.
        window_bytes: memory one window needs during the forward call (activations and output).
        free_bytes: memory available for the forward call.
        reserve_bytes: memory to leave unused.
        max_batch: upper bound, if any.

    Returns:
        a batch size in ``[1, num_windows]`` (1 when not even one window seems to fit: the call may still run).
    """
    budget = max(float(free_bytes) - float(reserve_bytes), 0.0)
    fit = int(budget // window_bytes) if window_bytes > 0 else num_windows
    fit = max(1, fit)
    if max_batch is not None:
        fit = min(fit, int(max_batch))
    return even_batch_size(num_windows, fit)


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


def auto_cache_key(
    predictor: Any, roi_size: Sequence[int], inputs: torch.Tensor, device: torch.device, args: tuple, kwargs: dict
) -> tuple:
    """What the per-window memory of ``predictor`` depends on: the predictor (its ``auto_batch_key`` when it has
    one, else the object), the window, the extra arguments."""
    named = getattr(predictor, "auto_batch_key", None)
    identity = ("named", *named) if named is not None else _identity(predictor)
    key = (identity, tuple(roi_size), inputs.shape[1], str(inputs.dtype), str(device))
    return key + _signature(tuple(args), dict(kwargs))


class _CudaMemory:
    """The CUDA memory queries ``AutoBatchSize`` needs (replaced by a fake in CPU tests)."""

    def __init__(self, device: torch.device):
        self.device = device

    def available(self) -> tuple[int, int]:
        """``(available bytes, total bytes)``: free device memory plus what PyTorch caches unused."""
        free, total = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + max(cached, 0)), int(total)

    def start_peak(self) -> int:
        """Bytes allocated now. The peak counter is the user's and is not reset: see ``AutoBatchSize``."""
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))


def _is_cuda(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


class AutoBatchSize:
    """Chooses the size of each window batch of one sliding-window pass with ``sw_batch_size="auto"``.

    The window loop calls :meth:`next` before each batch, :meth:`before_forward` / :meth:`after_forward` around
    the predictor call, and :meth:`after_stitch` after stitching it.

    Args:
        device: the device the predictor runs on (``sw_device``).
        cache: a dict kept across calls (e.g. by an inferer): the measured costs are stored under ``key`` so that
            later calls skip the probe.
        key: what the per-window cost depends on (predictor, window size, channels, dtype, prompts).
        result_voxels: voxels of the padded result per output channel (to reserve room for the result when it is
            stitched on ``device`` and not allocated yet).
        stitch_on_device: whether the result is stitched in ``device`` memory.
    """

    def __init__(
        self,
        device: torch.device,
        cache: dict | None = None,
        key: Any = None,
        result_voxels: int = 0,
        stitch_on_device: bool = True,
    ):
        self.device = torch.device(device)
        self.cuda = _is_cuda(self.device)
        self.memory = _CudaMemory(self.device)  # queried only on CUDA
        self.cache = cache if cache is not None else {}
        self.key = key
        self.result_voxels = result_voxels
        self.stitch_on_device = stitch_on_device
        self.max_batch: int | None = None
        self.info: dict[str, Any] = {"rule": "gpu memory"}
        if not self.cuda:
            self.info = {"rule": "cpu", "max_batch": CPU_AUTO_BATCH}
        self._probing = False
        self._base = 0
        self._peak_before = 0
        self._batch_windows = 0
        self._result_bytes = 0

    @property
    def _costs(self) -> dict | None:
        return self.cache.get(self.key)

    def next(self, remaining: int) -> int:
        """Windows in the next batch, ``remaining`` windows (of the current band) still to run."""
        if not self.cuda:
            return even_batch_size(remaining, CPU_AUTO_BATCH)
        max_batch = self.max_batch
        if max_batch is None:
            costs = self._costs
            if costs is None:
                self._probing = True
                self.info["probe"] = True
                return 1
            chosen = self.cache.get(self._size_key)
            if chosen is not None:  # this size was seen: the same batch, so no new shape to specialise for
                max_batch = self.max_batch = chosen
                self.info.update(max_batch=chosen, reused=True)
            else:
                reserve = 0.0
                if self.stitch_on_device and not self._result_bytes:
                    reserve = costs.get("result_bytes_per_voxel", 0.0) * self.result_voxels
                max_batch = self._choose(costs["window_bytes"], reserve)
        return even_batch_size(remaining, max_batch)

    @property
    def _size_key(self) -> tuple:
        return ("max_batch", self.key, self.result_voxels)

    def _choose(self, window_bytes: float, extra_reserve: float = 0.0) -> int:
        """Set (and return) the largest batch the available memory fits."""
        available, total = self.memory.available()
        reserve = RESERVE_FRACTION * total + extra_reserve
        fit = choose_sw_batch_size(1 << 30, window_bytes, available, reserve)  # largest fit, not yet evened
        max_batch = self.max_batch = max(1, fit)
        self.cache[self._size_key] = max_batch  # later images of this size take the same batch
        self.info.update(window_bytes=int(window_bytes), available_bytes=int(available), max_batch=max_batch)
        return max_batch

    def before_forward(self, num_windows: int) -> None:
        if self._probing:
            self._batch_windows = num_windows
            self._peak_before = self.memory.peak()
            self._base = self.memory.start_peak()

    def after_forward(self) -> None:
        if self._probing:
            # the peak since the user's last reset is max(their earlier peak, the probe's): exact when the probe
            # raised it, else an upper bound of the probe's use (a smaller batch, never too large a one)
            peak = self.memory.peak()
            self.info["probe_peak"] = "exact" if peak > self._peak_before else "upper bound"
            used = max(peak - self._base, 0)
            self._window_bytes = SAFETY_FACTOR * used / max(self._batch_windows, 1)

    def after_stitch(self, result_bytes: int = 0) -> None:
        """After a batch is stitched; ``result_bytes``: bytes of the allocated results and weight sums."""
        self._result_bytes = result_bytes
        if self._probing:
            self._probing = False
            per_voxel = result_bytes / self.result_voxels if self.result_voxels else 0.0
            exact = self.info["probe_peak"] == "exact"  # (an upper bound serves this process, not a store)
            self.cache[self.key] = {"window_bytes": self._window_bytes, "result_bytes_per_voxel": per_voxel,
                                    "exact": exact}
            self._choose(self._window_bytes)  # results are allocated now: the free memory accounts for them
