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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monai.apps.vista3d.config import (
    DEFAULT_EMBED_DIM,
    DEFAULT_OUTPUT_DTYPE,
    DEFAULT_OVERLAP,
    DEFAULT_ROI_SIZE,
    OUTPUT_DTYPES,
    OUTPUT_TYPES,
    ROI_MULTIPLE,
    check_embed_dim,
    check_roi_size,
)

if TYPE_CHECKING:
    from monai.apps.vista3d.core.job import SegmentJob

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
    "job_from_flags",
    "FIELD_FLAGS",
]

#: the commands; without one, ``segment`` is meant
COMMANDS = ("segment", "benchmark", "summary", "prepare", "serve", "statistics")


#: the flag of each setting's field (a SettingError names the field; every command names it by this flag)
FIELD_FLAGS = {
    "roi_size": "--roi-size",
    "overlap": "--overlap",
    "sw_batch_size": "--sw-batch-size",
    "output_dtype": "--output-dtype",
    "nonfinite": "--strict",
    "device": "--device",
    "encoder_embed_dim": "--embed-dim",
    "per_class": "--per-class",
    "unreached_label": "--unreached-label",
    "weights": "--weights",
    "series": "--series",
    "output_type": "--output-type",
    "preview": "--preview",
}

def program_name() -> str:
    """The name the user typed: ``vista3d`` for the console script, else the module form."""
    return "vista3d" if Path(sys.argv[0]).name == "vista3d" else "python -m monai.apps.vista3d"


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m monai.apps.vista3d``."""
    prog = program_name()
    usage = (f"{prog} [segment] -i IMAGE_OR_FOLDER [-i ...] -o OUTPUT [options]\n       {prog} --list-classes\n"
             f"       {prog} prepare [options]\n       {prog} benchmark [options]\n       {prog} summary OUTPUT\n"
             f"       {prog} serve --weights model.pt [--host 127.0.0.1] [--port 8000]\n"
             f"       {prog} statistics CT LABELS [-o stats.json]\n       {prog} --version")
    parser = argparse.ArgumentParser(
        prog=prog, usage=usage,
        description="VISTA3D CT segmentation: the bundle's inference pipeline, and a latency benchmark. "
                    "Without a command, 'segment' is meant.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{segment,prepare,benchmark,summary,serve,statistics}")

    _add_segment(sub, prog, usage)
    _add_benchmark(sub, prog)
    _add_summary(sub, prog)
    _add_prepare(sub, prog)
    _add_serve(sub, prog)
    _add_statistics(sub, prog)
    return parser


def _add_network(p: argparse.ArgumentParser, sw_batch_size: bool = True) -> None:
    """The flags of the network and how it runs, the same for every command that builds it (segment, benchmark,
    prepare, serve): one :class:`~monai.apps.vista3d.core.job.SegmentJob` checks them all, before anything loads."""
    p.add_argument("--weights", default=None, help="VISTA3D checkpoint (the bundle's models/model.pt); without it "
                                                   "the network has random weights and a warning says so")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--embed-dim", type=int, default=None,
                   help=f"vista3d132 encoder_embed_dim (default {DEFAULT_EMBED_DIM}, the bundle's; must match "
                        "--weights)")
    p.add_argument("--roi-size", default=None,
                   help=f"window size, e.g. 128 or 128,128,96 (default {DEFAULT_ROI_SIZE[0]}, the bundle's; 64 in the "
                        "CPU benchmark)")
    p.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP,
                   help=f"sliding-window overlap (default {DEFAULT_OVERLAP})")
    if sw_batch_size:
        p.add_argument("--sw-batch-size", default="1",
                       help="windows per network call (default 1), or 'auto': on CUDA as many as the free GPU memory "
                            "holds, measured on a first one-window call once per GPU model and settings and kept in "
                            "the kernel cache folder (vista3d-auto-batch.json), elsewhere 4; split evenly (the same "
                            "rule with and without --no-streaming; see monai.inferers.batch_size)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="float16 autocast on CUDA (default: on for CUDA, off for CPU)")
    p.add_argument("--no-fuse", dest="fuse", action="store_false",
                   help="run the network's module path instead of the fused channels-last kernels (which run by "
                        "default on Hopper GPUs with Triton; see VISTA3D.fuse)")


def _add_common(p: argparse.ArgumentParser) -> None:
    """The options ``segment`` and ``benchmark`` share beside the network's."""
    p.add_argument("--classes", default="everything",
                   help="'everything' (the bundle's 117 labels) or ids/names, e.g. 3,14,liver (names as --list-classes "
                        "prints them, underscores for spaces, or TotalSegmentator's: kidney_right)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (without --weights)")
    p.add_argument("--output-dtype", choices=OUTPUT_DTYPES, default=DEFAULT_OUTPUT_DTYPE,
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
    seg.add_argument("images", nargs="*", help=".nii / .nii.gz files, DICOM series, or folders (searched "
                                               "recursively)")
    seg.add_argument("-i", "--input", dest="inputs", action="append", default=[], metavar="IMAGE_OR_FOLDER",
                     help="a .nii / .nii.gz file, a DICOM series (a folder of its files, a .zip of one, a multi-frame "
                          "file), or a folder searched recursively for both (repeatable); an image found in a folder "
                          "keeps its subfolder under the output folder")
    seg.add_argument("--input-list", default=None, help="a text file with one image path per line, or a folder")
    seg.add_argument("-o", "--output", default=None,
                     help="output folder (writes OUTPUT/<name>/<name>_trans.nii.gz), or a .nii / .nii.gz file "
                          "for one input image")
    seg.add_argument("--output-dir", default=None, help="output folder (the same as -o FOLDER)")
    seg.add_argument("--list-classes", action="store_true",
                     help="print the label ids and names VISTA3D knows ('*': in --classes everything) and exit")
    seg.add_argument("--strict", action="store_true",
                     help="refuse images with NaN or Inf voxels (default: read them as air, -1000 HU, with a warning)")
    seg.add_argument("--points", default=None, help="point prompts, voxel indices of the input: 'x,y,z;x,y,z'")
    seg.add_argument("--point-labels", default=None, help="one label per point: 1 positive, 0 negative")
    seg.add_argument("--per-class", action="store_true",
                     help="also write one uint8 mask per requested class, OUTPUT/<name>/<class name>.nii.gz (names "
                          "of --list-classes, spaces as underscores), each class thresholded on its own, so "
                          "structures that overlap (a vessel inside the liver) are all kept")
    seg.add_argument("--unreached-label", type=int, default=0, metavar="{0,255}",
                     help="label of the voxels of a point prompt's label map that no window reached (default 0, "
                          "background; 255 writes what the VISTA3D bundle writes)")
    seg.add_argument("--timing", action="store_true", help="print the per-stage times of each image")
    seg.add_argument("--volume-index", type=int, default=None,
                     help="the volume to segment of each 4D image (3D images are read as they are)")
    seg.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    seg.add_argument("--part", default=None, metavar="I/N",
                     help="segment only part I of N (numbered from 0, as SLURM_ARRAY_TASK_ID: 0/4 .. 3/4): a split "
                          "of the inputs balanced by voxel count, the same in every process, so N processes (a job "
                          "array) can share the output folder; each writes summary.part-I-of-N.json ('summary "
                          "OUTPUT' merges them); under torchrun the ranks share the part")
    _add_dicom_and_extras(seg)
    seg.add_argument("--no-streaming", dest="streaming", action="store_false",
                     help="class prompts through the full-logits inferer (with its out-of-memory fallback) instead of "
                          "the streamed label map")
    _add_network(seg)
    _add_common(seg)


def _add_dicom_and_extras(seg: argparse.ArgumentParser) -> None:
    """``segment``'s flags of DICOM inputs and of what each image gets beside its label map."""
    seg.add_argument("--output-name", default=None, metavar="NAME",
                     help="name of the one input's outputs, OUTPUT/NAME/NAME_trans.nii.gz (default: the file's name, "
                          "or a DICOM series folder's)")
    seg.add_argument("--series", default=None, metavar="UID",
                     help="the SeriesInstanceUID to read where a DICOM input holds several series")
    seg.add_argument("--allow-modality", action="store_true",
                     help="segment a DICOM series whose modality is not CT (VISTA3D was trained on CT)")
    seg.add_argument("--output-type", choices=OUTPUT_TYPES, default="nifti",
                     help="nifti (default): the label map; dicom-seg: also a DICOM SEG referring to the source series "
                          "(OUTPUT/<name>/<name>_trans.dcm; DICOM inputs only)")
    seg.add_argument("--statistics", action="store_true",
                     help="also write statistics.json beside each label map: per structure its voxels, volume (mm3), "
                          "HU mean/median/std/min/max, centroid, bounding box, whether it touches the border")
    seg.add_argument("--exclude-border-structures", action="store_true",
                     help="in the statistics, give no values for structures within 3 voxels of the image border "
                          "(TotalSegmentator's rule: they are likely cut off)")
    seg.add_argument("--preview", action="store_true",
                     help="also write preview.png beside each label map: axial, coronal and sagittal slices through "
                          "the image centre (and each --classes structure's centroid) with the labels over them")


def _add_statistics(sub: Any, prog: str) -> None:
    """The ``statistics`` command."""
    st = sub.add_parser(
        "statistics", help="per-structure statistics of an existing label map over its CT (JSON)",
        usage=f"{prog} statistics CT LABELS [-o stats.json] [--label-names names.json] [options]",
        prog=f"{prog} statistics",
        description="Compute what 'segment --statistics' writes for any label map on the grid of its CT: per "
                    "structure its voxels, volume (mm3), HU mean/median/std/min/max, centroid (voxel and RAS mm), "
                    "bounding box and whether it touches the border. The CT may be NIfTI or DICOM.")
    st.add_argument("ct", help="the CT: .nii / .nii.gz, or a DICOM series folder, .zip or multi-frame file")
    st.add_argument("labels", help="the label map (.nii / .nii.gz) on the CT's grid")
    st.add_argument("-o", "--output", default=None, help="write the JSON here (default: print it)")
    st.add_argument("--label-names", default=None, metavar="FILE",
                    help="a JSON file naming the label ids, {\"1\": \"liver\", ...} or {\"liver\": 1, ...} (default: "
                         "VISTA3D's names)")
    st.add_argument("--exclude-border-structures", action="store_true",
                    help="no values for structures within 3 voxels of the image border (TotalSegmentator's rule)")
    st.add_argument("--device", default=None, help="where to compute: cuda or cpu (default: cuda when available)")
    st.add_argument("--series", default=None, metavar="UID", help="the series to read from a DICOM CT holding several")
    st.add_argument("--allow-modality", action="store_true", help="read a DICOM series whose modality is not CT")


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
    _add_network(bench, sw_batch_size=False)
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
        usage=f"{prog} prepare [--roi-size R] [--embed-dim D] [--sw-batch-size N] [--device cuda] [options]",
        description="Compile the fused GPU kernels that 'segment' will run into Triton's kernel cache, so that the "
                    "first CT on this machine does not wait for them. Without a Hopper GPU there is nothing to "
                    "prepare and it says so. The weights do not matter: the network has random ones here.")
    _add_network(prep)


