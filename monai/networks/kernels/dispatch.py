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
"""The fused path's policy, in one frozen configuration, and the one place that picks a 3x3x3 convolution's kernel.

:py:class:`FusedConfig` says which kernels the fused forward runs (the norm kernels or their PyTorch reference, the
resident-weight Gluon convolution's load form or none, the Triton convolution's launches by width), up to which
window batch the forward is replayed as a CUDA graph, and whether cuDNN times its algorithms. Its defaults are
resolved from the installed Triton when it is built (``FusedConfig()``), so the forms are chosen once, when
``VISTA3D.fuse()`` is called, and never by compiling anything at run time. :py:func:`conv3x3x3_dispatch` runs a
stride-1 3x3x3 convolution through the Gluon, the Triton or the cuDNN kernel as :py:func:`choose_conv3x3x3` says.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from monai.networks.kernels.conv3d import FUSED_LAUNCHES, ConvLaunch, channel_pieces, conv3x3x3
from monai.networks.kernels.conv3d_resident import (
    conv3x3x3_resident,
    resident_unavailable_reason,
    slab_loads_supported,
    triton_release,
)
from monai.networks.kernels.conv_transpose3d import UPSAMPLE_LAUNCH, conv_transpose3x3x3, plain_upsample
from monai.networks.kernels.instance_norm import instance_stats
from monai.networks.kernels.padded_weights import PaddedWeights, Quarters, padded_channels

__all__ = [
    "FusedConfig",
    "KERNELS",
    "RESIDENT_FORMS",
    "check_config",
    "choose_conv3x3x3",
    "conv3x3x3_dispatch",
    "upsample_add_dispatch",
]

logger = logging.getLogger(__name__)

KERNELS = ("triton", "torch")
# how the 48 -> 48 channel convolutions run: the resident-weight Gluon kernel with slab or with patch loads, or
# ("off") the Triton kernel of FusedConfig.triton_launches
RESIDENT_FORMS = ("slabs", "patches", "off")


def _installed_resident_form() -> str:
    """The resident kernel's fastest form the installed Triton builds (:py:data:`~.conv3d_resident.SLAB_TRITONS`)."""
    return "slabs" if slab_loads_supported() else "patches"


def _default_launches() -> tuple[tuple[int, ConvLaunch], ...]:
    return tuple(sorted(FUSED_LAUNCHES.items()))


