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
"""Experiment: where a click's time goes. The clicks of ``vista3d_clicks.py`` (a ``Vista3DSession`` of the published
network on the 512x512x200 phantom, random weights, fp16, fused on CUDA) after a warm-up sequence, under the torch
profiler: the operators by their own device time and by host time, and each click's stages.

    python tests/benchmarks/experiments/click_profile.py --device cuda [--no-fuse] [--rows 25]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    from vista3d_clicks import SPACING, click_sequence
    from vista3d_everything import build_net

    from monai.apps.vista3d.cli.phantom import make_phantom, make_phantom_labels
    from monai.apps.vista3d.core.pipeline import Vista3DPipeline
    from monai.apps.vista3d.core.session import Vista3DSession

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-fuse", action="store_true")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--size", default="512x512x200")
    args = p.parse_args(argv)
    shape = tuple(int(v) for v in args.size.split("x"))
    dev = torch.device(args.device)
    torch.manual_seed(0)
    net = build_net(dev.type == "cpu", dev, None)
    pipe = Vista3DPipeline(network=net, device=dev, roi_size=128 if dev.type == "cuda" else 32, fuse=False,
                           warn_random=False)
    if not args.no_fuse and dev.type == "cuda":
        net.fuse()
    hu, affine = make_phantom(shape, SPACING, 0)
    clicks = click_sequence(make_phantom_labels(shape, SPACING, 0), 3)
    session = Vista3DSession(pipe, torch.from_numpy(hu).to(dev), affine)
    for point, label in clicks:  # warm-up: kernels, graphs, plans
        session.click([point], [label])
    session.reset()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda"
                                                         else [])
    with torch.profiler.profile(activities=activities) as prof:
        for point, label in clicks:
            session.click([point], [label])
            print("click stages ms:", {k: round(1000 * v, 1) for k, v in session.timings.items()})
    averages = prof.key_averages()
    if dev.type == "cuda":
        print(averages.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    print(averages.table(sort_by="cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
