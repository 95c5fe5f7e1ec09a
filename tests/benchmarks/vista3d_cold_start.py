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
"""What a user meets: the ``vista3d`` command in fresh processes, timed from the outside, against the bundle.

Every row is one new process, timed from its start to its exit (the label map is written before it exits):

* ``baseline``: ``python -c "import torch; torch.zeros(1).cuda()"`` (on the CPU ``import torch``): what any
  PyTorch program pays before it does anything; ``package``: the same with the command's module imported
  (``monai.apps.vista3d.cli.main``) and the command's exit (``os._exit``, no teardown): issue 50's reference;
* ``cold``: ``vista3d -i ct.nii.gz -o out/ --weights model.pt --timing`` with an empty kernel cache
  (``TRITON_CACHE_DIR`` a new folder): the first run on a machine;
* ``prepare``, ``prepared``: the README's install on a new machine: ``vista3d prepare`` with an empty cache, then
  the same command as ``cold`` on the cache it filled;
* ``warm``, ``no-fuse``: the same command with that cache filled, and with ``--no-fuse``;
* ``auto-first``, ``auto``: with ``--sw-batch-size auto``, the first time (on CUDA its one-window probe measures
  the window's memory and stores it beside the kernels, ``vista3d-auto-batch.json``) and the times after (the
  stored cost read: no probe); ``stored_costs`` says how many costs the store held after the first;
* ``six``: six CTs in one command (warm cache); each CT's share of the wall clock from the second on is the
  time between the lines the command prints as each label map is written, set against that CT's inference stage;
* ``bundle``: the VISTA3D bundle's inference (upstream MONAI 1.6.1's transforms and inferer, as
  ``tests/benchmarks/vista3d_end_to_end.py`` rebuilds them) as a one-shot process, imports included
  (``--upstream FOLDER``: where ``pip install --target FOLDER monai==1.6.1`` put it).

``exit s`` is the time from the command's last line to its exit (Python's teardown, where the process runs it).
The weights are random (a ``vista3d132`` state dict written once, the size of the bundle's 872 MB checkpoint);
speed does not depend on them. The stage table of each fork run is the ``--timing`` output of its image.

    python tests/benchmarks/vista3d_cold_start.py --device cuda --upstream /tmp/up --json cold.json
    python tests/benchmarks/vista3d_cold_start.py --device cpu     # a small phantom and a tiny network
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
END_TO_END = REPO / "tests" / "benchmarks" / "vista3d_end_to_end.py"
#: the issue's CT: 512 x 512 x 200 at 0.78 x 0.78 x 2.0 mm (on the CPU a tenth of it, for a tiny network)
CUDA_CT, CPU_CT = ((512, 512, 200), (0.78, 0.78, 2.0)), ((128, 128, 50), (0.78, 0.78, 2.0))
_STAGE_ROW = re.compile(r"^(\w[\w /-]*?)\s+([0-9.]+)\s+[0-9.]+%$")


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Run ``cmd`` in a new process; its wall clock from start to exit and the arrival time of each stdout line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append((time.perf_counter() - t0, line.rstrip("\n")))
    err = proc.stderr.read()  # type: ignore[union-attr]
    code = proc.wait()
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {code}:\n{err}")
    return {"wall": wall, "lines": lines}


def stage_table(lines: list[tuple[float, str]]) -> dict[str, float]:
    """The first image's ``--timing`` table (stage -> seconds) from the command's stdout."""
    stages: dict[str, float] = {}
    for _, text in lines:
        m = _STAGE_ROW.match(text.strip())
        if m and m.group(1) not in stages:
            stages[m.group(1)] = float(m.group(2))
    return stages


def written_times(lines: list[tuple[float, str]]) -> list[float]:
    """When each image's line (printed as its label map is written) arrived, in seconds from process start."""
    return [t for t, text in lines if " -> " in text]


def inference_times(lines: list[tuple[float, str]]) -> list[float]:
    """Every image's inference stage from the ``--timing`` tables."""
    rows = (_STAGE_ROW.match(text.strip()) for _, text in lines)
    return [float(m.group(2)) for m in rows if m and m.group(1) == "inference"]