def _launch_pairs(launches, name: str) -> tuple[tuple[int, ConvLaunch], ...]:
    """A launch table (a mapping or ``(width, launch)`` pairs) as sorted pairs; ``ValueError`` for anything else."""
    pairs = launches.items() if isinstance(launches, Mapping) else launches
    table = tuple(sorted((int(width), launch) for width, launch in pairs))
    for width, launch in table:
        if width < 1 or not isinstance(launch, ConvLaunch):
            raise ValueError(f"{name} maps padded widths to ConvLaunch, got {width}: {launch!r}.")
    return table


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    """Everything the fused forward decides besides the network: build one, change fields with
    ``dataclasses.replace``, pass it to ``VISTA3D.fuse(config)``.

    Args:
        kernels: ``"triton"`` for the fused kernels (on a supported GPU, or Triton's CPU interpreter), ``"torch"``
            for their PyTorch reference (any device and dtype; for tests and for checking the kernels).
        resident_conv: the 48 -> 48 channel 3x3x3 convolutions (with the next norm's statistics and the block's
            residual) on the resident-weight Gluon kernel with ``"slabs"`` or ``"patches"`` loads, or ``"off"`` (the
            Triton kernel). Default: slabs where the installed Triton builds them, else patches. Where the GPU cannot
            run the Gluon kernel, the Triton kernel runs instead, said once in the log. Measured on the H200 with
            statistics, 14 x 48 x 128^3: 7.79 ms with slabs against 11.08 ms on the Triton kernel.
        triton_launches: the Triton implicit-GEMM convolution's launch by padded output width (a mapping or
            ``(width, launch)`` pairs; kept as sorted pairs); widths not listed run on cuDNN. Default:
            :py:data:`~monai.networks.kernels.conv3d.FUSED_LAUNCHES`.
        upsample_launches: the decoders' transposed convolutions (3x3x3, stride 2) with the skip add and the next
            norm's statistics on the Triton kernel of :py:mod:`~monai.networks.kernels.conv_transpose3d`, its
            launch by padded output width (as ``triton_launches``); other widths run on cuDNN followed by the add.
            Default: 64 channels, the top level (H100, the forward per window at 14 / 1 windows: 11.30 / 11.85 ms
            against 11.65 / 11.93 with cuDNN and the add).
        resident_96: the 96 -> 96 channel convolutions as four calls of the resident-weight kernel (in the form
            ``resident_conv`` names) on quarters of their weights: each output half is its two input halves' sum,
            the second call taking the first's output as its residual (the partial sum rounded to fp16 once on the
            way). Off by default: no faster (H100, the forward per window at 14 / 1 windows: 11.12 / 11.96 ms
            against 11.13 / 11.79) and its labels a little further from the module path's (99.626 against 99.635 %).
        norm_in_product: with ``kernels="triton"`` and fp16 features, the class features' last norm, residual add
            and activation run inside the class product's kernel (:py:mod:`~monai.networks.kernels.class_product`)
            instead of a full-resolution pass of their own (H100, per window at 14 / 1 windows: 11.06 / 11.63 ms
            against 11.13 / 11.79). The block's input stays alive until the product, as its residual: the peak
            memory at 14 windows 13.77 against 10.99 GiB (``sw_batch_size="auto"`` measures it).
        graph_max_windows: window batches up to this size are replayed as CUDA graphs (one per batch shape), where
            issuing the forward's ~250 launches from Python costs more than the GPU work (measured on the H200: 43.8
            ms per window at one window eager, ~17 ms of kernels); 0 turns graphs off.
        cudnn_autotune: let cuDNN time its algorithms for each convolution shape, on the first call of each input
            shape only (its heuristics pick slow tiles for the lower levels at one or two windows: 3.2 against 2.2 ms
            per window at one window on the H200); the plans it picks stay in PyTorch's plan cache.
        window_add: with ``kernels="triton"``, the sliding-window stitch adds each window's logits into the result
            with the Triton kernel of :mod:`monai.inferers.window_add` (PyTorch's mixed-dtype add over a strided
            slice: 1.85 ms per 117-class 128^3 window on the H200). Read by :py:attr:`stitch_window_add`.
    """

    kernels: str = "triton"
    resident_conv: str = dataclasses.field(default_factory=_installed_resident_form)
    triton_launches: tuple[tuple[int, ConvLaunch], ...] = dataclasses.field(default_factory=_default_launches)
    upsample_launches: tuple[tuple[int, ConvLaunch], ...] = ((64, UPSAMPLE_LAUNCH),)
    resident_96: bool = False
    norm_in_product: bool = True
    graph_max_windows: int = 4
    cudnn_autotune: bool = True
    window_add: bool = True

    def __post_init__(self):
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {self.kernels!r}.")
        if self.resident_conv not in RESIDENT_FORMS:
            raise ValueError(f"resident_conv must be one of {RESIDENT_FORMS}, got {self.resident_conv!r}.")
        object.__setattr__(self, "triton_launches", _launch_pairs(self.triton_launches, "triton_launches"))
        object.__setattr__(self, "upsample_launches", _launch_pairs(self.upsample_launches, "upsample_launches"))
        for _, launch in self.upsample_launches:
            if launch.planes != 1:
                raise ValueError(f"upsample_launches take one input plane per program (planes=1), got {launch!r}.")
        for flag in ("resident_96", "norm_in_product"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}.")
        if isinstance(self.graph_max_windows, bool) or not isinstance(self.graph_max_windows, int):
            raise ValueError(f"graph_max_windows must be an int >= 0, got {self.graph_max_windows!r}.")
        if self.graph_max_windows < 0:
            raise ValueError(f"graph_max_windows must be an int >= 0, got {self.graph_max_windows}.")

    @property
    def stitch_window_add(self) -> bool:
        """Whether the stitch around this fused forward adds windows with the Triton kernel."""
        return self.window_add and self.kernels == "triton"

    def triton_launch(self, width: int) -> ConvLaunch | None:
        """The Triton convolution's launch for padded output ``width``, ``None`` where cuDNN runs it."""
        return dict(self.triton_launches).get(width)


def _installed_triton() -> str:
    """``"Triton 3.5"`` (the installed release) or ``"no Triton"``, for messages."""
    release = triton_release()
    return "no Triton" if release is None else f"Triton {'.'.join(map(str, release))}"


