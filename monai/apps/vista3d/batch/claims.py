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
"""Claims on outputs, so that processes sharing an output folder never write one file twice.

Each output is claimed before its image is read (:func:`claim`, :class:`OutputClaims`): a POSIX record lock
(``fcntl.lockf``) on a hidden ``.<output name>.lock`` beside it (:func:`~.paths.lock_path`), which the operating
system drops when its process ends, so a killed process never blocks its rerun; an output claimed by another live
process is reported ``busy``, not redone, and one written meanwhile is skipped. A part's summary is claimed the
same way (:func:`claim_summary`): a second process given the same part writes another file, so neither summary
replaces the other.

The locks need a file system whose locks every machine sees (local disks; NFSv4 or NFSv3 with ``lockd``; Lustre
mounted with ``flock``; GPFS), and "written since this run started" compares file times with this machine's
clock, so the machines' clocks should agree (NTP).
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import socket
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from monai.apps.vista3d.io.paths import OutputLayout, lock_path, own_summary_name

__all__ = ["Claim", "OutputClaims", "OutputTaken", "claim", "claim_owner", "claim_summary", "missing_folders"]


def _owner() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class Claim:
    """A held claim on one output path (see :func:`claim`); :meth:`release` (or the end of a ``with``) drops it.

    Attributes:
        path: the claimed path.
        lock: its lock file.
    """

    def __init__(self, path: Path, lock: Path, fd: int, created: list[Path]) -> None:
        self.path, self.lock, self._created = path, lock, created
        self._fd: int | None = fd  # None once released

    @property
    def held(self) -> bool:
        """Whether this claim is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file, drop the lock, and remove the folders the claim created if they are empty."""
        if self._fd is None:
            return
        try:
            os.unlink(self.lock)  # before unlocking: a process waiting on this file then sees it is stale
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing the file drops the lock
        self._fd = None
        for folder in self._created:  # deepest first; stops at the first folder that holds something
            try:
                folder.rmdir()
            except OSError:
                break

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            try:
                self.release()
            except Exception:  # at interpreter exit; the lock goes with the process anyway
                pass


def missing_folders(folder: str | os.PathLike) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first (what writing into it would create)."""
    folder = Path(folder)
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def claim(path: str | os.PathLike, attempts: int = 5) -> Claim | None:
    """Claim ``path`` for this process, without waiting: the claim, or ``None`` when another process holds it.

    The claim is an exclusive ``fcntl.lockf`` lock on ``.<name>.lock`` beside ``path`` (missing folders are
    created), which the operating system drops when the process ends, however it ends; the lock file of a killed
    process stays on disk but does not block. The lock file holds the owner's pid and host, for messages. A
    process must claim a path at most once at a time (POSIX locks are per process).

    Raises:
        OSError: the lock file cannot be created or the file system does not support locks.
    """
    p = Path(path)
    lock = lock_path(p)
    created = missing_folders(p.parent)
    for _ in range(max(1, attempts)):
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # its folder was removed by a claim released meanwhile
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return None
            raise
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            current = False
        if current:
            held = Claim(p, lock, fd, created)
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{_owner()}\n".encode())
            except OSError:  # a full disk: nothing of the claim is left behind
                held.release()
                raise
            return held
        os.close(fd)  # the lock file was released and removed after this process opened it: open the new one
    return None


def claim_owner(path: str | os.PathLike) -> str:
    """Who claimed ``path`` (``"pid P on HOST"``) as its lock file says, or ``""``."""
    try:
        return lock_path(path).read_text().strip()
    except OSError:
        return ""


def claim_summary(path: str | os.PathLike, started: float) -> tuple[Path, Claim | None]:
    """The summary file a part writes now, claimed: ``path``, or another name when ``path`` is another process's.

    ``path`` is another process's when that process holds its claim (it is writing it) or wrote it at or after
    ``started`` (the ``time.time()`` at which this run began: a second process given the same part). The other
    name puts ``.<host>-<pid>`` before ``.json``, so that neither summary replaces the other; a summary of an
    earlier run is replaced. Release the claim once the file is written.
    """
    p = Path(path)
    held = claim(p)
    if held is not None:
        try:
            mine = p.stat().st_mtime < started
        except FileNotFoundError:
            mine = True
        if mine:
            return p, held
        held.release()
    other = own_summary_name(p)
    return other, claim(other)


