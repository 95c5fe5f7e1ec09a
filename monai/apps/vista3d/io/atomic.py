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
"""Writing one small file whole or not at all (a statistics JSON, a preview PNG, a DICOM SEG): written under the
hidden temporary name of :mod:`~.paths` beside it, flushed, then renamed onto its name."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..errors import Vista3DOutputError
from .paths import TEMP_SUFFIX, temp_prefix

__all__ = ["write_atomically"]


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it onto ``path``; returns ``path``.

    Missing folders are created. On any failure the temporary file is removed and ``path`` is untouched.

    Raises:
        Vista3DOutputError: the folder cannot be created or written.
    """
    p = Path(path)
    tmp = p.with_name(f"{temp_prefix(p.name)}{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        f = open(tmp, "xb")
    except OSError as e:
        raise Vista3DOutputError(f"{p}: cannot write to folder {p.parent} ({e.strerror or e}); choose a writable "
                                 "output folder.") from None
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p
