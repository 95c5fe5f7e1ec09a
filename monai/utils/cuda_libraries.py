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
"""CUDA libraries, and the first launches of kernels, started ahead of the work that needs them on threads of their
own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["start_cuda_libraries", "start_first_calls"]


def start_first_calls(device: torch.device, calls: Callable[[torch.device], Any], name: str) -> threading.Thread | None:
    """Run ``calls(device)`` without gradients on a daemon thread named ``name``; returns the thread (``None`` off
    CUDA).

    A process's first launch of a kernel loads its code (lazily, from the library that holds it): tens of
    milliseconds for some of PyTorch's. PyTorch lets other threads run meanwhile, so a caller that knows which
    kernels will follow launches them here on tiny tensors of the same types while its own thread reads a checkpoint.
    Only the time moves: no result changes.
    """
    if device.type != "cuda":
        return None
    if device.index is None:  # the caller's current GPU (a new thread's would be GPU 0, whatever torchrun set)
        device = torch.device("cuda", torch.cuda.current_device())

    def run() -> None:
        with torch.no_grad():
            calls(device)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def start_cuda_libraries(device: torch.device) -> threading.Thread | None:
    """Run one small half-precision matrix product and one small 3D convolution on ``device`` on a daemon thread;
    returns the thread (``None`` off CUDA).

    A process's first matrix product creates its cuBLAS handle and loads the library (0.09-0.12 s on an H100 host),
    its first convolution does the same for cuDNN (0.12-0.13 s), both paid by a fresh process's first forward.
    PyTorch lets other threads run meanwhile, so a caller that knows a network will follow starts them here and
    reads its checkpoint in the meantime; the handles go back to PyTorch's pools when the thread ends, and the next
    thread that multiplies or convolves takes them. Only the time moves: no result changes.
    """

    def start(device: torch.device) -> None:
        # the handles and the libraries' kernels are made at the launch, on the host: nothing to wait for on the GPU
        # (where the work queues behind the weights' copy)
        a = torch.ones(64, 64, device=device, dtype=torch.float16)
        torch.nn.functional.linear(a, a)
        # the layout and dtype of the fused network's convolutions (channels-last fp16), at a tiny size
        x = torch.ones(1, 8, 8, 8, 8, device=device, dtype=torch.float16)
        w = torch.ones(8, 8, 3, 3, 3, device=device, dtype=torch.float16)
        x, w = x.to(memory_format=torch.channels_last_3d), w.to(memory_format=torch.channels_last_3d)
        torch.nn.functional.conv3d(x, w, padding=1)

    return start_first_calls(device, start, "cuda-libraries-start")
