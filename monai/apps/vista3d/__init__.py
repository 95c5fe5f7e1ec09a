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
"""VISTA3D inference: the upstream point-window inferer, and this fork's segmentation pipeline around it.

The names users call are listed here; everything else is imported from its room: ``io`` (images and label maps
on disk), ``core`` (one image: prompts, pre/post-processing, window passes, the pipeline, click sessions),
``batch`` (many images in one run), ``cli`` (the ``vista3d`` command) and ``server`` (``vista3d serve``);
``config`` holds every setting and its check, ``errors`` every error. The pipeline's names are imported on
first use, so ``import monai.apps.vista3d`` stays cheap for the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from monai.utils.module import not_carried_names

from .inferer import point_based_window_inferer

if TYPE_CHECKING:
    from .batch.run import run_batch
    from .batch.summary import BatchResult
    from .config import BatchOptions, PipelineOptions
    from .core.job import SegmentJob
    from .core.pipeline import Vista3DPipeline
    from .core.postprocess import logits_to_labels
    from .core.prompts import Prompt, parse_prompt
    from .core.results import SegmentationResult
    from .core.session import Vista3DSession
    from .core.streaming import sliding_window_label_inference
    from .io.nifti import load_image
    from .io.nifti_write import save_class_masks, save_label_map

#: each public name and the room that defines it
_ROOMS = {
    "Vista3DPipeline": "core.pipeline",
    "Vista3DSession": "core.session",
    "SegmentationResult": "core.results",
    "Prompt": "core.prompts",
    "parse_prompt": "core.prompts",
    "PipelineOptions": "config",
    "BatchOptions": "config",
    "SegmentJob": "core.job",
    "run_batch": "batch.run",
    "BatchResult": "batch.summary",
    "load_image": "io.nifti",
    "save_label_map": "io.nifti_write",
    "save_class_masks": "io.nifti_write",
    "sliding_window_label_inference": "core.streaming",
    "logits_to_labels": "core.postprocess",
}

__all__ = [
    "point_based_window_inferer",
    "Vista3DPipeline",
    "Vista3DSession",
    "SegmentationResult",
    "Prompt",
    "parse_prompt",
    "PipelineOptions",
    "BatchOptions",
    "SegmentJob",
    "run_batch",
    "BatchResult",
    "load_image",
    "save_label_map",
    "save_class_masks",
    "sliding_window_label_inference",
    "logits_to_labels",
]


_not_carried = not_carried_names(__name__)  # upstream's other names (sample_prompt_pairs, ...) are refused clearly


def __getattr__(name: str) -> Any:
    if name in _ROOMS:
        return getattr(importlib.import_module(f".{_ROOMS[name]}", __name__), name)
    return _not_carried(name)
