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
"""Answers written into a client's ``local_working_dir``: each under a name no other file holds.

Requests from several clients may name the same image (``scan.nii.gz``) and the same folder: each answer gets its own
file, ``scan_trans.nii.gz`` for the first and ``scan_trans-2.nii.gz``, ``-3``, ... after it, never over an existing
file, also when two requests place theirs at the same moment (the name is taken by a hard link, which fails when
the name exists; where the file system has none, by an exclusive create).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from pathlib import Path

from monai.apps.vista3d.io.paths import TEMP_SUFFIX, temp_prefix

from .errors import ServeError

__all__ = ["publish", "MAX_COPIES"]

#: numbered names tried for one answer before the folder is refused (409)
MAX_COPIES = 1000

_SUFFIXES = (".nii.gz", ".nii", ".nrrd")


def _numbered(name: str, k: int) -> str:
    """``name`` with ``-k`` before its image suffix (``k == 1``: ``name`` itself)."""
    if k == 1:
        return name
    suffix = next((s for s in _SUFFIXES if name.endswith(s)), "")
    return f"{name[: len(name) - len(suffix)]}-{k}{suffix}"


def _take(tmp: Path, target: Path) -> bool:
    """Give ``tmp``'s file the name ``target`` unless that name exists; True when it did."""
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
    try:  # no hard links here: reserve the name exclusively, then move the whole file onto it
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileExistsError:
        return False
    os.replace(tmp, target)
    return True


def publish(src: Path, folder: Path, name: str) -> Path:
    """Copy ``src`` into ``folder`` as ``name``, or as the first of its numbered names no file holds.

    Raises:
        ServeError: 409 when ``name`` and :data:`MAX_COPIES` numbered names are all taken; 403 for a folder the
            server may not write, 507 for a full disk.
    """
    tmp = folder / f"{temp_prefix(name)}{secrets.token_hex(4)}{TEMP_SUFFIX}"
    try:
        shutil.copyfile(src, tmp)
        for k in range(1, MAX_COPIES + 1):
            target = folder / _numbered(name, k)
            if _take(tmp, target):
                return target
    except PermissionError:
        raise ServeError(403, "local_working_dir is not writable by the server; give a folder it can write") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise ServeError(507, "local_working_dir's disk is full; free space and retry") from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    raise ServeError(409, f"local_working_dir already holds {name} and {MAX_COPIES - 1} numbered copies of it "
                          f"({_numbered(name, MAX_COPIES)} the last); move them away and retry")
