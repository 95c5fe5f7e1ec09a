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
"""``preview.png``: a picture to check a segmentation at a glance, drawn with Pillow alone (no display, no X
server, no VTK).

One row of three slices (axial, coronal, sagittal) through the image centre, and one more row through the centroid
of each structure asked for; the CT in a soft-tissue window (level 40, width 400 HU), the label map over it in the
colours of :func:`~.label_colors.label_color`, and a legend of the structures the slices show. Slices are shown as a
radiologist reads them (the patient's right on the left, anterior and superior up), whatever the voxel order on
disk, and stretched to their size in mm.

:func:`preview_slices` takes the few slices off the device (the only work where the volume is);
:func:`write_preview` draws and writes them (the saver's thread).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.labels import label_names

from .label_colors import label_color

__all__ = ["PreviewSlices", "preview_slices", "render_preview", "write_preview", "pillow_missing", "PANEL_PX"]

#: the longer side of each slice's panel, in pixels
PANEL_PX = 256
_WINDOW = (40.0 - 200.0, 40.0 + 200.0)  # soft tissue: level 40 HU, width 400 HU
_ALPHA = 0.45
_VIEWS = ("axial", "coronal", "sagittal")


@dataclass
class PreviewSlices:
    """The slices of a preview, on the host.

    Attributes:
        rows: per row, its title and its three views, each ``(ct [H, W] float32 HU, labels [H, W] int64,
            (mm per pixel across, mm per pixel down))`` already in display orientation.
    """

    rows: list[tuple[str, list[tuple[np.ndarray, np.ndarray, tuple[float, float]]]]]

    @property
    def shown(self) -> list[int]:
        """The label ids the slices show (background left out), ascending."""
        ids: set[int] = set()
        for _, views in self.rows:
            for _, lab, _ in views:
                ids.update(int(i) for i in np.unique(lab))
        return sorted(i for i in ids if i > 0)


def pillow_missing() -> str | None:
    """None where Pillow imports, else how to install it."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        return "the preview needs Pillow: pip install pillow (the 'preview' extra)"
    return None


def _world_axes(affine: np.ndarray) -> list[tuple[int, bool]]:
    """For R, A and S in turn: the voxel axis closest to it, and whether that axis runs against it."""
    import nibabel as nib

    ornt = nib.orientations.io_orientation(np.asarray(affine, dtype=np.float64))  # per voxel axis: world axis, sign
    out = [(0, False)] * 3
    for voxel_axis, (world_axis, sign) in enumerate(ornt):
        out[int(world_axis)] = (voxel_axis, sign < 0)
    return out


#: the world axes across and down the screen for each plane, by the world axis it is normal to:
#: axial (S): R/A, coronal (A): R/S, sagittal (R): A/S
_SCREEN_AXES = {2: (0, 1), 1: (0, 2), 0: (1, 2)}


def _view(volume: torch.Tensor, axes: list[tuple[int, bool]], normal: int, index: int) -> np.ndarray:
    """The slice of ``volume`` across world axis ``normal`` at voxel ``index``, as a host array whose rows run down
    the screen (S or A decreasing) and columns across it (the patient's right first, or anterior first)."""
    across, down = _SCREEN_AXES[normal]
    picked = volume.select(axes[normal][0], index)
    # the remaining voxel axes, named by the world axis each stands for
    remaining = [w for w in range(3) if w != normal]
    order = sorted(remaining, key=lambda w: axes[w][0])
    plane = picked.permute(order.index(down), order.index(across))  # [down, across]
    flips = []
    if not axes[down][1]:  # rows from the most superior/anterior voxel down
        flips.append(0)
    if not axes[across][1]:  # columns from the patient's right (largest R) or the front (largest A)
        flips.append(1)
    if flips:
        plane = plane.flip(flips)
    return plane.cpu().numpy()


def preview_slices(
    image: torch.Tensor, labels: torch.Tensor, affine: np.ndarray, centroids: Sequence[tuple[str, Sequence[float]]] = ()
) -> PreviewSlices:
    """Take the preview's slices off the device: through the image centre, then through each of ``centroids``.

    Args:
        image: the CT, ``[X, Y, Z]`` or ``[1, X, Y, Z]``, in HU.
        labels: the label map on the same grid.
        affine: the grid's voxel-to-world (RAS) matrix.
        centroids: ``(title, voxel coordinates)`` of each structure that gets a row of its own.
    """
    image = image[0] if image.ndim == 4 else image
    labels = labels[0] if labels.ndim == 4 else labels
    affine = np.asarray(affine, dtype=np.float64)
    axes = _world_axes(affine)
    spacing = np.linalg.norm(affine[:3, :3], axis=0)
    shape = tuple(labels.shape)
    rows = []
    for title, centre in [("image centre", [(n - 1) / 2 for n in shape]), *centroids]:
        voxel = [min(max(int(round(float(c))), 0), n - 1) for c, n in zip(centre, shape)]
        views = []
        for normal in (2, 1, 0):
            index = voxel[axes[normal][0]]
            across, down = _SCREEN_AXES[normal]
            views.append((_view(image, axes, normal, index).astype(np.float32),
                          _view(labels, axes, normal, index).astype(np.int64),
                          (float(spacing[axes[across][0]]), float(spacing[axes[down][0]]))))
        rows.append((title, views))
    return PreviewSlices(rows)


