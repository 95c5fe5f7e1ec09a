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
"""Volumes per minute of the README's folder command over 1, 2, 4 ... processes, each row a fresh command (issue
50, item 6: ``torchrun`` over 2 and 4 GPUs at >= 90 % of linear).

Writes ``--distinct`` phantom CTs of ``--size`` and links them to ``--volumes`` inputs, runs the command once on one
input untimed (the kernel cache filled, as ``vista3d prepare`` leaves it), then for each process count the command a
user types: ``python -m monai.apps.vista3d -i in/ -o out/`` for one process, ``torchrun --standalone
--nproc_per_node=N -m monai.apps.vista3d -i in/ -o out/`` for N. Each row is timed from the command's start to its
exit (imports, CUDA, the network's build and every save included) and checked: its ``summary.json`` must say every
input was segmented. Percent of linear is ``volumes/min at N / (N x volumes/min at 1)``. Arguments after ``--`` go
to the command (``--weights``, ``--sw-batch-size``, ...).

    python tests/benchmarks/batch_scaling.py --ranks 1,2,4 --volumes 96 --size 512,512,200
    OMP_NUM_THREADS=1 python tests/benchmarks/batch_scaling.py --device cpu --ranks 1,2 --volumes 4 --size 40,40,32 \
        -- --embed-dim 8 --roi-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from monai.apps.vista3d.cli.phantom import write_phantom
from tests.subprocess_env import ROOT, child_env


def write_inputs(folder: Path, volumes: int, distinct: int, shape: tuple[int, int, int]) -> list[Path]:
    """``volumes`` inputs in ``folder``: ``distinct`` phantoms (seeds 0, 1, ...), the rest hard links to them."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"ct{i:03d}.nii.gz" for i in range(volumes)]
    for i, path in enumerate(paths):
        if i < distinct:
            write_phantom(path, shape, seed=i)
        else:
            path.unlink(missing_ok=True)  # (a --workdir used before)
            os.link(paths[i % distinct], path)
    return paths


def command(ranks: int, inputs: Path, out: Path, device: str, extra: list[str]) -> list[str]:
    """The command a user types for ``ranks`` processes (a plain one for one; ``torchrun`` is torch.distributed.run)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    head = [sys.executable] if ranks == 1 else launcher
    return [*head, "-m", "monai.apps.vista3d", "-i", str(inputs), "-o", str(out), "--device", device,
            "--overwrite", *extra]


def run_row(argv: list[str], out: Path, volumes: int) -> float:
    """Run the command; its wall seconds. Raises if it failed or its summary does not count every input done."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    done = json.loads((out / "summary.json").read_text())["done"]
    if done != volumes:
        raise RuntimeError(f"{' '.join(argv)} segmented {done} of {volumes} inputs (see {out / 'summary.json'})")
    return wall


def percent_of_linear(rates: dict[int, float]) -> dict[int, float]:
    """Each process count's volumes/min against that many times the one-process rate (needs ranks 1)."""
    return {n: 100.0 * rate / (n * rates[1]) for n, rate in rates.items()}


def time_rows(work: Path, args: argparse.Namespace, ranks: list[int], extra: list[str]) -> dict[int, float]:
    """Write the inputs under ``work``, fill the kernel cache, then each process count's fastest wall seconds."""
    shape = tuple(int(s) for s in args.size.split(","))
    distinct = min(args.distinct, args.volumes)
    inputs = write_inputs(work / "in", args.volumes, distinct, shape)  # type: ignore[arg-type]
    warm = run_row(command(1, inputs[0], work / "warm", args.device, extra), work / "warm", 1)
    print(f"untimed first run on one input (fills the kernel cache): {warm:.1f} s")
    print(f"{args.volumes} volumes {shape} ({distinct} distinct), device {args.device}, command flags {extra}")
    return {n: min(run_row(command(n, work / "in", work / f"out{n}", args.device, extra), work / f"out{n}",
                           args.volumes) for _ in range(args.repeats)) for n in ranks}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4", help="process counts, 1 first (default 1,2,4; on cuda capped at "
                        "the GPUs there)")
    parser.add_argument("--volumes", type=int, default=96, help="inputs (default 96)")
    parser.add_argument("--distinct", type=int, default=8, help="different phantoms among them (default 8)")
    parser.add_argument("--size", default="512,512,200", help="phantom size X,Y,Z (default 512,512,200)")
    parser.add_argument("--device", default="cuda", help="cuda (each rank its own GPU) or cpu (default cuda)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each row, the fastest kept (default 1)")
    parser.add_argument("--workdir", default=None, help="folder for inputs and outputs (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(own)
    ranks = [int(r) for r in args.ranks.split(",")]
    if ranks[0] != 1:
        parser.error("--ranks must start with 1: percent of linear is measured against one process")
    if args.device == "cuda":
        import torch

        ranks = [r for r in ranks if r <= torch.cuda.device_count()]
        if not ranks:
            parser.error("no CUDA GPU is visible here; pass --device cpu to run on the CPU")
        print(f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}; process counts {ranks}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="vista3d_scaling_"))
    try:
        walls = time_rows(work, args, ranks, extra)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    rates = {n: 60.0 * args.volumes / wall for n, wall in walls.items()}
    linear = percent_of_linear(rates)
    print("processes | wall s | volumes/min | % of linear")
    for n in ranks:
        print(f"{n:9d} | {walls[n]:6.1f} | {rates[n]:11.2f} | {linear[n]:10.1f}")
    if args.json:
        rows = [{"processes": n, "wall_seconds": walls[n], "volumes_per_minute": rates[n],
                 "percent_of_linear": linear[n]} for n in ranks]
        Path(args.json).write_text(json.dumps({"command": " ".join([sys.argv[0], *argv]), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
