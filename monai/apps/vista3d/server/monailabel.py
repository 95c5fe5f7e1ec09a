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
"""The part of MONAI Label's REST API that 3D Slicer's MONAI Label module calls, beside the NIM's.

What the module does, and what answers it: it asks ``GET /auth/`` whether to log in (a 200 with ``enabled``
true makes it ask for a user and password and trade them at ``POST /auth/token`` for ``{access_token,
token_type}``, sent as ``Authorization`` from then on; here the password is the server's token), then ``GET /info/``
for the app's models (grouped by ``type``: ``segmentation`` automatic, ``deepgrow``/``deepedit`` clicks; a
top-level ``config`` would make it refuse the server) and ``GET /train/?check_if_running=true`` (200 means a
training runs; here never). It uploads the volume it shows, saved as NIfTI (or the file type of its settings), with
``PUT /datastore/?image=<volume name>`` (a multipart body it builds by hand: a ``params`` JSON field and the file in
``file``), or opens a session with ``PUT /session/`` (the file in ``files``) that ``GET``/``DELETE
/session/{id}`` look after. Then ``POST /infer/{model}?image=<id>[&session_id=<id>]`` with a multipart ``params``
field: ``result_extension`` ``.nrrd`` and ``result_dtype`` ``uint8`` always, and for a click model the segment's
name (``label``) with every point placed on it so far (``foreground``, ``background``: voxel indices of the
uploaded image). It reads a multipart answer: a ``params`` part (JSON; ``label_names`` maps names to the values of
the file) and a part with a file name, the label map it loads. ``?output=image`` and ``?output=json`` ask for only
the file or only the JSON.

These endpoints share the server's gates (token, body size, body deadline), its queue (a request that needs the
model or stores an image reads its whole body first, then takes a place in its client's share: 429 when full, 503
while loading), its time limit, its --max-points and --max-classes, and its click sessions' budget, per-client share
and expiry. A client is its address, as on the NIM's endpoints (datastore images are kept per address and
``client_id``); what it uploads and the sessions it opens are its own. Every error is ``{"detail": one line}``
with a 4xx.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import tempfile
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote_plus

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import monailabel_jobs as mj
from .call import Call, client_of, holds_token, media_type, read_limited
from .errors import ServeError
from .fetch import FormData, receive_form
from .images import safe_stem
from .monailabel_store import ClickEntry, ClickSessions, Upload, UploadStore
from .routes import ServerState, check_sizes, sweep_sessions

__all__ = ["router", "MonaiLabelState"]

_MAX_SMALL_BODY = 64 << 10  # bytes of a url-encoded form (a login, or params sent that way)
_CHUNK = 1 << 20
_OUTPUTS = ("image", "json", "all")
_NOT_TRAINED = "training is not offered by this server (VISTA3D inference only): there is nothing to train or stop"


@dataclass
class MonaiLabelState:
    """What the protocol's endpoints keep: the uploaded images and the click sessions on them."""

    uploads: UploadStore
    clicks: ClickSessions


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.vista3d  # the app's own lifespan has made its work folder
    clicks = ClickSessions(state.sessions)
    folder = Path(tempfile.mkdtemp(prefix="monailabel-", dir=state.work_dir))
    limits = state.settings.limits
    uploads = UploadStore(folder, limits.max_sessions, limits.session_ttl, state.sessions.clock,
                          on_end=lambda upload: clicks.drop_upload(upload.token),
                          per_client=limits.max_sessions_per_client)
    app.state.monailabel = MonaiLabelState(uploads, clicks)
    sweeper = asyncio.ensure_future(sweep_sessions(uploads))  # an idle server deletes expired uploads too
    try:
        yield
    finally:
        sweeper.cancel()
        uploads.close()


router = APIRouter(tags=["MONAI Label (3D Slicer)"], lifespan=_lifespan)


def _states(request: Request) -> tuple[ServerState, MonaiLabelState]:
    return request.app.state.vista3d, request.app.state.monailabel


def _owner(request: Request, params: dict[str, Any]) -> tuple[str, str]:
    """Whose datastore an image id names: the client's address and its ``client_id`` (two users of one machine keep
    their images apart; the queue's share and the sessions' cap are the address's, as on the NIM's endpoints)."""
    return (client_of(request), str(params.get("client_id", "")))


