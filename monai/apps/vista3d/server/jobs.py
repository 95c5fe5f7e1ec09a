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

A job reads the image (NIfTI and a zip of a DICOM series through the pipeline's own load, NRRD through
:func:`~.images.load_nrrd`) and calls ``Vista3DPipeline.segment`` or a ``Vista3DSession``; an inference job also
takes the structures' statistics here, while the image and its label map are on the device. The answer is written by
the request afterwards, off this thread, while the next job runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from monai.apps.vista3d.core.feasibility import check_image
from monai.apps.vista3d.core.prompts import Prompt
from monai.apps.vista3d.core.session import Vista3DSession
from monai.apps.vista3d.core.statistics import structure_statistics
from monai.apps.vista3d.errors import DicomChoiceError, ResourceError, Vista3DInputError
from monai.apps.vista3d.io.image_geometry import as_xyz

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
    if fmt == "dicom":
        return _load_dicom_zip(pipeline, path, name)
    image, affine, placement = load_nrrd(path)
    return image, affine, LoadedImage(name, "nrrd", as_xyz(image.shape[1:]), placement)


def _load_dicom_zip(pipeline: Any, path: Path, name: str) -> tuple[torch.Tensor, Any, LoadedImage]:
    """A checked zip of a DICOM series, read by the pipeline's load (which knows a zip by its bytes); its label map
    is answered as NIfTI on the series' grid. The reader's refusals are said without the scratch path, and without
    the command line's options, which a request does not have."""
    try:
        image, geometry = pipeline.load(path)
    except DicomChoiceError as e:
        remedy = "send a zip of one series" if e.option == "series" else "VISTA3D segments CT: send a CT series"
        raise ServeError(422, f"the zip archive {e.problem}; {remedy}") from None
    except Vista3DInputError as e:
        raise ServeError(422, str(e).replace(f"{path}: ", "the zip archive: ", 1)) from None
    return image, geometry.affine, LoadedImage(name, "nifti", tuple(geometry.spatial_shape), geometry)


def segment(path: Path, fmt: str, name: str, prompt: Prompt, statistics: bool = False
            ) -> Callable[[Any], tuple[torch.Tensor, LoadedImage, dict, dict | None]]:
    """The job of one inference request: ``(label map on the input grid, LoadedImage, seconds per stage, the
    structures' statistics or None)``; the statistics (``statistics=True``) are computed where the image and the
    label map are, as ``vista3d --statistics`` computes them."""

    def job(pipeline: Any) -> tuple[torch.Tensor, LoadedImage, dict, dict | None]:
        start = time.perf_counter()
        image, affine, loaded = load(pipeline, path, fmt, name)
        seconds = time.perf_counter() - start
        result = pipeline.segment(image, affine, prompt)
        timings = {"load": seconds, **result.timings}
        stats = None
        if statistics:
            start = time.perf_counter()
            stats = structure_statistics(image, result.labels.to(pipeline.device), affine)  # image moves there
            timings["statistics"] = time.perf_counter() - start
        return result.labels, loaded, timings, stats

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
