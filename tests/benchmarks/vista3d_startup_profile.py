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
"""Where a fresh ``vista3d`` process spends its time before and around its one label map (issue 37, goal 2).

Writes the inputs of ``vista3d_cold_start.py`` (the issue's CT, a random checkpoint of the bundle's size), fills
the kernel cache with one run, then runs the same command under ``cProfile`` in fresh processes (``--fuse`` and
``--no-fuse``) and prints, for each, the wall clock and the calls of the main thread that take the most time.
cProfile sees only the main thread; the loader thread's read of the CT overlaps it and shows up as waits.

    python tests/benchmarks/vista3d_startup_profile.py --device cuda --workdir /tmp/sp --out prof/
"""

from __future__ import annotations

import argparse
import io
import os
import pstats
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vista3d_cold_start import REPO, write_inputs


def summary(prof: Path, top: int) -> str:
    """The ``top`` calls by cumulative and by own time, limited to this repository and torch/triton entry points."""
    text = io.StringIO()
    stats = pstats.Stats(str(prof), stream=text)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--workdir", required=True, help="inputs, outputs and the kernel cache go here")
    p.add_argument("--out", required=True, help="folder for the .prof files")
    p.add_argument("--top", type=int, default=45, help="rows of each table")
    p.add_argument("--timeline", type=int, default=2, metavar="N",
                   help="first run the command N times under experiments/process_timeline.py (no profiler)")
    p.add_argument("--timeline-config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="then as many timelines with these FusedConfig fields replaced (e.g. graph_max_windows=4), "
                        "taking turns with the command's own")
    p.add_argument("--timeline-script", default=None, metavar="NAME.py",
                   help="then as many timelines by this script of experiments/ (it takes process_timeline's "
                        "arguments), taking turns with the command's own")
    p.add_argument("--timeline-flags", default="", metavar="'FLAGS'",
                   help="then as many timelines of the command with these flags added (given with '=': "
                        "--timeline-flags='--sw-batch-size auto'), taking turns with the command's own")
    args = p.parse_args(argv)
    work, out = Path(args.workdir).resolve(), Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    tiny = args.device == "cpu"
    cts, weights = write_inputs(work, tiny, 1, 0)
    inherited = [q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q]
    # the bytecode of every import in one folder, filled by the first run, as an installed environment has it (the
    # GPU image sets PYTHONDONTWRITEBYTECODE and its torch ships none: without it every process compiles ~1.8 s)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *inherited]),
               TRITON_CACHE_DIR=str(work / "triton_cache"), PYTHONPYCACHEPREFIX=str(work / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    small = ["--embed-dim", "8", "--roi-size", "32"] if tiny else []
    cli = ["-m", "monai.apps.vista3d", "-i", str(cts[0]), "-o", str(work / "out"), "--weights", str(weights),
           "--device", args.device, "--timing", "--overwrite", *small]
    subprocess.run([sys.executable, *cli], env=env, check=True, capture_output=True)  # fills the kernel cache
    experiments = REPO / "tests" / "benchmarks" / "experiments"
    timeline = str(experiments / "process_timeline.py")
    # (script, FusedConfig fields, flags added to the command)
    variants = [(timeline, [], [])] + ([(timeline, args.timeline_config, [])] if args.timeline_config else [])
    if args.timeline_script:
        variants.append((str(experiments / args.timeline_script), [], []))
    if args.timeline_flags:
        variants.append((timeline, [], shlex.split(args.timeline_flags)))
    for i in range(args.timeline):  # when each step is reached, in the command's own process (no profiler)
        for script, config, flags in variants:
            t0 = time.perf_counter()
            run = subprocess.run([sys.executable, script, "exit=fast", *config, "--", *cli[2:], *flags], env=env,
                                 capture_output=True, text=True)
            wall = time.perf_counter() - t0
            label = " ".join(config + flags) or (Path(script).stem if script != timeline else "")
            print(f"=== timeline {i + 1}{' (' + label + ')' if label else ''}: {wall:.2f} s wall "
                  f"(exit {run.returncode})\n{run.stderr[-3000:]}")
    for name, extra in (("fused", []), ("no-fuse", ["--no-fuse"])):
        prof = out / f"startup_{name}.prof"
        t0 = time.perf_counter()
        # the profiler around the CLI's main (the program itself ends with os._exit, before cProfile could write)
        driver = ("import cProfile, sys; from monai.apps.vista3d.cli.main import main; "
                  f"cProfile.run('main(sys.argv[1:])', {str(prof)!r})")
        run = subprocess.run([sys.executable, "-c", driver, *cli[2:], *extra], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        print(f"=== {name}: {wall:.2f} s under cProfile (exit {run.returncode})\n{run.stdout}{run.stderr[-2000:]}")
        if prof.is_file():
            print(summary(prof, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
