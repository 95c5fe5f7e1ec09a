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
"""Fused GPU kernels (Triton) and the channel-padded, channels-last layout they work in.

Nothing here knows a particular network: ``monai.networks.nets.vista3d_fused`` composes these pieces into
VISTA3D's fused forward. Triton is optional; without it :py:func:`unavailable_reason` says so and the networks keep
their module path. :py:class:`FusedConfig` holds the fused path's policy (kernel forms, launch tables, CUDA graph
window limit, cuDNN autotuning); :py:func:`conv3x3x3_dispatch` is the one place that picks a 3x3x3 convolution's
kernel.
"""

from monai.utils.triton_support import interpreting, unavailable_reason

from .dispatch import FusedConfig, choose_conv3x3x3, conv3x3x3_dispatch
from .graph_cache import GraphCache, cudnn_autotuning
from .instance_norm import NormAct, instance_stats, merge_parts, merge_parts_triton, norm_act, norm_act_reference
from .padded_weights import PaddedWeights, image_channels, pad_channels, padded_channels

__all__ = [
    "interpreting", "unavailable_reason", "FusedConfig", "choose_conv3x3x3", "conv3x3x3_dispatch", "GraphCache",
    "cudnn_autotuning", "NormAct", "instance_stats", "merge_parts", "merge_parts_triton", "norm_act",
    "norm_act_reference", "PaddedWeights", "image_channels", "pad_channels", "padded_channels",
]