def _panel(ct: np.ndarray, lab: np.ndarray, pixel_mm: tuple[float, float]) -> Any:
    """One view as an RGB image of at most :data:`PANEL_PX` a side, in proportion to its size in mm."""
    from PIL import Image

    lo, hi = _WINDOW
    grey = np.clip((ct - lo) * (255.0 / (hi - lo)), 0, 255)
    rgb = np.repeat(grey[..., None], 3, axis=2)
    if lab.size and lab.max() > 0:
        table = np.array([label_color(i) for i in range(int(lab.max()) + 1)], dtype=np.float64)
        mask = lab > 0
        rgb[mask] = (1 - _ALPHA) * rgb[mask] + _ALPHA * table[lab[mask]]
    height_mm, width_mm = ct.shape[0] * pixel_mm[1], ct.shape[1] * pixel_mm[0]
    scale = PANEL_PX / max(height_mm, width_mm, 1e-6)
    size = (max(1, round(width_mm * scale)), max(1, round(height_mm * scale)))
    # Image.NEAREST: Pillow 9.0 (the extra's floor) has no Image.Resampling; newer Pillow's annotations declare the
    # constant only as Resampling.NEAREST, though Image.NEAREST is kept at run time
    return Image.fromarray(rgb.astype(np.uint8), "RGB").resize(size, Image.NEAREST)  # type: ignore[attr-defined]


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap font
        return ImageFont.load_default()


def render_preview(slices: PreviewSlices, names: Mapping[int, str] | None = None) -> Any:
    """The preview as a Pillow RGB image: the rows of views on the left, the legend on the right."""
    from PIL import Image, ImageDraw

    names = label_names() if names is None else names
    title_px, gap, line = 18, 6, 15
    font = _font(12)
    grid_w = 3 * PANEL_PX + 4 * gap
    grid_h = len(slices.rows) * (PANEL_PX + title_px + gap) + gap
    shown = slices.shown
    per_column = max(8, (grid_h - 2 * gap) // line - 1)
    columns = max(1, -(-len(shown) // per_column))
    legend_w = columns * 190 + gap
    canvas = Image.new("RGB", (grid_w + legend_w, max(grid_h, 60)), (0, 0, 0))
    draw = ImageDraw.Draw(canvas)
    y = gap
    for title, views in slices.rows:
        draw.text((gap, y), title, fill=(255, 255, 255), font=font)
        for k, (view, (ct, lab, pixel_mm)) in enumerate(zip(_VIEWS, views)):
            panel = _panel(ct, lab, pixel_mm)
            x0 = gap + k * (PANEL_PX + gap)
            canvas.paste(panel, (x0 + (PANEL_PX - panel.width) // 2, y + title_px + (PANEL_PX - panel.height) // 2))
            draw.text((x0 + PANEL_PX - 60, y), view, fill=(160, 160, 160), font=font)
        y += PANEL_PX + title_px + gap
    x_legend = grid_w
    draw.text((x_legend, gap), f"{len(shown)} structure(s) shown" if shown else "no structure in these slices",
              fill=(255, 255, 255), font=font)
    for n, label_id in enumerate(shown):
        col, row = divmod(n, per_column)
        x, y = x_legend + col * 190, gap + (row + 1) * line
        draw.rectangle((x, y + 2, x + 10, y + 12), fill=label_color(label_id))
        draw.text((x + 15, y), f"{label_id} {names.get(label_id, f'label_{label_id}')}"[:28], fill=(230, 230, 230),
                  font=font)
    return canvas


def write_preview(slices: PreviewSlices, path: str | os.PathLike, names: Mapping[int, str] | None = None) -> Path:
    """Draw the preview and write it as PNG to ``path`` (through a temporary name beside it, renamed when whole).

    Raises:
        Vista3DInputError: Pillow is not installed.
    """
    missing = pillow_missing()
    if missing:
        raise Vista3DInputError(missing)
    from .atomic import write_atomically

    picture = render_preview(slices, names)
    return write_atomically(path, lambda f: picture.save(f, format="PNG", compress_level=1))
