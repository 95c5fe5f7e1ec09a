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
"""Inferers: callables that run a network on an input, directly or window by window."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch

from monai.inferers.sliding_window import SlidingWindowSettings, run_sliding_window
from monai.inferers.stitcher import WindowOutputs
from monai.inferers.windows import SlidingWindowPlan, compute_importance_map
from monai.utils import BlendMode, PytorchPadMode, ensure_tuple
from monai.utils.profiling import StageTimer, log_timings

__all__ = ["Inferer", "SimpleInferer", "SlidingWindowInferer", "SlidingWindowInfererAdapt"]

logger = logging.getLogger(__name__)


class Inferer(ABC):
    """Base class of the inferers: ``inferer(inputs, network, *args, **kwargs)`` returns the prediction."""

    @abstractmethod
    def __call__(self, inputs: torch.Tensor, network: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``network`` on ``inputs``.

        Args:
            inputs: the network input, e.g. ``[N, C, *spatial]``.
            network: the model or any callable.
            args: extra positional arguments of ``network``.
            kwargs: extra keyword arguments of ``network``.
        """
        raise NotImplementedError(f"Subclass {self.__class__.__name__} must implement __call__.")


class SimpleInferer(Inferer):
    """Calls the network once on the whole input."""

    def __init__(self) -> None:
        Inferer.__init__(self)

    def __call__(
        self, inputs: torch.Tensor, network: Callable[..., torch.Tensor], *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """Return ``network(inputs, *args, **kwargs)``."""
        return network(inputs, *args, **kwargs)


class SlidingWindowInferer(Inferer):
    """Runs the network on overlapping windows of the input with :func:`monai.inferers.sliding_window_inference`.

    Args:
        roi_size: window size, one int or one per spatial dimension; ``None`` / non-positive entries take the whole
            extent of that dimension.
        sw_batch_size: number of windows per network call, or ``"auto"`` (see :mod:`monai.inferers.batch_size`;
            the measured per-window memory is remembered across calls).
        overlap: overlap fraction between neighbouring windows, one value or one per dimension, in ``[0, 1)``.
        mode: ``"constant"`` or ``"gaussian"`` blending of overlapping windows.
        sigma_scale: Gaussian sigma as a fraction of the window size.
        padding_mode: padding of inputs smaller than the window (``"constant"``, ``"reflect"``, ...).
        cval: fill value of constant padding.
        sw_device: device of the windows given to the network (default: that of the input).
        device: device of the stitched result (default: that of the input).
        progress: show a progress bar.
        cache_roi_weight_map: compute the weight map once here (only for a fixed, fully positive ``roi_size``).
        cpu_thresh: when ``device`` is not given, stitch on the CPU for inputs with more than this many voxels.
        buffer_steps: buffered stitching, see :func:`~monai.inferers.sliding_window_inference`.
        buffer_dim: spatial dimension of the buffered bands.
        with_coord: also pass the window coordinates to the network (its second argument).
        window_add: add window outputs into CUDA results with the Triton kernel of :mod:`monai.inferers.window_add`
            (on for the fused VISTA3D path, see ``FusedConfig.window_add``); off: PyTorch's add.
        on_plan: called with each pass's :class:`~monai.inferers.windows.SlidingWindowPlan` before its first window
            (e.g. to size a caller's own progress bar from the one plan).
        auto_cache: where ``sw_batch_size="auto"`` keeps its measured window costs across calls: a dict the caller
            holds (shared by several inferers, or loaded from disk); None: the inferer's own.
        timing: measure where each call spends its time. After a call, ``timings`` holds seconds for ``total``,
            ``prepare`` (padding, window slicing, copies to ``sw_device``), ``forward`` (the network calls),
            ``stitch`` (weighting and adding window outputs), ``finalize`` (normalising and cropping) and
            ``other``, the counts ``windows`` and ``batches``, and ``sw_batch_size``; the line is also logged at
            INFO by ``monai.inferers.inferer``. On CUDA the device is synchronised at stage boundaries, which adds
            a little latency; with ``timing=False`` (default) nothing is measured or synchronised (CUDA runs
            still carry NVTX ranges such as ``SW_Model_Computation`` for profilers).

    Note:
        ``sw_batch_size`` is the number of windows per network call, not the batch size of the input.
    """

    def __init__(
        self,
        roi_size: Sequence[int] | int,
        sw_batch_size: int | str = 1,
        overlap: Sequence[float] | float = 0.25,
        mode: BlendMode | str = BlendMode.CONSTANT,
        sigma_scale: Sequence[float] | float = 0.125,
        padding_mode: PytorchPadMode | str = PytorchPadMode.CONSTANT,
        cval: float = 0.0,
        sw_device: torch.device | str | None = None,
        device: torch.device | str | None = None,
        progress: bool = False,
        cache_roi_weight_map: bool = False,
        cpu_thresh: int | None = None,
        buffer_steps: int | None = None,
        buffer_dim: int = -1,
        with_coord: bool = False,
        timing: bool = False,
        window_add: bool = False,
        on_plan: Callable[[SlidingWindowPlan], Any] | None = None,
        auto_cache: dict | None = None,
    ) -> None:
        super().__init__()
        self.roi_size = roi_size
        self.sw_batch_size = sw_batch_size
        self.overlap = overlap
        self.mode: BlendMode = BlendMode(mode)
        self.sigma_scale = sigma_scale
        self.padding_mode = padding_mode
        self.cval = cval
        self.sw_device = sw_device
        self.device = device
        self.progress = progress
        self.cpu_thresh = cpu_thresh
        self.buffer_steps = buffer_steps
        self.buffer_dim = buffer_dim
        self.with_coord = with_coord
        self.timing = timing
        self.window_add = window_add
        self.on_plan = on_plan
        self.timings: dict[str, Any] = {}
        self._auto_cache: dict = {} if auto_cache is None else auto_cache  # "auto": costs reused across calls

        # The Gaussian map is slow to build on the CPU: build it once when the window size cannot change.
        self.roi_weight_map: torch.Tensor | None = None
        if cache_roi_weight_map:
            if isinstance(roi_size, Sequence) and all(r is not None and r > 0 for r in roi_size):
                self.roi_weight_map = compute_importance_map(
                    ensure_tuple(roi_size), mode=self.mode, sigma_scale=sigma_scale, device=device or "cpu"
                )
            else:
                warnings.warn(
                    f"cache_roi_weight_map=True needs a roi_size with one positive size per dimension, got {roi_size}; "
                    "the weight map is computed at each call instead."
                )

    def _settings(self) -> SlidingWindowSettings:
        """This inferer's current settings as one object (the attributes may be changed between calls)."""
        return SlidingWindowSettings.from_values(vars(self))

    def __call__(
        self,
        inputs: torch.Tensor,
        network: Callable[..., torch.Tensor | Sequence[torch.Tensor] | dict[Any, torch.Tensor]],
        *args: Any,
        **kwargs: Any,
    ) -> WindowOutputs:
        """Sliding-window prediction of ``network`` on ``inputs`` (timings of the call in ``timings``).

        Args:
            inputs: ``[N, C, *spatial]`` input.
            network: the model or any callable taking ``[n, C, *roi_size]`` windows.
            args: extra positional arguments of ``network``.
            kwargs: extra keyword arguments of ``network``; ``device``, ``buffer_steps`` and ``buffer_dim`` here
                override this inferer's settings for one call; a ``condition`` tensor shaped like ``inputs`` is
                windowed together with the inputs.
        """
        out = self._call(inputs, network, args, kwargs)
        self._report()
        return out

    def _call(self, inputs: torch.Tensor, network: Callable, args: tuple, kwargs: dict[str, Any]) -> WindowOutputs:
        """Resolve the per-call overrides and run one pass."""
        condition = kwargs.get("condition", None)
        if condition is not None and tuple(condition.shape) != tuple(inputs.shape):
            raise ValueError(
                f"`condition` must have the shape of `inputs` {tuple(inputs.shape)}, got {tuple(condition.shape)}."
            )
        device = kwargs.pop("device", self.device)
        buffer_steps = kwargs.pop("buffer_steps", self.buffer_steps)
        buffer_dim = kwargs.pop("buffer_dim", self.buffer_dim)
        if device is None and self.cpu_thresh is not None and inputs.shape[2:].numel() > self.cpu_thresh:
            device = "cpu"  # large volume: keep the stitched result in host memory
        return self._run(inputs, network, device, buffer_steps, buffer_dim, args, kwargs)

    def _run(
        self,
        inputs: torch.Tensor,
        network: Callable,
        device: torch.device | str | None,
        buffer_steps: int | None,
        buffer_dim: int,
        args: tuple,
        kwargs: dict[str, Any],
    ) -> WindowOutputs:
        """One sliding-window pass with this inferer's settings (the hook the adaptive inferer retries)."""
        self.timings = {}
        settings = dataclasses.replace(
            self._settings(), device=device, buffer_steps=buffer_steps, buffer_dim=buffer_dim
        )
        timer = StageTimer(device=settings.window_device(inputs)) if self.timing else None
        out = run_sliding_window(inputs, network, settings, args, kwargs, timer, self._auto_cache)
        if timer is not None:
            self.timings = dict(timer.timings)
            self.timings["stitch_device"] = str(device if device is not None else inputs.device)
            self.timings["synchronized"] = timer.sync
        return out

    def _report(self) -> None:
        if self.timing and self.timings:
            log_timings(logger, self.timings, type(self).__name__)


def _is_oom(err: BaseException) -> bool:
    return "OutOfMemoryError" in type(err).__name__


class SlidingWindowInfererAdapt(SlidingWindowInferer):
    """A :class:`SlidingWindowInferer` that falls back to cheaper stitching when the GPU runs out of memory.

    With ``device=None`` and an input on the GPU, a call tries in turn:

    1. stitching on the GPU;
    2. buffered stitching (bands of ``buffer_steps`` window positions on the GPU, result on the CPU), halving
       ``buffer_steps`` after each further out-of-memory error down to 1 (skipped when ``buffer_steps <= 0``);
    3. stitching on the CPU.

    After a GPU failure ``cpu_thresh`` is lowered to just below the failing volume's size (and ``buffer_steps`` set
    to the value that was tried), so later inputs at least as large start directly with buffered stitching. The
    result may therefore be on the CPU for a GPU input. With ``device`` given, no adaptation is attempted.

    ``attempts`` lists, for the last call, each stitching tried: ``{"stitching": "gpu" | "buffered" | "cpu",
    "device", "buffer_steps", "buffer_dim", "error", "seconds"}`` (``error`` is ``None`` for the one that
    succeeded). With ``timing=True``, ``timings`` (the stages of the successful pass, see
    :class:`SlidingWindowInferer`) also holds ``stitching`` (the mode that succeeded), ``stitch_device``,
    ``attempts`` and ``call_total`` (seconds including the failed attempts).
    """

    max_attempts = 10

    @staticmethod
    def _on_accelerator(inputs: torch.Tensor) -> bool:
        """Whether the input is on the GPU (the only case where stitching can fall back)."""
        return bool(inputs.is_cuda)

    def __call__(
        self,
        inputs: torch.Tensor,
        network: Callable[..., torch.Tensor | Sequence[torch.Tensor] | dict[Any, torch.Tensor]],
        *args: Any,
        **kwargs: Any,
    ) -> WindowOutputs:
        """Sliding-window prediction with out-of-memory fallbacks; arguments as :class:`SlidingWindowInferer`."""
        self.attempts: list[dict] = []
        clock = StageTimer(sync=False, nvtx=False)  # host time for the adaptation record
        with clock.stage("call_total"):
            out, stitching = self._adapt(inputs, network, args, kwargs, clock)
        self._finish(stitching, clock.timings["call_total"])
        return out

    def _adapt(
        self, inputs: torch.Tensor, network: Callable, args: tuple, kwargs: dict[str, Any], clock: StageTimer
    ) -> tuple[WindowOutputs, str]:
        """Try the stitching modes from the cheapest that may fit; returns ``(output, stitching mode)``."""
        if self.device is not None:
            return self._call(inputs, network, args, kwargs), "fixed"

        numel = int(inputs.shape[2:].numel())
        on_gpu = self._on_accelerator(inputs)
        skip_buffer = self.buffer_steps is not None and self.buffer_steps <= 0
        large = self.cpu_thresh is not None and numel > self.cpu_thresh
        gpu_stitching = on_gpu and not large
        buffered = on_gpu and large and not skip_buffer
        buffer_steps = max(1, self.buffer_steps) if self.buffer_steps is not None else 1
        # Bands along the longest dimension when it is clearly longer than the last one, else along the last.
        spatial = list(inputs.shape[2:])
        longest = spatial.index(max(spatial))
        buffer_dim = longest if spatial[longest] / spatial[-1] >= 2 else -1

        for n in range(self.max_attempts):
            stitch_device = inputs.device if gpu_stitching else torch.device("cpu")
            stitching = "gpu" if gpu_stitching else "buffered" if buffered else "cpu"
            attempt: dict[str, Any] = {
                "stitching": stitching,
                "device": str(stitch_device),
                "buffer_steps": buffer_steps if buffered else None,
                "buffer_dim": buffer_dim,
                "error": None,
            }
            self.attempts.append(attempt)
            call_kwargs = dict(kwargs, device=stitch_device, buffer_dim=buffer_dim)
            call_kwargs["buffer_steps"] = attempt["buffer_steps"]
            try:
                with clock.stage(f"attempt {n}"):
                    out = self._call(inputs, network, args, call_kwargs)
                attempt["seconds"] = clock.timings[f"attempt {n}"]
                return out, stitching
            except RuntimeError as e:
                attempt["seconds"] = clock.timings[f"attempt {n}"]
                if not _is_oom(e) or not (gpu_stitching or buffered):
                    raise
                attempt["error"] = f"{type(e).__name__}: {e}"
                logger.info("sliding window attempt failed: %s", attempt)
                if gpu_stitching:
                    gpu_stitching = False
                    self.cpu_thresh = numel - 1  # remember: volumes this large start with cheaper stitching
                    buffered = not skip_buffer
                    if buffered:
                        self.buffer_steps = buffer_steps
                        logger.warning(
                            f"GPU stitching ran out of memory for input {tuple(inputs.shape)}; retrying with buffered "
                            f"stitching (buffer_steps={buffer_steps}, buffer_dim={buffer_dim})."
                        )
                    else:
                        logger.warning(
                            f"GPU stitching ran out of memory for input {tuple(inputs.shape)}; retrying on the CPU."
                        )
                elif buffer_steps > 1:
                    buffer_steps = max(1, buffer_steps // 2)
                    self.buffer_steps = buffer_steps
                    logger.warning(
                        f"Buffered stitching ran out of memory for input {tuple(inputs.shape)}; retrying with "
                        f"buffer_steps={buffer_steps}."
                    )
                else:
                    buffered = False
                    logger.warning(
                        f"Buffered stitching ran out of memory for input {tuple(inputs.shape)}; retrying on the CPU."
                    )
        self.timings = {}
        raise RuntimeError(
            f"SlidingWindowInfererAdapt gave up after {self.max_attempts} attempts for input {tuple(inputs.shape)}: "
            f"{self.attempts}"
        )

    def _finish(self, stitching: str, call_total: float) -> None:
        """Add the adaptation record to ``timings`` and log them."""
        if self.timing and self.timings:
            self.timings["stitching"] = stitching
            self.timings["attempts"] = [dict(a) for a in self.attempts]
            self.timings["call_total"] = call_total
        self._report()
