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
"""Sliding-window latency against sw_batch_size, with the per-stage breakdown of ``timing=True``.

VISTA3D automatic segmentation (class prompts, ``with_coord=True``, ``transpose=True``) through
``SlidingWindowInfererAdapt``. On CPU a small VISTA3D (feature size 16, three encoder levels) on 48^3 windows
keeps the default run near a minute on two cores; on CUDA the published ``vista3d132`` with the 117
"everything" classes on 128^3 windows, fp16 autocast. ``--model conv`` replaces the network by one
``Conv3d`` (no dependency on ``monai.networks``), to test the script or isolate the inferer's own costs.

Examples::

    python tests/benchmarks/sliding_window_timing.py                       # CPU defaults
    python tests/benchmarks/sliding_window_timing.py --device cuda         # vista3d132, 117 classes, 128^3
    python tests/benchmarks/sliding_window_timing.py --model conv --json /tmp/sw.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from monai.inferers import SlidingWindowInfererAdapt, plan_sliding_windows  # noqa: E402

STAGES = ("prepare", "forward", "stitch", "finalize", "other")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument("--model", choices=("vista3d", "conv"), default="vista3d", help="network (default: vista3d)")
    p.add_argument("--config", choices=("small", "vista3d132"), default=None,
                   help="VISTA3D configuration (default: small on cpu, vista3d132 on cuda)")
    p.add_argument("--classes", type=int, default=None, help="number of class prompts (default: 4 cpu, 117 cuda)")
    p.add_argument("--roi", type=int, default=None, help="cubic window size (default: 48 cpu, 128 cuda)")
    p.add_argument("--volume", type=int, nargs=3, default=None, metavar=("H", "W", "D"),
                   help="volume size (default: 80 80 64 on cpu = 8 windows; 288 288 240 on cuda = 27 windows)")
    p.add_argument("--overlap", type=float, default=0.25, help="window overlap (default: 0.25, as the bundle)")
    p.add_argument("--batch-sizes", default="1,4,8,10,12,14,16,20",
                   help="comma-separated sw_batch_size values; 'auto' is allowed")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per size (default: 1 cpu, 3 cuda)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per size on cuda (default: 1); every run "
                   "starts with one untimed window")
    p.add_argument("--no-amp", action="store_true", help="no fp16 autocast on cuda")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    return p.parse_args(argv)


def build_vista3d(config: str, device: torch.device) -> torch.nn.Module:
    """The VISTA3D network, imported only now so that ``--model conv`` works without ``monai.networks``."""
    try:
        from monai.networks.nets import VISTA3D, SegResNetDS2, vista3d132
        from monai.networks.nets.vista3d import ClassMappingClassify, PointMappingSAM
    except ImportError as e:
        raise SystemExit(
            f"VISTA3D is not available in this checkout ({type(e).__name__}: {e}).\n"
            "Run from a branch that has monai.networks.nets.VISTA3D, or use --model conv."
        ) from e
    if config == "vista3d132":
        net = vista3d132()
    else:
        encoder = SegResNetDS2(
            in_channels=1, blocks_down=(1, 1, 1), norm="instance", out_channels=16, init_filters=16, dsdepth=1
        )
        net = VISTA3D(
            encoder, ClassMappingClassify(512, 16, True), PointMappingSAM(16, n_classes=512, last_supported=132)
        )
    return net.to(device).eval()


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    config = args.config or ("vista3d132" if cuda else "small")
    classes = args.classes or (117 if cuda else 4)
    roi = args.roi or (128 if cuda else 48)
    volume = tuple(args.volume or ((288, 288, 240) if cuda else (80, 80, 64)))
    repeats = args.repeats or (3 if cuda else 1)
    sizes = [s.strip() if s.strip() == "auto" else int(s) for s in args.batch_sizes.split(",") if s.strip()]
    amp = cuda and not args.no_amp

    torch.manual_seed(0)
    image = torch.rand(1, 1, *volume, device=device)
    class_vector = torch.arange(1, classes + 1, device=device)[:, None]
    if args.model == "vista3d":
        net = build_vista3d(config, device)
        call_kwargs = dict(transpose=True, class_vector=class_vector, prompt_class=class_vector,
                           point_coords=None, point_labels=None, labels=None, label_set=None, prev_mask=None)
        with_coord = True
        label = f"VISTA3D {config}, {classes} classes"
    else:
        net = torch.nn.Conv3d(1, classes, 3, padding=1).to(device).eval()
        call_kwargs, with_coord = {}, False
        label = f"Conv3d(1, {classes}, 3)"
    n_windows = plan_sliding_windows(volume, roi, args.overlap).num_windows
    print(f"# {label} on {device} ({'fp16 autocast' if amp else 'fp32'}); volume {volume}, roi {roi}^3, "
          f"overlap {args.overlap}: {n_windows} windows; torch {torch.__version__}, {torch.get_num_threads()} threads")

    def run(bs: int, timing: bool):
        inferer = SlidingWindowInfererAdapt((roi,) * 3, bs, args.overlap, with_coord=with_coord, timing=timing)
        with torch.no_grad(), torch.autocast("cuda", enabled=amp) if cuda else torch.no_grad():
            inferer(image, net, **call_kwargs)
        return inferer

    # one window through the network first: lazy initialisation (allocator, kernels) is not charged to size 1
    with torch.no_grad(), torch.autocast("cuda", enabled=amp) if cuda else torch.no_grad():
        SlidingWindowInfererAdapt((roi,) * 3, 1, args.overlap, with_coord=with_coord)(
            image[..., :roi, :roi, :roi], net, **call_kwargs
        )

    rows = []
    header = f"{'sw_batch':>8} {'batches':>7} {'latency ms':>11} " + " ".join(f"{s:>9}" for s in STAGES)
    header += f" {'fwd/win ms':>10} {'stitching':>9}"
    print(header)
    print("-" * len(header))
    for bs in sizes:
        if cuda:
            for _ in range(args.warmup):
                run(bs, False)
            latencies = []
            for _ in range(repeats):  # latency without timing's synchronisation, by CUDA events
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run(bs, False)
                end.record()
                torch.cuda.synchronize()
                latencies.append(start.elapsed_time(end) / 1e3)
            timed = [run(bs, True).timings for _ in range(repeats)]
        else:
            timed = [run(bs, True).timings for _ in range(repeats)]
            latencies = [t["total"] for t in timed]
        median = sorted(timed, key=lambda t: t["total"])[len(timed) // 2]
        row = {
            "sw_batch_size": bs,
            "windows": median["windows"],
            "batches": median["batches"],
            "latency_s": statistics.median(latencies),
            "timed_total_s": median["total"],
            **{f"{s}_s": median.get(s, 0.0) for s in STAGES},
            "forward_per_window_ms": 1e3 * median["forward"] / median["windows"],
            "stitching": median.get("stitching"),
            "attempts": len(median.get("attempts", [])),
            "model": label,
            "device": str(device),
            "amp": amp,
            "volume": volume,
            "roi": roi,
        }
        rows.append(row)
        print(f"{bs:>8} {row['batches']:>7} {1e3 * row['latency_s']:>11.1f} "
              + " ".join(f"{1e3 * row[s + '_s']:>9.1f}" for s in STAGES)
              + f" {row['forward_per_window_ms']:>10.1f} {str(row['stitching']):>9}")
        sys.stdout.flush()
    print("# stage columns in ms, from timing=True (CUDA synchronised at stage boundaries); "
          "latency: median total" + (" by CUDA events without timing" if cuda else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"# finished in {time.perf_counter() - t0:.1f} s")
