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
"""One image of a batch run: where it is, what became of it, what it cost. Its :meth:`~ImageRecord.as_dict` is
the image's entry of ``summary.json`` and of :attr:`~.summary.BatchResult.records`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["ImageRecord"]

#: the fields every entry has; the others appear once they are known
_ALWAYS = ("index", "image", "output", "rank", "voxels", "status", "error", "seconds", "windows")


@dataclass
class ImageRecord:
    """One image of a run.

    Attributes:
        index: its place among the run's inputs.
        image: the input file.
        output: its label map.
        rank: the rank that segments it (None: not known, e.g. another rank's in a stopped run).
        voxels: its voxel count (from the header).
        status: None while it is open; then "done", "skipped", "failed", "busy" (another process writes it),
            "interrupted" or "unknown" (a stopped run).
        error: why it failed, one line.
        seconds: load, segmentation and save.
        windows: windows the network ran.
        masks: with per-class masks, their files.
        load_seconds: reading the image.
        segment_seconds: segmenting it.
        sw_batch_size: the largest window batch (what ``"auto"`` chose).
        stages: seconds per stage (``load``, the pipeline's stages, ``save``).
        note: why another process has it ("busy").
    """

    index: int
    image: str
    output: str
    rank: int | None
    voxels: int
    status: str | None = None
    error: str | None = None
    seconds: float = 0.0
    windows: int | None = None
    masks: list[str] | None = None
    load_seconds: float | None = None
    segment_seconds: float | None = None
    sw_batch_size: int | None = None
    stages: dict[str, float] | None = None
    note: str | None = None

    @classmethod
    def new(cls, index: int, image: Path, output: Path, rank: int | None, voxels: int) -> ImageRecord:
        """The record of an image before anything was done with it."""
        return cls(index, str(image), str(output), rank, voxels)

    def segmented(self, t_load: float, t_segment: float, info: dict[str, Any]) -> None:
        """Record its times, windows, window batch and per-stage seconds once it is segmented (``info``: what
        the segmenter reported)."""
        self.segment_seconds = round(t_segment, 4)
        self.seconds = round(t_load + t_segment, 4)
        self.windows = info.get("windows")
        if info.get("sw_batch_size") is not None:
            self.sw_batch_size = info["sw_batch_size"]
        stages = {k: round(float(v), 4) for k, v in info.get("stages", {}).items()}
        self.stages = {"load": round(t_load, 4), **stages}

    def saved(self, seconds: float) -> None:
        """Its label map (and masks) are written, in ``seconds``."""
        self.status = "done"
        self.stages = {**(self.stages or {}), "save": round(seconds, 4)}
        self.seconds = round(self.seconds + seconds, 4)

    def as_dict(self) -> dict[str, Any]:
        """The summary's entry: the fields every image has, and the others once they are known."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in values.items() if k in _ALWAYS or v is not None}
