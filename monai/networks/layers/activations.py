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
"""Activations not provided by ``torch.nn`` (``Act["geglu"]``; upstream exports them from ``monai.networks.blocks``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GEGLU"]


class GEGLU(nn.Module):
    """Gated GELU (Shazeer, 2020): splits the last dimension into halves ``x, gate`` and returns ``x * gelu(gate)``.

    The last dimension of the input must be even; the output has half of it.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = x.chunk(2, dim=-1)
        return value * F.gelu(gate)
