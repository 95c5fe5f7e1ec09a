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
"""What a run segments, described and checked once where it enters: :class:`SegmentJob`.

The command line (``segment``, ``serve``, ``prepare``, ``benchmark``) builds one from its flags and the Python API
gives one to :func:`~monai.apps.vista3d.batch.run.run_batch`; everything after reads the resolved values from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from monai.apps.vista3d.config import (
    ROI_MULTIPLE,
    PipelineOptions,
    SettingError,
    check_roi_size,
    embed_dim_of,
    resolve_device,
)

from .feasibility import check_network, check_window
from .pipeline import Vista3DPipeline
from .prompts import Prompt, parse_prompt

if TYPE_CHECKING:
    from monai.networks.kernels.dispatch import FusedConfig

__all__ = ["SegmentJob"]


@dataclass(frozen=True)
class SegmentJob:
    """The pipeline a run builds and the prompt it gives every image, resolved and checked when built: what cannot
    run is refused before any weights load or image is read.

    Attributes:
        prompt: the parsed prompt (anything :func:`~monai.apps.vista3d.core.prompts.parse_prompt` takes is parsed).
        options: the pipeline's per-run options (window, overlap, batch, output type, NaN policy, masks, ...).
        device: where to compute, resolved once (:func:`~monai.apps.vista3d.config.resolve_device`: under
            ``torchrun`` a bare ``"cuda"`` is this rank's GPU).
        weights: the checkpoint to load; None keeps random weights (with a warning, see ``warn_random``).
        network_kwargs: arguments of ``vista3d132``.
        network: a caller's network instead of ``vista3d132`` (``network_kwargs`` is then unused).
        resample_dtype: floating type of the resampling.
        warn_random: warn when the network has random weights.
        fuse: run the network's fused path where it can (see :class:`~.pipeline.Vista3DPipeline`); a
            ``FusedConfig`` says with what (:func:`~.network_ready.fused_for_images`).

    Raises:
        SettingError: a device, weights file, width or window ``vista3d132`` cannot run (the message names the
            field), or ``per_class`` without classes.
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
    fuse: bool | FusedConfig = True

    def __post_init__(self) -> None:
        device = resolve_device(self.device)
        object.__setattr__(self, "prompt", parse_prompt(self.prompt))
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "network_kwargs", dict(self.network_kwargs or {}))
        if self.weights is not None and not Path(self.weights).is_file():
            raise SettingError("weights", f"{os.fspath(self.weights)!r} is not a file; give the VISTA3D bundle's "
                                          "models/model.pt.")
        if self.options.per_class and not self.prompt.label_ids:
            raise SettingError("per_class", "needs classes: give the classes (or 'everything'), or with points the "
                                            "clicked object's class, e.g. 'liver'.")
        if self.network is None:  # what vista3d132 cannot run is refused before it is built
            width = embed_dim_of(self.network_kwargs)
            check_network(width, device)
            check_window(check_roi_size(self.options.roi_size, ROI_MULTIPLE), width, device)

    @property
    def parsed_prompt(self) -> Prompt:
        """The prompt, typed (the field holds the parsed :class:`~monai.apps.vista3d.core.prompts.Prompt`)."""
        assert isinstance(self.prompt, Prompt)  # parsed when the job was built
        return self.prompt

    @property
    def resolved_device(self) -> torch.device:
        """The device, typed (the field holds the resolved ``torch.device``)."""
        assert isinstance(self.device, torch.device)  # resolved when the job was built
        return self.device

    @property
    def nonfinite(self) -> str:
        """How NaN/Inf voxels are read (the options')."""
        return self.options.nonfinite

    @property
    def output_dtype(self) -> str:
        """The label maps' voxel type on disk (the options')."""
        return self.options.output_dtype

    @property
    def mask_ids(self) -> list[int] | None:
        """The classes whose masks each image gets (``per_class``), else None."""
        return list(self.parsed_prompt.label_ids or []) if self.options.per_class else None

    def build(self) -> Vista3DPipeline:
        """The pipeline, built: the weights loaded, on the job's device."""
        return Vista3DPipeline(self.network, self.weights, self.device, options=self.options,
                               network_kwargs=dict(self.network_kwargs), resample_dtype=self.resample_dtype,
                               warn_random=self.warn_random, fuse=self.fuse)
