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
"""Replaying a function's GPU work as a CUDA graph, one graph per input shape.

A forward of a hundred small launches on one or two windows is bound by the CPU that issues them; a captured graph
issues them all at once. The cache captures ``fn`` on first use of an input signature (shapes, dtypes, autocast
state), copies each call's inputs into the graph's own input buffers, replays, and returns a copy of the output (the
graph's output buffer is overwritten by the next replay), or, for a caller that consumes it at once, the buffer
itself. When a watched parameter changes (its storage or version
counter, bumped by every in-place write and by ``load_state_dict``) every graph is dropped and recaptured on demand.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["GraphCache"]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor


class GraphCache:
    """Runs ``fn(*inputs)`` through captured CUDA graphs.

    Args:
        fn: a function of CUDA tensors returning one tensor; it must not synchronise with the host.
        params: tensors ``fn`` reads besides its inputs (e.g. a network's parameters); a change drops the graphs.
        max_graphs: how many input signatures keep a graph (and its memory); the least recently used goes first.
        copy_output: return a copy of the output; ``False`` returns the graph's own output buffer, which the next
            call overwrites (work queued on the current stream before that call still reads this call's values).
    """

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        params: Sequence[torch.Tensor],
        max_graphs: int = 2,
        copy_output: bool = True,
    ):
        self.fn = fn
        self.params = list(params)
        self.max_graphs = max_graphs
        self.copy_output = copy_output
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()
        self._fingerprint: tuple = ()

    def __len__(self) -> int:
        return len(self._graphs)

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Captured:
        static = tuple(t.clone() for t in inputs)
        side = torch.cuda.Stream(device=static[0].device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph: compilation, cuDNN plans, cached weights
            self.fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self.fn(*static)
        return _Captured(graph, static, output)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        fingerprint = tuple((p.data_ptr(), p._version) for p in self.params)
        if fingerprint != self._fingerprint:
            self._graphs.clear()
            self._fingerprint = fingerprint
        device_type = inputs[0].device.type
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs) + (
            torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type),
        )
        captured = self._graphs.get(key)
        if captured is None:
            while len(self._graphs) >= self.max_graphs:
                self._graphs.popitem(last=False)
            captured = self._graphs[key] = self._capture(inputs)
        self._graphs.move_to_end(key)
        for buffer, value in zip(captured.inputs, inputs):
            buffer.copy_(value)
        captured.graph.replay()
        return captured.output.clone() if self.copy_output else captured.output