def write_inputs(work: Path, tiny: bool, copies: int, seed: int) -> tuple[list[Path], Path]:
    """``copies`` phantoms of the issue's CT (different seeds) and a random ``vista3d132`` checkpoint."""
    import torch

    from monai.apps.vista3d.cli.phantom import write_phantom
    from monai.networks.nets import vista3d132

    shape, spacing = CPU_CT if tiny else CUDA_CT
    cts = []
    (work / "cts").mkdir(parents=True, exist_ok=True)
    for i in range(copies):
        path = work / "cts" / f"ct{i}.nii.gz"
        if not path.is_file():
            write_phantom(path, shape, spacing, seed=seed + i)
        cts.append(path)
    weights = work / "model.pt"
    if not weights.is_file():
        torch.manual_seed(seed)
        torch.save(vista3d132(encoder_embed_dim=8 if tiny else 48).state_dict(), weights)
    return cts, weights


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--upstream", default=None, help="folder with upstream MONAI 1.6.1 (pip install --target PATH)")
    p.add_argument("--repeats", type=int, default=3, help="warm runs of each kind (the median is reported)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the phantoms")
    p.add_argument("--workdir", default=None, help="inputs and outputs go here (default: a temporary folder)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--quick", action="store_true",
                   help="only baseline, package, warm, no-fuse and auto (stored cost), taking turns: the rows of issue "
                        "50's goal 2")
    args = p.parse_args(argv)
    if args.upstream and not (Path(args.upstream) / "monai" / "__init__.py").is_file():
        p.error(f"--upstream {args.upstream}: no monai package there; install it with "
                f"'pip install --no-deps --target {args.upstream} monai==1.6.1'")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tiny = device == "cpu"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="vista3d_cold_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from monai.apps.vista3d.core.auto_batch_store import STORE_NAME

    cts, weights = write_inputs(work, tiny, 6, args.seed)
    cache = work / "triton_cache"
    # this checkout first; the caller's own entries after it (dependencies installed with pip --target)
    inherited = [q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *inherited]), TRITON_CACHE_DIR=str(cache),
               PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=str(work / "pycache"))
    # Every timed process finds the bytecode of what it imports, as in an installed environment (pip writes it).
    # Where the environment says not to write any (PYTHONDONTWRITEBYTECODE, as on some GPU images, whose torch
    # ships none), each fresh process would compile every module it imports, torch's included: one untimed run
    # (its own kernel cache, thrown away) and compileall of upstream fill a shared bytecode folder first.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cli = [sys.executable, "-m", "monai.apps.vista3d", "--weights", str(weights), "--device", device, "--timing",
           "--overwrite", *(["--embed-dim", "8", "--roi-size", "32"] if tiny else [])]
    timed(cli + ["-i", str(cts[0]), "-o", str(work / "out_fill")], dict(env, TRITON_CACHE_DIR=str(work / "fill")), work)
    if args.upstream:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(args.upstream) / "monai")], env=env,
                       check=True)
    warm_up = "torch.zeros(1).cuda()" if device == "cuda" else "torch.zeros(1)"
    rows: list[dict[str, Any]] = []

    def record(kind: str, runs: list[dict[str, Any]], **extra: Any) -> None:
        walls = [r["wall"] for r in runs]
        # what the process took after its last line (the summary): its exit, Python's teardown where it runs
        exits = [r["wall"] - r["lines"][-1][0] for r in runs if r["lines"]]
        row = {"kind": kind, "wall": statistics.median(walls), "walls": walls,
               "after_last_line": statistics.median(exits) if exits else None,
               "stages": stage_table(runs[-1]["lines"]), **extra}
        rows.append(row)
        print(f"{kind:<10} {row['wall']:8.2f} s  {' '.join(f'{w:.2f}' for w in walls)}", file=sys.stderr, flush=True)

    baseline = [sys.executable, "-c", f"import torch; {warm_up}; print('ready')"]
    # issue 50's reference: the package imported (the command's module) and CUDA touched, nothing run, and the exit
    # the command takes (os._exit after the flush: no teardown, which the baseline's exit pays)
    package = [sys.executable, "-c",
               f"import os, torch, monai.apps.vista3d.cli.main; {warm_up}; print('ready', flush=True); os._exit(0)"]
    one = ["-i", str(cts[0]), "-o", str(work / "out")]
    if cache.exists():
        raise SystemExit(f"{cache} exists: give a new --workdir for a cold run")
    if args.quick:  # the warm rows only: the cache filled by an untimed run, auto's cost stored by another
        timed(cli + one, env, work)
        timed(cli + one + ["--sw-batch-size", "auto"], env, work)
        commands = {"baseline": baseline, "package": package, "warm": cli + one, "no-fuse": cli + one + ["--no-fuse"],
                    "auto": cli + one + ["--sw-batch-size", "auto"]}
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in commands}
        for _ in range(args.repeats):  # the rows take turns: a host's drift (page cache, clocks) falls on all alike
            for kind, command in commands.items():
                runs[kind].append(timed(command, env, work))
        for kind in commands:
            record(kind, runs[kind])
        report(rows, device, args)
        return 0
    record("baseline", [timed(baseline, env, work) for _ in range(args.repeats)])
    record("package", [timed(package, env, work) for _ in range(args.repeats)])
    record("cold", [timed(cli + one, env, work)])
    # the README's install: `vista3d prepare` once with an empty cache, then the first CT
    prepared = work / "triton_cache_prepared"
    if prepared.exists():
        raise SystemExit(f"{prepared} exists: give a new --workdir for a cold run")
    prep_env = dict(env, TRITON_CACHE_DIR=str(prepared))
    prep_args = ["--embed-dim", "8", "--roi-size", "32"] if tiny else []
    record("prepare", [timed([sys.executable, "-m", "monai.apps.vista3d", "prepare", "--device", device, *prep_args],
                             prep_env, work)])
    record("prepared", [timed(cli + one, prep_env, work)])
    record("warm", [timed(cli + one, env, work) for _ in range(args.repeats)])
    record("no-fuse", [timed(cli + one + ["--no-fuse"], env, work) for _ in range(args.repeats)])
    auto = cli + one + ["--sw-batch-size", "auto"]
    record("auto-first", [timed(auto, env, work)])
    stored = json.loads((cache / STORE_NAME).read_text())["costs"] if (cache / STORE_NAME).exists() else {}
    record("auto", [timed(auto, env, work) for _ in range(args.repeats)], stored_costs=len(stored))
    six = [timed(cli + ["-i", str(work / "cts"), "-o", str(work / "out6")], env, work) for _ in range(args.repeats)]
    shares = [b - a for r in six for a, b in zip(written_times(r["lines"])[:-1], written_times(r["lines"])[1:])]
    infer = [t for r in six for t in inference_times(r["lines"])[1:]]
    record("six", six, share_per_ct=statistics.median(shares), inference_per_ct=statistics.median(infer),
           volumes_per_minute=60.0 * len(cts) / statistics.median(r["wall"] for r in six))
    if args.upstream:
        up_env = dict(env, PYTHONPATH=os.pathsep.join([str(Path(args.upstream).resolve()), *inherited]))
        bundle = [sys.executable, str(END_TO_END), "--worker", "upstream", "--device", device, "--repeats", "0",
                  "--sw-batch-size", "1", "--roi", "32" if tiny else "128", "--classes", "0", "--weights",
                  str(weights), "--out", str(work), "--output-dtypes", "float32", "--embed-dim", "8" if tiny else "48",
                  "--inputs", str(cts[0])]
        record("bundle", [timed(bundle, up_env, work) for _ in range(args.repeats)])

    report(rows, device, args)
    return 0


