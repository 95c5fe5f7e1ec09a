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
"""Segment many volumes, on one process or many under ``torchrun``.

``run_batch`` shards the images over the ranks of ``torch.distributed`` (balanced by voxel count read from
the NIfTI headers: largest first onto the least-loaded rank, the same on every rank, so no communication is
needed), uses the GPU ``LOCAL_RANK`` names, loads the next image on a thread while the current one is
segmented, saves on another thread, skips images whose output exists (restartable), isolates failures per
image, and has rank 0 write a JSON summary gathered from all ranks. Without ``torchrun`` (or with one
process) it runs everything locally, with no process group.

Example::

    torchrun --nproc_per_node=2 -m monai.apps.vista3d segment --input-list files.txt --output-dir out
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
import torch.distributed as dist

from .errors import Vista3DInputError
from .io import DEFAULT_OUTPUT_DTYPE, ImageGeometry, load_image, output_path, save_label_map

__all__ = ["run_batch", "AsyncSaver", "collect_inputs", "shard_by_size", "output_path", "dist_context"]

SegmentFn = Callable[[torch.Tensor, ImageGeometry], Any]


class AsyncSaver:
    """Save label maps on one background thread, so that writing one overlaps loading or inferring the next.

    Saves run in submission order. At most ``max_pending`` label maps wait in memory: ``submit`` blocks
    until one finishes (so a slow disk throttles the producer instead of filling memory). Each save is
    atomic (see :func:`save_label_map`). Errors are kept on each save's ``Future`` and raised by
    :meth:`close` (or at the end of a ``with`` block); pending saves also finish at interpreter exit.

    Example::

        with AsyncSaver() as saver:
            for path in paths:
                image, geom = load_image(path)
                saver.submit(segment(image), geom, out_dir / path.name)

    Args:
        max_pending: label maps queued or being written at once (>= 1).
        save_kwargs: defaults for :func:`save_label_map` (``dtype``, ``compresslevel``, ``threads``).
    """

    def __init__(self, max_pending: int = 1, **save_kwargs: Any) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._defaults = save_kwargs
        self._slots = threading.BoundedSemaphore(max_pending)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vista3d-save")
        self._futures: list[Future] = []
        self._closed = False
        atexit.register(self._at_exit)

    def submit(self, labels: Any, geometry: ImageGeometry, path: str | os.PathLike, **kwargs: Any) -> Future:
        """Queue ``save_label_map(labels, geometry, path, **kwargs)``; returns its Future (result: the path).

        ``labels`` must not be modified afterwards; a CUDA tensor is copied to the CPU here (on the caller's
        stream, so the copy sees the finished result).
        """
        if self._closed:
            raise RuntimeError("AsyncSaver is closed")
        if isinstance(labels, torch.Tensor) and labels.device.type != "cpu":
            labels = labels.detach().to("cpu")
        self._slots.acquire()
        try:
            fut = self._pool.submit(save_label_map, labels, geometry, path, **{**self._defaults, **kwargs})
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _: self._slots.release())
        # keep pending and failed saves only, so a long run does not accumulate finished Futures
        self._futures = [f for f in self._futures if not f.done() or f.exception() is not None] + [fut]
        return fut

    def wait(self) -> list[BaseException]:
        """Block until every submitted save has finished; return the errors (oldest first), raising none."""
        errors = []
        for f in list(self._futures):
            e = f.exception()
            if e is not None:
                errors.append(e)
        return errors

    def close(self, raise_errors: bool = True) -> None:
        """Finish all saves and stop the thread; raise the first save error (others are chained in the note)."""
        if not self._closed:
            self._closed = True
            errors = self.wait()
            self._pool.shutdown(wait=True)
            atexit.unregister(self._at_exit)
            self._futures = []
            if errors and raise_errors:
                first = errors[0]
                if len(errors) > 1 and hasattr(first, "add_note"):
                    first.add_note(f"{len(errors) - 1} more save(s) failed: " + "; ".join(map(str, errors[1:])))
                raise first

    def __enter__(self) -> AsyncSaver:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On an exception in the body, still finish the saves but do not hide that exception.
        self.close(raise_errors=exc_type is None)

    def _at_exit(self) -> None:
        if self._closed:
            return
        errors = self.wait()
        self._closed = True
        for e in errors:
            print(f"vista3d: a background save failed: {e}", file=sys.stderr)


def collect_inputs(inputs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Image paths from a list of paths, a text file (one path per line, ``#`` comments), or a folder."""
    if isinstance(inputs, (str, os.PathLike)):
        src = Path(inputs)
        if src.is_dir():
            return sorted(p for p in src.iterdir() if p.name.lower().endswith((".nii", ".nii.gz")))
        if src.is_file() and not src.name.lower().endswith((".nii", ".nii.gz")):
            base = src.parent
            lines = [ln.strip() for ln in src.read_text().splitlines()]
            return [Path(ln) if Path(ln).is_absolute() else base / ln for ln in lines if ln and not ln.startswith("#")]
        return [src]
    return [Path(p) for p in inputs]


