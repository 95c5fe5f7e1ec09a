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
"""The flags of ``vista3d`` (``python -m monai.apps.vista3d``): the parser of every command, its usage and help.
What each command does with them is ``__main__``'s."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..config import (
    DEFAULT_OVERLAP,
    OUTPUT_DTYPES,
    ROI_MULTIPLE,
    check_embed_dim,
    check_roi_size,
)
from ..server.cli import add_serve_command

__all__ = [
    "COMMANDS",
    "build_parser",
    "program_name",
    "version",
    "UsageError",
    "parse_ints",
    "parse_floats",
    "parse_roi",
    "embed_dim_or",
    "joined_points",
]

#: the commands; without one, ``segment`` is meant
COMMANDS = ("segment", "benchmark", "summary", "prepare", "serve")


def program_name() -> str:
    """The name the user typed: ``vista3d`` for the console script, else the module form."""
    return "vista3d" if Path(sys.argv[0]).name == "vista3d" else "python -m monai.apps.vista3d"


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m monai.apps.vista3d``."""
    prog = program_name()
    usage = (f"{prog} [segment] -i IMAGE_OR_FOLDER [-i ...] -o OUTPUT [options]\n       {prog} --list-classes\n"
             f"       {prog} prepare [options]\n       {prog} benchmark [options]\n       {prog} summary OUTPUT\n"
             f"       {prog} serve --weights model.pt [--host 127.0.0.1] [--port 8000]\n       {prog} --version")
    parser = argparse.ArgumentParser(
        prog=prog, usage=usage,
        description="VISTA3D CT segmentation: the bundle's inference pipeline, and a latency benchmark. "
                    "Without a command, 'segment' is meant.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{segment,prepare,benchmark,summary,serve}")

    _add_segment(sub, prog, usage)
    _add_benchmark(sub, prog)
    _add_summary(sub, prog)
    _add_prepare(sub, prog)
    add_serve_command(sub, prog)  # the server's own subcommand: args.run(args) runs it
    return parser


def _add_common(p: argparse.ArgumentParser) -> None:
    """The options ``segment`` and ``benchmark`` share."""
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="float16 autocast on CUDA (default: on for CUDA, off for CPU)")
    p.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP,
                   help=f"sliding-window overlap (default {DEFAULT_OVERLAP})")
    p.add_argument("--no-fuse", dest="fuse", action="store_false",
                   help="run the network's module path instead of the fused channels-last kernels (which run by "
                        "default on Hopper GPUs with Triton; see VISTA3D.fuse)")
    p.add_argument("--classes", default="everything",
                   help="'everything' (the bundle's 117 labels) or ids/names, e.g. 3,14,liver")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (without --weights)")
    p.add_argument("--roi-size", default=None,
                   help="window size, e.g. 128 or 128,128,96 (default 128, the bundle's; 64 in the CPU benchmark)")
    p.add_argument("--embed-dim", type=int, default=None,
                   help="vista3d132 encoder_embed_dim (default 48, the bundle's; must match --weights)")
    p.add_argument("--output-dtype", choices=OUTPUT_DTYPES, default="uint8",
                   help="voxel type of the saved label maps (default uint8: every label id and the 255 sentinel "
                        "fit; float32 writes the bundle's files, 4x the bytes)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-image lines")


