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
"""The network a pipeline runs, made ready: the device chosen, ``vista3d132`` built (or the caller's network),
the weights loaded, on the device in eval mode, fused where its fused path can run there."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from monai.apps.vista3d.config import DEFAULT_EMBED_DIM, embed_dim_of
from monai.utils.cuda_libraries import start_cuda_libraries

from .checkpoint import build_network, load_checkpoint, network_from_checkpoint

if TYPE_CHECKING:
    from monai.networks.kernels.dispatch import FusedConfig

__all__ = ["RANDOM_WEIGHTS_WARNING", "check_network_kwargs", "ready_network", "encoder_shape", "fused_for_images"]

RANDOM_WEIGHTS_WARNING = (
    "WARNING: no weights given: the VISTA3D network has RANDOM weights, the label maps are MEANINGLESS "
    "(use only to test the pipeline or measure speed; pass weights=PATH, the bundle's models/model.pt, for real "
    "results)"
)


def check_network_kwargs(network_kwargs: dict | None) -> None:
    """Refuse a ``vista3d132`` width the network cannot be built with, before building it.

    Raises:
        SettingError: ``encoder_embed_dim`` is not a positive multiple of 8 (see :func:`~.config.check_embed_dim`).
    """
    embed_dim_of(network_kwargs)


def ready_network(
    network: torch.nn.Module | Callable | None,
    weights: str | os.PathLike | None,
    network_kwargs: dict | None,
    device: torch.device,
    fuse: bool | FusedConfig,
) -> torch.nn.Module | Callable:
    """``network`` (or ``vista3d132(**network_kwargs)`` built) with ``weights`` loaded, on ``device`` in eval mode,
    and fused (with ``fuse`` when it is a ``FusedConfig``) where the network says its fused path can run there."""
    if fuse is not False and _fuses_on(device):
        from monai.utils.triton_cache_key import prefetch_cache_key

        prefetch_cache_key()  # Triton's one hash of itself, while the checkpoint is read
    start_cuda_libraries(device)  # cuBLAS's and cuDNN's starts, while the checkpoint is read
    if network is None:
        check_network_kwargs(network_kwargs)
        if weights is not None:
            return on_device(network_from_checkpoint(weights, network_kwargs, device), device, fuse)
        network = build_network(network_kwargs)
    if weights is not None:
        if not isinstance(network, torch.nn.Module):
            raise ValueError("weights can only be loaded into a torch.nn.Module network")
        load_checkpoint(network, weights)
    return on_device(network, device, fuse) if isinstance(network, torch.nn.Module) else network


def on_device(network: torch.nn.Module, device: torch.device, fuse: bool | FusedConfig) -> torch.nn.Module:
    """``network`` on ``device`` in eval mode, fused where the network says its fused path can run there."""
    from monai.networks.nets import VISTA3D

    network = network.to(device).eval()
    if fuse is not False and isinstance(network, VISTA3D) and _fuses_on(device):
        network.fuse(None if fuse is True else fuse)
    return network


def _fuses_on(device: torch.device) -> bool:
    """Whether a VISTA3D's fused path runs on ``device``."""
    from monai.networks.nets import VISTA3D

    return VISTA3D.fused_unavailable_reason(device) is None


def fused_for_images(images: int, device: torch.device, fuse: bool | FusedConfig) -> bool | FusedConfig:
    """What a process that segments ``images`` images fuses with: for one image on a GPU, no CUDA graphs and no
    cuDNN autotuning, whose first calls cost more than they save over one image's windows (an H100 at e74e066,
    512x512x200 CT: the first forward 1.36 s with both, 0.98-1.02 s without either; the later CTs of a six-CT run
    37 ms slower without them); otherwise ``fuse`` as given (``True``: the defaults, both on)."""
    if fuse is not True or images != 1 or device.type != "cuda":
        return fuse
    from monai.networks.kernels.dispatch import FusedConfig

    return FusedConfig(graph_max_windows=0, cudnn_autotune=False)


def encoder_shape(network: Any) -> tuple[int, int]:
    """``(encoder_embed_dim, halvings)`` of a VISTA3D: its first convolution's channels and its encoder's levels
    below the first (``vista3d132``: ``(48, 4)``)."""
    encoder = getattr(getattr(network, "image_encoder", None), "encoder", None)
    width = int(getattr(getattr(encoder, "conv_init", None), "out_channels", DEFAULT_EMBED_DIM))
    return width, max(len(getattr(encoder, "layers", ())) - 1, 0) if encoder is not None else 4
