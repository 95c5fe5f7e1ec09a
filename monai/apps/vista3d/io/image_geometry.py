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
"""Where an image's voxels lie: the :class:`ImageGeometry` a load gives and a save writes back on."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

__all__ = ["ImageGeometry", "as_xyz", "LPS_RAS_FLIP", "reverse_voxel_axes"]

_T = TypeVar("_T")

#: DICOM, ITK and NRRD's usual space place a point in LPS (x to the patient's left, y posterior), NIfTI in RAS: the
#: matrix that turns a 4x4 affine (or, its top-left 3x3, a direction) of one into the other, applied from the left.
#: It is its own inverse, so it converts both ways.
LPS_RAS_FLIP = np.diag([-1.0, -1.0, 1.0, 1.0])
LPS_RAS_FLIP.setflags(write=False)


def as_xyz(values: Iterable[_T]) -> tuple[_T, _T, _T]:
    """``values`` (a size or spacing along the three voxel axes) as a 3-tuple.

    Raises:
        ValueError: when there are not exactly three values.
    """
    xyz = tuple(values)
    if len(xyz) != 3:
        raise ValueError(f"expected three values, one per voxel axis (X, Y, Z), got {len(xyz)}: {xyz}")
    return xyz[0], xyz[1], xyz[2]


def reverse_voxel_axes(array: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``array`` (a view) with its three voxel axes in reverse order, and ``affine`` (a copy) with its columns to match.

    This is the step between highdicom's ``(slice, row, column)`` layout and this app's ``[column, row, slice]``, in
    either direction: voxel ``(i, j, k)`` of the input and voxel ``(k, j, i)`` of the output hold the same value at
    the same world position.
    """
    return array.transpose(2, 1, 0), affine[:, [2, 1, 0, 3]]


@dataclass
class ImageGeometry:
    """Where an image's voxels lie, and what is needed to write a result on the same grid.

    Attributes:
        affine: ``[4, 4]`` float64 voxel-to-world (RAS mm) matrix, as ``nibabel`` gives it (``img.affine``).
        spatial_shape: ``(X, Y, Z)`` voxel counts, axes as on disk.
        header: a copy of the input's NIfTI header (qform/sform and their codes kept).
        filename: the input path, or ``None`` for an in-memory image.
        dtype: the on-disk voxel dtype (before scl_slope/scl_inter scaling), byte order included.
        source: for an image read from DICOM, the series it came from (a
            :class:`~monai.apps.vista3d.io.dicom.DicomSource`, which a DICOM SEG refers to); None for NIfTI.
        stored_header: the input's header block as its file stores it (348 or 540 bytes), or None. ``header`` holds
            nibabel's reading of it, which makes a negative pixdim positive; a result is written with the stored
            geometry fields (pixdim, qform, sform and their codes), so that every reader (ITK reads the sign as a
            flip) places it where it places the input.
    """

    affine: np.ndarray
    spatial_shape: tuple[int, int, int]
    header: Any
    filename: str | None
    dtype: np.dtype
    source: Any = None
    stored_header: bytes | None = None

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size in mm along each voxel axis (column norms of the affine)."""
        return as_xyz(float(s) for s in np.linalg.norm(self.affine[:3, :3], axis=0))