def _add_serve(sub: Any, prog: str) -> None:
    """The ``serve`` command: the network's flags as ``segment`` has them, and the server's own."""
    p = sub.add_parser(
        "serve", help="an HTTP server with the VISTA-3D NIM's API and click sessions (needs the 'serve' extra)",
        description="Serve VISTA3D over HTTP: the NVIDIA VISTA-3D NIM's endpoints (/v1/health/live, /v1/health/ready, "
                    "/v1/vista3d/info, /v1/vista3d/inference) and click sessions (/v1/vista3d/sessions). Listens on "
                    "127.0.0.1 unless told otherwise.",
        usage=f"{prog} serve --weights model.pt [--host 127.0.0.1] [--port 8000] [options]",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000, the NIM's)")
    p.add_argument("--token", default=None,
                   help="bearer token every request but the health checks must send (or set VISTA3D_SERVE_TOKEN); "
                        "required for a --host other machines can reach, unless --insecure")
    p.add_argument("--insecure", action="store_true", help="serve a non-loopback --host without a token")
    p.add_argument("--data-dir", default=None,
                   help="folder whose files requests may name as 'image' (and as 'local_working_dir'); none: no "
                        "server-side paths")
    p.add_argument("--work-dir", default=None, help="folder for uploads, downloads and answers in flight "
                                                    "(default: a temporary folder)")
    p.add_argument("--allow-url-host", action="append", default=[], metavar="HOST",
                   help="a host image URLs may name (host, host:port or *.domain; repeat for more); none: no URLs")
    p.add_argument("--allow-private-urls", action="store_true",
                   help="let image URLs reach private, loopback and link-local addresses")
    p.add_argument("--max-body-mb", type=float, default=1024, help="largest request body, uploads included (1024)")
    p.add_argument("--max-download-mb", type=float, default=1024, help="largest image fetched from a URL (1024)")
    p.add_argument("--max-voxels", type=int, default=1 << 30, help="largest image in voxels, read from its header "
                                                                   "before it is inflated (2^30)")
    p.add_argument("--max-points", type=int, default=64, help="point prompts in one request, and on one click "
                                                               "session's object; more get 413 (64)")
    p.add_argument("--max-classes", type=int, default=132, help="entries of one request's class list (132)")
    p.add_argument("--queue-size", type=int, default=8,
                   help="requests that may wait behind the running one; more get 429 with Retry-After (8)")
    p.add_argument("--request-timeout", type=float, default=600,
                   help="seconds a request may take once its body has arrived (600)")
    p.add_argument("--body-timeout", type=float, default=5,
                   help="seconds a request's headers may take, and its body per MiB (at least this long): a body "
                        "arrives before its request takes a queue place; slower ones get 408 (5)")
    p.add_argument("--keep-alive", type=float, default=5, help="seconds an idle connection is kept open (5)")
    p.add_argument("--shutdown-timeout", type=float, default=10,
                   help="on SIGTERM: seconds the running job may take to finish before it is cancelled; waiting "
                        "requests are answered 503 at once (10)")
    p.add_argument("--max-connections", type=int, default=100,
                   help="connections open at once; more get 503 (100)")
    p.add_argument("--max-connections-per-client", type=int, default=None,
                   help="connections open at once from one address (a quarter of --max-connections)")
    p.add_argument("--session-ttl", type=float, default=1800, help="seconds a click session lives unused (1800)")
    p.add_argument("--max-sessions", type=int, default=8, help="click sessions held at once; the least recently "
                                                              "used is evicted for a new one (8)")
    p.add_argument("--max-queue-per-client", type=int, default=None,
                   help="queue places one client (address) may hold at once (half of --queue-size + 1)")
    p.add_argument("--max-sessions-per-client", type=int, default=None,
                   help="click sessions one client (address) may hold; its own least recently used is evicted for "
                        "a new one (half of --max-sessions)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    _add_network(p)


def job_from_flags(
    args: argparse.Namespace, prompt: Any = "everything", roi: Sequence[int] = DEFAULT_ROI_SIZE,
    embed_dim: int = DEFAULT_EMBED_DIM, device: Any = None, **options: Any,
) -> SegmentJob:
    """The network flags (every command that builds the network has them), with ``options`` (fields of
    :class:`~monai.apps.vista3d.config.PipelineOptions`) beside them, as one checked
    :class:`~monai.apps.vista3d.core.job.SegmentJob`: a bad value is a
    :class:`~monai.apps.vista3d.config.SettingError` that names its field, which the command line words as the flag, and
    nothing has been loaded yet. ``roi`` and ``embed_dim`` are the defaults where the flags are not given."""
    from monai.apps.vista3d.config import PipelineOptions
    from monai.apps.vista3d.core.job import SegmentJob

    sw = getattr(args, "sw_batch_size", None)
    if sw is not None and "sw_batch_size" not in options:
        options["sw_batch_size"] = sw if sw == "auto" else parse_ints(sw, what="--sw-batch-size")[0]
    opts = PipelineOptions(roi_size=parse_roi(args.roi_size) if args.roi_size else roi, overlap=args.overlap,
                           amp=args.amp, **options)
    job = SegmentJob(prompt, opts, device if device is not None else args.device, weights=args.weights,
                     network_kwargs={"encoder_embed_dim": embed_dim_or(args.embed_dim, embed_dim)}, fuse=args.fuse,
                     warn_random=False)
    return job


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
