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
"""Waiting on a worker thread without ever waiting forever.

The app's background threads (inflate, load ahead) hand their results, and their errors, to the main thread
through a queue. A thread that dies without handing anything on would leave the main thread in ``queue.get``
for ever; :func:`get_from` waits in short steps and raises :class:`WorkerError` once the thread has ended with
nothing queued, so a failure always reaches the main thread as one line, and Ctrl-C is seen within a step.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from monai.apps.vista3d.errors import WorkerError

__all__ = ["get_from"]

_STEP = 0.1  # seconds between checks that the worker is still alive


def get_from(q: queue.Queue, worker: threading.Thread, what: str) -> Any:
    """The next item of ``q``, filled by ``worker``; raises :class:`WorkerError` when ``worker`` has ended and
    nothing is left (``what`` names the work in the message)."""
    while True:
        try:
            return q.get(timeout=_STEP)
        except queue.Empty:
            if not worker.is_alive():
                try:
                    return q.get_nowait()  # put just before it ended
                except queue.Empty:
                    raise WorkerError(f"the {what} thread stopped without a result (an internal error)") from None
