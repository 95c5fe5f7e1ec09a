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
"""What segments each image of a batch: the pipeline a :class:`SegmentJob` describes (built by the run), a
:class:`~monai.apps.vista3d.core.pipeline.Vista3DPipeline`, or a caller's function."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from ..config import (
    DEFAULT_OUTPUT_DTYPE,
    ROI_MULTIPLE,
    BatchOptions,
    PipelineOptions,
    SettingError,
    check_nonfinite,
    check_output_dtype,
    check_roi_size,
    embed_dim_of,
)
from ..core.feasibility import check_network, check_window
from ..core.network_ready import resolve_device
from ..core.pipeline import Vista3DPipeline
from ..core.progress import text_bar
from ..core.prompts import Prompt, parse_prompt
from ..core.results import SegmentationResult
from ..errors import Vista3DInputError
from ..io.image_geometry import ImageGeometry
from .distributed import TorchrunEnv, rank_device

__all__ = [
    "SegmentFn",
    "Segmenter",
    "PipelineSegmenter",
    "SegmentJob",
    "ResolvedSegmenter",
    "resolve_segmenter",
    "pipeline_segment_fn",
    "spread_options",
    "labels_and_info",
]


@runtime_checkable
class Segmenter(Protocol):
    """What :func:`~monai.apps.vista3d.batch.run.run_batch` calls on each image: ``(image, geometry)`` to a label map, a
    :class:`~monai.apps.vista3d.core.results.SegmentationResult`, or ``(labels, {"windows": ..., "timings": ...})``."""

    def __call__(self, image: torch.Tensor, geometry: ImageGeometry) -> Any: ...


#: the type of ``segment_fn`` (kept for the callers that name it)
SegmentFn = Segmenter


class PipelineSegmenter:
    """A ``segment_fn`` for :func:`run_batch` that runs a ``Vista3DPipeline`` with one prompt.

    ``run_batch`` reads each image with the pipeline's :meth:`~.pipeline.Vista3DPipeline.load` (its device and
    load policy), and shows the images' progress in the pipeline's window bar.

    Args:
        pipeline: the pipeline to run.
        prompt: the parsed prompt of every image.
    """

    def __init__(self, pipeline: Vista3DPipeline, prompt: Prompt):
        self.pipeline, self.prompt = pipeline, prompt

    def load(self, path: Path, volume_index: int | None, nonfinite: str) -> tuple[torch.Tensor, ImageGeometry]:
        """The pipeline's own load (see :func:`~monai.apps.vista3d.io.load_policy.load_input`)."""
        return self.pipeline.load(path, volume_index, nonfinite)

    @property
    def device(self) -> torch.device:
        """Where the pipeline computes, and so where its images are read to."""
        return self.pipeline.device

    @property
    def mask_ids(self) -> list[int] | None:
        """The classes whose masks each image gets (a pipeline with ``per_class``), else None."""
        return list(self.prompt.label_ids or []) if self.pipeline.per_class else None

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
    """A ``segment_fn`` for :func:`run_batch` that runs an existing ``Vista3DPipeline``; the prompt is parsed here."""
    prompt = parse_prompt(classes, points, point_labels)
    return PipelineSegmenter(pipe, prompt)


_BUILD_KEYS = ("network", "weights", "network_kwargs", "resample_dtype", "warn_random", "fuse")


