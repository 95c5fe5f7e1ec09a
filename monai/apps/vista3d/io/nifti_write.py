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
"""Writing label maps and per-class masks as NIfTI on the input's grid: the header marked as this pipeline's
output, the voxels cast on the device and moved once in the narrow type, gzip-compressed block-parallel, every
file of a set written to a temporary name and renamed together (nothing half written)."""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
import zlib
from collections.abc import Mapping
from typing import Any

import nibabel as nib
import numpy as np
import torch

from monai.apps.vista3d.config import DEFAULT_OUTPUT_DTYPE
from monai.apps.vista3d.errors import Vista3DInputError, Vista3DOutputError
from monai.apps.vista3d.labels import label_name

from .atomic import commit, discard, write_temp
from .gzip_codec import GZIP_MAGIC, available_cores, gzip_codec, write_gzip
from .image_geometry import ImageGeometry
from .label_transfer import file_order_slabs
from .nifti_read import header_from_bytes, header_start, vox_offset
from .paths import class_mask_paths, same_file

__all__ = [
    "save_label_map",
    "save_class_masks",
    "mark_output_header",
    "is_vista3d_output",
    "read_output_record",
    "output_problem",
    "DEFAULT_COMPRESSLEVEL",
]

#: gzip level used when ``save_label_map(compresslevel=None)``: label maps are mostly long runs, so level 1
#: is several times faster than the gzip default (6) for a few percent larger files.
DEFAULT_COMPRESSLEVEL = 1


def _output_header(geometry: ImageGeometry, shape: tuple[int, ...], dtype: np.dtype, record: Any = None) -> Any:
    hdr = geometry.header
    if hdr is None:
        hdr = nib.Nifti1Header()
        hdr.set_qform(geometry.affine, code=1)
        hdr.set_sform(geometry.affine, code=1)
        hdr.set_xyzt_units("mm")
    hdr = hdr.copy()
    if not getattr(hdr, "is_single", True):  # header of a .hdr/.img pair: write it as a single file
        klass = nib.Nifti2Header if isinstance(hdr, nib.Nifti2Header) else nib.Nifti1Header
        single = klass(binaryblock=hdr.binaryblock, endianness=hdr.endianness)
        single["magic"] = klass.single_magic if hasattr(klass, "single_magic") else b"n+1"
        single.extensions[:] = list(hdr.extensions)
        hdr = single
    if hdr.endianness != "<":
        hdr = hdr.as_byteswapped("<")
    if not np.allclose(hdr.get_best_affine(), geometry.affine, atol=1e-6):
        # the caller changed the geometry: write its affine like nibabel does (codes kept when set)
        hdr.set_sform(geometry.affine, code=int(hdr["sform_code"]) or 2)
        hdr.set_qform(geometry.affine, code=int(hdr["qform_code"]) or 2)
    elif geometry.stored_header is not None:
        _keep_stored_geometry(hdr, geometry.stored_header)
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(dtype)
    hdr["scl_slope"], hdr["scl_inter"] = 1.0, 0.0  # values are label ids: no scaling
    hdr["cal_min"], hdr["cal_max"] = 0.0, 0.0  # the input's display window means nothing for labels
    hdr["vox_offset"] = 0  # recomputed by write_to from the extensions
    mark_output_header(hdr)
    _set_record(hdr, record)
    return hdr


#: the start of the header extension (a NIfTI 'comment') that records how a label map was made
_RECORD_MARK = b"vista3d-settings "


def _record_text(ext: Any) -> bytes | None:
    """The settings record an extension holds (a 'comment' starting with the mark), else None."""
    if ext.get_code() != _COMMENT:
        return None
    content = ext.get_content()
    return content.rstrip(b"\x00") if isinstance(content, bytes) and content.startswith(_RECORD_MARK) else None


_COMMENT = 6  # NIFTI_ECODE_COMMENT


