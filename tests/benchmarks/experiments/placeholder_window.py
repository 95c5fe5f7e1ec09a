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
"""Experiment: the first window's kernels loaded by a placeholder network while the checkpoint loads (issue 50, item 2)

A fresh process's first forward costs 0.18-0.29 s on H100 hosts against ~0.012 s warm: Triton's 22 kernels are
looked up in its cache and loaded into the CUDA context, and each kernel's first launch sets itself up. None of that
needs the weights. This runs the ``vista3d`` command under ``process_timeline.py`` (the same arguments) with one
change: when the network is readied, a thread builds a placeholder ``vista3d132`` of the same width on the GPU with
uninitialised weights (``to_empty``), fuses it with the command's configuration and runs one window of zeros
through it (the pipeline's own window call, the everything prompt), while the main thread reads the checkpoint as
usual; the real first forward then finds the kernels loaded. Compare its timeline with the plain one.

    python tests/benchmarks/experiments/placeholder_window.py exit=fast -- -i ct.nii.gz -o out --weights model.pt
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import process_timeline  # noqa: E402  (its marks start with this process)


def _placeholder_window(network_kwargs: dict | None, device: torch.device, fuse) -> None:
    from monai.apps.vista3d.labels import everything_labels
    from monai.networks.nets import vista3d132

    process_timeline.mark(f"placeholder build called [{threading.current_thread().name}]")
    with torch.device("meta"):
        net = vista3d132(**(network_kwargs or {}))
    net = net.to_empty(device=device).eval()
    net.fuse(None if fuse is True else fuse)
    process_timeline.mark(f"placeholder fused [{threading.current_thread().name}]")
    ids = list(everything_labels())
    cv = torch.as_tensor(ids, device=device).view(-1, 1)
    x = torch.zeros((1, 1, 128, 128, 128), device=device)
    coords = [(slice(None), slice(None), slice(0, 128), slice(0, 128), slice(0, 128))]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        net(x, patch_coords=coords, class_vector=cv, prompt_class=cv, transpose=True)
    torch.cuda.synchronize(device)
    process_timeline.mark(f"placeholder window done [{threading.current_thread().name}]")


def main(argv: list[str]) -> int:
    from monai.apps.vista3d.core import network_ready

    ready = network_ready.ready_network

    def ready_with_placeholder(network, weights, network_kwargs, device, fuse):
        if network is None and weights is not None and device.type == "cuda" and fuse is not False:
            threading.Thread(target=_placeholder_window, args=(network_kwargs, device, fuse),
                             name="placeholder", daemon=True).start()
        return ready(network, weights, network_kwargs, device, fuse)

    network_ready.ready_network = ready_with_placeholder
    from monai.apps.vista3d.core import pipeline

    pipeline.ready_network = ready_with_placeholder  # the name the pipeline calls
    return process_timeline.main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