@dataclass(frozen=True)
class SegmentJob:
    """The pipeline a run builds and the prompt it gives every image: resolved and checked once, where the run
    enters. The command line builds one from its flags; :func:`~monai.apps.vista3d.batch.run.run_batch` builds one from
    ``pipeline_kwargs`` (or takes one as ``segment_fn``), then builds its pipeline on each rank while the first
    image loads.

    Attributes:
        prompt: the parsed prompt (anything :func:`~monai.apps.vista3d.core.prompts.parse_prompt` takes is parsed).
        options: the pipeline's per-run options.
        device: where to compute (see :func:`~monai.apps.vista3d.core.network_ready.resolve_device`; under ``torchrun`` give this rank's).
        weights: the checkpoint to load; None keeps random weights (with a warning, see ``warn_random``).
        network_kwargs: arguments of ``vista3d132``.
        network: a caller's network instead of ``vista3d132`` (``network_kwargs`` is then unused).
        resample_dtype: floating type of the resampling.
        warn_random: warn when the network has random weights.
        fuse: run the network's fused path where it can (see :class:`~monai.apps.vista3d.core.pipeline.Vista3DPipeline`).

    Raises:
        SettingError: a width or window ``vista3d132`` cannot run (the message names the field), or ``per_class``
            without classes.
        ResourceError: the network or one window cannot fit on the device.
    """

    prompt: Any = "everything"
    options: PipelineOptions = field(default_factory=PipelineOptions)
    device: str | torch.device | None = None
    weights: str | os.PathLike | None = None
    network_kwargs: Mapping[str, Any] = field(default_factory=dict)
    network: Any = None
    resample_dtype: torch.dtype = torch.float32
    warn_random: bool = True
    fuse: bool = True

    def __post_init__(self):
        object.__setattr__(self, "prompt", parse_prompt(self.prompt))
        object.__setattr__(self, "device", resolve_device(self.device))
        object.__setattr__(self, "network_kwargs", dict(self.network_kwargs or {}))
        if self.options.per_class and not self.prompt.label_ids:
            raise SettingError("per_class", "needs classes: give the classes (or 'everything'), or with points the "
                                            "clicked object's class, e.g. 'liver'.")
        if self.network is None:  # what vista3d132 cannot run is refused before it is built
            width = embed_dim_of(self.network_kwargs)
            roi = check_roi_size(self.options.roi_size, ROI_MULTIPLE)
            check_network(width, self.device)
            check_window(roi, width, self.device)

    @classmethod
    def from_kwargs(cls, pipeline_kwargs: Mapping[str, Any] | None, device: str | torch.device | None) -> SegmentJob:
        """The job of :class:`~monai.apps.vista3d.core.pipeline.Vista3DPipeline`'s keywords and the prompt's (``classes``, ``points``,
        ``point_labels``); ``options=`` is spread into its fields, a keyword beside it wins.

        Raises:
            TypeError: a keyword that is none of these.
        """
        kwargs = dict(spread_options(pipeline_kwargs) or {})
        prompt = _prompt_of(kwargs)
        for key in (*_PROMPT_KEYS, "device"):  # the device: resolved by the caller (under torchrun: this rank's GPU)
            kwargs.pop(key, None)
        build = {k: kwargs.pop(k) for k in _BUILD_KEYS if k in kwargs}
        return cls(prompt, PipelineOptions(**kwargs), device, **build)

    @property
    def mask_ids(self) -> list[int] | None:
        """The classes whose masks each image gets (``per_class``), else None."""
        return list(self.prompt.label_ids or []) if self.options.per_class else None

    def build(self) -> PipelineSegmenter:
        """The pipeline, built (the weights loaded, on the device) with the job's prompt."""
        pipe = Vista3DPipeline(self.network, self.weights, self.device, options=self.options,
                               network_kwargs=self.network_kwargs, resample_dtype=self.resample_dtype,
                               warn_random=self.warn_random, fuse=self.fuse)
        return PipelineSegmenter(pipe, self.prompt)


_PROMPT_KEYS = ("classes", "points", "point_labels")


def spread_options(pipeline_kwargs: dict | None) -> dict | None:
    """``pipeline_kwargs`` with a :class:`~monai.apps.vista3d.config.PipelineOptions` given as ``options=`` spread into its
    fields (a keyword given beside it wins, as in ``Vista3DPipeline``), so that ``run_batch`` reads each setting in
    one place: the output type, the non-finite policy and the per-class masks of ``options`` are the run's."""
    if not pipeline_kwargs or pipeline_kwargs.get("options") is None:
        return pipeline_kwargs
    kwargs = dict(pipeline_kwargs)
    return {**dataclasses.asdict(kwargs.pop("options")), **kwargs}


