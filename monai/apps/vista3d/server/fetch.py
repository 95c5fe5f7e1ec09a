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
"""Where a request's image comes from, and the rules it must pass before a byte is read.

Three sources: an ``http(s)`` URL (:func:`download`), a path under ``--data-dir`` (:func:`confined_path`), and an
upload in a ``multipart/form-data`` body (:func:`receive_form`). The rules: URLs only over http(s), only to hosts
of ``--allow-url-host``, never to private, loopback or link-local addresses unless ``--allow-private-urls``
(checked on the resolved address, which is the one connected to, so a name cannot change its answer in between),
redirects only to the same host, at most ``--max-download-mb``; paths only inside ``--data-dir`` after every
symlink is resolved, without ``..``; uploads and downloads streamed to a file, never held in memory.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urljoin, urlsplit

from .errors import ServeError
from .images import safe_stem
from .settings import ServerSettings

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

__all__ = ["confined_path", "check_url", "download", "receive_form", "FormData", "has_scheme"]

_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5
_MAX_FIELD = 64 << 10  # bytes of a text field of a form
_MAX_PARTS = 8
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def has_scheme(text: str) -> bool:
    """True for ``scheme:...`` (a URL), False for a path."""
    return bool(_SCHEME.match(text))


# ---------------------------------------------------------------------------------------- server paths
def confined_path(data_dir: Path | None, text: str, what: str, kind: str = "file") -> Path:
    """The real path of ``text`` (absolute, or relative to ``data_dir``) when it lies inside ``data_dir``.

    Args:
        data_dir: the real path of ``--data-dir`` (None: server-side paths are refused).
        text: the path the request gave.
        what: its name in the messages (``image``, ``local_working_dir``).
        kind: ``"file"`` (an existing regular file) or ``"dir"`` (an existing folder).
    """
    if data_dir is None:
        raise ServeError(403, f"server-side paths are off: give the {what} as a URL or upload it, or start the "
                              "server with --data-dir FOLDER")
    if not text or "\x00" in text:
        raise ServeError(422, f"{what}: an empty or malformed path")
    given = Path(text)
    if ".." in given.parts:
        raise ServeError(403, f"{what} {text!r}: '..' is not allowed; give a path inside --data-dir")
    real = Path(os.path.realpath(given if given.is_absolute() else data_dir / given))
    if real != data_dir and data_dir not in real.parents:
        raise ServeError(403, f"{what} {text!r} lies outside --data-dir (symlinks are followed); give a path inside it")
    if kind == "dir":
        if not real.is_dir():
            raise ServeError(422, f"{what} {text!r}: no such folder under --data-dir")
    elif real.is_dir():
        raise ServeError(415, f"{what} {text!r} is a folder (a DICOM series?): give one .nii.gz, .nii or .nrrd file")
    elif not real.is_file():
        raise ServeError(422, f"{what} {text!r}: no such file under --data-dir")
    return real


# ------------------------------------------------------------------------------------------------ URLs
def _port(parts: SplitResult) -> int:
    try:
        port = parts.port
    except ValueError:
        raise ServeError(422, f"image URL {parts.geturl()!r} has a bad port") from None
    return port or (443 if parts.scheme == "https" else 80)


def _rule_matches(rule: str, host: str, port: int) -> bool:
    ruled = urlsplit("//" + rule)
    r_host, r_port = ruled.hostname or "", ruled.port
    if r_port is not None and r_port != port:
        return False
    if r_host.startswith("*."):
        return host.endswith(r_host[1:])
    return host == r_host


def check_url(url: str, settings: ServerSettings) -> SplitResult:
    """Refuse a URL the server must not fetch (scheme, credentials, a host not allowed); its parts otherwise."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        raise ServeError(403, "file:// URLs are not accepted: put the image under --data-dir and give its path")
    if scheme not in ("http", "https"):
        raise ServeError(422, f"image URL scheme {scheme!r} is not fetched: give an http(s) URL, a path under "
                              "--data-dir, or upload the file")
    if parts.username is not None or parts.password is not None:
        raise ServeError(422, "image URLs with credentials (user:password@) are not accepted")
    host = (parts.hostname or "").lower()
    if not host:
        raise ServeError(422, f"image URL {url!r} names no host")
    port = _port(parts)
    # the whole advice: a loopback or private host (a file server on this machine) also needs --allow-private-urls
    private = "" if settings.allow_private_urls or not _names_private(host) else " --allow-private-urls"
    if not settings.allow_url_hosts:
        raise ServeError(403, f"image URLs are off on this server: start it with --allow-url-host {host}{private} (or "
                              "send the image as an upload or a path under --data-dir)")
    if not any(_rule_matches(rule, host, port) for rule in settings.allow_url_hosts):
        raise ServeError(403, f"image URL host {host}:{port} is not allowed: start the server with --allow-url-host "
                              f"{host}{private} (allowed now: {', '.join(settings.allow_url_hosts)})")
    return parts