def check_config(config: FusedConfig) -> None:
    """Raise ``ValueError`` where ``config`` asks the installed Triton for a form it does not build (slab loads
    outside :py:data:`~monai.networks.kernels.conv3d_resident.SLAB_TRITONS`)."""
    if config.kernels == "triton" and config.resident_conv == "slabs" and not slab_loads_supported():
        raise ValueError(
            f"resident_conv='slabs' needs a Triton that builds the slab loads (3.6, 3.7), found {_installed_triton()}: "
            "use 'patches' (the default there)."
        )


@functools.cache
def _say_once(message: str) -> None:
    """Log ``message`` as a warning the first time this process sees it (a fallback is worth one line, not one a
    call)."""
    logger.warning(message)


def _plain_3x3x3(conv: nn.Conv3d, x: torch.Tensor) -> bool:
    """Whether ``conv`` on ``x`` is an fp16 3x3x3 convolution the fused kernels take: stride 1, zero padding 1, no
    bias, dilation or groups."""
    if x.dtype != torch.float16 or not isinstance(conv, nn.Conv3d):
        return False
    same = conv.kernel_size == (3, 3, 3) and conv.stride == (1, 1, 1) and conv.padding == (1, 1, 1)
    return same and conv.dilation == (1, 1, 1) and conv.groups == 1 and conv.bias is None


