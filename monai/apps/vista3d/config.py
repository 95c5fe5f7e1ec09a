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
"""The settings of a VISTA3D run, in one room: each setting's default, its one check, and the frozen objects that
hold them (:class:`PipelineOptions` for the pipeline, :class:`BatchOptions` for :func:`~.batch.run.run_batch`).

Each check returns the setting as the library uses it, or raises :class:`SettingError`, which names the field
(``roi_size``); the command line names its flag instead (``--roi-size``) from the same error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from monai.inferers.batch_size import check_sw_batch_size as _check_batch

from .errors import ResourceError, Vista3DInputError
from .labels import bundle_config

__all__ = [
    "SettingError",
    "OUTPUT_DTYPES",
    "NONFINITE",
    "ROI_MULTIPLE",
    "check_roi_size",
    "check_overlap",
    "check_sw_batch_size",
    "check_output_dtype",
    "check_nonfinite",
    "check_unreached_label",
    "UNREACHED_LABELS",
    "check_embed_dim",
    "embed_dim_of",
    "DEFAULT_EMBED_DIM",
    "TorchrunEnv",
    "resolve_device",
    "resolve_amp",
    "DEFAULT_OUTPUT_DTYPE",
    "DEFAULT_ROI_SIZE",
    "DEFAULT_OVERLAP",
    "OUTPUT_POSTFIX",
    "PipelineOptions",
    "BatchOptions",
    "DicomOptions",
    "ImageOutputs",
    "OUTPUT_TYPES",
]

#: voxel types a label map may be saved as (uint8 holds every label id and the 255 sentinel)
OUTPUT_DTYPES = ("uint8", "int16", "float32")
#: how NaN/Inf voxels are read: as air (-1000 HU, with a warning that counts them), or refused
NONFINITE = ("air", "error")
#: what a point prompt's label map holds where no window reached: background (what a viewer expects), or the bundle's
#: 255 (its ``nan_value``)
UNREACHED_LABELS = (0, 255)
#: VISTA3D's encoder halves the grid four times, so windows are multiples of this
ROI_MULTIPLE = 16
#: voxel type of a saved label map unless asked otherwise (every label id and the 255 sentinel fit)
DEFAULT_OUTPUT_DTYPE = "uint8"
# The bundle's own settings, read from the shipped ``vista3d_labels.json`` (its ``configs/inference.json``)
_BUNDLE = bundle_config()
#: the bundle's sliding window (128³)
_ROI = [int(r) for r in _BUNDLE["inference"]["patch_size"]]
DEFAULT_ROI_SIZE: tuple[int, int, int] = (_ROI[0], _ROI[1], _ROI[2])
#: the bundle's window overlap (0.25)
DEFAULT_OVERLAP: float = float(_BUNDLE["inference"]["overlap"])
#: the bundle's output name postfix: ``ct.nii.gz`` -> ``ct_trans.nii.gz``
OUTPUT_POSTFIX: str = str(_BUNDLE["postprocessing"]["output_postfix"])
#: the ``vista3d132`` width of the published checkpoint, and so of a network built without ``encoder_embed_dim``
DEFAULT_EMBED_DIM = 48


class SettingError(Vista3DInputError):
    """A setting that cannot be used. ``field`` is its Python name; the message reads ``"<field> <problem>"``.

    Args:
        field: the parameter's name (``roi_size``).
        problem: what is wrong and how to fix it, without the name (``"must be in [0, 1), got 2"``).
    """

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class TorchrunEnv:
    """What ``torchrun`` tells this process (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``); one process without it.

    Attributes:
        world_size: processes of the run.
        rank: this process among them.
        local_rank: this process on its machine (its GPU), or None where ``LOCAL_RANK`` is not set.
        local_world_size: processes on this machine, or None where ``LOCAL_WORLD_SIZE`` is not set.
    """

    world_size: int = 1
    rank: int = 0
    local_rank: int | None = None
    local_world_size: int | None = None

    @classmethod
    def read(cls) -> TorchrunEnv:
        """The variables of this process's environment: the one place they are read."""
        local, local_world = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
        return cls(int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")),
                   None if local is None else int(local), None if local_world is None else int(local_world))

    @property
    def gpu(self) -> int:
        """This process's GPU on its machine: ``LOCAL_RANK``; without it, the rank of a process group a caller
        started without torchrun's variables (one GPU per rank); else 0."""
        if self.local_rank is not None:
            return self.local_rank
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist.get_rank()
        return 0


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device this process computes on, decided once where a job enters and read from the job afterwards.

    ``None`` picks CUDA when available; a bare ``"cuda"`` is this process's GPU (under ``torchrun``, ``LOCAL_RANK``'s,
    so that the ranks do not share GPU 0); a resolved CUDA device always has an index. CUDA is not touched for
    ``"cpu"``.

    Raises:
        SettingError: not a CUDA or CPU device, CUDA where there is none, or a GPU this machine does not have.
        ResourceError: ``torchrun`` started more ranks on this machine than it has GPUs.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SettingError("device", f"{str(device)!r} is not supported; use 'cuda', 'cuda:N' or 'cpu'.") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise SettingError("device", f"{str(device)!r} is not supported; use 'cuda', 'cuda:N' or 'cpu'.")
    if not torch.cuda.is_available():
        raise SettingError("device", f"{str(device)!r} was asked for, but CUDA is not available here; use 'cpu'.")
    env = TorchrunEnv.read()
    index = env.gpu if dev.index is None else dev.index
    count = torch.cuda.device_count()
    if index >= count:
        if dev.index is None and env.local_rank is not None:
            ranks = env.local_world_size or env.local_rank + 1
            raise ResourceError(f"torchrun started {ranks} ranks on this node but it has {count} GPUs; start at most "
                                f"{count} (--nproc_per_node={count}) or run on the CPU (device='cpu').")
        raise SettingError("device", f"'cuda:{index}' does not exist: this machine has {count} GPUs.")
    return torch.device("cuda", index)


