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
"""Which inputs are DICOM, told from their bytes without pydicom (the core install has none): the one place an
input's kind is decided, for the folder search and for the load.

A DICOM file is a DICOM Part 10 file: 128 bytes of preamble, then ``DICM``. A folder with such files directly inside
is one series (one image); a ``.zip`` is read as one series too.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["input_kind", "is_dicom_file", "dicom_files_in", "is_series_folder", "DICOM_SUFFIXES"]

#: names an input given directly may end with and still be a DICOM image
DICOM_SUFFIXES = (".zip", ".dcm", ".dicom")

_MAGIC_AT, _MAGIC = 128, b"DICM"


def is_dicom_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file with the DICOM Part 10 marker (``DICM`` after the 128-byte preamble)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_MAGIC_AT + 4)
    except OSError:
        return False
    return head[_MAGIC_AT:] == _MAGIC


def dicom_files_in(folder: str | os.PathLike) -> list[Path]:
    """The DICOM files directly inside ``folder`` (not in its subfolders; hidden files left out), sorted by name
    (an order for messages only: slices are ordered by their position, never by name)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return sorted(Path(e.path) for e in entries
                  if not e.name.startswith(".") and e.is_file() and is_dicom_file(e.path))


def is_series_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds DICOM files directly (it is then one image)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    return any(not e.name.startswith(".") and e.is_file() and is_dicom_file(e.path) for e in entries)


def input_kind(path: str | os.PathLike) -> str:
    """``"dicom"`` for a folder, a ``.zip`` or a DICOM Part 10 file; ``"nifti"`` for anything else (whose load then
    says what is wrong with it)."""
    p = Path(path)
    if p.is_dir() or p.name.lower().endswith(".zip") or (p.is_file() and is_dicom_file(p)):
        return "dicom"
    return "nifti"
