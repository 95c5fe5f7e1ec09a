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
"""Convolution weights zero-padded to channel counts that run fast, in channels-last layout.

cuDNN runs a 3x3x3 convolution of 48 channels 2.2x faster when input and weights are zero-padded to 64 channels
(96 to 128: 1.5x), measured on the H200 (see ``docs/benchmarks.md``). Zero channels change no sum, so the padded
convolution gives the real channels' values and zeros in the padding, up to the kernel's own rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from monai.networks.kernels.conv3d import conv3x3x3_weights, single_channel_weights
from monai.networks.kernels.conv_transpose3d import conv_transpose3x3x3_weights

__all__ = ["padded_channels", "image_channels", "pad_channels", "PaddedWeights"]

_ALIGN = 64

# a cached value: the conv weights and bias, a GEMM operand, a norm's affine pair
ValueT = TypeVar("ValueT")
# the layers whose parameters are padded (the network's convolutions and instance norms)
PaddedLayer = Union[nn.Conv3d, nn.ConvTranspose3d, nn.InstanceNorm3d]
# a 96-channel convolution's resident-kernel operands by (output half, input half)
Quarters = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def padded_channels(channels: int) -> int:
    """The channel count of an activation in the padded layout: the next multiple of 64."""
    return -(-channels // _ALIGN) * _ALIGN


def image_channels(channels: int) -> int:
    """The padded channel count of a network's input image: 8 for up to 8 channels, else a multiple of 64.

    With a single channel cuDNN cannot tell channels-last from channels-first and returns channels-first outputs;
    8 fp16 channels fill one 16-byte vector per voxel.
    """
    return 8 if channels <= 8 else padded_channels(channels)


def pad_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``x`` ``[B, C, *spatial]`` with zero channels appended up to ``channels``, channels-last (a copy when needed)."""
    memory_format = torch.channels_last_3d if x.ndim == 5 else torch.contiguous_format
    if x.shape[1] < channels:
        x = F.pad(x, (0, 0) * (x.ndim - 2) + (0, channels - x.shape[1]))
    return x.contiguous(memory_format=memory_format)


def _pad_to(t: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    out = t.new_zeros(sizes)
    out[tuple(slice(0, s) for s in t.shape)] = t
    return out


class PaddedWeights:
    """Padded copies of convolution weights, made on first use and remade when a parameter changes.

    A parameter counts as changed when its storage, device, dtype or version counter (bumped by every in-place
    write, ``load_state_dict`` included) differs from the copy's, so a cached copy is never stale.
    """

    def __init__(self) -> None:
        # one cache per kind of value: (id(module), *form) -> (the parameters' fingerprint, the value)
        self._convs: dict[tuple, tuple[tuple, tuple[torch.Tensor, torch.Tensor | None]]] = {}
        self._gemms: dict[tuple, tuple[tuple, torch.Tensor]] = {}
        self._quarters: dict[tuple, tuple[tuple, Quarters]] = {}
        self._affines: dict[tuple, tuple[tuple, tuple[torch.Tensor, torch.Tensor]]] = {}

    @staticmethod
    def _cached(
        cache: dict[tuple, tuple[tuple, ValueT]], module: PaddedLayer, form: tuple, make: Callable[[], ValueT]
    ) -> ValueT:
        params = (module.weight, module.bias)
        key = tuple((p.data_ptr(), p.device, p.dtype, p._version) for p in params if p is not None)
        hit = cache.get((id(module),) + form)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = make()
        cache[(id(module),) + form] = (key, value)
        return value

    def __call__(
        self, conv: nn.Conv3d | nn.ConvTranspose3d, dtype: torch.dtype, in_channels: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight, bias)`` of ``conv`` (``nn.Conv3d`` or ``nn.ConvTranspose3d``) in ``dtype``: the input channels
        padded to ``in_channels`` (those of the padded input), the output channels to :py:func:`padded_channels`."""

        def make() -> tuple[torch.Tensor, torch.Tensor | None]:
            w = conv.weight.detach().to(dtype)
            # Conv3d weights are [out, in, *k]; ConvTranspose3d weights are [in, out, *k]
            if isinstance(conv, nn.ConvTranspose3d):
                sizes = (in_channels, padded_channels(w.shape[1])) + tuple(w.shape[2:])
            else:
                sizes = (padded_channels(w.shape[0]), in_channels) + tuple(w.shape[2:])
            w = _pad_to(w, sizes).contiguous(memory_format=torch.channels_last_3d)
            b = None
            if conv.bias is not None:
                b = _pad_to(conv.bias.detach().to(dtype), (padded_channels(conv.out_channels),))
            return w, b

        return self._cached(self._convs, conv, (dtype, in_channels), make)

    def gemm(self, conv: nn.Conv3d, planes: int = 1) -> torch.Tensor:
        """The fp16 GEMM operand of a bias-free 3x3x3 ``conv`` for :py:func:`~monai.networks.kernels.conv3d.conv3x3x3`
        with ``planes`` output planes per program: its real input channels, its output channels padded to
        :py:func:`padded_channels`."""
        n = padded_channels(conv.out_channels)
        return self._cached(
            self._gemms, conv, ("gemm", planes), lambda: conv3x3x3_weights(conv.weight, out_columns=n, planes=planes)
        )

    def transposed_gemm(self, conv: nn.ConvTranspose3d) -> torch.Tensor:
        """The fp16 GEMM operand of a bias-free 3x3x3 transposed ``conv`` for
        :py:func:`~monai.networks.kernels.conv_transpose3d.conv_transpose3x3x3`: its real input channels, its output
        channels padded to :py:func:`padded_channels`."""
        n = padded_channels(conv.out_channels)
        return self._cached(
            self._gemms, conv, ("transposed",), lambda: conv_transpose3x3x3_weights(conv.weight, out_columns=n)
        )

    def quarters(self, conv: nn.Conv3d) -> Quarters:
        """The four ``[1296, 64]`` operands of a bias-free 96 -> 96 channel 3x3x3 ``conv`` for
        :py:func:`~monai.networks.kernels.conv3d_resident.conv3x3x3_resident`: ``[h][i]`` takes input channels
        ``48 i ... 48 i + 47`` to output channels ``48 h ... 48 h + 47`` (written as 64, the last 16 zeros)."""

        def make() -> Quarters:
            w = conv.weight

            def quarter(h: int, i: int) -> torch.Tensor:
                return conv3x3x3_weights(w[48 * h : 48 * (h + 1), 48 * i : 48 * (i + 1)], out_columns=64)

            return (quarter(0, 0), quarter(0, 1)), (quarter(1, 0), quarter(1, 1))

        return self._cached(self._quarters, conv, ("quarters",), make)

    def single_channel(self, conv: nn.Conv3d) -> torch.Tensor:
        """The fp16 GEMM operand of a one-channel, bias-free 3x3x3 ``conv`` for
        :py:func:`~monai.networks.kernels.conv3d.conv3x3x3_single_channel`, its output channels padded to
        :py:func:`padded_channels`."""
        n = padded_channels(conv.out_channels)
        return self._cached(self._gemms, conv, ("single",), lambda: single_channel_weights(conv.weight, n))

    def affine(self, norm: nn.InstanceNorm3d, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 ``(weight, bias)`` of an affine ``norm`` zero-padded to ``channels`` (zeros keep the padding
        channels zero after the norm)."""

        def make() -> tuple[torch.Tensor, torch.Tensor]:
            pad = (0, channels - norm.num_features)
            return F.pad(norm.weight.detach().float(), pad), F.pad(norm.bias.detach().float(), pad)

        return self._cached(self._affines, norm, ("affine", channels), make)
