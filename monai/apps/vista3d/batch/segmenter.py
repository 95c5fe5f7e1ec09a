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
"""What segments each image of a batch: the pipeline of a :class:`~monai.apps.vista3d.core.job.SegmentJob` (built
by the run on each rank), or a :class:`Segmenter` the caller built: a pipeline with its prompt
(:class:`PipelineSegmenter`) or the caller's own function (:class:`FunctionSegmenter`).

Each says once where its images are read to and how they are read and written (``device``, ``nonfinite``,
``output_dtype``, ``mask_ids``); the run reads those and nothing else decides them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from monai.apps.vista3d.config import DEFAULT_OUTPUT_DTYPE, check_nonfinite, check_output_dtype
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.core.progress import text_bar
from monai.apps.vista3d.core.prompts import Prompt, parse_prompt
from monai.apps.vista3d.core.results import SegmentationResult
from monai.apps.vista3d.io.image_geometry import ImageGeometry

__all__ = [
    "Segmenter",
    "PipelineSegmenter",
    "FunctionSegmenter",
    "pipeline_segment_fn",
    "as_segmenter",
    "labels_and_info",
]


@runtime_checkable
class Segmenter(Protocol):
    """What :func:`~monai.apps.vista3d.batch.run.run_batch` calls on each image: ``(image, geometry)`` to a label
    map, a :class:`~monai.apps.vista3d.core.results.SegmentationResult`, or ``(labels, {"windows": ...})``.

    Attributes:
        device: where its images are read to.
        nonfinite: how NaN/Inf voxels are read (``"air"`` or ``"error"``).
        output_dtype: the label maps' voxel type on disk.
        mask_ids: the classes whose masks each image gets, or None.
    """

    # read-only members (properties), so that a frozen dataclass such as FunctionSegmenter is a Segmenter too

    @property
    def device(self) -> torch.device: ...

    @property
    def nonfinite(self) -> str: ...

    @property
    def output_dtype(self) -> str: ...

    @property
    def mask_ids(self) -> list[int] | None: ...

    def __call__(self, image: torch.Tensor, geometry: ImageGeometry) -> Any: ...


class PipelineSegmenter:
    """A :class:`Vista3DPipeline` with the prompt of every image; its options say how images are read and written.

    Args:
        pipeline: the pipeline to run.
        prompt: the parsed prompt of every image.
    """

    def __init__(self, pipeline: Vista3DPipeline, prompt: Prompt):
        self.pipeline, self.prompt = pipeline, prompt
        options = pipeline.options
        self.device: torch.device = pipeline.device
        self.nonfinite, self.output_dtype = options.nonfinite, options.output_dtype
        self.mask_ids: list[int] | None = list(prompt.label_ids or []) if options.per_class else None

    def show_image(self, k: int, n: int, path: Path, rank: int, world: int) -> None:
        """Name image ``k`` of ``n`` in the pipeline's window progress bar (``images [###---] 2/7 ct.nii.gz |
        windows``; under torchrun the rank's line)."""
        if not self.pipeline.progress:
            return
        if world == 1:
            self.pipeline.progress_label = f"images {text_bar(k - 1, n)} {k}/{n} {path.name} | windows"
        else:
            self.pipeline.progress_label = f"[rank {rank}] [{k}] {path.name} windows"

    def __call__(self, image: torch.Tensor, geometry: ImageGeometry) -> SegmentationResult:
        return self.pipeline.segment(image, geometry.affine, self.prompt)


def pipeline_segment_fn(
    pipe: Vista3DPipeline, classes: Any = "everything", points: Any = None, point_labels: Any = None
) -> PipelineSegmenter:
    """A :class:`PipelineSegmenter` of an existing pipeline; the prompt is parsed here."""
    return PipelineSegmenter(pipe, parse_prompt(classes, points, point_labels))


@dataclass(frozen=True)
class FunctionSegmenter:
    """A caller's ``fn(image [1, X, Y, Z] float32 on the CPU, geometry)`` as a :class:`Segmenter`.

    Attributes:
        fn: returns the ``[X, Y, Z]`` labels on the input grid, a ``SegmentationResult``, or
            ``(labels, {"windows": ..., "timings": ...})``.
        output_dtype: the label maps' voxel type on disk.
        nonfinite: how NaN/Inf voxels are read.
    """

    fn: Callable[[torch.Tensor, ImageGeometry], Any]
    output_dtype: str = DEFAULT_OUTPUT_DTYPE
    nonfinite: str = "air"
    device: torch.device = torch.device("cpu")
    mask_ids: list[int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_dtype", check_output_dtype(self.output_dtype))
        object.__setattr__(self, "nonfinite", check_nonfinite(self.nonfinite))

    def __call__(self, image: torch.Tensor, geometry: ImageGeometry) -> Any:
        return self.fn(image, geometry)


def as_segmenter(segment_fn: Any) -> SegmentJob | Segmenter:
    """What segments each image, checked before any work: a :class:`SegmentJob` or a :class:`Segmenter` as it
    is, a plain function as a :class:`FunctionSegmenter`.

    Raises:
        TypeError: a bare pipeline (it has no prompt) or anything that cannot be called.
    """
    if segment_fn is None:
        return SegmentJob()
    if isinstance(segment_fn, (SegmentJob, PipelineSegmenter, FunctionSegmenter)):
        return segment_fn
    if isinstance(segment_fn, Vista3DPipeline):
        raise TypeError("a Vista3DPipeline has no prompt: give pipeline_segment_fn(pipe, classes) to run_batch, or a "
                        "SegmentJob")
    if not callable(segment_fn):
        raise TypeError(f"segment_fn must be a SegmentJob, a Segmenter or a function fn(image, geometry), got "
                        f"{type(segment_fn).__name__}")
    if isinstance(segment_fn, Segmenter):
        return segment_fn
    return FunctionSegmenter(segment_fn)


def labels_and_info(result: Any) -> tuple[Any, dict[str, Any]]:
    """What a segmenter returned, as ``(labels, {"windows", "sw_batch_size", "stages", "masks"})``."""
    if isinstance(result, SegmentationResult):
        return result.labels, {"windows": result.windows, "sw_batch_size": result.sw_batch_size,
                               "stages": result.timings, "masks": result.masks}
    if isinstance(result, tuple):
        labels, info = result
        info = dict(info or {})
        return labels, {"windows": info.get("windows"), "stages": info.get("timings") or {}}
    return result, {}
