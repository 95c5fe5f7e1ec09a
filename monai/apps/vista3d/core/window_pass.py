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
"""The network's passes over one preprocessed image: every class's logits over sliding windows, the streamed label
map (and masks), or the windows around clicks; what each pass ran, and the wrapper around the network that counts
the windows and drives the progress bar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from monai.apps.vista3d.errors import PromptError
from monai.utils.profiling import WINDOW_STAGES

from .auto_batch_store import AutoBatchStore, measured_costs, network_identity
from .postprocess import ClassMasks
from .progress import WindowProgress, between_windows

__all__ = ["WindowPass", "CountingPredictor", "PassSettings", "WindowPasses"]


@dataclass
class WindowPass:
    """What one network pass over an image ran.

    Attributes:
        windows: windows given to the network.
        sw_batch_size: the largest window batch of the pass (what ``"auto"`` chose).
        stages: seconds of the sliding-window stages as ``inference/<stage>``, when the inferer measured them.
    """

    windows: int
    sw_batch_size: int
    stages: dict[str, float] = field(default_factory=dict)


class CountingPredictor:
    """Wraps the network: runs the caller's check between windows (:func:`~.progress.stop_between_windows`),
    advances a progress counter and records the windows of each call."""

    def __init__(self, network: Callable):
        self.network = network
        self.progress: WindowProgress | None = None
        self.batches: list[int] = []
        self.auto_batch_key: tuple | None = None  # what "auto"'s costs are kept under (None: this object)

    def start(self, progress: WindowProgress) -> None:
        """Begin one image's pass."""
        self.progress, self.batches = progress, []

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        between_windows()  # a cancelled job stops here, before its next window
        out = self.network(x, *args, **kwargs)
        self.batches.append(int(x.shape[0]))
        if self.progress is not None:
            self.progress.update(int(x.shape[0]))
        return out

    def finish(self, stages: dict[str, float] | None = None) -> WindowPass:
        """End the pass: what it ran (the probe batch of ``sw_batch_size="auto"`` does not count as the size)."""
        if self.progress is not None:
            self.progress.close()
        sizes = self.batches[1:] if len(self.batches) > 1 else self.batches
        return WindowPass(sum(self.batches), max(sizes, default=0), dict(stages or {}))


@dataclass(frozen=True)
class PassSettings:
    """The resolved settings of a pipeline's passes (see :class:`~monai.apps.vista3d.config.PipelineOptions`).

    Attributes:
        roi_size: the window, three ints (checked against the network by the pipeline).
        overlap: window overlap.
        sw_batch_size: windows per network call, or ``"auto"``.
        amp: float16 autocast (on CUDA only).
        progress: a progress bar over the windows.
        timing: ask the sliding-window inferer for its stage timings.
        window_add: the stitch adds windows with the fused path's Triton kernel.
    """

    roi_size: tuple[int, int, int]
    overlap: float
    sw_batch_size: int | str
    amp: bool
    progress: bool
    timing: bool
    window_add: bool = False


