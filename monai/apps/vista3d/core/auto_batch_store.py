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
"""``sw_batch_size="auto"``'s measured window costs, kept on disk beside the kernel cache.

The one-window probe of ``"auto"`` (:mod:`monai.inferers.batch_size`) measures what a window of the network costs
in GPU memory. Within a process the cost is kept; a new process would probe again, running one more window shape
than the batches need (a CUDA graph and cuDNN's autotuning for it). The store keeps each cost under what it depends
on, the network (kind, width, fused configuration), the precision, the GPU model, torch's version, and the
window, channels and classes of the pass, in one small JSON file in Triton's kernel cache folder
(``vista3d-auto-batch.json``), so that a later process on the same machine chooses its batch at once from the free
memory it finds then. Only the costs are kept, not the batches: those still follow the memory free at the time.
"""

from __future__ import annotations

import ast
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from monai.apps.vista3d.errors import Vista3DOutputError
from monai.apps.vista3d.io.atomic import write_atomically

from .network_ready import encoder_shape

__all__ = ["AutoBatchStore", "STORE_NAME", "network_identity", "measured_costs"]

#: the store's file name in the kernel cache folder
STORE_NAME = "vista3d-auto-batch.json"
_FORMAT = 1


def network_identity(network: Any, device: torch.device, amp: bool) -> tuple:
    """What a window's memory depends on besides the pass's own key (window, channels, classes): the network's
    kind and width, its fused configuration, autocast, the GPU model and its memory, torch's version."""
    width, _ = encoder_shape(network)
    fused = getattr(network, "fused_config", None)
    gpu: tuple = ()
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        gpu = (props.name, int(props.total_memory))
    return (type(network).__name__, width, repr(fused), bool(amp), *gpu, torch.__version__)


def measured_costs(cache: dict) -> dict:
    """The exactly measured costs of an ``"auto"`` cache, without the batches it chose for each image size (those
    follow the memory free at the time, and are not kept)."""
    return {k: v for k, v in cache.items() if _is_cost(k, v)}


def _is_cost(key: Any, value: Any) -> bool:
    # a cost keyed by a predictor's auto_batch_key (("named", ...)), not by a process's object, and measured exactly:
    # a probe under an earlier, higher peak only bounds the cost, and would keep every later process's batch small
    return (isinstance(key, tuple) and bool(key) and isinstance(key[0], tuple) and key[0][:1] == ("named",)
            and isinstance(value, dict) and isinstance(value.get("window_bytes"), (int, float))
            and value.get("exact") is True)


class AutoBatchStore:
    """The costs of ``"auto"`` in one file: :meth:`load` them into a pass's cache, :meth:`save` what it measured.

    A file that cannot be read (damaged, another format) is said in one warning and written anew by the next save;
    a folder that cannot be written is said once and costs the next process a probe, not its run.

    Args:
        path: the JSON file (:meth:`in_kernel_cache`: in the kernel cache folder).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._warned = False

    @classmethod
    def in_kernel_cache(cls) -> AutoBatchStore:
        """The store in Triton's kernel cache folder (``TRITON_CACHE_DIR``, else ``~/.triton/cache``)."""
        from monai.utils.triton_support import kernel_cache_dir

        return cls(Path(kernel_cache_dir()) / STORE_NAME)

    def load(self) -> dict:
        """The stored costs, keyed as :func:`~monai.inferers.batch_size.auto_cache_key` keys them; ``{}`` when there
        is no file yet."""
        try:
            text = self.path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # none yet (a save says why if it cannot write one)
            return {}
        except OSError as e:
            self._warn(f"cannot read {self.path} ({e.strerror or e})")
            return {}
        try:
            doc = json.loads(text)
            if doc.get("format") != _FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {_FORMAT}")
            costs = {ast.literal_eval(k): v for k, v in doc["costs"].items()}
        except (ValueError, TypeError, KeyError, AttributeError, SyntaxError, MemoryError, RecursionError) as e:
            self._warn(f"{self.path} is not a store of window costs ({type(e).__name__}: {e}); it is written anew")
            return {}
        return measured_costs(costs)

    def save(self, cache: dict) -> bool:
        """Add the costs of ``cache`` to the file (with what another process stored since); True when written."""
        merged = {**self.load(), **measured_costs(cache)}
        doc = {"format": _FORMAT, "costs": {repr(k): v for k, v in merged.items()}}
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        try:
            write_atomically(self.path, lambda f: f.write(data))
        except Vista3DOutputError as e:
            self._warn(f"{e} A later run measures its window batch again.")
            return False
        return True

    def _warn(self, text: str) -> None:
        if not self._warned:  # one line per store: a batch of images must not repeat it per image
            self._warned = True
            warnings.warn(f"sw_batch_size='auto': {text}", stacklevel=3)