def _set_record(hdr: Any, record: Any) -> None:
    """Put ``record`` (JSON-able) into ``hdr`` as its one settings extension (an input's own is dropped)."""
    hdr.extensions[:] = [e for e in hdr.extensions if _record_text(e) is None]
    if record is not None:
        text = _RECORD_MARK + json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        hdr.extensions.append(nib.nifti1.Nifti1Extension("comment", text))


def read_output_record(path: str | os.PathLike) -> dict | None:
    """The settings a label map of this program was made with (``save_label_map(record=...)``), or None: none
    recorded (an older version's output, another program's file) or an unreadable file or record."""
    p = pathlib.Path(path)
    try:
        hdr = header_from_bytes(header_start(p), p)
        for ext in hdr.extensions:
            text = _record_text(ext)
            if text is not None:
                record = json.loads(text[len(_RECORD_MARK):])
                return record if isinstance(record, dict) else None  # what save_label_map writes is an object
    except (OSError, ValueError, zlib.error):
        return None
    return None


#: the header fields that place the voxels in the world
_GEOMETRY_FIELDS = ("pixdim", "qform_code", "sform_code", "quatern_b", "quatern_c", "quatern_d", "qoffset_x",
                    "qoffset_y", "qoffset_z", "srow_x", "srow_y", "srow_z")


def _keep_stored_geometry(hdr: Any, block: bytes) -> None:
    """Give ``hdr`` the geometry fields exactly as the input's file stores them (``block``): nibabel's reading makes a
    negative pixdim positive and resets odd codes, which moves the result against the input in other readers."""
    try:
        stored = type(hdr)(binaryblock=block, check=False)  # byte order from its sizeof_hdr
    except Exception:  # a block this header class cannot take: keep nibabel's reading
        return
    for name in _GEOMETRY_FIELDS:
        hdr[name] = stored[name]


#: the NIfTI intent of every file this program writes (NIFTI_INTENT_LABEL) and the name beside it
_OUTPUT_INTENT, _OUTPUT_INTENT_NAME = 1002, "vista3d"


def mark_output_header(hdr: Any) -> None:
    """Mark a header as a label map (or mask) written by this program: intent 'label', intent name 'vista3d'.

    Any NIfTI reader shows the intent; :func:`is_vista3d_output` recognises it, so that a folder search never
    reads an output back as a CT, whatever its name or folder.
    """
    hdr.set_intent(_OUTPUT_INTENT, name=_OUTPUT_INTENT_NAME)


def output_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with an output file on disk (``"missing"``, ``"incomplete: ..."``), or None when it is whole.

    Whole: the header reads and the file holds every voxel it declares (a ``.nii.gz`` is inflated to the end, so
    that its CRC and length are checked too).
    """
    p = pathlib.Path(path)
    if not p.is_file():
        return "missing"
    try:
        with open(p, "rb") as f:
            head = f.read(1 << 16)
            gz = head[:2] == GZIP_MAGIC
            if gz:
                f.seek(0)
                d, total, first = zlib.decompressobj(31), 0, b""
                while piece := f.read(1 << 20):
                    while piece:
                        if d.eof:  # another member follows
                            d = zlib.decompressobj(31)
                        out = d.decompress(piece, 1 << 22)  # bounded: a label map inflates ~100x
                        total += len(out)
                        if len(first) < max(544, vox_offset(first)):  # the header and its extensions
                            first = (first + out)[: max(544, vox_offset(first + out))]
                        piece = d.unused_data if d.eof else d.unconsumed_tail
                if not d.eof:
                    return "incomplete: the gzip stream is truncated"
                head = first
            else:
                total = p.stat().st_size
        hdr = header_from_bytes(head, p)
    except (OSError, ValueError, zlib.error) as e:
        return f"incomplete: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    need = int(hdr["vox_offset"]) + math.prod(hdr.get_data_shape()) * hdr.get_data_dtype().itemsize
    if total < need:
        return f"incomplete: {total} of {need} bytes"
    return None


def is_vista3d_output(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a NIfTI file that this program wrote (see :func:`mark_output_header`).

    Reads the header only; anything unreadable is not an output (it fails as an input, with its own message).
    """
    p = pathlib.Path(path)
    try:
        if not p.is_file():
            return False
        hdr = header_from_bytes(header_start(p), p)  # the header and its extensions (inflated as far as needed)
        return int(hdr["intent_code"]) == _OUTPUT_INTENT and hdr.get_intent()[2] == _OUTPUT_INTENT_NAME
    except (OSError, ValueError, zlib.error):
        return False


