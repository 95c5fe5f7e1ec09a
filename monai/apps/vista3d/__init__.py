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
"""VISTA3D inference: point-prompt windows and (in further modules) the segmentation pipeline."""

from .inferer import point_based_window_inferer
from .streaming import logits_to_labels, sliding_window_label_inference

from monai.utils.module import names_from_submodules

__getattr__ = names_from_submodules(__name__, __path__)  # e.g. `from monai.apps.vista3d import Vista3DPipeline`
