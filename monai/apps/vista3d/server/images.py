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
"""Image files as the server receives and answers them: NIfTI, NRRD where ``pynrrd`` is installed, and a zip
archive of one DICOM series where the ``dicom`` extra is (checked by :mod:`~.dicom_zip`, answered as NIfTI).

:func:`inspect_image` looks at a file before any model work: what it is (by its bytes, not its name), how many
voxels its header claims (refused over ``--max-voxels`` before anything is inflated) and, for compressed data,
how many bytes its stream should inflate to; :func:`check_inflated_size` counts them, stopping one MiB past that,
so a gzip bomb costs at most that (the server counts what a client sends). :func:`load_nrrd` reads an NRRD volume
and its RAS affine, :func:`write_label_map` writes a label map (or a box of it) in the input's geometry, in its
format or the one the request's ``output`` asks for (:class:`AnswerFormat`).
"""

from __future__ import annotations

import io
import math
import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import nibabel as nib
import numpy as np
import torch

from monai.apps.vista3d.io.dicom_files import ZIP_MAGIC, has_dicom_marker
from monai.apps.vista3d.io.gzip_codec import GZIP_MAGIC, gzip_codec
from monai.apps.vista3d.io.image_geometry import LPS_RAS_FLIP, ImageGeometry, as_xyz
from monai.apps.vista3d.io.nifti_write import save_label_map
from monai.apps.vista3d.io.nrrd_write import save_nrrd

from .dicom_zip import inspect_dicom_zip
from .errors import ServeError, too_many_voxels

__all__ = ["ImageInfo", "LoadedImage", "AnswerFormat", "inspect_image", "check_inflated_size", "load_nrrd",
           "write_label_map", "nrrd_placement", "zip_one", "safe_stem", "nrrd_available"]

_CHUNK = 1 << 20  # bytes read, and bytes inflated, per step of the counted inflate
_SLACK = 1 << 20  # inflated bytes tolerated past what the header describes (padding some writers add)
_NIFTI_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".gz", ".zip")


def nrrd_available() -> bool:
    """True when ``pynrrd`` imports (the ``nrrd`` extra)."""
    try:
        import nrrd  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class ImageInfo:
    """What :func:`inspect_image` found: ``format`` is ``"nifti"``, ``"nrrd"`` or ``"dicom"`` (a zip of a series),
    ``shape`` the header's dims, ``inflated_bytes`` what the file's gzip stream should inflate to (``None``: not
    compressed, or a zip, whose members :func:`~.dicom_zip.inspect_dicom_zip` has checked)."""

    format: str
    shape: tuple[int, ...]
    inflated_bytes: int | None = None


@dataclass
class LoadedImage:
    """How to answer in an image's own format: its name, format, grid, and geometry.

    Attributes:
        name: the base of the answer's file name (``ct`` -> ``ct_trans.nii.gz``).
        format: ``"nifti"`` or ``"nrrd"``.
        shape: ``(X, Y, Z)`` of the input grid.
        geometry: an :class:`~monai.apps.vista3d.io.nifti.ImageGeometry` for NIfTI; for NRRD the header fields that
            place the grid (``space``, ``space directions``, ``space origin``).
    """

    name: str
    format: str
    shape: tuple[int, int, int]
    geometry: Any

    @property
    def suffix(self) -> str:
        return ".nii.gz" if self.format == "nifti" else ".nrrd"


def safe_stem(text: str) -> str:
    """A file-name stem from a URL path, an upload's name or a server path: no folders, no image suffix."""
    base = re.split(r"[\\/]", text.strip())[-1]
    for suffix in _NIFTI_SUFFIXES:
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
            break
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")[:64]
    return stem or "image"


# ------------------------------------------------------------------------------------------ inspection
def _counted_inflate(fh: BinaryIO, cap: int) -> int:
    """Inflate the gzip data from ``fh`` (one or more members, zero padding allowed) counting the bytes it
    gives, and stop with 413 as soon as they pass ``cap``; returns the count."""
    codec = gzip_codec()
    d, total = codec.decompressobj(31), 0
    errors = _inflate_errors(codec)
    try:
        while True:
            chunk = fh.read(_CHUNK)
            data = chunk
            while True:
                if d.eof:
                    data = data.lstrip(b"\x00")
                    if not data:
                        break
                    d = codec.decompressobj(31)  # another member follows
                out = d.decompress(data, _CHUNK)
                total += len(out)
                if total > cap:
                    raise ServeError(413, f"the compressed data inflates to more than the header's {cap - _SLACK} "
                                          "bytes (a gzip bomb, or a wrong header); refused")
                data = d.unused_data if d.eof else d.unconsumed_tail
                if not data and not out:
                    break
            if not chunk:
                return total
    except errors as e:
        raise ServeError(422, f"the image's gzip data is corrupt ({e}); send the file again or re-save it") from None


