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
"""Command line of the VISTA3D pipeline: ``vista3d`` (or ``python -m monai.apps.vista3d``).

``vista3d -i ct.nii.gz -o out/`` (the ``segment`` command, the default) writes ``out/<name>/<name>_trans.nii.gz``
(the bundle's naming) for each input image; images found in a given folder keep their subfolder under ``out/``.
``vista3d --list-classes`` prints the label ids and names; ``vista3d benchmark`` segments a synthetic CT
phantom with random weights and prints where the time goes; ``vista3d summary out/`` merges the summaries of the
parts (``--part I/N``) that wrote to ``out/`` into one table.
Exit status: 0 on success, 1 when an image failed, 2 for bad arguments, 130 on SIGINT, 143 on SIGTERM;
failures print one line.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import functools
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from monai.apps.vista3d.config import DEFAULT_EMBED_DIM, DEFAULT_ROI_SIZE, SettingError
from monai.apps.vista3d.errors import (
    ClassPromptError,
    OutputCollisionError,
    OutputPathError,
    PromptError,
    ResourceError,
    WorkerError,
    first_line,
)

from .benchmark import (
    BenchSetup,
    bench_segment,
    best_of,
    print_header,
    print_tables,
    stage_table,
    total_seconds,
    write_json,
)
from .parser import (
    COMMANDS,
    FIELD_FLAGS,
    UsageError,
    build_parser,
    embed_dim_or,
    job_from_flags,
    joined_points,
    parse_floats,
    parse_ints,
    parse_roi,
    version,
)

if TYPE_CHECKING:
    from monai.apps.vista3d.batch.summary import BatchResult

__all__ = ["main", "run"]

# The library's messages name its Python parameters; here they become this command's flags.
_FLAGS = (
    ("overwrite=True", "--overwrite"),
    ("encoder_embed_dim=", "--embed-dim "),
    ("encoder_embed_dim", "--embed-dim"),
    ("roi_size", "--roi-size"),
    ("nonfinite='error'", "--strict"),
    ("volume_index", "--volume-index"),
    ("point_labels=", "--point-labels "),
    ("points=", "--points "),
    ("weights=PATH", "--weights PATH"),
    ("no weights given", "no --weights given"),
    ("device='cpu'", "--device cpu"),
    ("sw_batch_size", "--sw-batch-size"),
)


def _flagged(text: str) -> str:
    for name, flag in _FLAGS:
        text = text.replace(name, flag)
    return text


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it unwinds like Ctrl-C (exit status 143)."""


def _collect_images(args: argparse.Namespace) -> list[Any]:
    """The images and folders named on the command line, the lines of ``--input-list`` expanded."""
    from monai.apps.vista3d.batch.inputs import read_input_list

    items: list[Any] = [Path(p) for p in (*args.images, *args.inputs)]  # a missing one fails as its image
    if args.input_list:
        src = Path(args.input_list)
        if src.is_dir():
            items.append(src)
        elif src.is_file():
            items += read_input_list(src)
        else:
            raise UsageError(f"--input-list {args.input_list!r} is neither a file nor a folder")
    if not items:
        raise UsageError("no input images: give -i IMAGE_OR_FOLDER (or IMAGE paths, or --input-list)")
    return items


def _list_classes() -> int:
    from monai.apps.vista3d.labels import everything_labels, label_names

    everything = set(everything_labels())
    print("id   name  (* = in --classes everything)")
    for label_id, name in sorted(label_names().items()):
        if label_id:
            print(f"{label_id:>3}{'*' if label_id in everything else ' '} {name}")
    print(f"{len(everything)} classes in 'everything'; --classes takes ids or names, e.g. --classes 3,liver "
          "(underscores for spaces, right_kidney, and TotalSegmentator's names, kidney_right, are names too)")
    return 0


def _seed_and_warn(args: argparse.Namespace, warn: bool = True) -> None:
    """The process's seed (random weights are drawn from it) and the random-weights warning, printed once."""
    from monai.apps.vista3d.core.network_ready import RANDOM_WEIGHTS_WARNING

    torch.manual_seed(getattr(args, "seed", 0))
    if warn and args.weights is None:
        print(_flagged(RANDOM_WEIGHTS_WARNING), file=sys.stderr)


