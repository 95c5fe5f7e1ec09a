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
"""Experiment: how fast can a fresh process copy the checkpoint's weights to the GPU? (issue 50, item 2)

The command maps the checkpoint (``torch.load(mmap=True)``) and moves the network to the GPU tensor by tensor:
0.10-0.15 s of a fresh process for the published 872 MB on H100 hosts (from pageable memory, the driver stages
each copy). Each layout runs in its own fresh process, CUDA started and the file in the page cache first, and times
the copy of every tensor to the GPU (synchronized): ``serial`` (today's), ``threads2`` / ``threads4`` (the tensors
split over threads, each copying on its own stream: the driver's staging copies run on several cores), ``flat``
(one pinned buffer filled on the host, one copy).

    python tests/benchmarks/experiments/weights_to_gpu.py --weights model.pt --repeats 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = r"""
import sys, threading, time
import torch
layout, path = sys.argv[1], sys.argv[2]
torch.zeros(1, device="cuda")
sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
tensors = [v for v in sd.values() if isinstance(v, torch.Tensor)]
start = time.perf_counter()
if layout == "serial":
    out = [t.to("cuda") for t in tensors]
elif layout.startswith("threads"):
    n = int(layout[len("threads"):])
    parts = [tensors[i::n] for i in range(n)]
    outs = [None] * n
    def copy(i):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            outs[i] = [t.to("cuda", non_blocking=False) for t in parts[i]]
        stream.synchronize()
    threads = [threading.Thread(target=copy, args=(i,)) for i in range(n)]
    [t.start() for t in threads]
    [t.join() for t in threads]
elif layout == "flat":
    total = sum(t.numel() * t.element_size() for t in tensors)
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    at = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        host[at:at + n].copy_(t.reshape(-1).view(torch.uint8))
        at += n
    dev = host.to("cuda", non_blocking=True)
torch.cuda.synchronize()
mib = sum(t.numel() * t.element_size() for t in tensors) / 2**20
print(f"{layout} {time.perf_counter() - start:.4f} s {mib:.0f} MiB")
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--layouts", default="serial,threads2,threads4,flat")
    args = p.parse_args(argv)
    with open(args.weights, "rb") as f:  # into the page cache, as a checkpoint read before
        while f.read(1 << 24):
            pass
    for _ in range(args.repeats):
        for layout in args.layouts.split(","):
            run = subprocess.run([sys.executable, "-c", CHILD, layout, args.weights], capture_output=True, text=True)
            print(run.stdout.strip() or run.stderr.strip()[-400:], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
