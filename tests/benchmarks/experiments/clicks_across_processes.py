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
"""Experiment: do the same clicks give the same masks in two fresh processes? (issue 50, item 3)

``vista3d_slicer_clicks.py`` compares the server's answers (one process) with a ``Vista3DSession`` of the same
weights in the benchmark's own process. This runs that in-process sequence (the five liver clicks on the phantom,
the server's settings) in fresh processes: ``--processes`` alike (cuDNN's autotuning on, the default), then one with
it off, one on a worker thread and one after a sequence on another session of the same pipeline (what the benchmark's
in-process side does), and prints how many voxels of each click's 0/1 mask differ from the first process's, and
each click's time (the first click of a process pays cuDNN's autotuning where it is on).

    python tests/benchmarks/experiments/clicks_across_processes.py --device cuda --processes 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parents[1]
SIZES = {"tiny": (8, (64, 64, 48), 32), "published": (48, (512, 512, 200), 128)}


def child(args: argparse.Namespace) -> None:
    """One process: the sequence twice on one session (reset between), masks saved bit-packed. ``--layout``:
    ``main`` as said; ``thread`` on a worker thread (as the server's model thread and the benchmark's in-process
    side run clicks); ``second`` after a whole sequence on another session of the same pipeline (as the benchmark's
    in-process side warms up)."""
    sys.path[:0] = [str(REPO), str(BENCH)]
    from vista3d_slicer_clicks import CLICKS, LABEL, new_points, slicer_requests

    from monai.apps.vista3d.core.pipeline import Vista3DPipeline
    from monai.apps.vista3d.core.session import Vista3DSession
    from monai.apps.vista3d.server.monailabel_jobs import object_mask
    from monai.networks.kernels.dispatch import FusedConfig

    embed_dim, shape, roi = SIZES[args.size]
    requests = slicer_requests(shape)

    def run() -> list:
        pipe = Vista3DPipeline(weights=args.weights, device=args.device, roi_size=roi, overlap=0.25, sw_batch_size=1,
                               progress=False, warn_random=False, network_kwargs={"encoder_embed_dim": embed_dim},
                               fuse=FusedConfig(cudnn_autotune=args.autotune == "on"))
        if args.layout == "second":
            warm = Vista3DSession(pipe, args.ct)
            for k in range(CLICKS):
                warm.click(*new_points(requests, k), classes=LABEL)
            del warm
        session = Vista3DSession(pipe, args.ct)
        masks, seconds = [], []
        for r in range(2):
            if r:
                session.reset()
            for k in range(CLICKS):
                start = time.perf_counter()
                mask = object_mask(session.click(*new_points(requests, k), classes=LABEL)).cpu().numpy()
                seconds.append(time.perf_counter() - start)
                masks.append(np.packbits(mask.astype(bool)))
        np.save(args.child + ".seconds.npy", np.array(seconds))
        return masks

    if args.layout == "thread":
        with ThreadPoolExecutor(1) as pool:
            masks = pool.submit(run).result()
    else:
        masks = run()
    np.save(args.child, np.stack(masks))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", choices=sorted(SIZES), default=None, help="tiny (CPU default) or published (CUDA)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--autotune", default="on", help=argparse.SUPPRESS)
    p.add_argument("--layout", default="main", help=argparse.SUPPRESS)
    p.add_argument("--weights", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ct", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.size = args.size or ("published" if args.device.startswith("cuda") else "tiny")
    if args.child:
        child(args)
        return 0
    sys.path[:0] = [str(REPO)]
    import torch

    from monai.apps.vista3d.cli.phantom import write_phantom
    from monai.networks.nets import vista3d132

    embed_dim, shape, _ = SIZES[args.size]
    with tempfile.TemporaryDirectory(prefix="clicks_across_") as tmp:
        root = Path(tmp)
        ct = write_phantom(root / "ct.nii.gz", shape, (1.0, 1.0, 1.5), 0)
        torch.manual_seed(0)
        torch.save(vista3d132(encoder_embed_dim=embed_dim).state_dict(), root / "model.pt")
        runs, times = {}, {}
        layouts = [("on", "main")] * args.processes + [("off", "main"), ("on", "thread"), ("on", "second")]
        for autotune, layout in layouts:
            name = f"autotune {autotune}, {layout}"
            out = root / f"{len(runs)}.npy"
            subprocess.run([sys.executable, __file__, "--device", args.device, "--size", args.size, "--child", str(out),
                            "--autotune", autotune, "--layout", layout, "--weights", str(root / "model.pt"),
                            "--ct", str(ct)], check=True)
            key = name if name not in runs else f"{name} #{len(runs)}"
            runs[key] = np.load(out)
            times[key] = np.load(str(out) + ".seconds.npy")
        (first_name, first), *others = runs.items()
        clicks = first.shape[0] // 2
        print(f"foreground of each click ({first_name}): {[int(np.unpackbits(m).sum()) for m in first[:clicks]]}")
        for name, masks in runs.items():
            within = [int(np.unpackbits(masks[k] ^ masks[k + clicks]).sum()) for k in range(clicks)]
            across = [int(np.unpackbits(first[k] ^ masks[k]).sum()) for k in range(clicks)]
            print(f"{name}: voxels differing per click from its own first sequence {within}, from {first_name}'s "
                  f"{across}")
            ms = ", ".join(f"{1000 * t:.1f}" for t in times[name])
            print(f"{name}: ms per click, two sequences (the mask to the host included): {ms}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
