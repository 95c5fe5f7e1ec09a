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
"""Reading a DICOM CT series (a folder of slices, a ``.zip`` of one, or one multi-frame file) into the same
``([1, X, Y, Z] HU tensor, ImageGeometry)`` as :func:`~monai.apps.vista3d.io.nifti.load_image` gives for a NIfTI file.

pydicom parses the files, decodes each slice and applies its modality transform (RescaleSlope/Intercept or the
modality LUT). This module refuses, one line each, what would give a wrong volume: several series, a modality other
than CT, slices of several orientations or sizes, duplicate or missing slices, uneven spacing, a gantry tilt,
compressed pixel data without its decoder; the same check orders the slices along the normal of
ImageOrientationPatient by ImagePositionPatient and gives the affine, and numpy stacks them. A multi-frame file's
volume is built by highdicom (which also writes the DICOM SEG). The voxel axes are those of SimpleITK and
dicom2nifti: ``X`` along a row (the column index), ``Y`` down the columns (the row index), ``Z`` along the slice
normal; the affine is NIfTI's, RAS.

Both packages are the ``dicom`` extra (``pip install pydicom highdicom``); without them a DICOM input is refused
with that line.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monai.apps.vista3d.config import DicomOptions
from monai.apps.vista3d.errors import DicomChoiceError, Vista3DInputError, first_line

from .dicom_files import DICOM_HEAD_BYTES, dicom_files_in, has_dicom_marker, is_dicom_file, is_zip_archive
from .image_geometry import LPS_RAS_FLIP, ImageGeometry, as_xyz, reverse_voxel_axes

__all__ = ["load_dicom", "DicomSource", "read_series", "SPACING_TOLERANCE", "DICOM_EXTRA"]

#: how much the slice steps may differ from their mean, relative to it (highdicom's own default)
SPACING_TOLERANCE = 0.01
#: what a DICOM input needs installed
DICOM_EXTRA = "pip install pydicom highdicom (the 'dicom' extra)"
_SLAB = 16  # slices decoded before they are laid out, a tile of _TILE_ROWS rows at a time
_TILE_ROWS = 128
_ORIENTATION_TOLERANCE = 1e-4


@dataclass
class DicomSource:
    """The series an image was read from, kept on its :class:`ImageGeometry` for the outputs that refer to it (a
    DICOM SEG).

    Attributes:
        datasets: the series' datasets without their pixel data, in the order of the volume's ``Z`` axis (one
            multi-frame dataset for a multi-frame file).
        series_uid: its SeriesInstanceUID.
        modality: its Modality.
    """

    datasets: list[Any]
    series_uid: str
    modality: str

    @property
    def multiframe(self) -> bool:
        """Whether the image came from one multi-frame file."""
        return len(self.datasets) == 1 and int(getattr(self.datasets[0], "NumberOfFrames", 1) or 1) > 1


def _packages() -> tuple[Any, Any]:
    try:
        import highdicom
        import pydicom
    except ImportError as e:
        raise Vista3DInputError(f"reading DICOM needs pydicom and highdicom ({e.name} is missing): {DICOM_EXTRA}.")\
            from None
    return pydicom, highdicom


def load_dicom(
    path: str | os.PathLike, options: DicomOptions | None = None, device: str | torch.device | None = None
) -> tuple[torch.Tensor, ImageGeometry]:
    """Read a DICOM CT image: a folder of one series, a ``.zip`` of one, or one multi-frame file.

    Args:
        path: the folder, zip or file.
        options: which series, and whether another modality than CT is read (:class:`DicomOptions`).
        device: where the tensor is returned (``None``: the CPU).

    Returns:
        ``(image, geometry)``: ``image`` is ``[1, X, Y, Z]`` float32 in HU (the rescale applied), ``geometry`` its
        RAS affine, a NIfTI header for the outputs written on its grid (qform and sform set to the affine, code 1,
        scanner) and the :class:`DicomSource` a DICOM SEG refers to.

    Raises:
        Vista3DInputError: what :func:`read_series` refuses, and a missing ``dicom`` extra.
    """
    array, affine, source, stored = read_series(path, options or DicomOptions())
    image = torch.from_numpy(array)
    if device is not None:
        image = image.to(device)
    geometry = ImageGeometry(affine=affine, spatial_shape=as_xyz(int(s) for s in array.shape), header=_nifti_header(
        affine, array.shape, source.series_uid), filename=str(path), dtype=stored, source=source)
    return image[None], geometry


def read_series(path: str | os.PathLike, options: DicomOptions) -> tuple[np.ndarray, np.ndarray, DicomSource, Any]:
    """``(volume [X, Y, Z] float32 C-contiguous in HU, RAS affine, DicomSource, stored dtype)`` of a DICOM input.

    Raises:
        Vista3DInputError: no DICOM there; several series without ``options.series`` (they are listed), or that
            series absent; a modality other than CT without ``options.allow_modality``; one 2D slice; slices of
            several orientations or sizes; duplicate or missing slices; uneven spacing; a gantry tilt; compressed
            pixel data whose decoder is not installed; a missing ``dicom`` extra.
    """
    pydicom, _ = _packages()
    p = Path(path)
    datasets = _pick_series(p, _read_datasets(p, pydicom), options)
    first = datasets[0]
    modality = str(getattr(first, "Modality", "") or "?")
    if modality != "CT" and not options.allow_modality:
        problem = f"holds a series whose modality is {modality}, not CT"
        raise DicomChoiceError(f"{p}: {problem}; VISTA3D segments CT. Pass --allow-modality (allow_modality=True) to "
                               "segment it anyway.", problem, "allow_modality")
    _check_decoder(p, datasets)
    source = DicomSource(datasets, str(getattr(first, "SeriesInstanceUID", "")), modality)
    if source.multiframe:
        array, affine = _multiframe_volume(p, first)
    else:
        array, affine = _series_volume(p, datasets)  # puts source.datasets in the volume's Z order
    stored = _stored_dtype(first)
    for ds in datasets:  # the source of a SEG keeps the headers only
        if "PixelData" in ds:
            del ds.PixelData
    return array, affine, source, stored


# --------------------------------------------------------------------------------------------- the files
def _read_datasets(p: Path, pydicom: Any) -> list[Any]:
    """Every DICOM image dataset of the input (files without pixel data, such as a DICOMDIR, left out)."""
    if p.is_dir():
        blobs: list[tuple[str, Any]] = [(str(f), f) for f in dicom_files_in(p)]
        what = "DICOM files (files with the DICM marker) directly in this folder"
    elif is_zip_archive(p):
        blobs, what = _zip_members(p), "DICOM files in this zip archive"
    elif p.is_file() and is_dicom_file(p):
        blobs, what = [(str(p), p)], ""
    elif not p.exists():
        raise Vista3DInputError(f"{p}: no such file or folder; check the path.")
    else:
        raise Vista3DInputError(f"{p}: not a DICOM file (no DICM marker); give a series folder, a .zip of one, or a "
                                "multi-frame DICOM file.")
    datasets = []
    for name, blob in blobs:
        try:
            ds = pydicom.dcmread(blob)
        except Exception as e:  # pydicom raises several types for damaged files
            raise Vista3DInputError(f"{p}: cannot read {Path(name).name} as DICOM ({first_line(e)}).") from None
        if "PixelData" in ds:
            datasets.append(ds)
    if not datasets:
        raise Vista3DInputError(f"{p}: no DICOM image found ({what or 'the file has no pixel data'}); give the "
                                "folder of one CT series.")
    return datasets


def _zip_members(p: Path) -> list[tuple[str, Any]]:
    """The members of a zip archive that are DICOM files, as in-memory files (nothing is extracted to disk; a member
    is inflated whole only once its first bytes show the DICOM marker, and never past the size the archive states
    for it: zipfile stops there)."""
    try:
        with zipfile.ZipFile(p) as z:
            members = []
            for info in z.infolist():
                if info.is_dir() or Path(info.filename).name.startswith("."):
                    continue
                with z.open(info) as f:
                    head = f.read(DICOM_HEAD_BYTES)
                    if has_dicom_marker(head):
                        members.append((info.filename, io.BytesIO(head + f.read())))
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError) as e:
        # RuntimeError: an encrypted member; NotImplementedError: a compression method zipfile lacks
        raise Vista3DInputError(f"{p}: not a readable zip archive ({first_line(e)}); send the series again or zip "
                                "it anew (unencrypted, deflated or stored).") from None
    return members


def _pick_series(p: Path, datasets: list[Any], options: DicomOptions) -> list[Any]:
    """The datasets of the one series to read: the only one, or ``options.series``."""
    series: dict[str, list[Any]] = {}
    for ds in datasets:
        series.setdefault(str(getattr(ds, "SeriesInstanceUID", "")), []).append(ds)
    if options.series is not None:
        if options.series not in series:
            raise Vista3DInputError(f"{p}: no series {options.series} here; it holds {_listing(series)}.")
        return series[options.series]
    if len(series) > 1:
        problem = f"holds {len(series)} series: {_listing(series)}"
        raise DicomChoiceError(f"{p}: {problem}; pick one with --series UID (series= in DicomOptions).", problem,
                               "series")
    return next(iter(series.values()))


def _listing(series: dict[str, list[Any]]) -> str:
    parts = []
    for uid, members in series.items():
        first = members[0]
        description = str(getattr(first, "SeriesDescription", "") or "no description")
        parts.append(f"{uid} ({description}, {getattr(first, 'Modality', '?')}, {len(members)} file(s))")
    return "; ".join(parts)


def _check_decoder(p: Path, datasets: list[Any]) -> None:
    """Refuse compressed pixel data that no installed decoder reads, naming the packages that would."""
    from pydicom.pixels import get_decoder

    syntax = datasets[0].file_meta.get("TransferSyntaxUID") if hasattr(datasets[0], "file_meta") else None
    if syntax is None or not syntax.is_compressed:
        return
    try:
        decoder = get_decoder(syntax)
    except NotImplementedError:
        raise Vista3DInputError(f"{p}: the pixel data is compressed as {syntax.name}, which pydicom cannot "
                                "decode; convert the series to an uncompressed transfer syntax.") from None
    if not decoder.is_available:
        raise Vista3DInputError(f"{p}: the pixel data is compressed as {syntax.name} and no decoder for it is "
                                f"installed; {_install_hint(decoder.missing_dependencies)}.")


def _install_hint(missing: list[str]) -> str:
    """``pip install pylibjpeg pylibjpeg-libjpeg`` from pydicom's list of its plugins' missing packages
    (``"pylibjpeg - requires pylibjpeg>=2.0 and pylibjpeg-libjpeg>=2.1"``); pylibjpeg's preferred (wheels
    everywhere), GDCM's as the alternative."""
    options = []
    for entry in missing:
        _, _, needs = entry.partition(" - requires ")
        names = [req.strip().split(">")[0].split("=")[0].split("<")[0] for req in needs.split(" and ") if req.strip()]
        names = ["python-gdcm" if n == "gdcm" else n for n in names]
        if names:
            options.append("pip install " + " ".join(names))
    options.sort(key=lambda o: "gdcm" in o)
    return " (or ".join(options) + ")" * (len(options) - 1) if options else "install a pydicom pixel data plugin"


