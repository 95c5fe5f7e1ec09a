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
"""The colour of each VISTA3D label, the same in the preview and in a DICOM SEG's recommended display colours.

VISTA3D's bundle defines no colours, so this table is the fork's own, made by a fixed rule rather than copied from a
viewer: label ``i`` gets the hue ``i`` times the golden ratio (mod 1), so that neighbouring ids (left and right of one
organ, successive vertebrae or ribs) land far apart on the colour wheel, with saturation and brightness alternating
between two levels by the id's parity. The rule gives every id up to 255 a colour and never changes, so a structure
keeps its colour across images, runs and versions.
"""

from __future__ import annotations

import colorsys
from functools import cache

__all__ = ["label_color", "GOLDEN_RATIO"]

GOLDEN_RATIO = 0.6180339887498949


@cache
def label_color(label_id: int) -> tuple[int, int, int]:
    """The ``(r, g, b)`` (0-255) colour of a label id (background 0 is black)."""
    i = int(label_id)
    if i <= 0:
        return 0, 0, 0
    hue = (i * GOLDEN_RATIO) % 1.0
    saturation = 0.85 if i % 2 else 0.6
    value = 0.95 if (i // 2) % 2 == 0 else 0.8
    r, g, b = colorsys.hsv_to_rgb(hue, saturation, value)
    return round(r * 255), round(g * 255), round(b * 255)
