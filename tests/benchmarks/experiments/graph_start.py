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
"""What the fused forward's own graph does before its first kernel (issue 50, item 4; not on any path).

At one window the profile shows ~120 us of idle GPU between the copy of the window into the graph's input buffer
and the graph's first kernel, where graphs of plain kernels, and of cuDNN's and cuBLAS's memset nodes, start within
~10 us (``graph_launch.py``). This captures the real forward's features with CUDA's graph debug mode on, writes the
graph (DOT) and counts its nodes by type and its roots, then times with events the copy, the replay alone and two
replays back to back, the host's time in the call, and lists the runtime calls and first kernels of one profiled
replay::

    python tests/benchmarks/experiments/graph_start.py --out DIR

Measured on an H100 (docs/notes/h100-2026-12-07d/call2): a chain of 199 nodes (193 kernels, 6 memsets, one root);
the replay alone 11.88 ms, two back to back 23.47; inside the graph 0.11 ms of gaps; the host 0.016 ms in
``replay()``, 0.072 ms in the features' call, 1.0 ms queuing one window's forward, no synchronisation. The ~120 us
before the first kernel appears under the profiler only (``cudaGraphLaunch`` takes 0.34 ms there).
"""

from __future__ import annotations

import argparse
import collections
import re
import time

import torch

from tests.benchmarks.vista3d_fused import BASE, build_net, everything_labels

_TYPES = ("KERNEL", "MEMSET", "MEMCPY", "EVENT_RECORD", "WAIT_EVENT", "MEM_ALLOC", "MEM_FREE", "HOST", "EMPTY",
          "GRAPH", "CONDITIONAL", "BATCH_MEM_OP", "EXT_SEMAS")  # fmt: skip


def dot_summary(path: str) -> None:
    text = open(path).read()
    nodes = re.findall(r'^"?(\w+)"?\s*\[', text, flags=re.M)
    edges = re.findall(r'"?(\w+)"?\s*->\s*"?(\w+)"?', text)
    targets = {b for _, b in edges}
    roots = [n for n in nodes if n not in targets and n not in ("graph", "node", "edge")]
    kinds = collections.Counter()
    for word in _TYPES:
        kinds[word] = len(re.findall(rf"\b{word}\b", text))
    print(f"graph: {len(nodes)} nodes, {len(edges)} edges, {len(roots)} roots; type words {dict(kinds)}")
    for r in roots[:8]:
        m = re.search(rf'^"?{r}"?\s*\[(.*?)\];?\s*$', text, flags=re.M | re.S)
        print(f"  root {r}: {re.sub(r'<[^>]+>', ' ', m.group(1))[:300] if m else '?'}")


def events_ms(fn, repeats: int = 10) -> float:
    best = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        best.append(a.elapsed_time(b))
    best.sort()
    return best[len(best) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    a = p.parse_args()
    real_graph = torch.cuda.CUDAGraph

    class DebugGraph(real_graph):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(keep_graph=True)  # (the graph itself, not only its executable, for debug_dump)
            self.enable_debug_mode()

    torch.cuda.CUDAGraph = DebugGraph  # type: ignore[misc]
    dev = torch.device("cuda")
    net = build_net(False, dev).fuse(BASE)
    x = torch.rand((1, 1, 128, 128, 128), generator=torch.Generator().manual_seed(0)).to(dev)
    fused = net._fused

    def features():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            return fused.run(x)

    features()
    features()
    torch.cuda.CUDAGraph = real_graph  # type: ignore[misc]
    captured = next(iter(fused.run._graphs.values()))
    dot = f"{a.out}/forward_graph.dot"
    captured.graph.debug_dump(dot)
    dot_summary(dot)
    buf, graph = captured.inputs[0], captured.graph

    def copy():
        buf.copy_(x)

    def two():
        graph.replay()
        graph.replay()

    print(f"features() (copy + replay): {events_ms(features):.3f} ms")
    print(f"the copy alone: {events_ms(copy):.3f} ms")
    print(f"replay alone: {events_ms(graph.replay):.3f} ms")
    print(f"two replays back to back: {events_ms(two):.3f} ms")
    host = []
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
    print(f"host time in replay(): median {sorted(host)[5]:.3f} ms, all {[round(h, 3) for h in host]}")
    cache = fused.run
    steps = []
    for _ in range(10):  # GraphCache.__call__'s steps, each timed on the host from a synchronised GPU
        torch.cuda.synchronize()
        t = [time.perf_counter()]
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            t.append(time.perf_counter())
            cache._signature((x,))
            t.append(time.perf_counter())
            _ = tuple((q.data_ptr(), q._version) for q in cache.params)
            t.append(time.perf_counter())
            buf.copy_(x)
            t.append(time.perf_counter())
            graph.replay()
            t.append(time.perf_counter())
        steps.append([(b - a) * 1e3 for a, b in zip(t, t[1:])])
    names = ("enter no_grad + autocast", "signature", "fingerprint", "copy_", "replay")
    med = [sorted(col)[5] for col in zip(*steps)]
    print("host ms per step (median of 10): " + ", ".join(f"{n} {m:.3f}" for n, m in zip(names, med)))
    for fn, name in ((features, "features()"), (copy, "copy()")):
        host = []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
        print(f"host time in {name}: median {sorted(host)[5]:.3f} ms")
    cv = torch.tensor(everything_labels()[:117], device=dev).view(-1, 1)

    def window():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            return net(x, class_vector=cv, transpose=True)

    window()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")  # names any synchronising call in one window's forward
    t0 = time.perf_counter()
    window()
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    print(f"host time in one window's forward: {host_ms:.3f} ms (a synchronisation inside would make this ~12 ms)")
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        features()
        torch.cuda.synchronize()
    evs = sorted(prof.events(), key=lambda e: e.time_range.start)
    t0 = evs[0].time_range.start
    print("runtime calls and the first device events of one profiled features() (us from the first event):")
    shown_gpu = 0
    for e in evs:
        on_gpu = e.device_type.name == "CUDA"
        if on_gpu and shown_gpu >= 6:
            continue
        if not on_gpu and not e.name.startswith(("cuda", "cu", "aten::copy_")):
            continue
        shown_gpu += on_gpu
        start = e.time_range.start - t0
        print(f"  {'GPU' if on_gpu else 'CPU'} {start:9.1f} +{e.time_range.elapsed_us():8.1f}  {e.name[:70]}")
    prof.export_chrome_trace(f"{a.out}/features_trace.json")


if __name__ == "__main__":
    main()
