"""What the server keeps per client between requests, and the click sessions among it.

:class:`BoundedStore` holds entries by key under one lock, least recently used first: an entry ends ``ttl`` seconds
after its last use; a new one past its owner's share (``per_client``, the owner an address) evicts that owner's least
recently used, and one past ``capacity`` the least recently used of all. It remembers why the last ``remembered``
ended keys are gone (and whose they were), so that their owner is told 410 with the reason.

:class:`SessionStore` holds the click sessions, each one
:class:`~monai.apps.vista3d.core.session.Vista3DSession` (the image preprocessed once, the clicks and previous
logits of the current object) with what the server needs to answer in the image's own format. A session belongs to
the client that opened it: another client's requests for it get 404, as for an id never issued; a request for one
that was evicted, has expired or was deleted gets 410 with the reason.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any, Generic, Protocol, TypeVar

from .errors import ServeError

__all__ = ["Held", "BoundedStore", "SessionEntry", "SessionStore"]

_CREATE = "create a new one with POST /v1/vista3d/sessions"


class Held(Protocol):
    """An entry of a :class:`BoundedStore`: the store's clock at its last use, and whose it is (an address)."""

    last_used: float

    @property
    def owner(self) -> str: ...


K = TypeVar("K", bound=Hashable)
E = TypeVar("E", bound=Held)


class BoundedStore(Generic[K, E]):
    """Entries by key, least recently used first (see the module). A ``_locked`` method runs under ``_lock``.

    Args:
        capacity: entries held at once.
        ttl: seconds an entry lives after its last use.
        clock: seconds, monotonic.
        per_client: entries one owner may hold (None: all of them).
        remembered: how many ended keys are remembered to say why they are gone.
    """

    share_full = "evicted: one client holds at most {n} entries and it was that client's least recently used"
    store_full = "evicted: the store holds at most {n} entries and it was the least recently used"

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic,
                 per_client: int | None = None, remembered: int = 4096) -> None:
        self.capacity, self.ttl, self.clock = capacity, ttl, clock
        self.per_client = per_client or capacity
        self._remembered = remembered
        self._lock = threading.Lock()
        self._live: OrderedDict[K, E] = OrderedDict()
        self._ended: OrderedDict[K, tuple[str, str]] = OrderedDict()  # key -> (owner, why it is gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def _end(self, key: K, why: str) -> E:
        """End the live entry of ``key``; the entry."""
        entry = self._live.pop(key)
        self._ended[key] = (entry.owner, why)
        self._ended.move_to_end(key)  # a key held again (an upload's) is remembered anew
        while len(self._ended) > self._remembered:
            self._ended.popitem(last=False)
        self._entry_ended_locked(entry)
        return entry

    def _entry_ended_locked(self, entry: E) -> None:
        """What ending ``entry`` does besides forgetting it (nothing here)."""

    def _entries_ended(self, entries: list[E]) -> None:
        """What the ended entries do once the lock is let go (nothing here)."""

    def _sweep_locked(self) -> list[E]:
        now = self.clock()  # least recently used first: the expired ones end at the first live one
        expired = [k for k, e in takewhile(lambda ke: now - ke[1].last_used > self.ttl, self._live.items())]
        return [self._end(k, f"expired: unused for more than {self.ttl:g} s (--session-ttl)") for k in expired]

    def sweep(self) -> int:
        """End the entries unused for longer than ``ttl``; how many ended."""
        with self._lock:
            gone = self._sweep_locked()
        self._entries_ended(gone)
        return len(gone)

    def _admit_locked(self, key: K, entry: E) -> list[E]:
        """Hold ``entry`` under ``key`` as the most recently used, evicting first past its owner's share and past
        the capacity; the entries evicted."""
        own = [k for k, e in self._live.items() if e.owner == entry.owner]
        gone = [self._end(own[0], self.share_full.format(n=self.per_client))] if len(own) >= self.per_client else []
        while len(self._live) >= self.capacity:
            gone.append(self._end(next(iter(self._live)), self.store_full.format(n=self.capacity)))
        self._ended.pop(key, None)
        entry.last_used = self.clock()
        self._live[key] = entry
        return gone

    def _touch_locked(self, key: K, owner: str | None, missing: str, what: str, how: str) -> E:
        """The live entry of ``key``, now the most recently used; else 410 ``"{what} was {why it ended}; {how}"``,
        or 404 ``missing`` for a key never held. With ``owner``, another owner's key, live or ended, is one never
        held: nothing is said of another client's entries."""
        entry = self._live.get(key)
        if entry is not None and owner in (None, entry.owner):
            entry.last_used = self.clock()
            self._live.move_to_end(key)
            return entry
        ended = self._ended.get(key) if entry is None else None
        if ended is None or owner not in (None, ended[0]):
            raise ServeError(404, missing)
        raise ServeError(410, f"{what} was {ended[1]}; {how}")

    def expires_in(self, entry: E) -> float:
        """Seconds ``entry`` has left unless it is used again."""
        return max(0.0, self.ttl - (self.clock() - entry.last_used))


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


class SessionStore(BoundedStore[str, SessionEntry]):
    """Sessions by id, least recently used first (:class:`BoundedStore`).

    Args:
        max_sessions: sessions held at once.
        ttl: seconds a session lives after its last use.
        clock: seconds, monotonic (``time.monotonic``; tests pass their own).
        remembered: how many ended sessions are remembered to say why they are gone.
        per_client: sessions one client may hold (None: all of them).
    """

    share_full = ("evicted: one client holds at most {n} sessions (--max-sessions-per-client) and it was that "
                  "client's least recently used")
    store_full = "evicted: the server holds at most {n} sessions (--max-sessions) and it was the least recently used"

    def __init__(self, max_sessions: int, ttl: float, clock: Callable[[], float] = time.monotonic,
                 remembered: int = 4096, per_client: int | None = None) -> None:
        super().__init__(max_sessions, ttl, clock, per_client, remembered)

    def add(self, entry: SessionEntry) -> str:
        """Hold ``entry`` under a new id: past its owner's share the owner's least recently used session is evicted,
        and when the store is full the least recently used of all."""
        with self._lock:
            self._sweep_locked()
            sid = secrets.token_urlsafe(16)
            self._admit_locked(sid, entry)
            return sid

    def _find_locked(self, session_id: str, owner: str) -> SessionEntry:
        self._sweep_locked()
        return self._touch_locked(session_id, owner, f"no session {session_id!r}: {_CREATE}", f"session {session_id!r}",
                                  _CREATE)

    def get(self, session_id: str, owner: str = "") -> SessionEntry:
        """``owner``'s session (now the most recently used); 404 for an id never issued or another client's, 410
        for one that ended."""
        with self._lock:
            return self._find_locked(session_id, owner)

    def remove(self, session_id: str, owner: str = "") -> None:
        """End ``owner``'s session (404/410 as :meth:`get`)."""
        with self._lock:  # found and ended at once: of two requests that end it, the second is told 410
            self._find_locked(session_id, owner)
            self._end(session_id, "deleted")
