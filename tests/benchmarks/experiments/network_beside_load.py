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
"""Experiment: what the command's other threads cost its network build (issue 50, goal 2).

A fresh ``vista3d`` process reads the checkpoint into the network (``network_from_checkpoint``, on the main thread)
while the loader thread reads the first CT and a third thread hashes the weights for the run's record. This times
the network build alone and beside each of them (median of ``--repeats``), in this process, on the CPU.

    python tests/benchmarks/experiments/network_beside_load.py --ct /tmp/ct512.nii.gz --weights /tmp/w48.pt
    python tests/benchmarks/experiments/network_beside_load.py --workdir /tmp/nbl   # cold_start's CT and weights
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ct", help="a CT .nii.gz (e.g. a 512x512x200 phantom)")
    p.add_argument("--weights", help="a vista3d132 state dict of width --embed-dim")
    p.add_argument("--workdir", help="instead: write vista3d_cold_start.py's CT and weights here (or reuse them)")
    p.add_argument("--embed-dim", type=int, default=48)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.workdir:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from vista3d_cold_start import write_inputs

        cts, weights = write_inputs(Path(args.workdir), False, 1, 0)
        args.ct, args.weights, args.embed_dim = str(cts[0]), str(weights), 48
    if not (args.ct and args.weights):
        p.error("give --ct and --weights, or --workdir")
    from monai.apps.vista3d.batch.provenance import weights_digest
    from monai.apps.vista3d.core.checkpoint import network_from_checkpoint
    from monai.apps.vista3d.io.nifti import load_image

    def build() -> None:
        network_from_checkpoint(args.weights, {"encoder_embed_dim": args.embed_dim})

    build()
    load_image(args.ct)  # imports and the page cache, as in a warm process

    def beside(others: list) -> float:
        seconds = []
        for _ in range(args.repeats):
            threads = [threading.Thread(target=fn, args=(arg,)) for fn, arg in others]
            start = time.perf_counter()
            for t in threads:
                t.start()
            build()
            seconds.append(time.perf_counter() - start)
            for t in threads:
                t.join()
        return statistics.median(seconds)

    start = time.perf_counter()
    load_image(args.ct)
    print(f"the CT's load alone: {time.perf_counter() - start:.3f} s")
    for name, others in (("alone", []), ("beside the weights' hash", [(weights_digest, args.weights)]),
                         ("beside the CT's load", [(load_image, args.ct)]),
                         ("beside both", [(weights_digest, args.weights), (load_image, args.ct)])):
        print(f"network build {name}: {beside(others):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
