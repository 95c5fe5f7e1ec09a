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
"""The one error the server's rooms raise: an HTTP status, one message, and the headers it needs."""

from __future__ import annotations

__all__ = ["ServeError"]


class ServeError(Exception):
    """A request the server answers with ``status`` and ``{"detail": message}``.

    Args:
        status: the HTTP status (4xx for the client's input, 5xx for the server's state).
        message: one line: what is wrong and what to do about it.
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
