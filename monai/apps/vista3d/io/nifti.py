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
"""NIfTI input and output for the VISTA3D pipeline: the reading here, the writing in
:mod:`~monai.apps.vista3d.io.nifti_write` (its names are this module's too).

``load_image`` reads a ``.nii`` / ``.nii.gz`` file into a float32 tensor ``[1, X, Y, Z]`` and an
:class:`ImageGeometry`; ``save_label_map`` writes a label map back on the input's grid, with the input's
affine and header, atomically; ``save_class_masks`` writes one uint8 mask per class the same way, as a set.
They validate their input and raise :class:`Vista3DInputError` (or its subclass :class:`Vista3DOutputError`)
with a message that says what is wrong and how to fix it.

Speed: the voxels are read into a buffer of the right size and cast once to float32 (nibabel's ``get_fdata``
goes through a float64 copy) or moved in their stored type onto the GPU, slab by slab while the file inflates
(:mod:`monai.apps.vista3d.io.nifti_read`); gzip is read and written by :mod:`monai.apps.vista3d.io.gzip_codec` (a
background inflate thread, or rapidgzip's parallel inflate for large files on many cores; block-parallel
compression; isal when installed).
"""

from __future__ import annotations

import math
import os
import pathlib
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from monai.apps.vista3d.errors import Vista3DInputError

from .gzip_codec import GZIP_MAGIC
from .image_geometry import ImageGeometry
from .input_kind import input_problem
from .nifti_read import header_from_bytes, header_start, read_gzip_nifti, read_plain_nifti

__all__ = ["load_image", "AIR_HU", "ImageHeader", "read_header"]

#: what non-finite voxels are read as with ``load_image(nonfinite="air")``, in HU
AIR_HU = -1000.0


@dataclass(frozen=True)
class ImageHeader:
    """What a NIfTI header says of its image, read once before any voxel is: enough to plan, shard and check it.

    Attributes:
        shape: the stored shape, trailing dimensions of size 1 past the third dropped.
        itemsize: bytes per stored voxel.
        zooms: the spatial voxel size (mm; the column norms of the header's best affine; 1 where it has 0).
        file_bytes: the size of the file on disk (compressed for ``.nii.gz``).
        gz: whether the file is gzip-compressed.
    """

    shape: tuple[int, ...]
    itemsize: int
    zooms: tuple[float, float, float]
    file_bytes: int
    gz: bool

    @property
    def spatial(self) -> tuple[int, int, int]:
        """The three spatial sizes (1 for a missing one)."""
        s = (*self.shape, 1, 1, 1)
        return s[0], s[1], s[2]

    @property
    def voxels(self) -> int:
        """Voxels of one volume."""
        return math.prod(self.spatial)

    @property
    def four_d(self) -> bool:
        """Whether the file holds several volumes (a 4th dimension)."""
        return len(self.shape) == 4

    @property
    def inflated_bytes(self) -> int:
        """Bytes of every voxel the file stores, uncompressed."""
        return math.prod(self.shape) * self.itemsize


def read_header(path: str | os.PathLike) -> ImageHeader | None:
    """The :class:`ImageHeader` of a NIfTI file, or None where it cannot be read (the image then fails at its
    load, which says what is wrong with it)."""
    try:
        header = header_from_bytes(header_start(pathlib.Path(path)), pathlib.Path(path))
        shape = [int(s) for s in header.get_data_shape()]
        # the voxel sizes the pipeline resamples by: the affine's (pixdim's only where no sform says otherwise)
        zooms = [float(z) or 1.0 for z in np.linalg.norm(np.asarray(header.get_best_affine())[:3, :3], axis=0)]
        itemsize = np.dtype(header.get_data_dtype()).itemsize
        size = os.path.getsize(path)
        gz = _gzipped(pathlib.Path(path))  # by its bytes, as the reader tells it, whatever its name
    except Exception:  # any unreadable header is the load's to report
        return None
    while len(shape) > 3 and shape[-1] == 1:
        shape.pop()
    return ImageHeader(tuple(shape), itemsize, (zooms[0], zooms[1], zooms[2]), size, gz)


