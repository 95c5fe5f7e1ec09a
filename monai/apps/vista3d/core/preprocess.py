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
"""Preprocessing of the VISTA3D bundle on plain tensors, and its inverse for label maps.

The bundle runs ``Spacingd(1.5 mm, bilinear)`` -> ``CropForegroundd(margin=10, allow_smaller=True)`` ->
``ScaleIntensityRanged`` -> ``Orientationd("RAS")`` on MetaTensors and undoes them with ``Invertd``. Here
the same geometry is computed once from the affine (in float64, like MONAI's ``Spacing``), the image is
resampled in one separable pass on its device, and a :class:`PreprocessRecord` keeps what the inverse needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import nibabel.orientations as nio
import numpy as np
import torch

from monai.apps.vista3d.errors import EmptyForegroundError
from monai.apps.vista3d.io.image_geometry import as_xyz
from monai.apps.vista3d.io.load_policy import as_compute_layout
from monai.apps.vista3d.labels import bundle_config

__all__ = [
    "AFFINE_TOL",
    "PreprocessRecord",
    "spacing_geometry",
    "resample",
    "foreground_box",
    "scale_intensity_range",
    "ras_orientation",
    "apply_orientation",
    "undo_orientation",
    "preprocess",
    "preprocess_like_bundle",
    "invert_labels",
    "input_to_preprocessed_coords",
]

# MONAI treats affines and spacings that agree to this tolerance as equal (no resampling needed).
AFFINE_TOL = 1e-3


def _spacing(affine: np.ndarray) -> np.ndarray:
    sp: np.ndarray = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    sp[sp == 0] = 1.0
    return sp


def spacing_geometry(
    affine: np.ndarray, shape: Sequence[int], pixdim: Sequence[float] = (1.5, 1.5, 1.5)
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Output affine and shape of MONAI's ``Spacing(pixdim)`` with its defaults (``diagonal=False``).

    The axes' directions (rotations included) are kept, shear is dropped, each column gets the new spacing,
    the output shape covers the input's voxel centres, and the first voxel centre lands on the input corner
    that is the lowest in the output's index space (the input centre when no corner is).

    Args:
        affine: ``[4, 4]`` voxel-to-world affine of the input.
        shape: input spatial shape ``(X, Y, Z)``.
        pixdim: target spacing in mm; an axis already within 1e-3 mm of its target keeps its spacing.

    Returns:
        ``(new_affine [4, 4] float64, new_shape)``.
    """
    affine = np.asarray(affine, dtype=np.float64)
    shape_f = np.asarray(shape, dtype=np.float64)
    orig = _spacing(affine)
    target = np.asarray(pixdim, dtype=np.float64)
    out_d = np.where(np.abs(orig - target) <= AFFINE_TOL, orig, target)
    out_d[out_d == 0] = 1.0
    # Split the 3x3 part into an orthogonal part and an upper-triangular zoom/shear (QR via Cholesky), and
    # rebuild it from the orthogonal part and the new spacing.
    rzs = affine[:3, :3]
    upper = np.linalg.cholesky(rzs.T @ rzs).T
    rot = rzs @ np.linalg.inv(upper)
    new = np.eye(4)
    new[:3, :3] = rot @ np.diag(np.sign(np.diag(upper)) * np.abs(out_d))
    # Input voxel-centre corners in the new index space decide the output extent and origin.
    corners = np.stack(np.meshgrid(*[(0.0, d - 1.0) for d in shape_f], indexing="ij")).reshape(3, -1)
    corners = np.concatenate([corners, np.ones((1, corners.shape[1]))])
    in_new = np.linalg.solve(new, affine) @ corners
    out_shape = np.round(np.ptp(in_new[:3] / in_new[3], axis=1) + 1.0)
    world = affine @ corners
    offset = None
    for i in range(corners.shape[1]):
        rel = np.min(in_new[:3] - in_new[:3, i : i + 1], axis=1)
        if np.allclose(rel, 0.0, rtol=AFFINE_TOL):
            offset = world[:3, i]
            break
    if offset is None:
        offset = affine[:3, :3] @ (shape_f / 2.0) + affine[:3, 3] - new[:3, :3] @ (out_shape / 2.0)
    new[:3, 3] = offset
    return new, as_xyz(int(s) for s in out_shape)