def _segment(args: argparse.Namespace) -> int:
    _import_nibabel_without_pydicom()
    from monai.apps.vista3d.batch.run import run_batch
    from monai.apps.vista3d.config import TorchrunEnv
    from monai.apps.vista3d.core.feasibility import check_environment
    from monai.apps.vista3d.core.network_ready import fused_for_images
    from monai.apps.vista3d.core.prompts import parse_prompt

    if args.list_classes:
        return _list_classes()
    items = _collect_images(args)
    images, outputs, output_dir, part = _segment_outputs(args, items)
    if args.per_class and output_dir is None:
        raise UsageError("--per-class writes a folder of masks per image: give an output folder, -o FOLDER")
    dicom, extras = _dicom_and_extras(args)
    check_environment()
    job = job_from_flags(args, parse_prompt(args.classes, args.points, args.point_labels),
                         progress=not args.quiet and sys.stderr.isatty(), output_dtype=args.output_dtype,
                         streaming=args.streaming, nonfinite="error" if args.strict else "air",
                         per_class=args.per_class, unreached_label=args.unreached_label)
    fuse = fused_for_images(len(images), job.resolved_device, job.fuse)  # graphs pay off over many images
    if fuse is not job.fuse:
        job = dataclasses.replace(job, fuse=fuse)
    _seed_and_warn(args)
    if job.resolved_device.type == "cuda":
        _usable_kernel_cache()
    env = TorchrunEnv.read()
    start = time.perf_counter()
    result = run_batch(
        images, output_dir, job, overwrite=args.overwrite, outputs=outputs, dicom=dicom, extras=extras,
        volume_index=args.volume_index, on_image=_image_reporter(args, f"[rank {env.rank}] " if env.world_size > 1
                                                                   else ""), part=part,
    )
    _say_totals(result, args.quiet, time.perf_counter() - start, env.rank)
    return result.exit_code


def _dicom_and_extras(args: argparse.Namespace) -> tuple[Any, Any]:
    """How DICOM inputs are read and what each image gets beside its label map, from their flags."""
    from monai.apps.vista3d.config import DicomOptions, ImageOutputs
    from monai.apps.vista3d.labels import parse_classes

    classes = () if args.classes == "everything" or not args.preview else tuple(parse_classes(args.classes))
    return (DicomOptions(args.series, args.allow_modality),
            ImageOutputs(args.statistics, args.preview, args.output_type, args.exclude_border_structures, classes))


def _segment_outputs(
    args: argparse.Namespace, items: list[Any]
) -> tuple[list[Path], list[Path], str | None, tuple[int, int] | None]:
    """``(images, their outputs, output folder, part)`` from the inputs, ``-o`` / ``--output-dir`` and ``--part``:
    the folders walked once, here, and everything checked before any work (an output name the disk refuses, two
    images with one output, a folder without images). The output folder is None for ``-o FILE.nii.gz``."""
    from monai.apps.vista3d.batch.inputs import plan_outputs
    from monai.apps.vista3d.io.dicom_files import is_series_folder
    from monai.apps.vista3d.io.input_kind import folder_problem
    from monai.apps.vista3d.io.paths import check_output

    output, output_dir = args.output, args.output_dir
    if output is not None and not str(output).lower().endswith((".nii", ".nii.gz")):
        if output_dir is not None:
            raise UsageError("give one output folder: -o FOLDER or --output-dir FOLDER")
        output, output_dir = None, output
    if output is None and output_dir is None:
        raise UsageError("give the output folder: -o FOLDER (or -o FILE.nii.gz for one image)")
    part = _part(args.part, output_dir)
    if output is not None:
        if output_dir is not None:
            raise UsageError("give -o FILE.nii.gz or --output-dir FOLDER, not both")
        if len(items) != 1 or (Path(items[0]).is_dir() and not is_series_folder(items[0])):
            raise UsageError("-o FILE.nii.gz names one output: give a folder (-o FOLDER) for several images")
        check_output(items[0], output, overwrite=True)  # a name the disk refuses is refused now, not after the work
        return [Path(items[0])], [Path(output)], None, part
    plan = plan_outputs(items, output_dir)  # every output unique, before any work
    if not plan:  # only folders were given, and they hold no image: say what they hold
        raise UsageError("; ".join(folder_problem(item) for item in items))
    if args.output_name is not None:
        return _named_output(args.output_name, plan, output_dir, part)
    return [p for p, _ in plan], [o for _, o in plan], output_dir, part


def _named_output(
    name: str, plan: list[tuple[Path, Path]], output_dir: str, part: tuple[int, int] | None
) -> tuple[list[Path], list[Path], str | None, tuple[int, int] | None]:
    """The one input's outputs under ``--output-name``: ``OUTPUT/NAME/NAME_<postfix>.nii.gz``."""
    from monai.apps.vista3d.io.paths import output_path

    if len(plan) != 1:
        raise UsageError(f"--output-name names one image's outputs; the inputs hold {len(plan)} images")
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise UsageError(f"--output-name must be a plain file name (no folders, not hidden), got {name!r}")
    return [plan[0][0]], [output_path(name, output_dir)], output_dir, part


