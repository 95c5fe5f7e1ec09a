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
"""The ranks of a batch: torchrun's environment, this process's device, and images balanced over ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from monai.apps.vista3d.config import TorchrunEnv
from monai.apps.vista3d.core.feasibility import failure_reason
from monai.apps.vista3d.errors import Vista3DInputError

__all__ = ["shard_by_size", "dist_context", "on_device", "agree_on_setup", "gather_records"]


def shard_by_size(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Greedy balance: indices by decreasing size (ties by index) onto the least-loaded rank (ties by rank).

    Returns, per rank, its indices in increasing order. Deterministic, so every rank computes the same plan.
    """
    loads = [0] * world_size
    counts = [0] * world_size
    plan: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world_size), key=lambda r: (loads[r], counts[r], r))
        plan[r].append(i)
        loads[r] += max(int(sizes[i]), 1)
        counts[r] += 1
    return [sorted(p) for p in plan]


class dist_context:  # noqa: N801 - used as a function: with dist_context() as (rank, world, local)
    """``(rank, world_size, local_rank)``; starts a process group from torchrun's variables if none exists.

    The group is destroyed on exit only if this context started it. The backend is gloo (``backend`` overrides):
    the batch driver only gathers small records, and gloo needs no GPU bound to the process.
    """

    def __init__(self, backend: str | None = None):
        self.backend, self.owned = backend, False

    def __enter__(self) -> tuple[int, int, int]:
        env = TorchrunEnv.read()
        if dist.is_available() and not dist.is_initialized() and env.world_size > 1:
            dist.init_process_group(backend=self.backend or "gloo")
            self.owned = True
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = 0, 1
        local = env.local_rank if env.local_rank is not None else (rank if world > 1 else 0)
        return rank, world, local

    def __exit__(self, *exc: Any) -> None:
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()


def agree_on_setup(error: BaseException | None, world: int) -> None:
    """Raise on every rank when the pipeline could not be built on one (so no rank waits for the others)."""
    if world > 1:
        errors: list[Any] = [None] * world
        dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {failure_reason(error)}")
        first = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
        if error is None and first is not None:
            raise Vista3DInputError(f"rank {first[0]} could not build the pipeline ({first[1]}); nothing was started.")
    if error is not None:
        raise error


def gather_records(local: list[dict], world: int) -> list[dict]:
    """Every rank's records in input order (``local`` itself on one process)."""
    if world == 1:
        return local
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    return sorted((r for records in gathered for r in records), key=lambda r: r["index"])


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` made the current CUDA device for a block (the caller's comes back after); nothing for the CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
