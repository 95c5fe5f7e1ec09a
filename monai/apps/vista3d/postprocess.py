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
"""VISTA3D logits -> label map, in one pass over the classes.

Gives the result of upstream's ``VistaPostTransformd``: the winning class where its logit is > 0, background
where no class is, channel ``i`` mapped to its prompted label id; a single channel is a thresholded mask.
Instead of a compare-and-assign loop per class, one ``max`` over the channel axis and one table look-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["logits_to_labels", "NAN_LABEL"]

# Voxels that no prediction window covered (NaN logits of the point inferer) get this label, like the bundle.
NAN_LABEL = 255


def logits_to_labels(
    logits: torch.Tensor,
    label_ids: Sequence[int] | torch.Tensor | None = None,
    nan_value: int = NAN_LABEL,
    dtype: torch.dtype = torch.int16,
) -> torch.Tensor:
    """Turn VISTA3D logits into a label map.

    Args:
        logits: ``[C, X, Y, Z]`` or ``[1, C, X, Y, Z]`` logits (before sigmoid), any float type; NaN marks
            voxels without a prediction.
        label_ids: ``[C]`` label id of each channel; None numbers the channels 1..C (upstream's behaviour
            without a class prompt).
        nan_value: label of voxels whose (single-channel) logit is NaN.
        dtype: integer type of the result.

    Returns:
        ``[X, Y, Z]`` label map of ``dtype`` on ``logits``' device: 0 where no logit is > 0.
    """
    if logits.ndim == 5:
        if logits.shape[0] != 1:
            raise ValueError(f"expected a batch of one, got logits of shape {tuple(logits.shape)}")
        logits = logits[0]
    if logits.ndim != 4:
        raise ValueError(f"logits must be [C, X, Y, Z], got shape {tuple(logits.shape)}")
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
    # torch.max propagates NaN (and its index), so a NaN channel wins, as in the bundle's argmax.
    best, idx = logits.max(dim=0)
    out = lut[idx]
    return out.masked_fill_(best <= 0, 0)
