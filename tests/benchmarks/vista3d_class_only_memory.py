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
"""Peak memory and latency of VISTA3D inference, before/after removing the allocations it does not need.

``before`` reproduces MONAI 1.6.1's behaviour on the same model and weights: ``torch.cuda.empty_cache()`` after
the encoder and in the point head (``release_cached_memory=True``), a copy of the encoder bottleneck when both
decoders run, and a -9999-filled ``[B, 1, H, W, D]`` buffer that the point logits are copied into.
``after`` is this fork's default. The timed call is ``VISTA3D.forward`` (encoder and head(s)) on one batch of
windows, the way the sliding-window inferers call it (``transpose=True``).

Modes: ``class`` (everything segmentation: ``--classes`` class prompts on ``W`` windows), ``points``
(3 click prompts on one window) and ``mixed`` (class and click prompts on one window).

Examples::

    python tests/benchmarks/vista3d_class_only_memory.py                      # CPU, 32^3 windows, about a minute
    python tests/benchmarks/vista3d_class_only_memory.py --device cuda --size 128 --modes class,points,mixed --json mem.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from monai.networks.nets import VISTA3D, SegResNetDS2, vista3d132  # noqa: E402


class LegacySegResNetDS2(SegResNetDS2):
    """SegResNetDS2 that copies the bottleneck for the point decoder when both decoders run (MONAI 1.6.1)."""

    def forward(self, x, with_point=True, with_label=True):
        x = self._check_input(x)
        feats = self.encoder(x)
        bottleneck, skips = feats[-1], feats[-2::-1]
        outputs = self._decode(bottleneck.clone() if with_label else bottleneck, skips) if with_point else []
        auto = self._decode_auto(bottleneck, skips) if with_label else []
        return (outputs[0] if len(outputs) == 1 else outputs, auto[0] if len(auto) == 1 else auto)


def legacy_scatter(self, point_logits, mapping_index, bs):
    """A -9999 buffer for every row (zeros, then + NINF), then the point rows copied in (MONAI 1.6.1)."""
    logits = self.NINF_VALUE + torch.zeros([bs, *point_logits.shape[1:]], device=point_logits.device, dtype=point_logits.dtype)
    logits[mapping_index] = point_logits
    return logits


@contextlib.contextmanager
def legacy_behaviour(model: VISTA3D):
    encoder_cls = type(model.image_encoder)
    model.image_encoder.__class__ = LegacySegResNetDS2
    model.release_cached_memory = True
    try:
        with mock.patch.object(VISTA3D, "_scatter_point_logits", legacy_scatter):
            yield
    finally:
        model.image_encoder.__class__ = encoder_cls
        model.release_cached_memory = False


def cpu_peak_bytes(fn) -> tuple[int, int]:
    """``(peak, total)``: the peak of the bytes allocated during ``fn()`` above those live at its start, and all
    bytes it allocated (from the profiler's allocation events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    current = peak = total = 0
    for e in events:
        current += e.nbytes()
        total += max(e.nbytes(), 0)
        peak = max(peak, current)
    return peak, total


def measure(fn, device, warmup, repeats):
    """``(median ms, peak allocated MiB, peak reserved MiB (CUDA) or total allocated MiB (CPU))`` of ``fn()``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        reserved = torch.cuda.max_memory_reserved(device) / 2**20
    else:
        peak, total = cpu_peak_bytes(fn)
        peak, reserved = peak / 2**20, total / 2**20
    return statistics.median(times), peak, reserved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--size", type=int, default=None, help="window edge, a multiple of 16 and at least 32 (default 32 CPU, 128 CUDA)")
    parser.add_argument("--windows", default="1,14", help="window batch sizes for the class mode")
    parser.add_argument("--classes", type=int, default=117, help="number of class prompts (117: the bundle's everything set)")
    parser.add_argument("--modes", default="class", help="comma-separated: class, points, mixed")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs (default 1 CPU, 10 CUDA)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 0 CPU (the output check warms up), 3 CUDA)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="autocast dtype on CUDA")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda requested but CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    gpu = device.type == "cuda"
    size = args.size or (128 if gpu else 32)
    if size < 32 or size % 16:
        parser.error(f"--size must be a multiple of 16 and at least 32 (the encoder downsamples 16x), got {size}")
    repeats = args.repeats or (10 if gpu else 1)
    warmup = args.warmup if args.warmup is not None else (3 if gpu else 0)
    autocast = torch.autocast("cuda", dtype=getattr(torch, args.dtype)) if gpu and args.dtype != "float32" else contextlib.nullcontext()

    torch.manual_seed(0)
    model = vista3d132().to(device).eval()
    cv = torch.arange(1, args.classes + 1, device=device).unsqueeze(1)
    coords = torch.tensor([[[size // 2] * 3], [[size // 4] * 3], [[size // 3, size // 2, size // 5]]], device=device)
    labels = torch.ones(3, 1, dtype=torch.long, device=device)
    cases = []
    for mode in args.modes.split(","):
        if mode == "class":
            cases += [(mode, w, dict(class_vector=cv)) for w in (int(v) for v in args.windows.split(","))]
        elif mode == "points":
            cases.append((mode, 1, dict(point_coords=coords, point_labels=labels)))
        elif mode == "mixed":
            cases.append((mode, 1, dict(class_vector=cv[:3], point_coords=coords, point_labels=labels, prompt_class=cv[:3])))
        else:
            parser.error(f"unknown mode '{mode}', use class, points or mixed")

    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    print(f"# VISTA3D forward (vista3d132, random weights), device={device} ({name}), threads={torch.get_num_threads()}, "
          f"window={size}^3, dtype={args.dtype if gpu else 'float32'}, median of {repeats} after {warmup} warm-up")
    extra = "rsv MiB" if gpu else "alloc MiB"  # CUDA: peak reserved; CPU: all bytes allocated in the call
    header = f"{'mode':>6} {'windows':>7} {'prompts':>7} | {'before ms':>9} {'after ms':>9} {'ratio':>6} | {'before MiB':>10} {'after MiB':>10} | {'before ' + extra:>13} {'after ' + extra:>13}"
    print(header)
    print("-" * len(header))
    rows = []
    for mode, w, kwargs in cases:
        images = torch.randn(w, 1, size, size, size, device=device)

        def call(kwargs=kwargs, images=images):
            with torch.no_grad(), autocast:
                return model(images, transpose=True, **kwargs)

        with torch.no_grad():
            after_out = call()
            with legacy_behaviour(model):
                before_out = call()
        torch.testing.assert_close(after_out, before_out, rtol=0, atol=0)  # the outputs are bit-identical
        del after_out, before_out
        res = {}
        with legacy_behaviour(model):
            res["before"] = measure(call, device, warmup, repeats)
        if gpu:
            torch.cuda.empty_cache()  # a fair start for the reserved-memory peak
            torch.cuda.reset_peak_memory_stats(device)
        res["after"] = measure(call, device, warmup, repeats)
        n_prompts = kwargs["class_vector"].shape[0] if "class_vector" in kwargs else kwargs["point_coords"].shape[0]
        row = {"mode": mode, "windows": w, "prompts": n_prompts}
        for key, (ms, peak, reserved) in res.items():
            row.update({f"{key}_ms": ms, f"{key}_peak_mib": peak, f"{key}_{'reserved' if gpu else 'allocated'}_mib": reserved})
        rows.append(row)
        fmt = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"{mode:>6} {w:>7} {n_prompts:>7} | {row['before_ms']:>9.1f} {row['after_ms']:>9.1f} "
              f"{row['before_ms'] / row['after_ms']:>6.2f} | {row['before_peak_mib']:>10.1f} {row['after_peak_mib']:>10.1f} | "
              f"{fmt(res['before'][2]):>13} {fmt(res['after'][2]):>13}")
        del images
    if args.json:
        meta = {"benchmark": "vista3d_class_only_memory", "device": str(device), "device_name": name, "size": size,
                "threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": repeats, "warmup": warmup,
                "dtype": args.dtype if gpu else "float32"}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
