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
"""Where the fused forward of one window spends the time its kernels do not (issue 50, item 4; not on any path).

``vista3d_fused.py --forward`` times each forward alone (events around it, then a synchronisation); at one window on
an H100 (35a952c) that is 12.3 ms against 11.9 ms of kernels. This times, with events and no profiler, the same
forward alone and back to back (20 in a row, one synchronisation: what a sliding window's loop does), the graph's
replay alone (``run``: the input's copy and the replay) and what follows it (the class embedding and the product)::

    python tests/benchmarks/experiments/one_window_host.py

Measured on an H100 (35a952c, docs/notes/h100-2026-12-07c/call4): alone 12.32 ms, 20 in a row 12.42 per forward,
the replay alone 12.12, the embedding and product alone 0.55. Queuing ahead hides nothing: what the kernels do not
account for is idle time inside the replayed graph, not the host's.
"""

from __future__ import annotations

import torch

from tests.benchmarks.vista3d_fused import BASE, bench, build_net, everything_labels


def main(repeats: int = 20) -> None:
    dev = torch.device("cuda")
    # vista3d_fused.py's forward of one window: random vista3d132, 117 classes
    net = build_net(False, dev).fuse(BASE)
    cv = torch.tensor(everything_labels()[:117], device=dev).view(-1, 1)
    x = torch.rand((1, 1, 128, 128, 128), generator=torch.Generator().manual_seed(0)).to(dev)
    fused = net._fused

    def run():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            return net(x, class_vector=cv, transpose=True)

    def in_a_row():
        for _ in range(repeats):
            run()

    def features():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            return fused.run(x)

    def head():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            return fused._project(feats, fused._class_embedding(cv, torch.float16))  # feats: as fused.run gives them

    alone = bench(run, True, repeats)
    row = bench(in_a_row, True, 5) / repeats
    feats = features()
    print(f"one window, alone (events around each forward): {alone:.3f} ms")
    print(f"one window, {repeats} in a row (one synchronisation): {row:.3f} ms per forward")
    print(f"the features' replay alone (input copy + graph): {bench(features, True, repeats):.3f} ms")
    print(f"the class embedding and the product alone: {bench(head, True, repeats):.3f} ms")


if __name__ == "__main__":
    main()
