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
"""One model, one thread, a bounded queue in front of it.

:class:`ModelWorker` builds the pipeline on its own thread (the weights load and a warm-up forward runs while
the server already answers ``/v1/health/live``), then runs jobs one at a time in the order they were submitted.
A request first takes a :class:`Slot` (at most ``queue_size + 1`` are held: one running, the rest waiting; one
more is refused with 429 before its image is even fetched), then runs its job through it. A request that times
out or whose client disconnects cancels its job: a queued job is dropped, a running one stops before its next
window (the pipeline's window loop runs the job's check: :func:`~..core.progress.stop_between_windows`), and the
slot is free at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from monai.apps.vista3d.core.progress import stop_between_windows

from .errors import ServeError

__all__ = ["ModelWorker", "Slot", "JobCancelled", "ClientGone"]

logger = logging.getLogger("monai.apps.vista3d.server")

#: what ``Retry-After`` says while the model loads, in seconds
LOADING_RETRY_AFTER = 5


class JobCancelled(Exception):  # noqa: N818 - a signal that ends a job, not an error
    """Raised inside a running job before its next window once its request has given up."""


class ClientGone(Exception):  # noqa: N818 - a signal that ends a job, not an error
    """The client disconnected while its job was waiting or running; nothing is sent back."""


class _Job:
    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn
        self.future: Future = Future()
        self.cancel = threading.Event()

    def check(self) -> None:
        """Stop the job (between two windows) once its request has given up."""
        if self.cancel.is_set():
            raise JobCancelled("the request was cancelled")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) < 500 else text[:497] + "..."


class ModelWorker:
    """The thread that owns the pipeline, and the bounded FIFO of jobs in front of it.

    Args:
        factory: builds the pipeline (a ``Vista3DPipeline``); called once, on the worker's thread.
        queue_size: jobs that may wait behind the running one.
        warm_up: run one network call on blank windows before turning ready (kernels chosen and compiled).
        on_failure: called with the exception when the pipeline cannot be built (the CLI stops the server).
        per_client: slots one client may hold at once (None: all of them).
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        queue_size: int,
        warm_up: bool = True,
        on_failure: Callable[[BaseException], None] | None = None,
        per_client: int | None = None,
    ) -> None:
        self._factory = factory
        self.capacity = queue_size + 1
        self.per_client = per_client or self.capacity
        self._held_by: Counter[str] = Counter()
        self._warm_up = warm_up
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._jobs: deque[_Job] = deque()
        self._held = 0
        self._current: _Job | None = None
        self._stopping = False
        self._seconds: deque[float] = deque(maxlen=32)  # recent job durations, for Retry-After
        self.state = "loading"
        self.error: str | None = None
        self.pipeline: Any = None
        self.counts = {"done": 0, "failed": 0, "cancelled": 0}
        self._thread = threading.Thread(target=self._run, name="vista3d-model", daemon=True)

    # -------------------------------------------------------------------------------------------- control
    def start(self) -> None:
        self._thread.start()

    def drain(self, timeout: float) -> None:
        """Stop taking work: new reservations get 503, waiting jobs end at once with :class:`JobCancelled` (their
        requests answer 503), and the running job has ``timeout`` seconds to finish before it is cancelled (it
        stops before its next window). The thread ends after it."""
        with self._cond:
            self._stopping = True
            self._drop_waiting()
            current = self._current
            self._cond.notify_all()
        if current is not None:
            timer = threading.Timer(timeout, current.cancel.set)
            timer.daemon = True
            timer.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Drop the queued jobs, let the running one stop before its next window, and end the thread."""
        with self._cond:
            self._stopping = True
            self._drop_waiting()
            if self._current is not None:
                self._current.cancel.set()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """True while the model's thread runs (loading, serving, or finishing a window after a stop)."""
        return self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        """True once :meth:`drain` or :meth:`stop` was called."""
        return self._stopping

    def _drop_waiting(self) -> None:
        for job in self._jobs:  # an exception, not a cancelled future: the request answers 503, never 500
            job.cancel.set()
            if not job.future.done():
                job.future.set_exception(JobCancelled("the server is stopping"))
            self.counts["cancelled"] += 1
        self._jobs.clear()

    def wait_for(self, predicate: Callable[[ModelWorker], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate(worker)`` holds (checked whenever the queue or the state changes)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)

    @property
    def pending(self) -> int:
        """Jobs waiting for the model."""
        return len(self._jobs)

    @property
    def held(self) -> int:
        """Slots held by requests (fetching their image, waiting, or running)."""
        return self._held

    @property
    def running(self) -> bool:
        return self._current is not None

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the recent mean job time times the jobs ahead."""
        mean = sum(self._seconds) / len(self._seconds) if self._seconds else 1.0
        return max(1, math.ceil(mean * (len(self._jobs) + 1)))

    def check_ready(self) -> None:
        """Raise the 503 of a model that is not serving yet (loading) or will not (failed to load)."""
        if self.state == "loading":
            raise ServeError(503, "the model is still loading (weights and a warm-up forward); retry shortly",
                             {"Retry-After": str(LOADING_RETRY_AFTER)})
        if self.state != "ready":
            raise ServeError(503, f"the model failed to load: {self.error}; fix it and restart the server")

    def reserve(self, client: str = "") -> Slot:
        """A slot for one request of ``client``; 503 when not ready, 429 with ``Retry-After`` when every slot is
        held, or when this client holds its share of them."""
        with self._cond:
            self.check_ready()
            if self._stopping:
                raise ServeError(503, "the server is shutting down", {"Retry-After": str(LOADING_RETRY_AFTER)})
            if self._held >= self.capacity:
                wait = self.retry_after()
                raise ServeError(
                    429,
                    f"the server is busy: {self._held} requests are running or queued (at most {self.capacity}, "
                    f"--queue-size {self.capacity - 1}); retry in {wait} s",
                    {"Retry-After": str(wait)},
                )
            if self._held_by[client] >= self.per_client:
                wait = self.retry_after()
                raise ServeError(
                    429,
                    f"this client already has {self._held_by[client]} requests running or queued, its most "
                    f"(--max-queue-per-client {self.per_client}); wait for their answers, or retry in {wait} s",
                    {"Retry-After": str(wait)},
                )
            self._held += 1
            self._held_by[client] += 1
            return Slot(self, client)

    def _release(self, client: str) -> None:
        with self._cond:
            self._held -= 1
            self._held_by[client] -= 1
            if self._held_by[client] <= 0:
                del self._held_by[client]
            self._cond.notify_all()

    def _submit(self, fn: Callable[[Any], Any]) -> _Job:
        job = _Job(fn)
        with self._cond:
            if self._stopping:
                raise ServeError(503, "the server is shutting down")
            self._jobs.append(job)
            self._cond.notify_all()
        return job

    def _cancel(self, job: _Job) -> None:
        with self._cond:
            job.cancel.set()
            if job in self._jobs:
                self._jobs.remove(job)
                self.counts["cancelled"] += 1
            self._cond.notify_all()

    # ------------------------------------------------------------------------------------------- thread
    def _load(self) -> Any:
        from monai.apps.vista3d.labels import everything_labels

        pipeline = self._factory()
        if self._warm_up:
            batch = pipeline.sw_batch_size if isinstance(pipeline.sw_batch_size, int) else 1
            pipeline.warm_up(batch, everything_labels())
        return pipeline

    def _run(self) -> None:
        try:
            pipeline = self._load()
        except BaseException as e:  # a bad checkpoint, out of memory: the server cannot serve
            with self._cond:
                self.state, self.error = "failed", _one_line(e)
                self._cond.notify_all()
            logger.error("the model failed to load: %s", self.error)
            if self._on_failure is not None:
                self._on_failure(e)
            return
        with self._cond:
            self.pipeline, self.state = pipeline, "ready"
            self._cond.notify_all()
        logger.info("model ready")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._stopping)
                if self._stopping:
                    return
                job = self._jobs.popleft()
                self._current = job
                self._cond.notify_all()
            start = time.perf_counter()
            outcome = "done"
            try:
                if job.future.set_running_or_notify_cancel():
                    try:
                        with stop_between_windows(job.check):
                            job.future.set_result(job.fn(pipeline))
                    except BaseException as e:  # the request's handler turns it into its answer
                        outcome = "cancelled" if isinstance(e, JobCancelled) else "failed"
                        job.future.set_exception(e)
                else:
                    outcome = "cancelled"
            finally:
                with self._cond:
                    self._current = None
                    self.counts[outcome] += 1
                    self._seconds.append(time.perf_counter() - start)
                    self._cond.notify_all()


class Slot:
    """One request's place in the queue; release it (``async with``) when the request is answered."""

    def __init__(self, worker: ModelWorker, client: str = ""):
        self._worker, self._client = worker, client
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._worker._release(self._client)

    async def __aenter__(self) -> Slot:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()

    async def run(self, fn: Callable[[Any], Any], deadline: float, gone: Awaitable[Any] | None = None) -> Any:
        """Run ``fn(pipeline)`` on the model's thread after the jobs before it; its result or its exception.

        Args:
            fn: the job.
            deadline: ``loop.time()`` by which the answer is due (504 after it, and the job is cancelled).
            gone: completes when the client disconnects (the job is cancelled, :class:`ClientGone` raised).
        """
        loop = asyncio.get_running_loop()
        job = self._worker._submit(fn)
        result = asyncio.wrap_future(job.future)
        waiters: set[Any] = {result}
        if gone is not None:
            waiters.add(gone)
        done, _ = await asyncio.wait(waiters, timeout=max(0.0, deadline - loop.time()),
                                     return_when=asyncio.FIRST_COMPLETED)
        if result in done:
            return result.result()
        self._worker._cancel(job)
        result.cancel()  # nothing will read it (a running job still finishes or stops on its own)
        self.release()  # the slot is free now; a running job stops before its next window
        if gone is not None and gone in done:
            raise ClientGone()
        raise ServeError(504, "the request ran out of time (--request-timeout); it was cancelled")
