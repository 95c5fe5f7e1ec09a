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
"""The click sessions a server holds: a bounded number, each living ``ttl`` seconds after its last use.

A session is one :class:`~monai.apps.vista3d.core.session.Vista3DSession` (the image preprocessed once, the clicks and
previous logits of the current object) with what the server needs to answer in the image's own format. A session
belongs to the client that opened it: another client's requests for it get 404, as for an id never issued. A client
holds at most ``per_client`` sessions (a new one past that evicts its own least recently used); when the store is
full a new session evicts the least recently used one of all. A request for a session that was evicted, has
expired or was deleted gets 410 with the reason.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ServeError

__all__ = ["SessionEntry", "SessionStore"]

_CREATE = "create a new one with POST /v1/vista3d/sessions"


@dataclass
class SessionEntry:
    """One session: the library's session, the image it was made from, and the last label map sent.

    Attributes:
        session: the ``Vista3DSession``.
        image: the loaded image's description (:class:`~.images.LoadedImage` without its voxels).
        previous: the label map of the last click (uint8, input grid) for the changed-box answers; None
            before the first click (every voxel unknown).
        last_used: clock time of the last request.
        owner: the client that opened it (its address).
    """

    session: Any
    image: Any
    previous: Any = None
    last_used: float = 0.0
    owner: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one click of a session at a time


class SessionStore:
    """Sessions by id, least recently used first.

    Args:
        max_sessions: sessions held at once.
        ttl: seconds a session lives after its last use.
        clock: seconds, monotonic (``time.monotonic``; tests pass their own).
        remembered: how many ended sessions are remembered to say why they are gone.
        per_client: sessions one client may hold (None: all of them).
    """

    def __init__(self, max_sessions: int, ttl: float, clock: Callable[[], float] = time.monotonic,
                 remembered: int = 4096, per_client: int | None = None) -> None:
        self.max_sessions = max_sessions
        self.ttl = ttl
        self.clock = clock
        self.per_client = per_client or max_sessions
        self._remembered = remembered
        self._lock = threading.Lock()
        self._live: OrderedDict[str, SessionEntry] = OrderedDict()
        self._ended: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (owner, why it is gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def _end(self, session_id: str, why: str) -> None:
        entry = self._live.pop(session_id, None)
        self._ended[session_id] = (entry.owner if entry is not None else "", why)
        while len(self._ended) > self._remembered:
            self._ended.popitem(last=False)

    def _sweep_locked(self) -> int:
        now, gone = self.clock(), 0
        for sid, entry in list(self._live.items()):  # least recently used first: stop at the first live one
            if now - entry.last_used <= self.ttl:
                break
            self._end(sid, f"expired: unused for more than {self.ttl:g} s (--session-ttl)")
            gone += 1
        return gone

    def sweep(self) -> int:
        """End the sessions unused for longer than ``ttl``; how many ended."""
        with self._lock:
            return self._sweep_locked()

    def add(self, entry: SessionEntry) -> str:
        """Hold ``entry`` under a new id: past its owner's share the owner's least recently used session is evicted,
        and when the store is full the least recently used of all."""
        with self._lock:
            self._sweep_locked()
            own = [sid for sid, e in self._live.items() if e.owner == entry.owner]
            if len(own) >= self.per_client:
                self._end(own[0], f"evicted: one client holds at most {self.per_client} sessions "
                                  "(--max-sessions-per-client) and it was that client's least recently used")
            while len(self._live) >= self.max_sessions:
                oldest = next(iter(self._live))
                self._end(oldest, f"evicted: the server holds at most {self.max_sessions} sessions "
                                  "(--max-sessions) and it was the least recently used")
            sid = secrets.token_urlsafe(16)
            entry.last_used = self.clock()
            self._live[sid] = entry
            return sid

    def get(self, session_id: str, owner: str = "") -> SessionEntry:
        """``owner``'s session (now the most recently used); 404 for an id never issued or another client's, 410
        for one that ended."""
        with self._lock:
            self._sweep_locked()
            entry = self._live.get(session_id)
            if entry is None:
                ended = self._ended.get(session_id)
                if ended is None or ended[0] != owner:
                    raise ServeError(404, f"no session {session_id!r}: {_CREATE}")
                raise ServeError(410, f"session {session_id!r} was {ended[1]}; {_CREATE}")
            if entry.owner != owner:  # the same answer as an unknown id: nothing is said of another client's
                raise ServeError(404, f"no session {session_id!r}: {_CREATE}")
            entry.last_used = self.clock()
            self._live.move_to_end(session_id)
            return entry

    def remove(self, session_id: str, owner: str = "") -> None:
        """End ``owner``'s session (404/410 as :meth:`get`)."""
        self.get(session_id, owner)
        with self._lock:
            self._end(session_id, "deleted")

    def expires_in(self, entry: SessionEntry) -> float:
        return max(0.0, self.ttl - (self.clock() - entry.last_used))
