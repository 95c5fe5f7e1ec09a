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
"""Time ways of computing one 3x3x3 ``Conv3d`` (and an instance norm) at VISTA3D's full resolution.

The full-resolution 48-channel convolutions dominate VISTA3D's window forward. This script compares cuDNN's
3D convolution in both memory layouts with a depth-stacked 2D formulation (one 2D convolution producing the
three depth taps as 3x the output channels, then a shifted sum along depth), and reports the relative error
of each against a float32 reference.

    python tests/benchmarks/conv3d_variants.py --device cuda --batch 14 --size 128
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F


def conv3d_as_stacked_2d(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """3x3x3 convolution (stride 1, padding 1) through one 2D convolution over the depth-folded batch."""
    b, c, d, h, w = x.shape
    co = weight.shape[0]
    x_cl = x.contiguous(memory_format=torch.channels_last_3d)
    x2d = x_cl.permute(0, 2, 1, 3, 4).reshape(b * d, c, h, w)  # a view: NDHWC is NHWC over (b*d)
    w2d = weight.permute(2, 0, 1, 3, 4).reshape(3 * co, c, 3, 3).contiguous(memory_format=torch.channels_last)
    y = F.conv2d(x2d, w2d, padding=1)  # [b*d, 3*co, h, w], NHWC
    y = y.permute(0, 2, 3, 1).reshape(b, d, h, w, 3, co)  # view
    out = y[:, :, :, :, 1].clone()
    out[:, 1:] += y[:, :-1, :, :, 0]
    out[:, :-1] += y[:, 1:, :, :, 2]
    return out.permute(0, 4, 1, 2, 3)  # [b, co, d, h, w] in channels_last_3d


def conv3d_as_three_2d(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """3x3x3 convolution as three accumulated 2D convolutions on depth-shifted slices (no 3x buffer)."""
    b, c, d, h, w = x.shape
    co = weight.shape[0]
    x_cl = x.contiguous(memory_format=torch.channels_last_3d)
    x2d = x_cl.permute(0, 2, 1, 3, 4)  # [b, d, c, h, w]
    out = None
    for kd in range(3):
        wk = weight[:, :, kd].contiguous(memory_format=torch.channels_last)
        y = F.conv2d(x2d.reshape(b * d, c, h, w), wk, padding=1).permute(0, 2, 3, 1).reshape(b, d, h, w, co)
        if out is None:
            out = torch.zeros_like(y)
        # output depth i takes input depth i + kd - 1
        if kd == 0:
            out[:, 1:] += y[:, :-1]
        elif kd == 1:
            out += y
        else:
            out[:, :-1] += y[:, 1:]
    return out.permute(0, 4, 1, 2, 3)


def _time(fn, reps: int, device: torch.device) -> float:
    for _ in range(2):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 1000)
    else:
        import time

        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--channels", type=int, default=48)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    c, s = a.channels, a.size
    x32 = torch.randn(a.batch, c, s, s, s, device=dev)
    w32 = torch.randn(c, c, 3, 3, 3, device=dev) / (c * 27) ** 0.5
    ref = F.conv3d(x32[:1].double(), w32.double(), padding=1)
    dtypes = [torch.float16, torch.bfloat16] if dev.type == "cuda" else [torch.float32]
    flops = 2 * c * c * 27 * s**3 * a.batch
    rows = []
    for dt in dtypes:
        x, w = x32.to(dt), w32.to(dt)
        x_cl = x.contiguous(memory_format=torch.channels_last_3d)
        w_cl = w.contiguous(memory_format=torch.channels_last_3d)
        variants = {
            "conv3d NCDHW": lambda: F.conv3d(x, w, padding=1),
            "conv3d NDHWC": lambda: F.conv3d(x_cl, w_cl, padding=1),
            "stacked 2D (3x out ch)": lambda: conv3d_as_stacked_2d(x_cl, w),
            "three 2D, accumulated": lambda: conv3d_as_three_2d(x_cl, w),
        }
        for name, fn in variants.items():
            out = fn()
            err = ((out[:1].double() - ref).norm() / ref.norm()).item()
            t = _time(fn, a.reps, dev)
            rows.append({"dtype": str(dt).split(".")[-1], "variant": name, "ms": t * 1e3, "tflops": flops / t / 1e12,
                         "rel_err": err})
        # instance norm + relu: the other full-resolution cost
        norm = lambda: F.relu(F.instance_norm(x, eps=1e-5))  # noqa: E731
        with torch.autocast(dev.type, dtype=dt, enabled=dev.type == "cuda"):
            t = _time(norm, a.reps, dev)
        rows.append({"dtype": str(dt).split(".")[-1], "variant": "instance_norm+relu (autocast)", "ms": t * 1e3,
                     "tflops": 0.0, "rel_err": 0.0})

        def fast_norm():
            var, mean = torch.var_mean(x.float().view(x.shape[0], c, -1), dim=2, unbiased=False, keepdim=True)
            scale = torch.rsqrt(var + 1e-5)
            return F.relu(((x.view(x.shape[0], c, -1) - mean.to(dt)) * scale.to(dt)).view_as(x))

        t = _time(fast_norm, a.reps, dev)
        rows.append({"dtype": str(dt).split(".")[-1], "variant": "var_mean norm+relu in dtype", "ms": t * 1e3,
                     "tflops": 0.0, "rel_err": 0.0})
    print(f"batch {a.batch}, {c} channels, {s}^3, device {dev} ({torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'})")
    print(f"{'dtype':9s} {'variant':32s} {'ms':>9s} {'TFLOP/s':>8s} {'rel err':>9s}")
    for r in rows:
        print(f"{r['dtype']:9s} {r['variant']:32s} {r['ms']:9.2f} {r['tflops']:8.1f} {r['rel_err']:9.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
