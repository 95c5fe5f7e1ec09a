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

It is also where a caller's policy meets the GPU, so that the function it runs need not know either: inputs with
more than ``max_batch`` samples, or not on CUDA, run eagerly; with ``autotune`` the first call of each input
signature (the graph's warm-up and capture, or the first eager call) runs with ``torch.backends.cudnn.benchmark`` on,
and the caller's setting is put back after it. PyTorch keeps the cuDNN plan it picks for a convolution shape in a
cache that every later call of that shape consults first, whatever the flag then says, so the later calls run the
timed plans without the process-wide flag being touched again. (That cache is per thread and bounded by PyTorch's
``TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT``: a forward on another thread plans its shapes by cuDNN's heuristics.) While
the first call runs, the flag is on for the whole process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

__all__ = ["GraphCache", "cudnn_autotuning"]

# signatures remembered as tuned; past this many the record starts again (re-entering the tuning scope for a shape
# cuDNN has already planned costs a flag flip, not a new timing)
_TUNED_LIMIT = 256

# what the captured function returns: one tensor or a tuple of them (tuples may nest)
OutputT = TypeVar("OutputT", torch.Tensor, tuple)


def _cloned(output):
    """A copy of a tensor or of the tensors of a (nested) tuple."""
    return tuple(_cloned(t) for t in output) if isinstance(output, tuple) else output.clone()


@contextmanager
def cudnn_autotuning(enable: bool = True) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` on inside the block when ``enable``; the caller's setting after it."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before or enable
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


@dataclass
class _Captured(Generic[OutputT]):
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    output: OutputT


class GraphCache(Generic[OutputT]):
    """Runs ``fn(*inputs)`` through captured CUDA graphs.

    Args:
        fn: a function of CUDA tensors returning one tensor or a tuple of them (tuples may nest); it must not
            synchronise with the host.
        params: tensors ``fn`` reads besides its inputs (e.g. a network's parameters); a change drops the graphs.
        max_graphs: how many input signatures keep a graph (and its memory); the least recently used goes first.
        copy_output: return a copy of the output; ``False`` returns the graph's own output buffer, which the next
            call overwrites (work queued on the current stream before that call still reads this call's values).
        max_batch: inputs whose first one has more samples (dim 0) than this run eagerly, uncaptured; ``None``: no
            limit, 0: never capture.
        autotune: run the first call of each input signature with cuDNN's algorithm timing on (see the module
            docstring); the flag is the caller's again after that call.
    """

    def __init__(
        self,
        fn: Callable[..., OutputT],
        params: Sequence[torch.Tensor],
        max_graphs: int = 2,
        copy_output: bool = True,
        max_batch: int | None = None,
        autotune: bool = False,
    ):
        self.fn: Callable[..., OutputT] = fn
        self.params = list(params)
        self.max_graphs = max_graphs
        self.copy_output = copy_output
        self.max_batch = max_batch
        self.autotune = autotune
        self._graphs: OrderedDict[tuple, _Captured[OutputT]] = OrderedDict()
        self._fingerprint: tuple = ()
        self._tuned: set[tuple] = set()

    def __len__(self) -> int:
        return len(self._graphs)

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Captured[OutputT]:
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

    def captures(self, first: torch.Tensor) -> bool:
        """Whether a call whose first input is ``first`` is replayed as a graph (else it runs eagerly)."""
        return first.is_cuda and (self.max_batch is None or (first.ndim > 0 and first.shape[0] <= self.max_batch))

    def _signature(self, inputs: tuple[torch.Tensor, ...]) -> tuple:
        device_type = inputs[0].device.type
        return tuple((tuple(t.shape), t.dtype, t.device) for t in inputs) + (
            torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type),
        )

    def _tuned_now(self, key: tuple) -> None:
        if len(self._tuned) >= _TUNED_LIMIT:
            self._tuned.clear()
        self._tuned.add(key)

    def __call__(self, *inputs: torch.Tensor) -> OutputT:
        key = self._signature(inputs)
        tune = self.autotune and key not in self._tuned
        if not self.captures(inputs[0]):
            if not tune:
                return self.fn(*inputs)
            with cudnn_autotuning():
                output = self.fn(*inputs)
            self._tuned_now(key)
            return output
        fingerprint = tuple((p.data_ptr(), p._version) for p in self.params)
        if fingerprint != self._fingerprint:
            self._graphs.clear()
            self._fingerprint = fingerprint
        captured = self._graphs.get(key)
        if captured is None:
            while len(self._graphs) >= self.max_graphs:
                self._graphs.popitem(last=False)
            # (a recapture after new weights tunes nothing new: cuDNN's plans are per shape)
            with cudnn_autotuning(tune):
                captured = self._graphs[key] = self._capture(inputs)
            if tune:
                self._tuned_now(key)
        self._graphs.move_to_end(key)
        for buffer, value in zip(captured.inputs, inputs):
            buffer.copy_(value)
        captured.graph.replay()
        return _cloned(captured.output) if self.copy_output else captured.output