def _add_segment(sub: Any, prog: str, usage: str) -> None:
    """The ``segment`` command (the default one)."""
    seg = sub.add_parser(
        "segment", help="segment NIfTI CT images (the default command)", usage=usage, prog=prog,
        description="Segment NIfTI CT images with VISTA3D (the default command: 'segment' may be left out). "
                    f"Other commands: '{prog} prepare' (compile the GPU kernels once, after installing), '{prog} "
                    f"benchmark -h' (time the pipeline on a phantom), '{prog} summary OUTPUT' (merge the parts' "
                    f"summaries), '{prog} --version'.",
        epilog="Negative point coordinates work as --points=-3,40,20 or --points -3,40,20. Exit status: 0 done, "
               "1 an image failed, 2 bad arguments, 130 Ctrl-C, 143 SIGTERM.",
    )
    seg.add_argument("images", nargs="*", help=".nii / .nii.gz files, or folders (searched recursively)")
    seg.add_argument("-i", "--input", dest="inputs", action="append", default=[], metavar="IMAGE_OR_FOLDER",
                     help="a .nii / .nii.gz file or a folder searched recursively for them (repeatable); an image "
                          "found in a folder keeps its subfolder under the output folder")
    seg.add_argument("--input-list", default=None, help="a text file with one image path per line, or a folder")
    seg.add_argument("-o", "--output", default=None,
                     help="output folder (writes OUTPUT/<name>/<name>_trans.nii.gz), or a .nii / .nii.gz file "
                          "for one input image")
    seg.add_argument("--output-dir", default=None, help="output folder (the same as -o FOLDER)")
    seg.add_argument("--list-classes", action="store_true",
                     help="print the label ids and names VISTA3D knows ('*': in --classes everything) and exit")
    seg.add_argument("--strict", action="store_true",
                     help="refuse images with NaN or Inf voxels (default: read them as air, -1000 HU, with a warning)")
    seg.add_argument("--weights", default=None, help="VISTA3D checkpoint (the bundle's models/model.pt)")
    seg.add_argument("--points", default=None, help="point prompts, voxel indices of the input: 'x,y,z;x,y,z'")
    seg.add_argument("--point-labels", default=None, help="one label per point: 1 positive, 0 negative")
    seg.add_argument("--sw-batch-size", default="1",
                     help="windows per network call (default 1), or 'auto': on CUDA as many as the free GPU memory "
                          "holds, measured on a first one-window call, elsewhere 4; split evenly (the same rule "
                          "with and without --no-streaming; see monai.inferers.batch_size)")
    seg.add_argument("--per-class", action="store_true",
                     help="also write one uint8 mask per requested class, OUTPUT/<name>/<class name>.nii.gz (names "
                          "of --list-classes, spaces as underscores), each class thresholded on its own, so "
                          "structures that overlap (a vessel inside the liver) are all kept")
    seg.add_argument("--timing", action="store_true", help="print the per-stage times of each image")
    seg.add_argument("--volume-index", type=int, default=None,
                     help="the volume to segment of each 4D image (3D images are read as they are)")
    seg.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    seg.add_argument("--part", default=None, metavar="I/N",
                     help="segment only part I of N (numbered from 0, as SLURM_ARRAY_TASK_ID: 0/4 .. 3/4): a split "
                          "of the inputs balanced by voxel count, the same in every process, so N processes (a job "
                          "array) can share the output folder; each writes summary.part-I-of-N.json ('summary "
                          "OUTPUT' merges them); under torchrun the ranks share the part")
    seg.add_argument("--no-streaming", dest="streaming", action="store_false",
                     help="class prompts through the full-logits inferer (with its out-of-memory fallback) instead of "
                          "the streamed label map")
    _add_common(seg)


def _add_benchmark(sub: Any, prog: str) -> None:
    """The ``benchmark`` command."""
    bench = sub.add_parser("benchmark", help="time the pipeline on a synthetic CT phantom (random weights)",
                           usage=f"{prog} benchmark [options]", prog=f"{prog} benchmark",
                           description="Write a CT-like phantom, segment it with random weights, print "
                           "per-stage times and latency vs sw_batch_size.")
    bench.add_argument("--size", default=None,
                       help="phantom shape X,Y,Z (default 256,256,176 on CUDA, 160,160,96 on CPU)")
    bench.add_argument("--spacing", default="1.0,1.0,1.5", help="phantom voxel size in mm (default 1,1,1.5)")
    bench.add_argument("--sw-batch-sizes", default=None, help="default 1,4,14 on CUDA, 1,2,4 on CPU; 'auto' is allowed")
    bench.add_argument("--repeats", type=int, default=1, help="timed runs per sw_batch_size (best is kept)")
    bench.add_argument("--json", default=None, help="also write the results to this JSON file")
    bench.add_argument("--weights", default=None, help="optional checkpoint (speed does not depend on it)")
    _add_common(bench)


