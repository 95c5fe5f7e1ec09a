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
"""Measure speed levers on one VISTA3D window batch of upstream MONAI (run with upstream on PYTHONPATH).

Times ``vista3d132`` class-branch forward passes of one 128³ window batch under fp16/bf16 autocast, with and
without the full-resolution 3x3x3 convolutions routed through the depth-stacked 2D formulation of
``conv3d_variants.py``, and reports the max abs logit difference against the plain fp16 forward.

    PYTHONPATH=.upstream python tests/benchmarks/upstream_levers.py --batch 14
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from conv3d_variants import conv3d_as_stacked_2d  # noqa: E402


def patch_convs(model: torch.nn.Module, max_channels: int) -> int:
    n = 0
    for m in model.modules():
        if (
            isinstance(m, torch.nn.Conv3d)
            and m.kernel_size == (3, 3, 3)
            and m.stride == (1, 1, 1)
            and m.padding == (1, 1, 1)
            and m.dilation == (1, 1, 1)
            and m.groups == 1
            and m.in_channels <= max_channels
        ):

            def fwd(x, m=m):
                w = m.weight.to(x.dtype) if not torch.is_autocast_enabled() else m.weight.to(torch.get_autocast_gpu_dtype())
                xx = x.to(w.dtype)
                y = conv3d_as_stacked_2d(xx, w)
                if m.bias is not None:
                    y = y + m.bias.to(y.dtype).view(1, -1, 1, 1, 1)
                return y

            m.forward = fwd
            n += 1
    return n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=14)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    import monai
    from monai.networks.nets import vista3d132

    print("monai", monai.__version__, "from", os.path.dirname(monai.__file__))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    net = vista3d132().to(dev).eval()
    x = torch.rand(a.batch, 1, a.size, a.size, a.size, device=dev)
    cv = torch.arange(1, 118, device=dev).view(-1, 1)

    def run(dtype, cl=False):
        xx = x.contiguous(memory_format=torch.channels_last_3d) if cl else x
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
            return net(xx, class_vector=cv, transpose=True)

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(a.reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        return sorted(ts)[len(ts) // 2], out

    results = {}
    t, ref = timed(lambda: run(torch.float16))
    results["fp16"] = (t, 0.0)
    ref = ref.float()
    t, o = timed(lambda: run(torch.bfloat16))
    results["bf16"] = (t, (o.float() - ref).abs().max().item())
    del o
    n = patch_convs(net, 48)
    t, o = timed(lambda: run(torch.float16))
    results[f"fp16 + stacked-2D convs ({n} convs <=48ch)"] = (t, (o.float() - ref).abs().max().item())
    del o
    t, o = timed(lambda: run(torch.bfloat16))
    results["bf16 + stacked-2D convs"] = (t, (o.float() - ref).abs().max().item())
    del o
    patch_convs(net, 10_000)
    t, o = timed(lambda: run(torch.float16))
    results["fp16 + stacked-2D all 3x3x3 convs"] = (t, (o.float() - ref).abs().max().item())
    del o
    print(f"one window batch of {a.batch} x {a.size}^3, 117 classes, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    print(f"{'variant':48s} {'ms':>8s} {'ms/window':>10s} {'max|dlogit|':>12s}")
    for k, (t, d) in results.items():
        print(f"{k:48s} {t:8.1f} {t / a.batch:10.2f} {d:12.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