def _names_private(host: str) -> bool:
    """Whether ``host`` plainly names this machine or a private network (``localhost``, an address literal that is not
    public); a name's addresses are checked when it resolves."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    return not (getattr(ip, "ipv4_mapped", None) or ip).is_global


async def _resolve(host: str, port: int, allow_private: bool) -> str:
    """An address of ``host`` to connect to; every address it has must be public unless private ones are allowed."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ServeError(422, f"image URL host {host!r} does not resolve ({e.strerror})") from None
    addresses = [str(info[4][0]) for info in infos]  # (an int only for address families other than IP)
    for text in addresses:
        ip = ipaddress.ip_address(text.split("%")[0])
        ip = getattr(ip, "ipv4_mapped", None) or ip
        if not ip.is_global and not allow_private:
            raise ServeError(403, f"image URL host {host!r} resolves to the non-public address {ip}; such addresses "
                                  "are refused unless the server runs with --allow-private-urls")
    return addresses[0]


async def _fetch_once(client: Any, parts: SplitResult, address: str, dest: Path, limit: int) -> str | None:
    """GET one URL at ``address``: None when the file is written, the redirect target otherwise."""
    port = _port(parts)
    literal = f"[{address}]" if ":" in address else address
    target = parts._replace(netloc=f"{literal}:{port}", fragment="").geturl()
    headers = {"Host": parts.netloc, "Accept-Encoding": "identity", "User-Agent": "vista3d-serve"}
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    host = parts.hostname
    async with client.stream("GET", target, headers=headers, extensions=extensions) as resp:
        if resp.status_code in _REDIRECTS:
            location = resp.headers.get("location")
            if not location:
                raise ServeError(422, f"{host} answered a redirect without a Location")
            return urljoin(parts.geturl(), str(location))
        if resp.status_code != 200:
            raise ServeError(422, f"could not fetch the image: {host} answered {resp.status_code} "
                                  f"{resp.reason_phrase}")
        size = resp.headers.get("content-length", "")
        if size.isdigit() and int(size) > limit:
            raise ServeError(413, f"the image at {host} is {int(size)} bytes, more than --max-download-mb allows")
        total = 0
        with open(dest, "wb") as f:
            async for chunk in resp.aiter_raw():  # raw: a Content-Encoding is never inflated here
                total += len(chunk)
                if total > limit:
                    raise ServeError(413, f"the image at {host} is larger than --max-download-mb allows")
                f.write(chunk)
    return None


