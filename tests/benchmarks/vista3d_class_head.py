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
"""Latency of the VISTA3D class head's class-to-voxel mapping: per-window loop vs one broadcast matmul.

Three formulations of ``logits[k, w] = class_embedding[k] . features[w]`` for ``K`` classes and ``W`` sliding
windows of ``C``-channel features are timed:

- ``loop``: one ``[K, 1, C] @ [1, C, N]`` product per window, concatenated on dim 1 (earlier MONAI releases);
- ``squeeze``: ``class_embedding.squeeze() @ features.view(W, C, N)`` then a transpose (MONAI 1.6.1; fails for
  ``C == 1``);
- ``broadcast``: ``class_embedding.reshape(K, C) @ features.view(W, C, N)`` (this fork's
  ``ClassMappingClassify.forward``).

With ``--full-head`` the two residual blocks before the mapping (the same in all three) are included.

Examples::

    python tests/benchmarks/vista3d_class_head.py                       # CPU, 32^3 windows, ~1 min on 2 cores
    python tests/benchmarks/vista3d_class_head.py --device cuda --size 128 --json head.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from monai.networks.nets.vista3d import ClassMappingClassify  # noqa: E402


def map_loop(emb: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    w, c, h, wd, d = feats.shape
    masks = [(emb @ feats[[i]].view(1, c, h * wd * d)).view(-1, 1, h, wd, d) for i in range(w)]
    return torch.cat(masks, 1)


def map_squeeze(emb: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    w, c, h, wd, d = feats.shape
    return (emb.squeeze() @ feats.view(w, c, h * wd * d)).view(w, -1, h, wd, d).transpose(0, 1)


def map_broadcast(emb: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    w, c, h, wd, d = feats.shape
    return torch.matmul(emb.reshape(-1, c), feats.view(w, c, h * wd * d)).view(w, -1, h, wd, d).transpose(0, 1)


VARIANTS = {"loop": map_loop, "squeeze": map_squeeze, "broadcast": map_broadcast}


def time_ms(fn, device: torch.device, warmup: int, repeats: int) -> float:
    """Median latency in milliseconds (CUDA events on GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (cuda when present)")
    parser.add_argument("--size", type=int, default=None, help="window edge in voxels (default 32 on CPU, 128 on CUDA)")
    parser.add_argument("--feature-size", type=int, default=48, help="channels C (48 in vista3d132)")
    parser.add_argument("--classes", default="1,14,117", help="comma-separated class counts K")
    parser.add_argument("--windows", default="1,4,14", help="comma-separated window batch sizes W")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per point (default 5 CPU, 20 CUDA)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 1 CPU, 5 CUDA)")
    parser.add_argument("--full-head", action="store_true", help="include the head's two residual blocks")
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
    repeats = args.repeats or (20 if gpu else 5)
    warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    dtype = getattr(torch, args.dtype)
    classes = [int(v) for v in args.classes.split(",")]
    windows = [int(v) for v in args.windows.split(",")]
    c = args.feature_size

    torch.manual_seed(0)
    head = ClassMappingClassify(n_classes=max(max(classes), 2), feature_size=c, use_mlp=True).to(device, dtype).eval()
    rows = []
    print(
        f"# VISTA3D class head mapping, device={device} ({torch.cuda.get_device_name(device) if gpu else platform.processor() or 'cpu'}), "
        f"threads={torch.get_num_threads()}, dtype={args.dtype}, C={c}, window={size}^3, full_head={args.full_head}, "
        f"median of {repeats} after {warmup} warm-up"
    )
    header = f"{'classes':>7} {'windows':>7} {'loop ms':>10} {'squeeze ms':>11} {'broadcast ms':>13} {'loop/bcast':>10} {'squeeze/bcast':>13}"
    print(header)
    print("-" * len(header))
    for k in classes:
        class_vector = torch.arange(k, device=device).unsqueeze(1)
        for w in windows:
            feats = torch.randn(w, c, size, size, size, device=device, dtype=dtype)
            with torch.no_grad():
                emb = head.mlp(head.class_embeddings(class_vector))
                mapped = head.image_post_mapping(feats) if args.full_head else feats
                results = {}
                ref = map_loop(emb, mapped)
                for name, fn in VARIANTS.items():
                    if name == "squeeze" and (c == 1):
                        results[name] = float("nan")  # 1.6.1's squeeze cannot handle C == 1
                        continue
                    if name != "loop":
                        torch.testing.assert_close(fn(emb, mapped), ref, rtol=1e-2, atol=1e-2)

                    def run(fn=fn):
                        x = head.image_post_mapping(feats) if args.full_head else feats
                        return fn(emb, x)

                    results[name] = time_ms(run, device, warmup, repeats)
                del ref, mapped
            row = {"classes": k, "windows": w, **{f"{n}_ms": v for n, v in results.items()}}
            row["loop_over_broadcast"] = results["loop"] / results["broadcast"]
            row["squeeze_over_broadcast"] = results["squeeze"] / results["broadcast"]
            rows.append(row)
            print(
                f"{k:>7} {w:>7} {results['loop']:>10.2f} {results['squeeze']:>11.2f} {results['broadcast']:>13.2f} "
                f"{row['loop_over_broadcast']:>10.2f} {row['squeeze_over_broadcast']:>13.2f}"
            )
            del feats
            if gpu:
                torch.cuda.empty_cache()
    if args.json:
        meta = {
            "benchmark": "vista3d_class_head",
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if gpu else platform.processor(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "dtype": args.dtype,
            "feature_size": c,
            "size": size,
            "full_head": args.full_head,
            "repeats": repeats,
            "warmup": warmup,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
