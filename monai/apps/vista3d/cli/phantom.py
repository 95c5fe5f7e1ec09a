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
"""A synthetic abdominal/thoracic CT phantom, for benchmarks and tests (no real data can be shipped).

The phantom is an elliptic body (fat shell around soft tissue) in air, with lungs, liver, spleen, kidneys,
aorta and spine at plausible Hounsfield values, plus Gaussian noise. It is deterministic for a given seed
and is built with vectorised numpy on bounding boxes, so 512x512x300 takes about a second.
"""

from __future__ import annotations

import os
import pathlib

import nibabel as nib
import numpy as np

__all__ = ["make_phantom", "make_phantom_labels", "write_phantom", "PHANTOM_HU", "PHANTOM_LABELS"]

#: Hounsfield values of the phantom's tissues.
PHANTOM_HU = {
    "air": -1000,
    "fat": -100,
    "soft_tissue": 40,
    "lung": -850,
    "liver": 60,
    "spleen": 50,
    "kidney": 30,
    "aorta": 45,
    "bone": 700,
}


def _paint_ellipsoid(vol: np.ndarray, centre, radii, value: int, inside2d: np.ndarray, zrange) -> None:
    """Set voxels inside an axis-aligned ellipsoid (voxel units) and inside the body to ``value``.

    Only the ellipsoid's bounding box is computed; ``inside2d`` [X, Y] and ``zrange`` are the body's extent.
    """
    lo = [max(0, int(np.floor(c - r))) for c, r in zip(centre, radii)]
    hi = [min(n, int(np.ceil(c + r)) + 1) for c, r, n in zip(centre, radii, vol.shape)]
    if any(h <= lo_ for lo_, h in zip(lo, hi)):
        return
    grids = np.ogrid[tuple(slice(a, b) for a, b in zip(lo, hi))]
    d = sum(((g - c) / max(r, 1e-6)) ** 2 for g, c, r in zip(grids, centre, radii))
    inside = d <= 1.0
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    inside &= inside2d[box[0], box[1], None]
    inside[:, :, : max(0, zrange[0] - lo[2])] = False
    inside[:, :, max(0, zrange[1] - lo[2]) :] = False
    vol[box][inside] = value


#: VISTA3D label ids of the phantom's organs (see :func:`make_phantom_labels`).
PHANTOM_LABELS = {"liver": 1, "spleen": 3, "right_kidney": 5, "aorta": 6, "left_kidney": 14, "lung": 20, "bone": 21}


def _check_args(shape, spacing) -> tuple[tuple[int, int, int], tuple[float, float, float]]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 8:
        raise ValueError(f"phantom shape must be three sizes >= 8, got {shape}")
    spacing = tuple(float(s) for s in spacing)
    if len(spacing) != 3 or min(spacing) <= 0:
        raise ValueError(f"phantom spacing must be three positive sizes in mm, got {spacing}")
    return shape, spacing


def _layout(shape, spacing, rng: np.random.Generator, values: dict, dtype) -> np.ndarray:
    """Paint the phantom's anatomy with ``values`` (tissue name -> value); the same layout for any ``values``."""
    nx, ny, nz = shape
    sx, sy, _ = spacing
    vol = np.full(shape, values["air"], dtype=dtype)

    # Body: elliptic cylinder along z, a fat shell around soft tissue. Built once in 2D and broadcast.
    cx, cy = (nx - 1) / 2, (ny - 1) / 2
    ax, ay = 0.45 * nx, 0.36 * ny
    r2 = ((np.arange(nx)[:, None] - cx) / ax) ** 2 + ((np.arange(ny)[None, :] - cy) / ay) ** 2
    shell = min(12.0 / min(ax * sx, ay * sy), 0.08)  # ~12 mm of fat, thinner on small phantoms
    inner2d = r2 <= (1.0 - shell) ** 2
    z0, z1 = int(0.03 * nz), max(int(0.97 * nz), int(0.03 * nz) + 1)
    slab = vol[:, :, z0:z1]
    slab[r2 <= 1.0] = values["fat"]
    slab[inner2d] = values["soft_tissue"]

    j = rng.uniform(-0.02, 0.02, size=16)  # small per-seed jitter of the organ layout

    def e(cfx, cfy, cfz, rfx, rfy, rfz, name, k):
        centre = (cx + (cfx + j[k]) * ax, cy + (cfy + j[k + 1]) * ay, (cfz + j[k]) * nz)
        radii = (rfx * ax, rfy * ay, rfz * nz)
        _paint_ellipsoid(vol, centre, radii, values[name], inner2d, (z0, z1))

    # Axis 0 grows to the patient's right: lungs on top, liver right, spleen left, kidneys at the back.
    e(-0.45, 0.05, 0.80, 0.38, 0.55, 0.22, "lung", 0)
    e(0.45, 0.05, 0.80, 0.38, 0.55, 0.22, "lung", 1)
    e(0.40, 0.10, 0.50, 0.42, 0.50, 0.14, "liver", 2)
    e(-0.50, -0.15, 0.52, 0.16, 0.22, 0.08, "spleen", 3)
    e(0.35, -0.45, 0.38, 0.13, 0.16, 0.07, "right_kidney", 4)
    e(-0.35, -0.45, 0.38, 0.13, 0.16, 0.07, "left_kidney", 5)

    def disc(fx, fy, rx, ry):  # a cylinder along z, as a 2D mask
        return ((np.arange(nx)[:, None] - cx - fx * ax) / (rx * ax)) ** 2 + (
            (np.arange(ny)[None, :] - cy - fy * ay) / (ry * ay)
        ) ** 2 <= 1

    slab[disc(0.0, -0.62, 0.09, 0.14) & inner2d] = values["bone"]  # spine
    slab[disc(-0.08, -0.35, 0.06, 0.07) & inner2d] = values["aorta"]
    return vol


