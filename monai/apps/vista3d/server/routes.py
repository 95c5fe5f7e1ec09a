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
"""The endpoints: HTTP in, library calls through the model's queue, files out.

The NIM's: ``GET /v1/health/live``, ``GET /v1/health/ready``, ``GET /v1/license``, ``GET /v1/vista3d/info``,
``POST /v1/vista3d/inference``. This server's: ``POST /v1/vista3d/sessions``, ``GET|DELETE
/v1/vista3d/sessions/{id}``, ``POST /v1/vista3d/sessions/{id}/clicks``. A request that needs the model reads its
whole body first (an upload into the scratch folder of its :class:`~.call.Call`; :class:`~.app.BodyDeadline`
bounds how long that may take) and checks it; only then does it take a place in the queue (429 when full), fetch a
URL's image, check the image and wait for its job; the answer file is written off the model's thread and the folder
is removed once sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response

from monai.apps.vista3d.config import OUTPUT_POSTFIX, check_roi_size, embed_dim_of
from monai.apps.vista3d.core.prompts import parse_points
from monai.apps.vista3d.io.atomic import write_atomically
from monai.apps.vista3d.io.image_geometry import as_xyz
from monai.apps.vista3d.labels import everything_labels, label_names

from . import jobs
from .call import Call, client_of, media_type, read_limited
from .errors import ServeError
from .fetch import confined_path, download, has_scheme, receive_form
from .images import AnswerFormat, LoadedImage, nrrd_available, safe_stem, write_label_map, zip_one
from .outputs import publish
from .schemas import (
    ClickRequest,
    InferenceRequest,
    SessionRequest,
    load_json,
    nim_prompt,
    openapi_body,
    parse_body,
    prompt_sizes,
)
from .sessions import BoundedStore, SessionEntry, SessionStore
from .settings import Limits, ServerSettings
from .worker import ModelWorker

__all__ = ["router", "ServerState", "client_of", "check_sizes", "sweep_sessions"]

router = APIRouter()

_MAX_JSON = 1 << 20  # bytes of a JSON request body
_RAW_TYPES = ("application/gzip", "application/x-gzip", "application/x-nifti", "application/x-nrrd",
              "application/octet-stream")


@dataclass
class ServerState:
    """What the endpoints share: the settings, the model's worker, the sessions and the scratch root."""

    settings: ServerSettings
    worker: ModelWorker
    sessions: SessionStore
    work_dir: Path | None = None

    def call(self, request: Request) -> Call:
        """The :class:`~.call.Call` of one request that does work: its scratch folder, clock and disconnect watch."""
        return Call(request, self.work_dir, self.settings.limits.request_timeout)


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.vista3d
    return state


async def read_json(request: Request) -> Any:
    """The request's JSON body (at most 1 MiB; 400 when it is not JSON, 415 for another content type)."""
    ctype = media_type(request, "application/json")
    if ctype not in ("application/json", "text/json", ""):
        raise ServeError(415, f"send the request as JSON (application/json) or as an upload (multipart/form-data), "
                              f"not {ctype}")
    body = await read_limited(request, _MAX_JSON, f"a JSON request body may be at most {_MAX_JSON} bytes; upload "
                                                  "images as multipart/form-data")
    if not body:
        raise ServeError(400, "the request has no body: send a JSON object (see the API reference)")
    return load_json(body)


async def _obtain(call: Call, settings: ServerSettings, image: str) -> tuple[Path, str]:
    """The file of an ``image`` field (a URL, fetched into the scratch folder, or a path under --data-dir)."""
    if has_scheme(image):
        try:
            name = await asyncio.wait_for(download(image, call.folder / "download", settings), call.left())
        except asyncio.TimeoutError:
            raise ServeError(504, "fetching the image ran out of time (--request-timeout)") from None
        return call.folder / "download", name
    path = confined_path(settings.data_dir, image, "image")
    return path, safe_stem(path.name)


