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
"""The process-wide state that library code (importing ``monai`` included) must leave as it found it.

Imports nothing of ``monai``, so that a child process can take the state before its first ``import monai``.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import signal
import sys
import threading
import warnings

import numpy as np
import torch


def _umask() -> str | None:
    """The umask as the kernel reports it (Linux 4.7+), read without setting it; ``None`` elsewhere."""
    try:
        with open("/proc/self/status") as f:
            return next((line.split()[1] for line in f if line.startswith("Umask:")), None)
    except OSError:
        return None


def process_state() -> dict:
    """umask, random states, torch's global flags and threads, environment and working directory, the import
    system's finders and hooks, Python's global handlers (exceptions, signals, warnings, logging), its threads."""
    cudnn = torch.backends.cudnn
    return {
        "umask": _umask(),
        "torch_rng": torch.get_rng_state().tolist(),
        "numpy_rng": repr(np.random.get_state()),
        "python_rng": random.getstate(),
        "cudnn": (cudnn.benchmark, cudnn.deterministic, cudnn.enabled, cudnn.allow_tf32),
        "matmul": (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "threads": (torch.get_num_threads(), torch.get_num_interop_threads()),
        "dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(),
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "meta_path": [repr(finder) for finder in sys.meta_path],
        "path_hooks": [repr(hook) for hook in sys.path_hooks],
        "sys_path": list(sys.path),
        "hooks": [repr(h) for h in (sys.excepthook, sys.displayhook, sys.unraisablehook, threading.excepthook)],
        "signals": {int(s): repr(signal.getsignal(s)) for s in signal.valid_signals()},
        "warnings": [repr(f) for f in warnings.filters],
        "logging": repr((logging.root.level, logging.root.handlers, logging.root.manager.disable)),
        "python_threads": sorted(repr(t) for t in threading.enumerate()),
        "recursion_limit": sys.getrecursionlimit(),
        "gc": (gc.isenabled(), gc.get_threshold()),
    }
