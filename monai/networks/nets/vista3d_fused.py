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
"""The class branch of VISTA3D (image encoder, class decoder, class head) on the fused channels-last path.

Same modules, same parameters, another data flow: activations stay channels-last (NDHWC) from the first
convolution to the class logits, with their channels zero-padded to multiples of 64 (48 -> 64, 96 -> 128; the
image's channel to 8), the layout in which cuDNN's convolutions run fastest; every instance norm runs as fused
kernels with its affine map, residual add and activation (:py:mod:`monai.networks.kernels.instance_norm`), the
3x3x3 convolutions of the two finest levels (48 and 96 channels) run as a Triton implicit GEMM over the real
channels with the next norm's statistics and the residual add in its epilogue
(:py:mod:`monai.networks.kernels.conv3d`), those of 48 channels, on Hopper, as a persistent Gluon kernel with the
weights resident in shared memory and the statistics and the residual add in its epilogue
(:py:mod:`monai.networks.kernels.conv3d_resident`), and no layout conversion runs inside the forward. Padding
channels hold zeros throughout, so the logits are those of the module path up to fp16 rounding.

:py:meth:`monai.networks.nets.VISTA3D.fuse` turns this path on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from monai.networks.blocks.dynunet_block import UnetResBlock
from monai.networks.blocks.unetr_block import UnetrBasicBlock
from monai.networks.kernels.conv3d import ConvLaunch, channel_pieces, conv3x3x3, conv3x3x3_single_channel
from monai.networks.kernels.conv3d_resident import conv3x3x3_resident, resident_unavailable_reason
from monai.networks.kernels.graph_cache import GraphCache
from monai.networks.kernels.instance_norm import NormAct, instance_stats, norm_act, norm_act_reference
from monai.networks.kernels.padded_weights import PaddedWeights, image_channels, pad_channels, padded_channels
from monai.utils.triton_support import unavailable_reason
from monai.networks.nets.segresnet_ds import SegResBlock, SegResNetDS2

__all__ = ["FusedClassBranch", "check_supported"]

logger = logging.getLogger(__name__)


KERNELS = ("triton", "torch")
# window batches up to this size replay CUDA graphs: at 1-4 windows the forward's ~250 launches cost more CPU time
# than the GPU needs for them (measured on the H200: 43.8 ms per window at batch 1 eager against ~17 ms of kernels)
GRAPH_MAX_WINDOWS = 4
# the stride-1 3x3x3 convolutions whose padded width is listed run through the Triton implicit GEMM (real input
# channels only, the next norm's statistics and the residual add in its epilogue) with this launch; the others on
# cuDNN (measured on the H200: docs/benchmarks.md, "The Triton convolution on the fused path")
TRITON_CONV = {
    64: ConvLaunch(8, 16, num_warps=4, num_stages=3, planes=2, swap=True),
    128: ConvLaunch(16, 16, num_warps=8, num_stages=3, swap=True),
}
# the 48 -> 48 channel 3x3x3 convolutions (with the next norm's statistics, and the residual add where the block has
# one) run through the persistent resident-weight Gluon kernel where it runs (Hopper, Triton with Gluon): with the
# statistics 7.79 ms against the Triton kernel's 11.08 ms for 14 x 48 x 128^3 on the H200, the window forward 10.88
# against 12.95 ms at 14 windows; False leaves them to TRITON_CONV
RESIDENT_CONV = True
# the fused forward lets cuDNN time its algorithms for each convolution shape on first use (cudnn.benchmark): its
# heuristics pick slow tiles for the lower levels at one or two windows (measured on the H200: 3.2 against 2.2 ms
# per window at one window, docs/benchmarks.md)
CUDNN_BENCHMARK = True


@contextmanager
def _cudnn_benchmark(enable: bool) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` on inside the block when ``enable``; the caller's setting after it."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before or enable
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def _only_child(module: nn.Module, kind: type) -> nn.Module:
    """The single submodule of ``module`` (a ``Convolution`` or ``UpSample`` wrapper), which must be a ``kind``."""
    children = list(module.children())
    if len(children) != 1 or not isinstance(children[0], kind):
        raise NotImplementedError(f"the fused path supports a wrapper of one {kind.__name__} here, found {module}.")
    return children[0]


def _res_block(block: nn.Module) -> nn.Module:
    """The ``UnetResBlock`` of a class-head block (``UnetrBasicBlock`` wraps one as ``layer``)."""
    inner = block.layer if isinstance(block, UnetrBasicBlock) else block
    if not isinstance(inner, UnetResBlock) or inner.downsample:
        raise NotImplementedError("the fused path runs a class head of UnetResBlocks without downsampling.")
    return inner


def _norm_spec(norm: nn.Module, act: nn.Module) -> NormAct:
    if not isinstance(norm, nn.InstanceNorm3d) or norm.track_running_stats:
        raise NotImplementedError(f"the fused path supports InstanceNorm3d without running stats, found {norm}.")
    if isinstance(act, nn.LeakyReLU):
        return NormAct(eps=norm.eps, act="leakyrelu", negative_slope=act.negative_slope)
    if isinstance(act, nn.ReLU):
        return NormAct(eps=norm.eps, act="relu")
    raise NotImplementedError(f"the fused path supports ReLU and LeakyReLU activations, found {act}.")


def check_supported(net: nn.Module) -> None:
    """Raise ``NotImplementedError`` (saying what) unless ``net``'s class branch has the layout this path runs."""
    encoder = net.image_encoder
    if not isinstance(encoder, SegResNetDS2) or encoder.spatial_dims != 3:
        raise NotImplementedError("the fused path runs a 3D SegResNetDS2 image encoder.")
    if encoder.preprocess is not None or encoder.anisotropic_scales is not None or encoder.dsdepth != 1:
        raise NotImplementedError(
            "the fused path runs SegResNetDS2 without preprocess, resolution or deep supervision."
        )
    for level in [*encoder.encoder.layers, *encoder.up_layers_auto]:
        for block in level["blocks"]:
            _norm_spec(block.norm1, block.act1)
            _norm_spec(block.norm2, block.act2)
    for level in encoder.up_layers_auto:
        _only_child(level["upsample"], nn.ConvTranspose3d)
    for block in map(_res_block, net.class_head.image_post_mapping):
        _only_child(block.conv1, nn.Conv3d)
        _only_child(block.conv2, nn.Conv3d)
        _norm_spec(block.norm1, block.lrelu)
        _norm_spec(block.norm2, block.lrelu)