def _image_reporter(args: argparse.Namespace, rank_tag: str) -> Callable[[dict[str, Any]], None]:
    """What ``segment`` prints as each image is done, skipped, busy or failed (failures even with ``--quiet``)."""

    def report(rec: dict[str, Any]) -> None:
        k, n = rec["progress"]
        head = f"{rank_tag}[{k}/{n}] {rec['image']}"
        if rec["status"] == "failed":
            print(f"error: {rec['image']}: {_flagged(rec['error'])}", file=sys.stderr, flush=True)
        elif args.quiet:
            return
        elif rec["status"] == "skipped":
            print(f"{head} skipped: {rec['output']} exists (--overwrite redoes it)", flush=True)
        elif rec["status"] == "busy":
            print(f"{head} busy: {rec['output']} is {rec['note']}", flush=True)
        else:
            print(f"{head} {rec['seconds']:.1f} s -> {rec['output']}", flush=True)
            if args.timing:
                print(stage_table(rec.get("stages", {})), flush=True)

    return report


def _say_totals(result: BatchResult, quiet: bool, seconds: float, rank: int) -> None:
    """The run's last lines: rank 0 speaks for every rank, another rank only of its own failures."""
    if result.summary_path is not None:
        if result.failed:
            print(f"error: {result.failed} of {len(result.records)} image(s) failed", file=sys.stderr)
        if not quiet:
            busy = f", {result.count('busy')} left to other processes" if result.count("busy") else ""
            print(f"{len(result.records)} image(s): {result.done} done, {result.skipped} skipped, {result.failed} "
                  f"failed{busy} in {seconds:.1f} s; summary in {result.summary_path}")
        return
    mine = sum(r["status"] == "failed" and r["rank"] == rank for r in result.records)
    if mine:
        print(f"error: {mine} image(s) failed on this rank", file=sys.stderr)


def _part(text: str | None, output_dir: str | None) -> tuple[int, int] | None:
    from monai.apps.vista3d.batch.parts import parse_part

    if text is None:
        return None
    if output_dir is None:
        raise UsageError("--part needs an output folder (-o FOLDER), which the parts share")
    try:
        return parse_part(text)
    except ValueError as e:
        raise UsageError(f"--{e}") from None  # "--part 4/4 does not exist: ..."


def _import_nibabel_without_pydicom() -> None:
    """Import nibabel as where pydicom is not installed.

    Where it is, nibabel imports it whole at its own import (0.17 s of a fresh process on an H100 host, 0.2 s on the
    CPU), only to parse DICOM headers stored inside NIfTI extensions, which this program never reads: it copies the
    extensions it keeps as bytes, which nibabel does without pydicom. pydicom stays importable for the DICOM
    reader; no other thread of this program runs yet at this point of a run.
    """
    if "nibabel" in sys.modules or "pydicom" in sys.modules:
        return
    sys.modules["pydicom"] = None  # type: ignore[assignment]  # import's own "not installed" mark
    try:
        import nibabel  # noqa: F401
    finally:
        del sys.modules["pydicom"]


def _usable_kernel_cache() -> None:
    """Point Triton at a temporary folder when its cache cannot be written (a read-only home, a container):
    kernels are then compiled again in every run, which costs time, not the run."""
    from monai.utils.triton_support import can_write, kernel_cache_dir

    folder = kernel_cache_dir()
    if can_write(folder):
        return
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="vista3d-kernels-")
    print(f"warning: the kernel cache {folder} cannot be written; compiling into {os.environ['TRITON_CACHE_DIR']} "
          "for this run only (set TRITON_CACHE_DIR to a writable folder to keep the kernels)", file=sys.stderr)