def _gzipped(p: pathlib.Path) -> bool:
    """Whether the file starts with the gzip magic (what :func:`load_image` inflates)."""
    with open(p, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def load_image(
    path: str | os.PathLike,
    volume_index: int | None = None,
    *,
    contiguous: bool = True,
    dtype: torch.dtype | None = torch.float32,
    device: str | torch.device | None = None,
    nonfinite: str = "error",
) -> tuple[torch.Tensor, ImageGeometry]:
    """Read a NIfTI volume as a tensor (float32 by default).

    Args:
        path: a ``.nii`` or ``.nii.gz`` file, any orientation, on-disk dtype and byte order.
        volume_index: for a 4D file, which volume to read (required when there are several).
        contiguous: return a C-contiguous tensor (default). ``False`` returns ``[1, X, Y, Z]`` in the file's own
            layout (strides ``(N, 1, X, X*Y)``), which skips a re-layout pass (~0.15 s at 512x512x200 on one CPU
            core) when the next step copies or resamples the data anyway.
        dtype: the result's floating type; ``None`` keeps the stored values in their own type (int16 for a CT;
            uint16/uint32 widened to int32/int64, float16 to float32) so that a consumer converts them where it
            computes. Files with ``scl_slope``/``scl_inter`` scaling are always returned as float32 (or ``dtype``).
        device: where the tensor is returned (``None``: the CPU). On an accelerator, each slab of z-slices is
            copied in its stored type while the rest of the file is inflating, and converted there.
        nonfinite: ``"error"`` refuses NaN or Inf voxels; ``"air"`` reads them as :data:`AIR_HU` and warns with
            their count (NaN outside a resampled field of view is common).

    Returns:
        ``(image, geometry)``: ``image`` is ``[1, X, Y, Z]`` (voxel axes as on disk, scl_slope and scl_inter
        applied), ``geometry`` the :class:`ImageGeometry` needed to save a result on the same grid.

    Raises:
        Vista3DInputError: missing or unreadable file, not NIfTI, corrupt or truncated gzip, 2D image, 4D image
            without a valid ``volume_index``, zero/degenerate spacing, non-mm units, NaN or Inf voxels.

    Spatial unit 'unknown' (``xyzt_units`` 0) is read as mm, as nibabel and MONAI do.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating type or None (the stored type), got {dtype}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    p = pathlib.Path(path)
    problem = input_problem(p, nifti_only=True)  # missing, a folder, DICOM, NRRD, ...: said with what to do
    if problem is not None:
        raise Vista3DInputError(problem)
    if nonfinite not in ("error", "air"):
        raise Vista3DInputError(f"nonfinite must be 'error' or 'air', got {nonfinite!r}.")
    try:
        read = read_gzip_nifti if _gzipped(p) else read_plain_nifti
        hdr, block, (image, spatial, affine, disk_dtype) = read(p, volume_index, contiguous, dtype is None, dev)
    except OSError as e:
        raise Vista3DInputError(f"{p}: cannot read ({e.strerror or e}).") from None
    if dtype is not None and image.dtype != dtype:
        image = image.to(dtype)
    if contiguous:
        image = image.contiguous()
    if disk_dtype.kind == "f":  # integers times nibabel's (finite) slope cannot be NaN/Inf
        _handle_nonfinite(image, p, nonfinite)
    geometry = ImageGeometry(
        affine=affine, spatial_shape=spatial, header=hdr.copy(), filename=str(p), dtype=np.dtype(disk_dtype),
        stored_header=block,
    )
    return image[None], geometry


def _handle_nonfinite(image: torch.Tensor, p: pathlib.Path, nonfinite: str) -> None:
    """NaN/Inf voxels of ``image`` (read from ``p``) become :data:`AIR_HU` in place with a warning that counts
    them (``nonfinite="air"``), or are refused (``"error"``)."""
    # A finite sum proves every voxel finite in one fast pass; count only when it is not.
    if math.isfinite(float(image.sum(dtype=torch.float64 if image.dtype == torch.float64 else None))):
        return
    n_bad = image.numel() - int(torch.isfinite(image).sum())
    if not n_bad:
        return
    n_nan = int(torch.isnan(image).sum())
    if nonfinite == "air":
        image.nan_to_num_(nan=AIR_HU, posinf=AIR_HU, neginf=AIR_HU)
        warnings.warn(
            f"{p}: {n_bad} voxel(s) are not finite ({n_nan} NaN, {n_bad - n_nan} Inf); read as air "
            f"({AIR_HU:g} HU). Use nonfinite='error' to refuse such images.",
            stacklevel=3,  # the caller of load_image
        )
    else:
        raise Vista3DInputError(
            f"{p}: {n_bad} voxel(s) are not finite ({n_nan} NaN, {n_bad - n_nan} Inf); "
            "replace them (e.g. with the background value) before segmenting."
        )


# ------------------------------------------------------------------------------------------------ save