def _stored_dtype(ds: Any) -> np.dtype:
    bits = int(getattr(ds, "BitsAllocated", 16) or 16)
    signed = int(getattr(ds, "PixelRepresentation", 0) or 0) == 1
    return np.dtype(f"{'i' if signed else 'u'}{max(1, bits // 8)}")


# ---------------------------------------------------------------------------------------------- geometry
def _vector(ds: Any, keyword: str, n: int, p: Path) -> np.ndarray:
    value = getattr(ds, keyword, None)  # None: absent, or an empty element
    try:
        out = np.zeros(0) if value is None else np.asarray([float(v) for v in value], dtype=np.float64)
    except (TypeError, ValueError):
        out = np.zeros(0)
    if out.shape != (n,) or not np.all(np.isfinite(out)):
        raise Vista3DInputError(f"{p}: a slice has no valid {keyword}, so its place in the volume is unknown (a "
                                "localizer or secondary capture?); give a folder of axial, coronal or sagittal CT "
                                "slices.")
    return out


@dataclass(frozen=True)
class _Stack:
    """A checked stack of slices: their order along the normal, and the LPS affine of voxel ``(column, row, slice)``
    in that order."""

    order: np.ndarray
    affine: np.ndarray


def _check_stack(p: Path, datasets: list[Any]) -> _Stack:
    """Refuse a set of slices that is not one regular stack: several orientations or sizes, duplicate or missing
    slices, uneven spacing, a gantry tilt. Positions along the normal of ImageOrientationPatient decide, and give
    the stack's order and affine: rows along the first direction cosines times the column spacing, columns along the
    second times the row spacing (PixelSpacing is row spacing, then column spacing), slices along the normal times
    the mean step, from the first slice's position."""
    if len(datasets) < 2:
        raise Vista3DInputError(f"{p}: a single 2D slice; VISTA3D segments 3D volumes: give the folder of the whole "
                                "series.")
    orientation = _vector(datasets[0], "ImageOrientationPatient", 6, p)
    for ds in datasets:
        if np.abs(_vector(ds, "ImageOrientationPatient", 6, p) - orientation).max() > _ORIENTATION_TOLERANCE:
            raise Vista3DInputError(f"{p}: the slices have several orientations (ImageOrientationPatient differs): a "
                                    "localizer or several stacks in one series; remove them or pick another series.")
        if (ds.Rows, ds.Columns) != (datasets[0].Rows, datasets[0].Columns) or list(
                getattr(ds, "PixelSpacing", [])) != list(getattr(datasets[0], "PixelSpacing", [])):
            raise Vista3DInputError(f"{p}: the slices differ in size or pixel spacing; they are not one volume.")
    row, col = orientation[:3], orientation[3:]
    normal = np.cross(row, col)
    positions = np.stack([_vector(ds, "ImagePositionPatient", 3, p) for ds in datasets])
    along = positions @ normal
    order = np.argsort(along, kind="stable")
    along, positions = along[order], positions[order]
    steps = np.diff(along)
    mean_step = (along[-1] - along[0]) / (len(along) - 1)
    same = steps <= max(1e-3, 1e-3 * abs(mean_step))
    if same.any():
        raise Vista3DInputError(f"{p}: {int(same.sum())} slice(s) share a position with another (duplicate slices, "
                                f"e.g. at {along[1:][same][0]:.2f} mm along the normal); remove the duplicates.")
    _check_tilt(p, positions, along, normal, datasets[0])
    smallest = steps.min()
    gaps = np.rint(steps / smallest)
    if gaps.max() >= 2 and np.all(np.abs(steps - gaps * smallest) <= SPACING_TOLERANCE * smallest):
        missing = int((gaps - 1).sum())
        where = along[:-1][gaps >= 2][0]
        raise Vista3DInputError(f"{p}: {missing} slice(s) missing (the {smallest:.3g} mm steps have gaps, the first "
                                f"after {where:.2f} mm along the normal); export the whole series again.")
    if np.abs(steps - mean_step).max() > SPACING_TOLERANCE * mean_step:
        raise Vista3DInputError(f"{p}: uneven slice spacing: steps from {steps.min():.4g} to {steps.max():.4g} mm "
                                f"differ by more than {SPACING_TOLERANCE:.0%}; resample the series to a regular "
                                "spacing first.")
    spacing = _vector(datasets[0], "PixelSpacing", 2, p)
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2] = row * spacing[1], col * spacing[0], normal * mean_step
    affine[:3, 3] = positions[0]
    return _Stack(order, affine)


