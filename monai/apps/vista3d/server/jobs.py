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
"""What runs on the model's thread: library calls only, each a function of the pipeline.

A job reads the image (NIfTI through the pipeline's own load, NRRD through :func:`~.images.load_nrrd`) and calls
``Vista3DPipeline.segment`` or a ``Vista3DSession``; the answer is written by the request afterwards, off this
thread, while the next job runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..core.feasibility import check_image
from ..core.prompts import Prompt
from ..core.session import Vista3DSession
from ..errors import ResourceError
from .errors import ServeError
from .images import LoadedImage, load_nrrd

__all__ = ["load", "segment", "open_session", "click"]


def load(pipeline: Any, path: Path, fmt: str, name: str) -> tuple[torch.Tensor, Any, LoadedImage]:
    """``(image [1, X, Y, Z], RAS affine, LoadedImage)`` of a checked file, on the pipeline's device.

    Raises:
        ServeError: 413 for a NIfTI image that cannot fit in the memory there (read from its header, before the
            load), as ``segment_file`` refuses it.
    """
    if fmt == "nifti":
        try:
            check_image(path, pipeline.device)
        except ResourceError as e:  # its message starts with the scratch path, which is no business of the client
            raise ServeError(413, str(e).replace(f"{path}: ", "the image: ", 1)) from None
        image, geometry = pipeline.load(path)  # the pipeline's one load policy, as for a file it segments
        return image, geometry.affine, LoadedImage(name, "nifti", tuple(geometry.spatial_shape), geometry)
    image, affine, placement = load_nrrd(path)
    return image, affine, LoadedImage(name, "nrrd", tuple(image.shape[1:]), placement)


def segment(path: Path, fmt: str, name: str, prompt: Prompt) -> Callable[[Any], tuple[torch.Tensor, LoadedImage, dict]]:
    """The job of one inference request: ``(label map on the input grid, LoadedImage, seconds per stage)``."""

    def job(pipeline: Any) -> tuple[torch.Tensor, LoadedImage, dict]:
        start = time.perf_counter()
        image, affine, loaded = load(pipeline, path, fmt, name)
        seconds = time.perf_counter() - start
        result = pipeline.segment(image, affine, prompt)
        return result.labels, loaded, {"load": seconds, **result.timings}

    return job


def open_session(path: Path, fmt: str, name: str) -> Callable[[Any], tuple[Vista3DSession, LoadedImage]]:
    """The job of a new click session: the image loaded and preprocessed once."""

    def job(pipeline: Any) -> tuple[Vista3DSession, LoadedImage]:
        image, affine, loaded = load(pipeline, path, fmt, name)
        return Vista3DSession(pipeline, image, affine), loaded

    return job


def click(session: Vista3DSession, points: Any, labels: Any, object_class: Any, reset: bool
          ) -> Callable[[Any], torch.Tensor]:
    """The job of one click request: the object's label map on the input grid after the new clicks."""

    def job(pipeline: Any) -> torch.Tensor:
        if reset:
            session.reset()
        return session.click(points, labels, classes=object_class)

    return job