def _prompt_of(pipeline_kwargs: dict | None) -> Prompt:
    """The prompt given among ``pipeline_kwargs`` (every class when none is)."""
    kwargs = pipeline_kwargs or {}
    return parse_prompt(kwargs.get("classes", "everything"), kwargs.get("points"), kwargs.get("point_labels"))


def _as_segmenter(segment_fn: Any, pipeline_kwargs: dict | None) -> Any:
    """What segments each image, checked before any work: a ``Vista3DPipeline`` runs with the prompt of
    ``pipeline_kwargs`` (its own settings stay); anything that cannot be called is refused."""
    if segment_fn is None or isinstance(segment_fn, PipelineSegmenter):
        return segment_fn
    if isinstance(segment_fn, Vista3DPipeline):
        other = sorted(set(pipeline_kwargs or {}) - set(_PROMPT_KEYS))
        if other:
            raise Vista3DInputError(
                f"pipeline_kwargs {other} configure the pipeline run_batch builds, but segment_fn is a pipeline "
                "already; set them on it (pipe.replace(...)) and give only the prompt in pipeline_kwargs."
            )
        return PipelineSegmenter(segment_fn, _prompt_of(pipeline_kwargs))
    if not callable(segment_fn):
        raise TypeError(
            f"segment_fn must be callable as segment_fn(image, geometry) or be a Vista3DPipeline, got "
            f"{type(segment_fn).__name__}"
        )
    return segment_fn


def _one_setting(name: str, given: Any, own: Any, default: Any) -> Any:
    """``given`` (a field of :class:`BatchOptions`) or the pipeline's ``own`` value: a pipeline's settings are never
    silently replaced, so two different values are refused."""
    if given is None:
        return default if own is None else own
    if own is not None and own != given:
        raise Vista3DInputError(f"{name}={given!r} disagrees with the pipeline's {name}={own!r}; give it once.")
    return given


def _batch_device(device: str | torch.device | None, pipeline_kwargs: dict | None) -> str | torch.device | None:
    """The one device asked for, by ``device=`` or by ``pipeline_kwargs["device"]``."""
    other = (pipeline_kwargs or {}).get("device")
    if device is None or other is None:
        return device if device is not None else other
    if torch.device(device) != torch.device(other):
        raise Vista3DInputError(
            f"device={str(device)!r} and pipeline_kwargs['device']={str(other)!r} disagree; give the device once."
        )
    return device


def labels_and_info(result: Any) -> tuple[Any, dict[str, Any]]:
    """What a ``segment_fn`` returned, as ``(labels, {"windows", "sw_batch_size", "stages"})``."""
    if isinstance(result, SegmentationResult):
        return result.labels, {"windows": result.windows, "sw_batch_size": result.sw_batch_size,
                               "stages": result.timings, "masks": result.masks}
    if isinstance(result, tuple):
        labels, info = result
        info = dict(info or {})
        return labels, {"windows": info.get("windows"), "stages": info.get("timings") or {}}
    return result, {}


def _rank_device(device: str | torch.device | None) -> torch.device:
    """This rank's device for the pipeline a run builds (see :func:`rank_device`)."""
    env = TorchrunEnv.read()
    if env.local_rank is None and dist.is_available() and dist.is_initialized():
        # a process group the caller started without torchrun's variables: one GPU per rank
        env = dataclasses.replace(env, local_rank=dist.get_rank() if dist.get_world_size() > 1 else 0)
    return rank_device(device, env)