async def _image_of(call: Call, model: type, text_fields: tuple[str, ...]) -> tuple[Any, Path | None, str]:
    """The parsed request and its image file: a form with the file, or a JSON body naming the image (no file yet:
    None, and no name)."""
    if media_type(call.request) == "multipart/form-data":
        form = await receive_form(call.request, call.folder / "upload", "image", text_fields)
        if form.file is None:
            raise ServeError(422, "the form has no complete 'image' file part: upload the image as 'image'")
        fields: dict[str, Any] = dict(form.fields)
        for key in ("prompts", "output", "statistics"):  # JSON in a text field (statistics: true or false)
            if key in fields:
                fields[key] = load_json(fields[key], f"form field {key!r}")
        return parse_body(model, fields), form.file, safe_stem(form.filename or "image")
    body = parse_body(model, await read_json(call.request))
    if not body.image:
        raise ServeError(422, "field 'image' is required: an http(s) URL, a path under --data-dir, or upload the "
                              "file as multipart/form-data")
    return body, None, ""


def check_sizes(limits: Limits, points: int, classes: int) -> None:
    """Refuse (413) more points or classes than the server's limits allow, before anything else is done."""
    if points > limits.max_points:
        raise ServeError(413, f"the request has {points} points, more than this server takes (--max-points "
                              f"{limits.max_points}); send fewer points")
    if classes > limits.max_classes:
        raise ServeError(413, f"the request lists {classes} classes, more than this server takes (--max-classes "
                              f"{limits.max_classes}); send fewer, or 'everything' by leaving the classes out")


def _timing_header(timings: dict[str, float]) -> str:
    return ", ".join(f"{k.replace('/', '-')};dur={1000 * v:.1f}" for k, v in timings.items())


def _wants(request: Request, default: str) -> str:
    """``"zip"`` or ``"raw"``: the answer's packaging the ``Accept`` header asks for (else ``default``)."""
    accept = [part.split(";")[0].strip().lower() for part in request.headers.get("accept", "").split(",")]
    if "application/zip" in accept:
        return "zip"
    if any(t in accept for t in _RAW_TYPES):
        return "raw"
    return default


def _file_answer(call: Call, path: Path, name: str, packaging: str, headers: dict[str, str],
                 more: tuple[tuple[Path, str], ...] = ()) -> FileResponse:
    if packaging == "zip":
        path = zip_one(path, name, call.folder / (Path(name).name.split(".")[0] + ".zip"), more)
        return call.file_answer(path, path.name, headers, media="application/zip")
    return call.file_answer(path, name, headers)


def _write_statistics(stats: dict, image_name: str, label_map: str, path: Path) -> Path:
    """``statistics.json`` of one answer, as ``vista3d --statistics`` writes it (the client's names, no server
    path), whole or not at all."""
    text = json.dumps({"image": image_name, "label_map": label_map, **stats}, indent=1).encode()
    return write_atomically(path, lambda f: f.write(text))


# ---------------------------------------------------------------------------------------------- the NIM's
@router.get("/v1/health/live")
async def live() -> dict:
    return {"status": "live"}


@router.get("/v1/health/ready")
async def ready(request: Request) -> Response:
    worker = _state(request).worker
    try:
        worker.check_ready()
    except ServeError as e:
        return JSONResponse({"status": worker.state, "detail": e.message}, status_code=e.status, headers=e.headers)
    return JSONResponse({"status": "ready", "weights": "random" if _state(request).settings.random_weights
                         else "loaded"})


@router.get("/v1/license")
async def license_info() -> dict:
    return {"license": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0",
            "note": "this server's code; the VISTA3D checkpoint it serves carries the license of the MONAI model zoo's "
                    "vista3d bundle"}


def _weights(settings: ServerSettings) -> str | None:
    """The checkpoint's file name, ``"random"`` without one, None for a network the caller built."""
    if settings.random_weights:
        return "random"
    return Path(settings.model.weights).name if settings.model.weights else None


@router.get("/v1/vista3d/info")
async def info(request: Request) -> dict:
    from monai import __version__

    state = _state(request)
    model, limits = state.settings.model, state.settings.limits
    names = label_names()
    return {
        "name": "VISTA3D",
        "version": __version__,
        "model": {"network": "vista3d132", "embed_dim": embed_dim_of(model.network_kwargs),
                  "roi_size": list(check_roi_size(model.options.roi_size)),
                  "weights": _weights(state.settings), "state": state.worker.state},
        "labels": {name: label_id for label_id, name in names.items() if label_id != 0},
        "everything": everything_labels(),
        "formats": ["nifti"] + (["nrrd"] if nrrd_available() else []),
        "limits": {"max_voxels": limits.max_voxels, "max_points": limits.max_points,
                   "max_classes": limits.max_classes, "queue_size": limits.queue_size,
                   "request_timeout_s": limits.request_timeout, "session_ttl_s": limits.session_ttl,
                   "max_sessions": limits.max_sessions, "body_timeout_s_per_mib": limits.body_timeout,
                   "max_queue_per_client": limits.max_queue_per_client,
                   "max_sessions_per_client": limits.max_sessions_per_client},
    }


