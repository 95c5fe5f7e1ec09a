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
"""What a pipeline gives back for one image: its stages, and the :class:`SegmentationResult`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from monai.apps.vista3d.io.image_geometry import ImageGeometry

from .postprocess import ClassMasks
from .preprocess import PreprocessRecord

__all__ = ["STAGES", "SegmentationResult"]

#: the stages of one image, in order (``inference`` has the sliding-window stages as ``inference/<stage>``)
STAGES = ("load", "preprocess", "inference", "postprocess", "invert", "save")


@dataclass
class SegmentationResult:
    """One image's segmentation and what it cost.

    Attributes:
        labels: ``[X, Y, Z]`` int16 label map on the input grid (the pipeline's ``unreached_label``, 0 unless asked,
            where no point window predicted).
        timings: seconds per stage (see :data:`STAGES`), plus ``inference/<stage>`` when measured.
        windows: sliding windows run.
        sw_batch_size: windows per network call (the largest batch; what ``"auto"`` chose).
        record: the preprocessing record (grids of each stage, what inverting needs).
        output: the file written, when the result was saved.
        masks: with ``per_class``, one mask per prompted class on the input grid (label id -> ``[X, Y, Z]``
            bool, see :class:`~monai.apps.vista3d.core.postprocess.ClassMasks`); None otherwise.
        mask_outputs: label id -> the mask file written, when the masks were saved.
        geometry: the input file's affine and header, when the image was read from a file (what saving needs).
    """

    labels: torch.Tensor
    timings: dict[str, float]
    windows: int
    sw_batch_size: int
    record: PreprocessRecord
    output: Path | None = None
    masks: ClassMasks | None = None
    mask_outputs: dict[int, Path] | None = None
    geometry: ImageGeometry | None = None