async def download(url: str, dest: Path, settings: ServerSettings) -> str:
    """Fetch ``url`` into ``dest`` under the rules of the module; returns the name for the answer's file."""
    import httpx

    limit = settings.limits.max_download_bytes
    parts = check_url(url, settings)
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                 timeout=httpx.Timeout(60.0, connect=10.0)) as client:
        for _ in range(_MAX_REDIRECTS + 1):
            assert parts.hostname, "check_url refuses a URL without a host"
            address = await _resolve(parts.hostname, _port(parts), settings.allow_private_urls)
            try:
                nxt = await _fetch_once(client, parts, address, dest, limit)
            except httpx.HTTPError as e:
                raise ServeError(422, f"could not fetch the image from {parts.hostname}: {type(e).__name__} "
                                      f"{e}".strip()) from None
            if nxt is None:
                return safe_stem(parts.path)
            moved = check_url(nxt, settings)
            if (moved.scheme, moved.hostname, _port(moved)) != (parts.scheme, parts.hostname, _port(parts)):
                raise ServeError(403, f"the image URL redirects to another host or scheme ({moved.scheme}://"
                                      f"{moved.hostname}); give the final URL")
            parts = moved
    raise ServeError(422, f"the image URL redirects more than {_MAX_REDIRECTS} times")


# ---------------------------------------------------------------------------------------------- uploads
@dataclass
class FormData:
    """A parsed ``multipart/form-data`` body: its text fields and the one uploaded file (already on disk)."""

    fields: dict[str, str] = field(default_factory=dict)
    file: Path | None = None
    filename: str | None = None


class _FormSink:
    """python-multipart callbacks: the file part goes to disk as it arrives, text parts to small buffers."""

    def __init__(self, dest: Path, file_field: str, text_fields: tuple[str, ...]):
        self.dest, self.file_field, self.text_fields = dest, file_field, text_fields
        self.form = FormData()
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, bytes] = {}
        self._name: str | None = None
        self._out: Any = None
        self._text = bytearray()
        self._parts = 0
        self._seen_file = False

    def on_part_begin(self) -> None:
        self._parts += 1
        if self._parts > _MAX_PARTS:
            raise ServeError(400, f"the form has more than {_MAX_PARTS} parts")
        self._headers, self._name, self._text = {}, None, bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[bytes(self._header_name).decode("latin-1").lower()] = bytes(self._header_value)
        self._header_name, self._header_value = bytearray(), bytearray()

    def on_headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, params = parse_options_header(self._headers.get("content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        if name == self.file_field:
            if self._seen_file:
                raise ServeError(400, f"the form has two '{self.file_field}' parts; send one file")
            self._seen_file = True
            self.form.filename = params.get(b"filename", b"").decode("utf-8", "replace") or None
            self._out = open(self.dest, "wb")
        elif name in self.text_fields:
            if name in self.form.fields:
                raise ServeError(400, f"the form has two '{name}' parts")
        else:
            allowed = ", ".join((self.file_field, *self.text_fields))
            raise ServeError(422, f"unknown form field {name!r}: the fields are {allowed}")
        self._name = name

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._out is not None:
            self._out.write(data[start:end])
            return
        self._text += data[start:end]
        if len(self._text) > _MAX_FIELD:
            raise ServeError(413, f"form field {self._name!r} is longer than {_MAX_FIELD} bytes")

    def on_part_end(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
            self.form.file = self.dest  # only a part that ended: a cut-off upload is no file
        elif self._name is not None:
            self.form.fields[self._name] = self._text.decode("utf-8", "replace")

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


async def receive_form(request: Any, dest: Path, file_field: str, text_fields: tuple[str, ...]) -> FormData:
    """Read a ``multipart/form-data`` body, writing the ``file_field`` part to ``dest`` as it arrives."""
    from python_multipart.exceptions import MultipartParseError
    from python_multipart.multipart import MultipartParser, parse_options_header

    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise ServeError(400, "a multipart/form-data body needs a boundary in its Content-Type")
    sink = _FormSink(dest, file_field, text_fields)
    callbacks: MultipartCallbacks = {
        "on_part_begin": sink.on_part_begin, "on_header_field": sink.on_header_field,
        "on_header_value": sink.on_header_value, "on_header_end": sink.on_header_end,
        "on_headers_finished": sink.on_headers_finished, "on_part_data": sink.on_part_data,
        "on_part_end": sink.on_part_end}
    parser = MultipartParser(boundary, callbacks)
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as e:
        raise ServeError(400, f"malformed multipart/form-data body ({e})") from None
    finally:
        sink.close()
    return sink.form