def _affine(shape, spacing) -> np.ndarray:
    affine = np.diag(list(spacing) + [1.0])
    affine[:3, 3] = -np.asarray(spacing) * (np.asarray(shape) - 1) / 2
    return affine


def make_phantom(
    shape: tuple[int, int, int] = (256, 256, 176), spacing: tuple[float, float, float] = (1.0, 1.0, 1.5), seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Build a CT-like volume in RAS voxel order (axis 0 to the right, 1 anterior, 2 superior).

    Args:
        shape: ``(X, Y, Z)`` voxel counts (each at least 8).
        spacing: voxel size in mm.
        seed: noise and jitter seed; the same seed gives the same volume.

    Returns:
        ``(hu, affine)``: ``hu`` int16 ``[X, Y, Z]`` Hounsfield units, ``affine`` ``[4, 4]`` float64 RAS
        voxel-to-mm matrix centred on the volume.
    """
    shape, spacing = _check_args(shape, spacing)
    rng = np.random.default_rng(seed)
    kidney = PHANTOM_HU["kidney"]
    vol = _layout(shape, spacing, rng, {**PHANTOM_HU, "right_kidney": kidney, "left_kidney": kidney}, np.int16)
    # Noise: the sum of two uniform nibbles of random bytes, a triangular distribution on [-15, 15] HU
    # (std ~6.5 HU, like a standard-dose CT), about 10x faster than Gaussian noise at this size.
    raw = np.frombuffer(rng.bytes(vol.size), dtype=np.uint8).reshape(shape)
    noise = raw >> 4
    noise += raw & 15
    vol += noise
    vol -= 15
    return vol, _affine(shape, spacing)


def make_phantom_labels(
    shape: tuple[int, int, int] = (256, 256, 176), spacing: tuple[float, float, float] = (1.0, 1.0, 1.5), seed: int = 0
) -> np.ndarray:
    """The ground truth of :func:`make_phantom` with the same arguments: uint8 ``[X, Y, Z]`` VISTA3D label ids
    (:data:`PHANTOM_LABELS`), 0 for air, fat and other soft tissue."""
    shape, spacing = _check_args(shape, spacing)
    values = {"air": 0, "fat": 0, "soft_tissue": 0, **PHANTOM_LABELS}
    return _layout(shape, spacing, np.random.default_rng(seed), values, np.uint8)


def _oblique(affine: np.ndarray) -> np.ndarray:
    a, b = np.deg2rad(20.0), np.deg2rad(10.0)
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    out: np.ndarray = affine.copy()
    out[:3, :3] = rz @ rx @ affine[:3, :3]
    out[:3, 3] = rz @ rx @ affine[:3, 3]
    return out


def write_phantom(
    path: str | os.PathLike,
    shape: tuple[int, int, int] = (256, 256, 176),
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.5),
    seed: int = 0,
    orientation: str = "RAS",
    *,
    dtype: str = "int16",
) -> pathlib.Path:
    """Write :func:`make_phantom` as a NIfTI file (``.nii`` or ``.nii.gz``) with nibabel.

    Args:
        path: output file.
        shape, spacing, seed: as :func:`make_phantom` (``shape`` and ``spacing`` in RAS axis order).
        orientation: voxel axis codes such as ``"RAS"``, ``"LAS"``, ``"LPS"``, ``"PIR"``; the array is
            flipped/permuted so the anatomy stays where it is in world space. ``"oblique"``: RAS voxel axes
            rotated by 20 degrees about z and 10 about x.
        dtype: on-disk type: int16 like a scanner, or e.g. float32, float64, uint8 (nibabel then sets
            scl_slope/scl_inter so the Hounsfield values fit).

    Returns:
        The path written. qform and sform are both set (code 1, scanner), units mm.
    """
    hu, affine = make_phantom(shape, spacing, seed)
    if orientation.lower() == "oblique":
        data, affine = hu, _oblique(affine)
    else:
        codes = tuple(orientation.upper())
        target = nib.orientations.axcodes2ornt(codes)
        if len(codes) != 3 or np.isnan(target).any():
            raise ValueError(f"orientation must be 3 axis codes like 'RAS' or 'LPS', or 'oblique'; got {orientation!r}")
        xform = nib.orientations.ornt_transform(nib.orientations.axcodes2ornt(("R", "A", "S")), target)
        data = nib.orientations.apply_orientation(hu, xform)
        affine = affine @ nib.orientations.inv_ornt_aff(xform, hu.shape)
    img = nib.Nifti1Image(np.ascontiguousarray(data), affine)
    img.set_data_dtype(np.dtype(dtype))  # nibabel picks scl_slope/scl_inter when the HU do not fit (uint8)
    img.header.set_qform(affine, code=1)
    img.header.set_sform(affine, code=1)
    img.header.set_xyzt_units("mm", "sec")
    p = pathlib.Path(path)
    nib.save(img, p)
    return p