def _prepare(args: argparse.Namespace) -> int:
    from monai.apps.vista3d.labels import everything_labels
    from monai.networks.nets import VISTA3D
    from monai.utils.triton_support import kernel_cache_dir

    sw = 1 if args.sw_batch_size == "auto" else None  # "auto" runs its one-window probe
    cuda = torch.cuda.is_available()  # without one the flags are still checked, for the CPU
    options: dict[str, Any] = {} if sw is None else {"sw_batch_size": sw}
    job = job_from_flags(args, device=None if cuda else "cpu", **options)
    device = job.resolved_device
    reason: str | None
    if device.type != "cuda":
        reason = "no CUDA GPU here" if not cuda else "the CPU was asked for"
    else:
        reason = VISTA3D.fused_unavailable_reason(device)
    if reason is None and not args.fuse:
        reason = "--no-fuse was given"
    if reason is not None:
        print(f"vista3d prepare: nothing to prepare ({reason}); the fused kernels run on a Hopper GPU with Triton")
        return 0
    _usable_kernel_cache()
    start = time.perf_counter()
    pipe = job.build()
    roi, batches = pipe.roi_size, sorted({1, int(pipe.sw_batch_size)})
    for batch in batches:  # one forward at each window batch compiles what that batch runs
        pipe.warm_up(batch, everything_labels())
    print(f"vista3d prepare: compiled the fused kernels for {roi[0]}x{roi[1]}x{roi[2]} windows at window batches "
          f"{', '.join(map(str, batches))} into {kernel_cache_dir()} in {time.perf_counter() - start:.1f} s")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from monai.apps.vista3d.server.serve import serve

    from .serve import settings_from_args

    try:
        settings = settings_from_args(args)  # a bad network flag is refused here, as segment refuses it
    except SettingError:
        raise  # named as segment names it
    except ValueError as e:  # the server's own flags name themselves
        raise UsageError(str(e)) from None
    _seed_and_warn(args, warn=False)  # the server logs the warning itself, in the same words, as it starts
    return serve(settings, args.log_level)


def _summary(args: argparse.Namespace) -> int:
    from monai.apps.vista3d.batch.summary_merge import format_summary, merge_summaries

    folder = Path(args.folder)
    if not folder.is_dir():
        raise UsageError(f"{args.folder!r} is not a folder; give the output folder of the parts")
    merged = merge_summaries(folder)
    if not merged["parts"]:
        print(f"error: no summary in {folder}: no part or run has finished there yet", file=sys.stderr)
        return 1
    print(format_summary(merged))
    if args.json:
        Path(args.json).write_text(json.dumps(merged, indent=1))
    totals = merged["totals"]
    if not totals["complete"]:
        print(f"error: {totals['inputs'] - totals['done'] - totals['skipped']} of {totals['inputs']} image(s) have no "
              "output; rerun the parts named above", file=sys.stderr)
        return 1
    return 0


def _bench_setup(args: argparse.Namespace) -> BenchSetup:
    """The benchmark's settings from its flags, with the defaults of the device (smaller on the CPU)."""
    from monai.apps.vista3d.config import resolve_amp, resolve_device
    from monai.apps.vista3d.io.image_geometry import as_xyz
    from monai.apps.vista3d.labels import parse_classes

    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    size = as_xyz(parse_ints(args.size, 3, "--size")) if args.size else ((256, 256, 176) if cuda else (160, 160, 96))
    spacing = as_xyz(parse_floats(args.spacing, 3, "--spacing"))
    sws: tuple[Any, ...] = (1, 4, 14) if cuda else (1, 2, 4)
    if args.sw_batch_sizes:
        sws = tuple("auto" if t.strip() == "auto" else parse_ints(t, what="--sw-batch-sizes")[0]
                    for t in args.sw_batch_sizes.split(",") if t.strip())
    roi = parse_roi(args.roi_size) if args.roi_size else (DEFAULT_ROI_SIZE if cuda else (64,) * 3)
    embed_dim = embed_dim_or(args.embed_dim, DEFAULT_EMBED_DIM if cuda else 8)
    if args.repeats < 1:
        raise UsageError("--repeats must be >= 1")
    amp = resolve_amp(args.amp, device) and cuda  # (autocast runs on CUDA only: the report says off elsewhere)
    return BenchSetup(device, size, spacing, sws, roi, embed_dim, amp, len(parse_classes(args.classes)))


