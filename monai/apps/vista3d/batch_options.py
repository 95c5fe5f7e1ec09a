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
"""The settings of a :func:`~.batch.run_batch` run, in one frozen dataclass."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BatchOptions"]


@dataclass(frozen=True)
class BatchOptions:
    """How :func:`run_batch` reads, segments and writes; every field is also a keyword of :func:`run_batch`.

    Attributes:
        outputs: one output file per input instead of the ``output_dir`` naming.
        volume_index: the volume of each 4D input; 3D inputs are read as they are.
        output_dtype: label map dtype on disk; None: ``pipeline_kwargs["output_dtype"]``, a given pipeline's,
            else uint8.
        postfix: output name postfix.
        prefetch: images loaded ahead of the one being segmented.
        device: see :func:`~.network_ready.resolve_device` (under ``torchrun`` a bare ``"cuda"`` is this rank's GPU);
            ``pipeline_kwargs["device"]`` may give it instead.
        backend: process-group backend when one has to be started (default nccl with CUDA, else gloo).
        pipeline_kwargs: arguments of :class:`~.pipeline.Vista3DPipeline` and the prompt, for ``segment_fn=None``
            (they make a :class:`~.segmenter.SegmentJob`, checked before any work).
        on_image: called on this process's main thread with each image's record once its file is written (or
            it was skipped or failed), plus ``progress``: ``(k, n)``, the k-th of this rank's n.
        quiet: without ``on_image``, no per-image line on stdout.
        nonfinite: ``"air"`` reads NaN/Inf voxels as -1000 HU with a warning that counts them; ``"error"``
            fails such images. None: the pipeline's (given, or ``pipeline_kwargs["nonfinite"]``), else ``"air"``.
            A value that disagrees with the pipeline's is refused (as ``output_dtype`` and ``device``).
        part: ``(i, N)`` or ``"i/N"``: only part ``i`` (from 0) of a split of the images into ``N`` parts balanced
            by voxel count, the same in every process (see :mod:`.parts`); its ranks shard it. The summary is
            then ``summary.part-<i>-of-<N>.json``. Whatever ``part``, each output is claimed before its image is
            read: an output another live process claimed is ``"busy"`` (left to it), so processes sharing the
            output folder never write one file twice.
    """

    outputs: Sequence[str | os.PathLike] | None = None
    volume_index: int | None = None
    output_dtype: str | None = None
    postfix: str = "trans"
    prefetch: int = 1
    device: str | torch.device | None = None
    backend: str | None = None
    pipeline_kwargs: dict | None = None
    on_image: Callable[[dict[str, Any]], None] | None = None
    quiet: bool = True
    nonfinite: str | None = None
    part: tuple[int, int] | str | None = None
