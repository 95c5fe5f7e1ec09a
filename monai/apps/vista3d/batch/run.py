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
"""Segment many volumes, on one process or many under ``torchrun``: the one batch driver of the app.

``run_batch`` is the command line and the Python API alike; it returns a :class:`BatchResult`. It shards the
images over the ranks of ``torch.distributed`` (balanced by voxel count read from the NIfTI headers: largest
first onto the least-loaded rank, the same on every rank, so no communication is needed), uses the GPU
``LOCAL_RANK`` names, reads the first image while the network is built, loads the next image on a thread while
the current one is segmented (through the pipeline's one load policy), saves on another thread, skips images
whose output exists (restartable), isolates failures per image, and has rank 0 write a JSON summary gathered
from all ranks. Without ``torchrun`` (or with one process) it runs everything locally, with no process group.
Images that fail before saving leave no file.

``part=(i, N)`` takes one part of a split for a cluster (see :mod:`~.parts`); one part or all, each output is
claimed before its image is read, so processes that share the output folder never write one file twice.

Example::

    torchrun --nproc_per_node=2 -m monai.apps.vista3d segment --input-list files.txt --output-dir out
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from monai.apps.vista3d.config import BatchOptions, DicomOptions, ImageOutputs
from monai.apps.vista3d.core.feasibility import check_environment, check_image, failure_reason
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.io.input_kind import input_problem
from monai.apps.vista3d.io.nifti import read_header
from monai.apps.vista3d.io.paths import (
    check_output,
    check_output_folder,
    class_mask_paths,
    part_summary_name,
    summary_path_for,
)
from monai.utils.profiling import StageTimer

from .claims import OutputClaims, OutputTaken, missing_folders
from .distributed import (
    agree_on_setup,
    dist_context,
    gather_records,
    on_device,
    shard_by_size,
)
from .image_record import ImageRecord
from .inputs import collect_inputs, plan_outputs
from .parts import check_part, parse_part, part_keys, split_parts
from .provenance import Provenance, check_made_alike, output_settings
from .reports import check_extras, image_reports, report_files
from .segmenter import PipelineSegmenter, Segmenter, as_segmenter, labels_and_info
from .summary import (
    BatchResult,
    check_summary_path,
    counting_reporter,
    print_record,
    remove_empty,
    stopped_records,
    write_summary,
)
from .workers import AsyncSaver, Loader, load_for, timed_save

__all__ = [
    "run_batch",
    "ImageJob",
]


def run_batch(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike | None,
    segment_fn: SegmentJob | Segmenter | Callable | None = None,
    overwrite: bool = False,
    summary_path: str | os.PathLike | None = None,
    *,
    options: BatchOptions | None = None,
    **settings: Any,
) -> BatchResult:
    """Segment every image once over all ranks (one process is world size 1); returns what was done.

    The rules, the same on one process and under ``torchrun``: an image whose output exists is skipped
    (``overwrite=True`` redoes it); a failure (unreadable file, bad prompt for that image, out of memory, ...)
    is recorded for its image and the others go on; the next image is loaded while one is segmented and the
    previous one saved; rank 0 writes a JSON summary of every image. The command line is this function.

    Args:
        inputs: image paths and folders (searched recursively for ``.nii[.gz]``), or a text file listing images
            (one per line).
        output_dir: results go to ``output_dir/<name>/<name>_<postfix>.nii.gz`` (the bundle's naming); an image
            found in a folder keeps its subfolder (see :func:`plan_outputs`). Two images that would get the same
            output raise before any work starts.
        segment_fn: what segments each image: a :class:`~monai.apps.vista3d.core.job.SegmentJob` (what the command
            line gives; None: ``SegmentJob()``, every class with the defaults), whose pipeline is built on each
            rank while its first image loads; or a :class:`~monai.apps.vista3d.batch.segmenter.Segmenter` the
            caller built: ``pipeline_segment_fn(pipe, classes)`` for a pipeline, or a plain function
            ``fn(image [1, X, Y, Z] float32, geometry)`` returning a label map on the input grid, a
            :class:`~monai.apps.vista3d.core.results.SegmentationResult`, or ``(labels, {"windows": ...})`` (read as
            ``FunctionSegmenter(fn)``: uint8 outputs, NaN read as air; wrap it yourself for other settings).
            Where the images are read to and how they are read and written is the segmenter's, said once there.
        overwrite: redo images whose output exists.
        summary_path: JSON summary written by rank 0 (default ``output_dir/summary.json``, or beside the first
            of ``outputs``).
        options: the settings of the run (:class:`BatchOptions`).
        settings: any field of :class:`BatchOptions` as a keyword (``device="cpu"``, ``part=(0, 2)``, ...); it
            replaces that field of ``options``.

    Returns:
        the records of every image and the totals (:class:`BatchResult`; ``exit_code`` is the command line's).

    Raises:
        OutputCollisionError: two images would be written to the same output (nothing was started).
        Vista3DInputError: the pipeline could not be built (a bad checkpoint, say; nothing was started).
        TypeError: a keyword that is no field of :class:`BatchOptions`, or a ``segment_fn`` that cannot be called.
    """
    opts = dataclasses.replace(options or BatchOptions(), **settings)
    what = as_segmenter(segment_fn)  # it says where images are read to and how they are read and written
    paths, outs = _planned_outputs(inputs, output_dir, opts)
    check_extras(opts.extras, paths)
    if output_dir is not None:
        check_output_folder(output_dir)  # a file in its place, read-only, a full disk: refused before any work
    check_environment()
    headers = [read_header(p) for p in paths]  # each header read once: the checks, the shards and the volumes
    if isinstance(what, SegmentJob):  # what cannot fit is refused before the first image
        for path, header in zip(paths, headers):
            check_image(path, what.resolved_device, header, what.options)
        if not overwrite:  # an earlier output of other settings is not skipped as this run's
            check_made_alike(outs, what)
    part, summary = _part_and_summary(opts.part, summary_path, output_dir, outs)
    started = time.perf_counter()  # the run's wall clock
    began = time.time()  # the clock of file times: outputs written since are another process's
    claims = OutputClaims(began)
    device = what.resolved_device if isinstance(what, SegmentJob) else what.device  # where images are read to
    # the run's GPU is current while it runs (kernels launch on the current device) and the caller's after
    with on_device(device), dist_context(opts.backend) as (rank, world, _):
        made = Provenance(what) if rank == 0 else None  # the weights hashed while the run works
        result_of = functools.partial(BatchResult, world_size=world, host=socket.gethostname(), part=part,
                                      inputs=len(paths), started=began)
        sizes = [h.voxels if h is not None else 0 for h in headers]  # an unreadable one fails at its load
        # --volume-index picks a volume of the 4D images; the 3D images of the same batch are read as they are
        volumes = [opts.volume_index if h is not None and h.four_d else None for h in headers]
        pool, mine = _my_images(sizes, part_keys(outs, output_dir), part, rank, world)
        report = counting_reporter(opts.on_image or (None if opts.quiet else print_record), len(mine))
        records = {i: ImageRecord.new(i, paths[i], outs[i], rank, sizes[i]) for i in mine}
        todo = _triage(records, what.mask_ids, overwrite, claims, report, opts.extras)
        jobs = _Jobs([ImageJob(i, paths[i], outs[i], volumes[i]) for i in todo], records, claims)
        try:
            _segment_all(jobs, _Work(what, device, opts.prefetch, rank, world, opts.dicom, opts.extras), report)
        except BaseException:  # Ctrl-C, SIGTERM, a crash: what was finished is still recorded
            if rank == 0 and jobs.started:  # (a pipeline that could not be built started nothing)
                stopped = stopped_records(records, paths, outs, sizes, pool)
                wall = time.perf_counter() - started
                made_with = made.record() if made is not None else None
                write_summary(summary, result_of(stopped, wall_seconds=wall, interrupted=True, settings=made_with))
            raise
        every = gather_records([records[i].as_dict() for i in sorted(records)], world)
    result = result_of(every, wall_seconds=time.perf_counter() - started)
    if made is not None:
        result.settings = made.record()
        result.summary_path = write_summary(summary, result)
    return result


def _planned_outputs(
    inputs: str | os.PathLike | Sequence[str | os.PathLike], output_dir: str | os.PathLike | None, opts: BatchOptions
) -> tuple[list[Path], list[Path]]:
    """Every input image and its output file, checked before any work: one output per image, each unique."""
    if opts.outputs is not None:
        paths = collect_inputs(inputs)
        outs = [Path(o) for o in opts.outputs]
        if len(outs) != len(paths):
            raise Vista3DInputError(f"{len(outs)} outputs for {len(paths)} images; give one output per image.")
        return paths, outs
    if output_dir is None:
        raise Vista3DInputError("give output_dir, or one output file per image with outputs=")
    plan = plan_outputs(inputs, output_dir, opts.postfix)
    return [p for p, _ in plan], [o for _, o in plan]


def _part_and_summary(
    part: tuple[int, int] | str | None,
    summary_path: str | os.PathLike | None,
    output_dir: str | os.PathLike | None,
    outs: list[Path],
) -> tuple[tuple[int, int] | None, Path]:
    """The checked part (or None) and the summary file of the run (a part's own name unless one is given)."""
    summary = Path(summary_path) if summary_path is not None else summary_path_for(output_dir, outs)
    if part is not None:
        try:
            part = parse_part(part) if isinstance(part, str) else check_part(part)
        except ValueError as e:
            raise Vista3DInputError(str(e)) from None
        summary = summary if summary_path is not None else summary.with_name(part_summary_name(part))
    check_summary_path(summary)
    return part, summary


def _my_images(
    sizes: list[int], keys: list[str], part: tuple[int, int] | None, rank: int, world: int
) -> tuple[list[int], list[int]]:
    """The images of this part (every image without a part) and the share of them this rank segments."""
    pool = list(range(len(sizes)))
    if part is not None:
        pool = split_parts(keys, sizes, part[1])[part[0]]
    return pool, [pool[k] for k in shard_by_size([sizes[j] for j in pool], world)[rank]]


def _triage(
    records: dict[int, ImageRecord],
    mask_ids: list[int] | None,
    overwrite: bool,
    claims: OutputClaims,
    report: Callable[[ImageRecord], None] | None,
    extras: ImageOutputs,
) -> list[int]:
    """Mark the images that cannot be read (missing, not NIfTI) or whose output is refused ("failed"), or whose output
    exists ("skipped"), before the pipeline is built; returns those left to segment."""
    todo: list[int] = []
    for i, rec in records.items():
        image, out = Path(rec.image), Path(rec.output)
        files = [out, *(class_mask_paths(out.parent, mask_ids).values() if mask_ids else ())]
        extra = report_files(extras, out)
        if mask_ids:
            rec.masks = [str(f) for f in files[1:]]  # so that 'summary' checks them on disk too
        try:
            problem = input_problem(image)
            if problem is not None:
                raise Vista3DInputError(problem)
            for f in files:
                check_output(image, f, overwrite=True)
        except Vista3DInputError as e:
            rec.status, rec.error = "failed", failure_reason(e, image)
        else:
            if not overwrite and all(f.exists() for f in files + extra):
                rec.status = "skipped"
                claims.sweep(out)  # a lock file left by a writer killed after its save
            else:
                todo.append(i)
        if rec.status is not None and report is not None:
            report(rec)
    return todo


@dataclass(frozen=True)
class ImageJob:
    """One image this rank segments: its place in the run, its file (and volume of a 4D file) and its output."""

    index: int
    image: Path
    output: Path
    volume: int | None = None


@dataclass
class _Jobs:
    """This rank's images to segment, every image's record (by index), and the outputs this process claims."""

    todo: list[ImageJob]
    records: dict[int, ImageRecord]
    claims: OutputClaims
    started: bool = False


@dataclass
class _Work:
    """How this rank segments: with the pipeline of a :class:`SegmentJob` (built here) or a caller's
    :class:`Segmenter`."""

    what: SegmentJob | Segmenter
    device: torch.device
    prefetch: int
    rank: int
    world: int
    dicom: DicomOptions
    extras: ImageOutputs

    def loader(self, jobs: _Jobs) -> Loader:
        """Start reading this rank's images onto the segmenter's device, with the one load policy."""
        read = functools.partial(load_for, device=self.device, nonfinite=self.what.nonfinite, dicom=self.dicom)
        items = [(job.image, job.volume) for job in jobs.todo]
        load = jobs.claims.claiming(read, [job.output for job in jobs.todo])  # each output claimed before its read
        return Loader(load, items, self.prefetch, self.device)

    def ready_segmenter(self, todo: list[ImageJob]) -> Segmenter | None:
        """What segments each image; a job's pipeline is built here, while the loader reads the first image (none
        is built for a rank without images: None)."""
        job = self.what
        if not isinstance(job, SegmentJob):
            return job
        built, error = None, None
        if todo:
            try:
                built = PipelineSegmenter(job.build(), job.parsed_prompt)
            except Exception as e:
                error = e
        agree_on_setup(error, self.world)
        return built


class _Finisher:
    """Gives an image's record its final status once its file is written (on the saver's thread) or it failed (on
    the main one), releases its output's claim and reports it; one report at a time."""

    def __init__(self, jobs: _Jobs, report: Callable[[ImageRecord], None] | None):
        self.jobs, self.report = jobs, report
        self.lock = threading.Lock()

    def __call__(
        self, job: ImageJob, created: list[Path], fut: Future | None, error: BaseException | None = None
    ) -> None:
        rec = self.jobs.records[job.index]
        error = error or (fut.exception() if fut is not None else None)
        self.jobs.claims.release(job.output)  # the file is written, or the image failed
        with self.lock:
            if isinstance(error, OutputTaken):  # another process's, or written since the plan
                rec.status, rec.note = error.status, str(error)
            elif error is not None:
                remove_empty(created)
                rec.status, rec.error = "failed", failure_reason(error, job.image)
            else:
                assert fut is not None, "finished with neither the save's future nor an error"
                rec.saved(fut.result()[1])
            if self.report is not None:
                self.report(rec)


class _RecordedSave:
    """:func:`timed_save` with the job's settings record in each label map (:func:`output_settings`).

    The record is made at the first save, on the saver's thread: it holds the weights' SHA-256, which a thread
    computes while the first image is segmented (0.5 s of a fresh process for the published checkpoint on an H100
    host, spent before its first window while the record was made on the main thread).
    """

    def __init__(self, job: SegmentJob):
        self.job = job
        self.record: dict[str, Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.record is None:  # one saver thread: made once
            self.record = output_settings(self.job)
        return timed_save(*args, record=self.record, **kwargs)


def _segment_all(jobs: _Jobs, work: _Work, report: Callable[[ImageRecord], None] | None) -> None:
    """This rank's images: load ahead, segment, save behind; each record gets its status when its file is written."""
    records = jobs.records
    loads = work.loader(jobs)  # before the build: the first image and the weights load together
    try:
        fn = work.ready_segmenter(jobs.todo)
    except BaseException:
        loads.close()
        jobs.claims.release_all()  # the outputs the loader claimed meanwhile
        raise
    jobs.started = True
    finish = _Finisher(jobs, report)
    try:
        save = _RecordedSave(work.what) if isinstance(work.what, SegmentJob) else timed_save
        with AsyncSaver(max_pending=1, save_fn=save, dtype=work.what.output_dtype) as saver:
            for k, (job, (image, geom, t_load, err)) in enumerate(zip(jobs.todo, loads), start=1):
                rec = records[job.index]
                rec.load_seconds = round(t_load, 4)
                # on CUDA it synchronises at the end, so the time includes the GPU work; a CPU job touches no GPU
                timer = StageTimer(device=work.device)
                try:
                    if err is not None:
                        raise err
                    assert fn is not None, "a rank with images has its segmenter"
                    if isinstance(fn, PipelineSegmenter):
                        fn.show_image(k, len(jobs.todo), job.image, work.rank, work.world)
                    with timer.stage("segment"):
                        labels, info = labels_and_info(fn(image, geom))
                    if work.extras.any:  # while the image and its labels are still on the device
                        with timer.stage("reports"):
                            reports = image_reports(image, labels, geom, work.extras)
                        info["stages"] = {**info.get("stages", {}), "reports": timer.timings["reports"]}
                    else:
                        reports = None
                    rec.segmented(t_load, timer.timings["segment"], info)
                    created = missing_folders(job.output.parent)
                    fut = saver.submit(labels, geom, job.output, masks=info.get("masks"), reports=reports)
                except Exception as e:
                    rec.seconds = round(t_load + timer.timings.get("segment", 0.0), 4)
                    finish(job, [], None, e)
                    continue
                finally:
                    del image
                # reported on the saver's thread as soon as the file is written (at once if it already is)
                fut.add_done_callback(functools.partial(finish, job, created))
            saver.close(raise_errors=False)
    finally:
        loads.close()
        jobs.claims.release_all()
