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
"""The UNETR encoder block, used by the VISTA3D class head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from monai.networks.blocks.dynunet_block import UnetBasicBlock, UnetResBlock

__all__ = ["UnetrBasicBlock"]


class UnetrBasicBlock(nn.Module):
    """A double-convolution block of UNETR (Hatamizadeh et al., https://arxiv.org/abs/2103.10504).

    Its only submodule ``layer`` is a :py:class:`UnetResBlock` when ``res_block`` else a :py:class:`UnetBasicBlock`.

    Args:
        spatial_dims: number of spatial dimensions.
        in_channels: number of input channels.
        out_channels: number of output channels.
        kernel_size: convolution kernel size.
        stride: stride of the first convolution.
        norm_name: normalization name or ``(name, kwargs)``.
        res_block: use the residual variant.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: Sequence[int] | int,
        stride: Sequence[int] | int,
        norm_name: tuple | str,
        res_block: bool = False,
    ) -> None:
        super().__init__()
        block = UnetResBlock if res_block else UnetBasicBlock
        self.layer = block(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            kernel_size=kernel_size,
            stride=stride,
            norm_name=norm_name,
        )

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(inp)
        return out