class FusedClassBranch:
    """Class logits of a VISTA3D through the fused channels-last path (see the module docstring).

    Not an ``nn.Module``: it holds no parameters of its own and reads the network's on every call (through
    :py:class:`PaddedWeights`, which notices a changed parameter), so the network's state dict is unchanged.

    Args:
        net: a :py:class:`~monai.networks.nets.VISTA3D` whose layout :py:func:`check_supported` accepts.
        kernels: ``"triton"`` for the fused norm kernels (on a supported GPU), ``"torch"`` for their PyTorch
            reference (any device; for tests and for checking the kernels).
        cuda_graphs: replay the forward of up to ``GRAPH_MAX_WINDOWS`` windows on CUDA as a captured graph (one
            per window-batch shape), where issuing the launches from Python would cost more than the GPU work.
    """

    def __init__(self, net: nn.Module, kernels: str = "triton", cuda_graphs: bool = True):
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}.")
        check_supported(net)
        self.net = net
        self.kernels = kernels
        self.weights = PaddedWeights()
        self._logged: set[str] = set()
        branch = [net.image_encoder.encoder, net.image_encoder.up_layers_auto, net.class_head.image_post_mapping]
        params = [p for module in branch for p in module.parameters()]
        # the graph ends at the class features; the class product runs after each replay into a new tensor, so no
        # copy of the graph's logits buffer (0.5 GB per window at 117 classes) is needed to hand them out
        self.graphs = GraphCache(self.features, params, copy_output=False) if cuda_graphs else None

    def compute_dtype(self, image: torch.Tensor) -> torch.dtype:
        """The dtype the branch runs ``image`` in: fp16 under fp16 autocast, else the image's own dtype."""
        device_type = image.device.type
        if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.float16:
            return torch.float16
        return image.dtype

    def unavailable_reason(self, image: torch.Tensor) -> str | None:
        """``None`` when this call can take the fused path, else why not (in a few words)."""
        if self.net.training or torch.is_grad_enabled():
            return "the fused path has no backward pass: it runs in eval mode under torch.no_grad() or inference_mode()"
        return None if self.kernels == "torch" else unavailable_reason(image.device)

    # ---- the operations ----------------------------------------------------------------------------------------
    def _conv(self, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weights(conv, x.dtype, x.shape[1])
        pointwise = conv.kernel_size == (1, 1, 1) and conv.stride == (1, 1, 1) and conv.padding == (0, 0, 0)
        if isinstance(conv, nn.Conv3d) and pointwise and conv.groups == 1:
            # a GEMM over the voxels' channel rows: cuBLAS adds the bias in its epilogue, where cuDNN leaves it to a
            # separate broadcast add (measured on the H200: 5.3 ms per 14 full-resolution windows)
            rows = x.permute(0, 2, 3, 4, 1).reshape(-1, x.shape[1])
            y = F.linear(rows, w.reshape(w.shape[0], -1), b)
            return y.view(x.shape[0], *x.shape[2:], -1).permute(0, 4, 1, 2, 3)
        if isinstance(conv, nn.ConvTranspose3d):
            y = F.conv_transpose3d(x, w, b, conv.stride, conv.padding, conv.output_padding, conv.groups, conv.dilation)
        else:
            y = F.conv3d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups)
        return y.contiguous(memory_format=torch.channels_last_3d)  # a no-op where cuDNN kept the layout

    def _plain_3x3x3(self, conv: nn.Module, x: torch.Tensor) -> bool:
        """Whether ``conv`` on ``x`` is an fp16 3x3x3 convolution of the form the fused kernels take (stride 1, zero
        padding 1, no bias, dilation or groups) and the fused kernels are on."""
        if self.kernels != "triton" or x.dtype != torch.float16 or not isinstance(conv, nn.Conv3d):
            return False
        same = conv.kernel_size == (3, 3, 3) and conv.stride == (1, 1, 1) and conv.padding == (1, 1, 1)
        return same and conv.dilation == (1, 1, 1) and conv.groups == 1 and conv.bias is None

    def _triton_launch(self, conv: nn.Module, x: torch.Tensor) -> ConvLaunch | None:
        """The Triton convolution's launch for ``conv`` on ``x``, or ``None`` where cuDNN runs it."""
        if not self._plain_3x3x3(conv, x):
            return None
        try:
            channel_pieces(conv.in_channels)
        except ValueError:
            return None
        return TRITON_CONV.get(padded_channels(conv.out_channels))

    def _resident(self, conv: nn.Module, x: torch.Tensor) -> bool:
        """Whether ``conv(x)``, with or without a residual add (the kernel takes the block's input, padded to 64
        channels like the output), runs through the resident-weight Gluon kernel: ``RESIDENT_CONV`` on, 48 -> 48
        channels, and a GPU that runs it."""
        if not RESIDENT_CONV or not self._plain_3x3x3(conv, x) or (conv.in_channels, conv.out_channels) != (48, 48):
            return False
        reason = resident_unavailable_reason(x.device)
        if reason is not None and reason not in self._logged:
            self._logged.add(reason)  # the Triton kernel runs instead: as right, slower; said once per reason
            logger.warning("VISTA3D fused path: the 48-channel convolutions run on the Triton kernel: %s.", reason)
        return reason is None

    def _conv_norm_input(
        self, conv: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple | None]:
        """``conv(x) (+ residual)`` and, where the Triton or Gluon kernels compute them on the way, its
        statistics."""
        if self._resident(conv, x):
            return conv3x3x3_resident(x, self.weights.gemm(conv, planes=1), stats=True, residual=residual)
        launch = self._triton_launch(conv, x)
        if launch is not None:
            return conv3x3x3(x, self.weights.gemm(conv, launch.planes), stats=True, residual=residual, launch=launch)
        y = self._conv(conv, x)
        return self._add(y, residual) if residual is not None else (y, None)

    def _first_conv(self, conv: nn.Conv3d, image: torch.Tensor) -> torch.Tensor:
        dtype = self.compute_dtype(image)
        n_out = padded_channels(conv.out_channels)
        single = image.shape[1] == 1 and conv.kernel_size == (3, 3, 3) and conv.padding == (1, 1, 1)
        single &= conv.stride == (1, 1, 1) and conv.bias is None and n_out & (n_out - 1) == 0
        if self.kernels == "triton" and dtype == torch.float16 and single:
            return conv3x3x3_single_channel(image.contiguous(), conv.weight, n_out)
        return self._conv(conv, pad_channels(image.to(dtype), image_channels(image.shape[1])))

    def _norm_act(
        self,
        x: torch.Tensor,
        norm: nn.Module,
        act: nn.Module,
        residual: torch.Tensor | None,
        in_place: bool,
        stats: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        spec = _norm_spec(norm, act)
        weight, bias = self.weights.affine(norm, x.shape[1]) if norm.affine else (None, None)
        if self.kernels == "torch":
            return norm_act_reference(x, weight, bias, spec, residual, norm.num_features)
        return norm_act(x, weight, bias, spec, residual, norm.num_features, out=x if in_place else None, stats=stats)

    def _add(self, x: torch.Tensor, addend: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
        """``x += addend``; with the Triton kernels also the statistics of the sum, for the norm that may follow."""
        if self.kernels == "torch":
            return x.add_(addend), None
        return x, instance_stats(x, add=addend)

    # ---- the blocks ---------------------------------------------------------------------------------------------
    def _segres_block(
        self, block: SegResBlock, x: torch.Tensor, stats: tuple | None
    ) -> tuple[torch.Tensor, tuple | None]:
        y = self._norm_act(x, block.norm1, block.act1, None, in_place=False, stats=stats)
        y, y_stats = self._conv_norm_input(block.conv1, y)
        y = self._norm_act(y, block.norm2, block.act2, None, in_place=True, stats=y_stats)
        return self._conv_norm_input(block.conv2, y, residual=x)

    def _unet_res_block(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        block = _res_block(block)
        y, y_stats = self._conv_norm_input(block.conv1.conv, x)
        y = self._norm_act(y, block.norm1, block.lrelu, None, in_place=True, stats=y_stats)
        y, y_stats = self._conv_norm_input(block.conv2.conv, y)
        return self._norm_act(y, block.norm2, block.lrelu, x, in_place=True, stats=y_stats)

    # ---- the branch ---------------------------------------------------------------------------------------------
    def features(self, image: torch.Tensor) -> torch.Tensor:
        """Class features after the class head's post-mapping: ``[W, C_pad, *spatial]`` channels-last."""
        segresnet = self.net.image_encoder
        if not segresnet.is_valid_shape(image):
            raise ValueError(
                f"Input spatial dims {tuple(image.shape)} must be divisible by {segresnet.shape_factor()}; "
                "pad or crop the input."
            )
        encoder = segresnet.encoder
        x = self._first_conv(encoder.conv_init, image)
        # the blocks run in this frame's loops: a helper called with a level's input would hold that tensor for all
        # of the level's blocks (measured: a fourth full-resolution tensor at the class head, 1.0 GiB per window)
        skips = []
        for level in encoder.layers:
            stats = None
            for block in level["blocks"]:
                x, stats = self._segres_block(block, x, stats)
            skips.append(x)
            if isinstance(level["downsample"], nn.Conv3d):
                x = self._conv(level["downsample"], x)
        skips.pop()  # the bottleneck is x itself
        for level in segresnet.up_layers_auto:
            x = self._conv(_only_child(level["upsample"], nn.ConvTranspose3d), x)
            x, stats = self._add(x, skips.pop())
            for block in level["blocks"]:
                x, stats = self._segres_block(block, x, stats)
        x = self._conv(segresnet.up_layers_auto[-1]["head"], x)
        for block in self.net.class_head.image_post_mapping:
            x = self._unet_res_block(block, x)
        return x

    def class_logits(self, image: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``[W, K, N]`` logits of the windows ``image`` for the padded class embeddings ``embedding``
        ``[K, C_pad]``."""
        return self._project(self.features(image), embedding)

    @staticmethod
    def _project(src: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``[W, K, N]`` logits from the class features ``src`` ``[W, C_pad, *spatial]`` (channels-last)."""
        n_win, n_chan = src.shape[:2]
        # [K, C] @ [W, C, N] -> [W, K, N]; the features are [W, N, C] in memory, which cuBLAS reads as a transposed
        # operand, and the embedding is broadcast over the windows with a zero batch stride (no copies)
        rows = src.permute(0, 2, 3, 4, 1).reshape(n_win, -1, n_chan)
        return torch.bmm(embedding.expand(n_win, -1, -1), rows.transpose(1, 2))

    def __call__(self, image: torch.Tensor, class_vector: torch.Tensor) -> torch.Tensor:
        """Class logits ``[K, W, *spatial]`` (a transposed view of a contiguous ``[W, K, *spatial]``), as the class
        head returns them.

        Args:
            image: ``[W, C, *spatial]`` windows.
            class_vector: ``[K, 1]`` class indices.
        """
        head = self.net.class_head
        embedding = head.class_embeddings(class_vector)
        if head.use_mlp:
            embedding = head.mlp(embedding)
        embedding = embedding.reshape(-1, embedding.shape[-1])
        embedding = F.pad(embedding, (0, padded_channels(embedding.shape[-1]) - embedding.shape[-1]))
        embedding = embedding.to(self.compute_dtype(image))
        with _cudnn_benchmark(CUDNN_BENCHMARK):
            if self.graphs is not None and image.is_cuda and image.shape[0] <= GRAPH_MAX_WINDOWS:
                # the graph's own features buffer: the product below is queued before any later replay overwrites it
                logits = self._project(self.graphs(image), embedding)
            else:
                logits = self.class_logits(image, embedding)
        return logits.view(image.shape[0], -1, *image.shape[2:]).transpose(0, 1)