def _header_bytes(hdr: Any) -> bytes:
    bio = io.BytesIO()
    hdr.write_to(bio)
    out = bio.getvalue()
    return out + b"\x00" * (int(hdr["vox_offset"]) - len(out))


_OUTPUT_DTYPES = ("uint8", "int16", "uint16", "int32", "float32", "float64")


def save_label_map(
    labels: torch.Tensor | np.ndarray,
    geometry: ImageGeometry,
    path: str | os.PathLike,
    dtype: str = DEFAULT_OUTPUT_DTYPE,
    compresslevel: int | None = None,
    *,
    threads: int | None = None,
    record: Mapping[str, Any] | None = None,
) -> pathlib.Path:
    """Write a label map on the input grid as NIfTI, atomically.

    The file gets the input's affine and header (qform/sform and codes kept), ``datatype`` set to ``dtype``,
    ``scl_slope``/``scl_inter`` reset to 1/0 and ``cal_min``/``cal_max`` to 0. It is written to a temporary
    name in the same folder, flushed to disk and renamed, so a crash never leaves a partial file under
    ``path``; the input file is never touched.

    The voxels are cast and laid out in file order slab by slab of z-slices, each slab compressed as one block
    on ``threads`` threads (one standard gzip stream). A label map on a GPU is transposed there and copied to
    the host in the narrowest integer type that holds its labels (or in ``dtype``), then widened to ``dtype``
    slab by slab on the compressing threads.

    Args:
        labels: ``[X, Y, Z]`` or ``[1, X, Y, Z]`` tensor (any device) or array on the input grid.
        geometry: the input's geometry from :func:`load_image`.
        path: ``.nii.gz`` (gzip) or ``.nii``; missing parent folders are created.
        dtype: one of uint8 (the default: label ids 0-132 and the 255 sentinel fit), int16, uint16, int32,
            float32 (what the VISTA3D bundle writes), float64.
        compresslevel: gzip level 0-9 (``None``: :data:`DEFAULT_COMPRESSLEVEL`); with isal, 1-3 map to its levels.
        threads: compression threads (``None``: one per available core).
        record: how the label map was made (JSON-able), kept in its header as a NIfTI comment extension (see
            :func:`read_output_record`), so that a rerun with other settings can tell.

    Returns:
        The path written.

    Raises:
        Vista3DInputError: wrong shape, label ids that do not fit ``dtype``, unknown ``dtype`` or suffix.
        Vista3DOutputError: the output is the input file, or its folder cannot be created or written.
    """
    p = pathlib.Path(path)
    out_dtype, level = _check_save(p, geometry, dtype, compresslevel)
    threads = available_cores() if threads is None else max(1, int(threads))
    commit([(_write_part(labels, geometry, p, out_dtype, level, threads, record), p)])
    return p


def _check_save(
    p: pathlib.Path, geometry: ImageGeometry, dtype: str, compresslevel: int | None
) -> tuple[np.dtype, int]:
    """Check a save's target and settings before any work: ``(little-endian output dtype, gzip level)``."""
    name = p.name
    if not name.endswith((".nii", ".nii.gz")):
        raise Vista3DInputError(f"{p}: output must end with .nii or .nii.gz.")
    if same_file(p, geometry.filename):
        raise Vista3DOutputError(f"{p}: the output path is the input file; choose another output folder or name.")
    if str(dtype) not in _OUTPUT_DTYPES:
        raise Vista3DInputError(f"output dtype {dtype!r} is not supported; use one of {', '.join(_OUTPUT_DTYPES)}.")
    level = DEFAULT_COMPRESSLEVEL if compresslevel is None else int(compresslevel)
    if not 0 <= level <= 9:
        raise Vista3DInputError(f"compresslevel {compresslevel} out of range; use 0 (none) to 9 (smallest).")
    return np.dtype(dtype).newbyteorder("<"), level


