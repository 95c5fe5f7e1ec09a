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
"""The Triton 3x3x3 convolution of this folder against cuDNN, fp16, median of 5 (docs/CHANGELOG.md).

Run from the repository root on a CUDA machine: ``python3 -m tests.benchmarks.experiments.triton_conv3d.time_triton``.
"""

import time

import torch
import torch.nn.functional as F

from tests.benchmarks.experiments.triton_conv3d import triton_conv as tc


def bench(fn, reps=5):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts)//2]


def main() -> None:
    torch.manual_seed(0)
    for (b, c, s) in [(14, 48, 128), (4, 48, 128), (14, 96, 64), (14, 192, 32)]:
        x = torch.randn(b, c, s, s, s, device="cuda", dtype=torch.float16)
        w = (torch.randn(c, c, 3, 3, 3, device="cuda") / (27 * c) ** 0.5).half()
        pw = tc.pack_weight(w)
        t0 = time.time(); y = tc.conv3d_3x3x3(x, pw); torch.cuda.synchronize(); tune = time.time() - t0
        ref = F.conv3d(x, w, padding=1)
        err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
        flops = 2 * c * c * 27 * s**3 * b
        t_cudnn = bench(lambda: F.conv3d(x, w, padding=1))
        t_tr = bench(lambda: tc.conv3d_3x3x3(x, pw))
        print(f"b{b} c{c} {s}^3: cudnn {t_cudnn:.2f} ms ({flops/t_cudnn/1e9:.0f} TF/s)  triton {t_tr:.2f} ms ({flops/t_tr/1e9:.0f} TF/s)  rel diff {err:.2e}  tune {tune:.1f}s  best {tc._conv3x3x3_kernel.best_config}", flush=True)
        del x, y, ref


if __name__ == "__main__":
    main()