def _inflate_errors(codec: Any) -> tuple[type[BaseException], ...]:
    return (zlib.error, codec.error)


def _nrrd_itemsize(kind: str) -> int:
    """Bytes per voxel of an NRRD ``type`` (its spellings: ``uchar``, ``unsigned short``, ``int16_t``, ...)."""
    kind = kind.lower()
    if "block" in kind:
        raise ServeError(415, "NRRD voxels of type 'block' cannot be segmented")
    if "char" in kind or "8" in kind:
        return 1
    if "short" in kind or "16" in kind:
        return 2
    if "long" in kind or "64" in kind or "double" in kind:
        return 8
    return 4  # int, uint, float, (u)int32


def _check_voxels(shape: tuple[int, ...], max_voxels: int) -> int:
    voxels = math.prod(int(s) for s in shape) if shape else 0
    if voxels > max_voxels:
        raise too_many_voxels(voxels, max_voxels, f"shape {tuple(int(s) for s in shape)}")
    return voxels


def _nifti_header(head: bytes) -> Any:
    """The NIfTI header in ``head`` (its first 540 bytes), or None when it is not one."""
    if len(head) < 348:
        return None
    for order in ("<", ">"):
        size = int(np.frombuffer(head[:4], dtype=f"{order}i4")[0])
        if size == 348 and head[344:348] == b"n+1\x00":
            return nib.Nifti1Header.from_fileobj(io.BytesIO(head[:348]), check=False)
        if size == 348 and head[344:348] == b"ni1\x00":
            raise ServeError(415, "a NIfTI .hdr/.img pair cannot be sent as one file; save it as a single .nii.gz")
        if size == 540 and len(head) >= 540 and head[4:8] == b"n+2\x00":
            return nib.Nifti2Header.from_fileobj(io.BytesIO(head[:540]), check=False)
    return None


def _gunzip_head(path: Path, n: int) -> bytes:
    codec = gzip_codec()
    d, out = codec.decompressobj(31), b""
    with open(path, "rb") as fh:
        while len(out) < n and not d.eof:
            chunk = fh.read(4096)
            if not chunk:
                break
            try:
                out += d.decompress(chunk, n - len(out))
            except _inflate_errors(codec) as e:
                raise ServeError(422, f"not a readable gzip file ({e}); send a .nii.gz, .nii or .nrrd") from None
    return out


def _not_an_image(head: bytes) -> ServeError:
    if has_dicom_marker(head):
        return ServeError(415, "a single DICOM file: send the whole series as one zip archive of its folder (zip -r "
                               "series.zip SERIES_FOLDER)")
    return ServeError(415, "the file is neither NIfTI (.nii, .nii.gz), NRRD (.nrrd) nor a zip of a DICOM series; "
                           "send one of those")