def report(rows: list[dict[str, Any]], device: str, args: argparse.Namespace) -> None:
    """Print the table (and write ``--json``)."""
    import torch

    base = rows[0]["wall"]
    print(f"\n{'run':<10}{'wall s':>9}{'- baseline':>12}{'exit s':>8}  stages of the image (s)")
    for r in rows:
        stages = " ".join(f"{k} {v:.3f}" for k, v in r["stages"].items())
        after = f"{r['after_last_line']:8.2f}" if r["after_last_line"] is not None else f"{'':8s}"
        print(f"{r['kind']:<10}{r['wall']:>9.2f}{r['wall'] - base:>12.2f}{after}  {stages}")
    wall_of = {r["kind"]: r["wall"] for r in rows}
    warm = wall_of["warm"]
    print(f"device {device}; warm - baseline {warm - base:.2f} s; warm - package {warm - wall_of['package']:.2f} s; "
          f"no-fuse - warm {wall_of['no-fuse'] - warm:.2f} s; auto - warm {wall_of['auto'] - warm:.2f} s")
    if "six" in wall_of:
        full_report(rows, args)
    if args.json:
        meta = {"device": device, "tiny": device == "cpu", "repeats": args.repeats, "cpus": os.cpu_count(),
                "torch": torch.__version__, "bytecode": "PYTHONPYCACHEPREFIX, filled by an untimed run",
                "dont_write_bytecode_in_env": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
                "command": "python tests/benchmarks/vista3d_cold_start.py " + " ".join(sys.argv[1:])}
        for r in rows:
            r.pop("lines", None)
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def full_report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The lines of the full run: six CTs, cold and prepared against warm, the bundle."""
    six_row = next(r for r in rows if r["kind"] == "six")
    print(f"six CTs: {six_row['share_per_ct']:.3f} s of wall clock per CT from the second on, inference "
          f"{six_row['inference_per_ct']:.3f} s ({six_row['share_per_ct'] / six_row['inference_per_ct']:.2f}x); "
          f"{six_row['volumes_per_minute']:.1f} volumes/min")
    wall_of = {r["kind"]: r["wall"] for r in rows}
    warm = wall_of["warm"]
    print(f"cold / warm {wall_of['cold'] / warm:.2f}x; prepared / warm {wall_of['prepared'] / warm:.2f}x"
          f" (prepare {wall_of['prepare']:.2f} s)"
          + (f"; bundle / warm {wall_of['bundle'] / warm:.2f}x" if args.upstream else ""))


if __name__ == "__main__":
    sys.exit(main())