def resolve_amp(amp: bool | None, device: torch.device) -> bool:
    """Whether a pipeline on ``device`` runs float16 autocast: ``amp`` as asked, ``None`` meaning on CUDA only."""
    return device.type == "cuda" if amp is None else bool(amp)


def check_roi_size(value: int | Sequence[int], multiple: int = 1) -> tuple[int, int, int]:
    """A window size as three ints: one int is a cube; each a positive multiple of ``multiple``."""
    try:
        roi = (int(value),) * 3 if isinstance(value, (int, np.integer)) else tuple(int(r) for r in value)
    except (TypeError, ValueError):
        roi = ()
    if len(roi) != 3 or any(r < multiple or r < 1 or r % multiple for r in roi):
        why = " (VISTA3D halves the window four times)" if multiple > 1 else ""
        shown = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else value
        raise SettingError("roi_size", f"must be one or three positive multiples of {multiple}{why}, got "
                                       f"{shown!r}; e.g. 128 (the bundle's) or 64.")
    return roi[0], roi[1], roi[2]


def check_overlap(value: Any) -> float:
    """The window overlap as a float in ``[0, 1)``."""
    try:
        overlap = float(value)
    except (TypeError, ValueError):
        overlap = float("nan")
    if not 0.0 <= overlap < 1.0:
        raise SettingError("overlap", f"must be in [0, 1), got {value!r}; the bundle's is {DEFAULT_OVERLAP}.")
    return overlap


def check_sw_batch_size(value: Any) -> int | str:
    """Windows per network call: a positive int, or ``"auto"`` (the rule of :mod:`monai.inferers.batch_size`)."""
    try:
        return _check_batch(value)
    except ValueError:
        raise SettingError("sw_batch_size", f"must be a positive int or 'auto', got {value!r}.") from None