def inspect_image(path: Path, max_voxels: int) -> ImageInfo:
    """Check an image file before the model reads it (format, voxel count, compressed size); see the module."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head.startswith(ZIP_MAGIC):
        return ImageInfo("dicom", inspect_dicom_zip(path, max_voxels).shape)
    gz = head[:2] == GZIP_MAGIC
    if gz:
        head = _gunzip_head(path, 4096)
    if head.startswith(b"NRRD000"):
        if gz:
            raise ServeError(415, "a gzip-compressed NRRD file: NRRD compresses its own voxels ('encoding: gzip'); "
                                  "send the .nrrd itself")
        return _inspect_nrrd(path, max_voxels)
    hdr = _nifti_header(head)
    if hdr is None:
        raise _not_an_image(head)
    shape = tuple(int(s) for s in hdr.get_data_shape())
    voxels = _check_voxels(shape, max_voxels)
    expected = int(hdr["vox_offset"]) + voxels * hdr.get_data_dtype().itemsize
    return ImageInfo("nifti", shape, expected if gz else None)


def check_inflated_size(path: Path, info: ImageInfo) -> None:
    """Refuse (413) a compressed file that inflates past what its header describes, counting as it inflates."""
    if info.inflated_bytes is not None:
        with open(path, "rb") as fh:
            _counted_inflate(fh, info.inflated_bytes + _SLACK)


def _inspect_nrrd(path: Path, max_voxels: int) -> ImageInfo:
    if not nrrd_available():
        raise ServeError(415, "NRRD images need pynrrd on the server (pip install 'monai[nrrd]'); or send NIfTI")
    import nrrd

    with open(path, "rb") as fh:
        try:
            header = nrrd.read_header(fh)
        except (nrrd.NRRDError, ValueError, StopIteration) as e:
            raise ServeError(422, f"unreadable NRRD header ({e})") from None
        if "data file" in header or "datafile" in header:
            raise ServeError(415, "NRRD with a detached data file ('data file' field) is not accepted; send one "
                                  ".nrrd with its voxels attached")
        shape = tuple(int(s) for s in header.get("sizes", ()))
        if int(header.get("dimension", 0)) != 3 or len(shape) != 3:
            raise ServeError(422, f"only 3D NRRD images are segmented; this one has sizes {shape}")
        voxels = _check_voxels(shape, max_voxels)
        encoding = str(header.get("encoding", "")).lower()
        itemsize = _nrrd_itemsize(str(header.get("type", "")))
        if encoding in ("gzip", "gz"):
            _counted_inflate(fh, voxels * itemsize + _SLACK)
        elif encoding != "raw":
            raise ServeError(415, f"NRRD encoding {encoding!r} is not read here; save it with 'raw' or 'gzip'")
    return ImageInfo("nrrd", shape)


# -------------------------------------------------------------------------------------------- NRRD i/o
#: each NRRD space word -> (RAS axis, sign along it)
_SPACE_WORDS = {"right": (0, 1), "left": (0, -1), "anterior": (1, 1), "posterior": (1, -1),
                "superior": (2, 1), "inferior": (2, -1)}
_SPACE_ABBREV = {"r": "right", "l": "left", "a": "anterior", "p": "posterior", "s": "superior", "i": "inferior"}


def _to_ras(space: str) -> np.ndarray:
    """The 3x3 matrix taking coordinates of an NRRD ``space`` to RAS."""
    words = space.lower().split("-") if "-" in space else [_SPACE_ABBREV.get(c, c) for c in space.lower()]
    if len(words) != 3 or any(w not in _SPACE_WORDS for w in words):
        raise ServeError(422, f"NRRD space {space!r} is not an anatomical 3D space (e.g. left-posterior-superior)")
    m = np.zeros((3, 3))
    for i, w in enumerate(words):
        axis, sign = _SPACE_WORDS[w]
        m[axis, i] = sign
    if sorted(int(np.argmax(np.abs(m[:, i]))) for i in range(3)) != [0, 1, 2]:
        raise ServeError(422, f"NRRD space {space!r} names an axis twice")
    return m


def load_nrrd(path: Path) -> tuple[torch.Tensor, np.ndarray, dict[str, Any]]:
    """Read a 3D NRRD volume: ``([1, X, Y, Z] float32 (NaN/Inf as -1000 HU), RAS affine, placement fields)``."""
    import nrrd

    try:
        data, header = nrrd.read(str(path), index_order="F")
    except (nrrd.NRRDError, ValueError, OSError) as e:
        raise ServeError(422, f"cannot read the NRRD image ({e})") from None
    space, dirs = header.get("space"), header.get("space directions")
    if space is None or dirs is None:
        raise ServeError(422, "the NRRD image has no 'space' and 'space directions': VISTA3D needs the voxel size "
                              "and orientation (3D Slicer writes them)")
    dirs = np.asarray(dirs, dtype=np.float64)
    origin = np.asarray(header.get("space origin", np.zeros(3)), dtype=np.float64)
    if dirs.shape != (3, 3) or not np.isfinite(dirs).all() or abs(np.linalg.det(dirs)) < 1e-12:
        raise ServeError(422, f"the NRRD 'space directions' {dirs.tolist()} do not describe a 3D grid")
    placement = {"space": str(space), "space directions": dirs, "space origin": origin}
    affine = _ras_affine(placement)
    if data.dtype.kind not in "iuf":
        raise ServeError(422, f"NRRD voxels of type {data.dtype} cannot be segmented")
    image = torch.from_numpy(np.asarray(data, dtype=np.float32))
    if data.dtype.kind == "f":
        torch.nan_to_num_(image, nan=-1000.0, posinf=-1000.0, neginf=-1000.0)  # the pipeline's 'air' policy
    return image[None], affine, placement


# ---------------------------------------------------------------------------------------------- answers
@dataclass(frozen=True)
class AnswerFormat:
    """What a request's ``output`` options ask of the answer's file.

    Attributes:
        suffix: ``.nii.gz``, ``.nii`` or ``.nrrd``; None: the input's own format.
        dtype: the voxel type (label ids fit uint8, the default).
        ignored: the ``output`` keys this server does not use (named back to the client).
    """

    suffix: str | None = None
    dtype: str = "uint8"
    ignored: tuple[str, ...] = ()

    @classmethod
    def of(cls, output: Any) -> AnswerFormat:
        """The format of an ``OutputOptions`` (None: the defaults)."""
        if output is None:
            return cls()
        return cls(output.extension, output.dtype or "uint8", tuple(output.ignored()))

    def note(self) -> dict[str, str]:
        """The ``X-Vista3D-Note`` header naming the ignored ``output`` keys (none: no header)."""
        return {"X-Vista3D-Note": f"ignored: {', '.join(self.ignored)}"} if self.ignored else {}


def nrrd_placement(image: LoadedImage) -> dict[str, Any]:
    """Where an answer on ``image``'s grid lies, as NRRD fields: an NRRD upload's own fields as they came; a NIfTI
    one's affine in ITK's (and 3D Slicer's) left-posterior-superior space, row ``i`` of ``space directions`` the
    step of voxel axis ``i``, ``space origin`` the first voxel's centre."""
    if image.format == "nrrd":
        fields: dict[str, Any] = image.geometry
        return fields
    affine, flip = image.geometry.affine, LPS_RAS_FLIP[:3, :3]
    return {"space": "left-posterior-superior", "space directions": (flip @ affine[:3, :3]).T,
            "space origin": flip @ affine[:3, 3]}


def _ras_affine(placement: dict[str, Any]) -> np.ndarray:
    """The RAS voxel-to-world affine of an NRRD grid from its ``space``, ``space directions`` (row ``i``: the step of
    voxel axis ``i``) and ``space origin``."""
    to_ras = _to_ras(str(placement["space"]))
    affine = np.eye(4)
    affine[:3, :3] = to_ras @ np.asarray(placement["space directions"], dtype=np.float64).T
    affine[:3, 3] = to_ras @ np.asarray(placement["space origin"], dtype=np.float64)
    return affine


def _nifti_geometry(placement: dict[str, Any], shape: tuple[int, int, int]) -> ImageGeometry:
    """The NIfTI geometry of an NRRD grid (its RAS affine; a fresh header)."""
    return ImageGeometry(affine=_ras_affine(placement), spatial_shape=shape, header=None, filename=None,
                         dtype=np.dtype(np.uint8))


def write_label_map(labels: torch.Tensor, image: LoadedImage, path: Path,
                    box: tuple[slice, slice, slice] | None = None, dtype: str = "uint8") -> Path:
    """Write ``labels`` (``[X, Y, Z]`` on the input grid), or its ``box``, as ``dtype`` in the format ``path``'s
    suffix names (NIfTI or NRRD, from either input format) and the image's geometry (a box keeps its place in the
    world: the origin moves to its first voxel), atomically."""
    whole = box is None
    box = box or (slice(None),) * 3
    part = labels[box]
    start = np.array([s.start or 0 for s in box], dtype=np.float64)
    if not path.name.endswith(".nrrd"):
        geom: ImageGeometry = (image.geometry if image.format == "nifti"
                               else _nifti_geometry(image.geometry, image.shape))
        if whole:  # the input's own grid: its header as stored too (a negative pixdim stays what ITK reads)
            return Path(save_label_map(part, replace(geom, filename=None), path, dtype=dtype))
        affine = geom.affine.copy()
        affine[:3, 3] += affine[:3, :3] @ start
        sub = ImageGeometry(affine=affine, spatial_shape=as_xyz(part.shape), header=geom.header, filename=None,
                            dtype=geom.dtype)
        return Path(save_label_map(part, sub, path, dtype=dtype))
    placement = nrrd_placement(image)
    origin = np.asarray(placement["space origin"]) + np.asarray(placement["space directions"]).T @ start
    return save_nrrd(part, {**placement, "space origin": origin}, path, dtype)


def zip_one(src: Path, arcname: str, dest: Path, more: Sequence[tuple[Path, str]] = ()) -> Path:
    """A zip archive holding ``src`` as ``arcname`` (stored: the label map is compressed already), and each
    ``(file, arcname)`` of ``more`` after it (deflated: a statistics JSON)."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as z:
        z.write(src, arcname)
        for path, name in more:
            z.write(path, name, compress_type=zipfile.ZIP_DEFLATED)
    return dest
