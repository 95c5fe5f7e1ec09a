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
"""Optional activation, dropout and normalization layers in a configurable order."""

from __future__ import annotations

from torch import nn

from monai.networks.layers.utils import get_act_layer, get_dropout_layer, get_norm_layer

__all__ = ["ADN"]


class ADN(nn.Sequential):
    """A sequence of an activation ("A"), a dropout ("D") and a normalization ("N") layer, each optional.

    Submodules are named ``A``, ``D`` and ``N`` and appear in ``ordering``.

    Args:
        ordering: order of the layers, e.g. ``"NDA"`` (normalize, drop, activate).
        in_channels: number of channels ``C`` of the ``[B, C, ...]`` input (for the normalization).
        act: activation name or ``(name, kwargs)``; ``None`` for none.
        norm: normalization name or ``(name, kwargs)``; ``None`` for none.
        norm_dim: spatial dimension of the normalization (defaults to ``dropout_dim``).
        dropout: drop probability or ``(name, kwargs)``; ``None`` for none.
        dropout_dim: spatial dimension of the dropout (defaults to ``norm_dim``).
    """

    def __init__(
        self,
        ordering: str = "NDA",
        in_channels: int | None = None,
        act: tuple | str | None = "RELU",
        norm: tuple | str | None = None,
        norm_dim: int | None = None,
        dropout: tuple | str | float | None = None,
        dropout_dim: int | None = None,
    ) -> None:
        super().__init__()
        layers: dict[str, nn.Module] = {}
        if (norm is not None or dropout is not None) and norm_dim is None and dropout_dim is None:
            raise ValueError("ADN needs norm_dim or dropout_dim when a normalization or dropout is requested.")
        if norm is not None:
            layers["N"] = get_norm_layer(norm, spatial_dims=norm_dim or dropout_dim, channels=in_channels)
        if act is not None:
            layers["A"] = get_act_layer(act)
        if dropout is not None:
            layers["D"] = get_dropout_layer(dropout, dropout_dim=dropout_dim or norm_dim)
        for key in ordering.upper():
            if key not in "ADN":
                raise ValueError(f"ordering may only contain the letters 'A', 'D' and 'N', got '{ordering}'.")
            if key in layers:
                self.add_module(key, layers[key])
