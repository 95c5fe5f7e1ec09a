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
"""Everything-segmentation latency of this fork, and of upstream MONAI side by side.

Runs ``vista3d132`` (random weights, seed 0) with the 117 "everything" classes through
``SlidingWindowInfererAdapt`` (roi 128³, overlap 0.25, ``with_coord=True``, ``transpose=True``, fp16 autocast)
on random volumes, for each ``sw_batch_size``, the fork through its fused channels-last path (``--no-fuse``: its
module path); median of ``--repeats`` after a warm-up. With ``--upstream PATH``
(a ``pip install --target PATH monai==1.6.1`` folder) the same measurement runs for upstream in a separate
process on the same device, and the label maps (argmax over classes, background where no class is > 0) and
logits of both are compared at each side's best setting. ``--checkpoint`` loads weights (a trained VISTA3D, e.g.
the bundle's ``models/model.pt``) into both sides, ``--image`` runs a saved ``[1, 1, X, Y, Z]`` tensor instead of the
random volumes (``vista3d_trained_agreement.py`` uses both).

    python tests/benchmarks/vista3d_everything.py --device cuda --upstream /tmp/up
    python tests/benchmarks/vista3d_everything.py            # CPU: a tiny network and a small volume
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch


def everything_labels() -> list[int]:
    """The bundle's 117 everything labels (from the package data when available)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "testing_data", "vista3d_labels.json")
    with open(path) as f:
        return list(json.load(f)["everything_labels"])