async def _small_body(request: Request) -> bytes:
    return await read_limited(request, _MAX_SMALL_BODY, f"this request's body may be at most {_MAX_SMALL_BODY} bytes")


async def _form(request: Request, call: Call, file_field: str, text_fields: tuple[str, ...],
                required: bool) -> FormData:
    """The request's form: multipart (the file streamed to the scratch folder), url-encoded, or none."""
    ctype = media_type(request)
    if ctype == "multipart/form-data":
        return await receive_form(request, call.folder / "upload", file_field, text_fields)
    if required:
        raise ServeError(415, f"send the image as multipart/form-data (its file in the field {file_field!r})")
    body = await _small_body(request)
    if ctype == "application/x-www-form-urlencoded":
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        unknown = set(fields) - set(text_fields)
        if unknown:
            raise ServeError(422, f"unknown form field {min(unknown)!r}: the fields are "
                                  f"{', '.join(text_fields)}")
        return FormData({k: v[-1] for k, v in fields.items()})
    if body.strip():
        raise ServeError(415, "send the parameters as multipart/form-data (a field 'params' holding a JSON object)")
    return FormData()


def _image_id(text: str) -> str:
    if not text or len(text) > 256 or any(ord(c) < 32 for c in text):
        raise ServeError(422, "the image id must be 1 to 256 printable characters")
    return text


def _session_info(upload: Upload, store: UploadStore) -> dict[str, Any]:
    return {"name": upload.image_id, "image": upload.name, "format": upload.format,
            "create_ts": int(upload.created), "expiry": round(store.expires_in(upload))}


