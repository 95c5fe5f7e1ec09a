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
"""Spatial upsampling by a transposed convolution or by interpolation."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from monai.networks.layers.factories import Conv
from monai.utils import InterpolateMode, UpsampleMode, ensure_tuple_rep, look_up_option

__all__ = ["UpSample", "Upsample"]


class UpSample(nn.Sequential):
    """Upsample a ``[B, C, *spatial]`` tensor by ``scale_factor``.

    Modes: ``"deconv"`` (a transposed convolution, submodule ``deconv``), ``"deconvgroup"`` (a grouped one,
    ``deconvgroup``) and ``"nontrainable"`` (``nn.Upsample``, ``upsample_non_trainable``, with an optional
    ``preconv`` and ``postconv``). ``"pixelshuffle"`` is not carried by this fork.

    Args:
        spatial_dims: number of spatial dimensions.
        in_channels: input channels (needed by the convolution modes).
        out_channels: output channels; defaults to ``in_channels``.
        scale_factor: upsampling factor, one value or one per dimension.
        kernel_size: transposed convolution kernel; defaults to ``scale_factor`` (then no padding).
        size: output spatial size (``"nontrainable"`` only; takes precedence over ``scale_factor``).
        mode: one of ``"deconv"``, ``"deconvgroup"``, ``"nontrainable"``.
        pre_conv: ``"default"`` adds a 1x1 convolution in ``"nontrainable"`` mode when the channel count changes;
            a module is used as given; ``None`` for none.
        post_conv: module applied after interpolation (``"nontrainable"`` only).
        interp_mode: interpolation mode; ``"linear"`` picks linear/bilinear/trilinear from ``spatial_dims``.
        align_corners: passed to ``nn.Upsample``.
        bias: whether the convolutions have a bias.
        apply_pad_pool: only meaningful for ``"pixelshuffle"``.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int | None = None,
        out_channels: int | None = None,
        scale_factor: Sequence[float] | float = 2,
        kernel_size: Sequence[float] | float | None = None,
        size: tuple[int] | int | None = None,
        mode: UpsampleMode | str = UpsampleMode.DECONV,
        pre_conv: nn.Module | str | None = "default",
        post_conv: nn.Module | None = None,
        interp_mode: str = InterpolateMode.LINEAR,
        align_corners: bool | None = True,
        bias: bool = True,
        apply_pad_pool: bool = True,
    ) -> None:
        super().__init__()
        scale = ensure_tuple_rep(scale_factor, spatial_dims)
        up_mode = look_up_option(mode, UpsampleMode)
        padding: tuple[int, ...] | int
        output_padding: tuple[int, ...] | int
        if kernel_size:
            kernel = ensure_tuple_rep(kernel_size, spatial_dims)
            # for odd kernels this gives exactly `scale * input` outputs
            padding = tuple((k - 1) // 2 for k in kernel)
            output_padding = tuple(s - 1 - (k - 1) % 2 for k, s in zip(kernel, scale))
        else:
            kernel, padding, output_padding = scale, 0, 0

        if up_mode in (UpsampleMode.DECONV, UpsampleMode.DECONVGROUP):
            if not in_channels:
                raise ValueError(f"UpSample mode '{mode}' needs in_channels.")
            out_channels = out_channels or in_channels
            groups = 1
            if up_mode == UpsampleMode.DECONVGROUP and in_channels % out_channels == 0:
                groups = out_channels
            name = "deconv" if up_mode == UpsampleMode.DECONV else "deconvgroup"
            self.add_module(
                name,
                Conv[Conv.CONVTRANS, spatial_dims](
                    in_channels=in_channels,
                    out_channels=out_channels,
                    kernel_size=kernel,
                    stride=scale,
                    padding=padding,
                    output_padding=output_padding,
                    groups=groups,
                    bias=bias,
                ),
            )
        elif up_mode == UpsampleMode.NONTRAINABLE:
            if pre_conv == "default":
                if out_channels != in_channels:
                    if not in_channels:
                        raise ValueError(f"UpSample mode '{mode}' needs in_channels.")
                    self.add_module(
                        "preconv",
                        Conv[Conv.CONV, spatial_dims](
                            in_channels, out_channels or in_channels, kernel_size=1, bias=bias
                        ),
                    )
            elif isinstance(pre_conv, nn.Module):
                self.add_module("preconv", pre_conv)
            elif pre_conv is not None:
                raise TypeError(f"pre_conv must be 'default', a module or None, got {pre_conv!r}.")
            elif out_channels != in_channels:
                raise ValueError("In 'nontrainable' mode without pre_conv, out_channels must equal in_channels.")
            interp = InterpolateMode(interp_mode)
            if interp in (InterpolateMode.LINEAR, InterpolateMode.BILINEAR, InterpolateMode.TRILINEAR):
                interp = (InterpolateMode.LINEAR, InterpolateMode.BILINEAR, InterpolateMode.TRILINEAR)[spatial_dims - 1]
            self.add_module(
                "upsample_non_trainable",
                nn.Upsample(
                    size=size, scale_factor=None if size else scale, mode=interp.value, align_corners=align_corners
                ),
            )
            if post_conv:
                self.add_module("postconv", post_conv)
        else:
            raise NotImplementedError(
                f"Upsample mode '{mode}' is not carried by this fork; use 'deconv', 'deconvgroup' or 'nontrainable'."
            )


Upsample = UpSample
