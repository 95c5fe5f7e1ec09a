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
"""How long a replayed CUDA graph leaves an idle GPU before its first kernel, by the graph's size (issue 50, item 4;
not on any path).

At one window the fused forward's profile (H100, docs/notes/h100-2026-12-07c/call2) shows 190 us of idle GPU between
the copy of the window into the graph's input buffer and the graph's first kernel: the replay's launch. This times,
from an idle GPU, ``copy_`` then ``replay()`` of graphs of ``n`` small kernels, the copy's end to the end of the
first kernel (events), and the host's time in ``replay()``; then the same work as two graphs, a short one first
(``--first`` kernels), to see whether the GPU starts on the short graph while the host launches the long one; then
300 kernels followed by a cuDNN transposed convolution or a biased GEMM, whose memset nodes the forward's graph
has::

    python tests/benchmarks/experiments/graph_launch.py

Measured on an H100 (docs/notes/h100-2026-12-07c/call3): the replay's launch costs 4-6 us of host time and the
first kernel follows the copy within ~8 us whatever the size (1 to 600 kernels), and splitting gains nothing. The
forward's 190 us is not the launch of a large graph of plain kernels, nor of memset nodes (call1 of
docs/notes/h100-2026-12-07d: 300 kernels and a cuDNN transposed convolution 462.6 us after the copy against 455.5
alone; with a biased GEMM 469.1 against 465.4).
"""

from __future__ import annotations

import argparse
import time

import torch


def _capture(work: torch.Tensor, n: int, tail=None) -> torch.cuda.CUDAGraph:
    """A graph of ``n`` small kernels, then ``tail()`` (a library call whose nodes the forward's graph has)."""

    def body():
        for _ in range(n):
            work.add_(1)
        if tail is not None:
            tail()

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()  # warm-up outside the capture: cuDNN's and cuBLAS's plans
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        body()
    return graph


def _library_tails() -> dict:
    """Calls that put memset nodes into the forward's graph (the profile's "Memset (Unknown)"): cuDNN's transposed
    convolution (dgrad) and a GEMM with bias over many rows, as the fused forward runs them, fp16 channels-last."""
    import torch.nn.functional as F

    x = torch.randn(1, 128, 32, 32, 32, device="cuda").half().contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(128, 64, 3, 3, 3, device="cuda").half().contiguous(memory_format=torch.channels_last_3d)
    rows = torch.randn(1 << 18, 64, device="cuda").half()
    lw, lb = torch.randn(128, 64, device="cuda").half(), torch.randn(128, device="cuda").half()
    return {
        "conv_transpose3d": lambda: F.conv_transpose3d(x, w, None, 2, 1, 1),
        "linear with bias": lambda: F.linear(rows, lw, lb),
    }


def _time(graphs: list[torch.cuda.CUDAGraph], src: torch.Tensor, dst: torch.Tensor, repeats: int) -> tuple:
    """Median (copy's end to the end of everything, ms; host time in the replays, us)."""
    gpu, host = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        copied, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dst.copy_(src)
        copied.record()
        t0 = time.perf_counter()
        for g in graphs:
            g.replay()
        host.append(1e6 * (time.perf_counter() - t0))
        done.record()
        torch.cuda.synchronize()
        gpu.append(copied.elapsed_time(done))
    return sorted(gpu)[repeats // 2], sorted(host)[repeats // 2]


def _busy(graph: torch.cuda.CUDAGraph) -> float:
    """Milliseconds of the graph's replay behind a queue of work (its launch hidden): its kernels' own time."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10_000_000)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def main(sizes=(1, 50, 150, 300, 600), first: int = 8, repeats: int = 50) -> None:
    src = torch.randn(1 << 21, device="cuda")
    dst = torch.empty_like(src)
    work = torch.zeros(1024, device="cuda")
    # the kernels' own time: n launches back to back in one graph on a busy GPU
    for n in sizes:
        one = _capture(work, n)
        kernels = _busy(one)
        ms, us = _time([one], src, dst, repeats)
        text = f"n={n:4d}: one graph {ms * 1e3:7.1f} us after the copy (kernels alone {kernels * 1e3:7.1f} us), "
        text += f"host {us:6.1f} us"
        if n > first:
            split = [_capture(work, first), _capture(work, n - first)]
            ms2, us2 = _time(split, src, dst, repeats)
            text += f" | {first} + {n - first}: {ms2 * 1e3:7.1f} us, host {us2:6.1f} us"
        print(text)
    for name, tail in _library_tails().items():
        with torch.backends.cudnn.flags(enabled=True, benchmark=True):
            g = _capture(work, 300, tail)
        ms, us = _time([g], src, dst, repeats)
        busy = sorted(_busy(g) for _ in range(5))[2]
        print(f"n= 300 + {name}: {ms * 1e3:7.1f} us after the copy (alone {busy * 1e3:7.1f} us), host {us:6.1f} us")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", type=int, default=8, help="kernels in the short first graph of the split form")
    a = p.parse_args()
    main(first=a.first)
