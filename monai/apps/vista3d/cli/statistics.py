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
"""``vista3d statistics CT LABELS``: the statistics of an existing label map (VISTA3D's or another tool's) over its
CT, the same as ``segment --statistics`` writes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from .parser import UsageError

__all__ = ["run_statistics", "read_label_names"]


def read_label_names(path: str) -> dict[int, str]:
    """Label id -> name from a JSON file: ``{"1": "liver"}`` or ``{"liver": 1}`` (TotalSegmentator's class maps
    have the first form).

    Raises:
        UsageError: unreadable, not an object, or neither form.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--label-names {path}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--label-names {path}: give a JSON object of label ids and names, e.g. {{\"1\": \"liver\"}}")
    try:
        if all(str(k).strip().lstrip("-").isdigit() for k in data):
            return {int(k): str(v) for k, v in data.items()}
        return {int(v): str(k) for k, v in data.items()}
    except (TypeError, ValueError):
        raise UsageError(f"--label-names {path}: each entry must pair an integer id with a name") from None


def run_statistics(args: argparse.Namespace) -> int:
    """The ``statistics`` command: read the CT and the label map, check they share a grid, print or write the JSON."""
    import torch

    from monai.apps.vista3d.config import DicomOptions, resolve_device
    from monai.apps.vista3d.core.statistics import statistics_document, structure_statistics
    from monai.apps.vista3d.io.load_policy import load_input
    from monai.apps.vista3d.io.nifti import load_image

    names = read_label_names(args.label_names) if args.label_names else None
    device = resolve_device(args.device)
    image, geom = load_input(Path(args.ct), torch.device("cpu"), dicom=DicomOptions(args.series, args.allow_modality))
    labels, lgeom = load_image(Path(args.labels), dtype=None)
    _check_grid(geom, lgeom, args)
    lab = labels[0]
    if lab.dtype.is_floating_point:  # a float label map (the bundle writes float32) holds integer ids
        lab = lab.round().to(torch.int64)
    stats = structure_statistics(image.to(device), lab.to(device), geom.affine, names,
                                 exclude_border_structures=args.exclude_border_structures)
    text = statistics_document(str(args.ct), str(args.labels), stats)
    if args.output:
        from monai.apps.vista3d.io.atomic import write_atomically

        write_atomically(args.output, lambda f: f.write(text))
    else:
        print(text.decode())
    return 0


def _check_grid(geom: Any, lgeom: Any, args: argparse.Namespace) -> None:
    if tuple(geom.spatial_shape) != tuple(lgeom.spatial_shape):
        raise UsageError(f"{args.labels} has shape {tuple(lgeom.spatial_shape)}, the CT {tuple(geom.spatial_shape)}: "
                         "give the label map made for this CT (on its grid)")
    if not np.allclose(geom.affine, lgeom.affine, atol=1e-3):
        raise UsageError(f"{args.labels} and {args.ct} have the same shape but different affines (voxel size, "
                         "orientation or origin): give the label map made for this CT")
