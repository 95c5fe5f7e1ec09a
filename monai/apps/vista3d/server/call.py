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
"""One request's life on the server, the same for every protocol it speaks (the NIM's and MONAI Label's).

A :class:`Call` is what a request that does work holds: a scratch folder of its own (its upload, its download, its
answer file), the clock of ``--request-timeout`` (started once its whole body has arrived: the time a body may take
is ``--body-timeout``'s, see :class:`~.app.BodyDeadline`), a watch that completes when its client disconnects, and
the check of an image file the client sent. The folder goes when the request ends, or, when the answer is a file
read from it, once that answer has been sent. :func:`read_limited` reads a small body whole, within a byte limit;
:func:`holds_token` is the one check of a bearer token (the app's gate, MONAI Label's ``/auth/token/valid``).
"""

from __future__ import annotations

import asyncio
import hmac
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from .errors import ServeError
from .images import check_inflated_size, inspect_image

__all__ = ["Call", "client_of", "holds_token", "media_type", "read_limited"]


def client_of(request: Request) -> str:
    """Who sent a request, for the per-client shares and the owners of sessions and uploads: its address (as
    uvicorn reads it, from a trusted proxy's ``X-Forwarded-For`` where one forwards it)."""
    return request.client.host if request.client is not None else ""


def holds_token(authorization: bytes, token: bytes) -> bool:
    """Whether an ``Authorization`` header's value is ``Bearer <token>`` (the scheme's name in any case, as RFC 7235
    has it), compared in constant time."""
    scheme, _, credentials = authorization.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token)


def media_type(request: Request, default: str = "") -> str:
    """The request's content type without its parameters, in lower case (``default`` when it has none)."""
    return request.headers.get("content-type", default).split(";")[0].strip().lower()


async def read_limited(request: Request, limit: int, too_large: str) -> bytes:
    """The request's whole body, refused (413 with ``too_large``) as soon as it passes ``limit`` bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ServeError(413, too_large)
    return bytes(body)


async def _disconnected(request: Request) -> None:
    """Completes when the client disconnects (read once the body is in: nothing else is left to receive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Call:
    """One request's scratch folder, clock and disconnect watch; ``async with`` it for the request's life.

    Args:
        request: the request.
        work_dir: where the scratch folder is made (the server's work folder).
        timeout: seconds from the body's arrival to the answer (``--request-timeout``).
    """

    def __init__(self, request: Request, work_dir: Path | None, timeout: float):
        self.request = request
        self.folder = Path(tempfile.mkdtemp(prefix="req-", dir=work_dir))
        self.timeout = timeout
        self.deadline = math.inf  # no clock while the body arrives: --body-timeout bounds that
        self._gone: asyncio.Task | None = None
        self._sending = False  # an answer is read from the folder: it goes once sent

    async def __aenter__(self) -> Call:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def body_received(self) -> None:
        """Start the request's clock: its body is in, its work begins."""
        self.deadline = asyncio.get_running_loop().time() + self.timeout

    def left(self) -> float:
        """Seconds left before the deadline."""
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def gone(self) -> asyncio.Task:
        """A task that completes when the client disconnects (started on first use)."""
        if self._gone is None:
            self._gone = asyncio.ensure_future(_disconnected(self.request))
        return self._gone

    async def image_format(self, path: Path, max_voxels: int) -> str:
        """The format of the image at ``path`` once its header passes (at most ``max_voxels``); a file the client
        sent (an upload or a download, both in this scratch folder) also has its gzip stream counted against the
        header before the model reads it. The operator's files under --data-dir are not: the load inflates them
        once, as ``vista3d`` does."""
        info = await run_in_threadpool(inspect_image, path, max_voxels)
        if self.folder in path.parents:
            await run_in_threadpool(check_inflated_size, path, info)
        return info.format

    def after_sent(self) -> BackgroundTask:
        """The task an answer read from the folder runs once sent: the folder stays until then."""
        self._sending = True
        return BackgroundTask(self.cleanup)

    def file_answer(self, path: Path, filename: str, headers: dict[str, str] | None = None,
                    media: str | None = None) -> FileResponse:
        """``path`` as the answer, named ``filename`` (``media`` by default: gzip for ``.gz``, else bytes)."""
        if media is None:
            media = "application/gzip" if filename.endswith(".gz") else "application/octet-stream"
        return FileResponse(path, media_type=media, filename=filename, headers=headers, background=self.after_sent())

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def close(self) -> None:
        """The request has its answer: stop watching the client, and remove the folder unless an answer is still
        read from it."""
        if self._gone is not None:
            self._gone.cancel()
        if not self._sending:
            self.cleanup()
