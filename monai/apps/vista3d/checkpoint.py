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
"""The VISTA3D network of the pipeline and its checkpoint: build ``vista3d132``, load a state dict strictly."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .errors import CheckpointError

__all__ = ["build_network", "load_checkpoint"]


def build_network(network_kwargs: dict | None = None) -> torch.nn.Module:
    """``vista3d132(**network_kwargs)`` of this fork, in eval mode (random weights)."""
    from monai.networks.nets import vista3d132

    return vista3d132(**(network_kwargs or {})).eval()


def load_checkpoint(network: torch.nn.Module, path: str | os.PathLike) -> torch.nn.Module:
    """Load a VISTA3D checkpoint strictly, saying which keys or shapes do not match.

    Accepts a plain state dict (the bundle's ``models/model.pt``) or one nested under ``"state_dict"``,
    ``"model"`` or ``"network"``; a ``"module."`` prefix (DataParallel) is dropped.

    Raises:
        CheckpointError: the file cannot be read, or its keys or shapes differ from the network's.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {type(e).__name__}: {e}".splitlines()[0]) from e
    for key in ("state_dict", "model", "network"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a state dict of tensors")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    own = network.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [f"{k}: checkpoint {tuple(sd[k].shape)} vs network {tuple(own[k].shape)}"
              for k in own if k in sd and sd[k].shape != own[k].shape]

    def _few(items: list[str]) -> str:
        return ", ".join(items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")

    problems = []
    if missing:
        problems.append(f"{len(missing)} missing keys: {_few(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys: {_few(unexpected)}")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatches: {_few(shapes)}")
    if problems:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not match the VISTA3D network: " + "; ".join(problems)
            + " (is it a vista3d132 checkpoint, e.g. the bundle's models/model.pt?)"
        )
    network.load_state_dict(sd, strict=True)
    return network
