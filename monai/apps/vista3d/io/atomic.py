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
"""Writing files whole or not at all, the one way every output of the app is written (label maps and per-class
masks, statistics, previews, DICOM SEGs).

A file is written under the hidden temporary name of :mod:`~.paths` beside it and flushed to disk
(:func:`write_temp`), then renamed onto its name and the rename made durable (:func:`commit`); a set of files (the
per-class masks) is renamed only once all are written. :func:`write_atomically` does both for one file.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from monai.apps.vista3d.errors import Vista3DOutputError

from .paths import TEMP_TOKEN_BYTES, temp_name

__all__ = ["write_atomically", "write_temp", "commit", "discard"]


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it onto ``path``; returns ``path``.

    Missing folders are created. On any failure the temporary file is removed and ``path`` is untouched.

    Raises:
        Vista3DOutputError: the folder cannot be created or written, or writing fails (a full disk).
    """
    p = Path(path)
    commit([(write_temp(p, write), p)])
    return p


def write_temp(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> str:
    """Call ``write(f)`` on a new temporary file beside ``path`` (its folder created when missing) and flush it to
    disk; returns the temporary name, for :func:`commit`. Nothing is left behind on failure.

    Raises:
        Vista3DOutputError: the folder cannot be created or written, or writing fails.
    """
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temp(p.parent, p.name)
    except OSError as e:
        raise Vista3DOutputError(f"{p}: cannot write to folder {p.parent} ({e.strerror or e}); choose a writable "
                                 "output folder.") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        discard([tmp])
        if isinstance(e, OSError):
            raise Vista3DOutputError(f"{p}: writing failed ({e.strerror or e}); nothing was left under this name.") \
                from e
        raise
    return tmp


def _create_temp(parent: Path, name: str) -> tuple[int, str]:
    """Open a new ``.<name>.<8 hex>.part`` beside the output for writing; return its descriptor and path.

    Created with mode 0o666 so that the kernel applies the umask (and any default ACL) as for a plain ``open``:
    the renamed output gets the permissions the user expects, and the umask is never read or changed
    (``os.umask`` is process-wide, so reading it by setting it races with other threads).
    """
    for _ in range(100):
        tmp = os.path.join(parent, temp_name(name, secrets.token_hex(TEMP_TOKEN_BYTES)))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent}: no unused temporary name for {name}")


def discard(temps: Sequence[str]) -> None:
    """Remove temporary files that will not be committed (those already gone are passed over)."""
    for tmp in temps:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def commit(parts: Sequence[tuple[str, Path]]) -> None:
    """Rename written temporary files onto their names, then make the renames durable; on a failure the temporary
    files not yet renamed are removed.

    Raises:
        Vista3DOutputError: a rename fails.
    """
    for k, (tmp, p) in enumerate(parts):
        try:
            os.replace(tmp, p)
        except BaseException as e:
            discard([t for t, _ in parts[k:]])
            if isinstance(e, OSError):
                raise Vista3DOutputError(f"{p}: writing failed ({e.strerror or e}); nothing was left under this "
                                         "name.") from e
            raise
    for parent in dict.fromkeys(Path(p).parent for _, p in parts):
        try:  # not possible on every platform (a folder cannot be opened on Windows)
            dfd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
