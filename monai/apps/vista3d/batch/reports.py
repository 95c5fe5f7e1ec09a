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
"""What an image gets beside its label map (:class:`~monai.apps.vista3d.config.ImageOutputs`): its statistics, its
preview and its DICOM SEG.

The statistics and the preview's slices are taken on the main thread right after the segmentation, while the image
and its label map are still on the device (:func:`image_reports`); the files are written on the saver's thread
before the label map (:func:`write_reports`), so an image whose label map exists has all of them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from monai.apps.vista3d.config import ImageOutputs, SettingError
from monai.apps.vista3d.core.statistics import label_centroids, statistics_document, structure_statistics
from monai.apps.vista3d.io.atomic import write_atomically
from monai.apps.vista3d.io.image_geometry import ImageGeometry
from monai.apps.vista3d.io.input_kind import input_kind
from monai.apps.vista3d.io.paths import extra_output_paths
from monai.apps.vista3d.io.preview import PreviewSlices, pillow_missing, preview_slices, write_preview
from monai.apps.vista3d.labels import label_name

__all__ = ["ImageReports", "image_reports", "write_reports", "check_extras", "report_files"]


@dataclass
class ImageReports:
    """One image's extra outputs, made on the device and waiting to be written.

    Attributes:
        statistics: the content of ``statistics.json``, or None.
        preview: the preview's slices, or None.
        seg: whether a DICOM SEG is written.
    """

    statistics: dict[str, Any] | None = None
    preview: PreviewSlices | None = None
    seg: bool = False


def check_extras(extras: ImageOutputs, images: Sequence[str | os.PathLike]) -> None:
    """Refuse, before any work, extra outputs that cannot be made: a DICOM SEG of a NIfTI input, a preview without
    Pillow, a SEG without highdicom.

    Raises:
        SettingError: naming ``output_type`` or ``preview``.
    """
    if extras.dicom_seg:
        nifti = [str(p) for p in images if input_kind(p) != "dicom"]
        if nifti:
            raise SettingError("output_type", f"dicom-seg refers to the DICOM series it segments; {nifti[0]} is not "
                                              "DICOM (a series folder, .zip or .dcm): write NIfTI for it, the default.")
        try:
            import highdicom  # noqa: F401
        except ImportError:
            raise SettingError("output_type", "dicom-seg needs highdicom: pip install pydicom highdicom (the 'dicom' "
                                              "extra).") from None
    if extras.preview and pillow_missing():
        raise SettingError("preview", f"cannot be drawn: {pillow_missing()}.")


def report_files(extras: ImageOutputs, label_map: str | os.PathLike) -> list[Path]:
    """The files ``extras`` adds beside ``label_map`` (what a rerun checks before it skips the image)."""
    paths = extra_output_paths(label_map)
    wanted = {"statistics": extras.statistics, "preview": extras.preview, "seg": extras.dicom_seg}
    return [paths[k] for k, on in wanted.items() if on]


def image_reports(
    image: torch.Tensor, labels: torch.Tensor, geometry: ImageGeometry, extras: ImageOutputs
) -> ImageReports | None:
    """The statistics and the preview's slices of one segmented image, computed where its label map is."""
    if not extras.any:
        return None
    labels = labels[0] if labels.ndim == 4 else labels
    stats = None
    if extras.statistics:
        stats = structure_statistics(image, labels, geometry.affine,
                                     exclude_border_structures=extras.exclude_border_structures)
    preview = None
    if extras.preview:
        rows = []
        if extras.preview_classes:
            centres = label_centroids(labels).cpu()
            for label_id in extras.preview_classes:
                if label_id < centres.shape[0] and not bool(torch.isnan(centres[label_id, 0])):
                    rows.append((label_name(label_id), centres[label_id].tolist()))
        preview = preview_slices(image, labels.to(image.device) if labels.device != image.device else labels,
                                 geometry.affine, rows)
    return ImageReports(stats, preview, extras.dicom_seg)


def write_reports(reports: ImageReports | None, labels: Any, geometry: ImageGeometry, label_map: Path) -> list[Path]:
    """Write an image's extra outputs beside its label map (each whole or not at all); returns the files written.

    On a failure the files already written are removed and the error raised: the image's set is complete or absent.
    """
    if reports is None:
        return []
    paths = extra_output_paths(label_map)
    written: list[Path] = []
    try:
        if reports.statistics is not None:
            text = statistics_document(geometry.filename, str(label_map), reports.statistics)
            written.append(write_atomically(paths["statistics"], lambda f: f.write(text)))
        if reports.preview is not None:
            written.append(write_preview(reports.preview, paths["preview"]))
        if reports.seg:
            from monai.apps.vista3d.io.dicom_seg import write_dicom_seg

            written.append(write_dicom_seg(labels, geometry, paths["seg"]))
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        raise
    return written
