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
"""Layer factories and helpers used by the VISTA3D networks."""

from monai.utils.module import not_carried_names

from .convutils import same_padding, stride_minus_kernel_padding
from .factories import Act, Conv, Dropout, LayerFactory, Norm, Pool, split_args
from .utils import get_act_layer, get_dropout_layer, get_norm_layer

__all__ = [
    "same_padding", "stride_minus_kernel_padding", "Act", "Conv", "Dropout", "LayerFactory", "Norm", "Pool",
    "split_args", "get_act_layer", "get_dropout_layer", "get_norm_layer",
]

__getattr__ = not_carried_names(__name__)  # upstream names the fork lacks raise its one-line ImportError