def check_output_dtype(value: Any) -> str:
    """The label map's voxel type on disk, one of :data:`OUTPUT_DTYPES`."""
    if str(value) not in OUTPUT_DTYPES:
        raise SettingError("output_dtype", f"must be {', '.join(OUTPUT_DTYPES)}, got {value!r}.")
    return str(value)


def check_nonfinite(value: Any) -> str:
    """How NaN/Inf voxels are read, one of :data:`NONFINITE`."""
    if value not in NONFINITE:
        raise SettingError("nonfinite", f"must be 'air' or 'error', got {value!r}.")
    return str(value)


def check_unreached_label(value: Any) -> int:
    """The label of voxels no point window reached, one of :data:`UNREACHED_LABELS`."""
    if isinstance(value, bool) or value not in UNREACHED_LABELS:
        raise SettingError("unreached_label", f"must be 0 (background, the default) or 255 (the bundle's), got "
                                              f"{value!r}.")
    return int(value)


def check_embed_dim(value: Any) -> int:
    """A ``vista3d132`` width the network can be built with: a positive multiple of 8 (the point head's attention
    splits half of it over 4 heads)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 8 or value % 8:
        raise SettingError("encoder_embed_dim", f"must be a positive multiple of 8, got {value!r}; the published "
                                                "checkpoint uses 48 (the default).")
    return int(value)


def embed_dim_of(network_kwargs: Any) -> int:
    """The checked ``vista3d132`` width that ``network_kwargs`` builds (:data:`DEFAULT_EMBED_DIM` when unset)."""
    return check_embed_dim((network_kwargs or {}).get("encoder_embed_dim", DEFAULT_EMBED_DIM))



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
        streaming: class prompts go through the streamed label-map path (:meth:`~.Vista3DPipeline.stream`),
            which never holds all classes' logits for the whole volume; False keeps upstream's full-logits path
            with its out-of-memory fallback (``infer`` + ``postprocess``). Point prompts always use the latter.
        nonfinite: how files with NaN/Inf voxels are read: ``"air"`` (-1000 HU, with a warning that counts them)
            or ``"error"`` (refused).
        unreached_label: the label of the voxels of a point prompt's label map that no window reached: 0
            (background, the default, what a viewer expects) or 255 (what the bundle writes, its ``nan_value``):
            most of the voxels of a click's label map on a whole CT (and of a click session's answers).
        per_class: also give one mask per prompted class (``SegmentationResult.masks``; ``segment_file`` writes
            them), each class thresholded on its own (logit > 0), so a voxel may be in several; on the streamed
            path they add ``ceil(C / 8)`` bytes a voxel (bit-packed) to the label map's memory. Needs a class
            prompt (with points: the clicked object's class).

    Raises:
        SettingError: a value that cannot be used; the message names the field (``roi_size must be ...``). The
            window's multiple of 16 and its fit on the device are the pipeline's checks, which know the network.
    """

    roi_size: int | Sequence[int] = DEFAULT_ROI_SIZE
    overlap: float = DEFAULT_OVERLAP
    sw_batch_size: int | str = 1
    amp: bool | None = None
    progress: bool = False
    timing: bool = True
    output_dtype: str = DEFAULT_OUTPUT_DTYPE
    streaming: bool = True
    nonfinite: str = "air"
    per_class: bool = False
    unreached_label: int = 0

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
            "unreached_label": check_unreached_label(self.unreached_label),
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)  # frozen: the checked value replaces the given one, once


#: what ``--output-type`` may be: the NIfTI label map alone (the default), or a DICOM SEG of it too
OUTPUT_TYPES = ("nifti", "dicom-seg")


@dataclass(frozen=True)
class DicomOptions:
    """How a DICOM input (a series folder, a ``.zip`` of one, a multi-frame file) is read.

    Attributes:
        series: the SeriesInstanceUID to read where the input holds several series (None: refuse such an input
            and list its series).
        allow_modality: read a series whose Modality is not CT (VISTA3D was trained on CT only).
    """

    series: str | None = None
    allow_modality: bool = False

    def __post_init__(self):
        if self.series is not None and (not isinstance(self.series, str) or not self.series.strip()):
            raise SettingError("series", f"must be a SeriesInstanceUID (digits and dots), got {self.series!r}.")
        if self.series is not None:
            object.__setattr__(self, "series", self.series.strip())
        object.__setattr__(self, "allow_modality", bool(self.allow_modality))


