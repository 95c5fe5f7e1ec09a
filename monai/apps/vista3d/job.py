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
"""The one validation of a segmentation job's settings, shared by the Python API and the command line.

Each check returns the setting as the library uses it, or raises :class:`SettingError`, which names the field
(``roi_size``); the command line names its flag instead (``--roi-size``) from the same error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import Vista3DInputError

__all__ = [
    "SettingError",
    "OUTPUT_DTYPES",
    "NONFINITE",
    "ROI_MULTIPLE",
    "check_roi_size",
    "check_overlap",
    "check_sw_batch_size",
    "check_output_dtype",
    "check_nonfinite",
    "check_embed_dim",
    "embed_dim_of",
    "DEFAULT_EMBED_DIM",
    "FIELD_FLAGS",
]

#: voxel types a label map may be saved as (uint8 holds every label id and the 255 sentinel)
OUTPUT_DTYPES = ("uint8", "int16", "float32")
#: how NaN/Inf voxels are read: as air (-1000 HU, with a warning that counts them), or refused
NONFINITE = ("air", "error")
#: VISTA3D's encoder halves the grid four times, so windows are multiples of this
ROI_MULTIPLE = 16
#: the ``vista3d132`` width of the published checkpoint, and so of a network built without ``encoder_embed_dim``
DEFAULT_EMBED_DIM = 48
#: the command-line flag of each field (``vista3d`` and ``vista3d serve`` name them alike)
FIELD_FLAGS = {
    "roi_size": "--roi-size",
    "overlap": "--overlap",
    "sw_batch_size": "--sw-batch-size",
    "output_dtype": "--output-dtype",
    "nonfinite": "--strict",
    "device": "--device",
    "encoder_embed_dim": "--embed-dim",
    "per_class": "--per-class",
}


class SettingError(Vista3DInputError):
    """A setting that cannot be used. ``field`` is its Python name; the message reads ``"<field> <problem>"``.

    Args:
        field: the parameter's name (``roi_size``).
        problem: what is wrong and how to fix it, without the name (``"must be in [0, 1), got 2"``).
    """

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


def check_roi_size(value: int | Sequence[int], multiple: int = 1) -> tuple[int, int, int]:
    """A window size as three ints: one int is a cube; each a positive multiple of ``multiple``."""
    try:
        roi = (int(value),) * 3 if isinstance(value, (int, np.integer)) else tuple(int(r) for r in value)
    except (TypeError, ValueError):
        roi = ()
    if len(roi) != 3 or any(r < multiple or r < 1 or r % multiple for r in roi):
        why = " (VISTA3D halves the window four times)" if multiple > 1 else ""
        shown = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else value
        raise SettingError("roi_size", f"must be one or three positive multiples of {multiple}{why}, got "
                                       f"{shown!r}; e.g. 128 (the bundle's) or 64.")
    return roi  # type: ignore[return-value]


def check_overlap(value: Any) -> float:
    """The window overlap as a float in ``[0, 1)``."""
    try:
        overlap = float(value)
    except (TypeError, ValueError):
        overlap = float("nan")
    if not 0.0 <= overlap < 1.0:
        raise SettingError("overlap", f"must be in [0, 1), got {value!r}; the bundle's is 0.25.")
    return overlap


def check_sw_batch_size(value: Any) -> int | str:
    """Windows per network call: a positive int, or ``"auto"``."""
    if isinstance(value, str) and value == "auto":
        return value
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or (isinstance(value, float) and value != n):
        raise SettingError("sw_batch_size", f"must be >= 1 or 'auto', got {value!r}.")
    return n


def check_output_dtype(value: Any) -> str:
    """The label map's voxel type on disk, one of :data:`OUTPUT_DTYPES`."""
    if str(value) not in OUTPUT_DTYPES:
        raise SettingError("output_dtype", f"must be {', '.join(OUTPUT_DTYPES)}, got {value!r}.")
    return str(value)


def check_nonfinite(value: Any) -> str:
    """How NaN/Inf voxels are read, one of :data:`NONFINITE`."""
    if value not in NONFINITE:
        raise SettingError("nonfinite", f"must be 'air' or 'error', got {value!r}.")
    return value


def check_embed_dim(value: Any) -> int:
    """A ``vista3d132`` width the network can be built with: a positive multiple of 8 (the point head's attention
    splits half of it over 4 heads)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 8 or value % 8:
        raise SettingError("encoder_embed_dim", f"must be a positive multiple of 8, got {value!r}; the published "
                                                "checkpoint uses 48 (the default).")
    return int(value)


def embed_dim_of(network_kwargs: Any) -> int:
    """The checked ``vista3d132`` width that ``network_kwargs`` builds (:data:`DEFAULT_EMBED_DIM` when unset)."""
    return check_embed_dim((network_kwargs or {}).get("encoder_embed_dim", DEFAULT_EMBED_DIM))
