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
"""The image encoder of VISTA3D, its two decoders and the class head on the fused channels-last path.

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

Class prompts run the encoder, the class decoder and the class head's post-mapping here. Click prompts run the
encoder and the point decoder here (with class prompts too, one encoder pass feeds both decoders); the point head
(its downsampling, two-way transformer and upsampling) stays on its modules, reading the point features on their
real channels.

:py:meth:`monai.networks.nets.VISTA3D.fuse` turns this path on. What it runs is the caller's policy, one
:py:class:`~monai.networks.kernels.dispatch.FusedConfig`: which kernel takes each 3x3x3 convolution is
:py:func:`~monai.networks.kernels.dispatch.conv3x3x3_dispatch`'s choice, and whether a window batch is replayed as a
CUDA graph and cuDNN times its algorithms is the driver's (:py:class:`~monai.networks.kernels.graph_cache.GraphCache`),
so this module holds data flow only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from monai.networks.blocks.dynunet_block import UnetResBlock
from monai.networks.blocks.unetr_block import UnetrBasicBlock
from monai.networks.kernels.class_product import norm_act_product
from monai.networks.kernels.conv3d import conv3x3x3_single_channel
from monai.networks.kernels.dispatch import FusedConfig, check_config, conv3x3x3_dispatch, upsample_add_dispatch
from monai.networks.kernels.graph_cache import GraphCache, OutputT
from monai.networks.kernels.instance_norm import NormAct, instance_stats, norm_act, norm_act_reference
from monai.networks.kernels.padded_weights import PaddedWeights, image_channels, pad_channels, padded_channels
from monai.networks.nets.segresnet_ds import SegResBlock, SegResNetDS2
from monai.utils.triton_cache_key import wait_for_cache_key
from monai.utils.triton_support import unavailable_reason

if TYPE_CHECKING:
    from monai.networks.nets.vista3d import VISTA3D, ClassMappingClassify

__all__ = ["FusedClassBranch", "check_supported"]

ModuleT = TypeVar("ModuleT", bound=nn.Module)
# (the class features,) or, with FusedConfig.norm_in_product, the last block's (y, residual, mean, var) the class
# product makes them from
ClassFeatures = tuple[torch.Tensor, ...]

# The network's parts as this path runs them. Each accessor checks the part's type (torch types a ModuleList's or a
# ModuleDict's items, and a module's unannotated submodules, as plain modules) and raises NotImplementedError,
# saying what, for a layout the path does not run: check_supported walks them all once, when the path is built.


def _only_child(module: nn.Module, kind: type[ModuleT]) -> ModuleT:
    """The single submodule of ``module`` (a ``Convolution`` or ``UpSample`` wrapper), which must be a ``kind``."""
    children = list(module.children())
    child = children[0] if len(children) == 1 else None
    if not isinstance(child, kind):
        raise NotImplementedError(f"the fused path supports a wrapper of one {kind.__name__} here, found {module}.")
    return child


def _of_kind(module: nn.Module, kind: type[ModuleT], what: str) -> ModuleT:
    """``module``, which must be a ``kind`` (``what`` names it in the error)."""
    if not isinstance(module, kind):
        raise NotImplementedError(f"the fused path runs a {kind.__name__} as {what}, found {type(module).__name__}.")
    return module


def _segresnet(net: VISTA3D) -> SegResNetDS2:
    """The image encoder, a 3D :py:class:`SegResNetDS2`."""
    encoder = net.image_encoder
    if not isinstance(encoder, SegResNetDS2) or encoder.spatial_dims != 3:
        raise NotImplementedError("the fused path runs a 3D SegResNetDS2 image encoder.")
    return encoder


def _class_head(net: VISTA3D) -> ClassMappingClassify:
    """The class head, a :py:class:`~monai.networks.nets.vista3d.ClassMappingClassify`."""
    from monai.networks.nets.vista3d import ClassMappingClassify  # vista3d imports this module when fusing

    return _of_kind(net.class_head, ClassMappingClassify, "the class head")


def _level(level: nn.Module) -> nn.ModuleDict:
    """One level of an encoder or decoder (``blocks``, and ``downsample`` or ``upsample`` and ``head``)."""
    return _of_kind(level, nn.ModuleDict, "an encoder or decoder level")


def _blocks(level: nn.ModuleDict) -> list[SegResBlock]:
    """The residual blocks of a level."""
    blocks = _of_kind(level["blocks"], nn.Sequential, "a level's blocks")
    return [_of_kind(block, SegResBlock, "a level's block") for block in blocks]


def _blocks_and_more(level: nn.ModuleDict) -> list[tuple[SegResBlock, bool]]:
    """The residual blocks of a level, each with whether another block follows it in the level."""
    blocks = _blocks(level)
    return [(block, i < len(blocks) - 1) for i, block in enumerate(blocks)]


def _head(levels: nn.ModuleList) -> nn.Conv3d:
    """The output convolution of a decoder (``up_layers`` or ``up_layers_auto``), on its last level."""
    return _of_kind(_level(levels[-1])["head"], nn.Conv3d, "a decoder's head")


def _instance_norm(norm: nn.Module) -> nn.InstanceNorm3d:
    if not isinstance(norm, nn.InstanceNorm3d) or norm.track_running_stats:
        raise NotImplementedError(f"the fused path supports InstanceNorm3d without running stats, found {norm}.")
    return norm


def _res_block(block: nn.Module) -> UnetResBlock:
    """The ``UnetResBlock`` of a class-head block (``UnetrBasicBlock`` wraps one as ``layer``)."""
    inner = block.layer if isinstance(block, UnetrBasicBlock) else block
    if not isinstance(inner, UnetResBlock) or inner.downsample:
        raise NotImplementedError("the fused path runs a class head of UnetResBlocks without downsampling.")
    return inner


def _norm_spec(norm: nn.Module, act: nn.Module) -> NormAct:
    eps = _instance_norm(norm).eps
    if isinstance(act, nn.LeakyReLU):
        return NormAct(eps=eps, act="leakyrelu", negative_slope=act.negative_slope)
    if isinstance(act, nn.ReLU):
        return NormAct(eps=eps, act="relu")
    raise NotImplementedError(f"the fused path supports ReLU and LeakyReLU activations, found {act}.")


def check_supported(net: VISTA3D) -> None:
    """Raise ``NotImplementedError`` (saying what) unless ``net``'s class branch has the layout this path runs."""
    encoder = _segresnet(net)
    if encoder.preprocess is not None or encoder.anisotropic_scales is not None or encoder.dsdepth != 1:
        raise NotImplementedError(
            "the fused path runs SegResNetDS2 without preprocess, resolution or deep supervision."
        )
    _of_kind(encoder.encoder.conv_init, nn.Conv3d, "the first convolution")
    for level in map(_level, [*encoder.encoder.layers, *encoder.up_layers_auto, *encoder.up_layers]):
        for block in _blocks(level):
            _norm_spec(block.norm1, block.act1)
            _norm_spec(block.norm2, block.act2)
            _of_kind(block.conv1, nn.Conv3d, "a block's convolution")
            _of_kind(block.conv2, nn.Conv3d, "a block's convolution")
    for level in map(_level, [*encoder.up_layers_auto, *encoder.up_layers]):
        _only_child(level["upsample"], nn.ConvTranspose3d)
    _head(encoder.up_layers_auto)
    _head(encoder.up_layers)
    for res_block in map(_res_block, _class_head(net).image_post_mapping):
        _only_child(res_block.conv1, nn.Conv3d)
        _only_child(res_block.conv2, nn.Conv3d)
        _norm_spec(res_block.norm1, res_block.lrelu)
        _norm_spec(res_block.norm2, res_block.lrelu)


