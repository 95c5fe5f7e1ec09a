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
"""The batch's two worker threads: the loader that reads ahead and the saver that writes behind."""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from monai.apps.vista3d.config import DEFAULT_OUTPUT_DTYPE, DicomOptions
from monai.apps.vista3d.core.feasibility import failure_reason
from monai.apps.vista3d.errors import WorkerError
from monai.apps.vista3d.io.handoff import get_from
from monai.apps.vista3d.io.image_geometry import ImageGeometry
from monai.apps.vista3d.io.label_transfer import label_map_for_saving
from monai.apps.vista3d.io.load_policy import load_input
from monai.apps.vista3d.io.nifti_write import save_class_masks, save_label_map
from monai.utils.profiling import StageTimer

from .distributed import on_device
from .reports import ImageReports, write_reports

__all__ = ["AsyncSaver", "load_for", "Loader", "timed_save"]


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

        ``labels`` must not be modified afterwards. A tensor on a GPU is range-checked, cast to the narrowest type
        that holds it and laid out in file order here, on the caller's stream (see
        :func:`~monai.apps.vista3d.io.label_transfer.label_map_for_saving`); its slabs cross to the host on the
        saver's compressing threads, so the caller goes on at once and the copies overlap the deflate.
        """
        if self._closed:
            raise RuntimeError("AsyncSaver is closed")
        if _on_device(labels):
            dtype = {**self._defaults, **kwargs}.get("dtype", DEFAULT_OUTPUT_DTYPE)
            labels = label_map_for_saving(labels, geometry.spatial_shape, dtype)
        self._slots.acquire()
        try:
            save: Callable[..., Any] = self._save_fn or save_label_map
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


def _on_device(labels: Any) -> bool:
    """Whether ``labels`` is a tensor off the host (what :meth:`AsyncSaver.submit` copies)."""
    return isinstance(labels, torch.Tensor) and labels.device.type != "cpu"


_LOADER_JOIN_SECONDS = 5.0


class Loader:
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
        except BaseException as e:  # handed to the main thread, which raises it
            self._hand_on((None, None, 0.0, WorkerError(f"loading the images failed: {failure_reason(e)}")))

    def _hand_on(self, item: tuple) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _load_all(self) -> None:
        with on_device(self._device):  # this thread's current device: the one its loads go to
            self._load_each()

    def _load_each(self) -> None:
        side = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        for path, volume_index in self._items:
            if self._stop.is_set():
                return
            timer = StageTimer(sync=False, nvtx=False)  # a host-side stage on another thread
            item: tuple[Any, Any, float, BaseException | None]
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


def timed_save(
    labels: Any, geometry: ImageGeometry, path: Path, masks: Any = None, reports: ImageReports | None = None,
    **kwargs: Any
) -> tuple[Path, float]:
    """Save one image's results on the saver's thread: its class masks and extra outputs (statistics, preview, DICOM
    SEG) first, when asked for, the label map last, so that an image whose label map exists has every file."""
    timer = StageTimer(sync=False, nvtx=False)  # runs on the saver's thread
    with timer.stage("save"):
        written = [] if masks is None else list(save_class_masks(masks, geometry, Path(path).parent).values())
        try:
            written += write_reports(reports, labels, geometry, Path(path))
            path = save_label_map(labels, geometry, path, **kwargs)
        except BaseException:  # an image's set is written completely or not at all
            for p in written:
                Path(p).unlink(missing_ok=True)
            raise
    return Path(path), timer.timings["save"]


def load_for(
    path: Path, volume_index: int | None, device: torch.device, nonfinite: str, dicom: DicomOptions | None = None
) -> tuple:
    return load_input(path, device, volume_index, nonfinite, dicom)
