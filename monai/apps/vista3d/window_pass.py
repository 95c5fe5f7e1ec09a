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
"""What one network pass over an image ran: the windows, the batch ``"auto"`` chose, the inferer's stage times;
and the wrapper around the network that counts them and drives the progress bar."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .progress import WindowProgress

__all__ = ["WindowPass", "CountingPredictor"]


@dataclass
class WindowPass:
    """What one network pass over an image ran.

    Attributes:
        windows: windows given to the network.
        sw_batch_size: the largest window batch of the pass (what ``"auto"`` chose).
        stages: seconds of the sliding-window stages as ``inference/<stage>``, when the inferer measured them.
    """

    windows: int
    sw_batch_size: int
    stages: dict[str, float] = field(default_factory=dict)


class CountingPredictor:
    """Wraps the network: advances a progress counter and records the windows of each call."""

    def __init__(self, network: Callable):
        self.network = network
        self.progress: WindowProgress | None = None
        self.batches: list[int] = []

    def start(self, progress: WindowProgress) -> None:
        """Begin one image's pass."""
        self.progress, self.batches = progress, []

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = self.network(x, *args, **kwargs)
        self.batches.append(int(x.shape[0]))
        if self.progress is not None:
            self.progress.update(int(x.shape[0]))
        return out

    def finish(self, stages: dict[str, float] | None = None) -> WindowPass:
        """End the pass: what it ran (the probe batch of ``sw_batch_size="auto"`` does not count as the size)."""
        if self.progress is not None:
            self.progress.close()
        sizes = self.batches[1:] if len(self.batches) > 1 else self.batches
        return WindowPass(sum(self.batches), max(sizes, default=0), dict(stages or {}))
