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
"""Time ``ClassMappingClassify``'s class-to-window product: ``squeeze()`` (MONAI 1.6.1) against ``reshape``.

    python tests/benchmarks/vista3d_class_head.py --device cuda --size 128
"""

from __future__ import annotations

import argparse
import time

import torch


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
    parser.add_argument("--size", type=int, default=32, help="window edge")
    parser.add_argument("--channels", type=int, default=48)
    parser.add_argument("--cases", default="1x1,1x14,14x14,117x1,117x4,117x14", help="classes x windows")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    device, c, s = torch.device(args.device), args.channels, args.size
    print("classes | windows | squeeze ms | reshape ms | ratio")
    for case in args.cases.split(","):
        k, w = (int(v) for v in case.split("x"))
        emb = torch.randn(k, 1, c, device=device)
        src = torch.randn(w, c, s * s * s, device=device)
        old = median_ms(lambda: emb.squeeze() @ src, device, args.repeats, args.warmup)
        new = median_ms(lambda: emb.reshape(-1, c) @ src, device, args.repeats, args.warmup)
        print(f"{k} | {w} | {old:.2f} | {new:.2f} | {old / new:.2f}")


if __name__ == "__main__":
    main()