def label_map(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """VISTA3D post-transform on ``[C, ...]`` logits: argmax + 1 → label id, background where none > 0."""
    best = logits.argmax(0)
    fg = (logits > 0).any(0)
    return torch.where(fg, labels.to(best.device)[best], torch.zeros_like(best)).to(torch.uint8)


def build_net(tiny: bool, dev: torch.device, checkpoint: str | None = None):
    """``vista3d132`` (or, with ``tiny``, an 8-channel VISTA3D for the CPU) with seed-0 random weights, or the
    weights of ``checkpoint`` (a state dict, loaded strictly), in eval mode."""
    net = tiny_vista3d() if tiny else _seeded_vista3d132()
    if checkpoint:
        net.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return net.to(dev).eval()


def _seeded_vista3d132():
    from monai.networks.nets import vista3d132

    torch.manual_seed(0)
    return vista3d132()


def tiny_vista3d():
    """An 8-channel VISTA3D with seed-0 random weights (the CPU stand-in for ``vista3d132``)."""
    from monai.networks.nets.segresnet_ds import SegResNetDS2
    from monai.networks.nets.vista3d import (
        VISTA3D,
        ClassMappingClassify,
        PointMappingSAM,
    )

    torch.manual_seed(0)
    enc = SegResNetDS2(in_channels=1, blocks_down=(1, 1, 1), norm="instance", out_channels=8, init_filters=8, dsdepth=1)
    return VISTA3D(enc, ClassMappingClassify(n_classes=512, feature_size=8, use_mlp=True),
                   PointMappingSAM(feature_size=8, n_classes=512, last_supported=132))


def measure(fn, repeats: int, dev: torch.device) -> tuple[dict, Any]:
    """Time ``fn`` ``repeats`` times after one warm-up; returns the statistics and the last output.

    Only one output is alive while ``fn`` runs; the peak GPU memory covers the warm-up and the timed runs.
    ``repeats=0`` times the warm-up itself (one cold run, for paths too slow to run twice).
    """
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    times = [] if repeats else [time.perf_counter() - t0]
    for _ in range(repeats):
        del out
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    s = sorted(times)
    p50 = s[len(s) // 2]
    p90 = s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
    return {"median_s": p50, "p90_over_p50": p90 / p50, "max_over_min": s[-1] / s[0], "peak_gib": peak,
            "times_s": times}, out


def _parse_shape(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in s.lower().replace("x", ",").split(","))


def worker(args) -> dict:
    """Measure one implementation (whatever ``monai`` is importable) and save its best outputs."""
    import monai
    from monai.inferers import SlidingWindowInfererAdapt

    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    net = build_net(args.tiny, dev, args.checkpoint)
    labels = everything_labels()[: args.classes]
    cv = torch.tensor(labels, device=dev).view(-1, 1)
    is_fork = "+vista3d" in monai.__version__
    if is_fork and not args.no_fuse:
        net.fuse()  # the fused channels-last path where it applies (CUDA, Hopper, Triton); logs a line where not
    rows, outputs = [], {}
    for shape in args.sizes:
        if args.image:
            image = torch.load(args.image, weights_only=True).to(dev)
        else:
            image = torch.rand((1, 1) + shape, generator=torch.Generator().manual_seed(1)).to(dev)
        best = None
        for bs in args.sw_batch_sizes:
            if bs == "auto" and not is_fork:
                continue  # upstream has no automatic batch size
            kw = dict(roi_size=(args.roi,) * 3, sw_batch_size=bs, overlap=0.25, with_coord=True)
            if is_fork:
                kw["timing"] = True
            inferer = SlidingWindowInfererAdapt(**kw)

            def run():
                with torch.no_grad(), torch.autocast(dev.type, dtype=torch.float16, enabled=dev.type == "cuda"):
                    return inferer(image, net, transpose=True, class_vector=cv, prompt_class=cv, point_coords=None,
                                   point_labels=None, labels=None, label_set=None, prev_mask=None)

            stats, out = measure(run, args.repeats, dev)
            med, times, peak = stats["median_s"], stats["times_s"], stats["peak_gib"]
            row = {"impl": "fork" if is_fork else "upstream", "shape": list(shape), "sw_batch_size": bs,
                   "median_s": med, "times_s": times, "peak_gib": peak}
            if is_fork and getattr(inferer, "timings", None):
                row["timings"] = {k: v for k, v in inferer.timings.items() if isinstance(v, (int, float, str))}
            rows.append(row)
            print(f"  {row['impl']:8s} {shape} bs={bs!s:>4s} median {med:.3f} s  peak {peak:.1f} GiB", flush=True)
            if best is None or med < best[0]:
                best = (med, out)
            else:
                del out
        logits = best[1][0]
        key = "x".join(map(str, shape))
        outputs[key] = {"labels": label_map(logits, torch.tensor(labels)).cpu()}
        if args.compare_logits and logits[0].numel() <= args.compare_logits_max_voxels:
            outputs[key]["logits"] = logits.half().cpu()
        del best, logits
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    torch.save(outputs, args.save)
    return {"rows": rows, "monai": monai.__version__, "torch": torch.__version__}


def compare(a: dict, b: dict) -> dict:
    res = {}
    for key in a:
        if key not in b:
            continue
        la, lb = a[key]["labels"], b[key]["labels"]
        r = {"label_agreement": (la == lb).double().mean().item()}
        if "logits" in a[key] and "logits" in b[key]:
            d = (a[key]["logits"].float() - b[key]["logits"].float()).abs()
            r.update({"logit_max_abs_diff": d.max().item(), "logit_mean_abs_diff": d.mean().item(),
                      "logit_rel_err": (d.norm() / b[key]["logits"].float().norm()).item()})
        res[key] = r
    return res


def missing_upstream(folder: str | None) -> str | None:
    """Why ``folder`` cannot be the ``--upstream`` install (without a ``monai`` package in it the workers would
    silently import this fork instead), or None."""
    if folder and not os.path.isfile(os.path.join(folder, "monai", "__init__.py")):
        return f"--upstream {folder} holds no monai package: pip install --no-deps --target {folder} monai==1.6.1"
    return None


def run_worker(name: str, path: str, worker_args: list[str], save: str) -> dict:
    """Run this script's worker in a new process with ``path`` first on PYTHONPATH (the fork, or a folder with
    upstream MONAI), saving its outputs to ``save``; returns its results (raises CalledProcessError if it fails)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p))
    cmd = [sys.executable, os.path.abspath(__file__), *worker_args, "--worker", "--save", save]
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(save))
    proc.check_returncode()
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = torch.cuda.is_available()
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--sizes", default=None, help="volumes, e.g. 256x256x176,384x384x320")
    p.add_argument("--sw-batch-sizes", default=None, help="e.g. 1,4,14")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--classes", type=int, default=117)
    p.add_argument("--roi", type=int, default=None)
    p.add_argument("--tiny", action="store_true", help="a tiny network (the CPU default)")
    p.add_argument("--no-fuse", action="store_true", help="run the fork's module path, not the fused one")
    p.add_argument("--upstream", default=None, help="folder where upstream MONAI is pip-installed with --target")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="cudnn.benchmark on in both workers (the fork's fused path turns it on for itself anyway)")
    p.add_argument("--compare-logits", action="store_true", help="also compare logits (costs host memory)")
    p.add_argument("--compare-logits-max-voxels", type=int, default=16_000_000,
                   help="compare logits only for volumes up to this many voxels (host memory and disk)")
    p.add_argument("--checkpoint", default=None, help="load these weights (a vista3d132 state dict) on both sides")
    p.add_argument("--image", default=None,
                   help="run this saved [1, 1, X, Y, Z] tensor (torch.save) instead of random volumes (--sizes unused)")
    p.add_argument("--json", default=None)
    p.add_argument("--save", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    on_cpu = args.device == "cpu"
    args.tiny = args.tiny or on_cpu
    args.roi = args.roi or (32 if on_cpu else 128)
    args.sizes = [_parse_shape(s) for s in (args.sizes or ("64x64x48" if on_cpu else "256x256x176,384x384x320")).split(",")]
    if args.image:  # mapped, not read: every process asks for the shape, the worker then loads the data once
        args.sizes = [tuple(torch.load(args.image, weights_only=True, mmap=True).shape[2:])]
    args.sw_batch_sizes = [int(v) if v != "auto" else "auto" for v in (args.sw_batch_sizes or ("1,4" if on_cpu else "1,4,14")).split(",")]
    if args.worker:
        json.dump(worker(args), sys.stdout)
        return 0
    if missing_upstream(args.upstream):
        p.error(missing_upstream(args.upstream))

    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    tmp = tempfile.mkdtemp(prefix="vista3d_everything_")
    results = {}
    impls = [("fork", repo)] + ([("upstream", os.path.abspath(args.upstream))] if args.upstream else [])
    base = list(argv if argv is not None else sys.argv[1:])
    if "--json" in base:  # the workers print their results; only this process writes the file
        i = base.index("--json")
        del base[i:i + 2]
    base = [a for a in base if not a.startswith("--json=")]
    if args.tiny and "--tiny" not in base:
        base.append("--tiny")
    for name, path in impls:
        save = os.path.join(tmp, f"{name}.pt")
        try:
            results[name] = run_worker(name, path, base, save)
        except subprocess.CalledProcessError as e:
            print(f"[{name}] failed with exit code {e.returncode}", file=sys.stderr)
            return e.returncode
        results[name]["save"] = save

    print(f"\n{'impl':9s} {'volume':14s} {'bs':>5s} {'median s':>9s} {'peak GiB':>9s}  stages (s)")
    for name in results:
        for r in results[name]["rows"]:
            t = r.get("timings", {})
            stages = " ".join(f"{k}={t[k]:.3f}" for k in ("prepare", "forward", "stitch", "finalize") if k in t)
            print(f"{name:9s} {'x'.join(map(str, r['shape'])):14s} {r['sw_batch_size']!s:>5s} {r['median_s']:9.3f} {r['peak_gib']:9.1f}  {stages}")
    summary = {}
    if "upstream" in results:
        print(f"\n{'volume':14s} {'upstream best s':>16s} {'fork best s':>12s} {'speed-up':>9s}")
        for shape in args.sizes:
            key = list(shape)
            ub = min(r["median_s"] for r in results["upstream"]["rows"] if r["shape"] == key)
            fb = min(r["median_s"] for r in results["fork"]["rows"] if r["shape"] == key)
            summary["x".join(map(str, shape))] = {"upstream_best_s": ub, "fork_best_s": fb, "speedup": ub / fb}
            print(f"{'x'.join(map(str, shape)):14s} {ub:16.3f} {fb:12.3f} {ub / fb:9.2f}")
        agree = compare(torch.load(results["fork"]["save"]), torch.load(results["upstream"]["save"]))
        for key, r in agree.items():
            summary.setdefault(key, {}).update(r)
            extra = "".join(f", {k} {v:.4g}" for k, v in r.items() if k != "label_agreement")
            print(f"{key}: label agreement {100 * r['label_agreement']:.4f} %{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
