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
"""Triton, when it is installed, and where the fused kernels can run (those of ``monai.networks.kernels`` and the
stitch's window add in ``monai.inferers``; it lives here, below both, because it knows neither).

Triton ships with the CUDA builds of PyTorch; a CPU install has none and never needs it. With
``TRITON_INTERPRET=1`` in the environment before the first import of the kernels, Triton runs them on CPU tensors
in its interpreter (slow, for tests on tiny shapes).
"""

from __future__ import annotations

import os
import tempfile

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheels of torch come without Triton; the fused path is then unavailable
    triton = None
    tl = None

__all__ = [
    "triton", "tl", "interpreting", "check_kernel_input", "unavailable_reason", "kernel_cache_dir", "can_write",
]


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return triton is not None and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_kernel_input(x: torch.Tensor, kernel: str) -> None:
    """Raise ``ValueError`` unless ``x`` is where ``kernel`` can read it: on CUDA, or on the CPU under the
    interpreter."""
    if not x.is_cuda and not interpreting():
        raise ValueError(f"{kernel} runs on CUDA tensors, got one on {x.device}.")


def unavailable_reason(device: torch.device | str) -> str | None:
    """``None`` where the fused kernels run on ``device``, else the reason in a few words.

    They need Triton and a CUDA GPU of compute capability 9.x (Hopper: H100, H200), the one they are tested on; the
    interpreter runs them on the CPU.
    """
    device = torch.device(device)
    if triton is None:
        return "Triton is not installed (it ships with the CUDA builds of PyTorch)"
    if interpreting():
        return None if device.type == "cpu" else f"the Triton interpreter runs on CPU tensors, not on {device}"
    if device.type != "cuda":
        return f"the fused kernels run on CUDA GPUs, not on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return (
            f"the fused kernels are built and tested for compute capability 9.x (Hopper), this GPU is {major}.{minor}"
        )
    return None


def kernel_cache_dir() -> str:
    """The folder Triton compiles kernels into: ``TRITON_CACHE_DIR``, else ``.triton/cache`` under ``TRITON_HOME``
    (default: the home folder), as Triton itself decides it."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    return os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache")


def can_write(folder: str) -> bool:
    """Whether files can be created in ``folder`` (made if missing): tried, not inferred from permission bits."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return False
    return True