def _check_tilt(p: Path, positions: np.ndarray, along: np.ndarray, normal: np.ndarray, first: Any) -> None:
    """Refuse a stack whose slices drift in their own plane by more than half a pixel from first to last: the
    slices of a tilted gantry are not stacked along their normal, and no rotation-only affine places them."""
    in_plane = positions - np.outer(along, normal)
    drift = float(np.linalg.norm(in_plane[-1] - in_plane[0]))
    pixel = min(float(v) for v in getattr(first, "PixelSpacing", [1.0, 1.0]))
    if drift > 0.5 * pixel:
        angle = math.degrees(math.atan2(drift, along[-1] - along[0]))
        raise Vista3DInputError(f"{p}: the slices are not stacked along their normal (a gantry tilt of about "
                                f"{angle:.1f} degrees: they drift {drift:.1f} mm in their plane); resample the series "
                                "to an untilted grid first (dcm2niix corrects tilt).")


def _series_volume(p: Path, datasets: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The volume of a checked stack of single-frame slices, in this module's axes, and its RAS affine.

    pydicom decodes each slice and applies its modality transform (RescaleSlope/Intercept, or a modality LUT), in
    float64 as pydicom does, then float32; numpy places the slices in their order along the normal. Slices are
    taken :data:`_SLAB` at a time and laid out as ``[column, row, slice]`` in tiles, which is several times faster
    than one transposing copy of the whole volume and needs no second volume in memory. (highdicom, which builds
    the volume of a multi-frame file here, spends a few milliseconds of Python per slice on checks this module has
    made already: several seconds for a 300-slice CT.)
    """
    from pydicom.pixels import apply_modality_lut

    stack = _check_stack(p, datasets)
    datasets[:] = [datasets[i] for i in stack.order]  # the source in the volume's Z order
    rows, columns = int(datasets[0].Rows), int(datasets[0].Columns)
    out = np.empty((columns, rows, len(datasets)), dtype=np.float32)
    slab = np.empty((_SLAB, rows, columns), dtype=np.float32)
    for z0 in range(0, len(datasets), _SLAB):
        n = min(_SLAB, len(datasets) - z0)
        for k in range(n):
            ds = datasets[z0 + k]
            slab[k] = apply_modality_lut(_stored_values(p, ds, (rows, columns)), ds)
            del ds.PixelData  # its bytes, and the array pydicom keeps with them, are not needed again
        for r0 in range(0, rows, _TILE_ROWS):
            out[:, r0:r0 + _TILE_ROWS, z0:z0 + n] = slab[:n, r0:r0 + _TILE_ROWS].transpose(2, 1, 0)
    return out, LPS_RAS_FLIP @ stack.affine


def _stored_values(p: Path, ds: Any, shape: tuple[int, int]) -> np.ndarray:
    """One slice's stored values ``[rows, columns]``, decoded by pydicom (its decoders, sign and bit depth)."""
    try:
        values: np.ndarray = ds.pixel_array
    except Exception as e:  # pydicom's decoders raise several types for damaged data
        raise Vista3DInputError(f"{p}: the pixel data of a slice cannot be decoded ({first_line(e)}); export the "
                                "series again.") from None
    if values.shape != shape:
        raise Vista3DInputError(f"{p}: a slice's pixel data has shape {values.shape}, not {shape} (colour or several "
                                "samples per pixel?); VISTA3D segments greyscale CT.")
    return values


def _multiframe_volume(p: Path, ds: Any) -> tuple[np.ndarray, np.ndarray]:
    """The volume of one multi-frame file, by highdicom (which checks its frames form a regular stack)."""
    import highdicom

    try:
        image = highdicom.Image.from_dataset(ds, copy=False)
        volume = image.get_volume(dtype=np.float32, apply_presentation_lut=False, rtol=SPACING_TOLERANCE)
    except Exception as e:
        raise Vista3DInputError(f"{p}: the frames do not form one regular volume ({first_line(e)}); missing or "
                                "unevenly spaced frames, or a tilt.") from None
    return _to_ras_layout(volume.array, volume.affine)


def _to_ras_layout(array: np.ndarray, affine_lps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """highdicom's ``(slice, row, column)`` array and LPS affine as ``[column, row, slice]`` with the slice axis
    along the normal (row x column direction, as SimpleITK orders it), and the NIfTI (RAS) affine."""
    array = np.asarray(array, dtype=np.float32)
    if array.ndim == 4:  # a channel axis of one
        array = array[..., 0]
    out, affine = reverse_voxel_axes(array, np.asarray(affine_lps, dtype=np.float64))
    normal = np.cross(affine[:3, 0], affine[:3, 1])
    if float(affine[:3, 2] @ normal) < 0:  # highdicom stacked against the normal: turn the slice axis round
        affine[:3, 3] += affine[:3, 2] * (out.shape[2] - 1)
        affine[:3, 2] *= -1
        out = out[:, :, ::-1]
    return np.ascontiguousarray(out), LPS_RAS_FLIP @ affine


def _nifti_header(affine: np.ndarray, shape: tuple[int, ...], series_uid: str) -> Any:
    """The NIfTI header of the outputs written on a DICOM image's grid: qform and sform the series' affine with code 1
    (scanner anatomical), mm, and the series named in ``descrip``."""
    import nibabel as nib

    hdr = nib.Nifti1Header()
    hdr.set_data_shape(tuple(int(s) for s in shape))
    hdr.set_data_dtype(np.int16)
    hdr.set_qform(affine, code=1)
    hdr.set_sform(affine, code=1)
    hdr.set_xyzt_units("mm")
    hdr["descrip"] = f"DICOM {series_uid}"[:79].encode()
    return hdr
