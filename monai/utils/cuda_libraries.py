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
"""CUDA libraries started ahead of the work that needs them, on a thread of their own."""

from __future__ import annotations

import threading

import torch

__all__ = ["start_cublas"]


def start_cublas(device: torch.device) -> threading.Thread | None:
    """Run one small half-precision matrix product on ``device`` on a daemon thread; returns the thread (``None``
    off CUDA).

    A process's first matrix product creates its cuBLAS handle and loads the library (0.09-0.12 s on an H100 host,
    paid by the first linear layer of a fresh process's first forward). PyTorch lets other threads run meanwhile,
    so a caller that knows a network will follow starts it here and reads its checkpoint in the meantime; the
    handle goes back to PyTorch's pool when the thread ends, and the next thread that multiplies takes it. Only the
    time moves: no result changes.
    """
    if device.type != "cuda":
        return None
    if device.index is None:  # the caller's current GPU (a new thread's would be GPU 0, whatever torchrun set)
        device = torch.device("cuda", torch.cuda.current_device())

    def multiply() -> None:
        # the handle and the library's kernels are made at the launch, on the host: nothing to wait for on the GPU
        # (where the product queues behind the weights' copy)
        with torch.no_grad():
            a = torch.ones(64, 64, device=device, dtype=torch.float16)
            torch.nn.functional.linear(a, a)

    thread = threading.Thread(target=multiply, name="cublas-start", daemon=True)
    thread.start()
    return thread
