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
"""How uvicorn runs the app: one place for its configuration, with the server's JSON errors also for requests that
never reach the app (bytes uvicorn cannot parse as HTTP, which it would answer in plain text), and the connection
rules uvicorn lacks.

uvicorn closes a connection only when it has been idle ``timeout_keep_alive`` seconds *after an answer*: one that
never sends a whole request (a half-open connection, or headers sent a byte at a time) stays open for ever. Here
every connection must deliver its request's headers within ``header_timeout`` seconds of opening (or of its last
answer), else it gets 408 and is closed; and at most ``max_connections`` are open at once, ``max_per_client`` of
them from one address (more are answered 503 and closed at once).

:class:`DrainingServer` tells the app when uvicorn begins to stop, so that waiting requests are answered at once and
the running job gets ``--shutdown-timeout`` seconds; uvicorn's own graceful timeout is two seconds longer, for the
answers to go out.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import Limits

__all__ = ["ConnectionRules", "JsonErrorProtocol", "DrainingServer", "uvicorn_config", "SHUTDOWN_GRACE"]

#: seconds uvicorn's graceful shutdown runs past --shutdown-timeout: the cancelled job's 503 is sent in them
SHUTDOWN_GRACE = 2.0


@dataclass
class ConnectionRules:
    """The connection rules of one server (see the module) and its count of open connections per address."""

    header_timeout: float
    max_connections: int
    max_per_client: int
    open: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, limits: Limits) -> ConnectionRules:
        per_client = limits.max_connections_per_client
        assert per_client is not None, "Limits derives it from max_connections when it is not given"
        return cls(limits.body_timeout, limits.max_connections, per_client)


def _raw_json(status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole ``Connection: close`` response with ``{"detail": message}``: every answer this module sends itself (a
    connection over a limit, headers too late, bytes that are not HTTP/1.1), the connection closed after it."""
    body = json.dumps({"detail": message}).encode()
    lines = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
             "connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class JsonErrorProtocol(H11Protocol):
    """uvicorn's h11 protocol, answering an unparseable request with ``400 {"detail": ...}`` like every other error,
    and holding each connection to the :class:`ConnectionRules` (none given: uvicorn's own behaviour)."""

    def __init__(self, *args: Any, rules: ConnectionRules | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rules = rules
        self._peer: str | None = None
        self._headers_due: asyncio.TimerHandle | None = None

    # uvicorn's H11Protocol narrows asyncio's BaseTransport to Transport (with the same ignore); so does this override
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._rules is None:
            return
        self._peer = self.client[0] if self.client else ""
        self._rules.open[self._peer] += 1
        if len(self.connections) > self._rules.max_connections:
            self._refuse(503, "Service Unavailable", f"the server holds its most connections "
                              f"(--max-connections {self._rules.max_connections}); retry shortly", {"retry-after": "1"})
        elif self._rules.open[self._peer] > self._rules.max_per_client:
            self._refuse(503, "Service Unavailable", f"this client holds its most connections "
                              f"({self._rules.max_per_client} from one address); close some first",
                         {"retry-after": "1"})
        else:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._rules is not None and self._peer is not None:
            self._rules.open[self._peer] -= 1
            if self._rules.open[self._peer] <= 0:
                del self._rules.open[self._peer]
            self._peer = None
        super().connection_lost(exc)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request's headers arrived: its body has the app's deadline
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # the next request's headers are due in time too (a pipelined one disarms it at once)
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        if self._rules is not None and not self.transport.is_closing():
            timeout = self._rules.header_timeout
            self._headers_due = self.loop.call_later(timeout, self._headers_late, timeout)

    def _disarm(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self, timeout: float) -> None:
        self._headers_due = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return  # closed already, or a request is being answered
        self._refuse(408, "Request Timeout", f"no whole request arrived within {timeout:g} s "
                                             "(--body-timeout); the connection is closed")

    def _refuse(self, status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        self.transport.write(_raw_json(status, reason, message, headers))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "Bad Request", f"{msg.rstrip('.')}: the request is not valid HTTP/1.1")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, calling ``on_shutdown`` as it begins to stop (a signal, or ``should_exit``), before it
    waits for the open requests."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]):
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)


def uvicorn_config(app: Any, limits: Limits | None = None, **kwargs: Any) -> uvicorn.Config:
    """``uvicorn.Config(app, **kwargs)`` on the h11 protocol above (the command line's and the tests' servers), with
    the connection rules, keep-alive and graceful shutdown of ``limits`` (None: uvicorn's own)."""
    if limits is None:
        return uvicorn.Config(app, http=JsonErrorProtocol, **kwargs)
    rules = ConnectionRules.of(limits)

    def protocol(*args: Any, **kw: Any) -> JsonErrorProtocol:
        return JsonErrorProtocol(*args, rules=rules, **kw)

    kwargs.setdefault("timeout_graceful_shutdown", limits.shutdown_timeout + SHUTDOWN_GRACE)
    # uvicorn annotates `http` as a protocol class, but only calls it with each connection's arguments: a factory
    # that binds the rules serves as one
    return uvicorn.Config(app, http=protocol, timeout_keep_alive=limits.keep_alive, **kwargs)  # type: ignore[arg-type]
