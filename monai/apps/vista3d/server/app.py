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
import hmac
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import Vista3DInputError
from .errors import ServeError
from .monailabel import router as monailabel_router
from .routes import ServerState, router, sweep_sessions
from .sessions import SessionStore
from .settings import ServerSettings
from .worker import ClientGone, JobCancelled, ModelWorker

__all__ = ["create_app"]

logger = logging.getLogger("monai.apps.vista3d.server")

_MAX_ECHO = 200  # characters of a request's path quoted in an error message
_OPEN_PATHS = ("/v1/health/", "/auth/")  # probes answer without the token (as an orchestrator calls them); MONAI
# Label clients ask /auth/ whether to log in, and trade the login for the token there


async def _send_json(send: Callable, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"connection", b"close")]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """Refuse (401) every request but the health checks that lacks ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str):
        self.app, self._token = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(_OPEN_PATHS):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._token):
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

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
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


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, e: ServeError) -> Response:
        return JSONResponse({"detail": e.message}, status_code=e.status, headers=e.headers)

    @app.exception_handler(Vista3DInputError)
    async def _input_error(request: Request, e: Vista3DInputError) -> Response:
        return JSONResponse({"detail": _one_line(e)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError) -> Response:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"detail": f"{where}: {first.get('msg')}"}, status_code=422)

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
    async def _gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the client has gone

    @app.exception_handler(JobCancelled)
    async def _cancelled(request: Request, e: JobCancelled) -> Response:
        return JSONResponse({"detail": "the request was cancelled (the server is stopping)"}, status_code=503)

    @app.exception_handler(torch.cuda.OutOfMemoryError)
    async def _oom(request: Request, e: Exception) -> Response:
        return JSONResponse({"detail": "out of GPU memory for this image; retry later, or start the server with a "
                                       "smaller --sw-batch-size"}, status_code=503, headers={"Retry-After": "10"})

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> Response:
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"internal server error ({type(e).__name__}); the server logged it"},
                            status_code=500)


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
    worker = ModelWorker(pipeline_factory or settings.model.build, limits.queue_size, warm_up, on_failure)
    state = ServerState(settings, worker, SessionStore(limits.max_sessions, limits.session_ttl, clock))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        made = settings.work_dir is None
        state.work_dir = Path(tempfile.mkdtemp(prefix="vista3d-serve-")) if made else settings.work_dir
        worker.start()
        sweeper = asyncio.ensure_future(sweep_sessions(state.sessions))
        try:
            yield
        finally:
            sweeper.cancel()
            await asyncio.get_running_loop().run_in_executor(None, worker.stop)
            if made:
                shutil.rmtree(state.work_dir, ignore_errors=True)

    from monai import __version__

    app = FastAPI(title="VISTA3D", version=__version__, lifespan=lifespan,
                  description="VISTA3D segmentation: the NVIDIA VISTA-3D NIM's API, and click sessions.")
    app.state.vista3d = state
    app.include_router(router)
    app.include_router(monailabel_router)  # 3D Slicer's MONAI Label module: /info/, /infer/{model}, ...
    _install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    if settings.token is not None:
        app.add_middleware(BearerAuth, token=settings.token)  # added last: it runs first
    return app
