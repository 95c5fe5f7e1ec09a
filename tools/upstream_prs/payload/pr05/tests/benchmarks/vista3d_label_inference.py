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
"""Peak memory and time of a class-prompt label map: full logits + ``VistaPostTransformd`` against streamed labels.

    python tests/benchmarks/vista3d_label_inference.py --device cpu --size 128 --roi 32 --classes 117 --threads 1
    python tests/benchmarks/vista3d_label_inference.py --device cuda --model vista3d --size 512 --roi 128

Each path runs in its own process, so that its peak is its own: on the CPU the growth of the peak resident set
during the calls, on CUDA the peak allocated memory above what was allocated before them. ``--model tiny`` is a
two-layer convolution with ``--classes`` outputs (fast anywhere); ``--model vista3d`` is ``vista3d132`` with random
weights and a ``class_vector`` of ``--classes`` classes. The two label maps are checked to be equal.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from monai.apps.vista3d.inferer import sliding_window_label_inference
from monai.apps.vista3d.transforms import VistaPostTransformd
from monai.inferers import sliding_window_inference
from monai.networks.nets import vista3d132


def make_predictor(args: argparse.Namespace, device: torch.device):
    torch.manual_seed(0)
    if args.model == "vista3d":
        net = vista3d132(in_channels=1).to(device).eval()
        classes = torch.arange(1, args.classes + 1, device=device).view(-1, 1)
        return functools.partial(net, class_vector=classes, transpose=True)
    net = torch.nn.Sequential(
        torch.nn.Conv3d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(8, args.classes, 1)
    ).to(device)
    return net.eval()


def labels_of(path: str, image: torch.Tensor, predictor, args: argparse.Namespace) -> torch.Tensor:
    settings = {"roi_size": (args.roi,) * 3, "sw_batch_size": args.sw_batch_size, "predictor": predictor}
    if path == "streamed":
        return sliding_window_label_inference(image, **settings)
    logits = sliding_window_inference(image, **settings)
    post = VistaPostTransformd(keys="pred")
    return torch.stack([post({"pred": logits[b], "label_prompt": None})["pred"] for b in range(logits.shape[0])])


def measure(args: argparse.Namespace) -> None:
    """One path, in this process: prints a JSON line with the median seconds and the peak memory growth."""
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    predictor = make_predictor(args, device)
    torch.manual_seed(1)
    image = torch.randn(1, 1, args.size, args.size, args.size, device=device)
    with torch.no_grad():
        small = torch.randn(1, 1, args.roi, args.roi, args.roi, device=device)
        labels_of(args.path, small, predictor, args)  # warm-up at one window: below the peak measured next
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else rss_peak()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            labels = labels_of(args.path, image, predictor, args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else rss_peak()
    torch.save(labels.to(torch.int32).cpu(), args.labels_out)
    print(json.dumps({"seconds": sorted(times)[len(times) // 2], "peak_mib": (peak - base) / 2**20}))


def rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", choices=("tiny", "vista3d"), default="tiny")
    parser.add_argument("--size", type=int, default=128, help="edge of the cubic image")
    parser.add_argument("--roi", type=int, default=32, help="edge of the cubic window")
    parser.add_argument("--classes", type=int, default=117)
    parser.add_argument("--sw-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads of torch (0: torch's default)")
    parser.add_argument("--path", choices=("full", "streamed"), help=argparse.SUPPRESS)
    parser.add_argument("--labels-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        measure(args)
        return
    print(f"{args.model}, {args.size}^3, roi {args.roi}^3, {args.classes} classes, sw_batch_size {args.sw_batch_size}")
    print("path | median s | peak MiB (" + ("allocated" if args.device.startswith("cuda") else "RSS growth") + ")")
    with tempfile.TemporaryDirectory() as tmp:
        for path in ("full", "streamed"):
            out = Path(tmp) / f"{path}.pt"
            cmd = [sys.executable, __file__, *sys.argv[1:], "--path", path, "--labels-out", str(out)]
            result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            print(f"{path} | {result['seconds']:.2f} | {result['peak_mib']:.0f}")
        full, streamed = (torch.load(Path(tmp) / f"{p}.pt") for p in ("full", "streamed"))
    if not torch.equal(full, streamed):
        raise SystemExit(f"the label maps differ on {(full != streamed).sum().item()} voxels")
    print(f"label maps equal on all {full.numel()} voxels")


if __name__ == "__main__":
    main()
