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
"""What to segment: class prompts (label ids or names) and point prompts (clicks), parsed once per run.

:func:`parse_prompt` turns the user's ``classes`` / ``points`` / ``point_labels`` into a :class:`Prompt`; the
pipeline maps its points onto each image's network grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import torch

from monai.apps.vista3d.errors import PromptError
from monai.apps.vista3d.labels import parse_classes, special_point_labels

from .preprocess import input_to_preprocessed_coords

if TYPE_CHECKING:
    from .preprocess import PreprocessRecord

__all__ = ["Prompt", "parse_prompt", "parse_points", "prompt_on_grid"]

ClassSpec = Union[str, int, Sequence[Union[int, str]], None]


@dataclass(frozen=True, eq=False)
class Prompt:
    """A parsed prompt, the same for every image of a run.

    Attributes:
        label_ids: label ids to segment (class prompt, groups expanded), the clicked object's class (one id, with
            points), or ``None`` for a point-only prompt.
        points: ``[N, 3]`` float64 voxel indices of the input image, or ``None`` for a class prompt.
        point_labels: ``[N]`` int64, 1 (positive) or 0 (negative), or ``None``.
    """

    label_ids: list[int] | None
    points: np.ndarray | None = None
    point_labels: np.ndarray | None = None


def _is_everything(classes: ClassSpec) -> bool:
    return isinstance(classes, str) and classes.strip().lower() == "everything"


def parse_prompt(classes: ClassSpec | Prompt = "everything", points: Any = None, point_labels: Any = None) -> Prompt:
    """Check and parse a prompt once; what the pipeline and the batch driver take.

    Args:
        classes: ``"everything"`` (the bundle's 117 labels), label ids / names (``"3,14,liver"`` or a sequence).
            With points: at most one class (the clicked object's); ``"everything"`` or ``None`` means none.
            A :class:`Prompt` parsed already is returned as it is.
        points: ``"x,y,z;x,y,z"`` or ``[N, 3]`` voxel indices of the input image, or ``None``.
        point_labels: ``"1,0"`` or ``[N]``, one per point.

    Raises:
        PromptError, ClassPromptError: for anything that cannot be used; the message says what to change.
    """
    if isinstance(classes, Prompt):
        if points is not None or point_labels is not None:
            raise PromptError("give the points in the Prompt or beside classes, not both")
        return classes
    pts, labs = parse_points(points, point_labels)
    if pts is None:
        return Prompt(parse_classes(classes))
    if classes is None or _is_everything(classes):
        return Prompt(None, pts, labs)
    label_ids = parse_classes(classes, expand_subclasses=False)
    if len(label_ids) != 1:
        raise PromptError(f"points describe one object: give at most one class with points, got {label_ids}")
    return Prompt(label_ids, pts, labs)


def _as_array(values, dtype) -> np.ndarray:
    return np.asarray(values.cpu() if isinstance(values, torch.Tensor) else values, dtype=dtype)


def parse_points(points, point_labels) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Parse point prompts: ``"x,y,z;x,y,z"`` (voxel indices of the input image) and ``"1,0"``.

    Returns:
        ``(points [N, 3] float64, labels [N] int64)`` or ``(None, None)``.

    Raises:
        PromptError: points without labels (or the reverse), a count mismatch, a label not 0/1, bad syntax.
    """
    if points is None and point_labels is None:
        return None, None
    if points is None:
        raise PromptError("point labels were given without points: add points='x,y,z;...'")
    if point_labels is None:
        raise PromptError("points were given without labels: add point_labels= with one 1 (positive) or "
                          "0 (negative) per point")
    try:
        if isinstance(points, str):
            pts = np.array([[float(v) for v in p.split(",")] for p in points.split(";") if p.strip()],
                           dtype=np.float64)
        else:
            pts = _as_array(points, np.float64)
        if isinstance(point_labels, str):
            labs = np.array([int(v) for v in point_labels.split(",") if v.strip()], dtype=np.int64)
        else:
            labs = _as_array(point_labels, np.int64).reshape(-1)
    except (ValueError, TypeError, OverflowError) as e:  # OverflowError: an integer no int64 holds
        raise PromptError(
            f"cannot parse the points/labels ({e}): use points='x,y,z;x,y,z' point_labels='1,0'") from None
    pts = pts.reshape(-1, pts.shape[-1]) if pts.size else pts.reshape(0, 3)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise PromptError(f"each point needs 3 coordinates x,y,z; got points of shape {tuple(pts.shape)}")
    if len(pts) == 0:
        raise PromptError("no points given")
    if len(labs) != len(pts):
        raise PromptError(f"{len(pts)} points but {len(labs)} point labels: give one label per point")
    if not np.isin(labs, (0, 1)).all():
        raise PromptError(f"point labels must be 1 (positive) or 0 (negative), got {labs.tolist()}")
    if not np.isfinite(pts).all():
        raise PromptError("point coordinates must be finite numbers")
    return pts, labs


def prompt_on_grid(prompt: Prompt, record: PreprocessRecord, device: torch.device) -> dict[str, Any]:
    """``prompt`` (points in input voxels) on the network grid of the image ``record`` describes.

    Returns:
        dict with ``label_ids`` (list or None), ``point_coords`` ``[1, N, 3]`` and ``point_labels`` ``[1, N]``
        tensors on ``device`` (or None); the special classes' point labels are 2/3.

    Raises:
        PromptError: a point outside the image, or in the air cropped away by the preprocessing.
    """
    if prompt.points is None:
        return {"label_ids": prompt.label_ids, "point_coords": None, "point_labels": None}
    points = prompt.points
    shape = np.asarray(record.input_shape)
    outside = [p.tolist() for p in points if (p < -0.5).any() or (p > shape - 0.5).any()]
    if outside:
        raise PromptError(
            f"point(s) {outside} lie outside the image (voxel indices must be within 0..{(shape - 1).tolist()})"
        )
    coords = input_to_preprocessed_coords(points, record)
    fshape = np.asarray(record.final_shape)
    cropped = [p.tolist() for p, c in zip(points, coords) if (c < -0.5).any() or (c > fshape - 0.5).any()]
    if cropped:
        raise PromptError(
            f"point(s) {cropped} lie in the air outside the body, beyond the foreground crop of the bundle; "
            "click inside the body"
        )
    labs = np.asarray(prompt.point_labels, dtype=np.int64).copy()
    if prompt.label_ids is not None and prompt.label_ids[0] in special_point_labels():
        labs = labs + 2  # the bundle's special classes (vessels, tumours) use labels 2/3
    return {
        "label_ids": prompt.label_ids,
        "point_coords": torch.as_tensor(coords, dtype=torch.float32, device=device)[None],
        "point_labels": torch.as_tensor(labs, device=device)[None],
    }
