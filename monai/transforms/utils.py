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
"""Upstream's home of the point-prompt helpers VISTA3D calls; they live in :mod:`monai.utils.point_helpers`.

The networks use them too, and a network must not depend on the transforms, so the code sits in ``monai.utils``
and this module keeps upstream's import path.
"""

from __future__ import annotations

from monai.utils.point_helpers import (
    convert_points_to_disc,
    erode,
    get_largest_connected_component_mask,
    keep_components_with_positive_points,
    keep_merge_components_with_points,
    sample_points_from_label,
)

__all__ = [
    "get_largest_connected_component_mask",
    "keep_merge_components_with_points",
    "keep_components_with_positive_points",
    "convert_points_to_disc",
    "sample_points_from_label",
    "erode",
]
