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
"""SegResNet with deep supervision and anisotropic kernels, and its two-decoder variant (the VISTA3D encoder)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

from monai.networks.blocks.upsample import UpSample
from monai.networks.layers.factories import Act, Conv, Norm, split_args
from monai.networks.layers.utils import get_act_layer, get_norm_layer
from monai.utils import UpsampleMode, has_option

__all__ = ["SegResNetDS", "SegResNetDS2", "SegResEncoder", "SegResBlock", "aniso_kernel", "scales_for_resolution"]


def scales_for_resolution(resolution: Sequence[float], n_stages: int | None = None) -> list[tuple[int, ...]]:
    """Per-stage downsampling factors that bring an anisotropic spacing towards isotropic.

    A dimension with a fine spacing is downsampled (factor 2) while it is finer than the coarsest one by at least a
    factor 2; the coarse dimensions keep factor 1 until then. For example ``scales_for_resolution((1, 1, 5), 5)``
    is ``[(2, 2, 1), (2, 2, 1), (2, 2, 2), (2, 2, 2), (2, 2, 2)]``.

    Args:
        resolution: spacing of each spatial dimension (e.g. in mm), all positive.
        n_stages: number of stages; more stages append isotropic factors, fewer truncate. ``None``: as many
            stages as needed to reach an isotropic spacing.
    """
    if not all(r > 0 for r in resolution):
        raise ValueError(f"Resolution must be positive, got {tuple(resolution)}.")
    coarsest = max(resolution)
    # number of halvings of the spacing each dimension needs before it is within a factor 2 of the coarsest one
    levels = [int(math.floor(math.log2(coarsest / r))) for r in resolution]
    n_aniso = max(levels)
    scales = [tuple(1 if i >= lv else 2 for lv in levels) for i in range(n_aniso)]
    if n_stages and n_stages > n_aniso:
        scales += [(2,) * len(resolution)] * (n_stages - n_aniso)
    else:
        scales = scales[:n_stages]
    return scales


def aniso_kernel(scale: Sequence[int]) -> tuple[list[int], list[int], Sequence[int]]:
    """``(kernel_size, padding, stride)`` for one stage: kernel 3 along dimensions that are downsampled, else 1.

    Args:
        scale: the stage's downsampling factor per dimension.
    """
    kernel_size = [3 if s > 1 else 1 for s in scale]
    return kernel_size, [k // 2 for k in kernel_size], scale


def _norm_act(norm: tuple | str, act: tuple | str, spatial_dims: int) -> tuple[tuple, tuple]:
    """Normalization with learnable affine parameters and in-place activation, unless the caller said otherwise."""
    norm_name, norm_args = split_args(norm)
    norm_args = dict(norm_args)
    if has_option(Norm[norm_name, spatial_dims], "affine"):
        norm_args.setdefault("affine", True)
    act_name, act_args = split_args(act)
    act_args = dict(act_args)
    if has_option(Act[act_name], "inplace"):
        act_args.setdefault("inplace", True)
    return (norm_name, norm_args), (act_name, act_args)


class SegResBlock(nn.Module):
    """Pre-activation residual block ``x + conv2(act2(norm2(conv1(act1(norm1(x))))))`` of SegResNet
    (Myronenko, https://arxiv.org/abs/1810.11654).

    Args:
        spatial_dims: number of spatial dimensions.
        in_channels: number of input (and output) channels.
        norm: normalization name or ``(name, kwargs)``.
        kernel_size: convolution kernel size, one value or one per dimension.
        act: activation name or ``(name, kwargs)``.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        norm: tuple | str,
        kernel_size: Sequence[int] | int = 3,
        act: tuple | str = "relu",
    ) -> None:
        super().__init__()
        if isinstance(kernel_size, Sequence):
            padding: Sequence[int] | int = tuple(k // 2 for k in kernel_size)
        else:
            padding = kernel_size // 2
        conv = Conv[Conv.CONV, spatial_dims]
        self.norm1 = get_norm_layer(name=norm, spatial_dims=spatial_dims, channels=in_channels)
        self.act1 = get_act_layer(act)
        self.conv1 = conv(in_channels, in_channels, kernel_size=kernel_size, stride=1, padding=padding, bias=False)
        self.norm2 = get_norm_layer(name=norm, spatial_dims=spatial_dims, channels=in_channels)
        self.act2 = get_act_layer(act)
        self.conv2 = conv(in_channels, in_channels, kernel_size=kernel_size, stride=1, padding=padding, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # norm1 creates a new tensor, so in-place activations never touch the caller's `x`
        y: torch.Tensor = self.conv2(self.act2(self.norm2(self.conv1(self.act1(self.norm1(x))))))
        y += x
        return y


class SegResEncoder(nn.Module):
    """The encoder of SegResNet: an initial convolution, then per level residual blocks and a strided convolution.

    Args:
        spatial_dims: number of spatial dimensions (1, 2 or 3).
        init_filters: channels of the first level; doubled at every level.
        in_channels: number of input channels.
        act: activation name or ``(name, kwargs)``.
        norm: normalization name or ``(name, kwargs)``.
        blocks_down: number of residual blocks per level.
        head_module: optional module applied to the list of level outputs.
        anisotropic_scales: optional per-level downsampling factors (see :py:func:`scales_for_resolution`).

    Returns (forward):
        the list of level outputs, finest first: ``[B, init_filters * 2**i, *spatial / prod(strides[:i])]``.
    """

    def __init__(
        self,
        spatial_dims: int = 3,
        init_filters: int = 32,
        in_channels: int = 1,
        act: tuple | str = "relu",
        norm: tuple | str = "batch",
        blocks_down: tuple = (1, 2, 2, 4),
        head_module: nn.Module | None = None,
        anisotropic_scales: tuple | list | None = None,
    ):
        super().__init__()
        if spatial_dims not in (1, 2, 3):
            raise ValueError(f"`spatial_dims` can only be 1, 2 or 3, got {spatial_dims}.")
        norm, act = _norm_act(norm, act, spatial_dims)
        conv = Conv[Conv.CONV, spatial_dims]

        kernel_size, padding, _ = aniso_kernel(anisotropic_scales[0]) if anisotropic_scales else (3, 1, 1)
        filters = init_filters
        self.conv_init = conv(in_channels, filters, kernel_size=kernel_size, padding=padding, stride=1, bias=False)
        self.layers = nn.ModuleList()
        for i, n_blocks in enumerate(blocks_down):
            kernel_size, padding, stride = aniso_kernel(anisotropic_scales[i]) if anisotropic_scales else (3, 1, 2)
            level = nn.ModuleDict()
            level["blocks"] = nn.Sequential(
                *[
                    SegResBlock(spatial_dims, filters, kernel_size=kernel_size, norm=norm, act=act)
                    for _ in range(n_blocks)
                ]
            )
            if i < len(blocks_down) - 1:
                level["downsample"] = conv(
                    filters, 2 * filters, bias=False, kernel_size=kernel_size, stride=stride, padding=padding
                )
            else:
                level["downsample"] = nn.Identity()
            self.layers.append(level)
            filters *= 2

        self.head_module = head_module
        self.in_channels = in_channels
        self.blocks_down = blocks_down
        self.init_filters = init_filters
        self.norm = norm
        self.act = act
        self.spatial_dims = spatial_dims

    def _forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outputs = []
        x = self.conv_init(x)
        # (torch types a ModuleList's items as Module, not ModuleDict; TorchScript compiles this loop: no cast)
        for level in self.layers:
            x = level["blocks"](x)  # type: ignore[index]
            outputs.append(x)
            x = level["downsample"](x)  # type: ignore[index]
        if self.head_module is not None:
            outputs = self.head_module(outputs)
        return outputs

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self._forward(x)


def _with_skip(y: torch.Tensor, x: torch.Tensor, skips: list[torch.Tensor], i: int) -> torch.Tensor:
    """``y`` (the upsampled ``x``) plus the encoder skip of decoder level ``i``, if there is one."""
    if i >= len(skips):
        return y
    if y is x:  # identity upsampling: never add in place into the caller's tensor
        return y + skips[i]
    return y.add_(skips[i])


class SegResNetDS(nn.Module):
    """SegResNet (https://arxiv.org/abs/1810.11654) with deep supervision and anisotropic kernels.

    With ``resolution`` the first levels use anisotropic kernels and strides (:py:func:`scales_for_resolution`);
    each spatial size must then be divisible by :py:meth:`shape_factor`, which is ``2 ** (len(blocks_down) - 1)``
    per dimension without ``resolution``.

    Args:
        spatial_dims: number of spatial dimensions (1, 2 or 3).
        init_filters: channels of the first level.
        in_channels: number of input channels.
        out_channels: number of output channels of each head.
        act: activation name or ``(name, kwargs)``.
        norm: normalization name or ``(name, kwargs)``.
        blocks_down: number of residual blocks per encoder level.
        blocks_up: number of residual blocks per decoder level (default one each).
        dsdepth: number of deep-supervision outputs (finest first); 1 gives a single output.
        preprocess: optional callable applied to the input first.
        upsample_mode: ``"deconv"``, ``"deconvgroup"`` or ``"nontrainable"``.
        resolution: optional input spacing that enables anisotropic kernels.

    Returns (forward):
        ``[B, out_channels, *spatial]`` in eval mode (or when ``dsdepth == 1``); in training mode with
        ``dsdepth > 1`` the list of the ``dsdepth`` outputs, finest first.
    """

    def __init__(
        self,
        spatial_dims: int = 3,
        init_filters: int = 32,
        in_channels: int = 1,
        out_channels: int = 2,
        act: tuple | str = "relu",
        norm: tuple | str = "batch",
        blocks_down: tuple = (1, 2, 2, 4),
        blocks_up: tuple | None = None,
        dsdepth: int = 1,
        preprocess: nn.Module | Callable | None = None,
        upsample_mode: UpsampleMode | str = "deconv",
        resolution: tuple | None = None,
    ):
        super().__init__()
        if spatial_dims not in (1, 2, 3):
            raise ValueError(f"`spatial_dims` can only be 1, 2 or 3, got {spatial_dims}.")
        if resolution is not None:
            if not isinstance(resolution, (list, tuple)):
                raise TypeError(f"resolution must be a tuple of spacings, got {type(resolution).__name__}.")
            if not all(r > 0 for r in resolution):
                raise ValueError(f"resolution must be positive, got {resolution}.")

        self.spatial_dims = spatial_dims
        self.init_filters = init_filters
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.act = act
        self.norm = norm
        self.blocks_down = blocks_down
        self.dsdepth = max(dsdepth, 1)
        self.resolution = resolution
        self.preprocess = preprocess

        norm, act = _norm_act(norm, act, spatial_dims)
        scales = scales_for_resolution(resolution, n_stages=len(blocks_down)) if resolution else None
        self.anisotropic_scales = scales
        # worked out once here, as plain ints, so that the scripted forward can check its input with them
        self._divisors = (
            [2 ** (len(blocks_down) - 1)] * spatial_dims
            if scales is None
            else [math.prod(s[d] for s in scales[:-1]) for d in range(spatial_dims)]
        )

        self.encoder = SegResEncoder(
            spatial_dims=spatial_dims,
            init_filters=init_filters,
            in_channels=in_channels,
            act=act,
            norm=norm,
            blocks_down=blocks_down,
            anisotropic_scales=scales,
        )

        n_up = len(blocks_down) - 1
        if blocks_up is None:
            blocks_up = (1,) * n_up
        self.blocks_up = blocks_up

        filters = init_filters * 2**n_up
        self.up_layers = nn.ModuleList()
        for i in range(n_up):
            filters //= 2
            kernel_size, _, stride = aniso_kernel(scales[len(blocks_up) - i - 1]) if scales else (3, 1, 2)
            level = nn.ModuleDict()
            level["upsample"] = UpSample(
                mode=upsample_mode,
                spatial_dims=spatial_dims,
                in_channels=2 * filters,
                out_channels=filters,
                kernel_size=kernel_size,
                scale_factor=stride,
                bias=False,
                align_corners=False,
            )
            level["blocks"] = nn.Sequential(
                *[
                    SegResBlock(spatial_dims, filters, kernel_size=kernel_size, norm=norm, act=act)
                    for _ in range(blocks_up[i])
                ]
            )
            if len(blocks_up) - i <= dsdepth:
                level["head"] = Conv[Conv.CONV, spatial_dims](filters, out_channels, kernel_size=1, bias=True)
            else:
                level["head"] = nn.Identity()
            self.up_layers.append(level)

        if n_up == 0:  # no downsampling at all: a single head on the encoder output
            self.up_layers.append(
                nn.ModuleDict(
                    {
                        "upsample": nn.Identity(),
                        "blocks": nn.Identity(),
                        "head": Conv[Conv.CONV, spatial_dims](filters, out_channels, kernel_size=1, bias=True),
                    }
                )
            )

    def shape_factor(self) -> list[int]:
        """The number each input spatial size must be divisible by."""
        return list(self._divisors)

    def is_valid_shape(self, x: torch.Tensor) -> bool:
        """Whether the spatial size of ``x`` (a ``[B, C, *spatial]`` tensor) is divisible by :py:meth:`shape_factor`."""
        return all(s % f == 0 for s, f in zip(x.shape[2:], self._divisors))

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.preprocess is not None:
            x = self.preprocess(x)
        if not self.is_valid_shape(x):
            raise ValueError(
                f"Input spatial dims {list(x.shape)} must be divisible by {self.shape_factor()}; pad or crop the input."
            )
        return x

    def _decode(self, x: torch.Tensor, skips: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the decoder ``up_layers`` from the bottleneck ``x`` with the encoder ``skips`` (coarsest first).

        Returns the deep-supervision outputs, finest first. Neither ``x`` nor ``skips`` is modified.
        """
        # the loop names its ModuleList: TorchScript takes none as an argument (SegResNetDS2 has its own loop)
        outputs: list[torch.Tensor] = []
        # (torch types a ModuleList's items as Module, not ModuleDict; TorchScript compiles this loop: no cast)
        for i, level in enumerate(self.up_layers):
            x = level["blocks"](_with_skip(level["upsample"](x), x, skips, i))  # type: ignore[index]
            if len(self.up_layers) - i <= self.dsdepth:
                outputs.append(level["head"](x))  # type: ignore[index]
        outputs.reverse()
        return outputs

    def _forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        x = self._check_input(x)
        features = self.encoder(x)
        outputs = self._decode(features[-1], features[-2::-1])
        if not self.training or len(outputs) == 1:
            return outputs[0]
        return outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        return self._forward(x)


class SegResNetDS2(SegResNetDS):
    """:py:class:`SegResNetDS` with a second decoder ``up_layers_auto``: the image encoder of VISTA3D
    (https://arxiv.org/abs/2406.05285). ``up_layers`` feeds the point head, ``up_layers_auto`` the class head.

    Takes the same arguments as :py:class:`SegResNetDS`.
    """

    def __init__(
        self,
        spatial_dims: int = 3,
        init_filters: int = 32,
        in_channels: int = 1,
        out_channels: int = 2,
        act: tuple | str = "relu",
        norm: tuple | str = "batch",
        blocks_down: tuple = (1, 2, 2, 4),
        blocks_up: tuple | None = None,
        dsdepth: int = 1,
        preprocess: nn.Module | Callable | None = None,
        upsample_mode: UpsampleMode | str = "deconv",
        resolution: tuple | None = None,
    ):
        super().__init__(
            spatial_dims=spatial_dims,
            init_filters=init_filters,
            in_channels=in_channels,
            out_channels=out_channels,
            act=act,
            norm=norm,
            blocks_down=blocks_down,
            blocks_up=blocks_up,
            dsdepth=dsdepth,
            preprocess=preprocess,
            upsample_mode=upsample_mode,
            resolution=resolution,
        )
        self.up_layers_auto = nn.ModuleList([copy.deepcopy(layer) for layer in self.up_layers])

    def forward(  # type: ignore[override]  # upstream's API: both decoders' outputs, not SegResNetDS's one
        self, x: torch.Tensor, with_point: bool = True, with_label: bool = True
    ) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor | list[torch.Tensor]]:
        """Encode ``x`` once and run the requested decoders.

        Args:
            x: ``[B, in_channels, *spatial]``.
            with_point: run ``up_layers`` (point branch).
            with_label: run ``up_layers_auto`` (class branch).

        Returns:
            ``(point_features, class_features)``: each ``[B, out_channels, *spatial]`` when ``dsdepth == 1``, else a
            list finest first; a branch that was not run gives an empty list.
        """
        x = self._check_input(x)
        features = self.encoder(x)
        bottleneck, skips = features[-1], features[-2::-1]
        del features, x
        # _decode never writes into its inputs, so both decoders read the same bottleneck (no copy)
        outputs = self._decode(bottleneck, skips) if with_point else []
        outputs_auto = self._decode_auto(bottleneck, skips) if with_label else []
        return (
            outputs[0] if len(outputs) == 1 else outputs,
            outputs_auto[0] if len(outputs_auto) == 1 else outputs_auto,
        )

    def _decode_auto(self, x: torch.Tensor, skips: list[torch.Tensor]) -> list[torch.Tensor]:
        """:py:meth:`SegResNetDS._decode` through the class-head decoder ``up_layers_auto``."""
        outputs: list[torch.Tensor] = []
        # (torch types a ModuleList's items as Module, not ModuleDict; TorchScript compiles this loop: no cast)
        for i, level in enumerate(self.up_layers_auto):
            x = level["blocks"](_with_skip(level["upsample"](x), x, skips, i))  # type: ignore[index]
            if len(self.up_layers_auto) - i <= self.dsdepth:
                outputs.append(level["head"](x))  # type: ignore[index]
        outputs.reverse()
        return outputs

    def set_auto_grad(self, auto_freeze: bool = False, point_freeze: bool = False) -> None:
        """Freeze parts of the network: the encoder when either branch is frozen, and the frozen decoders.

        Args:
            auto_freeze: freeze the encoder and the class decoder ``up_layers_auto``.
            point_freeze: freeze the encoder and the point decoder ``up_layers``.
        """
        for param in self.encoder.parameters():
            param.requires_grad = not (auto_freeze or point_freeze)
        for param in self.up_layers_auto.parameters():
            param.requires_grad = not auto_freeze
        for param in self.up_layers.parameters():
            param.requires_grad = not point_freeze
