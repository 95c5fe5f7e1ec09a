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
never reach the app (bytes uvicorn cannot parse as HTTP, which it would answer in plain text)."""

from __future__ import annotations

import json
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["JsonErrorProtocol", "uvicorn_config"]


class JsonErrorProtocol(H11Protocol):
    """uvicorn's h11 protocol, answering an unparseable request with ``400 {"detail": ...}`` like every other error."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"detail": f"{msg.rstrip('.')}: the request is not valid HTTP/1.1"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


def uvicorn_config(app: Any, **kwargs: Any) -> uvicorn.Config:
    """``uvicorn.Config(app, **kwargs)`` on the h11 protocol above (the command line's and the tests' servers)."""
    return uvicorn.Config(app, http=JsonErrorProtocol, **kwargs)
