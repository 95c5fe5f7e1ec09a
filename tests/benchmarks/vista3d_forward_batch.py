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
"""What a window batch costs: VISTA3D forward time and peak memory per window, by ``sw_batch_size``.

The streamed label map holds little besides the network's own working set, so its peak memory is set by the
window batch; this shows what a smaller batch saves in memory and costs in time. With ``--profile`` the CUDA
kernels of one batch are listed (the ten largest by device time) for each batch size.

    python tests/benchmarks/vista3d_forward_batch.py --device cuda --sw-batch-sizes 1,2,4,8,14 --profile 1,4
    python tests/benchmarks/vista3d_forward_batch.py       # CPU: the tiny network, 32^3 windows
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vista3d_everything import build_net, everything_labels  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sw-batch-sizes", default="1,2,4")
    p.add_argument("--classes", type=int, default=117)
    p.add_argument("--roi", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", default="", help="batch sizes to list the CUDA kernels of, e.g. 1,4")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    roi = a.roi or (128 if cuda else 32)
    net = build_net(not cuda, dev)
    cv = torch.tensor(everything_labels()[: a.classes], device=dev).view(-1, 1)
    amp = dict(device_type=dev.type, dtype=torch.float16, enabled=cuda)
    profile = {int(b) for b in a.profile.split(",") if b}

    def forward(x):
        with torch.no_grad(), torch.autocast(**amp):
            return net(x, class_vector=cv, prompt_class=cv, transpose=True)

    rows = []
    print(f"{'sw_batch_size':>13s} {'ms / batch':>10s} {'ms / window':>11s} {'peak GiB':>9s} {'GiB / window':>12s}")
    for bs in (int(b) for b in a.sw_batch_sizes.split(",")):
        x = torch.rand((bs, 1, roi, roi, roi), generator=torch.Generator().manual_seed(0)).to(dev)
        out = forward(x)  # warm-up (cuDNN picks its kernels for this shape)
        del out
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            out = forward(x)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            del out
        med = sorted(times)[len(times) // 2]
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else float("nan")
        rows.append({"sw_batch_size": bs, "ms_per_batch": 1e3 * med, "ms_per_window": 1e3 * med / bs,
                     "peak_gib": peak, "gib_per_window": peak / bs, "times_s": times})
        print(f"{bs:13d} {1e3 * med:10.1f} {1e3 * med / bs:11.2f} {peak:9.2f} {peak / bs:12.2f}", flush=True)
        if bs in profile and cuda:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                forward(x)
                torch.cuda.synchronize()
            print(f"--- CUDA kernels of one batch of {bs}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=70))
        del x
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