class FusedClassBranch:
    """Class logits, and the point branch's features, of a VISTA3D through the fused channels-last path (see the
    module docstring).

    Not an ``nn.Module``: it holds no parameters of its own and reads the network's on every call (through
    :py:class:`PaddedWeights`, which notices a changed parameter), so the network's state dict is unchanged.

    Args:
        net: a :py:class:`~monai.networks.nets.VISTA3D` whose layout :py:func:`check_supported` accepts.
        config: the kernels, launches, CUDA graph window limit and cuDNN autotuning
            (:py:class:`~monai.networks.kernels.dispatch.FusedConfig`); default ``FusedConfig()``, resolved from the
            installed Triton now.
    """

    def __init__(self, net: VISTA3D, config: FusedConfig | None = None):
        config = FusedConfig() if config is None else config
        if not isinstance(config, FusedConfig):
            raise TypeError(f"config must be a FusedConfig, got {type(config).__name__}.")
        check_config(config)
        check_supported(net)
        self.net = net
        self.config = config
        self.weights = PaddedWeights()
        # the class features' last norm inside the class product (decided here: the graphs' outputs follow it)
        self._norm_in_product = config.norm_in_product and config.kernels == "triton"
        encoder = _segresnet(net)
        class_branch: list[nn.Module] = [encoder.encoder, encoder.up_layers_auto, _class_head(net).image_post_mapping]
        point_branch: list[nn.Module] = [encoder.encoder, encoder.up_layers]
        # the drivers of the features: graphs up to the configured window batch, cuDNN timing on each shape's first
        # call. The graphs end at the features; the class product runs after each replay into a new tensor, so no
        # copy of the graph's logits buffer (0.5 GB per window at 117 classes) is needed to hand them out, and the
        # point features are copied out of the graph's buffer once, onto their real channels (what the point head
        # and a feature cache across calls need)
        self.run = self._driver(self.features, class_branch)
        self.run_point = self._driver(self.point_features, point_branch)
        self.run_both = self._driver(self.both_features, [*point_branch, *class_branch[1:]])

    def _driver(self, fn: Callable[[torch.Tensor], OutputT], modules: list[nn.Module]) -> GraphCache[OutputT]:
        params = [p for module in modules for p in module.parameters()]
        return GraphCache(
            fn, params, copy_output=False, max_batch=self.config.graph_max_windows, autotune=self.config.cudnn_autotune
        )

    @property
    def kernels(self) -> str:
        """``"triton"`` or ``"torch"``, as the configuration says."""
        return self.config.kernels

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
    def _conv(self, conv: nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weights(conv, x.dtype, x.shape[1])
        pointwise = conv.kernel_size == (1, 1, 1) and conv.stride == (1, 1, 1) and conv.padding == (0, 0, 0)
        if pointwise and conv.groups == 1:
            # a GEMM over the voxels' channel rows: cuBLAS adds the bias in its epilogue, where cuDNN leaves it to a
            # separate broadcast add (measured on the H200: 5.3 ms per 14 full-resolution windows)
            rows = x.permute(0, 2, 3, 4, 1).reshape(-1, x.shape[1])
            y = F.linear(rows, w.reshape(w.shape[0], -1), b)
            return y.view(x.shape[0], *x.shape[2:], -1).permute(0, 4, 1, 2, 3)
        y = F.conv3d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups)
        return y.contiguous(memory_format=torch.channels_last_3d)  # a no-op where cuDNN kept the layout

    def _conv_norm_input(
        self, conv: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None, stats: bool = True
    ) -> tuple[torch.Tensor, tuple | None]:
        """``conv(x) (+ residual)`` and, where asked for and the kernels compute them on the way, its statistics;
        the kernel is :py:func:`~monai.networks.kernels.dispatch.conv3x3x3_dispatch`'s choice."""
        conv3d = _of_kind(conv, nn.Conv3d, "a block's convolution")
        return conv3x3x3_dispatch(conv3d, x, self.weights, self.config, residual=residual, stats=stats)

    def _first_conv(self, conv: nn.Conv3d, image: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
        """The first convolution's output and, from the Triton kernel, its statistics (the first norm's)."""
        dtype = self.compute_dtype(image)
        n_out = padded_channels(conv.out_channels)
        single = image.shape[1] == 1 and conv.kernel_size == (3, 3, 3) and conv.padding == (1, 1, 1)
        single &= conv.stride == (1, 1, 1) and conv.bias is None and n_out & (n_out - 1) == 0
        if self.kernels == "triton" and dtype == torch.float16 and single:
            return conv3x3x3_single_channel(image.contiguous(), self.weights.single_channel(conv), stats=True)
        return self._conv(conv, pad_channels(image.to(dtype), image_channels(image.shape[1]))), None

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
        instance_norm = _instance_norm(norm)
        weight, bias = self.weights.affine(instance_norm, x.shape[1]) if instance_norm.affine else (None, None)
        real = instance_norm.num_features
        if self.kernels == "torch":
            return norm_act_reference(x, weight, bias, spec, residual, real)
        return norm_act(x, weight, bias, spec, residual, real, out=x if in_place else None, stats=stats)

    # ---- the blocks ---------------------------------------------------------------------------------------------
    def _segres_block(
        self, block: SegResBlock, x: torch.Tensor, stats: tuple | None, stats_out: bool
    ) -> tuple[torch.Tensor, tuple | None]:
        """The block's output and, with ``stats_out`` (a norm reads it next), its statistics."""
        y = self._norm_act(x, block.norm1, block.act1, None, in_place=False, stats=stats)
        y, y_stats = self._conv_norm_input(block.conv1, y)
        y = self._norm_act(y, block.norm2, block.act2, None, in_place=True, stats=y_stats)
        return self._conv_norm_input(block.conv2, y, residual=x, stats=stats_out)

    def _unet_res_convs(self, module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
        """A UnetResBlock up to its last norm: the second convolution's output and its statistics."""
        block = _res_block(module)
        y, y_stats = self._conv_norm_input(_only_child(block.conv1, nn.Conv3d), x)
        y = self._norm_act(y, block.norm1, block.lrelu, None, in_place=True, stats=y_stats)
        return self._conv_norm_input(_only_child(block.conv2, nn.Conv3d), y)

    def _unet_res_block(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        block = _res_block(module)
        y, y_stats = self._unet_res_convs(module, x)
        return self._norm_act(y, block.norm2, block.lrelu, x, in_place=True, stats=y_stats)

    # ---- the branches ----------------------------------------------------------------------------------------
    def _encode(self, image: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The shared encoder: ``(bottleneck, skips finest first)``, channels-last with padded channels."""
        segresnet = _segresnet(self.net)
        if not segresnet.is_valid_shape(image):
            raise ValueError(
                f"Input spatial dims {tuple(image.shape)} must be divisible by {segresnet.shape_factor()}; "
                "pad or crop the input."
            )
        wait_for_cache_key()  # a kernel launched during the prefetched hash of Triton would hash it again
        encoder = segresnet.encoder
        x, stats = self._first_conv(_of_kind(encoder.conv_init, nn.Conv3d, "the first convolution"), image)
        # the blocks run in this frame's loops: a helper called with a level's input would hold that tensor for all
        # of the level's blocks (measured: a fourth full-resolution tensor at the class head, 1.0 GiB per window).
        # A level's last block feeds a convolution (downsample, upsample, head) that reads no statistics: its kernel
        # computes none
        skips = []
        for level in map(_level, encoder.layers):
            for block, more in _blocks_and_more(level):
                x, stats = self._segres_block(block, x, stats, stats_out=more)
            skips.append(x)
            downsample = level["downsample"]
            if isinstance(downsample, nn.Conv3d):
                x = self._conv(downsample, x)
            stats = None  # (cuDNN's downsampling computes none: the next level's first norm does)
        skips.pop()  # the bottleneck is x itself
        return x, skips

    def _decode(self, levels: nn.ModuleList, x: torch.Tensor, skips: list[torch.Tensor]) -> torch.Tensor:
        """One decoder (``up_layers`` or ``up_layers_auto``) and its head from the encoder's output; ``skips`` is
        consumed (coarsest last), the tensors in it are only read, so two decoders can share them."""
        for level in map(_level, levels):
            upsample = _only_child(level["upsample"], nn.ConvTranspose3d)
            x, stats = upsample_add_dispatch(upsample, x, skips.pop(), self.weights, self.config)
            for block, more in _blocks_and_more(level):  # (in this frame's loop: see _encode)
                x, stats = self._segres_block(block, x, stats, stats_out=more)
        return self._conv(_head(levels), x)

    def _post_mapping(self, x: torch.Tensor) -> ClassFeatures:
        blocks = list(_class_head(self.net).image_post_mapping)
        for block in blocks[:-1]:
            x = self._unet_res_block(block, x)
        if not self._norm_in_product:
            return (self._unet_res_block(blocks[-1], x),)
        y, stats = self._unet_res_convs(blocks[-1], x)
        mean, var = instance_stats(y) if stats is None else stats  # (None where cuDNN ran it: not fp16)
        return y, x, mean, var

    def features(self, image: torch.Tensor) -> ClassFeatures:
        """``(features,)``: the class features after the class head's post-mapping, ``[W, C_pad, *spatial]``
        channels-last; with ``FusedConfig.norm_in_product``, what the class product makes them from: ``(y,
        residual, mean, var)`` of the last block's norm."""
        x, skips = self._encode(image)
        return self._post_mapping(self._decode(_segresnet(self.net).up_layers_auto, x, skips))

    def point_features(self, image: torch.Tensor) -> torch.Tensor:
        """Point-branch features (the point decoder ``up_layers`` and its head): ``[W, C_pad, *spatial]``
        channels-last."""
        x, skips = self._encode(image)
        return self._decode(_segresnet(self.net).up_layers, x, skips)

    def both_features(self, image: torch.Tensor) -> tuple[torch.Tensor, ClassFeatures]:
        """``(point features, class features)`` of one encoder pass, as :py:meth:`point_features` and
        :py:meth:`features` give them."""
        x, skips = self._encode(image)
        encoder = _segresnet(self.net)
        point = self._decode(encoder.up_layers, x, list(skips))
        return point, self._post_mapping(self._decode(encoder.up_layers_auto, x, skips))

    def class_logits(self, image: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``[W, K, N]`` logits of the windows ``image`` for the padded class embeddings ``embedding``
        ``[K, C_pad]``."""
        return self._project(self.features(image), embedding)

    def _project(self, src: ClassFeatures, embedding: torch.Tensor) -> torch.Tensor:
        """``[W, K, N]`` logits from the class features ``src`` (as :py:meth:`features` returns them)."""
        if len(src) == 4:
            return self._norm_project(src, embedding)
        (features,) = src
        n_win, n_chan = features.shape[:2]
        # [K, C] @ [W, C, N] -> [W, K, N]; the features are [W, N, C] in memory, which cuBLAS reads as a transposed
        # operand, and the embedding is broadcast over the windows with a zero batch stride (no copies)
        rows = features.permute(0, 2, 3, 4, 1).reshape(n_win, -1, n_chan)
        return torch.bmm(embedding.expand(n_win, -1, -1), rows.transpose(1, 2))

    def _norm_project(self, pending: ClassFeatures, embedding: torch.Tensor) -> torch.Tensor:
        """The logits from the last block's ``(y, residual, mean, var)``: its norm, residual add and activation
        inside the class product's kernel where the features are fp16, else the norm's pass then the product."""
        y, residual, mean, var = pending
        block = _res_block(list(_class_head(self.net).image_post_mapping)[-1])
        norm = _instance_norm(block.norm2)
        if y.dtype != torch.float16 or embedding.dtype != torch.float16:
            features = self._norm_act(y, block.norm2, block.lrelu, residual, in_place=False, stats=(mean, var))
            return self._project((features,), embedding)
        weight, bias = self.weights.affine(norm, y.shape[1]) if norm.affine else (None, None)
        spec = _norm_spec(block.norm2, block.lrelu)
        return norm_act_product(y, weight, bias, spec, embedding, residual, norm.num_features, stats=(mean, var))

    def _class_embedding(self, class_vector: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The class head's ``[K, C_pad]`` embeddings of ``class_vector`` ``[K, 1]``, zero-padded, in ``dtype``."""
        head = _class_head(self.net)
        embedding = head.class_embeddings(class_vector)
        if head.use_mlp:
            embedding = head.mlp(embedding)
        embedding = embedding.reshape(-1, embedding.shape[-1])
        embedding = F.pad(embedding, (0, padded_channels(embedding.shape[-1]) - embedding.shape[-1]))
        return embedding.to(dtype)

    def _point_output(self, features: torch.Tensor) -> torch.Tensor:
        """The point features as the module path hands them to the point head: a new ``[W, C, *spatial]`` tensor
        (channels-last) of the real channels (the point decoder head's), so it outlives the next graph replay."""
        n_chan = _head(_segresnet(self.net).up_layers).out_channels
        return features[:, :n_chan].clone(memory_format=torch.channels_last_3d)

    def point(self, image: torch.Tensor) -> torch.Tensor:
        """Point-branch features ``[W, C, *spatial]`` of the windows ``image``, the ``point_features`` of the
        module path's image encoder (up to rounding)."""
        return self._point_output(self.run_point(image))

    def class_and_point(self, image: torch.Tensor, class_vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits (as :py:meth:`__call__` returns them) and point features (as :py:meth:`point`) of one
        encoder pass: what class + point prompts need."""
        point, features = self.run_both(image)
        # (after the features are queued: see __call__)
        logits = self._project(features, self._class_embedding(class_vector, self.compute_dtype(image)))
        return logits.view(image.shape[0], -1, *image.shape[2:]).transpose(0, 1), self._point_output(point)

    def __call__(self, image: torch.Tensor, class_vector: torch.Tensor) -> torch.Tensor:
        """Class logits ``[K, W, *spatial]`` (a transposed view of a contiguous ``[W, K, *spatial]``), as the class
        head returns them.

        Args:
            image: ``[W, C, *spatial]`` windows.
            class_vector: ``[K, 1]`` class indices.
        """
        # the features first: the class embedding's few small launches then run on the host while the GPU works on
        # them, where before them the GPU idled through their launches (H100 d7ef186: ~1 ms per forward at one
        # window). Where the forward was replayed, `features` is the graph's own buffer: the product below is queued
        # before any later replay overwrites it
        features = self.run(image)
        logits = self._project(features, self._class_embedding(class_vector, self.compute_dtype(image)))
        return logits.view(image.shape[0], -1, *image.shape[2:]).transpose(0, 1)
