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
"""VISTA3D logits -> label map, in one pass over the classes; and logits -> one mask per class.

Gives the result of upstream's ``VistaPostTransformd``: the winning class where its logit is > 0, background
where no class is, channel ``i`` mapped to its prompted label id; a single channel is a thresholded mask.
Instead of a compare-and-assign loop per class, one ``max`` over the channel axis and one table look-up.

The label map keeps one class per voxel, although VISTA3D answers each class on its own (a sigmoid per class):
a hepatic vessel inside the liver is lost to whichever logit is higher. :func:`logits_to_masks` keeps every
class: class ``c`` is set where its own logit is > 0 (the rule the label map applies to a class), so a voxel
may be in several masks. The masks are held bit-packed along the class axis (:class:`ClassMasks`): 8 classes
per byte, 15 bytes a voxel for the 117 classes of "everything", an eighth of one uint8 volume per class.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import torch

__all__ = [
    "logits_to_labels",
    "logits_to_outputs",
    "NAN_LABEL",
    "ClassMasks",
    "logits_to_masks",
    "pack_masks",
    "packed_channels",
]

# Voxels that no prediction window covered (NaN logits of the point inferer) get this label, like the bundle.
NAN_LABEL = 255


def _channels_first(logits: torch.Tensor) -> torch.Tensor:
    """``[C, *spatial]`` logits of one image (a batch of one is unwrapped)."""
    if logits.ndim == 5:
        if logits.shape[0] != 1:
            raise ValueError(f"expected a batch of one, got logits of shape {tuple(logits.shape)}")
        logits = logits[0]
    if logits.ndim < 2:
        raise ValueError(f"logits must be [C, X, Y, Z] (or [C, *spatial]), got shape {tuple(logits.shape)}")
    return logits


def logits_to_labels(
    logits: torch.Tensor,
    label_ids: Sequence[int] | torch.Tensor | None = None,
    nan_value: int = NAN_LABEL,
    dtype: torch.dtype = torch.int16,
) -> torch.Tensor:
    """Turn VISTA3D logits into a label map.

    Args:
        logits: ``[C, X, Y, Z]`` or ``[1, C, X, Y, Z]`` logits before sigmoid (other spatial ranks as
            ``[C, *spatial]``), any float type; NaN marks voxels without a prediction.
        label_ids: ``[C]`` label id of each channel; None numbers the channels 1..C (upstream's behaviour
            without a class prompt).
        nan_value: label of voxels whose (single-channel) logit is NaN.
        dtype: integer type of the result.

    Returns:
        ``[X, Y, Z]`` label map of ``dtype`` on ``logits``' device: 0 where no logit is > 0.
    """
    logits = _channels_first(logits)
    n = logits.shape[0]
    if label_ids is None:
        lut = torch.arange(1, n + 1, dtype=dtype, device=logits.device)
    else:
        lut = torch.as_tensor(label_ids, device=logits.device).reshape(-1).to(dtype)
        if lut.numel() != n:
            raise ValueError(f"{lut.numel()} label ids for {n} logit channels")
    if n == 1:
        x = logits[0]
        out = torch.where(x > 0, lut[0], torch.zeros((), dtype=dtype, device=x.device))
        return out.masked_fill_(torch.isnan(x), nan_value)
    # argmax takes the first channel at ties, as the bundle's argmax does; a NaN channel wins (NaN <= 0 is
    # False), so voxels without a prediction are never background.
    out = lut[logits.argmax(dim=0)]
    return out.masked_fill_((logits <= 0).all(dim=0), 0)


def packed_channels(n_classes: int) -> int:
    """Bytes per voxel of ``n_classes`` bit-packed masks (8 classes a byte)."""
    return math.ceil(n_classes / 8)


_BITS = (1, 2, 4, 8, 16, 32, 64, 128)


def pack_masks(logits: torch.Tensor) -> torch.Tensor:
    """Threshold each class of ``[C, *spatial]`` logits on its own (> 0) and pack 8 classes a byte.

    Class ``c`` is bit ``c % 8`` of channel ``c // 8``. NaN logits (voxels without a prediction) are 0. The
    classes are packed 8 at a time, so besides the result only 8 boolean channels are held.

    Returns:
        ``[ceil(C / 8), *spatial]`` uint8 on ``logits``' device.
    """
    if logits.ndim < 2:
        raise ValueError(f"logits must be [C, *spatial], got shape {tuple(logits.shape)}")
    n = logits.shape[0]
    out = torch.empty((packed_channels(n), *logits.shape[1:]), dtype=torch.uint8, device=logits.device)
    bits = torch.tensor(_BITS, dtype=torch.uint8, device=logits.device)
    for g in range(out.shape[0]):
        group = logits[8 * g : 8 * g + 8] > 0
        weights = bits[: group.shape[0]].view(-1, *([1] * (logits.ndim - 1)))
        torch.sum(group * weights, dim=0, dtype=torch.uint8, out=out[g])  # distinct bits: the sum is an OR
    return out


class ClassMasks(Mapping):
    """One binary mask per class, bit-packed along the class axis; a mapping label id -> ``[*spatial]`` bool.

    ``masks[label_id]`` unpacks that class's mask (a new tensor on the masks' device); iterating gives the label
    ids in prompt order; :meth:`dense` gives all masks as one ``[C, *spatial]`` tensor (C bytes a voxel).

    Args:
        packed: ``[ceil(C / 8), *spatial]`` uint8, class ``i`` (the ``i``-th of ``label_ids``) in bit ``i % 8``
            of channel ``i // 8`` (what :func:`pack_masks` gives).
        label_ids: the label id of each class, in channel order, without duplicates.

    Attributes:
        packed: the packed masks.
        label_ids: the label ids, in channel order.
    """

    def __init__(self, packed: torch.Tensor, label_ids: Sequence[int] | torch.Tensor):
        ids = tuple(int(i) for i in torch.as_tensor(label_ids).reshape(-1).tolist())
        if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.ndim < 2:
            what = getattr(packed, "shape", packed)
            raise ValueError(f"packed masks must be a [G, *spatial] uint8 tensor, got {what}")
        if packed.shape[0] != packed_channels(len(ids)):
            need = packed_channels(len(ids))
            raise ValueError(f"{len(ids)} classes need {need} packed channels, got {packed.shape[0]}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"label ids must be unique, got {list(ids)}")
        self.packed = packed
        self.label_ids = ids
        self._index = {i: k for k, i in enumerate(ids)}

    def __getitem__(self, label_id: int) -> torch.Tensor:
        if int(label_id) not in self._index:
            raise KeyError(
                f"no mask for label {int(label_id)}: the masks are of the requested classes {sorted(self._index)}; "
                "request it (classes=...) to get its mask"
            )
        k = self._index[int(label_id)]
        return (self.packed[k // 8] & _BITS[k % 8]) != 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.label_ids)

    def __len__(self) -> int:
        return len(self.label_ids)

    def __repr__(self) -> str:
        return f"ClassMasks({len(self)} classes, spatial {tuple(self.spatial_shape)}, {self.packed.device})"

    @property
    def spatial_shape(self) -> torch.Size:
        """The masks' spatial shape."""
        return self.packed.shape[1:]

    def dense(self, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """All masks as one ``[C, *spatial]`` tensor of ``dtype`` (0/1), classes in :attr:`label_ids` order."""
        out = torch.empty((len(self), *self.spatial_shape), dtype=dtype, device=self.packed.device)
        for k in range(len(self)):
            out[k] = (self.packed[k // 8] & _BITS[k % 8]) != 0
        return out

    def to(self, device: torch.device | str) -> ClassMasks:
        """The same masks on ``device``."""
        return ClassMasks(self.packed.to(device), self.label_ids)


def logits_to_masks(logits: torch.Tensor, label_ids: Sequence[int] | torch.Tensor | None = None) -> ClassMasks:
    """Turn VISTA3D logits into one mask per class, each thresholded on its own (logit > 0).

    Where :func:`logits_to_labels` gives a voxel to the class whose logit is highest, here every class whose
    logit is > 0 keeps the voxel, so the label map's class ``i`` is always inside mask ``i``, and the label map
    is background exactly where no mask is set (NaN voxels aside: they are in no mask, and 255 in a
    single-class label map).

    Args:
        logits: ``[C, *spatial]`` or ``[1, C, *spatial]`` logits (before sigmoid), any float type.
        label_ids: ``[C]`` label id of each channel; None numbers them 1..C.

    Returns:
        the :class:`ClassMasks` on ``logits``' device.
    """
    logits = _channels_first(logits)
    n = logits.shape[0]
    ids = list(range(1, n + 1)) if label_ids is None else torch.as_tensor(label_ids).reshape(-1).tolist()
    if len(ids) != n:
        raise ValueError(f"{len(ids)} label ids for {n} logit channels")
    return ClassMasks(pack_masks(logits), ids)


def logits_to_outputs(
    logits: torch.Tensor,
    label_ids: Sequence[int] | None,
    point_coords: torch.Tensor | None = None,
    point_labels: torch.Tensor | None = None,
    masks: bool = False,
    nan_value: int = NAN_LABEL,
) -> tuple[torch.Tensor, ClassMasks | None]:
    """A prompt's logits -> ``([X, Y, Z] int16 label map, one mask per class or None)`` on ``logits``' device
    (upstream's ``VistaPostTransformd``, and :func:`logits_to_masks` when ``masks``); ``nan_value`` labels the voxels
    whose single-channel logit is NaN (no window reached them).

    A point-only prompt (no class) first keeps only the connected components that hold a positive point; that edits
    ``logits`` in place.
    """
    if point_coords is not None and point_labels is not None and label_ids is None:
        from monai.transforms.utils import keep_components_with_positive_points

        logits = keep_components_with_positive_points(
            logits.float(), point_coords=point_coords.to(logits.device), point_labels=point_labels.to(logits.device)
        )
    return logits_to_labels(logits, label_ids, nan_value), logits_to_masks(logits, label_ids) if masks else None
