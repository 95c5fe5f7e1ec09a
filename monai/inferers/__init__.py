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
"""Inferers: whole-input and sliding-window inference."""

from monai.utils.module import not_carried_names

from .batch_size import AutoBatchSize, choose_sw_batch_size, even_batch_size
from .inferer import Inferer, SimpleInferer, SlidingWindowInferer, SlidingWindowInfererAdapt
from .utils import (
    SlidingWindowPlan,
    WindowStitcher,
    compute_importance_map,
    dense_patch_slices,
    get_scan_interval,
    get_valid_patch_size,
    plan_sliding_windows,
    sliding_window_inference,
)

__all__ = [
    "AutoBatchSize", "choose_sw_batch_size", "even_batch_size", "Inferer", "SimpleInferer", "SlidingWindowInferer",
    "SlidingWindowInfererAdapt", "SlidingWindowPlan", "WindowStitcher", "compute_importance_map",
    "dense_patch_slices", "get_scan_interval", "get_valid_patch_size", "plan_sliding_windows",
    "sliding_window_inference",
]

__getattr__ = not_carried_names(__name__)  # upstream names the fork lacks raise its one-line ImportError
