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
"""Residual and plain double-convolution blocks of DynUNet, used by the VISTA3D class head."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from monai.networks.blocks.convolutions import Convolution
from monai.networks.layers.factories import Act, Norm
from monai.networks.layers.utils import get_act_layer, get_norm_layer

__all__ = ["UnetResBlock", "UnetBasicBlock", "get_conv_layer", "get_padding", "get_output_padding"]


def _per_dim(*values: Sequence[int] | int) -> list[tuple[int, ...]]:
    as_tuples = [tuple(v) if isinstance(v, Sequence) else (v,) for v in values]
    n = max(len(t) for t in as_tuples)
    return [t * n if len(t) == 1 else t for t in as_tuples]


def get_padding(kernel_size: Sequence[int] | int, stride: Sequence[int] | int) -> tuple[int, ...] | int:
    """Padding ``(kernel_size - stride + 1) // 2`` so that a strided convolution divides the size by ``stride``."""
    ks, st = _per_dim(kernel_size, stride)
    padding = tuple(int((k - s + 1) / 2) for k, s in zip(ks, st))
    if min((k - s + 1) / 2 for k, s in zip(ks, st)) < 0:
        raise AssertionError(
            f"kernel_size {kernel_size} with stride {stride} needs a negative padding: use a kernel of at least "
            "stride - 1."
        )
    return padding if len(padding) > 1 else padding[0]


def get_output_padding(
    kernel_size: Sequence[int] | int, stride: Sequence[int] | int, padding: Sequence[int] | int
) -> tuple[int, ...] | int:
    """Output padding ``2 * padding + stride - kernel_size`` of the matching transposed convolution."""
    ks, st, pad = _per_dim(kernel_size, stride, padding)
    out = tuple(2 * p + s - k for k, s, p in zip(ks, st, pad))
    if min(out) < 0:
        raise AssertionError(
            f"kernel_size {kernel_size}, stride {stride} and padding {padding} need a negative output padding of "
            "the transposed convolution: change the kernel size or the stride."
        )
    return out if len(out) > 1 else out[0]


def get_conv_layer(
    spatial_dims: int,
    in_channels: int,
    out_channels: int,
    kernel_size: Sequence[int] | int = 3,
    stride: Sequence[int] | int = 1,
    act: tuple | str | None = Act.PRELU,
    norm: tuple | str | None = Norm.INSTANCE,
    dropout: tuple | str | float | None = None,
    bias: bool = False,
    conv_only: bool = True,
    is_transposed: bool = False,
) -> Convolution:
    """A :py:class:`Convolution` whose padding makes a stride-``s`` convolution divide the spatial size by ``s``."""
    padding = get_padding(kernel_size, stride)
    output_padding = get_output_padding(kernel_size, stride, padding) if is_transposed else None
    return Convolution(
        spatial_dims,
        in_channels,
        out_channels,
        strides=stride,
        kernel_size=kernel_size,
        act=act,
        norm=norm,
        dropout=dropout,
        bias=bias,
        conv_only=conv_only,
        is_transposed=is_transposed,
        padding=padding,
        output_padding=output_padding,
    )


_LEAKY = ("leakyrelu", {"inplace": True, "negative_slope": 0.01})


class UnetBasicBlock(nn.Module):
    """Two convolutions, each followed by normalization and activation.

    Args:
        spatial_dims: number of spatial dimensions.
        in_channels: number of input channels.
        out_channels: number of output channels.
        kernel_size: convolution kernel size.
        stride: stride of the first convolution.
        norm_name: normalization name or ``(name, kwargs)``.
        act_name: activation name or ``(name, kwargs)``.
        dropout: dropout probability or ``(name, kwargs)``.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: Sequence[int] | int,
        stride: Sequence[int] | int,
        norm_name: tuple | str,
        act_name: tuple | str = _LEAKY,
        dropout: tuple | str | float | None = None,
    ):
        super().__init__()
        common: dict[str, Any] = dict(dropout=dropout, act=None, norm=None, conv_only=False)
        self.conv1 = get_conv_layer(spatial_dims, in_channels, out_channels, kernel_size, stride, **common)
        self.conv2 = get_conv_layer(spatial_dims, out_channels, out_channels, kernel_size, 1, **common)
        self.lrelu = get_act_layer(act_name)
        self.norm1 = get_norm_layer(norm_name, spatial_dims=spatial_dims, channels=out_channels)
        self.norm2 = get_norm_layer(norm_name, spatial_dims=spatial_dims, channels=out_channels)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lrelu(self.norm1(self.conv1(inp)))
        out = self.lrelu(self.norm2(self.conv2(out)))
        return out



class UnetResBlock(UnetBasicBlock):
    """Two convolutions with normalization and a residual connection (nnU-Net style).

    ``conv1 -> norm1 -> act -> conv2 -> norm2 (+ residual) -> act``; the residual goes through a 1x1 convolution
    ``conv3`` and ``norm3`` when the channel count or the stride changes.

    Args:
        spatial_dims: number of spatial dimensions.
        in_channels: number of input channels.
        out_channels: number of output channels.
        kernel_size: convolution kernel size.
        stride: stride of the first convolution.
        norm_name: normalization name or ``(name, kwargs)``.
        act_name: activation name or ``(name, kwargs)``.
        dropout: dropout probability or ``(name, kwargs)``.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: Sequence[int] | int,
        stride: Sequence[int] | int,
        norm_name: tuple | str,
        act_name: tuple | str = _LEAKY,
        dropout: tuple | str | float | None = None,
    ):
        # the same two convolutions, norms and activation as UnetBasicBlock (and the same checkpoint keys)
        super().__init__(spatial_dims, in_channels, out_channels, kernel_size, stride, norm_name, act_name, dropout)
        strides = stride if isinstance(stride, Sequence) else [stride]
        self.downsample = in_channels != out_channels or any(s != 1 for s in strides)
        if self.downsample:
            self.conv3 = get_conv_layer(
                spatial_dims, in_channels, out_channels, 1, stride,
                dropout=dropout, act=None, norm=None, conv_only=False,
            )
            self.norm3 = get_norm_layer(norm_name, spatial_dims=spatial_dims, channels=out_channels)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm2(self.conv2(self.lrelu(self.norm1(self.conv1(inp)))))
        residual = inp
        if hasattr(self, "conv3"):  # not `self.downsample`: TorchScript resolves hasattr when it compiles
            residual = self.norm3(self.conv3(inp))
        out += residual
        out = self.lrelu(out)
        return out
