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
"""Where the host's time goes in one eager fused forward of one window (issue 50; not on any path).

A one-CT ``vista3d`` process runs its windows one at a time without CUDA graphs (``fused_for_images``), and there
the torch profiler had the host setting the pace (H100, 35a952c, ``run_h200.sh fused_idle_eager``: 25.1 ms per
window against 12.0 ms of kernels). This runs ``repeats`` such forwards under ``cProfile`` (after two warm-up calls) and
prints the functions by their own time and by their cumulative time, per forward::

    python tests/benchmarks/experiments/eager_host_profile.py

Measured on an H100 (docs/notes/h100-2026-12-07c/call5): 12.34 ms per forward without a profiler, as fast as the
graph's replay: the GPU sets the pace. Under cProfile the host takes 19 ms per forward (cProfile's own overhead
included): Triton's launcher 6.8 of it, the norm passes 5.5, the resident convolutions 5.0. The torch profiler's
25.1 ms was its own overhead.
"""

from __future__ import annotations

import cProfile
import dataclasses
import pstats
import time

import torch

from tests.benchmarks.vista3d_fused import BASE, fused_forward


def main(repeats: int = 10) -> None:
    run = fused_forward(torch.device("cuda"), 1, 128, 117, dataclasses.replace(BASE, graph_max_windows=0))
    run()
    run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    print(f"{1e3 * (time.perf_counter() - t0) / repeats:.2f} ms per eager forward of one window (no profiler)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"--- by own time (all {repeats} forwards)")
    stats.sort_stats("tottime").print_stats(30)
    print(f"--- by cumulative time (all {repeats} forwards)")
    stats.sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main()
