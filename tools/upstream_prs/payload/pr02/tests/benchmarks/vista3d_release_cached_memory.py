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
"""Time a VISTA3D forward with ``release_cached_memory`` True (MONAI 1.6.1's calls) and False (the default).

    python tests/benchmarks/vista3d_release_cached_memory.py --device cuda --size 128 --windows 1,14

Prints the median forward time and, on CUDA, the allocated and reserved peaks of each setting; the outputs of the
two settings are checked to be equal before timing.
"""

from __future__ import annotations

import argparse
import time

import torch

from monai.networks.nets import vista3d132


def median_ms(fn, device: torch.device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=64, help="window edge")
    parser.add_argument("--windows", default="1", help="comma-separated window batch sizes")
    parser.add_argument("--classes", type=int, default=117)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    net = vista3d132().to(device).eval()
    classes = torch.arange(1, args.classes + 1, device=device).view(-1, 1)
    print("windows | release_cached_memory | ms | allocated peak MiB | reserved peak MiB")
    for w in (int(v) for v in args.windows.split(",")):
        image = torch.randn(w, 1, args.size, args.size, args.size, device=device)
        outputs = {}
        for release in (True, False):
            net.release_cached_memory = release
            with torch.no_grad():
                outputs[release] = net(image, class_vector=classes)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                ms = median_ms(lambda: net(image, class_vector=classes), device, args.repeats, args.warmup)
            peaks = "n/a | n/a"
            if device.type == "cuda":
                peaks = f"{torch.cuda.max_memory_allocated(device) / 2**20:.1f} | "
                peaks += f"{torch.cuda.max_memory_reserved(device) / 2**20:.0f}"
            print(f"{w} | {release} | {ms:.1f} | {peaks}")
        if not torch.equal(outputs[True], outputs[False]):
            raise SystemExit("outputs differ between the two settings")


if __name__ == "__main__":
    main()
