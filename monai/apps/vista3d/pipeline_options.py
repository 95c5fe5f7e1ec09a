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
"""The per-run options of a :class:`~monai.apps.vista3d.pipeline.Vista3DPipeline`, in one frozen dataclass that
checks itself when it is built (:mod:`~monai.apps.vista3d.job`'s checks: a bad value names its field)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .job import check_nonfinite, check_output_dtype, check_overlap, check_roi_size, check_sw_batch_size
from .nifti_write import DEFAULT_OUTPUT_DTYPE

__all__ = ["PipelineOptions"]


@dataclass(frozen=True)
class PipelineOptions:
    """The per-run options of a :class:`~.pipeline.Vista3DPipeline` (what its ``replace`` changes); every field
    is also a keyword of the pipeline.

    Attributes:
        roi_size: sliding-window size, one int for a cube or three (the bundle's 128³); multiples of 16.
        overlap: window overlap (the bundle's 0.25).
        sw_batch_size: windows per network call, or ``"auto"`` (see :mod:`monai.inferers.batch_size`).
        amp: float16 autocast on CUDA; None means on for CUDA, off for CPU.
        progress: a progress bar over the windows.
        timing: ask the sliding-window inferer for its own stage timings (``inference/<stage>``).
        output_dtype: voxel type of saved label maps: ``"uint8"`` (default; every label id and the 255 sentinel
            fit), ``"int16"``, or ``"float32"`` (what the bundle writes, 4x the bytes).
        streaming: class prompts go through the streamed label-map path (:meth:`~Vista3DPipeline.infer_labels`),
            which never holds all classes' logits for the whole volume; False keeps upstream's full-logits path
            with its out-of-memory fallback (``infer`` + ``postprocess``). Point prompts always use the latter.
        nonfinite: how files with NaN/Inf voxels are read: ``"air"`` (-1000 HU, with a warning that counts them)
            or ``"error"`` (refused).
        per_class: also give one mask per prompted class (``SegmentationResult.masks``; ``segment_file`` writes
            them), each class thresholded on its own (logit > 0), so a voxel may be in several; on the streamed
            path they add ``ceil(C / 8)`` bytes a voxel (bit-packed) to the label map's memory. Needs a class
            prompt (with points: the clicked object's class).

    Raises:
        SettingError: a value that cannot be used; the message names the field (``roi_size must be ...``). The
            window's multiple of 16 and its fit on the device are the pipeline's checks, which know the network.
    """

    roi_size: int | Sequence[int] = (128, 128, 128)
    overlap: float = 0.25
    sw_batch_size: int | str = 1
    amp: bool | None = None
    progress: bool = False
    timing: bool = True
    output_dtype: str = DEFAULT_OUTPUT_DTYPE
    streaming: bool = True
    nonfinite: str = "air"
    per_class: bool = False

    def __post_init__(self):
        resolved = {
            "roi_size": check_roi_size(self.roi_size),
            "overlap": check_overlap(self.overlap),
            "sw_batch_size": check_sw_batch_size(self.sw_batch_size),
            "output_dtype": check_output_dtype(self.output_dtype),
            "nonfinite": check_nonfinite(self.nonfinite),
            "amp": None if self.amp is None else bool(self.amp),
            "progress": bool(self.progress),
            "timing": bool(self.timing),
            "streaming": bool(self.streaming),
            "per_class": bool(self.per_class),
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)  # frozen: the checked value replaces the given one, once
