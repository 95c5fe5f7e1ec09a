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
"""Experiment: is the GPU busy during a fresh process's windows? (issue 50, item 2)

After its first window, the ``vista3d`` command's other windows of a 512x512x200 CT and its label map took
0.34-0.51 s on H100 hosts, against 12.4 ms per window of the fused forward in a warm loop (0.21 s for 17). This runs
the command's ``main`` in this (fresh) process with ``torch.profiler`` over the streamed pass (``stream``) and
prints, for the pass after its first window: its wall time, the time some kernel ran (the union of the kernels'
intervals), the idle gaps between kernels (count and total of those over 50 us), the host's time per window call
against the GPU's, and the kernels that took the most GPU time. Kernel times under the profiler are the GPU's own;
the host's are inflated by the profiler's bookkeeping.

    python tests/benchmarks/experiments/windows_gpu_busy.py -- -i ct.nii.gz -o out --weights model.pt
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.autograd import DeviceType


def _union(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def _gaps(intervals: list[tuple[float, float]], least: float) -> list[tuple[float, float]]:
    """``(start, end)`` of each stretch longer than ``least`` where no interval runs."""
    gaps, end = [], None
    for a, b in sorted(intervals):
        if end is not None and a - end > least:
            gaps.append((end, a))
        end = b if end is None else max(end, b)
    return gaps


def main(argv: list[str]) -> int:
    cli = argv[argv.index("--") + 1:] if "--" in argv else argv
    from monai.apps.vista3d.cli import main as vista3d_main
    from monai.apps.vista3d.core.pipeline import Vista3DPipeline
    from monai.networks.nets.vista3d import VISTA3D

    forward, stream = VISTA3D.forward, Vista3DPipeline.stream
    prof_box: list = []

    def timed_forward(self, *args, **kwargs):
        with torch.profiler.record_function("window call"):
            return forward(self, *args, **kwargs)

    def profiled_stream(self, *args, **kwargs):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.profiler.record_function("stream"):
                out = stream(self, *args, **kwargs)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
        prof_box.append(prof)
        return out

    VISTA3D.forward = timed_forward
    Vista3DPipeline.stream = profiled_stream
    code = vista3d_main.main(cli)
    if not prof_box:
        print("no streamed pass ran", file=sys.stderr)
        return 1
    events = prof_box[0].events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and e.name not in ("stream", "window call")]
    calls = sorted((e for e in events if e.name == "window call"), key=lambda e: e.time_range.start)
    whole = next(e for e in events if e.name == "stream")
    if len(calls) < 2 or not kernels:
        print(f"{len(calls)} window calls, {len(kernels)} kernels: nothing to compare", file=sys.stderr)
        return 1
    # after the first window's call returned: the later windows, the stitch and the label map
    start = calls[0].time_range.end
    later = [(k.time_range.start, k.time_range.end) for k in kernels if k.time_range.start >= start]
    wall = (whole.time_range.end - start) / 1e6
    busy = _union(later) / 1e6
    gaps = _gaps(later, 50.0)
    spans = [b - a for a, b in gaps]
    host = [c.time_range.elapsed_us() / 1e3 for c in calls[1:]]
    per_kernel: dict[str, float] = collections.defaultdict(float)
    for k in kernels:
        if k.time_range.start >= start:
            per_kernel[k.name] += k.time_range.elapsed_us() / 1e3
    print(f"after the first window: {len(calls) - 1} window calls, wall {wall:.3f} s, a kernel running {busy:.3f} s "
          f"({100 * busy / wall:.0f} %), {len(gaps)} gaps over 50 us totalling {sum(spans) / 1e6:.3f} s "
          f"(largest {max(spans, default=0) / 1e3:.1f} ms)")
    print(f"host time per window call (profiled): median {sorted(host)[len(host) // 2]:.1f} ms, "
          f"min {min(host):.1f}, max {max(host):.1f}")
    print("GPU ms after the first window, by kernel (top 15):")
    for name, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {ms:9.2f}  {name[:110]}")
    # what the host did while the GPU waited: the longest host events (ops, CUDA runtime calls) inside each gap
    host_events = [e for e in events if e.device_type != DeviceType.CUDA and e.name not in ("stream", "window call")]
    print("the largest gaps (ms from the first window's return), with the longest host events overlapping them:")
    for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:6]:
        inside = [e for e in host_events if e.time_range.start < b and e.time_range.end > a]
        inside.sort(key=lambda e: -min(e.time_range.end, b) + max(e.time_range.start, a))
        what = ", ".join(f"{e.name[:48]} {(min(e.time_range.end, b) - max(e.time_range.start, a)) / 1e3:.1f}"
                         for e in inside[:5])
        print(f"  at {(a - start) / 1e3:8.1f}  {(b - a) / 1e3:6.1f} ms: {what}")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