_JSON_FIELD = "JSON, as the JSON body's field of this name"


@router.post("/v1/vista3d/inference", openapi_extra=openapi_body(InferenceRequest, {
    "prompts": _JSON_FIELD, "output": _JSON_FIELD, "local_working_dir": "a folder under --data-dir",
    "statistics": "true: statistics.json in the zip answer (JSON: true or false)"}))
async def inference(request: Request) -> Response:
    state = _state(request)
    state.worker.check_ready()  # 503 before the body is read
    async with state.call(request) as ctx:
        # the whole body first (within --body-timeout), checked; only then a place in the queue (429 when full)
        body, path, name = await _image_of(ctx, InferenceRequest, ("prompts", "local_working_dir", "output",
                                                                   "statistics"))
        ctx.body_received()
        check_sizes(state.settings.limits, *prompt_sizes(body.prompts))
        prompt = nim_prompt(body.prompts)
        answer = AnswerFormat.of(body.output)
        out_dir = None
        if body.local_working_dir:
            out_dir = confined_path(state.settings.data_dir, body.local_working_dir, "local_working_dir", "dir")
        if body.statistics and out_dir is None and _wants(request, "zip") != "zip":
            raise ServeError(406, "statistics come as statistics.json in the zip answer: accept application/zip "
                                  "(the default), or leave statistics out")
        async with state.worker.reserve(client_of(request)) as slot:
            if path is None:
                path, name = await _obtain(ctx, state.settings, body.image)
            start = time.perf_counter()
            fmt = await ctx.image_format(path, state.settings.limits.max_voxels)
            check = time.perf_counter() - start
            labels, loaded, timings, stats = await slot.run(jobs.segment(path, fmt, name, prompt, body.statistics),
                                                            ctx.deadline, ctx.gone())
            suffix = answer.suffix or loaded.suffix
            fname = f"{loaded.name}_{OUTPUT_POSTFIX}{suffix}"
            start = time.perf_counter()
            out = await run_in_threadpool(write_label_map, labels, loaded, ctx.folder / fname, None, answer.dtype)
            if out_dir is not None:  # its own name there: never over another file, another client's answer
                out = await run_in_threadpool(publish, out, out_dir, fname)
            more: tuple[tuple[Path, str], ...] = ()
            if stats is not None:  # named after the label map it describes (in local_working_dir, as published)
                stats_file = await run_in_threadpool(_write_statistics, stats, loaded.name, out.name,
                                                     ctx.folder / f"{out.name[:-len(suffix)]}_statistics.json")
                if out_dir is not None:
                    stats_file = await run_in_threadpool(publish, stats_file, out_dir, stats_file.name)
                more = ((stats_file, "statistics.json"),)
            # the server's own time for the request, in the order spent: the file's check, the job, the answer
            spent = {"check": check, **timings, "write": time.perf_counter() - start}
            headers = {"Server-Timing": _timing_header(spent), **answer.note()}
            if out_dir is not None:
                return JSONResponse({"local_working_dir": body.local_working_dir, "output": str(out),
                                     **({"statistics": str(more[0][0])} if more else {}),
                                     **({"ignored": answer.ignored} if answer.ignored else {})}, headers=headers)
            return _file_answer(ctx, out, fname, _wants(request, "zip"), headers, more)