@dataclass(frozen=True)
class ImageOutputs:
    """What a run writes for each image beside its label map (each written before the label map, which is written
    last: an image whose label map exists has all of them).

    Attributes:
        statistics: ``statistics.json``: per structure present, its voxels, volume, HU statistics, centroid,
            bounding box and whether it touches the image border.
        preview: ``preview.png``: three orthogonal slices with the label map over them and a legend.
        output_type: ``"nifti"`` (the label map only) or ``"dicom-seg"`` (also a DICOM SEG referencing the
            source series; DICOM inputs only).
        exclude_border_structures: TotalSegmentator's rule in the statistics: a structure within 3 voxels of a
            face of the image is reported as excluded, without values (it is likely cut off).
        preview_classes: structures whose centroid gets its own row of slices in the preview.
    """

    statistics: bool = False
    preview: bool = False
    output_type: str = "nifti"
    exclude_border_structures: bool = False
    preview_classes: tuple[int, ...] = ()

    def __post_init__(self):
        if self.output_type not in OUTPUT_TYPES:
            raise SettingError("output_type", f"must be {' or '.join(OUTPUT_TYPES)}, got {self.output_type!r}.")
        object.__setattr__(self, "preview_classes", tuple(int(i) for i in self.preview_classes))

    @property
    def dicom_seg(self) -> bool:
        """Whether a DICOM SEG is written beside the label map."""
        return self.output_type == "dicom-seg"

    @property
    def any(self) -> bool:
        """Whether anything is written beside the label map."""
        return self.statistics or self.preview or self.dicom_seg


@dataclass(frozen=True)
class BatchOptions:
    """How :func:`~monai.apps.vista3d.batch.run.run_batch` walks its images and writes their outputs; every field is
    also a keyword of ``run_batch``. What segments, where and with which read/write settings is the segmenter's
    (a :class:`~monai.apps.vista3d.core.job.SegmentJob`'s options), not these.

    Attributes:
        outputs: one output file per input instead of the ``output_dir`` naming.
        volume_index: the volume of each 4D input; 3D inputs are read as they are.
        postfix: output name postfix (the bundle's ``trans``).
        prefetch: images loaded ahead of the one being segmented.
        backend: process-group backend when one has to be started (default gloo: only small records are gathered).
        on_image: called on this process's main thread with each image's record once its file is written (or
            it was skipped or failed), plus ``progress``: ``(k, n)``, the k-th of this rank's n.
        quiet: without ``on_image``, no per-image line on stdout.
        part: ``(i, N)`` or ``"i/N"``: only part ``i`` (from 0) of a split of the images into ``N`` parts balanced
            by voxel count, the same in every process (see :mod:`monai.apps.vista3d.batch.parts`); its ranks shard
            it. The summary is then ``summary.part-<i>-of-<N>.json``. Whatever ``part``, each output is claimed
            before its image is read: an output another live process claimed is ``"busy"`` (left to it), so
            processes sharing the output folder never write one file twice.
        dicom: how DICOM inputs are read (:class:`DicomOptions`).
        extras: what each image gets beside its label map (:class:`ImageOutputs`).
    """

    outputs: Sequence[str | os.PathLike] | None = None
    volume_index: int | None = None
    postfix: str = OUTPUT_POSTFIX
    prefetch: int = 1
    backend: str | None = None
    on_image: Callable[[dict[str, Any]], None] | None = None
    quiet: bool = True
    part: tuple[int, int] | str | None = None
    dicom: DicomOptions = DicomOptions()
    extras: ImageOutputs = ImageOutputs()