def _quartered(
    x: torch.Tensor, quarters: Quarters, residual: torch.Tensor | None, stats: bool, slabs: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """A 96 -> 96 channel convolution of ``x`` (128 padded channels) as four resident 48 -> 48 ones (see
    ``FusedConfig.resident_96``), into a new 128-channel tensor; the statistics of its 96 real channels."""
    n_b, _, d, h, w = x.shape
    y = torch.empty((n_b, 128, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d)
    y[:, 112:].zero_()  # the padding the two halves' 64-channel writes (channels 0-63, then 48-111) leave
    partial = torch.empty(
        (n_b, 64, d, h, w), device=x.device, dtype=torch.float16, memory_format=torch.channels_last_3d
    )
    means, variances = [], []
    for half in range(2):  # in order: the second half's write overwrites channels 48-63 of the first's
        lo = 48 * half
        block_residual = residual[:, lo : lo + 64] if residual is not None else None
        conv3x3x3_resident(x, quarters[half][0], residual=block_residual, slabs=slabs, out=partial)
        _, part = conv3x3x3_resident(
            x[:, 48:], quarters[half][1], stats=stats, residual=partial, slabs=slabs, out=y[:, lo : lo + 64]
        )
        if part is not None:
            means.append(part[0][:, :48])
            variances.append(part[1][:, :48])
    if not stats:
        return y, None
    zeros = torch.zeros((n_b, 32), device=x.device, dtype=torch.float32)  # the padding channels'
    return y, (torch.cat([*means, zeros], 1), torch.cat([*variances, zeros], 1))


def _add(
    y: torch.Tensor, addend: torch.Tensor, config: FusedConfig, stats: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """``y += addend`` after a cuDNN convolution; with the Triton kernels and ``stats``, in the statistics kernel's
    pass, which also gives the sum's statistics."""
    if config.kernels == "torch" or not stats:
        return y.add_(addend), None
    return y, instance_stats(y, add=addend)


def _in_pieces(channels: int) -> bool:
    """Whether the Triton kernels read ``channels`` input channels (as :py:func:`channel_pieces` splits them)."""
    try:
        channel_pieces(channels)
    except ValueError:
        return False
    return True


def choose_conv3x3x3(conv: nn.Conv3d, x: torch.Tensor, config: FusedConfig) -> tuple[str, ConvLaunch | None]:
    """Which kernel runs ``conv(x)`` on the fused path: ``("resident", None)`` (the Gluon kernel, in the form
    ``config.resident_conv`` names), ``("triton", launch)`` or ``("cudnn", None)`` (``F.conv3d``, also every
    convolution the fused kernels do not take and everything under ``kernels="torch"``)."""
    if config.kernels != "triton" or not _plain_3x3x3(conv, x):
        return "cudnn", None
    if config.resident_conv != "off" and (conv.in_channels, conv.out_channels) == (48, 48):
        reason = resident_unavailable_reason(x.device)
        if reason is None:
            if config.resident_conv == "patches" and not slab_loads_supported():
                _say_once(
                    "VISTA3D fused path: the 48-channel convolutions load per-shift patches (slower): "
                    f"{_installed_triton()} does not build the slab loads (3.6 and 3.7 do)."
                )
            return "resident", None
        # the Triton kernel below runs instead: as right, slower
        _say_once(f"VISTA3D fused path: the 48-channel convolutions run on the Triton kernel: {reason}.")
    quartered = (
        config.resident_96 and config.resident_conv != "off" and (conv.in_channels, conv.out_channels) == (96, 96)
    )
    if quartered and resident_unavailable_reason(x.device) is None:
        return "quartered", None
    if not _in_pieces(conv.in_channels):
        return "cudnn", None
    launch = config.triton_launch(padded_channels(conv.out_channels))
    return ("cudnn", None) if launch is None else ("triton", launch)


def conv3x3x3_dispatch(
    conv: nn.Conv3d,
    x: torch.Tensor,
    weights: PaddedWeights,
    config: FusedConfig,
    residual: torch.Tensor | None = None,
    stats: bool = True,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """``conv(x) (+ residual)`` on the kernel :py:func:`choose_conv3x3x3` picks, channels-last, and the
    per-(sample, channel) ``(mean, var)`` of the result where the kernels compute them on the way.

    Args:
        conv: a ``Conv3d`` of the network (any; only the plain 3x3x3 ones go to the fused kernels).
        x: channels-last input, its channels zero-padded as ``weights`` expects.
        weights: the padded weight cache the GEMM operands and cuDNN weights come from.
        config: the fused path's configuration.
        residual: added to the convolution's output (the SegResNet blocks' ``conv2(y) + x``), of its padded shape.
        stats: compute the statistics on the way; ``False`` where no instance norm reads the output next (the last
            block of a level: a convolution follows), which spares the kernels' statistics epilogue.

    Returns:
        ``(y, stats)``: ``stats`` is ``None`` when not asked for, under ``kernels="torch"`` and for a cuDNN
        convolution without a residual.
    """
    kernel, launch = choose_conv3x3x3(conv, x, config)
    if kernel == "quartered":
        return _quartered(x, weights.quarters(conv), residual, stats, slabs=config.resident_conv == "slabs")
    if kernel == "resident":
        slabs = config.resident_conv == "slabs"
        return conv3x3x3_resident(x, weights.gemm(conv, planes=1), stats=stats, residual=residual, slabs=slabs)
    if kernel == "triton" and launch is not None:  # (a Triton choice always comes with its launch)
        return conv3x3x3(x, weights.gemm(conv, launch.planes), stats=stats, residual=residual, launch=launch)
    w, b = weights(conv, x.dtype, x.shape[1])
    y = F.conv3d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups)
    y = y.contiguous(memory_format=torch.channels_last_3d)  # a no-op where cuDNN kept the layout
    if residual is None:
        return y, None
    return _add(y, residual, config, stats)


def upsample_add_dispatch(
    conv: nn.ConvTranspose3d, x: torch.Tensor, skip: torch.Tensor, weights: PaddedWeights, config: FusedConfig
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """A decoder level's ``conv(x) + skip``, channels-last, and the per-(sample, channel) ``(mean, var)`` of the
    sum, which the level's first norm reads.

    The Triton kernel takes it where ``config.upsample_launches`` lists the padded output width and ``conv`` is a
    plain upsampling (:py:func:`~monai.networks.kernels.conv_transpose3d.plain_upsample`) of fp16 input; elsewhere
    cuDNN runs the convolution and the statistics kernel adds the skip (``kernels="torch"``: PyTorch's add, no
    statistics).
    """
    launch = dict(config.upsample_launches).get(padded_channels(conv.out_channels))
    kernel_fits = x.dtype == torch.float16 and plain_upsample(conv) and _in_pieces(conv.in_channels)
    if config.kernels == "triton" and launch is not None and kernel_fits:
        return conv_transpose3x3x3(x, weights.transposed_gemm(conv), skip=skip, stats=True, launch=launch)
    w, b = weights(conv, x.dtype, x.shape[1])
    # (torch types _ConvNd.padding as a tuple or a string; a transposed convolution's is always a tuple)
    padding: tuple[int, ...] = conv.padding  # type: ignore[assignment]
    y = F.conv_transpose3d(x, w, b, conv.stride, padding, conv.output_padding, conv.groups, conv.dilation)
    y = y.contiguous(memory_format=torch.channels_last_3d)  # a no-op where cuDNN kept the layout
    return _add(y, skip, config, stats=True)
