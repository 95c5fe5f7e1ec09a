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
"""A convolution followed by optional normalization, dropout and activation."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from monai.networks.blocks.acti_norm import ADN
from monai.networks.layers.convutils import same_padding, stride_minus_kernel_padding
from monai.networks.layers.factories import Conv

__all__ = ["Convolution"]


class Convolution(nn.Sequential):
    """``conv`` (a convolution or transposed convolution) then, unless ``conv_only``, an ``adn`` block
    (:py:class:`ADN`).

    Args:
        spatial_dims: number of spatial dimensions.
        in_channels: number of input channels.
        out_channels: number of output channels.
        strides: convolution stride.
        kernel_size: convolution kernel size.
        adn_ordering: order of activation, dropout and normalization, e.g. ``"NDA"``.
        act: activation name or ``(name, kwargs)``; ``None`` for none.
        norm: normalization name or ``(name, kwargs)``; ``None`` for none.
        dropout: drop probability or ``(name, kwargs)``; ``None`` for none.
        dropout_dim: spatial dimension of the dropout.
        dilation: convolution dilation.
        groups: convolution groups.
        bias: whether the convolution has a bias.
        conv_only: only the convolution, no ``adn`` block.
        is_transposed: use a transposed convolution.
        padding: input padding; defaults to "same" padding for stride 1.
        output_padding: output padding of the transposed convolution; defaults to ``strides - 1``.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        strides: Sequence[int] | int = 1,
        kernel_size: Sequence[int] | int = 3,
        adn_ordering: str = "NDA",
        act: tuple | str | None = "PRELU",
        norm: tuple | str | None = "INSTANCE",
        dropout: tuple | str | float | None = None,
        dropout_dim: int | None = 1,
        dilation: Sequence[int] | int = 1,
        groups: int = 1,
        bias: bool = True,
        conv_only: bool = False,
        is_transposed: bool = False,
        padding: Sequence[int] | int | None = None,
        output_padding: Sequence[int] | int | None = None,
    ) -> None:
        super().__init__()
        self.spatial_dims = spatial_dims
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.is_transposed = is_transposed
        if padding is None:
            padding = same_padding(kernel_size, dilation)
        kwargs = dict(kernel_size=kernel_size, stride=strides, padding=padding, dilation=dilation, groups=groups)
        if is_transposed:
            if output_padding is None:
                output_padding = stride_minus_kernel_padding(1, strides)
            conv = Conv[Conv.CONVTRANS, spatial_dims](
                in_channels, out_channels, output_padding=output_padding, bias=bias, **kwargs
            )
        else:
            conv = Conv[Conv.CONV, spatial_dims](in_channels, out_channels, bias=bias, **kwargs)
        self.add_module("conv", conv)
        if conv_only or (act is None and norm is None and dropout is None):
            return
        self.add_module(
            "adn",
            ADN(
                ordering=adn_ordering,
                in_channels=out_channels,
                act=act,
                norm=norm,
                norm_dim=spatial_dims,
                dropout=dropout,
                dropout_dim=dropout_dim,
            ),
        )
