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
"""Synthetic CT series written with pydicom, and the volume and RAS affine they hold, for the DICOM tests and the
read benchmark.

A series is described by :class:`SeriesSpec`; :func:`write_series` writes one file per slice under names that
say nothing of the order (and InstanceNumbers shuffled too), so a reader that sorts by name or number fails.
:func:`expected_affine` is the NIfTI (RAS) affine of the volume ``[X=column, Y=row, Z=slice]`` that the series
holds, computed from the spec alone.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

__all__ = ["SeriesSpec", "write_series", "expected_affine", "ct_values", "zip_folder", "AXIAL", "CORONAL",
           "SAGITTAL", "OBLIQUE", "write_multiframe"]

AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
CORONAL = (1.0, 0.0, 0.0, 0.0, 0.0, -1.0)
SAGITTAL = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)
_C, _S = np.cos(np.deg2rad(20)), np.sin(np.deg2rad(20))
OBLIQUE = (_C, _S, 0.0, 0.0, 0.0, -1.0)  # a row direction turned 20 degrees in the axial plane

_CT_STORAGE = "1.2.840.10008.5.1.4.1.1.2"


@dataclass
class SeriesSpec:
    """One synthetic series.

    Attributes:
        shape: ``(columns, rows, slices)``, the voxel axes of the volume read back.
        spacing: ``(column step, row step, slice step)`` in mm.
        orientation: ImageOrientationPatient (row direction, then column direction).
        origin: ImagePositionPatient of the first slice (LPS mm).
        slope: RescaleSlope.
        intercept: RescaleIntercept.
        modality: Modality.
        series_uid: SeriesInstanceUID (one is made when None).
        description: SeriesDescription.
        tilt_mm: in-plane shift (along the column direction) per slice: a gantry tilt.
        drop: slice indices left out (missing slices).
        duplicate: slice indices written twice.
        uneven: extra mm added to the position of each slice index listed (uneven spacing).
        slice_thickness: SliceThickness written (deliberately unlike the spacing).
        seed: of the voxel values.
    """

    shape: tuple[int, int, int] = (16, 14, 12)
    spacing: tuple[float, float, float] = (0.8, 0.7, 2.5)
    orientation: tuple[float, ...] = AXIAL
    origin: tuple[float, float, float] = (-6.0, -5.0, 30.0)
    slope: float = 1.0
    intercept: float = -1024.0
    modality: str = "CT"
    series_uid: str | None = None
    description: str = "synthetic CT"
    tilt_mm: float = 0.0
    drop: tuple[int, ...] = ()
    duplicate: tuple[int, ...] = ()
    uneven: dict[int, float] = field(default_factory=dict)
    slice_thickness: float = 5.0
    seed: int = 0

    def with_(self, **changes) -> SeriesSpec:
        return replace(self, **changes)


def ct_values(spec: SeriesSpec) -> np.ndarray:
    """The volume ``[X, Y, Z]`` in HU that :func:`write_series` stores (exactly representable after rescale)."""
    rng = np.random.default_rng(spec.seed)
    stored = rng.integers(0, 2000, size=spec.shape).astype(np.float64)
    return stored * spec.slope + spec.intercept


def _directions(spec: SeriesSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    row = np.asarray(spec.orientation[:3], dtype=np.float64)
    col = np.asarray(spec.orientation[3:], dtype=np.float64)
    return row, col, np.cross(row, col)


def expected_affine(spec: SeriesSpec) -> np.ndarray:
    """The RAS affine of voxel ``(column, row, slice)`` of the series (without tilt, drops or unevenness)."""
    row, col, normal = _directions(spec)
    lps = np.eye(4)
    lps[:3, 0] = row * spec.spacing[0]
    lps[:3, 1] = col * spec.spacing[1]
    lps[:3, 2] = normal * spec.spacing[2]
    lps[:3, 3] = spec.origin
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


def _uid(rng: np.random.Generator) -> str:
    return "2.25." + str(int(rng.integers(1, 2**62)))


def _dataset(spec: SeriesSpec, k: int, values: np.ndarray, uids: dict, number: int, rng: np.random.Generator):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    row, col, normal = _directions(spec)
    position = (np.asarray(spec.origin) + normal * spec.spacing[2] * k + col * spec.tilt_mm * k
                + normal * spec.uneven.get(k, 0.0))
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = _CT_STORAGE
    meta.MediaStorageSOPInstanceUID = _uid(rng)
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = _CT_STORAGE, meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = uids["study"], uids["series"]
    ds.FrameOfReferenceUID = uids["frame"]
    ds.PatientName, ds.PatientID, ds.PatientSex, ds.PatientBirthDate = "Phantom^Synthetic", "SYN001", "O", ""
    ds.StudyDate, ds.StudyTime, ds.StudyID, ds.AccessionNumber = "20261206", "120000", "1", ""
    ds.ReferringPhysicianName = ""
    ds.Modality, ds.SeriesNumber, ds.InstanceNumber = spec.modality, 3, number
    ds.SeriesDescription = spec.description
    ds.Manufacturer = "synthetic"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.ImageOrientationPatient = [f"{v:.6f}" for v in spec.orientation]
    ds.ImagePositionPatient = [f"{v:.4f}" for v in position]
    ds.PixelSpacing = [spec.spacing[1], spec.spacing[0]]  # between rows, between columns
    ds.SliceThickness = spec.slice_thickness
    ds.Rows, ds.Columns = spec.shape[1], spec.shape[0]
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType = spec.slope, spec.intercept, "HU"
    stored = np.rint((values[:, :, k] - spec.intercept) / spec.slope).astype(np.int16)
    ds.PixelData = np.ascontiguousarray(stored.T).tobytes()  # rows x columns
    return ds


def write_series(spec: SeriesSpec, folder: str | Path, uids: dict | None = None, values: np.ndarray | None = None
                 ) -> dict:
    """Write ``spec`` into ``folder`` (one file per slice, names and InstanceNumbers in a shuffled order); returns
    the UIDs used (``study``, ``series``, ``frame``), so a second series can share the study. ``values``: the
    ``[X, Y, Z]`` HU volume to store (integers after the rescale is undone; :func:`ct_values` when None)."""
    rng = np.random.default_rng(spec.seed + 1000)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    uids = dict(uids or {})
    uids.setdefault("study", _uid(rng))
    uids.setdefault("frame", _uid(rng))
    uids["series"] = spec.series_uid or _uid(rng)
    values = ct_values(spec) if values is None else np.asarray(values, dtype=np.float64)
    slices = [k for k in range(spec.shape[2]) if k not in spec.drop] + list(spec.duplicate)
    order = rng.permutation(len(slices))
    for number, i in enumerate(order, start=1):
        k = slices[i]
        ds = _dataset(spec, k, values, uids, int(rng.integers(1, 10_000)), rng)
        ds.save_as(folder / f"IM{_uid(rng)[5:17]}_{number}", enforce_file_format=True)
    return uids


def write_multiframe(spec: SeriesSpec, path: str | Path) -> Path:
    """The series of ``spec`` as one Legacy Converted Enhanced CT multi-frame file (made by highdicom from the
    single-frame datasets)."""
    import highdicom as hd
    import pydicom

    rng = np.random.default_rng(spec.seed + 2000)
    uids = {"study": _uid(rng), "frame": _uid(rng), "series": spec.series_uid or _uid(rng)}
    values = ct_values(spec)
    datasets = []
    for k in range(spec.shape[2]):
        ds = _dataset(spec, k, values, uids, k + 1, rng)
        datasets.append(pydicom.dcmread(pydicom.filebase.DicomBytesIO(_bytes_of(ds))))
    multi = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=datasets, series_instance_uid=_uid(rng), series_number=4, sop_instance_uid=_uid(rng),
        instance_number=1)
    path = Path(path)
    multi.save_as(path, enforce_file_format=True)
    return path


def _bytes_of(ds) -> bytes:
    from io import BytesIO

    buf = BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def zip_folder(folder: str | Path, dest: str | Path, prefix: str = "series/") -> Path:
    """The files of ``folder`` in a zip archive, under ``prefix``."""
    dest = Path(dest)
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for f in sorted(Path(folder).iterdir()):
            z.write(f, prefix + f.name)
    return dest