def _is_separable(xform: np.ndarray) -> bool:
    lin = xform[:3, :3]
    off = lin - np.diag(np.diag(lin))
    return bool(np.abs(off).max() <= 1e-9 * max(1.0, np.abs(lin).max()))


def _interp_axis(x: torch.Tensor, dim: int, coords: np.ndarray, mode: str, dtype: torch.dtype) -> torch.Tensor:
    """Sample ``x`` along ``dim`` at the continuous indices ``coords`` (border padding)."""
    n = x.shape[dim]
    c = np.clip(coords, 0.0, n - 1.0)
    if mode == "nearest":
        idx = torch.as_tensor(np.rint(c).astype(np.int64), device=x.device)
        return x.index_select(dim, idx)
    i0 = np.clip(np.floor(c), 0, max(n - 2, 0)).astype(np.int64)
    i1 = np.minimum(i0 + 1, n - 1)
    w = torch.as_tensor(c - i0, dtype=dtype, device=x.device)
    shape = [1] * x.ndim
    shape[dim] = len(coords)
    a = x.index_select(dim, torch.as_tensor(i0, device=x.device))
    b = x.index_select(dim, torch.as_tensor(i1, device=x.device))
    return torch.lerp(a, b, w.view(shape))


def resample(
    img: torch.Tensor,
    xform: np.ndarray,
    out_shape: Sequence[int],
    mode: str = "bilinear",
    dtype: torch.dtype = torch.float32,
    chunk_voxels: int = 1 << 24,
) -> torch.Tensor:
    """Resample ``img`` onto a new grid given the voxel-to-voxel map, like MONAI's ``SpatialResample``.

    Matches ``grid_sample(..., align_corners=False, padding_mode="border")`` of MONAI: output voxel ``j``
    takes the value at the continuous input index ``xform @ j``. Axis-aligned maps (the usual case, also for
    rotated scans, since spacing changes keep the axes' directions) run as three 1-D passes with
    ``index_select``/``lerp``; other maps use ``grid_sample`` over chunks of output slices.

    Args:
        img: ``[C, X, Y, Z]`` image (any device).
        xform: ``[4, 4]`` map from output voxel indices to input voxel indices.
        out_shape: output spatial shape.
        mode: ``"bilinear"`` or ``"nearest"`` (nearest rounds half to even, like ``grid_sample``).
        dtype: floating type of the computation for bilinear; nearest keeps ``img``'s dtype.
        chunk_voxels: bound on the voxels per ``grid_sample`` call in the general case.

    Returns:
        ``[C, *out_shape]`` tensor, ``dtype`` for bilinear, ``img.dtype`` for nearest on axis-aligned maps.
    """
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"mode must be 'bilinear' or 'nearest', got {mode!r}")
    xform = np.asarray(xform, dtype=np.float64)
    out_shape = tuple(int(s) for s in out_shape)
    if _is_separable(xform):
        x = img if mode == "nearest" else img.to(dtype)
        coords = [xform[d, d] * np.arange(out_shape[d], dtype=np.float64) + xform[d, 3] for d in range(3)]
        # Shrink first: the later passes then touch fewer voxels.
        order = sorted(range(3), key=lambda d: out_shape[d] / max(img.shape[d + 1], 1))
        for d in order:
            x = _interp_axis(x, d + 1, coords[d], mode, dtype)
        return x.contiguous()
    # General (sheared) maps: build the sampling grid slice by slice, in grid_sample's normalised space.
    in_shape = np.asarray(img.shape[1:], dtype=np.float64)
    src = img.to(dtype).unsqueeze(0)
    out = torch.empty((img.shape[0], *out_shape), dtype=dtype, device=img.device)
    lin = torch.as_tensor(xform[:3, :3], dtype=torch.float64, device=img.device)
    shift = torch.as_tensor(xform[:3, 3], dtype=torch.float64, device=img.device)
    scale = torch.as_tensor(2.0 / in_shape, dtype=torch.float64, device=img.device)
    ys, zs = torch.meshgrid(
        torch.arange(out_shape[1], dtype=torch.float64, device=img.device),
        torch.arange(out_shape[2], dtype=torch.float64, device=img.device),
        indexing="ij",
    )
    step = max(1, chunk_voxels // max(1, out_shape[1] * out_shape[2]))
    for x0 in range(0, out_shape[0], step):
        xs = torch.arange(x0, min(x0 + step, out_shape[0]), dtype=torch.float64, device=img.device)
        j = torch.stack(
            torch.broadcast_tensors(xs[:, None, None], ys[None], zs[None]), dim=-1
        )  # [x, Y, Z, 3] output indices
        i = j @ lin.T + shift
        norm = (i + 0.5) * scale - 1.0  # align_corners=False
        grid = norm.flip(-1).to(dtype).unsqueeze(0)  # grid_sample wants (z, y, x) order
        out[:, x0 : x0 + len(xs)] = torch.nn.functional.grid_sample(
            src, grid, mode=mode, padding_mode="border", align_corners=False
        )[0]
    return out


def foreground_box(
    img: torch.Tensor, margin: int = 10, allow_smaller: bool = True, threshold: float = 0.0
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Bounding box of the voxels ``> threshold`` (any channel), grown by ``margin``, like ``CropForeground``.

    Args:
        img: ``[C, X, Y, Z]`` image.
        margin: voxels added on each side.
        allow_smaller: clip the grown box to the image (the bundle's setting); otherwise it may extend
            outside and the crop pads with zeros.
        threshold: foreground is ``img > threshold`` (MONAI's default ``select_fn``).

    Returns:
        ``(start, end)`` with ``end`` exclusive.

    Raises:
        EmptyForegroundError: when no voxel is above the threshold.
    """
    fg = (img > threshold).any(0)
    start, end = [], []
    for d in range(3):
        other = tuple(a for a in range(3) if a != d)
        hit = torch.nonzero(fg.any(dim=other)).flatten()
        if hit.numel() == 0:
            raise EmptyForegroundError(
                f"the image has no voxel above {threshold} (it is constant or all air/negative after "
                "resampling), so the bundle's foreground crop is empty and there is nothing to segment"
            )
        lo, hi = int(hit[0]) - margin, int(hit[-1]) + margin + 1
        if allow_smaller:
            lo, hi = max(lo, 0), min(hi, img.shape[d + 1])
        start.append(lo)
        end.append(hi)
    return as_xyz(start), as_xyz(end)


def _crop_or_pad(img: torch.Tensor, start: Sequence[int], end: Sequence[int]) -> torch.Tensor:
    sl = tuple(slice(max(s, 0), min(e, n)) for s, e, n in zip(start, end, img.shape[1:]))
    every_channel = (slice(None), *sl)  # (named: mypy reads x[(a, *b)] as 3.11 syntax)
    out = img[every_channel]
    pad = [(max(-s, 0), max(e - n, 0)) for s, e, n in zip(start, end, img.shape[1:])]
    if any(p for pair in pad for p in pair):
        flat = [p for pair in reversed(pad) for p in pair]
        out = torch.nn.functional.pad(out, flat, mode="constant", value=0.0)
    return out


def scale_intensity_range(
    img: torch.Tensor, a_min: float, a_max: float, b_min: float = 0.0, b_max: float = 1.0, clip: bool = True
) -> torch.Tensor:
    """Map ``[a_min, a_max]`` linearly to ``[b_min, b_max]`` (then clip), the order of operations of MONAI."""
    if a_max == a_min:
        raise ValueError("a_min and a_max must differ")
    out = (img - a_min) / (a_max - a_min)
    out = out * (b_max - b_min) + b_min
    return out.clamp_(b_min, b_max) if clip else out


def ras_orientation(affine: np.ndarray, axcodes: str = "RAS") -> np.ndarray:
    """nibabel orientation transform (``[3, 2]``: target axis, flip) from ``affine``'s axes to ``axcodes``."""
    src = nio.io_orientation(np.asarray(affine, dtype=np.float64))
    return np.asarray(nio.ornt_transform(src, nio.axcodes2ornt(axcodes)))


def apply_orientation(img: torch.Tensor, ornt: np.ndarray) -> torch.Tensor:
    """Flip and permute the spatial axes of ``img`` (``[C, X, Y, Z]``) by a nibabel orientation transform."""
    flips = [d + 1 for d in range(3) if ornt[d, 1] == -1]
    if flips:
        img = torch.flip(img, dims=flips)
    perm = [0] + [int(p) + 1 for p in np.argsort(ornt[:, 0])]
    return img.permute(perm) if perm != [0, 1, 2, 3] else img


def undo_orientation(img: torch.Tensor, ornt: np.ndarray) -> torch.Tensor:
    """Inverse of :func:`apply_orientation` for ``[C, X, Y, Z]`` tensors."""
    img = img.permute([0] + [int(ornt[d, 0]) + 1 for d in range(3)])
    flips = [d + 1 for d in range(3) if ornt[d, 1] == -1]
    return torch.flip(img, dims=flips) if flips else img


@dataclass
class PreprocessRecord:
    """What the bundle's ``Invertd`` needs, plus the geometry of each stage.

    Attributes:
        input_affine: ``[4, 4]`` affine of the input image.
        input_shape: spatial shape of the input.
        resampled_affine: affine after the 1.5 mm resampling.
        resampled_shape: shape after resampling.
        resampled: whether resampling changed the grid (False when the input is already at the spacing).
        box_start: foreground crop start in the resampled grid.
        box_end: foreground crop end (exclusive).
        ornt: ``[3, 2]`` nibabel orientation transform of the cropped grid to RAS.
        final_affine: affine of the network input.
        final_shape: spatial shape of the network input.
    """

    input_affine: np.ndarray
    input_shape: tuple[int, int, int]
    resampled_affine: np.ndarray
    resampled_shape: tuple[int, int, int]
    resampled: bool
    box_start: tuple[int, int, int]
    box_end: tuple[int, int, int]
    ornt: np.ndarray
    final_affine: np.ndarray
    final_shape: tuple[int, int, int]
    settings: dict = field(default_factory=dict)


def _translate(v: Sequence[float]) -> np.ndarray:
    t = np.eye(4)
    t[:3, 3] = v
    return t


def preprocess(
    image: torch.Tensor,
    affine: np.ndarray | torch.Tensor,
    pixdim: Sequence[float] = (1.5, 1.5, 1.5),
    margin: int = 10,
    allow_smaller: bool = True,
    a_min: float = -963.8247715525971,
    a_max: float = 1053.678477684517,
    b_min: float = 0.0,
    b_max: float = 1.0,
    axcodes: str = "RAS",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, PreprocessRecord]:
    """The bundle's preprocessing: resample, crop foreground, scale intensity, orient to RAS, float32.

    Args:
        image: ``[1, X, Y, Z]`` (or ``[X, Y, Z]``) image in HU, on the device to compute on.
        affine: ``[4, 4]`` voxel-to-world (RAS mm) affine of ``image``.
        pixdim: resampling spacing (mm).
        margin: foreground crop margin (voxels of the resampled grid).
        allow_smaller: clip the crop box to the image.
        a_min: intensity mapped to ``b_min``.
        a_max: intensity mapped to ``b_max``.
        b_min: output minimum.
        b_max: output maximum.
        axcodes: output orientation.
        dtype: computation type of the resampling (float32 is ~1e-4 HU from MONAI's float64).

    Returns:
        ``([1, X', Y', Z'] float32 contiguous network input, record)``.

    Raises:
        EmptyForegroundError: when the resampled image has no voxel > 0.
    """
    if image.ndim == 3:
        image = image.unsqueeze(0)
    if image.ndim != 4:
        raise ValueError(f"image must be [C, X, Y, Z], got shape {tuple(image.shape)}")
    in_aff = np.asarray(torch.as_tensor(affine, dtype=torch.float64).cpu(), dtype=np.float64)
    in_shape = as_xyz(int(s) for s in image.shape[1:])
    res_aff, res_shape = spacing_geometry(in_aff, in_shape, pixdim)
    xform = np.linalg.solve(in_aff, res_aff)
    unchanged = res_shape == in_shape and (
        np.allclose(in_aff, res_aff, atol=AFFINE_TOL) or np.allclose(xform, np.eye(4), atol=AFFINE_TOL)
    )
    if unchanged:
        res_aff, resampled = in_aff.copy(), image.to(torch.float32)
    else:
        resampled = resample(image, xform, res_shape, mode="bilinear", dtype=dtype).to(torch.float32)
    start, end = foreground_box(resampled, margin=margin, allow_smaller=allow_smaller)
    cropped = _crop_or_pad(resampled, start, end)
    crop_aff = res_aff @ _translate(start)
    ornt = ras_orientation(crop_aff, axcodes)
    crop_shape = tuple(e - s for s, e in zip(start, end))
    final_aff = crop_aff @ nio.inv_ornt_aff(ornt, crop_shape)
    scaled = scale_intensity_range(cropped, a_min, a_max, b_min, b_max, clip=True)
    out = apply_orientation(scaled, ornt).to(torch.float32).contiguous()
    record = PreprocessRecord(
        input_affine=in_aff,
        input_shape=in_shape,
        resampled_affine=res_aff,
        resampled_shape=res_shape if not unchanged else in_shape,
        resampled=not unchanged,
        box_start=start,
        box_end=end,
        ornt=ornt,
        final_affine=final_aff,
        final_shape=as_xyz(int(s) for s in out.shape[1:]),
        settings={"pixdim": tuple(pixdim), "margin": margin, "a_min": a_min, "a_max": a_max, "axcodes": axcodes},
    )
    return out, record


def preprocess_like_bundle(
    image: torch.Tensor, affine: np.ndarray | torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, PreprocessRecord]:
    """:func:`preprocess` with the settings of the bundle's ``configs/inference.json``, on an image as it was read
    (a file-order image of stored values is cast and laid out by the same one pass; see
    :func:`~monai.apps.vista3d.io.load_policy.as_compute_layout`)."""
    cfg = bundle_config()["preprocessing"]
    sir, crop = cfg["scale_intensity_range"], cfg["crop_foreground"]
    return preprocess(
        as_compute_layout(image), affine, pixdim=cfg["resample_spacing_mm"], margin=crop["margin"],
        allow_smaller=crop["allow_smaller"], a_min=sir["a_min"], a_max=sir["a_max"], b_min=sir["b_min"],
        b_max=sir["b_max"], axcodes=cfg["orientation"], dtype=dtype,
    )


def invert_labels(labels: torch.Tensor, record: PreprocessRecord) -> torch.Tensor:
    """Bring a label map from the network grid back to the input grid, like the bundle's ``Invertd``.

    Orientation is undone exactly, the crop is undone by padding with 0 (background), and the resampling is
    undone with nearest-neighbour interpolation and border padding.

    Args:
        labels: ``[X', Y', Z']`` or ``[C, X', Y', Z']`` label map on the network grid (any dtype).
        record: the record returned by :func:`preprocess` for this image.

    Returns:
        label map of the same dtype on the input grid, ``[X, Y, Z]`` (or ``[C, X, Y, Z]``).
    """
    squeeze = labels.ndim == 3
    lab = labels.unsqueeze(0) if squeeze else labels
    if tuple(lab.shape[1:]) != tuple(record.final_shape):
        raise ValueError(f"labels have shape {tuple(lab.shape[1:])}, expected {record.final_shape}")
    lab = undo_orientation(lab, record.ornt)
    # Pad back to the resampled grid; the inverse crop is the crop by the negated box.
    neg_start = [-s for s in record.box_start]
    neg_end = [r - s for r, s in zip(record.resampled_shape, record.box_start)]
    lab = _crop_or_pad(lab, neg_start, neg_end)
    if record.resampled:
        xform = np.linalg.solve(record.resampled_affine, record.input_affine)
        if lab.dtype.is_floating_point or _is_separable(xform):
            lab = resample(lab, xform, record.input_shape, mode="nearest", dtype=torch.float32)
        else:
            lab = resample(lab.float(), xform, record.input_shape, mode="nearest").to(labels.dtype)
    lab = lab.contiguous()
    return lab[0] if squeeze else lab


def input_to_preprocessed_coords(points: np.ndarray | Sequence, record: PreprocessRecord) -> np.ndarray:
    """Map voxel coordinates ``[N, 3]`` of the input image to voxel coordinates of the network input."""
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    hom = np.concatenate([pts, np.ones((len(pts), 1))], axis=1)
    mapped: np.ndarray = (np.linalg.solve(record.final_affine, record.input_affine) @ hom.T).T[:, :3]
    return mapped