def _add_summary(sub: Any, prog: str) -> None:
    """The ``summary`` command."""
    merged = sub.add_parser("summary", help="one table of the summaries of the parts written to an output folder",
                            usage=f"{prog} summary OUTPUT [--json FILE]",
                            description="Merge the summaries of the parts (--part I/N) and runs written to one output "
                            "folder: done, skipped, failed per part and in all, and the parts that are missing or "
                            "failed. Exit status 0 when every image has an output, else 1.")
    merged.add_argument("folder", help="the output folder of the parts")
    merged.add_argument("--json", default=None, help="also write the merged summary to this JSON file")


def _add_prepare(sub: Any, prog: str) -> None:
    """The ``prepare`` command."""
    prep = sub.add_parser(
        "prepare", help="compile the GPU kernels once, ahead of the first CT (run once after installing)",
        usage=f"{prog} prepare [--roi-size R] [--embed-dim D] [--sw-batch-size N] [--device cuda]",
        description="Compile the fused GPU kernels that 'segment' will run into Triton's kernel cache, so that the "
                    "first CT on this machine does not wait for them. Without a Hopper GPU there is nothing to "
                    "prepare and it says so. The weights do not matter: the network has random ones here.")
    prep.add_argument("--device", default=None, help="cuda (default when available)")
    prep.add_argument("--roi-size", default=None, help="window size, as given to segment (default 128)")
    prep.add_argument("--embed-dim", type=int, default=None, help="vista3d132 width, as given to segment (default 48)")
    prep.add_argument("--sw-batch-size", default="1",
                      help="windows per network call, as given to segment (default 1; 'auto': the one-window probe)")


def version() -> str:
    import monai

    return (f"vista3d {monai.__version__}: the VISTA3D fork of MONAI, API- and checkpoint-compatible with MONAI "
            f"{monai.__upstream_version__}")


class UsageError(Exception):
    """Bad command-line arguments (exit status 2)."""


def parse_ints(text: str, n: int | None = None, what: str = "value") -> tuple[int, ...]:
    """A flag's comma-separated positive integers (one value given for ``n`` is repeated)."""
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None
    if n is not None and len(vals) == 1:
        vals = vals * n
    if not vals or (n is not None and len(vals) != n) or min(vals) < 1:
        raise UsageError(f"{what} must be {n or 'one or more'} positive integers, got {text!r}")
    return vals


def parse_floats(text: str, n: int, what: str) -> tuple[float, ...]:
    """A flag's ``n`` comma-separated positive numbers (one value given is repeated)."""
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{what} must be comma-separated numbers, got {text!r}") from None
    vals = vals * n if len(vals) == 1 else vals
    if len(vals) != n or min(vals) <= 0:
        raise UsageError(f"{what} must be {n} positive numbers, got {text!r}")
    return vals


def parse_roi(text: str, what: str = "--roi-size") -> tuple[int, ...]:
    """A window size flag: one or three multiples of 16 (:func:`~monai.apps.vista3d.config.check_roi_size`)."""
    return check_roi_size(parse_ints(text, 3, what), ROI_MULTIPLE)


def embed_dim_or(value: int | None, default: int) -> int:
    """The ``--embed-dim`` given, else ``default``; checked (:func:`~monai.apps.vista3d.config.check_embed_dim`)."""
    return check_embed_dim(default if value is None else value)


def joined_points(argv: list[str]) -> list[str]:
    """``--points -3,4,5`` as ``--points=-3,4,5``: argparse takes a value starting with '-' for an option."""
    out: list[str] = []
    for a in argv:
        if out and out[-1] == "--points" and a.startswith("-") and a[1:2].isdigit():
            out[-1] = f"--points={a}"
        else:
            out.append(a)
    return out
