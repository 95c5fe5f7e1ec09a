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
"""Writing a label map as a DICOM Segmentation (SEG) that refers to the CT series it was made from, with highdicom.

One segment per structure present, numbered 1..N in the order of the label ids, labelled with VISTA3D's name. Its
segmented property is a SNOMED CT concept where the DICOM standard's code tables (as pydicom ships them) name the
structure, with a laterality modifier for left and right ones; otherwise the generic "Anatomical Structure" concept
(a tumour, cyst, lesion or mass: "Morphologically Abnormal Structure" with its kind), the name carried by the
segment's label. Each segment's recommended display colour is its colour in the preview. The SEG is a BINARY one
(what viewers read), frames only where a segment has voxels.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.labels import label_names

from .image_geometry import LPS_RAS_FLIP, ImageGeometry, reverse_voxel_axes
from .label_colors import label_color

__all__ = ["write_dicom_seg", "segment_codes", "SNOMED_OF", "ALGORITHM_NAME"]

#: the algorithm named in every segment
ALGORITHM_NAME = "VISTA3D"

# VISTA3D label name -> (keyword of pydicom's SCT code dictionary, laterality or None). Names left out get the
# generic concept. Only concepts whose meaning is the structure itself are listed (not e.g. "Hip", a region, for the
# hip bone).
SNOMED_OF: dict[str, tuple[str, str | None]] = {
    "liver": ("Liver", None), "kidney": ("Kidney", None), "spleen": ("Spleen", None), "pancreas": ("Pancreas", None),
    "right kidney": ("Kidney", "Right"), "left kidney": ("Kidney", "Left"), "aorta": ("Aorta", None),
    "inferior vena cava": ("InferiorVenaCava", None), "right adrenal gland": ("AdrenalGland", "Right"),
    "left adrenal gland": ("AdrenalGland", "Left"), "gallbladder": ("Gallbladder", None),
    "esophagus": ("Esophagus", None), "stomach": ("Stomach", None), "duodenum": ("Duodenum", None),
    "bladder": ("Bladder", None), "rectum": ("Rectum", None), "small bowel": ("SmallIntestine", None),
    "lung": ("Lung", None), "bone": ("Bone", None), "brain": ("Brain", None), "trachea": ("Trachea", None),
    "colon": ("Colon", None), "heart": ("Heart", None), "prostate": ("Prostate", None), "skull": ("Skull", None),
    "sacrum": ("Sacrum", None), "sternum": ("Sternum", None), "spinal cord": ("SpinalCord", None),
    "thyroid gland": ("Thyroid", None), "superior vena cava": ("SuperiorVenaCava", None),
    "pulmonary vein": ("PulmonaryVein", None), "costal cartilages": ("CostalCartilage", None),
    "brachiocephalic trunk": ("BrachiocephalicTrunk", None), "airway": ("AirwayStructure", None),
    "left atrial appendage": ("LeftAuricularAppendage", None),
    "left lung upper lobe": ("UpperLobeOfLung", "Left"), "left lung lower lobe": ("LowerLobeOfLung", "Left"),
    "right lung upper lobe": ("UpperLobeOfLung", "Right"), "right lung middle lobe": ("MiddleLobeOfRightLung", None),
    "right lung lower lobe": ("LowerLobeOfLung", "Right"),
    "left iliac artery": ("CommonIliacArtery", "Left"), "right iliac artery": ("CommonIliacArtery", "Right"),
    "left iliac vena": ("CommonIliacVein", "Left"), "right iliac vena": ("CommonIliacVein", "Right"),
    "left brachiocephalic vein": ("BrachiocephalicVein", "Left"),
    "right brachiocephalic vein": ("BrachiocephalicVein", "Right"),
    "left common carotid artery": ("CommonCarotidArtery", "Left"),
    "right common carotid artery": ("CommonCarotidArtery", "Right"),
    "left subclavian artery": ("LeftSubclavianArtery", None),
    "right subclavian artery": ("RightSubclavianArtery", None),
    **{f"{side} {bone}": (keyword, side.title()) for side in ("left", "right")
       for bone, keyword in (("humerus", "Humerus"), ("scapula", "Scapula"), ("clavicula", "Clavicle"),
                             ("femur", "Femur"))},
    **{f"{side} rib {n}": ("Rib", side.title()) for side in ("left", "right") for n in range(1, 13)},
    **{f"vertebrae {level}{n}": (f"{level}{n}Vertebra", None) for level, count in (("C", 7), ("T", 12), ("L", 5))
       for n in range(1, count + 1)},
}
# abnormal structures: VISTA3D label name -> pydicom SCT keyword of their kind
_ABNORMAL = {"lung tumor": "Neoplasm", "pancreatic tumor": "Neoplasm", "hepatic tumor": "Neoplasm",
             "liver tumor": "Neoplasm", "colon cancer primaries": "Neoplasm", "left kidney cyst": "Cyst",
             "right kidney cyst": "Cyst", "bone lesion": "Lesion", "kidney mass": "Mass"}


def segment_codes(name: str) -> tuple[Any, Any, Any]:
    """``(category, property type, laterality modifier or None)`` of a structure, as pydicom codes."""
    from pydicom.sr.codedict import codes

    sct = codes.SCT
    if name in _ABNORMAL:
        side = "Left" if name.startswith("left ") else "Right" if name.startswith("right ") else None
        return sct.MorphologicallyAbnormalStructure, getattr(sct, _ABNORMAL[name]), getattr(sct, side) if side else None
    keyword, side = SNOMED_OF.get(name, (None, None))
    concept = getattr(sct, keyword, None) if keyword else None
    if concept is None:
        return sct.AnatomicalStructure, sct.AnatomicalStructure, None
    return sct.AnatomicalStructure, concept, getattr(sct, side) if side else None


def write_dicom_seg(
    labels: Any, geometry: ImageGeometry, path: str | os.PathLike, names: Mapping[int, str] | None = None
) -> Path:
    """Write ``labels`` (``[X, Y, Z]`` on the grid of a DICOM image) as a DICOM SEG referring to its series.

    Args:
        labels: the label map, array, CPU tensor or
            :class:`~monai.apps.vista3d.io.label_transfer.DeviceLabelMap`, on the image's grid.
        geometry: the image's geometry from :func:`~.dicom.load_dicom` (its ``source`` is the series).
        path: the file to write (through a temporary name, renamed when whole).
        names: label id -> structure name (VISTA3D's by default).

    Raises:
        Vista3DInputError: the image was not read from DICOM, or pydicom / highdicom are missing.
    """
    source = geometry.source
    if source is None:
        raise Vista3DInputError("a DICOM SEG refers to the DICOM series it segments; this image was not read from "
                                "DICOM (write NIfTI, the default --output-type, for it).")
    try:
        import highdicom as hd
    except ImportError:
        raise Vista3DInputError("writing a DICOM SEG needs highdicom: pip install pydicom highdicom (the 'dicom' "
                                "extra).") from None
    from .atomic import write_atomically

    arr = np.asarray(labels.numpy() if hasattr(labels, "numpy") else labels)
    arr = arr[0] if arr.ndim == 4 else arr
    arr = arr.astype(np.int64) if arr.dtype.kind == "f" else arr  # a float32 label map holds integer ids
    names = label_names() if names is None else names
    present = [int(i) for i in np.unique(arr) if i > 0]
    numbers = np.zeros(int(arr.max(initial=0)) + 1, dtype=np.uint16)
    numbers[present] = np.arange(1, len(present) + 1)
    array, affine = reverse_voxel_axes(numbers[arr], geometry.affine)  # highdicom's (slice, row, column)
    volume = hd.Volume(
        array=np.ascontiguousarray(array),
        affine=LPS_RAS_FLIP @ affine,  # DICOM's LPS
        coordinate_system="PATIENT",
        frame_of_reference_uid=str(source.datasets[0].FrameOfReferenceUID),
    )
    seg = hd.seg.Segmentation(
        source_images=source.datasets,
        pixel_array=volume if present else np.zeros(volume.array.shape, dtype=np.uint8),
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=[_description(hd, k + 1, label_id, names) for k, label_id in enumerate(present)] or [
            _description(hd, 1, 0, {0: "nothing segmented"})],
        series_instance_uid=hd.UID(), series_number=int(getattr(source.datasets[0], "SeriesNumber", 0) or 0) + 1000,
        sop_instance_uid=hd.UID(), instance_number=1, manufacturer="MONAI", manufacturer_model_name=ALGORITHM_NAME,
        software_versions=_version(), device_serial_number="0", series_description=f"{ALGORITHM_NAME} segmentation",
    )
    return write_atomically(path, lambda f: seg.save_as(f, enforce_file_format=True))


def _description(hd: Any, number: int, label_id: int, names: Mapping[int, str]) -> Any:
    name = names.get(label_id, f"label_{label_id}")
    category, concept, side = segment_codes(name)
    description = hd.seg.SegmentDescription(
        segment_number=number, segment_label=name[:64], segmented_property_category=category,
        segmented_property_type=concept, algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=hd.AlgorithmIdentificationSequence(
            name=ALGORITHM_NAME, version=_version(),
            family=hd.sr.CodedConcept("123109", "DCM", "Artificial Intelligence")),
        display_color=hd.color.CIELabColor.from_rgb(*label_color(label_id)) if hasattr(hd, "color") else None,
    )
    if side is not None:
        description.SegmentedPropertyTypeCodeSequence[0].SegmentedPropertyTypeModifierCodeSequence = [
            hd.sr.CodedConcept(side.value, side.scheme_designator, side.meaning)]
    return description


def _version() -> str:
    from monai import __version__

    return str(__version__)