class WindowPasses:
    """Runs a network over preprocessed images with one pipeline's settings.

    It keeps what outlives an image: the sliding-window inferer, the costs that ``sw_batch_size="auto"`` measured
    (one probe for the full-logits and the streamed passes of one window, channels and classes), and the counting
    wrapper of the network.

    Args:
        network: the VISTA3D-like module (called with ``transpose=True``).
        device: where the network runs; label maps and masks are returned there.
        settings: the resolved settings.
        store: where the costs of ``"auto"`` outlive the process (:class:`~.auto_batch_store.AutoBatchStore`):
            read here, written after a pass that measured a new one; None: kept in this object only.
    """

    def __init__(
        self, network: Callable, device: torch.device, settings: PassSettings, store: AutoBatchStore | None = None
    ):
        self.network, self.device, self.settings, self.store = network, device, settings, store
        self.counting = CountingPredictor(network)
        self._inferer: Any = None
        self._auto_cache: dict = {}
        if store is not None:
            # keyed by what the costs depend on, not by this process's objects: a later process finds them
            self.counting.auto_batch_key = network_identity(network, device, settings.amp)
            self._auto_cache = store.load()
        self._stored = set(self._auto_cache)

    def _keep_costs(self) -> None:
        """Write the costs to the store when a pass measured one it did not hold."""
        if self.store is not None and set(measured_costs(self._auto_cache)) - self._stored:
            self.store.save(self._auto_cache)
            self._stored = set(measured_costs(self._auto_cache))

    def autocast(self) -> Any:
        """float16 autocast where ``amp`` asks for it on CUDA, else nothing."""
        if self.settings.amp and self.device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.float16)
        return nullcontext()

    def class_vector(self, label_ids: Sequence[int] | None) -> torch.Tensor:
        """``[C, 1]`` label ids on the device, as the network takes a class prompt."""
        if not label_ids:
            raise PromptError("no classes to segment")
        return torch.as_tensor(list(label_ids), device=self.device).view(-1, 1)

    def logits(
        self,
        x: torch.Tensor,
        label_ids: Sequence[int] | None = None,
        point_coords: torch.Tensor | None = None,
        point_labels: torch.Tensor | None = None,
        prev_mask: torch.Tensor | None = None,
        point_start: int = 0,
        network: Callable | None = None,
        title: str = "windows",
    ) -> tuple[torch.Tensor, WindowPass]:
        """Every prompted class's logits (see :meth:`~.pipeline.Vista3DPipeline.infer`): ``([1, C, X, Y, Z], what
        ran)``; ``network`` is called in the network's place."""
        inp = x[None] if x.ndim == 4 else x
        predictor = self.counting if network is None else CountingPredictor(network)
        with torch.no_grad(), self.autocast():
            if point_coords is None:
                logits, run = self._class_logits(inp, label_ids, predictor, title)
            else:
                if point_labels is None:
                    raise PromptError("points need their labels (1 positive, 0 negative), one per point")
                logits, run = self._point_logits(inp, label_ids, point_coords, point_labels, prev_mask, point_start,
                                                 predictor)
        return (logits[0] if isinstance(logits, (tuple, list)) else logits), run

    def _class_logits(
        self, inp: torch.Tensor, label_ids: Sequence[int] | None, predictor: CountingPredictor, title: str
    ) -> tuple[torch.Tensor, WindowPass]:
        cv = self.class_vector(label_ids)
        progress = WindowProgress(None, self.settings.progress, title)  # its total: the pass's plan
        predictor.start(progress)
        inferer = self._sliding_inferer()
        inferer.on_plan = progress.planned
        try:
            logits = inferer(inp, predictor, transpose=True, class_vector=cv, prompt_class=cv, point_coords=None,
                             point_labels=None, labels=None, label_set=None, prev_mask=None)
        finally:
            measured = dict(inferer.timings) if self.settings.timing else {}
            stages = {f"inference/{k}": float(measured[k]) for k in (*WINDOW_STAGES, "other", "total")
                      if k in measured}
            run = predictor.finish(stages)
        self._keep_costs()
        return logits, run

    def _point_logits(
        self,
        inp: torch.Tensor,
        label_ids: Sequence[int] | None,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        prev_mask: torch.Tensor | None,
        point_start: int,
        predictor: CountingPredictor,
    ) -> tuple[torch.Tensor, WindowPass]:
        from monai.apps.vista3d.inferer import point_based_window_inferer

        pc = None if label_ids is None else torch.as_tensor(list(label_ids), device=self.device).view(-1, 1)
        predictor.start(WindowProgress(int(point_coords.shape[1]) - point_start, self.settings.progress))
        try:
            logits = point_based_window_inferer(
                inp, self.settings.roi_size, predictor, point_coords, point_labels, class_vector=None,
                prompt_class=pc, prev_mask=prev_mask, point_start=point_start, device=self.device, transpose=True,
                with_coord=True,
            )
        finally:
            run = predictor.finish()
        return logits, run

    def stream(
        self, x: torch.Tensor, label_ids: Sequence[int], masks: bool, title: str = "windows"
    ) -> tuple[torch.Tensor, ClassMasks | None, WindowPass]:
        """The streamed pass (see :meth:`~.pipeline.Vista3DPipeline.stream`): ``([X, Y, Z] int16 labels,
        masks or None, what ran)`` on the device."""
        from .streaming import sliding_window_label_inference

        cv = self.class_vector(label_ids)
        inp = x[None] if x.ndim == 4 else x
        progress = WindowProgress(None, self.settings.progress, title)  # its total: the pass's plan
        self.counting.start(progress)
        s = self.settings
        try:
            with torch.no_grad(), self.autocast():
                out = sliding_window_label_inference(
                    inp, s.roi_size, s.sw_batch_size, self.counting, overlap=s.overlap, with_coord=True,
                    label_ids=torch.as_tensor(list(label_ids)), auto_cache=self._auto_cache, return_masks=masks,
                    on_plan=progress.planned, transpose=True, class_vector=cv, prompt_class=cv,
                )
        finally:
            run = self.counting.finish()
        self._keep_costs()
        if isinstance(out, tuple):  # the labels and, with masks, the packed masks
            labels, packed = out[0], out[1][0].to(self.device)
        else:
            labels, packed = out, None
        class_masks = None if packed is None else ClassMasks(packed, list(label_ids))
        return labels[0, 0].to(device=self.device, dtype=torch.int16), class_masks, run

    def _sliding_inferer(self) -> Any:
        """The sliding-window inferer, kept across images so that ``sw_batch_size="auto"`` probes only once."""
        from monai.inferers import SlidingWindowInfererAdapt

        if self._inferer is None:
            s = self.settings
            self._inferer = SlidingWindowInfererAdapt(
                roi_size=s.roi_size, sw_batch_size=s.sw_batch_size, overlap=s.overlap, with_coord=True,
                timing=s.timing, window_add=s.window_add, auto_cache=self._auto_cache,
            )
        return self._inferer
