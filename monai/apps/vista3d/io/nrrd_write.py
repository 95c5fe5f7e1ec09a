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
"""Writing a label map as NRRD, the format 3D Slicer asks for: a text header placing the grid in its space, then
the voxels gzip-compressed block-parallel as the NIfTI writer compresses them (both formats store the first axis
fastest), under a temporary name renamed once complete.

pynrrd's writer transposes on the host and deflates on one thread with zlib: about 0.4 s for a 512x512x200 mask,
ten times a click on an H100. Here a label map on a GPU is laid out and narrowed there, and ISA-L (where
installed) compresses the slabs on every core.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from monai.apps.vista3d.errors import Vista3DInputError

from .atomic import commit, write_temp
from .gzip_codec import available_cores, gzip_codec, write_gzip
from .label_transfer import file_order_slabs
from .nifti_write import DEFAULT_COMPRESSLEVEL

__all__ = ["save_nrrd", "nrrd_header", "NRRD_TYPES"]

#: NRRD's names of the voxel types a label map is written in
NRRD_TYPES = {"uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32", "float32": "float",
              "float64": "double"}

def _vector(values: Any) -> str:
    return "(" + ",".join(repr(float(v)) for v in values) + ")"


def nrrd_header(shape: tuple[int, int, int], dtype: str, placement: Mapping[str, Any]) -> bytes:
    """The text header of a gzip-encoded 3D NRRD of ``shape`` voxels of ``dtype``, placed by ``placement``: its
    ``space`` (e.g. ``"left-posterior-superior"``), ``space directions`` (row ``i``: the step of voxel axis ``i``)
    and ``space origin`` (the first voxel's centre)."""
    directions = np.asarray(placement["space directions"], dtype=np.float64)
    origin = np.asarray(placement["space origin"], dtype=np.float64)
    if directions.shape != (3, 3) or origin.shape != (3,) or not (np.isfinite(directions).all()
                                                                   and np.isfinite(origin).all()):
        raise Vista3DInputError(f"NRRD placement needs 3 finite directions of 3 and a finite origin of 3, got "
                                f"{directions.tolist()} and {origin.tolist()}.")
    lines = ["NRRD0004", f"type: {NRRD_TYPES[dtype]}", "dimension: 3", f"space: {placement['space']}",
             "sizes: " + " ".join(str(int(n)) for n in shape),
             "space directions: " + " ".join(_vector(row) for row in directions),
             "kinds: domain domain domain"]
    if np.dtype(dtype).itemsize > 1:
        lines.append("endian: little")
    lines += ["encoding: gzip", f"space origin: {_vector(origin)}"]
    return ("\n".join(lines) + "\n\n").encode("ascii")


def save_nrrd(labels: Any, placement: Mapping[str, Any], path: str | os.PathLike, dtype: str = "uint8",
              *, threads: int | None = None) -> pathlib.Path:
    """Write ``labels`` (``[X, Y, Z]`` or ``[1, X, Y, Z]``; a tensor on any device, or an array) as a gzip-encoded
    NRRD of ``dtype`` placed by ``placement`` (see :func:`nrrd_header`), whole or not at all.

    Args:
        labels: the label map; its values must fit ``dtype``.
        placement: ``space``, ``space directions`` and ``space origin`` of the grid.
        path: ends with ``.nrrd``; missing parent folders are created.
        dtype: a key of :data:`NRRD_TYPES`.
        threads: compression threads (``None``: one per available core).

    Raises:
        Vista3DInputError: a wrong suffix, voxel type, shape or placement, or labels that do not fit ``dtype``.
        Vista3DOutputError: the folder cannot be created or written.
    """
    p = pathlib.Path(path)
    if not p.name.endswith(".nrrd"):
        raise Vista3DInputError(f"{p}: an NRRD output must end with .nrrd.")
    if dtype not in NRRD_TYPES:
        raise Vista3DInputError(f"NRRD voxel type {dtype!r} is not supported; use one of {', '.join(NRRD_TYPES)}.")
    dims = tuple(int(n) for n in labels.shape)
    if len(dims) not in (3, 4) or (len(dims) == 4 and dims[0] != 1):
        raise Vista3DInputError(f"a label map of shape {dims} cannot be written as NRRD; give [X, Y, Z] or "
                                "[1, X, Y, Z].")
    shape = (dims[-3], dims[-2], dims[-1])
    threads = available_cores() if threads is None else max(1, int(threads))
    head = nrrd_header(shape, dtype, placement)  # checked before any voxel moves
    slabs = file_order_slabs(labels, shape, np.dtype(dtype).newbyteorder("<"), threads)

    def write(f: Any) -> None:
        f.write(head)
        write_gzip(f, slabs, DEFAULT_COMPRESSLEVEL, threads, gzip_codec())

    commit([(write_temp(p, write), p)])
    return p
