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

``part=(i, N)`` takes one part of a split for a cluster (see :mod:`.parts`); one part or all, each output is
claimed before its image is read, so processes that share the output folder never write one file twice.

Example::

    torchrun --nproc_per_node=2 -m monai.apps.vista3d segment --input-list files.txt --output-dir out
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
import torch.distributed as dist

from monai.utils.profiling import StageTimer

from .errors import OutputCollisionError, OutputPathError, Vista3DInputError, Vista3DOutputError
from .feasibility import check_environment, check_images, friendly_memory_error
from .io import (
    DEFAULT_OUTPUT_DTYPE,
    ImageGeometry,
    check_name_lengths,
    check_output,
    class_mask_paths,
    is_vista3d_output,
    output_path,
    save_class_masks,
    save_label_map,
)
from .parts import (
    missing_folders,
    OutputClaims,
    OutputTaken,
    check_part,
    claim_summary,
    keep_earlier_done,
    parse_part,
    part_keys,
    part_summary_name,
    split_parts,
)
from .pipeline import SegmentationResult, Vista3DPipeline, load_input, resolve_device
from .progress import text_bar
from .prompts import Prompt, parse_prompt
from .workers import WorkerError, get_from

__all__ = [
    "run_batch",
    "BatchOptions",
    "BatchResult",
    "PipelineSegmenter",
    "pipeline_segment_fn",
    "AsyncSaver",
    "collect_inputs",
    "plan_outputs",
    "read_input_list",
    "shard_by_size",
    "output_path",
    "resolve_device",
    "dist_context",
    "rank_device",
    "TorchrunEnv",
    "check_summary_path",
    "summary_path_for",
]

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
        save_fn: called instead of :func:`save_label_map` with the same arguments (e.g. to time each save).
        save_kwargs: defaults for :func:`save_label_map` (``dtype``, ``compresslevel``, ``threads``).
    """

    def __init__(self, max_pending: int = 1, save_fn: Callable[..., Any] | None = None, **save_kwargs: Any) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._save_fn = save_fn
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
            save = self._save_fn or save_label_map
            fut = self._pool.submit(save, labels, geometry, path, **{**self._defaults, **kwargs})
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


_NIFTI_SUFFIXES = (".nii", ".nii.gz")


def _is_nifti(path: Path) -> bool:
    return path.name.lower().endswith(_NIFTI_SUFFIXES)


def _find_nifti(folder: Path, skip: Callable[[Path], bool] | None = None) -> list[Path]:
    """The ``.nii`` / ``.nii.gz`` files under ``folder``, recursively, sorted; hidden entries are ignored.

    A broken symbolic link is listed too (it fails as its image, saying so). ``skip(path)`` leaves files and
    folders out (the outputs of an earlier run).
    """
    found = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).parts
        if any(part.startswith(".") for part in rel) or (skip is not None and skip(p)):
            continue
        if _is_nifti(p) and (p.is_file() or (p.is_symlink() and not p.exists())):
            found.append(p)
    return sorted(found)


def _own_outputs(output_dir: str | os.PathLike | None, postfix: str) -> Callable[[Path], bool]:
    """What a folder search must leave out so that a run never reads the outputs of an earlier one.

    Every label map and mask this program wrote, in any folder, by the mark in its header
    (:func:`~.io.is_vista3d_output`); and under ``output_dir`` what it names as an output,
    ``<name>/<name>_<postfix>.nii.gz`` (the outputs of versions that did not mark them yet). An image named
    explicitly is never left out.
    """
    root = None if output_dir is None else Path(os.path.abspath(output_dir))

    def skip(p: Path) -> bool:
        full = Path(os.path.abspath(p))
        if not _is_nifti(full):
            return False
        if root is not None and full.is_relative_to(root) and full.name == f"{full.parent.name}_{postfix}.nii.gz":
            return True
        return is_vista3d_output(full)

    return skip


def _collect(
    inputs: str | os.PathLike | Sequence[str | os.PathLike], skip: Callable[[Path], bool] | None = None
) -> list[tuple[Path, Path]]:
    """``(image, subfolder)`` pairs: an image found in a given folder keeps its path relative to that folder."""
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    found: list[tuple[Path, Path]] = []
    for item in items:
        src = Path(item)
        if src.is_dir():
            found += [(p, p.parent.relative_to(src)) for p in _find_nifti(src, skip)]
        elif src.is_file() and not _is_nifti(src) and isinstance(inputs, (str, os.PathLike)):
            found += [(p, Path()) for p in read_input_list(src)]
        else:
            found.append((src, Path()))
    return found


def read_input_list(path: str | os.PathLike) -> list[Path]:
    """The paths of a text file, one per line (``#`` starts a comment line); relative ones are taken from the
    file's folder."""
    src = Path(path)
    try:
        lines = [ln.strip() for ln in src.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise Vista3DInputError(f"{src}: cannot read it as a list of image paths ({e}); give a text file.") from None
    return [Path(ln) if Path(ln).is_absolute() else src.parent / ln for ln in lines if ln and not ln.startswith("#")]


def collect_inputs(inputs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Image paths from a list of paths and folders, a text file (one path per line, ``#`` comments), or a folder.

    A folder is searched recursively for ``.nii`` and ``.nii.gz`` files (hidden files and folders, and the label
    maps and masks this program wrote, are skipped).
    """
    return [p for p, _ in _collect(inputs, _own_outputs(None, ""))]


def plan_outputs(
    inputs: str | os.PathLike | Sequence[str | os.PathLike], output_dir: str | os.PathLike, postfix: str = "trans"
) -> list[tuple[Path, Path]]:
    """``(image, output)`` for every input, each output unique; checked before any work starts.

    An image given directly goes to ``output_dir/<name>/<name>_<postfix>.nii.gz`` (the bundle's naming); an
    image found in a given folder keeps its subfolder under ``output_dir`` (``cts/p1/ct.nii.gz`` ->
    ``output_dir/p1/ct/ct_<postfix>.nii.gz``), so patient folders that all hold ``ct.nii.gz`` stay apart. The
    same file given twice is segmented once. A folder search leaves out the outputs of an earlier run under
    ``output_dir`` (an output folder inside, or equal to, the input folder is never read back as input).

    Raises:
        OutputCollisionError: two different images would be written to the same output.
    """
    plan: list[tuple[Path, Path]] = []
    seen: dict[Path, Path] = {}
    for path, sub in _collect(inputs, _own_outputs(output_dir, postfix)):
        out = output_path(path, Path(output_dir) / sub, postfix)
        key = Path(os.path.abspath(out))
        if key in seen:
            if _same_input(seen[key], path):
                continue
            raise OutputCollisionError(
                f"{seen[key]} and {path} would both be written to {out}; nothing was started. Give their common "
                "folder as the input instead (its subfolders are kept under the output folder), or rename one."
            )
        seen[key] = path
        plan.append((path, out))
    return plan


def _same_input(a: Path, b: Path) -> bool:
    try:
        return os.path.abspath(a) == os.path.abspath(b) or os.path.samefile(a, b)
    except OSError:
        return False


def _header_info(path: Path) -> tuple[int, bool]:
    """``(voxels of one volume, whether it is 4D)`` from the header only (``(0, False)`` when unreadable: the
    image then fails where it is processed)."""
    try:
        dims = list(nib.load(path).header.get_data_shape())
    except Exception:
        return 0, False
    while len(dims) > 3 and dims[-1] == 1:
        dims.pop()
    return int(np.prod(dims[:3])), len(dims) == 4


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


@dataclass(frozen=True)
class TorchrunEnv:
    """What ``torchrun`` tells this process (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``); one process without it.

    Attributes:
        world_size: processes of the run.
        rank: this process among them.
        local_rank: this process on its machine (its GPU), or None where ``LOCAL_RANK`` is not set.
    """

    world_size: int = 1
    rank: int = 0
    local_rank: int | None = None
    local_world_size: int | None = None

    @classmethod
    def read(cls) -> TorchrunEnv:
        """The variables of this process's environment: the one place they are read."""
        local, local_world = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
        return cls(int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")),
                   None if local is None else int(local), None if local_world is None else int(local_world))

    @property
    def gpu(self) -> int:
        """This process's GPU index on its machine (0 without ``torchrun``)."""
        return self.local_rank or 0


def rank_device(device: str | torch.device | None, env: TorchrunEnv) -> torch.device:
    """This process's device (see :func:`~.pipeline.resolve_device`; a bare ``"cuda"`` is ``LOCAL_RANK``'s GPU),
    decided once where a job enters. CUDA is not touched for ``"cpu"``.

    Raises:
        Vista3DInputError: the GPU asked for does not exist on this machine (one line, before any work).
    """
    dev = resolve_device(device, env.gpu)
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            if env.local_rank is not None and (device is None or torch.device(device).index is None):
                ranks = env.local_world_size or env.local_rank + 1
                raise Vista3DInputError(
                    f"torchrun started {ranks} ranks on this node but it has {count} GPUs; start at most {count} "
                    f"(--nproc_per_node={count}) or run on the CPU (--device cpu)."
                )
            raise Vista3DInputError(f"device {str(dev)!r} does not exist: this machine has {count} GPUs.")
    return dev


class dist_context:
    """``(rank, world_size, local_rank)``; starts a process group from torchrun's variables if none exists.

    The group is destroyed on exit only if this context started it. The backend is gloo (``backend`` overrides):
    the batch driver only gathers small records, and gloo needs no GPU bound to the process.
    """

    def __init__(self, backend: str | None = None):
        self.backend, self.owned = backend, False

    def __enter__(self) -> tuple[int, int, int]:
        env = TorchrunEnv.read()
        if dist.is_available() and not dist.is_initialized() and env.world_size > 1:
            dist.init_process_group(backend=self.backend or "gloo")
            self.owned = True
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = 0, 1
        local = env.local_rank if env.local_rank is not None else (rank if world > 1 else 0)
        return rank, world, local

    def __exit__(self, *exc: Any) -> None:
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()


_LOADER_JOIN_SECONDS = 5.0


class _Loader:
    """Loads images ahead of the one being segmented, in order, on one thread.

    It starts at once, so the first image is read while the network is built and its weights load. On a GPU the
    loads run on a stream of their own (an image's slabs cross while the previous image is segmented); each image
    is complete on the GPU when it is handed over.

    Args:
        load: ``load(path, volume_index) -> (image, geometry)``.
        items: ``(path, volume_index)`` in the order they are wanted.
        depth: images loaded ahead.
        device: the device ``load`` puts the images on.
    """

    def __init__(self, load: Callable, items: list[tuple[Path, int | None]], depth: int, device: torch.device):
        self._load, self._items, self._device = load, items, device
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="vista3d-prefetch", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            self._load_all()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            self._hand_on((None, None, 0.0, WorkerError(f"loading the images failed: {_reason(e)}")))

    def _hand_on(self, item: tuple) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _load_all(self) -> None:
        with _current(self._device):  # this thread's current device: the one its loads go to
            self._load_each()

    def _load_each(self) -> None:
        side = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        for path, volume_index in self._items:
            if self._stop.is_set():
                return
            timer = StageTimer(sync=False, nvtx=False)  # a host-side stage on another thread
            try:
                with timer.stage("load"), torch.cuda.stream(side) if side is not None else nullcontext():
                    image, geom = self._load(path, volume_index)
                    if side is not None:
                        side.synchronize()
                item = (image, geom, timer.timings["load"], None)
            except Exception as e:  # reported per image
                item = (None, None, timer.timings["load"], e)
            self._hand_on(item)

    def __iter__(self) -> Iterator[tuple[Any, Any, float, BaseException | None]]:
        for _ in self._items:
            image, geom, seconds, error = get_from(self._queue, self._thread, "load")
            if isinstance(error, WorkerError):
                raise error  # the loader itself failed: no image after this one can come
            if isinstance(image, torch.Tensor) and image.is_cuda:
                # made on the loader's stream, used and freed on this one: keep the allocator from reusing it early
                image.record_stream(torch.cuda.current_stream(image.device))
            yield image, geom, seconds, error

    def close(self) -> None:
        """Stop loading and wait for the thread, a few seconds at most: a load that hangs (a stuck read) must not
        turn one Ctrl-C into two; the thread is a daemon and stops at its next image."""
        self._stop.set()
        self._thread.join(timeout=_LOADER_JOIN_SECONDS)


def _os_message(e: OSError) -> str:
    """What went wrong, in the system's words but without the errno number (``[Errno 28] ...``)."""
    what = e.strerror or type(e).__name__
    return f"{what[:1].lower()}{what[1:]}" + (f" ({e.filename})" if e.filename else "")


def _reason(e: BaseException, path: Path | None = None) -> str:
    """One line for a failed image, without the image's path (the record names it)."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if friendly_memory_error(e) is not None:
        return friendly_memory_error(e)
    if isinstance(e, OSError) and not isinstance(e, Vista3DInputError):
        return _os_message(e)
    if isinstance(e, MemoryError):
        return f"not enough memory ({msg or 'allocation failed'}); free memory or segment it on a larger machine"
    if not isinstance(e, Vista3DInputError):
        return f"{type(e).__name__}: {msg}"
    if path is not None and msg.startswith(f"{path}: "):
        msg = msg[len(f"{path}: "):]
    return msg


class PipelineSegmenter:
    """A ``segment_fn`` for :func:`run_batch` that runs a ``Vista3DPipeline`` with one prompt.

    ``run_batch`` reads each image with the pipeline's :meth:`~.pipeline.Vista3DPipeline.load` (its device and
    load policy), and shows the images' progress in the pipeline's window bar.

    Args:
        pipeline: the pipeline to run.
        prompt: the parsed prompt of every image.
    """

    def __init__(self, pipeline: Vista3DPipeline, prompt: Prompt):
        self.pipeline, self.prompt = pipeline, prompt

    def load(self, path: Path, volume_index: int | None, nonfinite: str) -> tuple[torch.Tensor, ImageGeometry]:
        """The pipeline's own load (see :func:`~.pipeline.load_input`)."""
        return self.pipeline.load(path, volume_index, nonfinite)

    def __call__(self, image: torch.Tensor, geometry: ImageGeometry) -> SegmentationResult:
        return self.pipeline.segment(image, geometry.affine, self.prompt)


def pipeline_segment_fn(
    pipe: Vista3DPipeline, classes: Any = "everything", points: Any = None, point_labels: Any = None
) -> PipelineSegmenter:
    """A ``segment_fn`` for :func:`run_batch` that runs an existing ``Vista3DPipeline``; the prompt is parsed here."""
    prompt = classes if isinstance(classes, Prompt) else parse_prompt(classes, points, point_labels)
    return PipelineSegmenter(pipe, prompt)


_PROMPT_KEYS = ("classes", "points", "point_labels")


def _prompt_of(pipeline_kwargs: dict | None) -> Prompt:
    """The prompt given among ``pipeline_kwargs`` (every class when none is)."""
    kwargs = pipeline_kwargs or {}
    classes = kwargs.get("classes", "everything")
    return classes if isinstance(classes, Prompt) else parse_prompt(classes, kwargs.get("points"),
                                                                    kwargs.get("point_labels"))


def _as_segmenter(segment_fn: Any, pipeline_kwargs: dict | None) -> Any:
    """What segments each image, checked before any work: a ``Vista3DPipeline`` runs with the prompt of
    ``pipeline_kwargs`` (its own settings stay); anything that cannot be called is refused."""
    if segment_fn is None or isinstance(segment_fn, PipelineSegmenter):
        return segment_fn
    if isinstance(segment_fn, Vista3DPipeline):
        other = sorted(set(pipeline_kwargs or {}) - set(_PROMPT_KEYS))
        if other:
            raise Vista3DInputError(
                f"pipeline_kwargs {other} configure the pipeline run_batch builds, but segment_fn is a pipeline "
                "already; set them on it (pipe.replace(...)) and give only the prompt in pipeline_kwargs."
            )
        return PipelineSegmenter(segment_fn, _prompt_of(pipeline_kwargs))
    if not callable(segment_fn):
        raise TypeError(
            f"segment_fn must be callable as segment_fn(image, geometry) or be a Vista3DPipeline, got "
            f"{type(segment_fn).__name__}"
        )
    return segment_fn


def _one_setting(name: str, given: Any, own: Any, default: Any) -> Any:
    """``given`` (a field of :class:`BatchOptions`) or the pipeline's ``own`` value: a pipeline's settings are never
    silently replaced, so two different values are refused."""
    if given is None:
        return default if own is None else own
    if own is not None and own != given:
        raise Vista3DInputError(f"{name}={given!r} disagrees with the pipeline's {name}={own!r}; give it once.")
    return given


def _build_segmenter(device: torch.device, pipeline_kwargs: dict | None) -> PipelineSegmenter:
    """The VISTA3D pipeline of ``pipeline_kwargs`` on ``device`` (the prompt is parsed before the slow build)."""
    prompt = _prompt_of(pipeline_kwargs)
    kwargs = {k: v for k, v in (pipeline_kwargs or {}).items() if k not in _PROMPT_KEYS}
    kwargs.pop("device", None)  # resolved by run_batch (under torchrun: this rank's GPU)
    return PipelineSegmenter(Vista3DPipeline(device=device, **kwargs), prompt)


def _batch_device(device: str | torch.device | None, pipeline_kwargs: dict | None) -> str | torch.device | None:
    """The one device asked for, by ``device=`` or by ``pipeline_kwargs["device"]``."""
    other = (pipeline_kwargs or {}).get("device")
    if device is None or other is None:
        return device if device is not None else other
    if torch.device(device) != torch.device(other):
        raise Vista3DInputError(
            f"device={str(device)!r} and pipeline_kwargs['device']={str(other)!r} disagree; give the device once."
        )
    return device


def _agree_on_setup(error: BaseException | None, world: int) -> None:
    """Raise on every rank when the pipeline could not be built on one (so no rank waits for the others)."""
    if world > 1:
        errors: list[Any] = [None] * world
        dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {_reason(error)}")
        first = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
        if error is None and first is not None:
            raise Vista3DInputError(f"rank {first[0]} could not build the pipeline ({first[1]}); nothing was started.")
    if error is not None:
        raise error


def _labels_and_info(result: Any) -> tuple[Any, dict[str, Any]]:
    """What a ``segment_fn`` returned, as ``(labels, {"windows", "sw_batch_size", "stages"})``."""
    if isinstance(result, SegmentationResult):
        return result.labels, {"windows": result.windows, "sw_batch_size": result.sw_batch_size,
                               "stages": result.timings, "masks": result.masks}
    if isinstance(result, tuple):
        labels, info = result
        info = dict(info or {})
        return labels, {"windows": info.get("windows"), "stages": info.get("timings") or {}}
    return result, {}


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a failed save created, deepest first, as long as they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _timed_save(labels: Any, geometry: ImageGeometry, path: Path, masks: Any = None, **kwargs: Any) -> tuple[Path, float]:
    """Save one image's results on the saver's thread: its class masks first (when asked for), the label map last,
    so that an image whose label map exists has every file."""
    timer = StageTimer(sync=False, nvtx=False)  # runs on the saver's thread
    with timer.stage("save"):
        written = {} if masks is None else save_class_masks(masks, geometry, Path(path).parent)
        try:
            path = save_label_map(labels, geometry, path, **kwargs)
        except BaseException:  # an image's set is written completely or not at all
            for p in written.values():
                Path(p).unlink(missing_ok=True)
            raise
    return Path(path), timer.timings["save"]


#: the key that marks a JSON summary as this program's (another file of that name is never replaced)
SUMMARY_MARK = ("written_by", "monai.apps.vista3d")


def check_summary_path(path: str | os.PathLike) -> None:
    """Refuse, before any work, a summary path that holds a file this program did not write.

    Raises:
        OutputPathError: the file exists and is not a summary written by ``run_batch``.
    """
    p = Path(path)
    check_name_lengths(p)
    if not os.path.lexists(p):
        return
    try:
        ours = json.loads(p.read_text()).get(SUMMARY_MARK[0]) == SUMMARY_MARK[1]
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise OutputPathError(
            f"{p}: exists and is not a summary written by vista3d, so it is not replaced; move it, or choose "
            "another output folder."
        )


def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` atomically (a temporary file renamed); on failure nothing is left and one line says why."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(json.dumps(obj, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise Vista3DOutputError(
            f"{path}: the summary could not be written ({_os_message(e)}); the label maps written are kept."
        ) from None


def _counted(report: Callable[[dict[str, Any]], None] | None, n: int) -> Callable[[dict[str, Any]], None] | None:
    """``report`` called with a copy of each record that carries ``progress``: ``(k, n)``."""
    if report is None:
        return None
    count = [0]

    def counted(rec: dict[str, Any]) -> None:
        count[0] += 1
        report(dict(rec, progress=(count[0], n)))

    return counted


def _print_record(rec: dict[str, Any]) -> None:
    extra = f": {rec['error']}" if rec["error"] else ""
    print(f"[rank {rec['rank']}] {rec['status']} {rec['image']}{extra}", flush=True)


@dataclass
class BatchResult:
    """What :func:`run_batch` did, over every rank.

    Attributes:
        records: one dict per image, in input order: ``image``, ``output``, ``status`` ("done", "skipped",
            "failed", or "busy": claimed by another process, which writes it), ``error`` (one line, or None),
            ``seconds``, ``windows``, ``rank``, ``voxels``, per-stage ``stages`` of the images that ran.
        world_size: processes that shared the work.
        host: the machine of rank 0.
        wall_seconds: the run's wall clock on this rank, from the plan to the last save.
        summary_path: the JSON summary rank 0 wrote (None on the other ranks).
        interrupted: the run was stopped (Ctrl-C, SIGTERM, an error); images it did not finish are
            "interrupted", and under ``torchrun`` the other ranks' images are "unknown".
        part: ``(i, N)`` of a run of one part, else None.
        inputs: images of the whole batch (of every part).
        started: ``time.time()`` when the run began.
    """

    records: list[dict[str, Any]]
    world_size: int = 1
    host: str = ""
    wall_seconds: float = 0.0
    summary_path: Path | None = None
    interrupted: bool = False
    part: tuple[int, int] | None = None
    inputs: int = 0
    started: float = 0.0

    def count(self, status: str) -> int:
        """Images whose status is ``status``."""
        return sum(r["status"] == status for r in self.records)

    @property
    def done(self) -> int:
        return self.count("done")

    @property
    def skipped(self) -> int:
        return self.count("skipped")

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def volumes_per_minute(self) -> float | None:
        return round(60.0 * self.done / self.wall_seconds, 3) if self.wall_seconds > 0 else None

    @property
    def exit_code(self) -> int:
        """The command line's status: 0 when no image failed, else 1."""
        return 1 if self.failed else 0

    def summary(self) -> dict[str, Any]:
        """The JSON summary (what ``summary.json`` holds)."""
        return {
            SUMMARY_MARK[0]: SUMMARY_MARK[1],
            "interrupted": self.interrupted,
            "images": len(self.records),
            "done": self.done,
            "skipped": self.skipped,
            "failed": self.failed,
            "world_size": self.world_size,
            "host": self.host,
            "wall_seconds": round(self.wall_seconds, 3),
            "volumes_per_minute": self.volumes_per_minute,
            "busy": self.count("busy"),
            "part": list(self.part) if self.part else None,
            "inputs": self.inputs,
            "started": round(self.started, 3),
            "finished": round(self.started + self.wall_seconds, 3),
            "per_image": self.records,
        }


@dataclass(frozen=True)
class BatchOptions:
    """How :func:`run_batch` reads, segments and writes; every field is also a keyword of :func:`run_batch`.

    Attributes:
        outputs: one output file per input instead of the ``output_dir`` naming.
        volume_index: the volume of each 4D input; 3D inputs are read as they are.
        output_dtype: label map dtype on disk; None: ``pipeline_kwargs["output_dtype"]``, a given pipeline's,
            else uint8.
        postfix: output name postfix.
        prefetch: images loaded ahead of the one being segmented.
        device: see :func:`~.pipeline.resolve_device` (under ``torchrun`` a bare ``"cuda"`` is this rank's GPU);
            ``pipeline_kwargs["device"]`` may give it instead.
        backend: process-group backend when one has to be started (default nccl with CUDA, else gloo).
        pipeline_kwargs: arguments of :class:`~.pipeline.Vista3DPipeline` and the prompt, for ``segment_fn=None``.
        on_image: called on this process's main thread with each image's record once its file is written (or
            it was skipped or failed), plus ``progress``: ``(k, n)``, the k-th of this rank's n.
        quiet: without ``on_image``, no per-image line on stdout.
        nonfinite: ``"air"`` reads NaN/Inf voxels as -1000 HU with a warning that counts them; ``"error"``
            fails such images. None: the pipeline's (given, or ``pipeline_kwargs["nonfinite"]``), else ``"air"``.
            A value that disagrees with the pipeline's is refused (as ``output_dtype`` and ``device``).
        part: ``(i, N)`` or ``"i/N"``: only part ``i`` (from 0) of a split of the images into ``N`` parts balanced
            by voxel count, the same in every process (see :mod:`.parts`); its ranks shard it. The summary is
            then ``summary.part-<i>-of-<N>.json``. Whatever ``part``, each output is claimed before its image is
            read: an output another live process claimed is ``"busy"`` (left to it), so processes sharing the
            output folder never write one file twice.
    """

    outputs: Sequence[str | os.PathLike] | None = None
    volume_index: int | None = None
    output_dtype: str | None = None
    postfix: str = "trans"
    prefetch: int = 1
    device: str | torch.device | None = None
    backend: str | None = None
    pipeline_kwargs: dict | None = None
    on_image: Callable[[dict[str, Any]], None] | None = None
    quiet: bool = True
    nonfinite: str | None = None
    part: tuple[int, int] | str | None = None


def run_batch(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike | None,
    segment_fn: SegmentFn | None = None,
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
        segment_fn: ``segment_fn(image [1, X, Y, Z] float32, geometry)`` returning a
            :class:`~.pipeline.SegmentationResult`, the ``[X, Y, Z]`` labels on the input grid, or
            ``(labels, {"windows": ...})``; one with a ``load(path, volume_index, nonfinite)`` method (a
            :class:`PipelineSegmenter`) reads the images itself; a :class:`~.pipeline.Vista3DPipeline` runs with
            its own settings and the prompt of ``pipeline_kwargs`` (every class without one). ``None``: the VISTA3D pipeline on this rank's
            device, built from ``pipeline_kwargs`` (``classes``, ``points``, ``point_labels`` are the prompt)
            while the first image loads.
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
        Vista3DInputError: a setting that disagrees with the given pipeline's (nothing was started).
    """
    opts = dataclasses.replace(options or BatchOptions(), **settings)
    segment_fn = _as_segmenter(segment_fn, opts.pipeline_kwargs)
    paths, outs = _planned_outputs(inputs, output_dir, opts)
    nonfinite, output_dtype = _pipeline_settings(segment_fn, opts)
    dev = _run_device(segment_fn, _batch_device(opts.device, opts.pipeline_kwargs))
    check_environment()
    if segment_fn is None:  # what cannot fit is refused before the first image
        check_images(paths, dev)
    pipeline_kwargs = opts.pipeline_kwargs
    if segment_fn is None:  # the pipeline built here reads and writes as the run does
        pipeline_kwargs = {**(pipeline_kwargs or {}), "output_dtype": output_dtype, "nonfinite": nonfinite}
    work = functools.partial(_Work, segment_fn, pipeline_kwargs, output_dtype, nonfinite, opts.prefetch)
    mask_ids = _mask_ids(segment_fn, pipeline_kwargs)
    part, summary = _part_and_summary(opts.part, summary_path, output_dir, outs)
    started = time.perf_counter()  # the run's wall clock
    began = time.time()  # the clock of file times: outputs written since are another process's
    claims = OutputClaims(began)
    # the run's GPU is current while it runs (kernels launch on the current device) and the caller's after
    with _current(dev), dist_context(opts.backend) as (rank, world, _):
        result_of = functools.partial(BatchResult, world_size=world, host=socket.gethostname(), part=part,
                                      inputs=len(paths), started=began)
        info = [_header_info(p) for p in paths]
        sizes = [n for n, _ in info]
        # --volume-index picks a volume of the 4D images; the 3D images of the same batch are read as they are
        volumes = [opts.volume_index if four_d else None for _, four_d in info]
        pool, mine = _my_images(sizes, part_keys(outs, output_dir), part, rank, world)
        report = _counted(opts.on_image or (None if opts.quiet else _print_record), len(mine))
        records = {i: _new_record(i, paths[i], outs[i], rank, sizes[i]) for i in mine}
        todo = _triage(records, mask_ids, overwrite, claims, report)
        jobs = _Jobs(todo, paths, outs, volumes, records, claims)
        try:
            _segment_all(jobs, work(dev, world), report)
        except BaseException:  # Ctrl-C, SIGTERM, a crash: what was finished is still recorded
            if rank == 0 and jobs.started:  # (a pipeline that could not be built started nothing)
                stopped = _stopped_records(records, paths, outs, sizes, pool)
                _write_summary(summary, result_of(stopped, wall_seconds=time.perf_counter() - started, interrupted=True))
            raise
        every = _gathered([records[i] for i in sorted(records)], world)
    result = result_of(every, wall_seconds=time.perf_counter() - started)
    if rank == 0:
        result.summary_path = _write_summary(summary, result)
    return result


def _pipeline_settings(segment_fn: Any, opts: BatchOptions) -> tuple[str, str]:
    """``(nonfinite, output_dtype)`` of the run: a field of ``opts``, or the pipeline's (given, or built from
    ``pipeline_kwargs``); the two disagreeing is refused, never silently settled."""
    pipe = segment_fn.pipeline if isinstance(segment_fn, PipelineSegmenter) else None
    own = dataclasses.asdict(pipe.options) if pipe is not None else dict(opts.pipeline_kwargs or {})
    if segment_fn is not None and pipe is None:
        own = {}  # a caller's function: nothing of its own to agree with
    if pipe is not None and opts.device is not None:
        given = torch.device(opts.device)
        if given.type != pipe.device.type or given.index not in (None, pipe.device.index):
            raise Vista3DInputError(f"device={str(opts.device)!r} disagrees with the pipeline's device="
                                    f"{str(pipe.device)!r}; give it once.")
    nonfinite = _one_setting("nonfinite", opts.nonfinite, own.get("nonfinite"), "air")
    if nonfinite not in ("air", "error"):
        raise Vista3DInputError(f"nonfinite must be 'air' or 'error', got {nonfinite!r}")
    return nonfinite, _one_setting("output_dtype", opts.output_dtype, own.get("output_dtype"), DEFAULT_OUTPUT_DTYPE)


def _run_device(segment_fn: Any, device: str | torch.device | None) -> torch.device:
    """Where this process computes: the given pipeline's device, this rank's (see :func:`rank_device`) for the
    pipeline built here, the CPU for a caller's function (which gets its images there)."""
    if isinstance(segment_fn, PipelineSegmenter):
        return segment_fn.pipeline.device
    if segment_fn is not None:
        return torch.device("cpu")
    env = TorchrunEnv.read()
    if env.local_rank is None and dist.is_available() and dist.is_initialized():
        # a process group the caller started without torchrun's variables: one GPU per rank
        env = dataclasses.replace(env, local_rank=dist.get_rank() if dist.get_world_size() > 1 else 0)
    return rank_device(device, env)


def _current(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` made the current CUDA device for a block (the caller's comes back after); nothing for the CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


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


def _new_record(i: int, path: Path, out: Path, rank: int | None, voxels: int) -> dict[str, Any]:
    """The record of image ``i`` before anything was done with it."""
    return {"index": i, "image": str(path), "output": str(out), "rank": rank, "voxels": voxels,
            "status": None, "error": None, "seconds": 0.0, "windows": None}


def _triage(
    records: dict[int, dict],
    mask_ids: list[int] | None,
    overwrite: bool,
    claims: OutputClaims,
    report: Callable[[dict[str, Any]], None] | None,
) -> list[int]:
    """Mark the images whose output is refused ("failed") or exists ("skipped"); returns those left to segment."""
    todo: list[int] = []
    for i, rec in records.items():
        image, out = Path(rec["image"]), Path(rec["output"])
        files = [out, *(class_mask_paths(out.parent, mask_ids).values() if mask_ids else ())]
        if mask_ids:
            rec["masks"] = [str(f) for f in files[1:]]  # so that 'summary' checks them on disk too
        try:
            for f in files:
                check_output(image, f, overwrite=True)
        except Vista3DInputError as e:
            rec["status"], rec["error"] = "failed", _reason(e, image)
        else:
            if not overwrite and all(f.exists() for f in files):
                rec["status"] = "skipped"
                claims.sweep(out)  # a lock file left by a writer killed after its save
            else:
                todo.append(i)
        if rec["status"] is not None and report is not None:
            report(rec)
    return todo


def _gathered(local: list[dict], world: int) -> list[dict]:
    """Every rank's records in input order (``local`` itself on one process)."""
    if world == 1:
        return local
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    return sorted((r for records in gathered for r in records), key=lambda r: r["index"])


def _write_summary(path: Path, result: BatchResult) -> Path:
    """Write ``result``'s summary (rank 0); returns the file written. It goes to another name when another process
    (of the same part, or another whole run) wrote ``path`` since this run began (see
    :func:`.parts.claim_summary`); images done by the run whose summary it replaces stay done."""
    path, held = claim_summary(path, result.started)  # whole runs too: two at once keep both summaries
    try:
        _write_json(path, dataclasses.replace(result, records=keep_earlier_done(path, result.records)).summary())
    finally:
        if held is not None:
            held.release()
    return path


def _mask_ids(segment_fn: SegmentFn | None, pipeline_kwargs: dict | None) -> list[int] | None:
    """The classes whose masks each image gets (a pipeline with ``per_class``), else None."""
    if segment_fn is None and (pipeline_kwargs or {}).get("per_class"):
        kwargs = pipeline_kwargs or {}
        classes = kwargs.get("classes", "everything")
        prompt = classes if isinstance(classes, Prompt) else parse_prompt(
            classes, kwargs.get("points"), kwargs.get("point_labels"))
        return list(prompt.label_ids or [])
    pipe = getattr(segment_fn, "pipeline", None)
    if pipe is not None and getattr(pipe, "per_class", False):
        return list(segment_fn.prompt.label_ids or [])  # type: ignore[union-attr]
    return None


def summary_path_for(output_dir: str | os.PathLike | None, outputs: Sequence[Path]) -> Path:
    """Where a run's summary goes: ``output_dir/summary.json``; for one output file ``seg.nii.gz``, beside it
    as ``seg.summary.json`` (so that runs into one folder keep their own, and no ``summary.json`` of the user's
    is touched)."""
    if output_dir is not None:
        return Path(output_dir) / "summary.json"
    first = Path(outputs[0])
    stem = first.name[: -len(".nii.gz")] if first.name.endswith(".nii.gz") else first.stem
    return first.with_name(f"{stem}.summary.json")


def _stopped_records(
    records: dict[int, dict], paths: list[Path], outs: list[Path], sizes: list[int], pool: list[int]
) -> list[dict]:
    """The record of every image of the run's part (``pool``) when the run was stopped: this rank's as far as they
    got, the others' unknown."""
    every = []
    for i in sorted(pool):
        path, out = paths[i], outs[i]
        rec = records.get(i)
        if rec is None:
            rec = dict(_new_record(i, path, out, None, sizes[i]), status="unknown",
                       error="on another rank, which was stopped too")
        elif rec["status"] is None:
            rec = dict(rec, status="interrupted", error="the run was stopped before this image was finished")
        every.append(rec)
    return every


@dataclass
class _Jobs:
    """This rank's images to segment (indices into the run's lists) and every image's record."""

    todo: list[int]
    paths: list[Path]
    outs: list[Path]
    volumes: list[int | None]
    records: dict[int, dict]
    claims: OutputClaims
    started: bool = False


@dataclass
class _Work:
    """How this rank segments: the caller's ``segment_fn``, or the pipeline built from ``pipeline_kwargs``."""

    segment_fn: SegmentFn | None
    pipeline_kwargs: dict | None
    output_dtype: str
    nonfinite: str
    prefetch: int
    device: torch.device
    world: int

    def loader(self, jobs: _Jobs) -> _Loader:
        """Start reading this rank's images with the policy of what will segment them."""
        if hasattr(self.segment_fn, "load"):  # a PipelineSegmenter: its pipeline reads onto its device
            load = functools.partial(self.segment_fn.load, nonfinite=self.nonfinite)  # type: ignore[union-attr]
            load_device = getattr(getattr(self.segment_fn, "pipeline", None), "device", torch.device("cpu"))
        else:  # the pipeline built here reads onto this rank's device; a caller's function gets float32 on the CPU
            load_device = self.device if self.segment_fn is None else torch.device("cpu")
            load = functools.partial(_load_for, device=load_device, nonfinite=self.nonfinite)
        items = [(jobs.paths[i], jobs.volumes[i]) for i in jobs.todo]
        load = jobs.claims.claiming(load, [jobs.outs[i] for i in jobs.todo])  # each output claimed before its read
        return _Loader(load, items, self.prefetch, load_device)

    def segmenter(self, todo: list[int]) -> SegmentFn:
        """What segments each image; the pipeline is built here, while the loader reads the first image."""
        fn, error = self.segment_fn, None
        if fn is None and todo:
            try:
                fn = _build_segmenter(self.device, self.pipeline_kwargs)
            except Exception as e:
                error = e
        if self.segment_fn is None:
            _agree_on_setup(error, self.world)
        return fn  # type: ignore[return-value]



def _load_for(path: Path, volume_index: int | None, device: torch.device, nonfinite: str) -> tuple:
    return load_input(path, device, volume_index, nonfinite)


def _image_label(fn: SegmentFn, k: int, n: int, path: Path, rank: int, world: int) -> None:
    """Name the image in a pipeline's window progress bar: ``images [###---] 2/7 ct.nii.gz | windows``."""
    pipe = getattr(fn, "pipeline", None)
    if pipe is None or not getattr(pipe, "progress", False):
        return
    if world == 1:
        pipe.progress_label = f"images {text_bar(k - 1, n)} {k}/{n} {path.name} | windows"
    else:
        pipe.progress_label = f"[rank {rank}] [{k}] {path.name} windows"


def _segmented_fields(t_load: float, t_segment: float, info: dict[str, Any]) -> dict[str, Any]:
    """An image's record fields once it is segmented: its times, windows, window batch and per-stage seconds."""
    fields: dict[str, Any] = {
        "segment_seconds": round(t_segment, 4),
        "seconds": round(t_load + t_segment, 4),
        "windows": info.get("windows"),
    }
    if info.get("sw_batch_size") is not None:
        fields["sw_batch_size"] = info["sw_batch_size"]
    fields["stages"] = {"load": round(t_load, 4), **{k: round(float(v), 4) for k, v in info.get("stages", {}).items()}}
    return fields


class _Finisher:
    """Gives an image's record its final status once its file is written (on the saver's thread) or it failed (on
    the main one), releases its output's claim and reports it; one report at a time."""

    def __init__(self, jobs: _Jobs, report: Callable[[dict[str, Any]], None] | None):
        self.jobs, self.report = jobs, report
        self.lock = threading.Lock()

    def __call__(self, i: int, created: list[Path], fut: Future | None, error: BaseException | None = None) -> None:
        rec = self.jobs.records[i]
        error = error or (fut.exception() if fut is not None else None)
        self.jobs.claims.release(self.jobs.outs[i])  # the file is written, or the image failed
        with self.lock:
            if isinstance(error, OutputTaken):  # another process's, or written since the plan
                rec["status"], rec["note"] = error.status, str(error)
            elif error is not None:
                _remove_empty(created)
                rec["status"], rec["error"] = "failed", _reason(error, self.jobs.paths[i])
            else:
                _, seconds = fut.result()  # type: ignore[union-attr]
                rec["status"] = "done"
                rec["stages"]["save"] = round(seconds, 4)
                rec["seconds"] = round(rec["seconds"] + seconds, 4)
            if self.report is not None:
                self.report(rec)


def _segment_all(jobs: _Jobs, work: _Work, report: Callable[[dict[str, Any]], None] | None) -> None:
    """This rank's images: load ahead, segment, save behind; each record gets its status when its file is written."""
    records, paths, outs = jobs.records, jobs.paths, jobs.outs
    loads = work.loader(jobs)  # before the build: the first image and the weights load together
    try:
        fn = work.segmenter(jobs.todo)
    except BaseException:
        loads.close()
        jobs.claims.release_all()  # the outputs the loader claimed meanwhile
        raise
    jobs.started = True
    finish = _Finisher(jobs, report)
    rank = records[jobs.todo[0]]["rank"] if jobs.todo else 0
    try:
        with AsyncSaver(max_pending=1, save_fn=_timed_save, dtype=work.output_dtype) as saver:
            for k, (i, (image, geom, t_load, err)) in enumerate(zip(jobs.todo, loads), start=1):
                rec = records[i]
                rec["load_seconds"] = round(t_load, 4)
                timer = StageTimer()  # on CUDA it synchronises at the end, so the time includes the GPU work
                try:
                    if err is not None:
                        raise err
                    _image_label(fn, k, len(jobs.todo), paths[i], rank, work.world)
                    with timer.stage("segment"):
                        labels, info = _labels_and_info(fn(image, geom))
                    rec.update(_segmented_fields(t_load, timer.timings["segment"], info))
                    created = missing_folders(outs[i].parent)
                    fut = saver.submit(labels, geom, outs[i], masks=info.get("masks"))
                except Exception as e:
                    rec["seconds"] = round(t_load + timer.timings.get("segment", 0.0), 4)
                    finish(i, [], None, e)
                    continue
                finally:
                    del image
                # reported on the saver's thread as soon as the file is written (at once if it already is)
                fut.add_done_callback(functools.partial(finish, i, created))
            saver.close(raise_errors=False)
    finally:
        loads.close()
        jobs.claims.release_all()