class OutputTaken(Exception):  # noqa: N818 - a signal to skip an output, not an error
    """An output that this process will not write: another live process claimed it (``status`` "busy"), or it
    was written since the run was planned (``status`` "skipped")."""

    def __init__(self, status: str, message: str, owner: str = "") -> None:
        super().__init__(message)
        self.status, self.owner = status, owner


# errors of a file system without locks (some FUSE mounts): outputs are then written unclaimed, with a warning
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def _remove_stale(output: Path) -> None:
    """Remove the temporary files of a killed writer of ``output``; call it holding the claim (so no live process
    is writing them)."""
    for stale in output.parent.glob(OutputLayout.temp_glob(glob.escape(str(output)))):
        stale.unlink(missing_ok=True)


class OutputClaims:
    """One process's claims on the outputs it writes: taken before an image is read, released once its file is
    written (or it failed). Taking a claim removes the temporary files a killed writer of that output left.

    An output written since the run was planned is skipped once claimed: it exists and did not at the plan, or
    its file time is at or after ``started`` (an output that the plan redoes, with ``overwrite`` or for a missing
    class mask, is written over only if older).

    Args:
        started: when the run was planned (``time.time()``).
    """

    def __init__(self, started: float = 0.0) -> None:
        self.started = started
        self._held: dict[Path, Claim | None] = {}
        self._lock = threading.Lock()
        self.warned = False

    def take(self, output: Path, existed: bool = False) -> None:
        """Claim ``output`` (which ``existed`` when the run was planned, or not).

        Raises:
            OutputTaken: ``"busy"``: another live process holds it; ``"skipped"``: written since the plan.
        """
        try:
            held = claim(output)
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                raise
            if not self.warned:
                self.warned = True
                warnings.warn(f"{output.parent}: the file system does not support locks ({e.strerror}); outputs "
                              "are written without claims, so two processes may segment one image", stacklevel=2)
            held = None
        else:
            if held is None:
                owner = claim_owner(output)
                raise OutputTaken("busy", f"claimed by another process ({owner or 'owner unknown'})", owner)
        with self._lock:
            self._held[output] = held
        if held is not None:
            _remove_stale(output)
        try:
            written = output.stat().st_mtime
        except FileNotFoundError:
            return
        if not existed or written >= self.started:
            self.release(output)
            raise OutputTaken("skipped", "written by another process since this run started")

    def sweep(self, output: Path) -> None:
        """Remove what a killed writer left beside the finished ``output`` (its lock file, temporary files),
        unless a live process holds its claim. Cheap when there is no lock file."""
        if not lock_path(output).exists():
            return
        try:
            held = claim(output)
        except OSError:
            return
        if held is not None:
            _remove_stale(output)
            held.release()

    def release(self, output: Path) -> None:
        """Drop the claim on ``output`` (and its lock file), if this process holds it."""
        with self._lock:
            held = self._held.pop(output, None)
        if held is not None:
            held.release()

    def release_all(self) -> None:
        """Drop every claim still held (at the end of a run, however it ends), the last taken first: a folder
        that an earlier claim created is then empty again when that claim removes it."""
        for output in reversed(list(self._held)):
            self.release(output)

    def claiming(self, load: Callable[..., Any], outputs: Sequence[Path]) -> Callable[..., Any]:
        """``load`` that first claims the next of ``outputs``: the i-th call is for the i-th output. Call it at the
        plan: the outputs that exist now are those the plan redoes."""
        upcoming = iter([(out, out.exists()) for out in outputs])

        def claimed_load(*args: Any, **kwargs: Any) -> Any:
            self.take(*next(upcoming))
            return load(*args, **kwargs)

        return claimed_load
