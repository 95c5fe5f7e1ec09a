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
"""Which files and folders are DICOM, told from their bytes without pydicom (the core install has none); the kind
of an input is decided with them in :mod:`.input_kind`.

A DICOM file is a DICOM Part 10 file: 128 bytes of preamble, then ``DICM``. A folder with such files directly inside
is one series (one image); a zip archive is read as one series too, known by its name (``.zip``) or by its bytes (a
local file header first, and a central directory zipfile can read), so that a file saved under another name (the
server's uploads and downloads) is one as well.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

__all__ = ["is_dicom_file", "is_zip_archive", "dicom_files_in", "is_series_folder", "has_dicom_marker",
           "DICOM_SUFFIXES", "DICOM_HEAD_BYTES", "ZIP_MAGIC"]

#: names of DICOM inputs without the Part 10 marker (a bare data set, Siemens' .ima) or a zip of a series
DICOM_SUFFIXES = (".dcm", ".dicom", ".ima", ".zip")

_MAGIC_AT, _MAGIC = 128, b"DICM"
#: how many first bytes :func:`has_dicom_marker` reads
DICOM_HEAD_BYTES = _MAGIC_AT + len(_MAGIC)
#: the first bytes of a zip archive (a local file header)
ZIP_MAGIC = b"PK\x03\x04"


def has_dicom_marker(head: bytes) -> bool:
    """Whether a file's first :data:`DICOM_HEAD_BYTES` bytes hold the DICOM Part 10 marker (``DICM`` after the
    128-byte preamble)."""
    return head[_MAGIC_AT:DICOM_HEAD_BYTES] == _MAGIC


def is_dicom_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file with the DICOM Part 10 marker."""
    try:
        with open(path, "rb") as f:
            head = f.read(DICOM_HEAD_BYTES)
    except OSError:
        return False
    return has_dicom_marker(head)


def is_zip_archive(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file holding a zip archive: named ``.zip``, or starting with a local file header
    and ending with a central directory (what :func:`zipfile.is_zipfile` finds)."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.name.lower().endswith(".zip"):
        return True
    try:
        with open(p, "rb") as f:
            if f.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
                return False
    except OSError:
        return False
    return zipfile.is_zipfile(p)


def dicom_files_in(folder: str | os.PathLike[str]) -> list[Path]:
    """The DICOM files directly inside ``folder`` (not in its subfolders; hidden files left out), sorted by name
    (an order for messages only: slices are ordered by their position, never by name)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return sorted(Path(e.path) for e in entries
                  if not e.name.startswith(".") and e.is_file() and is_dicom_file(e.path))


def is_series_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds DICOM files directly (it is then one image)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    return any(not e.name.startswith(".") and e.is_file() and is_dicom_file(e.path) for e in entries)