@dataclass(frozen=True)
class ResolvedSegmenter:
    """What a :func:`~monai.apps.vista3d.batch.run.run_batch` segments with, where, and how it reads and writes: decided once, where it
    enters (:func:`resolve_segmenter`).

    Attributes:
        segmenter: a :class:`SegmentJob` (its pipeline is built on this process while the first image loads), a
            given pipeline (:class:`PipelineSegmenter`), or a caller's function.
        device: where this process computes and reads its images to (the CPU for a caller's function).
        nonfinite: how NaN/Inf voxels are read (``"air"`` or ``"error"``).
        output_dtype: the label maps' voxel type on disk.
        mask_ids: the classes whose masks each image gets, or None.
    """

    segmenter: Any
    device: torch.device
    nonfinite: str
    output_dtype: str
    mask_ids: list[int] | None


def resolve_segmenter(segment_fn: Any, opts: BatchOptions) -> ResolvedSegmenter:
    """``segment_fn`` of :func:`~monai.apps.vista3d.batch.run.run_batch` and its options resolved before any work: ``None`` becomes the
    :class:`SegmentJob` of ``opts.pipeline_kwargs`` on this rank's device, a ``Vista3DPipeline`` a
    :class:`PipelineSegmenter` with the prompt of ``pipeline_kwargs``. A pipeline's settings are never silently
    replaced: a field of ``opts`` (``device``, ``nonfinite``, ``output_dtype``) that disagrees with them is refused.

    Raises:
        Vista3DInputError: a setting given twice that disagrees; pipeline settings beside a pipeline or a job.
        SettingError: a setting the pipeline cannot run (it names the field).
        TypeError: a ``segment_fn`` that cannot be called.
    """
    segmenter = _what_segments(segment_fn, opts)
    own: PipelineOptions | None = None
    if isinstance(segmenter, SegmentJob):
        own = segmenter.options
    elif isinstance(segmenter, PipelineSegmenter):
        own = segmenter.pipeline.options
    nonfinite = _one_setting("nonfinite", opts.nonfinite, own and own.nonfinite, "air")
    dtype = _one_setting("output_dtype", opts.output_dtype, own and own.output_dtype, DEFAULT_OUTPUT_DTYPE)
    pipeline = isinstance(segmenter, (SegmentJob, PipelineSegmenter))
    device = segmenter.device if pipeline else torch.device("cpu")
    return ResolvedSegmenter(segmenter, device, check_nonfinite(nonfinite), check_output_dtype(dtype),
                             segmenter.mask_ids if pipeline else None)


def _what_segments(segment_fn: Any, opts: BatchOptions) -> Any:
    """The :class:`SegmentJob`, :class:`PipelineSegmenter` or caller's function that segments each image."""
    if segment_fn is None:
        kwargs = dict(spread_options(opts.pipeline_kwargs) or {})
        for name in ("nonfinite", "output_dtype"):  # given twice, they must agree
            value = _one_setting(name, getattr(opts, name), kwargs.get(name), None)
            if value is not None:
                kwargs[name] = value
        return SegmentJob.from_kwargs(kwargs, _rank_device(_batch_device(opts.device, kwargs)))
    if isinstance(segment_fn, SegmentJob):
        if opts.pipeline_kwargs:
            raise Vista3DInputError("pipeline_kwargs configure the pipeline run_batch builds, but segment_fn is a "
                                    "SegmentJob already; give its settings and prompt there.")
        _same_device(opts.device, segment_fn.device)
        return segment_fn
    segmenter = _as_segmenter(segment_fn, opts.pipeline_kwargs)
    if isinstance(segmenter, PipelineSegmenter):
        _same_device(opts.device, segmenter.device)
    return segmenter


def _same_device(given: str | torch.device | None, own: torch.device) -> None:
    if given is None:
        return
    given = torch.device(given)
    if given.type != own.type or given.index not in (None, own.index):
        raise Vista3DInputError(f"device={str(given)!r} disagrees with the pipeline's device={str(own)!r}; give it "
                                "once.")
