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
import threading

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheels of torch come without Triton; the fused path is then unavailable
    triton = None
    tl = None

__all__ = [
    "triton", "tl", "interpreting", "check_kernel_input", "unavailable_reason", "kernel_cache_dir", "can_write",
    "prefetch_cache_key", "wait_for_cache_key",
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


_cache_key_thread: threading.Thread | None = None
_cache_key_lock = threading.Lock()


def prefetch_cache_key() -> threading.Thread | None:
    """Start hashing Triton's own install on a daemon thread, once per process; returns that thread (the same one on
    every call), ``None`` where there is nothing to hash (no Triton, or a Triton without
    ``triton.runtime.cache.triton_key``).

    Before a process's first kernel is found in the kernel cache, Triton hashes its own files once (the key of every
    cached kernel; 0.34 s on an H100 host with Triton 3.6, on the thread that launches). The hash is kept for the
    process. Reading and hashing large files let other threads run, but its walk over Triton's modules holds the
    GIL, so a caller that knows kernels will follow starts it where its own thread mostly waits (a fused network's
    checkpoint read: started before a command's imports it slowed them, 0.64-1.24 s against 0.54-0.56 s to the first
    image's load on an H100 host); the first kernel's launch waits for it (:func:`wait_for_cache_key`). Only the time
    moves: the kernels and their results are the same.
    """
    global _cache_key_thread
    key = getattr(getattr(getattr(triton, "runtime", None), "cache", None), "triton_key", None)
    if key is None or interpreting():
        return None
    with _cache_key_lock:
        if _cache_key_thread is None:
            _cache_key_thread = threading.Thread(target=key, name="triton-cache-key", daemon=True)
            _cache_key_thread.start()
        return _cache_key_thread


def wait_for_cache_key() -> None:
    """Wait until :func:`prefetch_cache_key`'s hash is done, where one was started; call it before launching kernels.

    Triton keeps the hash only once it is computed: a kernel launched while the thread still hashes would hash
    Triton's files again on its own thread (0.34-0.39 s on an H100 host, measured as the first forward of a fresh
    process), where waiting costs only what is left of the first hash.
    """
    thread = _cache_key_thread
    if thread is not None and thread.is_alive():
        thread.join()
