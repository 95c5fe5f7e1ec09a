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
"""What an input path is, from its name and first bytes: the one place where the kind of an input is decided.

The folder search, the batch's check of its inputs before any work, the one load policy and
:func:`~.nifti.load_image` all ask here. A DICOM series (a folder of DICOM files, a zip of one, a DICOM file) goes
to the DICOM reader (:mod:`.dicom`, the ``dicom`` extra), a file that may be NIfTI to the NIfTI reader, which checks
its header; an NRRD or MetaImage file, a folder that is no series or a missing path is said in one line, with what
to do, wherever it is given.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import zlib
from collections import Counter

import numpy as np

from .dicom_files import DICOM_HEAD_BYTES, DICOM_SUFFIXES, ZIP_MAGIC, has_dicom_marker, is_series_folder, is_zip_archive
from .gzip_codec import GZIP_MAGIC
from .nifti_read import header_from_bytes, header_start

__all__ = ["input_kind", "input_problem", "folder_problem", "looks_like_label_map", "NIFTI_SUFFIXES"]

#: the names the folder search takes for images
NIFTI_SUFFIXES = (".nii", ".nii.gz")

_CONVERT_HINT = ("convert it to .nii.gz first (e.g. with 3D Slicer, or SimpleITK: "
                 "sitk.WriteImage(sitk.ReadImage('{name}'), 'image.nii.gz'))")
# most files of a folder whose first bytes are read to say what the folder holds
_FOLDER_SAMPLE = 2000


def input_kind(path: str | os.PathLike) -> str:
    """The kind of ``path``: ``"missing"``, ``"folder"`` (one that holds no DICOM file itself), ``"nifti"`` (by its
    first bytes or name: its header is the reader's to check), ``"dicom"`` (a DICOM file, a series folder or a zip
    archive: the DICOM reader's), ``"nrrd"``, ``"metaimage"``, or ``"other"``."""
    p = pathlib.Path(path)
    if p.is_dir():
        return "dicom" if is_series_folder(p) else "folder"
    if not p.exists():
        return "missing"
    if not p.is_file():  # a device or a pipe: never opened (reading a pipe would wait for a writer)
        return "other"
    name = p.name.lower()
    try:
        with open(p, "rb") as f:
            head = f.read(DICOM_HEAD_BYTES)
    except OSError:
        head = b""
    if has_dicom_marker(head):
        return "dicom"
    if head.startswith(b"NRRD000"):
        return "nrrd"
    if head.startswith((b"ObjectType", b"NDims")):
        return "metaimage"
    if head.startswith(ZIP_MAGIC) and is_zip_archive(p):  # a zip of one DICOM series
        return "dicom"
    if head.startswith(GZIP_MAGIC) or _sizeof_hdr(head) in (348, 540):  # gzip (what it holds is the reader's) or NIfTI
        return "nifti"
    for kind, suffixes in _SUFFIX_KINDS:
        if name.endswith(suffixes):
            return kind
    return "other"


def _sizeof_hdr(head: bytes) -> int | None:
    """The NIfTI-1/2 header size field (either byte order), when ``head`` holds one of those sizes."""
    for order in ("little", "big"):
        if len(head) >= 4 and int.from_bytes(head[:4], order) in (348, 540):
            return int.from_bytes(head[:4], order)
    return None


# kinds known by their name alone (a DICOM file without the Part 10 preamble, a detached NRRD header)
_SUFFIX_KINDS = (
    ("nifti", NIFTI_SUFFIXES),
    ("dicom", DICOM_SUFFIXES),
    ("nrrd", (".nrrd", ".nhdr")),
    ("metaimage", (".mha", ".mhd")),
)


def input_problem(path: str | os.PathLike, nifti_only: bool = False) -> str | None:
    """Why ``path`` cannot be read as an image, in one line that starts with the path and says what to do; None
    when it may be one (a file whose header the NIfTI reader then checks, or a DICOM input, whose reader says what
    is wrong with it, if anything). ``nifti_only``: for a reader of NIfTI alone, a DICOM input is a problem too."""
    p = pathlib.Path(path)
    kind = input_kind(p)
    if kind in ("nifti", "other"):
        if not p.is_file():
            return f"{p}: not a regular file; give a .nii or .nii.gz file."
        return None
    if kind == "dicom":
        if nifti_only:
            return (f"{p}: a DICOM input; load_image reads NIfTI: read it with monai.apps.vista3d.io.load_policy."
                    "load_input (or io.dicom.load_dicom).")
        return None
    if kind == "missing":
        if p.is_symlink():
            return f"{p}: a broken symbolic link (to {os.readlink(p)}); fix or remove the link."
        return f"{p}: no such file; check the path."
    if kind == "folder":
        return (f"{p}: is a folder with no DICOM file directly inside, not an image; give a .nii or .nii.gz file, or "
                "the folder of one DICOM series.")
    what = {"nrrd": "an NRRD file", "metaimage": "a MetaImage file"}[kind]
    serve = " (vista3d serve reads NRRD)" if kind == "nrrd" else ""
    return (f"{p}: {what}; the command line and run_batch read NIfTI (.nii, .nii.gz){serve}: "
            f"{_CONVERT_HINT.format(name=p.name)}.")


def _hidden(rel: pathlib.Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def folder_problem(folder: str | os.PathLike) -> str:
    """Why the folder search found no image (NIfTI file, DICOM series folder) in ``folder``: what it holds instead,
    in one line with what to do."""
    root = pathlib.Path(folder)
    if not root.is_dir():
        return input_problem(root) or f"{root}: not a folder"
    files = (p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
    kinds = Counter(input_kind(p) for p in itertools.islice(files, _FOLDER_SAMPLE))
    if kinds["dicom"]:  # zip archives: the folder search takes none (give each with -i: a zip of one series)
        return (f"{root}: holds zip archives or DICOM files ({kinds['dicom']}) and no image the folder search takes; "
                "give a zip of one DICOM series with -i, or the series' folder.")
    for kind, what, how in (("nrrd", "NRRD files", _CONVERT_HINT.format(name="x.nrrd")),
                            ("metaimage", "MetaImage files", _CONVERT_HINT.format(name="x.mha"))):
        if kinds[kind]:
            return f"{root}: holds {what} ({kinds[kind]}) and no .nii or .nii.gz image; {how}."
    return f"{root}: no .nii or .nii.gz image or DICOM series found (searched recursively, hidden files left out)."


#: NIfTI intents that say a file holds labels (NIFTI_INTENT_LABEL, NIFTI_INTENT_NEURONAME)
_LABEL_INTENTS = (1002, 1003)
#: most distinct values in the first slice of a label map (a CT's holds many: air, noise, tissue)
_LABEL_VALUES = 32


def looks_like_label_map(path: str | os.PathLike) -> bool:
    """Whether a NIfTI file is a label map (another tool's segmentation) rather than a CT, by a cheap rule: its header
    has a label intent, or its first z-slice (the only voxels read) holds whole numbers only, at most 32 distinct
    ones, the smallest 0 (the background of a label map). A CT's first slice holds air (about -1000 HU) and noise,
    so it is never taken for one. A file that cannot be read is no label map (it fails as an input, saying why)."""
    p = pathlib.Path(path)
    try:
        hdr = header_from_bytes(header_start(p), p)
        if int(hdr["intent_code"]) in _LABEL_INTENTS:
            return True
        shape, dtype = hdr.get_data_shape(), hdr.get_data_dtype()
        if len(shape) < 3 or min(shape[:3]) < 2 or dtype.kind not in "biuf":  # no volume: its load says what it is
            return False
        count = int(shape[0]) * int(shape[1])
        head = header_start(p, count * dtype.itemsize)
        start = int(hdr.get_data_offset())
        first = np.frombuffer(head, dtype=dtype, count=count, offset=start).astype(np.float64)
    except (OSError, ValueError, TypeError, zlib.error):
        return False
    slope, inter = hdr.get_slope_inter()
    first = first * (1.0 if slope is None else slope) + (inter or 0.0)
    return bool(np.all(np.isfinite(first)) and first.min() == 0 and np.all(first == np.round(first))
                and len(np.unique(first)) <= _LABEL_VALUES)
