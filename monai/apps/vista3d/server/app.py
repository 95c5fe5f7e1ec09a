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
"""The ASGI application: the endpoints of :mod:`.routes`, the bearer-token and body-size gates in front of them,
and one JSON shape for every error (``{"detail": "one line"}``, no traceback).

Example::

    import uvicorn
    from monai.apps.vista3d.server.app import create_app
    from monai.apps.vista3d import SegmentJob
    from monai.apps.vista3d.server.settings import ServerSettings

    uvicorn.run(create_app(ServerSettings(model=SegmentJob(weights="model.pt"))), host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from monai.apps.vista3d.core.network_ready import RANDOM_WEIGHTS_WARNING
from monai.apps.vista3d.errors import Vista3DInputError

from .call import holds_token
from .errors import ServeError
from .monailabel import router as monailabel_router
from .routes import ServerState, router, sweep_sessions
from .sessions import SessionStore
from .settings import ServerSettings
from .worker import ClientGone, JobCancelled, ModelWorker

__all__ = ["create_app", "begin_shutdown"]

logger = logging.getLogger("monai.apps.vista3d.server")

_MAX_ECHO = 200  # characters of a request's path quoted in an error message
_STOPPING = "the server is stopping (SIGTERM); the request was not finished: send it again later"
_STOPPING_RETRY = 10  # seconds: what Retry-After says while the server stops
# seconds the model's thread is waited for at exit: its job was cancelled and ends with the window in flight; the
# process must not end inside a forward (torch aborts a process that exits while a thread runs in it)
_STOP_JOIN = 60.0
_OPEN_PATHS = ("/v1/health/", "/auth/")  # probes answer without the token (as an orchestrator calls them); MONAI
# Label clients ask /auth/ whether to log in, and trade the login for the token there


async def _send_json(send: Callable, status: int, message: str, headers: dict[str, str] | None = None,
                     close: bool = True) -> None:
    """Answer ``{"detail": message}`` straight on the ASGI channel (for the gates in front of the app's handlers);
    ``close``: and end the connection after it."""
    body = json.dumps({"detail": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(b"connection", b"close")] if close else []
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """Refuse (401) every request but the health checks that lacks ``Authorization: Bearer <token>`` (the scheme's
    name in any case, as RFC 7235 has it)."""

    def __init__(self, app: Any, token: str):
        self.app, self._token = app, token.encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(_OPEN_PATHS):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not holds_token(given, self._token):
                why = "a bearer token is required" if not given else "the bearer token is wrong"
                await _send_json(send, 401, f"{why}: send 'Authorization: Bearer <token>' (the server's --token)",
                                 {"WWW-Authenticate": "Bearer"})
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse bodies over ``limit`` bytes: at once by their ``Content-Length``, else as they are read (413)."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    def _message(self) -> str:
        return f"the request body is larger than --max-body-mb ({self.limit >> 20} MiB)"

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await _send_json(send, 413, self._message())
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise ServeError(413, self._message())
            return message

        await self.app(scope, counted, send)


class BodyDeadline:
    """Hold a request's body to a deadline (408 and the connection closed past it): ``seconds`` for any body, and
    ``seconds`` per MiB received, from the request's headers on. The endpoints read the whole body before they
    take a place in the queue, so a client that sends slowly holds a connection for that long, never a place."""

    def __init__(self, app: Any, seconds: float):
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        start, received, complete = loop.time(), 0, False

        async def timed() -> dict:
            nonlocal received, complete
            if complete:  # past the body: a disconnect watch waits as long as it likes
                return await receive()
            due = start + self.seconds * max(1.0, received / (1 << 20))
            try:
                message = await asyncio.wait_for(receive(), max(0.0, due - loop.time()))
            except asyncio.TimeoutError:
                raise ServeError(408, f"the request body did not arrive in time ({received} bytes in "
                                      f"{loop.time() - start:.0f} s; this server waits {self.seconds:g} s per MiB, "
                                      "--body-timeout)", {"Connection": "close"}) from None
            received += len(message.get("body", b""))
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, timed, send)


#: what the server logs at start without weights: the command line's warning, in the command line's words
RANDOM_WEIGHTS_LOG = RANDOM_WEIGHTS_WARNING.replace("no weights given", "no --weights given").replace(
    "weights=PATH", "--weights PATH")


class AnswerHeaders:
    """Add ``headers`` to every answer of the app (its errors included)."""

    def __init__(self, app: Any, headers: dict[str, str]):
        self.app, self._headers = app, [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self._headers]}
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


class CatchAll:
    """Answer an error no handler knows with one JSON line (500) and keep the connection: the client's next request
    on it is served (an exception left to the server would close it under the client). A request cut short while
    the server stops (uvicorn cancels what is left once its graceful shutdown has run out) gets 503, not 500."""

    def __init__(self, app: Any, stopping: Callable[[], bool] = lambda: False):
        self.app, self._stopping = app, stopping

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except asyncio.CancelledError:
            if not self._stopping():
                raise
            if not started:  # the task ends here, answered: uvicorn would otherwise send a plain 500
                await _send_json(send, 503, _STOPPING, {"Retry-After": str(_STOPPING_RETRY)})
        except Exception as e:  # the last line of defence: logged here, one line to the client
            logger.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await _send_json(send, 500, f"internal server error ({type(e).__name__}); the server logged it",
                                 close=False)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _detail(request: Request, text: Any) -> str:
    """One line, without the server's own paths: its scratch files (an upload, a download) are "the image", and the
    folder of --data-dir is named by the flag (the client gave the path under it)."""
    state = request.app.state.vista3d
    line = _one_line(text)
    if state.work_dir is not None:
        line = re.sub(re.escape(str(state.work_dir)) + r"[^\s'\",;:]*", "the image", line)
    if state.settings.data_dir is not None:
        line = line.replace(str(state.settings.data_dir), "--data-dir")
    return line


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, e: ServeError) -> Response:
        return JSONResponse({"detail": _detail(request, e.message)}, status_code=e.status, headers=e.headers)

    @app.exception_handler(Vista3DInputError)
    async def _input_error(request: Request, e: Vista3DInputError) -> Response:
        return JSONResponse({"detail": _detail(request, e)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError) -> Response:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"detail": _detail(request, f"{where}: {first.get('msg')}")}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> Response:
        path = request.url.path
        path = path if len(path) <= _MAX_ECHO else path[:_MAX_ECHO] + "..."  # a 100 kB path is not echoed back
        if e.status_code == 404:
            message = f"no such endpoint: {request.method} {path} (the API is under /v1; see /docs)"
        elif e.status_code == 405:
            message = f"{request.method} is not allowed on {path}"
        else:
            message = _one_line(e.detail)
        return JSONResponse({"detail": message}, status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)  # gone while its body was being read
    async def _gone(request: Request, e: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it: the client has gone

    @app.exception_handler(JobCancelled)
    async def _cancelled(request: Request, e: JobCancelled) -> Response:
        return JSONResponse({"detail": _STOPPING}, status_code=503, headers={"Retry-After": str(_STOPPING_RETRY)})

    @app.exception_handler(torch.cuda.OutOfMemoryError)
    async def _oom(request: Request, e: Exception) -> Response:
        return JSONResponse({"detail": "out of GPU memory for this image; retry later, or start the server with a "
                                       "smaller --sw-batch-size"}, status_code=503, headers={"Retry-After": "10"})


def begin_shutdown(app: FastAPI) -> None:
    """The server is stopping (uvicorn has stopped accepting): waiting requests are answered 503 now, the running
    job has --shutdown-timeout seconds to finish before it is cancelled (503 too)."""
    state: ServerState = app.state.vista3d
    state.worker.drain(state.settings.limits.shutdown_timeout)


def create_app(
    settings: ServerSettings,
    pipeline_factory: Callable[[], Any] | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    on_failure: Callable[[BaseException], None] | None = None,
    warm_up: bool = True,
) -> FastAPI:
    """The VISTA3D server as an ASGI application (run it with uvicorn, one process: the model lives in it).

    Args:
        settings: what the server runs with.
        pipeline_factory: builds the pipeline on the model's thread (default: ``settings.model.build``).
        clock: the session store's clock.
        on_failure: called when the pipeline cannot be built (the command line stops the server).
        warm_up: one forward on blank windows before the server turns ready.
    """
    limits = settings.limits
    worker = ModelWorker(pipeline_factory or settings.model.build, limits.queue_size, warm_up, on_failure,
                         per_client=limits.max_queue_per_client)
    sessions = SessionStore(limits.max_sessions, limits.session_ttl, clock, per_client=limits.max_sessions_per_client)
    state = ServerState(settings, worker, sessions)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        made = Path(tempfile.mkdtemp(prefix="vista3d-serve-")) if settings.work_dir is None else None
        state.work_dir = made or settings.work_dir
        if settings.random_weights:
            logger.warning(RANDOM_WEIGHTS_LOG)
        worker.start()
        sweeper = asyncio.ensure_future(sweep_sessions(state.sessions))
        try:
            yield
        finally:
            sweeper.cancel()
            await asyncio.get_running_loop().run_in_executor(None, worker.stop, _STOP_JOIN)
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)

    from monai import __version__

    app = FastAPI(title="VISTA3D", version=__version__, lifespan=lifespan,
                  description="VISTA3D segmentation: the NVIDIA VISTA-3D NIM's API, and click sessions.")
    app.state.vista3d = state
    app.include_router(router)
    app.include_router(monailabel_router)  # 3D Slicer's MONAI Label module: /info/, /infer/{model}, ...
    _install_error_handlers(app)
    app.add_middleware(CatchAll, stopping=lambda: worker.stopping)  # added first: the innermost
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    app.add_middleware(BodyDeadline, seconds=limits.body_timeout)
    if settings.token is not None:
        app.add_middleware(BearerAuth, token=settings.token)
    if settings.random_weights:  # outermost: the refusals above carry it too
        app.add_middleware(AnswerHeaders, headers={"X-Vista3D-Weights": "random"})
    return app
