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
"""Activations not provided by ``torch.nn`` (``Act["geglu"]``, ``Act["swish"]``; upstream exports them from
``monai.networks.blocks``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GEGLU", "Swish"]


class GEGLU(nn.Module):
    """Gated GELU (Shazeer, 2020): splits the last dimension into halves ``x, gate`` and returns ``x * gelu(gate)``.

    The last dimension of the input must be even; the output has half of it.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = x.chunk(2, dim=-1)
        return value * F.gelu(gate)


class Swish(nn.Module):
    """``x * sigmoid(alpha * x)`` (Ramachandran et al., 2017), ``Act["swish"]`` as in MONAI 1.6.1.

    With the default ``alpha=1`` it is ``torch.nn.SiLU`` (which ``Act["memswish"]`` gives).
    """

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.alpha * x)
