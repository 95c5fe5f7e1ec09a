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
"""What a run's summary records of how its outputs were made: the resolved job (prompt, window, overlap, batch,
precision, fused or not, output type), the weights file (size and SHA-256) and the versions of this package and of
torch, so that an output folder says what produced it (as nnU-Net's ``predict_from_raw_data_args.json`` does)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from typing import Any

import torch

from ..core.job import SegmentJob
from .segmenter import PipelineSegmenter, Segmenter

__all__ = ["Provenance"]

_CHUNK = 16 << 20  # bytes hashed per read (hashlib releases the GIL on large buffers)


def _sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Provenance:
    """The settings record of a run; the weights are hashed on a thread while the run works (a checkpoint of a few
    hundred MB takes a fraction of a second, already in the page cache from its load).

    Args:
        what: the run's job or segmenter.
    """

    def __init__(self, what: SegmentJob | Segmenter):
        self.settings = _settings(what)
        self.weights = what.weights if isinstance(what, SegmentJob) else None
        self._digest: list[str] = []
        self._thread: threading.Thread | None = None
        if self.weights is not None:
            self._thread = threading.Thread(target=lambda: self._digest.append(_sha256(self.weights)),
                                            name="vista3d-weights-digest", daemon=True)
            self._thread.start()

    def record(self) -> dict[str, Any]:
        """The record, with the weights' digest once it is ready."""
        weights = None
        if self.weights is not None:
            if self._thread is not None:
                self._thread.join()
            weights = {"path": os.fspath(self.weights), "bytes": os.path.getsize(self.weights),
                       "sha256": self._digest[0] if self._digest else None}
        from monai import __version__

        return {**self.settings, "weights": weights, "versions": {"monai": __version__, "torch": torch.__version__}}


def _settings(what: SegmentJob | Segmenter) -> dict[str, Any]:
    if isinstance(what, SegmentJob):
        prompt = what.parsed_prompt
        network = "vista3d132" if what.network is None else type(what.network).__name__
        points = None if prompt.points is None else prompt.points.tolist()
        labels = None if prompt.point_labels is None else prompt.point_labels.tolist()
        return {"segmenter": "SegmentJob", "classes": prompt.label_ids, "points": points, "point_labels": labels,
                "options": dataclasses.asdict(what.options),
                "device": str(what.device), "fuse": what.fuse, "network": network,
                "network_kwargs": dict(what.network_kwargs)}
    options = dataclasses.asdict(what.pipeline.options) if isinstance(what, PipelineSegmenter) else None
    return {"segmenter": type(what).__name__, "options": options, "device": str(what.device),
            "output_dtype": what.output_dtype, "nonfinite": what.nonfinite}
