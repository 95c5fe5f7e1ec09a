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
"""A DICOM series sent as a zip archive, checked before the model reads it, as a NIfTI file's header is.

The archive's central directory states what each member inflates to, and zipfile never inflates a member past
that (the member then fails its CRC), so those sizes bound what the load can take. Nothing is extracted to disk:
the load reads the DICOM members into memory (:func:`~monai.apps.vista3d.io.dicom.load_dicom`). Refused here, one
line each, before the request waits for the model:

- more than :data:`MAX_ZIP_MEMBERS` members (413);
- a member name that would land outside the folder it was extracted to (an absolute path, a drive, ``..``), or an
  encrypted member (422): zipping a series folder makes neither;
- no DICOM member (a file with the DICM marker; 422);
- more voxels than ``--max-voxels``, counted from the members' headers (rows x columns x frames; 413);
- a DICOM member stated to inflate past what its header describes (its pixel data, plus room for the header
  itself: :data:`HEADER_ALLOWANCE`, and per frame :data:`FRAME_HEADER_ALLOWANCE`): a zip bomb (413); DICOM members
  without an image (a DICOMDIR, a report), which the load reads and sets aside, at most :data:`NON_IMAGE_BYTES`
  together (413).

Only the first :data:`HEADER_PREFIX` bytes of a member are inflated for this (the image attributes come early in a
DICOM header); the headers are read with pydicom, so a zip needs the ``dicom`` extra on the server (415 without).
"""

from __future__ import annotations

import io
import math
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monai.apps.vista3d.errors import first_line
from monai.apps.vista3d.io.dicom_files import has_dicom_marker

from .errors import ServeError, too_many_voxels

__all__ = ["ZipSeries", "inspect_dicom_zip", "MAX_ZIP_MEMBERS", "HEADER_ALLOWANCE", "FRAME_HEADER_ALLOWANCE",
           "HEADER_PREFIX", "NON_IMAGE_BYTES"]

#: members a zip may hold (a thin-sliced whole-body CT has a few thousand slices)
MAX_ZIP_MEMBERS = 20_000
#: bytes of a DICOM member beyond its pixel data that are taken for its header
HEADER_ALLOWANCE = 1 << 20
#: more header bytes allowed per frame (a multi-frame file describes each frame)
FRAME_HEADER_ALLOWANCE = 16 << 10
#: bytes of each member inflated to read its header
HEADER_PREFIX = 64 << 10
#: bytes the DICOM members without an image may inflate to together (a DICOMDIR of a large study is a few MB)
NON_IMAGE_BYTES = 64 << 20

_UNSAFE_NAME = re.compile(r"^([\\/]|[A-Za-z]:)|(^|[\\/])\.\.([\\/]|$)")


@dataclass(frozen=True)
class ZipSeries:
    """What :func:`inspect_dicom_zip` found.

    Attributes:
        members: the DICOM members' names.
        voxels: voxels of all of them together.
        shape: ``(columns, rows, frames)``: the first DICOM member's image size, and the frames of all of them.
        inflated_bytes: what the DICOM members inflate to, as the archive states.
    """

    members: tuple[str, ...]
    voxels: int
    shape: tuple[int, int, int]
    inflated_bytes: int


def _pydicom() -> Any:
    try:
        import pydicom
    except ImportError:
        raise ServeError(415, "DICOM zip archives need the 'dicom' extra on the server (pip install "
                              "'monai[dicom]'); or send the series as NIfTI") from None
    return pydicom


def _image_size(pydicom: Any, head: bytes) -> tuple[int, int, int, int]:
    """``(columns, rows, frames, bytes per voxel)`` from the start of a DICOM file (zeros where it has no image)."""
    ds = pydicom.dcmread(io.BytesIO(head), stop_before_pixels=True, force=True)

    def number(keyword: str, default: int) -> int:
        try:
            value = int(getattr(ds, keyword, default) or default)
        except (TypeError, ValueError):
            return 0
        return max(0, value)

    per_voxel = number("SamplesPerPixel", 1) * math.ceil(number("BitsAllocated", 16) / 8)
    return number("Columns", 0), number("Rows", 0), number("NumberOfFrames", 1), per_voxel


def _check_names(infos: list[zipfile.ZipInfo]) -> None:
    if len(infos) > MAX_ZIP_MEMBERS:
        raise ServeError(413, f"the zip archive has {len(infos)} members, more than the {MAX_ZIP_MEMBERS} a series "
                              "takes; send one series per request")
    for info in infos:
        if _UNSAFE_NAME.search(info.filename) or "\x00" in info.filename:
            raise ServeError(422, f"the zip archive has a member named {info.filename[:80]!r}, a path outside the "
                                  "archive's folder; zip the series folder itself (e.g. zip -r series.zip SERIES)")
        if info.flag_bits & 0x1:
            raise ServeError(422, f"the zip archive's member {info.filename[:80]!r} is encrypted; send it "
                                  "unencrypted (over https for privacy)")


def inspect_dicom_zip(path: Path, max_voxels: int) -> ZipSeries:
    """Check a zip archive of a DICOM series before the model reads it (see the module); what it holds.

    Raises:
        ServeError: what the module lists (413 or 422), 422 for a damaged archive, 415 without pydicom.
    """
    pydicom = _pydicom()
    members: list[str] = []
    voxels = inflated = frames = other = 0
    first: tuple[int, int] | None = None
    try:
        with zipfile.ZipFile(path) as z:
            infos = [i for i in z.infolist() if not i.is_dir()]
            _check_names(infos)
            for info in infos:
                with z.open(info) as f:
                    head = f.read(HEADER_PREFIX)
                if not has_dicom_marker(head):
                    continue
                try:
                    columns, rows, n, per_voxel = _image_size(pydicom, head)
                except Exception as e:  # pydicom raises several types for a damaged header
                    raise ServeError(422, f"the zip archive's member {info.filename[:80]!r} has the DICOM marker but "
                                          f"no readable header ({first_line(e)}); zip the series again") from None
                pixels = columns * rows * n
                if not pixels:
                    other += info.file_size
                    if other > NON_IMAGE_BYTES:
                        raise ServeError(413, f"the zip archive's DICOM files without an image (a DICOMDIR, reports) "
                                              f"inflate to more than {NON_IMAGE_BYTES} bytes; leave them out")
                    continue
                allowed = pixels * per_voxel + HEADER_ALLOWANCE + FRAME_HEADER_ALLOWANCE * n
                if info.file_size > allowed:
                    raise ServeError(413, f"the zip archive's member {info.filename[:80]!r} inflates to "
                                          f"{info.file_size} bytes, more than its header describes ({allowed}); a "
                                          "zip bomb, or a damaged file: refused")
                members.append(info.filename)
                voxels += pixels
                inflated += info.file_size
                frames += n
                first = first or (columns, rows)
                if voxels > max_voxels:
                    raise too_many_voxels(voxels, max_voxels, "at least: the zip's DICOM headers counted so far")
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError) as e:
        raise ServeError(422, f"not a readable zip archive ({first_line(e)}); zip the series again (unencrypted, "
                              "deflated or stored)") from None
    if not members:
        raise ServeError(422, "the zip archive holds no DICOM image (no member with the DICM marker has one); zip "
                              "the folder of one CT series")
    return ZipSeries(tuple(members), voxels, (*(first or (0, 0)), frames), inflated)
