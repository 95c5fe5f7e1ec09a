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
"""The two-layer perceptron of transformer blocks."""

from __future__ import annotations

import torch
from torch import nn

from monai.networks.layers.factories import split_args
from monai.networks.layers.utils import get_act_layer
from monai.utils import look_up_option

__all__ = ["MLPBlock", "SUPPORTED_DROPOUT_MODE"]

SUPPORTED_DROPOUT_MODE = {"vit", "swin", "vista3d"}


class MLPBlock(nn.Module):
    """``linear1 -> act -> drop1 -> linear2 -> drop2`` (ViT, https://arxiv.org/abs/2010.11929).

    Args:
        hidden_size: input and output width.
        mlp_dim: hidden width; ``0`` means ``hidden_size``.
        dropout_rate: drop probability in ``[0, 1]``.
        act: activation name or ``(name, kwargs)``; with ``"GEGLU"`` ``linear1`` doubles its width.
        dropout_mode: ``"vit"`` (two dropout layers), ``"swin"`` (one shared dropout layer) or ``"vista3d"``
            (no dropout).
    """

    def __init__(
        self,
        hidden_size: int,
        mlp_dim: int,
        dropout_rate: float = 0.0,
        act: tuple | str = "GELU",
        dropout_mode: str = "vit",
    ) -> None:
        super().__init__()
        if not 0 <= dropout_rate <= 1:
            raise ValueError(f"dropout_rate must be in [0, 1], got {dropout_rate}.")
        mode = look_up_option(dropout_mode, SUPPORTED_DROPOUT_MODE)
        mlp_dim = mlp_dim or hidden_size
        act_name, _ = split_args(act)
        gated = isinstance(act_name, str) and act_name.upper() == "GEGLU"
        self.linear1 = nn.Linear(hidden_size, 2 * mlp_dim if gated else mlp_dim)
        self.linear2 = nn.Linear(mlp_dim, hidden_size)
        self.fn = get_act_layer(act)
        self.drop1: nn.Module
        self.drop2: nn.Module
        if mode == "vit":
            self.drop1, self.drop2 = nn.Dropout(dropout_rate), nn.Dropout(dropout_rate)
        elif mode == "swin":
            self.drop1 = nn.Dropout(dropout_rate)
            self.drop2 = self.drop1
        else:
            self.drop1, self.drop2 = nn.Identity(), nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop1(self.fn(self.linear1(x)))
        x = self.drop2(self.linear2(x))
        return x
