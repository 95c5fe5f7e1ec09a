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
"""What the MONAI Label protocol keeps between requests: the images clients upload, and their click sessions.

:class:`UploadStore` holds the uploaded files under the server's work folder, by key: ``(owner, image id)`` for
``PUT /datastore/`` (an image id is the client's name for its volume, so two clients may use the same one) and
``("session", address, id)`` for ``PUT /session/`` (so that another client's request for the id finds nothing, as
for an id never issued). They are bounded in all and per client (an address), and expire, as a
:class:`~.sessions.BoundedStore`; a file still read by a request is deleted only once that request lets it go.
:class:`ClickSessions` says which of the server's click sessions (the :class:`~.sessions.SessionStore` the rest
of the server uses, so that one budget, one expiry and one share per client bound them all) continues the clicks of
an ``(owner, upload, label)``; an upload that ends takes its click sessions with it.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ServeError
from .sessions import BoundedStore, SessionEntry, SessionStore

__all__ = ["Upload", "UploadStore", "ClickEntry", "ClickSessions"]


@dataclass
class Upload:
    """One uploaded image.

    Attributes:
        key: the store's key (``(owner, image id)`` or ``("session", address, id)``).
        image_id: the client's image id (or the session id).
        path: the file, under the store's folder, named by the server.
        format: ``"nifti"`` or ``"nrrd"`` (read from its bytes).
        name: the stem of the answers' file names.
        client: the address that uploaded it (whose share it counts against).
        token: unique to this upload: an image re-uploaded under the same id is another upload.
        created: wall-clock time of the upload (seconds since the epoch).
        last_used: the store's clock at the last use.
    """

    key: Hashable
    image_id: str
    path: Path
    format: str
    name: str
    client: str = ""
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    created: float = field(default_factory=time.time)
    last_used: float = 0.0
    users: int = 0
    ended: bool = False

    @property
    def owner(self) -> str:
        """Whose share it counts against (:class:`~.sessions.Held`)."""
        return self.client


class UploadStore(BoundedStore[Hashable, Upload]):
    """Uploaded images by key, least recently used first (:class:`~.sessions.BoundedStore`); see the module.

    Args:
        folder: where the files go (made if missing; emptied by :meth:`close`).
        max_images: images held at once.
        ttl: seconds an image lives after its last use.
        clock: seconds, monotonic.
        on_end: called with each upload that ends (replaced, evicted, expired or removed).
        per_client: images one client may hold (None: all of them).
    """

    share_full = ("evicted: one client holds at most {n} uploaded images (--max-sessions-per-client) and it was that "
                  "client's least recently used")
    store_full = ("evicted: the server keeps at most {n} uploaded images (--max-sessions) and it was the least "
                  "recently used")

    def __init__(self, folder: Path, max_images: int, ttl: float, clock: Callable[[], float] = time.monotonic,
                 on_end: Callable[[Upload], None] | None = None, per_client: int | None = None) -> None:
        super().__init__(max_images, ttl, clock, per_client)
        self.folder = folder
        self.on_end = on_end
        folder.mkdir(parents=True, exist_ok=True)

    def _entry_ended_locked(self, entry: Upload) -> None:
        entry.ended = True
        if entry.users == 0:  # else the last request that reads it deletes it
            entry.path.unlink(missing_ok=True)

    def _entries_ended(self, entries: list[Upload]) -> None:
        if self.on_end is not None:
            for upload in entries:
                self.on_end(upload)

    def put(self, key: Hashable, src: Path, fmt: str, name: str, image_id: str, client: str = "") -> Upload:
        """Move ``src`` into the store under ``key`` for ``client`` (replacing what the key held; past the client's
        share evicting its least recently used image, and when full the least recently used of all); the new
        :class:`Upload`."""
        upload = Upload(key, image_id, self.folder / f"{secrets.token_hex(12)}.{fmt}", fmt, name, client)
        shutil.move(str(src), upload.path)  # src lies in a request's scratch folder under the same work folder
        with self._lock:
            gone = self._sweep_locked()
            if key in self._live:
                gone.append(self._end(key, "replaced by a newer upload"))
            gone += self._admit_locked(key, upload)
        self._entries_ended(gone)
        return upload

    def get(self, key: Hashable, what: str, how: str) -> Upload:
        """The upload of ``key`` (now the most recently used); 404 (never held) or 410 (ended) otherwise, the
        message naming it as ``what`` and saying ``how`` to send it."""
        self.sweep()  # apart from the lookup: on_end is called outside the lock
        with self._lock:
            return self._touch_locked(key, None, f"{what} is not on this server: {how}", what, how)  # key has owner

    @contextmanager
    def use(self, key: Hashable, what: str, how: str) -> Iterator[Upload]:
        """:meth:`get`, holding the file until the block ends (an upload that ends meanwhile is deleted then)."""
        upload = self.get(key, what, how)
        with self._lock:
            upload.users += 1
        try:
            yield upload
        finally:
            with self._lock:
                upload.users -= 1
                if upload.ended and upload.users == 0:
                    upload.path.unlink(missing_ok=True)

    def remove(self, key: Hashable, what: str, how: str) -> Upload:
        """End the upload of ``key`` (404/410 as :meth:`get`: one unused past ``ttl`` is told expired)."""
        self.sweep()
        with self._lock:
            self._touch_locked(key, None, f"{what} is not on this server: {how}", what, how)
            upload = self._end(key, "deleted")
        self._entries_ended([upload])
        return upload

    def count(self, owner: Any = None) -> int:
        """Images held (of ``owner``'s datastore uploads only, when given)."""
        with self._lock:
            return sum(1 for k in self._live if owner is None or (isinstance(k, tuple) and k[0] == owner))

    def close(self) -> None:
        """End every upload and remove the folder (the server is stopping)."""
        with self._lock:
            gone = [self._end(key, "removed: the server stopped") for key in list(self._live)]
        self._entries_ended(gone)
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class ClickEntry(SessionEntry):
    """A click session of the MONAI Label protocol: a server session with what its answers need.

    Attributes:
        foreground, background: the points clicked so far (voxel indices), in the order they came.
        answer: the last answer (``[X, Y, Z]`` uint8, 1 on the object), sent again when no point is new.
        latencies: seconds per stage of the last click (none when no point was new).
    """

    foreground: list = field(default_factory=list)
    background: list = field(default_factory=list)
    answer: Any = None
    latencies: dict = field(default_factory=dict)


class ClickSessions:
    """Which server session (of ``store``) continues the clicks of each key; see the module.

    Args:
        store: the server's sessions.
        remembered: keys remembered at once (their sessions are bounded by the store; a key whose session has
            ended is a key to start again).
    """

    def __init__(self, store: SessionStore, remembered: int = 1024) -> None:
        self.store = store
        self._remembered = remembered
        self._ids: OrderedDict[Hashable, tuple[str, str]] = OrderedDict()  # key -> (session id, its owner)
        self._turns: dict[Hashable, list] = {}  # key -> [lock, requests holding or awaiting it]

    def find(self, key: Hashable) -> ClickEntry | None:
        """The live session of ``key``, or None (never started, or ended: expired, evicted, dropped)."""
        held = self._ids.get(key)
        if held is None:
            return None
        try:
            entry = self.store.get(*held)
        except ServeError:  # ended in the store: the key starts again
            self._ids.pop(key, None)
            return None
        return entry if isinstance(entry, ClickEntry) else None

    def add(self, key: Hashable, entry: ClickEntry) -> None:
        """Hold ``entry`` in the server's sessions as the one of ``key`` (ending the key's previous one); it counts
        against the share of its ``owner``."""
        self.drop(key)
        self._ids[key] = (self.store.add(entry), entry.owner)
        while len(self._ids) > self._remembered:
            _, held = self._ids.popitem(last=False)
            self._remove(held)

    def _remove(self, held: tuple[str, str]) -> None:
        try:
            self.store.remove(*held)
        except ServeError:
            pass  # it had ended already

    def drop(self, key: Hashable) -> None:
        """End the session of ``key`` (a failed click leaves no half-updated session behind)."""
        held = self._ids.pop(key, None)
        if held is not None:
            self._remove(held)

    def drop_upload(self, token: str) -> None:
        """End the sessions on the upload ``token`` (keys ``(owner, token, label)``)."""
        for key in [k for k in self._ids if isinstance(k, tuple) and len(k) == 3 and k[1] == token]:
            self.drop(key)

    @asynccontextmanager
    async def serialized(self, key: Hashable) -> AsyncIterator[None]:
        """Hold the key's turn: one request of a key at a time (the one that starts its session, then each click
        in the order they came)."""
        turn = self._turns.setdefault(key, [asyncio.Lock(), 0])
        turn[1] += 1
        try:
            async with turn[0]:
                yield
        finally:
            turn[1] -= 1
            if turn[1] == 0:
                self._turns.pop(key, None)
