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
"""Independent parts over one output folder, on the CPU (issue 29, goal 5): every output written once.

Writes ``--images`` small phantom CTs of a few shapes, starts ``--parts`` parts together, each ``--copies`` times
(a second copy is the same part given twice by mistake) and each a ``torchrun --nproc_per_node --ranks`` of
``vista3d segment --part I/N`` (``--ranks 1``: a plain process), all writing to one folder. Once part ``--kill``
has written ``--kill-after`` images, all its processes are killed with SIGKILL (a node lost: nothing of theirs
runs after it); the other parts finish; then the killed part is rerun. Every process logs each rename into an
output (a hook on ``os.replace`` installed in it), so the script checks that every output was written exactly
once, that the files written before the rerun were left alone, and that no lock or temporary file is left. It
ends with ``vista3d summary`` of the folder.

    python tests/benchmarks/cluster_parts.py --images 40 --parts 4 --ranks 2
    python tests/benchmarks/cluster_parts.py --images 40 --parts 4 --ranks 1 --copies 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(40, 40, 32), (48, 40, 24), (32, 32, 32), (56, 48, 24), (40, 32, 40)]


def _worker(log: str, pids: str, argv: list[str]) -> int:
    """One process of a part: the CLI, with every rename into an output appended to ``log``."""
    sys.path.insert(0, str(ROOT))
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\n")
    real_replace = os.replace

    def logged_replace(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if str(dst).endswith("_trans.nii.gz"):
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{dst}\t{os.getpid()}\n".encode())
            os.close(fd)

    os.replace = logged_replace
    from monai.apps.vista3d.cli.main import main

    return main(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: argparse.Namespace, work: Path, i: int, tag: str) -> subprocess.Popen:
    """Part ``i`` (its launcher in a session of its own, its log files named by ``tag``)."""
    seg = ["segment", "-i", str(work / "cts"), "-o", str(work / "out"), "--part", f"{i}/{args.parts}",
           "--roi-size", "64", "--embed-dim", "8", "--classes", "1,3", "--device", "cpu"]
    me = [str(Path(__file__).resolve()), "--worker", str(work / f"writes.{tag}.log"), str(work / f"pids.{tag}")]
    if args.ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}",
               f"--master_port={_free_port()}", *me, "--", *seg]
    else:
        cmd = [sys.executable, *me, "--", *seg]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(work / f"stdout.{tag}.log", "w") as out, open(work / f"stderr.{tag}.log", "w") as err:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _kill(proc: subprocess.Popen, pid_file: Path) -> None:
    """SIGKILL the part's launcher session and every process of it (torchrun puts each rank in its own session)."""
    for pid in [proc.pid, *map(int, _lines(pid_file))]:
        try:
            os.killpg(pid, signal.SIGKILL) if pid == proc.pid else os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--worker":
        return _worker(argv[1], argv[2], argv[4:])  # argv[3] is "--"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=40, help="number of phantom CTs (default 40)")
    parser.add_argument("--parts", type=int, default=4, help="N of --part I/N (default 4)")
    parser.add_argument("--ranks", type=int, default=2, help="torchrun processes per part (default 2; 1: no torchrun)")
    parser.add_argument("--copies", type=int, default=1, help="times each part is started (default 1)")
    parser.add_argument("--kill", type=int, default=1, help="the part that is killed and rerun (default 1)")
    parser.add_argument("--kill-after", type=int, default=2, help="its outputs written before the kill (default 2)")
    parser.add_argument("--workdir", default=None, help="folder for inputs and outputs (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write the result to this JSON file")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from monai.apps.vista3d.cli.phantom import write_phantom

    work = Path(args.workdir or tempfile.mkdtemp(prefix="vista3d_parts_"))
    (work / "cts").mkdir(parents=True, exist_ok=True)
    for k in range(args.images):
        write_phantom(work / "cts" / f"ct{k:03d}.nii.gz", SHAPES[k % len(SHAPES)], seed=k)
    print(f"{args.images} images in {work / 'cts'}; {args.parts} parts x {args.copies} cop(ies) x {args.ranks} "
          f"process(es) started together; part {args.kill} killed after {args.kill_after} outputs, then rerun")

    t0 = time.perf_counter()
    procs = {(i, c): _start(args, work, i, f"{i}.{c}") for i in range(args.parts) for c in range(args.copies)}
    victims = [(i, c) for (i, c) in procs if i == args.kill]
    deadline = time.time() + 600
    while sum(len(_lines(work / f"writes.{i}.{c}.log")) for i, c in victims) < args.kill_after:
        if all(procs[v].poll() is not None for v in victims) or time.time() > deadline:
            print("error: the part to kill ended (or hung) before writing its outputs", file=sys.stderr)
            break
        time.sleep(0.02)
    for v in victims:
        _kill(procs[v], work / f"pids.{v[0]}.{v[1]}")
    killed_at = time.perf_counter() - t0
    codes = {f"{i}.{c}": p.wait() for (i, c), p in procs.items()}
    first_wall = time.perf_counter() - t0
    outs = sorted((work / "out").rglob("*_trans.nii.gz"))
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in outs}
    print(f"first round: {first_wall:.1f} s (part {args.kill} killed at {killed_at:.1f} s); {len(outs)} outputs; "
          f"exit codes {codes}")

    t1 = time.perf_counter()
    rerun = _start(args, work, args.kill, f"{args.kill}.rerun")
    rerun_code = rerun.wait()
    rerun_wall = time.perf_counter() - t1

    writes = Counter(line.split("\t")[0] for log in work.glob("writes.*.log") for line in _lines(log))
    outs = sorted((work / "out").rglob("*_trans.nii.gz"))
    changed = [str(p) for p, stamp in before.items() if (p.stat().st_ino, p.stat().st_mtime_ns) != stamp]
    twice = {k: n for k, n in writes.items() if n > 1}
    debris = [str(p) for p in (work / "out").rglob(".*") if p.is_file()]
    summary = subprocess.run([sys.executable, "-m", "monai.apps.vista3d", "summary", str(work / "out")], cwd=ROOT,
                             capture_output=True, text=True)
    print(f"rerun of part {args.kill}: {rerun_wall:.1f} s, exit {rerun_code}; "
          f"{len(before)} outputs before it, {len(outs)} after")
    print(f"renames into outputs: {sum(writes.values())} for {len(writes)} outputs; written twice: {len(twice)}; "
          f"outputs changed by the rerun: {len(changed)}; lock/temporary files left: {len(debris)}")
    print(summary.stdout, end="")
    ok = (len(outs) == args.images and not twice and not changed and not debris and rerun_code == 0
          and summary.returncode == 0 and set(writes) <= {str(p) for p in outs})
    print("OK: every output written once, the rerun completed the set" if ok else "FAILED", flush=True)
    if not ok:
        print(f"twice: {twice}\nchanged: {changed}\ndebris: {debris}\n{summary.stderr}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "images": args.images, "parts": args.parts, "copies": args.copies, "ranks": args.ranks,
            "first_round_seconds": round(first_wall, 2), "killed_at_seconds": round(killed_at, 2),
            "outputs_before_rerun": len(before), "rerun_seconds": round(rerun_wall, 2), "outputs": len(outs),
            "renames": sum(writes.values()), "written_twice": len(twice), "changed_by_rerun": len(changed),
            "debris": debris, "exit_codes": codes, "ok": ok,
        }, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