def _voxels(path: Path) -> int:
    """Voxel count from the header only (0 when unreadable: the image then fails where it is processed)."""
    try:
        return int(np.prod(nib.load(path).header.get_data_shape()[:3]))
    except Exception:
        return 0


def shard_by_size(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Greedy balance: indices by decreasing size (ties by index) onto the least-loaded rank (ties by rank).

    Returns, per rank, its indices in increasing order. Deterministic, so every rank computes the same plan.
    """
    loads = [0] * world_size
    counts = [0] * world_size
    plan: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world_size), key=lambda r: (loads[r], counts[r], r))
        plan[r].append(i)
        loads[r] += max(int(sizes[i]), 1)
        counts[r] += 1
    return [sorted(p) for p in plan]


class dist_context:
    """``(rank, world_size, local_rank)``; starts a process group from torchrun's variables if none exists.

    The group is destroyed on exit only if this context started it. The backend is NCCL when CUDA is
    available, else gloo (``backend`` overrides).
    """

    def __init__(self, backend: str | None = None):
        self.backend, self.owned = backend, False

    def __enter__(self) -> tuple[int, int, int]:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if dist.is_available() and not dist.is_initialized() and world > 1:
            backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend=backend)
            self.owned = True
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = 0, 1
        return rank, world, int(os.environ.get("LOCAL_RANK", str(rank if world > 1 else 0)))

    def __exit__(self, *exc: Any) -> None:
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()


def _prefetch(paths: list[Path], volume_index: int | None, depth: int):
    """Yield ``(path, image, geometry, seconds, error)`` in order, loading ahead on a thread."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def work() -> None:
        for p in paths:
            if stop.is_set():
                return
            t = time.perf_counter()
            try:
                image, geom = load_image(p, volume_index=volume_index)
                item = (p, image, geom, time.perf_counter() - t, None)
            except Exception as e:  # reported per image
                item = (p, None, None, time.perf_counter() - t, e)
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue

    th = threading.Thread(target=work, name="vista3d-prefetch", daemon=True)
    th.start()
    try:
        for _ in paths:
            yield q.get()
    finally:
        stop.set()
        th.join()


def _reason(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}" if not isinstance(e, Vista3DInputError) else msg


def _default_segment_fn(device: torch.device, pipeline_kwargs: dict | None) -> SegmentFn:
    from .pipeline import Vista3DPipeline  # the full pipeline only when no segment_fn is given

    kwargs = dict(pipeline_kwargs or {})
    classes = kwargs.pop("classes", "everything")
    points, point_labels = kwargs.pop("points", None), kwargs.pop("point_labels", None)
    return pipeline_segment_fn(Vista3DPipeline(device=device, **kwargs), classes, points, point_labels)


def pipeline_segment_fn(pipe: Any, classes: Any = "everything", points: Any = None, point_labels: Any = None) -> SegmentFn:
    """A ``segment_fn`` for :func:`run_batch` that runs an existing ``Vista3DPipeline`` with these prompts."""

    def segment(image: torch.Tensor, geometry: ImageGeometry) -> Any:
        labels = pipe(image, geometry.affine, classes=classes, points=points, point_labels=point_labels)
        return labels, {"windows": int(pipe.n_windows), "timings": dict(pipe.timings)}

    return segment


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def resolve_device(device: str | torch.device | None, local_rank: int) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` for ``None`` (when CUDA is available) and for a bare ``"cuda"``.

    ``torch.cuda.set_device`` needs an index, and under ``torchrun`` a bare ``"cuda"`` should still mean one GPU
    per rank rather than every rank on GPU 0.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return torch.device("cuda", local_rank) if dev.type == "cuda" and dev.index is None else dev


def run_batch(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    segment_fn: SegmentFn | None = None,
    overwrite: bool = False,
    summary_path: str | os.PathLike | None = None,
    *,
    volume_index: int | None = None,
    output_dtype: str = DEFAULT_OUTPUT_DTYPE,
    postfix: str = "trans",
    prefetch: int = 1,
    device: str | torch.device | None = None,
    backend: str | None = None,
    pipeline_kwargs: dict | None = None,
    quiet: bool = True,
) -> int:
    """Segment every image once over all ranks; returns the exit code (0: none failed, 1: some failed).

    Args:
        inputs: image paths, a text file listing them (one per line), or a folder of ``.nii[.gz]``.
        output_dir: results go to ``output_dir/<name>/<name>_<postfix>.nii.gz`` (the bundle's naming).
        segment_fn: ``segment_fn(image [1, X, Y, Z] float32, geometry) -> labels [X, Y, Z]`` on the input grid,
            or ``(labels, info)`` with ``info["windows"]``. ``None``: the VISTA3D pipeline on this rank's
            device, built with ``pipeline_kwargs`` (``classes``, ``points``, ``point_labels`` go to the call).
        overwrite: redo images whose output exists (by default they are skipped, so a run can be restarted).
        summary_path: JSON summary written by rank 0 (default ``output_dir/summary.json``).
        volume_index: for 4D inputs.
        output_dtype: label map dtype on disk (``pipeline_kwargs["output_dtype"]`` wins when given).
        postfix: output name postfix.
        prefetch: images loaded ahead of the one being segmented.
        device: default ``cuda:LOCAL_RANK`` when CUDA is available, else cpu.
        backend: process-group backend when one has to be started (default nccl with CUDA, else gloo).
        quiet: no per-image line on stdout.
    """
    paths = collect_inputs(inputs)
    output_dtype = (pipeline_kwargs or {}).get("output_dtype", output_dtype)
    out_dir = Path(output_dir)
    summary = Path(summary_path) if summary_path is not None else out_dir / "summary.json"
    t_start = time.perf_counter()
    with dist_context(backend) as (rank, world, local_rank):
        dev = resolve_device(device, local_rank)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        sizes = [_voxels(p) for p in paths]
        mine = shard_by_size(sizes, world)[rank]
        records: dict[int, dict] = {}
        todo: list[int] = []
        for i in mine:
            rec = {"index": i, "image": str(paths[i]), "output": str(output_path(paths[i], out_dir, postfix)),
                   "rank": rank, "voxels": sizes[i], "status": None, "error": None, "seconds": 0.0, "windows": None}
            records[i] = rec
            if not overwrite and Path(rec["output"]).exists():
                rec["status"] = "skipped"
            else:
                todo.append(i)
        fn = segment_fn
        pending: list[tuple[int, Any, float]] = []
        setup_error = None
        if fn is None and todo:
            try:
                fn = _default_segment_fn(dev, pipeline_kwargs)
            except Exception as e:  # e.g. a bad checkpoint: every image of this rank fails with the reason
                setup_error = e
        with AsyncSaver(max_pending=1, dtype=output_dtype) as saver:
            for i, (p, image, geom, t_load, err) in zip(todo, _prefetch([paths[i] for i in todo], volume_index, prefetch)):
                rec = records[i]
                rec["load_seconds"] = round(t_load, 4)
                t0 = time.perf_counter()
                try:
                    if setup_error is not None:
                        raise setup_error
                    if err is not None:
                        raise err
                    result = fn(image, geom)
                    if isinstance(result, tuple):
                        result, info = result
                        rec["windows"] = (info or {}).get("windows")
                        if (info or {}).get("timings"):
                            rec["stages"] = {k: round(float(v), 4) for k, v in info["timings"].items()}
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    rec["segment_seconds"] = round(time.perf_counter() - t0, 4)
                    pending.append((i, saver.submit(result, geom, rec["output"]), time.perf_counter()))
                except Exception as e:
                    rec["status"], rec["error"] = "failed", _reason(e)
                rec["seconds"] = round(t_load + time.perf_counter() - t0, 4)
                del image
            saver.close(raise_errors=False)
        for i, fut, t_sub in pending:
            rec = records[i]
            e = fut.exception()
            if e is not None:
                rec["status"], rec["error"] = "failed", _reason(e)
            else:
                rec["status"] = "done"
        for rec in records.values():
            if not quiet:
                extra = f": {rec['error']}" if rec["error"] else ""
                print(f"[rank {rank}] {rec['status']} {rec['image']}{extra}", flush=True)
        local = [records[i] for i in sorted(records)]
        if world > 1:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, local)
            every = sorted((r for part in gathered for r in part), key=lambda r: r["index"])
        else:
            every = local
        wall = time.perf_counter() - t_start
        failed = sum(r["status"] == "failed" for r in every)
        if rank == 0:
            done = sum(r["status"] == "done" for r in every)
            _write_json(
                summary,
                {
                    "images": len(every),
                    "done": done,
                    "skipped": sum(r["status"] == "skipped" for r in every),
                    "failed": failed,
                    "world_size": world,
                    "host": socket.gethostname(),
                    "wall_seconds": round(wall, 3),
                    "volumes_per_minute": round(60.0 * done / wall, 3) if wall > 0 else None,
                    "per_image": every,
                },
            )
    return 1 if failed else 0
