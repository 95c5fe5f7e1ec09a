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
"""VISTA3D: a promptable 3D CT segmentation network (He et al., https://arxiv.org/abs/2406.05285).

``VISTA3D`` joins an image encoder (:py:class:`~monai.networks.nets.SegResNetDS2`) with two heads: a class head
(:py:class:`ClassMappingClassify`) that segments the classes named by ``class_vector``, and a SAM-style point head
(:py:class:`PointMappingSAM`) that segments an object from positive/negative clicks. Module attribute names are those
of MONAI 1.6.1, so its checkpoints (e.g. the VISTA3D bundle's ``model.pt``) load strictly.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from monai.networks.blocks import MLPBlock, UnetrBasicBlock
from monai.networks.nets.segresnet_ds import SegResNetDS2
from monai.utils import point_helpers, unsqueeze_right

if TYPE_CHECKING:
    from monai.networks.kernels.dispatch import FusedConfig
    from monai.networks.nets.vista3d_fused import FusedClassBranch

logger = logging.getLogger(__name__)

__all__ = [
    "VISTA3D",
    "vista3d132",
    "PointMappingSAM",
    "ClassMappingClassify",
    "TwoWayTransformer",
    "TwoWayAttentionBlock",
    "Attention",
    "PositionEmbeddingRandom",
    "MLP",
]


@runtime_checkable
class _ReleasesCachedMemory(Protocol):
    """A head with the ``release_cached_memory`` switch (:py:class:`PointMappingSAM`)."""

    release_cached_memory: bool


def vista3d132(encoder_embed_dim: int = 48, in_channels: int = 1) -> VISTA3D:
    """The VISTA3D configuration of the paper and of the published bundle (classes above 132 are zero-shot).

    Args:
        encoder_embed_dim: width of the encoder output and of both heads.
        in_channels: number of image channels.
    """
    segresnet = SegResNetDS2(
        in_channels=in_channels,
        blocks_down=(1, 2, 2, 4, 4),
        norm="instance",
        out_channels=encoder_embed_dim,
        init_filters=encoder_embed_dim,
        dsdepth=1,
    )
    point_head = PointMappingSAM(feature_size=encoder_embed_dim, n_classes=512, last_supported=132)
    class_head = ClassMappingClassify(n_classes=512, feature_size=encoder_embed_dim, use_mlp=True)
    return VISTA3D(image_encoder=segresnet, class_head=class_head, point_head=point_head)


def _as_long_tensor(value: Any, device: torch.device, name: str) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.to(device)
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a tensor or a nested list of numbers, got {type(value).__name__}.") from e
    return tensor.to(device)


@dataclass(frozen=True)
class _Clicks:
    """The click prompts of the rows that have clicks.

    Attributes:
        coords: ``[B1, N, 3]`` clicks in window coordinates.
        labels: ``[B1, N]`` their labels.
        prompt_class: ``[B1, 1]`` class of each row, or None.
        mapping_index: ``[B]`` bool, the rows of the output these are.
    """

    coords: torch.Tensor
    labels: torch.Tensor
    prompt_class: torch.Tensor | None
    mapping_index: torch.Tensor


class VISTA3D(nn.Module):
    """VISTA3D (https://arxiv.org/abs/2406.05285): automatic (class prompt) and interactive (point prompt) 3D
    segmentation with one image encoder.

    Args:
        image_encoder: encoder returning ``(point_features, class_features)`` from
            ``image_encoder(image, with_point=..., with_label=...)``, e.g. :py:class:`SegResNetDS2`.
        class_head: head mapping class features and a ``[B, 1]`` class vector to logits, e.g.
            :py:class:`ClassMappingClassify`.
        point_head: head mapping point features and clicks to logits, e.g. :py:class:`PointMappingSAM`.
        release_cached_memory: call ``torch.cuda.empty_cache()`` after the encoder and between the point head's
            prompt chunks, as MONAI 1.6.1 always did. It lowers the memory the CUDA caching allocator keeps
            reserved (useful on small GPUs with many click prompts) at the cost of fresh device allocations in
            every call; leave it off for throughput, e.g. for all-class sliding-window inference.
    """

    def __init__(
        self,
        image_encoder: nn.Module,
        class_head: nn.Module,
        point_head: nn.Module,
        release_cached_memory: bool = False,
    ):
        super().__init__()
        self.image_encoder = image_encoder
        self.class_head = class_head
        self.point_head = point_head
        self.image_embeddings: torch.Tensor | None = None
        self.auto_freeze = False
        self.point_freeze = False
        self.NINF_VALUE = -9999
        self.PINF_VALUE = 9999
        self.release_cached_memory = release_cached_memory
        self._fused: FusedClassBranch | None = None  # once fuse() is called; not a submodule: no state-dict keys
        self._fused_reasons_logged: set[str] = set()

    def fuse(self, config: FusedConfig | bool | None = None) -> VISTA3D:
        """Run inference through the fused channels-last path (:py:mod:`monai.networks.nets.vista3d_fused`).

        The fused path serves forwards in eval mode without autograd, on a GPU the kernels support (compute
        capability 9.x with Triton): class prompts run the encoder, the class decoder and the class head's
        post-mapping there; click prompts (alone, or with class prompts) run the encoder and the point decoder (and
        the class branch) there and the point head on its modules. It computes in the dtype the module path would (fp16
        under fp16 autocast, else the input's); it is built and measured for fp16. Any other call runs the module
        path as before; where the fused path was asked for but cannot run, the reason is logged once. Parameters and
        state-dict keys are unchanged, and changed weights (``load_state_dict``) are picked up.

        Args:
            config: what the fused path runs (:py:class:`~monai.networks.kernels.dispatch.FusedConfig`: kernels,
                convolution forms and launches, CUDA graph window limit, cuDNN autotuning); ``None``: the default
                ``FusedConfig()``, resolved from the installed Triton now, once; ``False`` returns to the module path.

        Returns:
            this network.
        """
        if config is False:
            self._fused = None
            return self
        if config is True:
            config = None
        from monai.networks.nets.vista3d_fused import FusedClassBranch

        self._fused = FusedClassBranch(self, config)
        self._fused_reasons_logged = set()
        return self

    @staticmethod
    def fused_unavailable_reason(device: torch.device | str) -> str | None:
        """Why :py:meth:`fuse` would not run the fused kernels on ``device``; ``None`` where it would.

        The one answer to "can the fused path run here": the kernels need a CUDA GPU of compute capability 9.x
        with Triton (:py:func:`monai.utils.triton_support.unavailable_reason`). Callers ask it before calling
        :py:meth:`fuse`; each forward then asks its fused branch about that call (eval mode, no autograd).
        """
        device = torch.device(device)
        if device.type != "cuda":
            return f"the fused kernels run on CUDA GPUs, not on {device.type}"
        from monai.utils.triton_support import unavailable_reason

        return unavailable_reason(device)

    @property
    def fused_config(self) -> FusedConfig | None:
        """The configuration :py:meth:`fuse` resolved, ``None`` on the module path."""
        return None if self._fused is None else self._fused.config

    @property
    def fused(self) -> bool:
        """Whether :py:meth:`fuse` has turned the fused path on."""
        return self._fused is not None

    def __getstate__(self) -> dict:
        # a copy or a pickle is unfused: the fused path's CUDA graphs and weight copies belong to this instance
        state = self.__dict__.copy()
        state["_fused"] = None
        return state

    def _use_fused(self, image: torch.Tensor) -> bool:
        if self._fused is None:
            return False
        reason = self._fused.unavailable_reason(image)
        if reason is not None and reason not in self._fused_reasons_logged:
            self._fused_reasons_logged.add(reason)
            logger.warning("VISTA3D: the module path runs instead of the fused one: %s.", reason)
        return reason is None

    @property
    def release_cached_memory(self) -> bool:
        """Whether forward releases the CUDA allocator's cached blocks (see the class arguments)."""
        return self._release_cached_memory

    @release_cached_memory.setter
    def release_cached_memory(self, value: bool) -> None:
        self._release_cached_memory = bool(value)
        if isinstance(self.point_head, _ReleasesCachedMemory):
            self.point_head.release_cached_memory = bool(value)

    # ---------------------------------------------------------------------------------------------------------------
    # prompt bookkeeping
    # ---------------------------------------------------------------------------------------------------------------
    def update_slidingwindow_padding(
        self,
        pad_size: list | None,
        labels: torch.Tensor | None,
        prev_mask: torch.Tensor | None,
        point_coords: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Apply the sliding-window inferer's input padding to the tensors it did not pad itself.

        Args:
            pad_size: the ``F.pad`` padding of the image's last three dims ``[d0, d1, w0, w1, h0, h1]`` (or ``None``).
            labels: ``[1, 1, H, W, D]`` ground truth, zero padded.
            prev_mask: ``[1, B, H, W, D]`` previous output, zero padded.
            point_coords: ``[B, N, 3]`` clicks, shifted by the leading padding.
        """
        if pad_size is None:
            return labels, prev_mask, point_coords
        if labels is not None:
            labels = F.pad(labels, pad=pad_size, mode="constant", value=0)
        if prev_mask is not None:
            prev_mask = F.pad(prev_mask, pad=pad_size, mode="constant", value=0)
        if point_coords is not None:
            shift = torch.tensor([pad_size[-2], pad_size[-4], pad_size[-6]], device=point_coords.device)
            point_coords = point_coords + shift
        return labels, prev_mask, point_coords

    def get_foreground_class_count(self, class_vector: torch.Tensor | None, point_coords: torch.Tensor | None) -> int:
        """Number of foreground objects: rows of ``class_vector``, else rows of ``point_coords``."""
        if class_vector is not None:
            return class_vector.shape[0]
        if point_coords is None:
            raise ValueError("no prompt: give class_vector, or point_coords with point_labels.")
        return point_coords.shape[0]

    def convert_point_label(
        self,
        point_label: torch.Tensor,
        label_set: Sequence[int] | None = None,
        special_index: Sequence[int] = (23, 24, 25, 26, 27, 57, 128),
    ) -> torch.Tensor:
        """Turn the 0/1 clicks of the special classes (tumours, lesions, ...) into 2/3, in place.

        Args:
            point_label: ``[B, N]`` labels, -1 is padding.
            label_set: the (global) class of each row; ``None`` leaves the labels unchanged.
            special_index: the classes whose clicks are relabelled.
        """
        if label_set is None:
            return point_label
        if point_label.shape[0] != len(label_set):
            raise ValueError(
                f"point_label and label_set must have the same length, got {point_label.shape[0]} and {len(label_set)}."
            )
        special = set(int(i) for i in special_index)
        for row, cls in enumerate(label_set):
            if int(cls) in special:
                labels_row = point_label[row]
                labels_row[labels_row > -1] += 2
        return point_label

    def sample_points_patch_val(
        self,
        labels: torch.Tensor,
        patch_coords: Sequence[slice],
        label_set: Sequence[int],
        use_center: bool = True,
        mapped_label_set: Sequence[int] | None = None,
        max_ppoint: int = 1,
        max_npoint: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample clicks from the ground truth of one sliding window (point-only validation).

        Args:
            labels: ``[1, 1, H, W, D]`` ground truth.
            patch_coords: the window's slices into ``labels``.
            label_set: the (local) label values to sample, one object each.
            use_center: take the points nearest to the centre of each object instead of random ones.
            mapped_label_set: the global classes of ``label_set`` (selects the special-class labels 2/3).
            max_ppoint: positive points per object.
            max_npoint: negative points per object.

        Returns:
            ``(point_coords [B, N, 3], point_labels [B, N], prompt_class [B, 1])``.
        """
        point_coords, point_labels = point_helpers.sample_points_from_label(
            labels[patch_coords],
            label_set,
            max_ppoint=max_ppoint,
            max_npoint=max_npoint,
            device=labels.device,
            use_center=use_center,
        )
        point_labels = self.convert_point_label(point_labels, mapped_label_set)
        prompt_class = torch.tensor(label_set, device=point_coords.device).unsqueeze(-1)
        return point_coords, point_labels, prompt_class

    def update_point_to_patch(
        self, patch_coords: Sequence[slice], point_coords: torch.Tensor, point_labels: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Move clicks from image to window coordinates; clicks outside the window become padding (-1).

        Args:
            patch_coords: the window's slices (the last three are the spatial ones).
            point_coords: ``[B, N, 3]`` clicks in image coordinates.
            point_labels: ``[B, N]`` labels.

        Returns:
            the clicks and labels in the window (columns that are padding in every row dropped), or
            ``(None, None)`` when no click lies inside the window.
        """
        starts = torch.tensor([s.start for s in patch_coords[-3:]], device=point_coords.device)
        stops = torch.tensor([s.stop for s in patch_coords[-3:]], device=point_coords.device)
        # strictly inside, as MONAI 1.6.1 does: a click on the window's first voxel counts as outside
        inside = ((point_coords - starts) > 0).all(2) & ((stops - point_coords) > 0).all(2)
        if not inside.any():
            return None, None
        point_coords = point_coords - starts
        point_labels = point_labels.clone()
        point_labels[~inside] = -1
        point_coords[~inside] = 0
        keep = (point_labels != -1).any(0)
        return point_coords[:, keep], point_labels[:, keep]

    # ---------------------------------------------------------------------------------------------------------------
    # combining class and point results
    # ---------------------------------------------------------------------------------------------------------------
    def connected_components_combine(
        self,
        logits: torch.Tensor,
        point_logits: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mapping_index: torch.Tensor,
        thred: float = 0.5,
    ) -> torch.Tensor:
        """Edit automatic results with click results, keeping only the click regions connected to the clicks.

        Rows ``mapping_index`` of ``logits`` are replaced by ``point_logits`` where the point result adds a region
        connected to a positive click or removes one connected to a negative click. Voxels where ``logits`` is NaN
        (no earlier prediction) stay NaN, as in MONAI 1.6.1: the replacement multiplies them by 0 and NaN * 0 is
        NaN. ``logits`` is modified in place and returned.

        Args:
            logits: ``[B, 1, H, W, D]`` automatic (or previous) logits.
            point_logits: ``[B1, 1, H, W, D]`` click logits of the rows selected by ``mapping_index``.
            point_coords: ``[B1, N, 3]`` clicks.
            point_labels: ``[B1, N]`` labels.
            mapping_index: ``[B]`` bool, the rows that have clicks.
            thred: probability threshold of a foreground voxel.
        """
        auto = logits[mapping_index]
        # does any click of a row hit the automatic foreground? (padding clicks included, as in MONAI 1.6.1)
        # a click in the window's last half voxel rounds to one past its end (MONAI 1.6.1 raises IndexError
        # there, a device assert on the GPU): it lies in the last voxel
        idx = torch.minimum(point_coords.round().long(), torch.tensor(auto.shape[-3:], device=auto.device) - 1)
        rows = torch.arange(auto.shape[0], device=auto.device)[:, None]
        clicked = auto[rows, 0, idx[..., 0], idx[..., 1], idx[..., 2]]
        inside = (clicked > 0).any(1).to(torch.int64)

        nan_mask = torch.isnan(auto)
        auto = torch.nan_to_num(auto, nan=self.NINF_VALUE).sigmoid()
        pos_region = point_logits.sigmoid() > thred
        diff_pos = ((auto <= thred) | unsqueeze_right(inside, 5).bool()) & pos_region
        diff_neg = (auto > thred) & ~pos_region
        cc = point_helpers.keep_merge_components_with_points(
            diff_pos, diff_neg, point_coords=point_coords, point_labels=point_labels
        )
        cc = cc.to(logits.device)
        # NaN voxels take the point result, except positive regions not connected to a click: those get -1
        fill_mask = nan_mask & pos_region & ~cc
        point_logits.masked_fill_(fill_mask, -1)
        cc = (nan_mask | cc).to(logits.dtype)
        logits[mapping_index] *= 1 - cc
        logits[mapping_index] += cc * point_logits
        return logits

    def gaussian_combine(
        self,
        logits: torch.Tensor,
        point_logits: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mapping_index: torch.Tensor,
        radius: int | None = None,
    ) -> torch.Tensor:
        """Blend click results into automatic results with Gaussian weights around each click (in place).

        Args:
            logits: ``[B, 1, H, W, D]`` automatic logits.
            point_logits: ``[B1, 1, H, W, D]`` click logits of the rows selected by ``mapping_index``.
            point_coords: ``[B1, N, 3]`` clicks.
            point_labels: ``[B1, N]`` labels.
            mapping_index: ``[B]`` bool, the rows that have clicks.
            radius: Gaussian sigma in voxels; default a fifth of the smallest spatial size.
        """
        if radius is None:
            radius = min(point_logits.shape[-3:]) // 5
        discs = point_helpers.convert_points_to_disc(
            point_logits.shape[-3:], point_coords, point_labels, radius=radius
        )
        weight = (1 - discs.sum(1, keepdim=True)).clamp_(min=0)
        if torch.compiler.is_exporting():  # exported: every row has clicks (checked where the program runs)
            return logits * weight + (1 - weight) * point_logits
        logits[mapping_index] *= weight
        logits[mapping_index] += (1 - weight) * point_logits
        return logits

    def set_auto_grad(self, auto_freeze: bool = False, point_freeze: bool = False) -> None:
        """Freeze the automatic (class) branch, the point branch, or both, for fine-tuning.

        The image encoder is frozen when either branch is (its decoders follow their branch when it has a
        ``set_auto_grad`` method, like :py:class:`SegResNetDS2`).

        Args:
            auto_freeze: freeze the class branch (class head and class decoder).
            point_freeze: freeze the point branch (point head and point decoder).
        """
        if auto_freeze == self.auto_freeze and point_freeze == self.point_freeze:
            return
        set_auto_grad = getattr(self.image_encoder, "set_auto_grad", None)
        if set_auto_grad is not None:
            set_auto_grad(auto_freeze=auto_freeze, point_freeze=point_freeze)
        else:
            for param in self.image_encoder.parameters():
                param.requires_grad = not (auto_freeze or point_freeze)
        if auto_freeze != self.auto_freeze:
            for param in self.class_head.parameters():
                param.requires_grad = not auto_freeze
            self.auto_freeze = auto_freeze
        if point_freeze != self.point_freeze:
            for param in self.point_head.parameters():
                param.requires_grad = not point_freeze
            self.point_freeze = point_freeze

    def _scatter_point_logits(self, point_logits: torch.Tensor, mapping_index: torch.Tensor, bs: int) -> torch.Tensor:
        """``[bs, 1, H, W, D]`` logits: the point results in the rows with clicks, ``NINF_VALUE`` elsewhere.

        When every row has clicks the point results are returned as they are, without a filled buffer.
        """
        if torch.compiler.is_exporting() or bool(mapping_index.all()):  # exported: every row has clicks
            return point_logits
        logits = torch.full(
            (bs, *point_logits.shape[1:]), self.NINF_VALUE, dtype=point_logits.dtype, device=point_logits.device
        )
        logits[mapping_index] = point_logits
        return logits

    # ---------------------------------------------------------------------------------------------------------------
    # forward
    # ---------------------------------------------------------------------------------------------------------------
    @staticmethod
    def _check_prompts(
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        class_vector: torch.Tensor | None,
        prompt_class: torch.Tensor | None,
    ) -> None:
        if (point_coords is None) != (point_labels is None):
            raise ValueError(
                "point_coords and point_labels must be given together: point_coords [B, N, 3] and point_labels "
                f"[B, N] (got point_coords={'None' if point_coords is None else tuple(point_coords.shape)}, "
                f"point_labels={'None' if point_labels is None else tuple(point_labels.shape)})."
            )
        if point_coords is not None and point_labels is not None:
            if point_coords.ndim != 3 or point_coords.shape[-1] != 3:
                raise ValueError(f"point_coords must have shape [B, N, 3], got {tuple(point_coords.shape)}.")
            if tuple(point_labels.shape) != tuple(point_coords.shape[:2]):
                raise ValueError(
                    f"point_labels must have shape [B, N] = {tuple(point_coords.shape[:2])} to match point_coords "
                    f"{tuple(point_coords.shape)}, got {tuple(point_labels.shape)}."
                )
            if prompt_class is not None and prompt_class.shape[0] != point_coords.shape[0]:
                raise ValueError(
                    f"prompt_class must have one row per point prompt ({point_coords.shape[0]}), "
                    f"got shape {tuple(prompt_class.shape)}."
                )
        if class_vector is not None and (class_vector.ndim != 2 or class_vector.shape[1] != 1):
            raise ValueError(f"class_vector must have shape [B, 1] (or [B]), got {tuple(class_vector.shape)}.")

    def forward(
        self,
        input_images: torch.Tensor,
        patch_coords: list[Sequence[slice]] | None = None,
        point_coords: torch.Tensor | None = None,
        point_labels: torch.Tensor | None = None,
        class_vector: torch.Tensor | None = None,
        prompt_class: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        label_set: Sequence[int] | None = None,
        prev_mask: torch.Tensor | None = None,
        radius: int | None = None,
        val_point_sampler: Callable | None = None,
        transpose: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        """Segment the objects named by class prompts and/or click prompts.

        Point prompts need a single image (``B_img == 1``); class prompts alone accept a batch of sliding windows.

        Args:
            input_images: ``[B_img, C, H, W, D]``.
            patch_coords: per window, its slices into the full image (given by the sliding-window inferers);
                the point paths use ``patch_coords[0]``.
            point_coords: ``[B, N, 3]`` clicks (in full-image coordinates when ``patch_coords`` is given).
            point_labels: ``[B, N]``: 0/1 negative/positive, 2/3 negative/positive for the special classes,
                -1 padding.
            class_vector: ``[B, 1]`` class indices for automatic segmentation.
            prompt_class: ``[B, 1]`` class of each point prompt; classes above the point head's
                ``last_supported`` are zero-shot. With ``class_vector`` it is usually the same.
            labels: ``[1, 1, H, W, D]`` ground truth to sample clicks from (point-only validation, with
                ``patch_coords`` and ``label_set``).
            label_set: the label values of ``labels`` to sample clicks for.
            prev_mask: ``[1, B, H_full, W_full, D_full]`` previous raw output of the inferer; with click prompts and
                ``patch_coords`` the clicks edit it by connected components.
            radius: Gaussian sigma of the class+click blend without ``patch_coords``.
            val_point_sampler: ``f(labels, patch_coords, label_set) -> (coords, labels, prompt_class)``;
                default :py:meth:`sample_points_patch_val`.
            transpose: return ``[B_img, B, H, W, D]`` instead of ``[B, B_img, H, W, D]`` (the sliding-window
                inferers need this).
            kwargs: ``pad_size`` (from the sliding-window inferers) and ``keep_cache`` (reuse/store the point
                branch features across calls when there is no ``class_vector``).

        Returns:
            logits ``[B, B_img, H, W, D]`` (``[B_img, B, H, W, D]`` with ``transpose``). Without ``class_vector``
            and ``point_coords`` (also when clicks would be sampled from ``labels``), a ``[1, 1, H, W, D]`` tensor of
            ``NINF_VALUE`` (-9999) as MONAI 1.6.1 returns, not an error: check for a missing prompt before calling.
        """
        device = input_images.device
        point_coords, point_labels, class_vector, prompt_class = self._prompt_tensors(
            device, point_coords, point_labels, class_vector, prompt_class
        )
        if point_coords is None and class_vector is None:
            # MONAI 1.6.1's answer to a call without prompts: one row of NINF_VALUE, whatever ``transpose`` says
            return self.NINF_VALUE + torch.zeros([1, 1, *input_images.shape[-3:]], device=device)
        sample_from_labels = patch_coords is not None and labels is not None and label_set is not None

        labels, prev_mask, point_coords = self.update_slidingwindow_padding(
            kwargs.get("pad_size"), labels, prev_mask, point_coords
        )
        image_size = input_images.shape[-3:]
        keep_cache = bool(kwargs.get("keep_cache", False))

        if patch_coords is not None and labels is not None and label_set is not None:  # sample_from_labels
            sampler = val_point_sampler if val_point_sampler is not None else self.sample_points_patch_val
            point_coords, point_labels, prompt_class = self._sampled_clicks(sampler, labels, patch_coords, label_set)
            labels, prev_mask = None, None
        # the number of output rows is fixed by the prompts given, before clicks outside the window are dropped
        bs = self.get_foreground_class_count(class_vector, point_coords)
        if (
            patch_coords is not None
            and not sample_from_labels
            and point_coords is not None
            and point_labels is not None  # (given with point_coords, as _prompt_tensors checked)
        ):
            point_coords, point_labels = self.update_point_to_patch(patch_coords[0], point_coords, point_labels)
        clicks = self._prompted_rows(
            point_coords, point_labels, prompt_class, keep_padding=class_vector is None and patch_coords is None
        )

        if clicks is None and class_vector is None:
            logits = self.NINF_VALUE + torch.zeros([bs, 1, *image_size], device=device)
            return logits.transpose(1, 0) if transpose else logits

        fused = self._fused
        if class_vector is not None and clicks is None and fused is not None and self._use_fused(input_images):
            logits = fused(input_images, class_vector)
            return logits.transpose(1, 0) if transpose else logits

        out, class_logits = self._features(input_images, clicks is not None, class_vector, keep_cache)
        del input_images  # this frame's reference goes before the heads allocate
        if self.release_cached_memory:
            torch.cuda.empty_cache()
        if clicks is not None:
            logits = self._with_clicks(out, class_logits, clicks, patch_coords=patch_coords, prev_mask=prev_mask,
                                       radius=radius, bs=bs)
        elif class_logits is not None:
            logits = class_logits
        else:  # never: a call without clicks here has class prompts (one without either returned above)
            raise RuntimeError("VISTA3D.forward: no class logits for a call without clicks.")
        if keep_cache and class_vector is None:
            self.image_embeddings = out.detach()
        return logits.transpose(1, 0) if transpose else logits

    @staticmethod
    def _sampled_clicks(
        sampler: Callable, labels: torch.Tensor, patch_coords: list[Sequence[slice]], label_set: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Clicks sampled from ``labels`` in the first window (validation); the background class gets none."""
        point_coords, point_labels, prompt_class = sampler(labels, patch_coords[0], label_set)
        if prompt_class[0].item() == 0:  # background: no clicks
            point_labels[0] = -1
        return point_coords, point_labels, prompt_class

    @classmethod
    def _prompt_tensors(
        cls,
        device: torch.device,
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        class_vector: torch.Tensor | None,
        prompt_class: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        """The prompts as checked long tensors on ``device``; ``[B]`` class vectors become ``[B, 1]``."""
        point_coords = _as_long_tensor(point_coords, device, "point_coords")
        point_labels = _as_long_tensor(point_labels, device, "point_labels")
        class_vector = _as_long_tensor(class_vector, device, "class_vector")
        prompt_class = _as_long_tensor(prompt_class, device, "prompt_class")
        if class_vector is not None and class_vector.ndim == 1:
            class_vector = class_vector[:, None]
        if prompt_class is not None and prompt_class.ndim == 1:
            prompt_class = prompt_class[:, None]
        cls._check_prompts(point_coords, point_labels, class_vector, prompt_class)
        return point_coords, point_labels, class_vector, prompt_class

    def _prompted_rows(
        self,
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        prompt_class: torch.Tensor | None,
        keep_padding: bool,
    ) -> _Clicks | None:
        """The rows whose clicks are not all padding, or None when no row has a click.

        Args:
            point_coords: ``[B, N, 3]`` clicks in window coordinates, or None.
            point_labels: ``[B, N]`` labels (-1 padding), or None.
            prompt_class: ``[B, 1]`` class of each row, or None.
            keep_padding: with no clicks at all, keep every (padding) row, e.g. to have a loss when training
                the point branch (as with ``auto_freeze``).
        """
        if point_coords is None or point_labels is None:
            return None
        mapping_index = (point_labels != -1).any(1)
        if torch.compiler.is_exporting():
            # an exported program has shapes fixed when it is traced: it takes rows that each hold a click,
            # checked where it runs (a row of padding only is a prompt for the traced eager module instead)
            torch._assert_async(mapping_index.all(), "every prompt row of an exported VISTA3D needs a click")
            return _Clicks(point_coords, point_labels, prompt_class, mapping_index)
        if mapping_index.any():
            rows = prompt_class[mapping_index] if prompt_class is not None else None
            return _Clicks(point_coords[mapping_index], point_labels[mapping_index], rows, mapping_index)
        if self.auto_freeze or keep_padding:
            return _Clicks(point_coords, point_labels, prompt_class, mapping_index.fill_(True))
        return None

    def _features(
        self, input_images: torch.Tensor, with_point: bool, class_vector: torch.Tensor | None, keep_cache: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The point features (the cached ones of this window, or the encoder's point decoder's) and, with a class
        prompt, the class logits."""
        if self.image_embeddings is not None and keep_cache and class_vector is None:
            return self.image_embeddings, None
        fused = self._fused
        if fused is not None and self._use_fused(input_images):
            if class_vector is None:
                return fused.point(input_images), None
            logits, out = fused.class_and_point(input_images, class_vector)
            return out, logits
        out, out_auto = self.image_encoder(input_images, with_point=with_point, with_label=class_vector is not None)
        return out, None if class_vector is None else self.class_head(out_auto, class_vector)[0]

    def _with_clicks(
        self,
        out: torch.Tensor,
        class_logits: torch.Tensor | None,
        clicks: _Clicks,
        patch_coords: list[Sequence[slice]] | None,
        prev_mask: torch.Tensor | None,
        radius: int | None,
        bs: int,
    ) -> torch.Tensor:
        """The logits once the clicks' point-head result is combined with the class logits (given with class prompts)
        or with ``prev_mask``, else scattered into ``bs`` rows."""
        point_logits: torch.Tensor = self.point_head(
            out, clicks.coords, clicks.labels, class_vector=clicks.prompt_class
        )
        args = (point_logits, clicks.coords, clicks.labels, clicks.mapping_index)
        if class_logits is not None:
            if patch_coords is None:
                return self.gaussian_combine(class_logits, *args, radius)
            # sliding-window inference: keep the click regions connected to the clicks
            return self.connected_components_combine(class_logits, *args)
        point_logits = point_logits.to(out.dtype)
        if prev_mask is not None and patch_coords is not None:
            # the clicks edit the previous result; a copy, because MONAI 1.6.1 edited the caller's prev_mask
            # in place, which changes the input of later overlapping windows
            previous = prev_mask[patch_coords[0]].transpose(1, 0).to(point_logits.device, copy=True)
            return self.connected_components_combine(previous, point_logits, *args[1:])
        return self._scatter_point_logits(point_logits, clicks.mapping_index, bs)


# -------------------------------------------------------------------------------------------------------------------
# point head
# -------------------------------------------------------------------------------------------------------------------
class PointMappingSAM(nn.Module):
    """The interactive head of VISTA3D, a 3D version of the mask decoder of Segment Anything
    (https://github.com/facebookresearch/segment-anything).

    The encoder features are downsampled by 2, a two-way transformer attends between them and the click tokens,
    and a hypernetwork maps the mask token to per-voxel weights on the upsampled features.

    Args:
        feature_size: channels of the encoder features (and of the transformer).
        max_prompt: at most this many prompts go through the transformer at once (bounds peak memory).
        n_classes: size of the class embedding table.
        last_supported: classes above this index are zero-shot (they use ``zeroshot_embed``).

    Attributes:
        release_cached_memory: call ``torch.cuda.empty_cache()`` after downsampling the features and before each
            prompt chunk (MONAI 1.6.1 always did); off by default. ``VISTA3D`` sets it from its own option.
    """

    def __init__(self, feature_size: int, max_prompt: int = 32, n_classes: int = 512, last_supported: int = 132):
        super().__init__()
        dim = feature_size
        self.max_prompt = max_prompt
        self.feat_downsample = nn.Sequential(
            nn.Conv3d(feature_size, feature_size, kernel_size=3, stride=2, padding=1),
            nn.InstanceNorm3d(feature_size),
            nn.GELU(),
            nn.Conv3d(feature_size, dim, kernel_size=3, stride=1, padding=1),
            nn.InstanceNorm3d(feature_size),
        )
        # not used by forward; kept because the published checkpoints contain it
        self.mask_downsample = nn.Conv3d(2, 2, kernel_size=3, stride=2, padding=1)
        self.transformer = TwoWayTransformer(depth=2, embedding_dim=dim, mlp_dim=512, num_heads=4)
        self.pe_layer = PositionEmbeddingRandom(dim // 2)
        self.point_embeddings = nn.ModuleList([_embedding(1, dim), _embedding(1, dim)])
        self.not_a_point_embed = _embedding(1, dim)
        self.special_class_embed = _embedding(1, dim)
        self.mask_tokens = _embedding(1, dim)
        self.output_upscaling = nn.Sequential(
            nn.ConvTranspose3d(dim, dim, kernel_size=3, stride=2, padding=1, output_padding=1),
            nn.InstanceNorm3d(dim),
            nn.GELU(),
            nn.Conv3d(dim, dim, kernel_size=3, stride=1, padding=1),
        )
        self.output_hypernetworks_mlps = MLP(dim, dim, dim, 3)
        self.n_classes = n_classes
        self.last_supported = last_supported
        self.class_embeddings = _embedding(n_classes, feature_size)
        self.zeroshot_embed = _embedding(1, dim)
        self.supported_embed = _embedding(1, dim)
        self.release_cached_memory = False

    def _embed_points(self, point_coords: torch.Tensor, point_labels: torch.Tensor, image_size) -> torch.Tensor:
        """``[B, N, dim]`` click tokens: positional encoding plus the embedding of the click type."""
        bad = ((point_labels < -1) | (point_labels > 3)).any()
        rule = "point_labels must be -1 (padding), 0/1 (negative/positive) or 2/3 (special-class negative/positive)"
        if torch.compiler.is_exporting():  # values are unknown while tracing: the exported program checks them
            torch._assert_async(~bad, rule)
        elif bad:
            raise ValueError(f"{rule}, got values {torch.unique(point_labels).tolist()}.")
        # +0.5: a click addresses the centre of its voxel
        embedding = self.pe_layer.forward_with_coords(point_coords + 0.5, image_size)
        neg, pos = _embedding_weight(self.point_embeddings, 0), _embedding_weight(self.point_embeddings, 1)
        special = self.special_class_embed.weight
        # one additive row per label value -1, 0, 1, 2, 3; padding clicks carry no position
        table = torch.cat([self.not_a_point_embed.weight, neg, pos, neg + special, pos + special])
        embedding = torch.where(unsqueeze_right(point_labels == -1, 3), torch.zeros_like(embedding), embedding)
        return embedding + table[point_labels + 1]

    def forward(
        self,
        out: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        class_vector: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Click logits.

        Args:
            out: ``[1, C, H, W, D]`` point-branch features of one image.
            point_coords: ``[B, N, 3]`` clicks in voxel coordinates of ``out``.
            point_labels: ``[B, N]`` labels (-1 padding, 0/1, 2/3).
            class_vector: optional ``[B, 1]`` class of each prompt (selects supported vs zero-shot tokens).

        Returns:
            ``[B, 1, H, W, D]`` logits.
        """
        out_low = self.feat_downsample(out)
        image_size = tuple(out.shape[-3:])
        del out
        if self.release_cached_memory:
            torch.cuda.empty_cache()
        point_embedding = self._embed_points(point_coords, point_labels, image_size)
        n_prompts = point_embedding.shape[0]
        mask_tokens = self.mask_tokens.weight.unsqueeze(0).expand(n_prompts, -1, -1)
        if class_vector is None:
            class_tokens = self.supported_embed.weight.unsqueeze(0).expand(n_prompts, -1, -1)
        else:
            zero_shot = class_vector.reshape(n_prompts, 1, 1) > self.last_supported
            class_tokens = torch.where(zero_shot, self.zeroshot_embed.weight, self.supported_embed.weight)
        tokens_all = torch.cat((mask_tokens, point_embedding, class_tokens), dim=1)

        pos_low = self.pe_layer(out_low.shape[-3:]).unsqueeze(0)
        masks = []
        for start in range(0, n_prompts, self.max_prompt):
            if self.release_cached_memory:
                torch.cuda.empty_cache()
            tokens = tokens_all[start : start + self.max_prompt]
            n = tokens.shape[0]
            src = out_low.repeat(n, 1, 1, 1, 1)
            pos_src = pos_low.repeat(n, 1, 1, 1, 1)
            b, c, h, w, d = src.shape
            hs, src = self.transformer(src, pos_src, tokens)
            hyper_in = self.output_hypernetworks_mlps(hs[:, :1, :])
            upscaled = self.output_upscaling(src.transpose(1, 2).reshape(b, c, h, w, d))
            b, c, h, w, d = upscaled.shape
            mask = hyper_in @ upscaled.view(b, c, h * w * d)
            masks.append(mask.view(-1, 1, h, w, d))
            del src, pos_src, upscaled, hs, hyper_in
        return torch.cat(masks) if len(masks) > 1 else masks[0]


# -------------------------------------------------------------------------------------------------------------------
# class head
# -------------------------------------------------------------------------------------------------------------------
class ClassMappingClassify(nn.Module):
    """The automatic head of VISTA3D: the logit of class ``k`` at a voxel is the dot product of the class embedding
    ``k`` (optionally through an MLP) with the post-processed feature vector of that voxel.

    Args:
        n_classes: size of the class embedding table.
        feature_size: channels of the features and width of the embeddings.
        use_mlp: map the class embeddings through a small MLP.
    """

    def __init__(self, n_classes: int, feature_size: int, use_mlp: bool = True):
        super().__init__()
        self.use_mlp = use_mlp
        if use_mlp:
            self.mlp = nn.Sequential(
                nn.Linear(feature_size, feature_size),
                nn.InstanceNorm1d(1),
                nn.GELU(),
                nn.Linear(feature_size, feature_size),
            )
        self.class_embeddings = _embedding(n_classes, feature_size)
        self.image_post_mapping = nn.Sequential(
            *[
                UnetrBasicBlock(
                    spatial_dims=3,
                    in_channels=feature_size,
                    out_channels=feature_size,
                    kernel_size=3,
                    stride=1,
                    norm_name="instance",
                    res_block=True,
                )
                for _ in range(2)
            ]
        )

    def forward(self, src: torch.Tensor, class_vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits.

        Args:
            src: ``[W, C, H, W, D]`` class-branch features of ``W`` windows.
            class_vector: ``[K, 1]`` class indices.

        Returns:
            ``(logits [K, W, H, W, D], class_embedding [K, 1, C])``. The logits are a transposed view of a
            contiguous ``[W, K, H, W, D]`` tensor, so ``logits.transpose(0, 1)`` (what ``VISTA3D`` does for the
            sliding-window inferers) costs no copy.
        """
        n_win, c, h, w, d = src.shape
        src = self.image_post_mapping(src)
        class_embedding = self.class_embeddings(class_vector)
        if self.use_mlp:
            class_embedding = self.mlp(class_embedding)
        # all classes on all windows in one batched matmul: [K, C] @ [W, C, N] -> [W, K, N] (the matrix broadcasts
        # over the windows); reshape instead of squeeze so that K == 1 or C == 1 keep their dimension
        logits = torch.matmul(class_embedding.reshape(-1, c), src.view(n_win, c, h * w * d))
        return logits.view(n_win, -1, h, w, d).transpose(0, 1), class_embedding


# -------------------------------------------------------------------------------------------------------------------
# transformer of the point head (Segment Anything's two-way transformer in 3D)
# -------------------------------------------------------------------------------------------------------------------
class TwoWayTransformer(nn.Module):
    """Alternating token-to-image and image-to-token attention between prompt tokens and image features.

    Args:
        depth: number of :py:class:`TwoWayAttentionBlock` layers.
        embedding_dim: channels of tokens and image features.
        num_heads: attention heads (must divide ``embedding_dim // attention_downsample_rate``).
        mlp_dim: hidden width of the token MLP.
        activation: activation of the token MLP.
        attention_downsample_rate: the cross attentions project to ``embedding_dim // rate`` channels.
    """

    def __init__(
        self,
        depth: int,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int,
        activation: tuple | str = "relu",
        attention_downsample_rate: int = 2,
    ) -> None:
        super().__init__()
        self.depth = depth
        self.embedding_dim = embedding_dim
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.layers = nn.ModuleList(
            TwoWayAttentionBlock(
                embedding_dim=embedding_dim,
                num_heads=num_heads,
                mlp_dim=mlp_dim,
                activation=activation,
                attention_downsample_rate=attention_downsample_rate,
                skip_first_layer_pe=(i == 0),
            )
            for i in range(depth)
        )
        self.final_attn_token_to_image = Attention(embedding_dim, num_heads, downsample_rate=attention_downsample_rate)
        self.norm_final_attn = nn.LayerNorm(embedding_dim)

    def forward(
        self, image_embedding: torch.Tensor, image_pe: torch.Tensor, point_embedding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            image_embedding: ``[B, C, *spatial]`` image features.
            image_pe: ``[B, C, *spatial]`` their positional encoding.
            point_embedding: ``[B, T, C]`` prompt tokens.

        Returns:
            ``(tokens [B, T, C], image tokens [B, prod(spatial), C])``.
        """
        keys = image_embedding.flatten(2).permute(0, 2, 1)
        key_pe = image_pe.flatten(2).permute(0, 2, 1)
        queries = point_embedding
        for layer in self.layers:
            queries, keys = layer(queries=queries, keys=keys, query_pe=point_embedding, key_pe=key_pe)
        attn_out = self.final_attn_token_to_image(q=queries + point_embedding, k=keys + key_pe, v=keys)
        queries = self.norm_final_attn(queries + attn_out)
        return queries, keys


class TwoWayAttentionBlock(nn.Module):
    """Token self-attention, token-to-image attention, token MLP, image-to-token attention; each with a residual
    connection and a LayerNorm.

    Args:
        embedding_dim: channels of tokens and image features.
        num_heads: attention heads.
        mlp_dim: hidden width of the token MLP.
        activation: activation of the token MLP.
        attention_downsample_rate: channel reduction of the cross attentions.
        skip_first_layer_pe: the self-attention does not add the positional encoding and has no residual.
    """

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int = 2048,
        activation: tuple | str = "relu",
        attention_downsample_rate: int = 2,
        skip_first_layer_pe: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(embedding_dim, num_heads)
        self.norm1 = nn.LayerNorm(embedding_dim)
        self.cross_attn_token_to_image = Attention(embedding_dim, num_heads, downsample_rate=attention_downsample_rate)
        self.norm2 = nn.LayerNorm(embedding_dim)
        self.mlp = MLPBlock(hidden_size=embedding_dim, mlp_dim=mlp_dim, act=activation, dropout_mode="vista3d")
        self.norm3 = nn.LayerNorm(embedding_dim)
        self.norm4 = nn.LayerNorm(embedding_dim)
        self.cross_attn_image_to_token = Attention(embedding_dim, num_heads, downsample_rate=attention_downsample_rate)
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor, query_pe: torch.Tensor, key_pe: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.skip_first_layer_pe:
            queries = self.self_attn(q=queries, k=queries, v=queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q=q, k=q, v=queries)
        queries = self.norm1(queries)

        k = keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(q=queries + query_pe, k=k, v=keys))
        queries = self.norm3(queries + self.mlp(queries))
        keys = self.norm4(keys + self.cross_attn_image_to_token(q=k, k=queries + query_pe, v=queries))
        return queries, keys


class Attention(nn.Module):
    """Multi-head attention whose projections may reduce the width to ``embedding_dim // downsample_rate``.

    Args:
        embedding_dim: input and output channels.
        num_heads: attention heads; must divide the projected width.
        downsample_rate: width reduction of the projections.
    """

    def __init__(self, embedding_dim: int, num_heads: int, downsample_rate: int = 1) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.internal_dim = embedding_dim // downsample_rate
        self.num_heads = num_heads
        if self.internal_dim % num_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must divide embedding_dim // downsample_rate ({self.internal_dim})."
            )
        self.q_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.k_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.v_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.out_proj = nn.Linear(self.internal_dim, embedding_dim)

    def _separate_heads(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        """``[B, T, C] -> [B, heads, T, C / heads]``."""
        b, n, c = x.shape
        return x.reshape(b, n, num_heads, c // num_heads).transpose(1, 2)

    def _recombine_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, heads, T, C / heads] -> [B, T, C]``."""
        b, heads, n, c = x.shape
        return x.transpose(1, 2).reshape(b, n, heads * c)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = self._separate_heads(self.q_proj(q), self.num_heads)
        k = self._separate_heads(self.k_proj(k), self.num_heads)
        v = self._separate_heads(self.v_proj(v), self.num_heads)
        attn = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        out: torch.Tensor = torch.softmax(attn, dim=-1) @ v
        out = self.out_proj(self._recombine_heads(out))
        return out


def _embedding(num: int, dim: int) -> nn.Embedding:
    """``nn.Embedding(num, dim)`` with the same N(0, 1) initialisation, skipped on the meta device.

    A network built on the meta device (to count its weights, or to take a checkpoint's tensors) has no values
    to draw; drawing them there would import sympy and dynamo, about a second of a fresh process.
    """
    weight = torch.empty((num, dim))
    if not weight.is_meta:
        nn.init.normal_(weight)
    return nn.Embedding(num, dim, _weight=weight)


def _embedding_weight(embeddings: nn.ModuleList, index: int) -> torch.Tensor:
    """The weight of the ``nn.Embedding`` at ``index`` of ``embeddings`` (torch types the items as plain modules)."""
    embedding = embeddings[index]
    if not isinstance(embedding, nn.Embedding):
        raise TypeError(f"expected an nn.Embedding at index {index}, found {type(embedding).__name__}.")
    return embedding.weight


class PositionEmbeddingRandom(nn.Module):
    """Fourier positional encoding with random (fixed, saved) frequencies, as in Segment Anything.

    Args:
        num_pos_feats: number of frequencies; the encoding has ``2 * num_pos_feats`` channels (sin and cos).
        scale: standard deviation of the frequencies; ``None`` or non-positive means 1.
    """

    positional_encoding_gaussian_matrix: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, num_pos_feats: int = 64, scale: float | None = None) -> None:
        super().__init__()
        if scale is None or scale <= 0.0:
            scale = 1.0
        gaussian = torch.empty((3, num_pos_feats))
        if not gaussian.is_meta:  # on the meta device (shapes only) randn and * would import sympy and dynamo: ~1 s
            gaussian = scale * torch.randn((3, num_pos_feats))
        self.register_buffer("positional_encoding_gaussian_matrix", gaussian)

    def _pe_encoding(self, coords: torch.Tensor) -> torch.Tensor:
        """Encode ``[..., 3]`` coordinates in ``[0, 1]`` as ``[..., 2 * num_pos_feats]``."""
        coords = (2 * coords - 1) @ self.positional_encoding_gaussian_matrix
        coords = 2 * math.pi * coords
        return torch.cat([torch.sin(coords), torch.cos(coords)], dim=-1)

    def forward(self, size: Sequence[int]) -> torch.Tensor:
        """``[2 * num_pos_feats, h, w, d]`` encoding of the voxel centres of an ``h x w x d`` grid."""
        matrix = self.positional_encoding_gaussian_matrix  # its dtype: float32 as upstream, float64 in the tests
        axes = [(torch.arange(n, device=matrix.device, dtype=matrix.dtype) + 0.5) / n for n in size]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)
        return self._pe_encoding(grid).permute(3, 0, 1, 2)

    def forward_with_coords(self, coords_input: torch.Tensor, image_size: Sequence[int]) -> torch.Tensor:
        """``[B, N, 2 * num_pos_feats]`` encoding of ``[B, N, 3]`` voxel coordinates in an image of ``image_size``."""
        size = torch.tensor(list(image_size[:3]), device=coords_input.device)
        coords = coords_input / size
        return self._pe_encoding(coords.to(self.positional_encoding_gaussian_matrix.dtype))


class MLP(nn.Module):
    """A plain MLP with ReLU between layers (the hypernetwork of the point head).

    Args:
        input_dim: input width.
        hidden_dim: width of the hidden layers.
        output_dim: output width.
        num_layers: number of linear layers.
        sigmoid_output: apply a sigmoid to the output.
    """

    def __init__(
        self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int, sigmoid_output: bool = False
    ) -> None:
        super().__init__()
        self.num_layers = num_layers
        dims_in = [input_dim] + [hidden_dim] * (num_layers - 1)
        dims_out = [hidden_dim] * (num_layers - 1) + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims_in, dims_out))
        self.sigmoid_output = sigmoid_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < self.num_layers - 1:
                x = F.relu(x)
        return torch.sigmoid(x) if self.sigmoid_output else x
