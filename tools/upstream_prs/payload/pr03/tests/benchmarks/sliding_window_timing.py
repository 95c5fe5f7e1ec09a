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
"""What ``SlidingWindowInfererAdapt(timing=True)`` reports for several ``sw_batch_size`` values.

    python tests/benchmarks/sliding_window_timing.py --device cuda --size 288,288,240 --roi 128 --model vista3d

For each batch size: the median latency with ``timing=False`` and the ``forward``/``other`` split of a
``timing=True`` call (``--model conv``: one convolution, to show the inferer's own costs).
"""

from __future__ import annotations

import argparse
import time

import torch

from monai.inferers import SlidingWindowInfererAdapt
from monai.networks.nets import vista3d132


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default="96,96,64")
    parser.add_argument("--roi", type=int, default=32)
    parser.add_argument("--model", choices=("conv", "vista3d"), default="conv")
    parser.add_argument("--classes", type=int, default=117)
    parser.add_argument("--sw-batch-sizes", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    image = torch.randn(1, 1, *(int(v) for v in args.size.split(",")), device=device)
    if args.model == "conv":
        conv = torch.nn.Conv3d(1, args.classes, 3, padding=1).to(device)
        net = conv
    else:
        model = vista3d132().to(device).eval()
        classes = torch.arange(1, args.classes + 1, device=device).view(-1, 1)

        def net(x):
            return model(x, class_vector=classes, transpose=True)

    print("sw_batch_size | batches | latency ms | forward ms | other ms")
    for bs in (int(v) for v in args.sw_batch_sizes.split(",")):
        roi = (args.roi,) * 3
        plain, timed = SlidingWindowInfererAdapt(roi, bs), SlidingWindowInfererAdapt(roi, bs, timing=True)
        times = []
        with torch.no_grad():
            for _ in range(args.repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                plain(image, net)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append((time.perf_counter() - start) * 1e3)
            timed(image, net)
        t = timed.timings
        latency = sorted(times)[len(times) // 2]
        print(f"{bs} | {t['batches']} | {latency:.1f} | {t['forward'] * 1e3:.1f} | {t['other'] * 1e3:.1f}")


if __name__ == "__main__":
    main()
