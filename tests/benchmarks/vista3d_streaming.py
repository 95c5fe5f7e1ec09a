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
"""Streamed label maps against the full-logits path, and against upstream MONAI side by side.

For each volume and class set: ``sliding_window_label_inference`` (this fork, streamed), the fork's
``SlidingWindowInfererAdapt`` + post-transform (full logits) and, with ``--upstream PATH``, upstream's
``SlidingWindowInfererAdapt`` + post-transform in a separate process. Reports median latency, p90/p50 and
max/min over ``--repeats`` runs after a warm-up, peak GPU memory, and label agreement with upstream.
``--per-class`` adds each streamed variant with one bit-packed mask per class as well (``return_masks``), and
prints its peak memory and time against the label map alone (issue 26: within 1.5x the peak).

    python tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up
    python tests/benchmarks/vista3d_streaming.py          # CPU: a tiny network, small volumes
    python tests/benchmarks/vista3d_streaming.py --device cuda --fuse --sizes 512x512x512 --classes 117 \
        --sw-batch-size 2 --acc-dtypes float16 --repeats 3 --no-fork-full --per-class
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vista3d_everything import (  # noqa: E402
    build_net,
    everything_labels,
    label_map,
    measure,
    missing_upstream,
)


def held_tile_voxels(size: tuple[int, ...], roi: int, overlap: float = 0.25) -> int:
    """Most voxels of tiles held at once by the streamed path (``slab_dim=0``), replaying its window order."""
    from monai.inferers.tile_stitcher import Tiling
    from monai.inferers.utils import plan_sliding_windows

    plan = plan_sliding_windows(size, (roi,) * len(size), overlap)
    order = sorted(range(len(plan.slices)), key=lambda i: (plan.slices[i][0].start, i))
    tiling = Tiling(plan.slices, plan.padded_size, order)
    held: set[tuple[int, ...]] = set()
    peak = 0
    for w in order:
        held.update(tiling.window_tiles[w])
        peak = max(peak, sum(math.prod(e - a for a, e in tiling.box(t)) for t in held))
        held.difference_update(t for t in tiling.window_tiles[w] if tiling.last[t] == w)
    return peak


def worker(a) -> dict:
    import monai
    from monai.inferers import SlidingWindowInfererAdapt

    is_fork = "+vista3d" in monai.__version__
    dev = torch.device(a.device)
    if a.memory_cap_gib and dev.type == "cuda":  # emulate a smaller card: a per-process allocator limit
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.memory_cap_gib * 2**30 / total),
                                                 torch.cuda.current_device() if dev.index is None else dev.index)
    net = build_net(a.tiny, dev)
    if is_fork and a.fuse:
        net.fuse()  # the fused channels-last path where it applies (CUDA, Hopper, Triton); logs a line where not
    rows, saved = [], {}
    amp = dict(device_type=dev.type, dtype=torch.float16, enabled=dev.type == "cuda")
    for shape in a.sizes:
        image = torch.rand((1, 1) + shape, generator=torch.Generator().manual_seed(1)).to(dev)
        for ncls in a.classes:
            labels = everything_labels()[:ncls] if ncls > 1 else [3]  # 1 class: spleen
            cv = torch.tensor(labels, device=dev).view(-1, 1)
            ids = torch.tensor(labels)
            key = f"{'x'.join(map(str, shape))}_{ncls}"
            kw = dict(transpose=True, class_vector=cv, prompt_class=cv)
            variants = []
            if is_fork and a.repeats > 0:
                from monai.apps.vista3d.core.streaming import (
                    sliding_window_label_inference,
                )

                for acc, bs in itertools.product(a.acc_dtypes, a.sw_batch_size):
                    acc_dt = getattr(torch, acc)

                    def streamed(acc_dt=acc_dt, bs=bs):
                        with torch.no_grad(), torch.autocast(**amp):
                            return sliding_window_label_inference(
                                image.to(acc_dt), (a.roi,) * 3, bs, net, overlap=0.25, with_coord=True,
                                label_ids=ids, **kw)[0, 0]

                    variants.append((f"fork streamed, {acc} acc, bs {bs}", streamed, a.repeats))
                    if a.per_class:

                        def with_masks(acc_dt=acc_dt, bs=bs):
                            with torch.no_grad(), torch.autocast(**amp):
                                labels, masks = sliding_window_label_inference(
                                    image.to(acc_dt), (a.roi,) * 3, bs, net, overlap=0.25, with_coord=True,
                                    label_ids=ids, return_masks=True, **kw)
                            assert masks.shape[1] == -(-ncls // 8)
                            return labels[0, 0]

                        variants.append((f"fork streamed+masks, {acc} acc, bs {bs}", with_masks, a.repeats))
            inferer = SlidingWindowInfererAdapt(roi_size=(a.roi,) * 3, sw_batch_size=a.full_sw_batch_size,
                                                overlap=0.25, with_coord=True)

            def full():
                with torch.no_grad(), torch.autocast(**amp):
                    logits = inferer(image, net, **kw)[0]
                return label_map(logits, ids)

            if not (is_fork and a.no_fork_full):
                side = "fork" if is_fork else "upstream"
                variants.append((f"{side} full logits, bs {a.full_sw_batch_size}", full, a.full_repeats))
            for name, fn, reps in variants:
                try:
                    stats, out = measure(fn, reps, dev)
                except torch.cuda.OutOfMemoryError as e:  # report, do not hide
                    rows.append({"variant": name, "key": key, "error": f"OOM: {e}"[:200]})
                    continue
                stats.update(variant=name, key=key)
                rows.append(stats)
                saved[f"{key}|{name}"] = out.to(torch.uint8).cpu()
                print(f"  {name:36s} {key:18s} median {stats['median_s']:.3f} s  peak {stats['peak_gib']:.2f} GiB",
                      flush=True)
                del out
    torch.save(saved, a.save)
    return {"rows": rows, "monai": monai.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", default=None, help="e.g. 256x256x256,512x512x512")
    p.add_argument("--classes", default="117,1", help="class counts: 117 = everything, 1 = spleen")
    p.add_argument("--sw-batch-size", default=None, help="window batch sizes of the streamed path, e.g. 2,14")
    p.add_argument("--full-sw-batch-size", type=int, default=None, help="window batch size of the full-logits paths")
    p.add_argument("--repeats", type=int, default=None, help="timed runs of the streamed path (0: skip it)")
    p.add_argument("--full-repeats", type=int, default=3,
                   help="timed runs of the full-logits paths (0: one cold run, no warm-up)")
    p.add_argument("--no-fork-full", action="store_true", help="skip the fork's full-logits path")
    p.add_argument("--fuse", action="store_true", help="run the fork's network through its fused path (VISTA3D.fuse)")
    p.add_argument("--acc-dtypes", default=None, help="accumulator dtypes of the streamed path, e.g. float32,float16")
    p.add_argument("--roi", type=int, default=None)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--memory-cap-gib", type=float, default=None,
                   help="limit each process's CUDA allocator to this many GiB (emulates a smaller GPU)")
    p.add_argument("--per-class", action="store_true",
                   help="also run each streamed variant with per-class masks (return_masks) and compare its peak")
    p.add_argument("--held-tiles", action="store_true",
                   help="only print the most tile voxels the streamed path holds at once for --sizes and --roi")
    p.add_argument("--upstream", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--save", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    cpu = a.device == "cpu"
    a.tiny = a.tiny or cpu
    a.roi = a.roi or (32 if cpu else 128)
    a.sizes = [tuple(int(v) for v in s.split("x")) for s in (a.sizes or ("48x48x48" if cpu else "256x256x256,512x512x512")).split(",")]
    a.classes = [int(c) for c in a.classes.split(",")]
    a.sw_batch_size = [int(b) for b in str(a.sw_batch_size or (4 if cpu else 14)).split(",")]
    a.full_sw_batch_size = a.full_sw_batch_size or a.sw_batch_size[-1]
    a.repeats = (3 if cpu else 20) if a.repeats is None else a.repeats
    a.acc_dtypes = (a.acc_dtypes or ("float32" if cpu else "float32,float16")).split(",")
    if a.held_tiles:
        for size in a.sizes:
            n = held_tile_voxels(size, a.roi)
            gib = ", ".join(f"{c} classes {n * c * 2 / 2**30:.2f} / {n * c * 4 / 2**30:.2f} GiB" for c in a.classes)
            print(f"{'x'.join(map(str, size))}, roi {a.roi}: at most {n / 1e6:.2f} M voxels of tiles held "
                  f"(fp16 / float32 sums: {gib})")
        return 0
    if a.worker:
        json.dump(worker(a), sys.stdout)
        return 0
    if missing_upstream(a.upstream):
        p.error(missing_upstream(a.upstream))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tmp = tempfile.mkdtemp(prefix="vista3d_streaming_")
    base = [x for x in (argv if argv is not None else sys.argv[1:])]
    if "--json" in base:
        i = base.index("--json")
        del base[i:i + 2]
    results = {}
    for name, path in [("fork", repo)] + ([("upstream", os.path.abspath(a.upstream))] if a.upstream else []):
        save = os.path.join(tmp, f"{name}.pt")
        cmd = [sys.executable, os.path.abspath(__file__), *base, "--worker", "--save", save] + (["--tiny"] if a.tiny else [])
        print(f"[{name}] running", flush=True)
        proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p)), stdout=subprocess.PIPE, text=True, cwd=tmp)
        if proc.returncode:
            print(f"[{name}] failed ({proc.returncode})", file=sys.stderr)
            return proc.returncode
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[name]["outputs"] = torch.load(save)
    up = {k.split("|")[0]: v for k, v in results.get("upstream", {}).get("outputs", {}).items()}
    up_rows = {r["key"]: r for r in results.get("upstream", {}).get("rows", []) if "error" not in r}
    print(f"\n{'variant':38s} {'volume_classes':18s} {'median s':>9s} {'p90/p50':>8s} {'max/min':>8s} {'peak GiB':>9s} {'vs upstream':>11s} {'labels = upstream':>18s}")
    table = []
    for name in results:
        for r in results[name]["rows"]:
            if "error" in r:
                print(f"{r['variant']:38s} {r['key']:18s} {r['error']}")
                table.append(r)
                continue
            out = results[name]["outputs"][f"{r['key']}|{r['variant']}"]
            agree = (out == up[r["key"]]).double().mean().item() if r["key"] in up else float("nan")
            ratio = up_rows[r["key"]]["median_s"] / r["median_s"] if r["key"] in up_rows else float("nan")
            r = dict(r, label_agreement=agree, speedup_vs_upstream=ratio)
            table.append(r)
            print(f"{r['variant']:38s} {r['key']:18s} {r['median_s']:9.3f} {r['p90_over_p50']:8.3f} {r['max_over_min']:8.3f} {r['peak_gib']:9.2f} {ratio:11.2f} {100 * agree:17.4f}%")
    plain = {(r["key"], r["variant"]): r for r in table if "error" not in r}
    for (key, variant), r in plain.items():
        base = plain.get((key, variant.replace("streamed+masks", "streamed")))
        if "+masks" in variant and base is not None:
            ratio = r["peak_gib"] / base["peak_gib"]
            r.update(peak_over_labels=ratio, time_over_labels=r["median_s"] / base["median_s"])
            verdict = "within" if ratio <= 1.5 else "OVER" if ratio > 1.5 else "no GPU peak:"
            print(f"per-class masks {key} ({variant}): peak {r['peak_gib']:.2f} / {base['peak_gib']:.2f} GiB = "
                  f"{ratio:.2f}x the label map ({verdict} 1.5x), time {r['time_over_labels']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
