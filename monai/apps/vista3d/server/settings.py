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
"""What ``vista3d serve`` was told, checked once where the server starts: three small frozen objects.

:class:`ModelSettings` says which network to build, :class:`Limits` bounds what one request may cost, and
:class:`ServerSettings` holds them with the address and the security rules. Every field is checked when the
object is made (a ``ValueError`` that names the flag); the server reads only these objects afterwards.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monai.apps.vista3d.core.job import SegmentJob

__all__ = ["Limits", "ServerSettings", "is_loopback", "TOKEN_ENV"]

#: the environment variable read for the bearer token when ``--token`` is not given (a flag shows in ``ps``)
TOKEN_ENV = "VISTA3D_SERVE_TOKEN"

_MIB = 1 << 20


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine only (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve to a public interface


@dataclass(frozen=True)
class Limits:
    """What one request may cost; a request over a limit gets a 4xx that names the flag to raise.

    Attributes:
        max_body_bytes: request body (an upload included).
        max_download_bytes: an image fetched from a URL.
        max_voxels: voxels of an image, read from its header before anything is inflated.
        max_points: point prompts of one request, and of one click session's object (each point is a window and
            every window sees every point: the cost grows with the square).
        max_classes: entries of one request's class list.
        queue_size: requests that may wait behind the one the model is running (more get 429).
        request_timeout: seconds from a request's body having arrived to its answer (more: 504, and its work is
            dropped).
        body_timeout: seconds a request's headers may take, and its body per MiB (at least this long for any
            body): a body must arrive before the request takes a place in the queue; a slower one gets 408.
        keep_alive: seconds an idle connection is kept after an answer.
        shutdown_timeout: seconds the running job may take to finish once the server is told to stop (SIGTERM);
            then it is cancelled. Waiting requests are answered 503 at once, and every request by this time plus
            two seconds.
        max_connections: connections open at once (more: 503 and closed).
        max_connections_per_client: connections from one address at once (default a quarter of
            ``max_connections``).
        max_queue_per_client: queue places (running or waiting) one client may hold at once (default half of
            ``queue_size + 1``, rounded up); a client is its address.
        max_sessions_per_client: click sessions one client may hold (default half of ``max_sessions``, rounded
            up); a new one past it evicts that client's least recently used, never another's.
        session_ttl: seconds a click session lives after its last use.
        max_sessions: sessions held at once (the least recently used is evicted for a new one).
    """

    max_body_bytes: int = 1024 * _MIB
    max_download_bytes: int = 1024 * _MIB
    max_voxels: int = 1 << 30
    max_points: int = 64
    max_classes: int = 132
    queue_size: int = 8
    request_timeout: float = 600.0
    session_ttl: float = 1800.0
    max_sessions: int = 8
    shutdown_timeout: float = 10.0
    body_timeout: float = 5.0
    keep_alive: float = 5.0
    max_connections: int = 100
    max_connections_per_client: int | None = None
    max_queue_per_client: int | None = None
    max_sessions_per_client: int | None = None

    def __post_init__(self) -> None:
        derived = {"max_connections_per_client": max(1, self.max_connections // 4),
                   "max_queue_per_client": max(1, -(-(self.queue_size + 1) // 2)),
                   "max_sessions_per_client": max(1, -(-self.max_sessions // 2))}
        for name, value in derived.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        for name, flag in (("max_body_bytes", "--max-body-mb"), ("max_download_bytes", "--max-download-mb"),
                           ("max_voxels", "--max-voxels"), ("max_sessions", "--max-sessions"),
                           ("max_points", "--max-points"), ("max_classes", "--max-classes"),
                           ("max_connections", "--max-connections"),
                           ("max_connections_per_client", "--max-connections-per-client"),
                           ("max_queue_per_client", "--max-queue-per-client"),
                           ("max_sessions_per_client", "--max-sessions-per-client")):
            if getattr(self, name) < 1:
                raise ValueError(f"{flag} must be positive, got {getattr(self, name)}")
        if self.queue_size < 0:
            raise ValueError(f"--queue-size must be >= 0, got {self.queue_size}")
        for name, flag in (("request_timeout", "--request-timeout"), ("session_ttl", "--session-ttl"),
                           ("body_timeout", "--body-timeout"), ("keep_alive", "--keep-alive"),
                           ("shutdown_timeout", "--shutdown-timeout")):
            if not getattr(self, name) > 0:
                raise ValueError(f"{flag} must be a positive number of seconds, got {getattr(self, name)}")


def _host_rule(entry: str) -> str:
    rule = entry.strip().lower()
    host = rule[2:] if rule.startswith("*.") else rule
    if not host or "/" in rule or "@" in rule or "://" in entry:
        raise ValueError(f"--allow-url-host {entry!r}: give a host name (example.org), host:port, or *.example.org")
    return rule


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``vista3d serve`` runs with.

    Attributes:
        host, port: where to listen (127.0.0.1 by default: this machine only).
        token: bearer token every request but the health checks must carry (``Authorization: Bearer ...``).
        insecure: allow a non-loopback ``host`` without a token.
        data_dir: the folder server-side image paths and ``local_working_dir`` must lie in (None: neither is
            accepted).
        work_dir: where uploads, downloads and answers are written while a request runs (None: a temporary
            folder made at start and removed at exit).
        allow_url_hosts: hosts image URLs may name (``host``, ``host:port`` or ``*.domain``); none: no URLs.
        allow_private_urls: let URLs reach private, loopback and link-local addresses (off: they are refused).
        model: the network and how it runs (the job the command line checked from its flags).
        limits: the per-request bounds.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    insecure: bool = False
    data_dir: Path | None = None
    work_dir: Path | None = None
    allow_url_hosts: tuple[str, ...] = ()
    allow_private_urls: bool = False
    model: SegmentJob = field(default_factory=SegmentJob)
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.token is not None and len(self.token) < 16:
            raise ValueError("--token must be at least 16 characters (e.g. python -c 'import secrets; "
                             "print(secrets.token_urlsafe())')")
        if not is_loopback(self.host) and self.token is None and not self.insecure:
            raise ValueError(
                f"--host {self.host} lets other machines in: give --token (or set {TOKEN_ENV}), or --insecure to "
                "serve without one"
            )
        object.__setattr__(self, "allow_url_hosts", tuple(_host_rule(h) for h in self.allow_url_hosts))
        for name in ("data_dir", "work_dir"):
            folder = getattr(self, name)
            if folder is None:
                continue
            flag = "--" + name.replace("_", "-")
            if not Path(folder).is_dir():
                raise ValueError(f"{flag} {folder}: no such folder")
            # symlinks resolved once: every confinement check compares real paths
            object.__setattr__(self, name, Path(os.path.realpath(folder)))

    @property
    def random_weights(self) -> bool:
        """True when the network is built here without weights: every answer is a meaningless label map."""
        return self.model.weights is None and self.model.network is None

    @classmethod
    def create(cls, allow_url_hosts: Sequence[str] = (), **kwargs: Any) -> ServerSettings:
        """The settings with the token taken from :data:`TOKEN_ENV` when none is given."""
        if kwargs.get("token") is None and os.environ.get(TOKEN_ENV):
            kwargs["token"] = os.environ[TOKEN_ENV]
        return cls(allow_url_hosts=tuple(allow_url_hosts), **kwargs)
