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
"""Stage timing and NVTX ranges for inference loops.

:class:`StageTimer` measures wall-clock time per named stage (summed over repeated entries) and counts events.
With ``sync=True`` it synchronises the CUDA device at every stage boundary so that asynchronous kernels are
charged to the stage that launched them; without timing it only marks NVTX ranges (cheap, visible in Nsight
Systems) and never synchronises.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from monai.utils.module import not_carried_names

__all__ = ["StageTimer", "NVTX_NAMES", "WINDOW_STAGES", "cuda_active", "format_timings"]

# upstream's workflow profilers: `from monai.utils.profiling import PerfContext` says they are not carried
__getattr__ = not_carried_names(
    __name__,
    ("PerfContext", "ProfileHandler", "WorkflowProfiler", "select_transform_call", "torch_profiler_full",
     "torch_profiler_time_cpu_gpu", "torch_profiler_time_end_to_end"),
)

# NVTX range of each stage (the loop range wraps every window batch).
NVTX_NAMES = {
    "total": "SW_Inference",
    "loop": "SW_Patchforward_Loop",
    "prepare": "SW_Prepare_Windows",
    "forward": "SW_Model_Computation",
    "stitch": "SW_Stitch",
    "finalize": "SW_Finalize",
}

#: the timed stages of one sliding-window pass, in order (their unaccounted rest is reported as ``other``)
WINDOW_STAGES = ("prepare", "forward", "stitch", "finalize")


def cuda_active() -> bool:
    """Whether this process uses CUDA (the condition for NVTX ranges and synchronisation).

    A process that never initialised CUDA (a CPU run on a GPU machine) has no GPU work to wait for, and must not
    create a CUDA context on GPU 0 to find that out.
    """
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class StageTimer:
    """Accumulates seconds per stage and counts; optionally synchronises CUDA and marks NVTX ranges.

    Args:
        enabled: measure time (``False``: only NVTX ranges, no clock reads, no synchronisation).
        sync: wait for the current CUDA stream at stage boundaries (default: when timing and CUDA is active).
            Only the caller's stream is waited on, so copies a saver thread queued on its own stream keep running.
            Without it, GPU work is charged to whichever later stage waits for it.
        nvtx: mark NVTX ranges (default: when CUDA is active).
        device: where the timed work runs, when known. On any other device than CUDA the defaults of ``sync`` and
            ``nvtx`` are off: a CPU job in a process that also used a GPU has no GPU work to wait for, and must not
            touch the current GPU's stream to find that out.

    Example::

        timer = StageTimer()
        with timer.stage("forward"):
            y = net(x)
        timer.count("batches")
        timer.timings  # {"forward": 0.012, "batches": 1}
    """

    def __init__(
        self,
        enabled: bool = True,
        sync: bool | None = None,
        nvtx: bool | None = None,
        device: torch.device | str | None = None,
    ):
        cuda = cuda_active() and (device is None or torch.device(device).type == "cuda")
        self.enabled = bool(enabled)
        self.sync = bool(enabled and (cuda if sync is None else sync))
        self.nvtx = bool(cuda if nvtx is None else nvtx)
        self.timings: dict[str, Any] = {}
        self._null = nullcontext()

    # -- low level -----------------------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.sync:
            # not torch.cuda.synchronize(): a device-wide wait would also stall on other threads' streams
            torch.cuda.current_stream().synchronize()

    def _push(self, name: str) -> None:
        if self.nvtx:
            torch.cuda.nvtx.range_push(NVTX_NAMES.get(name, name))

    def _pop(self) -> None:
        if self.nvtx:
            torch.cuda.nvtx.range_pop()

    # -- public ------------------------------------------------------------------------------------------------------
    def stage(self, name: str):
        """Context manager adding the time spent inside to ``timings[name]``."""
        if not self.enabled and not self.nvtx:
            return self._null
        return self._stage(name)

    @contextmanager
    def _stage(self, name: str):
        if not self.enabled:
            self._push(name)
            try:
                yield
            finally:
                self._pop()
            return
        self._sync()
        self._push(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
            self._pop()

    def range(self, name: str):
        """An NVTX range only (no timing), e.g. around a loop whose parts are timed separately."""
        if not self.nvtx:
            return self._null
        return self._range(name)

    @contextmanager
    def _range(self, name: str):
        self._push(name)
        try:
            yield
        finally:
            self._pop()

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``timings[name]``."""
        if self.enabled:
            self.timings[name] = self.timings.get(name, 0) + n

    def set(self, name: str, value: Any) -> None:
        """Record a value (a device name, a list of attempts, ...)."""
        if self.enabled:
            self.timings[name] = value


def format_timings(timings: dict[str, Any], title: str = "sliding window") -> str:
    """One readable line: total, each stage with its share of the total, the counts and other values."""
    total = float(timings.get("total", 0.0)) or 1e-12
    parts = [f"{title}: total {timings.get('total', 0.0) * 1e3:.1f} ms"]
    stages = []
    for name in (*WINDOW_STAGES, "other"):
        if name in timings:
            sec = float(timings[name])
            stages.append(f"{name} {sec * 1e3:.1f} ms ({100 * sec / total:.0f}%)")
    if stages:
        parts.append(", ".join(stages))
    extras = []
    for key, value in timings.items():
        if key in ("total", "other", *WINDOW_STAGES) or key == "attempts":
            continue
        extras.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    if "attempts" in timings and len(timings["attempts"]) > 1:
        failed = [f"{a['stitching']}: {a['error']}" for a in timings["attempts"] if a.get("error")]
        extras.append(f"failed attempts [{'; '.join(failed)}]")
    if extras:
        parts.append(", ".join(extras))
    return " | ".join(parts)


def log_timings(logger: logging.Logger, timings: dict[str, Any], title: str = "sliding window") -> None:
    """Log :func:`format_timings` at INFO."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(format_timings(timings, title))
