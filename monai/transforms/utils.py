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

from monai.utils import point_helpers as _point_helpers
from monai.utils.module import not_carried_names
from monai.utils.point_helpers import *  # noqa: F403 - the names of __all__

__all__ = list(_point_helpers.__all__)
__getattr__ = not_carried_names(__name__)  # the rest of upstream's transform utilities