def _benchmark(args: argparse.Namespace) -> int:
    from monai.apps.vista3d.core.prompts import parse_prompt

    from .phantom import write_phantom

    setup = _bench_setup(args)
    if setup.cuda:
        _usable_kernel_cache()
    print_header(setup, args.overlap)
    # the full-logits path, whose inferer reports the latency study's sliding-window stages; the streamed
    # path (segment's default) is timed once after the sweep
    job = job_from_flags(args, roi=setup.roi, embed_dim=setup.embed_dim, device=setup.device,
                         sw_batch_size=setup.sws[0], progress=not args.quiet and sys.stderr.isatty(),
                         output_dtype=args.output_dtype, streaming=False)
    _seed_and_warn(args)
    base = job.build()
    prompt = parse_prompt(args.classes)
    assert prompt.label_ids is not None, "a prompt of classes alone has its label ids"
    with tempfile.TemporaryDirectory(prefix="vista3d_bench_") as tmp:
        src = write_phantom(Path(tmp) / "phantom.nii.gz", shape=setup.size, spacing=setup.spacing, seed=args.seed)
        segment = functools.partial(bench_segment, src=src, out_dir=Path(tmp) / "out", prompt=prompt, setup=setup)
        if setup.cuda:  # warm-up of the whole pipeline: lazy CUDA init, allocator, cuDNN autotuning
            segment(base)
        runs = []
        for sw in setup.sws:
            pipe = base.replace(sw_batch_size=sw)
            pipe.warm_up(1 if sw == "auto" else sw, prompt.label_ids)
            runs.append(best_of(segment, pipe, args.repeats, sw))
            if not args.quiet:
                print(f"  sw_batch_size {sw}: {runs[-1]['timings']['total']:.2f} s", file=sys.stderr)
        result, peak = segment(base.replace(streaming=True, sw_batch_size=runs[-1]["used"]))
        streamed = {"sw_batch_size": result.sw_batch_size, "timings": dict(result.timings),
                    "total": total_seconds(result.timings), "peak_gpu_gib": peak}
        shape_pre = tuple(result.record.final_shape)
    print_tables(runs, streamed, shape_pre, setup.cuda)
    if args.json:
        write_json(args, setup, shape_pre, runs, streamed)
    return 0


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {_flagged(str(message))}", file=sys.stderr, flush=True)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 an image failed, 2 bad arguments, 130/143 stopped)."""
    argv = joined_points(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    if argv == ["--version"]:
        print(version())
        return 0
    if argv in (["-h"], ["--help"]):
        argv = ["segment", "--help"]  # the default command's options are the program's
    if argv and argv[0] not in COMMANDS:
        argv.insert(0, "segment")  # segment is the default command
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    main_thread = threading.current_thread() is threading.main_thread()
    old_handler = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    old_showwarning = warnings.showwarning
    warnings.showwarning = _one_line_warning
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "segment":
            return _segment(args)
        if args.command == "summary":
            return _summary(args)
        if args.command == "prepare":
            return _prepare(args)
        if args.command == "statistics":
            from .statistics import run_statistics

            return run_statistics(args)
        return _benchmark(args)
    except SettingError as e:  # the library names the field; here it is the flag
        print(f"error: {FIELD_FLAGS.get(e.field, e.field)} {_flagged(e.problem)}", file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OutputCollisionError, OutputPathError, PromptError, ClassPromptError, ResourceError) as e:  # refused early
        print(f"error: {_flagged(first_line(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the output went to a program that stopped reading (| head): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush is quiet too
        return 0
    except WorkerError as e:  # a background thread failed: said once, the run stopped cleanly
        print(f"error: {e}", file=sys.stderr)
        return 1
    except torch.cuda.OutOfMemoryError:
        print("error: out of GPU memory; try a smaller --sw-batch-size (or --device cpu)", file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:
        print(f"error: {_flagged(first_line(e))}", file=sys.stderr)
        return 1
    except _Terminated:
        print("error: terminated (SIGTERM); finished outputs are kept, unfinished images left nothing",
              file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("error: interrupted; finished outputs are kept, unfinished images left nothing", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = old_showwarning
        if main_thread:
            signal.signal(signal.SIGTERM, old_handler)


def run() -> NoReturn:
    """The ``vista3d`` program: :func:`main`, then the process ends without Python's teardown.

    When ``main`` returns, every output is complete (renamed into place and flushed to disk); freeing each module,
    tensor and CUDA allocation one by one would only delay the exit (0.3-0.5 s on the CPU, 0.7 s after a run on an
    H100). So the streams are flushed, the exit handlers run (logging's flush, temporary folders) and the process
    ends with ``main``'s status. Where a thread that is not a daemon still runs, Python's own exit waits for it as
    usual; an exception from ``main`` also leaves the usual way.

    Before ``main``, the objects already made (torch's and this module's imports, ~165,000) are frozen out of the
    cyclic garbage collector (:func:`gc.freeze`): they live until the exit anyway, and each full collection would
    otherwise walk them all again (one in a run to its first window, 0.06-0.07 s on a CPU core of this VM).
    """
    gc.freeze()
    code = main()
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # its reader gone or the stream closed: nothing more can be said there
            pass
    atexit._run_exitfuncs()
    os._exit(code)
