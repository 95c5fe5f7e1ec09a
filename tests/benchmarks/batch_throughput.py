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
"""Throughput of batch segmentation (volumes per minute) with ``run_batch``, on one process or under torchrun.

Writes ``--volumes`` phantom CTs of ``--size`` to ``--workdir`` (rank 0; others wait), then segments them all
with the VISTA3D pipeline (random weights: the speed is what is measured) and prints the summary.

    python tests/benchmarks/batch_throughput.py --volumes 16 --size 256,256,176 --device cuda
    torchrun --nproc_per_node=2 tests/benchmarks/batch_throughput.py --volumes 16 --workdir /tmp/bt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from monai.apps.vista3d import PipelineOptions, SegmentJob  # noqa: E402
from monai.apps.vista3d.batch.run import run_batch  # noqa: E402
from monai.apps.vista3d.cli.phantom import write_phantom  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--volumes", type=int, default=4, help="number of phantom volumes (default 4)")
    parser.add_argument("--size", default="64,64,48", help="phantom size X,Y,Z (default 64,64,48: CPU-sized)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda:LOCAL_RANK when available)")
    parser.add_argument("--roi", default=None, help="window size, default 128,128,128 on cuda, 32,32,32 on cpu")
    parser.add_argument("--sw-batch-size", default="4", help="windows per network call")
    parser.add_argument("--embed-dim", type=int, default=None, help="encoder width (default 48; 8 on cpu)")
    parser.add_argument("--workdir", default=None, help="folder for inputs/outputs (default: a temporary one)")
    parser.add_argument("--json", default=None, help="copy the run summary to this file")
    args = parser.parse_args(argv)
    import torch

    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    shape = tuple(int(s) for s in args.size.split(","))
    roi = tuple(int(s) for s in (args.roi or ("128,128,128" if cuda else "32,32,32")).split(","))
    embed = args.embed_dim or (48 if cuda else 8)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="vista3d_batch_"))
    inputs = [work / "in" / f"ct{i:03d}.nii.gz" for i in range(args.volumes)]
    ready = work / "in" / ".ready"
    if os.environ.get("RANK", "0") == "0":
        (work / "in").mkdir(parents=True, exist_ok=True)
        for i, p in enumerate(inputs):
            if not p.exists():
                write_phantom(p, shape, seed=i)
        ready.touch()
    while not ready.exists():
        time.sleep(0.2)
    sw = args.sw_batch_size if args.sw_batch_size == "auto" else int(args.sw_batch_size)
    job = SegmentJob("everything", PipelineOptions(roi_size=roi, sw_batch_size=sw), args.device,
                     network_kwargs={"encoder_embed_dim": embed}, warn_random=False)
    summary = work / "summary.json"
    t = time.perf_counter()
    result = run_batch(inputs, work / "out", job, overwrite=True, summary_path=summary)
    wall = time.perf_counter() - t
    if result.summary_path is not None:
        s = result.summary()
        print(f"{s['done']}/{s['images']} volumes {shape} on {s['world_size']} rank(s): {s['wall_seconds']:.1f} s, "
              f"{s['volumes_per_minute']:.2f} volumes/min (roi {roi}, sw_batch_size {sw}, embed {embed})")
        for r in s["per_image"]:
            print(f"  rank {r['rank']} {Path(r['image']).name} {r['status']} {r['seconds']:.2f} s "
                  f"windows {r['windows']} {r['error'] or ''}")
        if args.json:
            Path(args.json).write_text(json.dumps({**s, "command": " ".join(sys.argv), "wall_total": wall}, indent=1))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