# ------------------------------------------------------------------------------------------ click sessions
@router.post("/v1/vista3d/sessions", status_code=201, openapi_extra=openapi_body(SessionRequest, {}))
async def create_session(request: Request) -> Response:
    state = _state(request)
    state.worker.check_ready()
    async with state.call(request) as ctx:
        body, path, name = await _image_of(ctx, SessionRequest, ())  # the body before the place, as inference
        ctx.body_received()
        async with state.worker.reserve(client_of(request)) as slot:
            if path is None:
                path, name = await _obtain(ctx, state.settings, body.image)
            fmt = await ctx.image_format(path, state.settings.limits.max_voxels)
            session, loaded = await slot.run(jobs.open_session(path, fmt, name), ctx.deadline, ctx.gone())
            sid = state.sessions.add(SessionEntry(session, loaded, owner=client_of(request)))
    return JSONResponse(_session_info(state.sessions, sid, state.sessions.get(sid, client_of(request))),
                        status_code=201)


def _session_info(store: SessionStore, sid: str, entry: SessionEntry) -> dict:
    image: LoadedImage = entry.image
    return {"session_id": sid, "name": image.name, "format": image.format, "shape": list(image.shape),
            "clicks": entry.session.clicks, "class": (entry.session.label_ids or [None])[0],
            "expires_in": round(store.expires_in(entry), 1)}


@router.get("/v1/vista3d/sessions/{session_id}")
async def session_info(session_id: str, request: Request) -> dict:
    store = _state(request).sessions
    return _session_info(store, session_id, store.get(session_id, client_of(request)))


@router.delete("/v1/vista3d/sessions/{session_id}", status_code=204)
async def delete_session(session_id: str, request: Request) -> Response:
    _state(request).sessions.remove(session_id, client_of(request))
    return Response(status_code=204)


def changed_box(before: torch.Tensor | None, after: torch.Tensor) -> tuple[slice, slice, slice] | None:
    """The smallest box holding every voxel whose label changed (before the first click every voxel is 255,
    unknown); None when nothing changed."""
    changed = after != 255 if before is None else after != before
    if not bool(changed.any()):
        return None
    box = []
    for axis in range(3):
        hit = torch.nonzero(changed.any(dim=tuple(d for d in range(3) if d != axis))).flatten()
        box.append(slice(int(hit[0]), int(hit[-1]) + 1))
    return as_xyz(box)


@router.post("/v1/vista3d/sessions/{session_id}/clicks", openapi_extra=openapi_body(ClickRequest))
async def clicks(session_id: str, request: Request) -> Response:
    state = _state(request)
    entry = state.sessions.get(session_id, client_of(request))
    body: ClickRequest = parse_body(ClickRequest, await read_json(request))
    limits = state.settings.limits
    check_sizes(limits, len(body.points), 0)
    object_points = len(body.points) + (0 if body.reset else entry.session.clicks)
    if object_points > limits.max_points:  # every click of the object goes to the network again
        raise ServeError(413, f"the session's object would have {object_points} points, more than this server "
                              f"takes (--max-points {limits.max_points}); start a new object with \"reset\": true")
    labels = body.point_labels if body.point_labels is not None else [1] * len(body.points)
    parse_points(body.points, labels)  # refused here, before the queue (PromptError -> 422)
    async with state.worker.reserve(client_of(request)) as slot, entry.lock:
        async with state.call(request) as ctx:
            ctx.body_received()
            job = jobs.click(entry.session, body.points, labels, body.object_class, body.reset)
            label_map = await slot.run(job, ctx.deadline, ctx.gone())
            now = label_map.to(torch.uint8).cpu()
            before = None if body.reset else entry.previous
            entry.previous = now
            box = changed_box(before, now) if body.answer == "box" else None
            headers: dict[str, str] = {}
            if body.answer == "box":
                if box is None:
                    return Response(status_code=204, headers={"X-Vista3D-Box": "none"})
                headers["X-Vista3D-Box"] = ",".join(str(v) for v in (*(s.start for s in box), *(s.stop for s in box)))
            fname = f"{entry.image.name}_click{entry.session.clicks}{entry.image.suffix}"
            out = await run_in_threadpool(write_label_map, now, entry.image, ctx.folder / fname, box)
            return _file_answer(ctx, out, fname, _wants(request, "raw"), headers)


def sweep_every(store: BoundedStore) -> float:
    """How often expired entries are swept: a quarter of the TTL, between 1 s and 60 s."""
    return min(60.0, max(1.0, store.ttl / 4))


async def sweep_sessions(store: BoundedStore) -> None:
    """End expired entries on a schedule, so that an idle server frees their memory (and files) too."""
    while True:
        await asyncio.sleep(sweep_every(store))
        store.sweep()
