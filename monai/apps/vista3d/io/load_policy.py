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
"""How a pipeline reads an image for its device, and brings it to the layout it computes in: the one load policy
of the command line, ``run_batch`` and ``segment_file``."""

from __future__ import annotations

import os
from typing import Any

import torch

from monai.apps.vista3d.config import DicomOptions

from .image_geometry import ImageGeometry
from .input_kind import input_kind
from .nifti import load_image

__all__ = ["load_options", "load_input", "as_compute_layout"]


def load_options(device: torch.device) -> dict[str, Any]:
    """Keyword arguments of :func:`~.nifti.load_image` for images computed on ``device``: the one load policy.

    An accelerator gets the stored values in file order and converts them itself (only the stored bytes cross,
    slab by slab while the file inflates; :meth:`Vista3DPipeline.preprocess` converts them there). On the CPU
    the file is converted to float32 in C order while it inflates, since resampling a strided image there is
    slow.
    """
    return {} if torch.device(device).type == "cpu" else {"dtype": None, "contiguous": False}


def load_input(
    path: str | os.PathLike,
    device: torch.device,
    volume_index: int | None = None,
    nonfinite: str = "air",
    dicom: DicomOptions | None = None,
) -> tuple[torch.Tensor, ImageGeometry]:
    """Read a NIfTI file or a DICOM image for a pipeline on ``device``: ``([1, X, Y, Z] HU, ImageGeometry)``.

    What :meth:`Vista3DPipeline.load`, :meth:`Vista3DPipeline.segment_file` and the batch driver's loader
    thread all call, so the command line, ``run_batch``, ``segment_file`` and the server read an image the same way.
    A folder, a zip archive (known by its name or its bytes) or a DICOM file is read as DICOM
    (:func:`~.dicom.load_dicom`, with ``dicom``'s options; its ``volume_index`` and ``nonfinite`` do not apply),
    anything else as NIfTI.
    """
    if input_kind(path) == "dicom":
        from .dicom import load_dicom  # pydicom and highdicom: only where DICOM is read

        return load_dicom(path, dicom, device=device)
    return load_image(path, volume_index=volume_index, device=device, nonfinite=nonfinite, **load_options(device))


def as_compute_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous floating tensor (float32 unless it is floating already), in one pass over the volume.

    A file-order image (see :func:`load_input`) is cast and re-laid out by the same copy (resampling strided data
    is slow); one that is both already is returned as it is.
    """
    if x.dtype.is_floating_point:
        return x.contiguous()  # (Tensor.to returns a strided tensor of the same type as it is)
    return x.to(dtype=torch.float32, memory_format=torch.contiguous_format)
