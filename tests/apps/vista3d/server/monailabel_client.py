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
"""A MONAI Label client that sends what 3D Slicer's MONAI Label module sends, written here from the protocol.

The module talks plain ``http.client`` for most calls and builds its multipart bodies by hand: a fixed boundary
that ends in ``$``, CRLF lines, each text field as ``Content-Disposition: form-data; name="..."``, the file part with
the *local path* as its ``filename`` and a content type guessed from it. Session uploads go through a standard
multipart encoder (field ``files``, the client id as a plain form field). It sends ``client_id`` with every request,
``result_extension`` ``.nrrd`` and ``result_dtype`` ``uint8`` with every inference, and after a login ``Authorization:
<token_type> <access_token>``. It reads an inference's answer as a multipart message: the ``params`` part (JSON) and
the part that has a file name. Nothing here imports the server.
"""

from __future__ import annotations

import email.parser
import email.policy
import http.client
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, urlencode, urlsplit

import httpx

__all__ = ["SlicerLikeClient", "Answer", "Reply", "parse_multipart", "hand_built_multipart"]

#: a boundary of the shape the module uses: long, mixed case, and a '$' (legal, but not a usual token character)
BOUNDARY = "----------sLiCeR_sTyLe_bOuNdArY_$"


@dataclass
class Reply:
    """An HTTP answer: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Answer:
    """An inference's multipart answer: its ``params`` JSON, and the file part's name and bytes."""

    params: dict[str, Any]
    filename: str
    data: bytes


def hand_built_multipart(fields: dict[str, str], files: dict[str, Path]) -> tuple[str, bytes]:
    """``(content type, body)`` of a form built line by line, as the module builds it."""
    lines: list[bytes] = []
    for name, value in fields.items():
        lines += [f"--{BOUNDARY}".encode(), f'Content-Disposition: form-data; name="{name}"'.encode(), b"",
                  value.encode()]
    for name, path in files.items():
        kind = mimetypes.guess_type(str(path))[0] or "application/octet-stream"
        disposition = f'Content-Disposition: form-data; name="{name}"; filename="{path}"'
        lines += [f"--{BOUNDARY}".encode(), disposition.encode(), f"Content-Type: {kind}".encode(), b"",
                  Path(path).read_bytes()]
    lines += [f"--{BOUNDARY}--".encode(), b""]
    return f"multipart/form-data; boundary={BOUNDARY}", b"\r\n".join(lines)


def parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    """``(text fields, files by file name)`` of a multipart body, read with the standard library's MIME parser."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    if not message.is_multipart():
        raise ValueError(f"not a multipart message: {content_type}")
    fields, files = {}, {}
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        if part.get_filename():
            files[part.get_filename()] = payload
        else:
            fields[part.get_param("name", header="content-disposition")] = payload.decode()
    return fields, files


class SlicerLikeClient:
    """The module's calls against ``url``.

    Args:
        url: ``http://host:port``.
        client_id: the module's "Client/User-ID" setting.
        source: the local address to connect from (another loopback address is another client machine).
    """

    def __init__(self, url: str, client_id: str = "user-xyz", source: str | None = None):
        self.url = url.rstrip("/")
        self.client_id = client_id
        self.source = source
        self.headers: dict[str, str] = {}
        parts = urlsplit(self.url)
        self._host, self._port = parts.hostname, parts.port

    def request(self, method: str, selector: str, body: bytes | None = None, content_type: str | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        """One request on a new ``http.client`` connection, as the module sends them."""
        sent = dict(self.headers if headers is None else headers)
        if body is not None:
            sent.update({"content-type": content_type or "text/plain", "content-length": str(len(body))})
        conn = http.client.HTTPConnection(self._host, self._port, timeout=300,
                                          source_address=(self.source, 0) if self.source else None)
        try:
            conn.request(method, selector, body=body, headers=sent)
            response = conn.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            conn.close()

    # ------------------------------------------------------------------------------------------ login, app
    def auth_enabled(self) -> bool:
        reply = self.request("GET", "/auth/", headers={})
        return reply.status == 200 and bool(reply.json().get("enabled"))

    def login(self, username: str, password: str) -> Reply:
        """Trade the login for a token; on success later requests carry it."""
        form = urlencode({"username": username, "password": password, "grant_type": "password"}).encode()
        reply = self.request("POST", "/auth/token", form, "application/x-www-form-urlencoded", headers={})
        if reply.status == 200:
            token = reply.json()
            self.headers["Authorization"] = f"{token['token_type']} {token['access_token']}"
        return reply

    def token_valid(self) -> bool:
        return self.request("GET", "/auth/token/valid").status == 200

    def info(self) -> Reply:
        return self.request("GET", "/info/")

    def training_running(self) -> bool:
        return self.request("GET", "/train/?check_if_running=true").status == 200

    # ----------------------------------------------------------------------------------------------- images
    def upload_image(self, path: Path, image_id: str, route: str = "/datastore/") -> Reply:
        """``PUT /datastore/?image=<id>`` with the hand-built form (``params`` JSON, the file in ``file``)."""
        ctype, body = hand_built_multipart({"params": json.dumps({"client_id": self.client_id})}, {"file": path})
        return self.request("PUT", f"{route}?image={quote_plus(image_id)}", body, ctype)

    def create_session(self, path: Path) -> Reply:
        """``PUT /session/`` through a standard multipart encoder: the file as ``files``, the client id beside it."""
        transport = httpx.HTTPTransport(local_address=self.source) if self.source else None
        with open(path, "rb") as f, httpx.Client(transport=transport, timeout=300) as http:
            response = http.put(f"{self.url}/session/", files=[("files", (Path(path).name, f))],
                                data={"client_id": self.client_id}, headers=self.headers)
        return Reply(response.status_code, dict(response.headers), response.content)

    def get_session(self, session_id: str) -> Reply:
        return self.request("GET", f"/session/{quote_plus(session_id)}")

    def remove_session(self, session_id: str) -> Reply:
        return self.request("DELETE", f"/session/{quote_plus(session_id)}")

    # ------------------------------------------------------------------------------------------------ infer
    def infer_reply(self, model: str, image_id: str, params: dict[str, Any], session_id: str | None = None,
                    output: str | None = None) -> Reply:
        """``POST /infer/<model>?image=<id>`` with the module's parameters added; the raw reply."""
        params = {**params, "client_id": self.client_id, "result_extension": params.get("result_extension", ".nrrd"),
                  "result_dtype": params.get("result_dtype", "uint8")}
        selector = f"/infer/{quote_plus(model)}?image={quote_plus(image_id)}"
        if session_id:
            selector += f"&session_id={quote_plus(session_id)}"
        if output:
            selector += f"&output={quote_plus(output)}"
        ctype, body = hand_built_multipart({"params": json.dumps(params)}, {})
        return self.request("POST", selector, body, ctype)

    def infer(self, model: str, image_id: str, params: dict[str, Any], session_id: str | None = None) -> Answer:
        """An inference read as the module reads it; raises on any status but 200 or a single-file answer."""
        reply = self.infer_reply(model, image_id, params, session_id)
        if reply.status != 200:
            raise RuntimeError(f"infer answered {reply.status}: {reply.body[:300]!r}")
        fields, files = parse_multipart(reply.headers["content-type"], reply.body)
        if len(files) != 1:
            raise RuntimeError(f"the answer holds {len(files)} files")
        (filename, data), = files.items()
        return Answer(json.loads(fields["params"]), filename, data)