# ------------------------------------------------------------------------------- bodies, for the schema
def _form_body(media: str, fields: dict[str, dict[str, Any]], required: tuple[str, ...] = (),
               examples: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a form with these ``fields`` and whole-body ``examples`` (the endpoints read
    their bodies themselves, so FastAPI cannot see them; schema-driven clients and fuzzers read them here)."""
    schema: dict[str, Any] = {"type": "object", "properties": fields}
    if required:
        schema["required"] = list(required)
    content: dict[str, Any] = {"schema": schema}
    if examples:
        content["examples"] = {name: {"value": value} for name, value in examples.items()}
    return {"requestBody": {"required": bool(required), "content": {media: content}}}


def _file(text: str) -> dict[str, Any]:
    return {"type": "string", "format": "binary", "description": text}


def _params(text: str) -> dict[str, Any]:
    return {"type": "string", "contentMediaType": "application/json", "description": f"a JSON object: {text}"}


_IMAGE_FILE = "the image: NIfTI (.nii.gz, .nii) or NRRD"
_LOGIN_BODY = _form_body("application/x-www-form-urlencoded", {
    "username": {"type": "string", "description": "any name"},
    "password": {"type": "string", "description": "the server's token (--token)"},
    "grant_type": {"type": "string", "description": "password"}}, ("password",))
_TRAIN_BODY = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "description": "a training's parameters (training is not offered: always 404)"}}}}}
_LABEL_BODY = _form_body("multipart/form-data", {
    "label": _file("a label map (saving labels is not offered: always 404)"),
    "params": _params("the label's info")}, ("label",))
_UPLOAD_BODY = _form_body("multipart/form-data", {
    "file": _file(_IMAGE_FILE), "params": _params('{"client_id": "<the client\'s id>"}')}, ("file",))
_SESSION_BODY = _form_body("multipart/form-data", {
    "files": _file(_IMAGE_FILE), "client_id": {"type": "string", "description": "the client's id"}}, ("files",))
_INFER_BODY = _form_body("multipart/form-data", {
    "params": _params('vista3d: {"classes": "everything" or names / ids}; vista3d_clicks: {"label": name, '
                      '"foreground": [[i, j, k], ...], "background": [...], "reset_state": false}; both: '
                      '"result_extension" (.nrrd, .nii.gz, .nii), "result_dtype", "client_id"'),
    "file": _file("vista3d only: the image itself, for this request alone (else ?image= or ?session_id=)")},
    examples={"automatic": {"params": json.dumps({"classes": "liver", "result_extension": ".nii.gz"})},
              "clicks": {"params": json.dumps({"label": "liver", "foreground": [[10, 10, 10]], "background": [],
                                               "result_extension": ".nii.gz"})}})


# ------------------------------------------------------------------------------------------ login, app
@router.get("/auth/")
async def auth(request: Request) -> dict:
    """Whether a login is needed (the server has a token)."""
    return {"enabled": _states(request)[0].settings.token is not None}


@router.post("/auth/token", openapi_extra=_LOGIN_BODY)
async def auth_token(request: Request) -> dict:
    """Trade the login form (any user name; the server's token as the password) for the bearer token."""
    token = _states(request)[0].settings.token
    if token is None:
        raise ServeError(404, "this server has no token (authentication is off): connect without logging in")
    fields = parse_qs((await _small_body(request)).decode("utf-8", "replace"))
    password = (fields.get("password") or [""])[-1]
    if not hmac.compare_digest(password.encode(), token.encode()):
        raise ServeError(401, "wrong password: log in with the server's token (--token or VISTA3D_SERVE_TOKEN) as "
                              "the password", {"WWW-Authenticate": "Bearer"})
    return {"access_token": token, "token_type": "Bearer"}


@router.get("/auth/token/valid")
async def auth_token_valid(request: Request) -> dict:
    """200 when the request's ``Authorization`` carries the server's token (or the server has none), else 401."""
    token = _states(request)[0].settings.token
    given = request.headers.get("authorization", "").encode()
    if token is not None and not holds_token(given, token.encode()):
        raise ServeError(401, "the bearer token is missing or wrong: log in again", {"WWW-Authenticate": "Bearer"})
    return {}


@router.get("/info/")
async def info(request: Request) -> dict:
    """The app: its label names and two models (``vista3d`` automatic, ``vista3d_clicks`` 3D clicks)."""
    from monai import __version__

    return mj.app_info(__version__, len(_states(request)[1].uploads))


@router.get("/train/")
@router.post("/train/", openapi_extra=_TRAIN_BODY)
@router.delete("/train/")
async def train(request: Request) -> Response:
    """Training is not offered (404: also ``check_if_running``, which reads only 200 as "running")."""
    raise ServeError(404, _NOT_TRAINED)


@router.post("/train/{model}", openapi_extra=_TRAIN_BODY)
async def train_model(model: str, request: Request) -> Response:
    """Training is not offered, for any model (404)."""
    raise ServeError(404, _NOT_TRAINED)


@router.put("/datastore/label", openapi_extra=_LABEL_BODY)
async def save_label(request: Request) -> Response:
    raise ServeError(404, "saving labels on the server is not offered: save the segmentation in 3D Slicer itself")


# ----------------------------------------------------------------------------------------------- images
async def _receive_upload(request: Request, file_field: str, text_fields: tuple[str, ...],
                          key_of: Callable[[FormData], tuple[Hashable, str]]) -> Upload:
    """Store the image of an upload form (the file in ``file_field``) under the key and image id ``key_of`` reads
    from the form. The whole body arrives first (within --body-timeout), as on the NIM's endpoints; only then does
    the file's check take a place in the queue (429 when full, or when this client holds its share)."""
    state, ml = _states(request)
    state.worker.check_ready()  # 503 before the body is read
    async with state.call(request) as call:
        form = await _form(request, call, file_field, text_fields, required=True)
        call.body_received()
        if form.file is None:
            raise ServeError(422, f"the form has no complete {file_field!r} part: send the image in the field "
                                  f"{file_field!r}")
        key, image_id = key_of(form)
        async with state.worker.reserve(client_of(request)):
            fmt = await call.image_format(form.file, state.settings.limits.max_voxels)
        return ml.uploads.put(key, form.file, fmt, safe_stem(form.filename or image_id), image_id, client_of(request))


@router.put("/datastore/", openapi_extra=_UPLOAD_BODY)
@router.put("/datastore/image", openapi_extra=_UPLOAD_BODY)
async def upload_image(request: Request, image: str | None = None) -> dict:
    """Store an image under ``image`` (default: the file's name) for this client's later ``/infer/`` requests."""

    def key_of(form: FormData) -> tuple[Hashable, str]:
        params = mj.parse_params(form.fields.get("params"))
        image_id = _image_id(image or safe_stem(form.filename or ""))
        return (_owner(request, params), image_id), image_id

    upload = await _receive_upload(request, "file", ("params",), key_of)
    return {"image": upload.image_id}


@router.put("/session/", openapi_extra=_SESSION_BODY)
async def create_session(request: Request) -> dict:
    """Store an image under a new session id (``/infer/...&session_id=<id>`` segments it)."""

    def key_of(form: FormData) -> tuple[Hashable, str]:
        sid = secrets.token_urlsafe(16)
        return _session_key(request, sid)[0], sid

    upload = await _receive_upload(request, "files", ("client_id",), key_of)
    return {"session_id": upload.image_id, "session_info": _session_info(upload, _states(request)[1].uploads)}


def _session_key(request: Request, session_id: str) -> tuple[tuple[str, str, str], str, str]:
    """``(key, what, how)`` of the session ``session_id`` of the request's client (another client's is not found)."""
    key = ("session", client_of(request), session_id)
    return key, f"session {session_id[:64]!r}", "create a new one with PUT /session/"


@router.get("/session/{session_id}")
async def session_info(session_id: str, request: Request, image: bool = False) -> dict:
    """The session's image and its time left (404 for an id never issued, 410 for one that ended)."""
    if image:
        raise ServeError(422, "a session's image is not sent back (the client has it); leave out image=true")
    uploads = _states(request)[1].uploads
    return _session_info(uploads.get(*_session_key(request, session_id)), uploads)


@router.delete("/session/{session_id}")
async def delete_session(session_id: str, request: Request) -> dict:
    """End the session: its image and its click sessions are gone."""
    uploads = _states(request)[1].uploads
    return _session_info(uploads.remove(*_session_key(request, session_id)), uploads)


# ------------------------------------------------------------------------------------------------ infer
def _upload_key(request: Request, params: dict[str, Any], image: str, session_id: str) -> tuple[Any, str, str]:
    """``(key, what, how)`` of the image a request names, for :meth:`UploadStore.use`."""
    if session_id:
        return _session_key(request, session_id)
    if image:
        how = f"upload it first with PUT /datastore/?image={quote_plus(image)}"
        return (_owner(request, params), image), f"image {image[:64]!r}", how
    raise ServeError(422, "name the image: ?image=<id> of an image uploaded with PUT /datastore/?image=<id>, or "
                          "?session_id=<id> of PUT /session/")


def _multipart(params: dict, path: Path, filename: str, call: Call) -> Response:
    """The answer MONAI Label clients read by default: a ``params`` JSON part, then the file's part."""
    boundary = secrets.token_hex(16)
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"params\"\r\nContent-Type: application/json\r\n"
            f"\r\n{json.dumps(params)}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; "
            f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body():
        yield head
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk
        yield tail

    length = len(head) + path.stat().st_size + len(tail)
    return StreamingResponse(body(), media_type=f"multipart/form-data; boundary={boundary}",
                             headers={"Content-Length": str(length)}, background=call.after_sent())


def _answer(call: Call, output: str | None, params: dict, path: Path, filename: str) -> Response:
    """The answer ``output`` asks for (the scratch folder stays until a file in it is sent)."""
    if output == "json":
        return JSONResponse(params)
    if output == "image":
        return call.file_answer(path, filename)
    return _multipart(params, path, filename, call)


@router.post("/infer/{model}", openapi_extra=_INFER_BODY)
async def infer(model: Annotated[str, PathParam(examples=[mj.AUTO_MODEL, mj.CLICK_MODEL])], request: Request,
                image: Annotated[str, Query(examples=["CTChest"])] = "", session_id: str = "",
                output: str | None = None) -> Response:
    """Segment an uploaded image: automatically (``vista3d``) or from the points on one segment
    (``vista3d_clicks``, successive requests continuing one click session)."""
    mj.check_model(model)
    if output is not None and output not in _OUTPUTS:
        raise ServeError(422, f"output={output!r} is not offered; leave it out (multipart), or use image or json")
    state = _states(request)[0]
    state.worker.check_ready()  # 503 before the body is read
    async with state.call(request) as call:
        # the whole body first (within --body-timeout), checked; only then a place in the queue (429 when full)
        form = await _form(request, call, "file", ("params",), required=False)
        call.body_received()
        params = mj.parse_params(form.fields.get("params"), model)
        check_sizes(state.settings.limits, *mj.prompt_sizes(params))  # 413 naming --max-points / --max-classes
        if model == mj.AUTO_MODEL:
            answer, path, name = await _automatic(request, call, params, form, image, session_id)
        else:
            if form.file is not None:
                raise ServeError(422, "the click model works on an uploaded image: upload it with PUT "
                                      "/datastore/?image=<id>, then send ?image=<id> without a file")
            answer, path, name = await _clicks(request, call, params, image, session_id)
        return _answer(call, output, answer, path, name)


async def _automatic(request: Request, call: Call, params: dict, form: FormData, image: str, session_id: str
                     ) -> tuple[dict, Path, str]:
    state, ml = _states(request)
    req = mj.auto_request(params)
    # the image itself, for this request only, or an upload (held until the answer is written)
    held = nullcontext(None) if form.file is not None else ml.uploads.use(
        *_upload_key(request, params, image, session_id))
    with held as upload:
        async with state.worker.reserve(client_of(request)) as slot:
            source = upload
            if source is None:  # nothing is held: the request brought its image
                assert form.file is not None, "an upload is held for every request without its own image"
                source = Upload("file", "file", form.file, await call.image_format(
                    form.file, state.settings.limits.max_voxels), safe_stem(form.filename or "image"))
            result = mj.result_format(params, source.format)
            job = mj.segment(source.path, source.format, source.name, req.prompt)
            labels, loaded, timings = await slot.run(job, call.deadline, call.gone())
            values = await run_in_threadpool(mj.renumber, labels, req.label_names, req.label_ids)
            name = f"{source.name}_vista3d{result.suffix}"
            path = await run_in_threadpool(mj.write_result, values, loaded, call.folder / name, result)
    return {"label_names": req.label_names, "latencies": {k: round(v, 4) for k, v in timings.items()}}, path, name


async def _clicks(request: Request, call: Call, params: dict, image: str, session_id: str) -> tuple[dict, Path, str]:
    state, ml = _states(request)
    req = mj.click_request(params)
    with ml.uploads.use(*_upload_key(request, params, image, session_id)) as source:
        result = mj.result_format(params, source.format)
        key = (_owner(request, params), source.token, req.label)
        async with state.worker.reserve(client_of(request)) as slot:
            async with ml.clicks.serialized(key):
                entry = await _click(call, slot, ml.clicks, key, req, source, client_of(request))
                values, loaded, clicked = entry.answer, entry.image, len(entry.foreground) + len(entry.background)
                latencies = {k: round(v, 4) for k, v in entry.latencies.items()}
            name = f"{source.name}_{safe_stem(req.label)}{result.suffix}"
            path = await run_in_threadpool(mj.write_result, values, loaded, call.folder / name, result)
    return {"label_names": {req.label: 1}, "clicks": clicked, "latencies": latencies}, path, name


async def _click(call: Call, slot: Any, clicks: ClickSessions, key: Any, req: mj.ClickRequest, source: Upload,
                 client: str) -> ClickEntry:
    """Continue (or start) the key's click session with the request's new points; the entry with its answer. A new
    session is ``client``'s: it counts against that address's --max-sessions-per-client, as the NIM's sessions."""
    entry = clicks.find(key)
    step = None if entry is None or req.reset else mj.new_clicks(entry.foreground, entry.background, req)
    if entry is not None and step == ([], []):  # (a step is only computed for an entry)
        entry.latencies = {}
        return entry  # no new point: the last answer again
    points, labels = step or ([list(p) for p in req.foreground + req.background],
                              [1] * len(req.foreground) + [0] * len(req.background))
    if not points:
        raise ServeError(422, f"no points on segment {req.label!r}: place a foreground point on the object")
    try:
        if entry is None:
            start = mj.first_click(source.path, source.format, source.name, points, labels, req.class_id)
            session, loaded, label_map = await slot.run(start, call.deadline, call.gone())
            entry = ClickEntry(session=session, image=loaded, owner=client)
            clicks.add(key, entry)
        else:
            more = mj.click(entry.session, points, labels, req.class_id, reset=step is None)
            label_map = await slot.run(more, call.deadline, call.gone())
        entry.latencies = dict(entry.session.timings)  # the click's stages, read before the key's next turn
        entry.answer = entry.previous = await run_in_threadpool(mj.object_mask, label_map)
    except BaseException:
        clicks.drop(key)  # the session may hold clicks its bookkeeping does not: the next request starts again
        raise
    entry.foreground, entry.background = list(req.foreground), list(req.background)
    return entry
