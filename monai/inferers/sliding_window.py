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
"""The sliding-window loop, driven by one :class:`SlidingWindowSettings` object.

The loop has four timed stages:

1. *prepare*: check the arguments, pad the input, plan the windows (:mod:`monai.inferers.windows`) and group them
   into forward batches; per batch, slice the windows out and copy them to ``sw_device``;
2. *forward*: call the predictor on one batch of windows;
3. *stitch*: weight each window output and add it into the result (:mod:`monai.inferers.stitcher`);
4. *finalize*: divide by the summed weights and crop the padding away.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, fields
from typing import Any, overload

import torch
import torch.nn.functional as F

from monai.inferers.batch_size import AutoBatchSize, auto_cache_key, check_sw_batch_size
from monai.inferers.stitcher import ResultT, StitcherFactory, WindowOutputs, WindowStitcher
from monai.inferers.windows import (
    SlidingWindowPlan,
    compute_importance_map,
    plan_sliding_windows,
    schedule_batches,
)
from monai.utils import BlendMode, PytorchPadMode, look_up_option, optional_import
from monai.utils.profiling import WINDOW_STAGES, StageTimer

tqdm, has_tqdm = optional_import("tqdm", name="tqdm")

__all__ = ["SlidingWindowSettings", "run_sliding_window", "pad_and_weight"]


@dataclass(frozen=True, eq=False)
class SlidingWindowSettings:
    """Everything a sliding-window pass needs besides the input, the predictor and its extra arguments.

    The fields are the arguments of :func:`monai.inferers.sliding_window_inference` of the same names, and keep
    their meaning; :meth:`dataclasses.replace` makes a per-call variant (e.g. another stitching ``device``).

    Attributes:
        roi_size: window size, one int or one per spatial dimension (``None`` / non-positive: the whole extent).
        sw_batch_size: windows per predictor call, or ``"auto"`` (see :mod:`monai.inferers.batch_size`).
        overlap: overlap fraction of neighbouring windows, one value or one per dimension, in ``[0, 1)``.
        mode: ``"constant"`` or ``"gaussian"`` blending.
        sigma_scale: Gaussian sigma as a fraction of the window size.
        padding_mode: padding of inputs smaller than the window.
        cval: fill value of constant padding.
        sw_device: device of the windows given to the predictor (``None``: that of the input).
        device: device of the stitched result (``None``: that of the input).
        progress: show a progress bar.
        roi_weight_map: precomputed ``[*roi_size]`` window weights instead of ``mode`` / ``sigma_scale``.
        process_fn: ``process_fn(outputs, windows, weight) -> (outputs, weight)`` applied before stitching.
        buffer_steps: buffered stitching in bands of this many window positions (``None`` / non-positive: off).
        buffer_dim: spatial dimension of the bands.
        with_coord: pass the window coordinates to the predictor.
        window_add: stitch with the Triton window-add kernel (see :class:`~monai.inferers.stitcher.WindowStitcher`);
            not an argument of ``sliding_window_inference``: an inferer's setting, on for the fused VISTA3D path.
        on_plan: called with the pass's :class:`~monai.inferers.windows.SlidingWindowPlan` before the first window
            (a caller's progress bar learns the window count from the one plan); like ``window_add``, an
            inferer's setting and a keyword of the streamed label map, not an argument of ``sliding_window_inference``.
    """

    roi_size: Sequence[int | None] | int | None
    sw_batch_size: int | str = 1
    overlap: Sequence[float] | float = 0.25
    mode: BlendMode | str = BlendMode.CONSTANT
    sigma_scale: Sequence[float] | float = 0.125
    padding_mode: PytorchPadMode | str = PytorchPadMode.CONSTANT
    cval: float = 0.0
    sw_device: torch.device | str | None = None
    device: torch.device | str | None = None
    progress: bool = False
    roi_weight_map: torch.Tensor | None = None
    process_fn: Callable | None = None
    buffer_steps: int | None = None
    buffer_dim: int = -1
    with_coord: bool = False
    window_add: bool = False
    on_plan: Callable[[SlidingWindowPlan], Any] | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> SlidingWindowSettings:
        """The settings named in ``values`` (e.g. a caller's arguments or an inferer's attributes), defaults for
        the fields it lacks; other entries are ignored."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})

    @classmethod
    def split(cls, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``values`` as ``(the entries named like a field, the others)``."""
        names = {f.name for f in fields(cls)}
        return {k: v for k, v in values.items() if k in names}, {k: v for k, v in values.items() if k not in names}

    def window_device(self, inputs: torch.Tensor) -> torch.device:
        """Where the predictor runs: ``sw_device``, else the input's device."""
        return torch.device(self.sw_device) if self.sw_device is not None else inputs.device

    def result_device(self, inputs: torch.Tensor) -> torch.device:
        """Where the result is stitched: ``device``, else the input's device."""
        return torch.device(self.device) if self.device is not None else inputs.device


def pad_and_weight(
    inputs: torch.Tensor, condition: torch.Tensor | None, plan: SlidingWindowPlan, settings: SlidingWindowSettings
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Pad ``inputs`` (and a ``condition`` tensor shaped like it) to ``plan``'s padded size; build the window weight.

    Returns:
        ``(padded inputs, padded condition or None, weight of one window)``: the weight is ``settings.roi_weight_map``
        or the importance map of ``settings.mode``, ``[*roi_size]`` on the window device in the input's dtype.
    """
    padding_mode = look_up_option(settings.padding_mode, PytorchPadMode)
    sw_device, dtype = settings.window_device(inputs), inputs.dtype
    if plan.padded:
        pad_kw = {"value": settings.cval} if padding_mode == PytorchPadMode.CONSTANT else {}  # cval: constant only
        inputs = F.pad(inputs, plan.pad_size, mode=padding_mode.value, **pad_kw)
        if condition is not None:
            condition = F.pad(condition, plan.pad_size, mode=padding_mode.value, **pad_kw)
    if settings.roi_weight_map is not None:
        weight = torch.as_tensor(settings.roi_weight_map).to(device=sw_device, dtype=dtype)
    else:
        weight = compute_importance_map(
            plan.roi_size, settings.mode, settings.sigma_scale, device=sw_device, dtype=dtype
        )
    return inputs, condition, weight


class _TextProgress:
    """Minimal progress bar on stderr, used when ``tqdm`` is not installed."""

    def __init__(self, items: Iterable, desc: str = "sliding window"):
        self.items, self.desc = items, desc

    def __iter__(self):
        n = f"/{len(self.items)}" if isinstance(self.items, Sized) else ""  # "auto" batches are not known ahead
        for i, item in enumerate(self.items):
            yield item
            sys.stderr.write(f"\r{self.desc}: {i + 1}{n} batches")
        sys.stderr.write("\n")
        sys.stderr.flush()


def _progress(items: Iterable, enabled: bool):
    if not enabled:
        return items
    if has_tqdm:
        return tqdm(items)
    return _TextProgress(items)


@overload
def run_sliding_window(
    inputs: torch.Tensor,
    predictor: Callable,
    settings: SlidingWindowSettings,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timer: StageTimer | None = None,
    auto_cache: dict | None = None,
    stitcher: None = None,
) -> WindowOutputs: ...


@overload
def run_sliding_window(
    inputs: torch.Tensor,
    predictor: Callable,
    settings: SlidingWindowSettings,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timer: StageTimer | None = None,
    auto_cache: dict | None = None,
    *,
    stitcher: StitcherFactory[ResultT],
) -> ResultT: ...


def run_sliding_window(
    inputs: torch.Tensor,
    predictor: Callable,
    settings: SlidingWindowSettings,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timer: StageTimer | None = None,
    auto_cache: dict | None = None,
    stitcher: StitcherFactory[Any] | None = None,
) -> Any:
    """One sliding-window pass of ``predictor`` over ``inputs`` with ``settings``.

    Args:
        inputs: ``[N, C, *spatial]`` input.
        predictor: called as ``predictor(windows, *args, **kwargs)`` (``with_coord``: ``predictor(windows,
            coords, *args, **kwargs)``).
        settings: the pass's settings.
        args: extra positional arguments of the predictor.
        kwargs: extra keyword arguments of the predictor (a ``condition`` tensor is windowed with the input).
        timer: receives the stages ``prepare``, ``forward``, ``stitch``, ``finalize`` and ``total``, the
            unaccounted rest as ``other``, and the counts ``windows`` and ``batches`` (default: NVTX ranges only).
        auto_cache: keeps the measured per-window memory of ``sw_batch_size="auto"`` across calls (see
            :class:`~monai.inferers.batch_size.AutoBatchSize`).
        stitcher: builds the way to stitch (see :class:`~monai.inferers.stitcher.Stitcher`); default: the full
            blended outputs of :class:`~monai.inferers.stitcher.WindowStitcher` with the settings' buffering
            and ``process_fn``.

    Returns:
        what the stitcher's ``finish`` returns; by default what :func:`monai.inferers.sliding_window_inference`
        returns.
    """
    timer = timer or StageTimer(enabled=False, device=settings.window_device(inputs))
    if stitcher is None:
        stitcher = functools.partial(
            WindowStitcher,
            buffer_steps=settings.buffer_steps,
            buffer_dim=settings.buffer_dim,
            process_fn=settings.process_fn,
            window_add=settings.window_add,
        )
    with timer.stage("total"):
        extra = (tuple(args), dict(kwargs or {}))
        result = _window_loop(inputs, predictor, settings, extra, timer, auto_cache, stitcher)
    if timer.enabled:
        t = timer.timings
        t["other"] = max(t["total"] - sum(t.get(k, 0.0) for k in WINDOW_STAGES), 0.0)
    return result


def _window_loop(
    inputs: Any,
    predictor: Callable,
    settings: SlidingWindowSettings,
    extra: tuple[tuple, dict],
    timer: StageTimer,
    auto_cache: dict | None,
    make_stitcher: StitcherFactory[ResultT],
) -> ResultT:
    args, kwargs = extra
    with timer.stage("prepare"):
        if not isinstance(inputs, torch.Tensor):
            inputs = torch.as_tensor(inputs)
        if inputs.ndim < 3:
            raise ValueError(
                f"inputs must be [N, C, *spatial] with at least one spatial dimension, got {tuple(inputs.shape)}."
            )
        sw_batch_size = check_sw_batch_size(settings.sw_batch_size)
        look_up_option(settings.mode, BlendMode)  # an unknown mode fails before any work
        pad_mode = look_up_option(settings.padding_mode, PytorchPadMode)
        device, sw_device = settings.result_device(inputs), settings.window_device(inputs)
        condition = kwargs.pop("condition", None)

        plan = plan_sliding_windows(inputs.shape[2:], settings.roi_size, settings.overlap, inputs.shape[0], pad_mode)
        if settings.on_plan is not None:
            settings.on_plan(plan)
        inputs, condition, weight = pad_and_weight(inputs, condition, plan, settings)
        stitcher = make_stitcher(plan=plan, weight=weight, device=device, dtype=inputs.dtype)
        auto = None
        if sw_batch_size == "auto":
            key = auto_cache_key(predictor, plan.roi_size, inputs, sw_device, args, kwargs)
            on_device = stitcher.stitches_on(sw_device)
            auto = AutoBatchSize(sw_device, auto_cache, key, stitcher.result_voxels, stitch_on_device=on_device)
            steps: Any = schedule_batches(stitcher.segments(), auto.next)
        else:
            bs = int(sw_batch_size)
            steps = list(schedule_batches(stitcher.segments(), lambda remaining: bs))
        timer.count("windows", plan.total_windows)
        timer.set("sw_batch_size", sw_batch_size)

    with timer.range("loop"):
        for segment, batch, last_of_segment in _progress(steps, settings.progress):
            with timer.stage("prepare"):
                coords = [plan.coords(i) for i in batch]
                windows = torch.cat([inputs[tuple(c)] for c in coords]).to(sw_device)
                if condition is not None:
                    kwargs["condition"] = torch.cat([condition[tuple(c)] for c in coords]).to(sw_device)
            with timer.stage("forward"):
                if auto is not None:
                    auto.before_forward(len(coords))
                if settings.with_coord:
                    out = predictor(windows, coords, *args, **kwargs)
                else:
                    out = predictor(windows, *args, **kwargs)
                if auto is not None:
                    auto.after_forward()
                timer.count("batches")
            with timer.stage("stitch"):
                stitcher.begin_segment(segment)
                stitcher.add(out, batch, coords, windows)
                del out  # a streaming stitcher frees what it is done with; the output must not outlive it
                if last_of_segment:
                    stitcher.end_segment()
                if auto is not None:
                    auto.after_stitch(stitcher.result_bytes(sw_device))

    if auto is not None:
        timer.set("sw_batch_size", "auto")
        timer.set("auto_batch", dict(auto.info))
    with timer.stage("finalize"):
        return stitcher.finish()