def _write_part(
    labels: Any, geometry: ImageGeometry, p: pathlib.Path, out_dtype: np.dtype, level: int, threads: int,
    record: Any = None,
) -> str:
    """Write ``labels`` complete and flushed to disk under a temporary name beside ``p``; return that name.

    Nothing is left behind on failure. The caller renames the file to ``p`` (:func:`~.atomic.commit`).
    """
    name = p.name
    slabs = file_order_slabs(labels, geometry.spatial_shape, out_dtype, threads)
    head = _header_bytes(_output_header(geometry, tuple(geometry.spatial_shape), out_dtype, record))

    def write(f: Any) -> None:
        if name.endswith(".gz"):
            # ISA-L's level 0 still compresses; a stored (level 0) stream comes from zlib
            codec = gzip_codec() if level > 0 else zlib
            write_gzip(f, [head, *slabs], level, threads, codec)
        else:
            f.write(head)
            for slab in slabs:
                f.write(slab().data.cast("B"))

    return write_temp(p, write)


# ------------------------------------------------------------------------------------------ per-class masks


def save_class_masks(
    masks: Mapping[int, Any],
    geometry: ImageGeometry,
    folder: str | os.PathLike,
    compresslevel: int | None = None,
    *,
    threads: int | None = None,
) -> dict[int, pathlib.Path]:
    """Write one uint8 mask per class, ``folder/<class name>.nii.gz``, as a complete set or not at all.

    Each file is written like :func:`save_label_map` (the input's grid, affine and header; slabs cast and
    compressed on ``threads`` threads; a mask on a GPU laid out there). Every file is first written in full to a
    temporary name in ``folder`` and flushed to disk; only when all are written are they renamed to their names,
    so a failure while writing leaves none of them (and the previous set, if any, untouched). Masks of classes not
    in ``masks`` that a previous run left in ``folder`` stay.

    Args:
        masks: label id -> ``[X, Y, Z]`` (or ``[1, X, Y, Z]``) bool or 0/1 tensor (any device) or array on the
            input grid, e.g. :class:`~monai.apps.vista3d.core.postprocess.ClassMasks`; unpacked one class at a time.
        geometry: the input's geometry from :func:`load_image`.
        folder: where the masks go (:func:`~monai.apps.vista3d.io.paths.class_mask_dir`); created when missing.
        compresslevel: gzip level 0-9 (``None``: :data:`DEFAULT_COMPRESSLEVEL`).
        threads: compression threads per file (``None``: one per available core).

    Returns:
        label id -> the path written, in the order of ``masks``.

    Raises:
        Vista3DInputError: no masks, a mask off the input grid or with values outside uint8.
        Vista3DOutputError: a file would be the input file, or the folder cannot be created or written.
    """
    if len(masks) == 0:
        raise Vista3DInputError("no class masks to save: give at least one class (a class prompt, not points only).")
    paths = class_mask_paths(folder, masks)
    out_dtype, level = [_check_save(p, geometry, "uint8", compresslevel) for p in paths.values()][0]
    threads = available_cores() if threads is None else max(1, int(threads))
    written: list[tuple[str, pathlib.Path]] = []
    try:
        for label_id, p in paths.items():
            try:
                written.append((_write_part(masks[label_id], geometry, p, out_dtype, level, threads), p))
            except Vista3DInputError as e:
                if isinstance(e, Vista3DOutputError):
                    raise
                raise type(e)(f"mask of class {label_id} ({label_name(label_id)}): {e}") from None
    except BaseException:
        discard([tmp for tmp, _ in written])
        raise
    commit(written)
    return paths
