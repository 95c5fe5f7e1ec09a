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
"""Helpers that build a layer instance from a name or a ``(name, kwargs)`` pair."""

from __future__ import annotations

import torch.nn as nn

from monai.networks.layers.factories import Act, Dropout, Norm, split_args
from monai.utils import has_option

__all__ = ["get_act_layer", "get_norm_layer", "get_dropout_layer"]


def get_norm_layer(name: tuple | str, spatial_dims: int | None = 1, channels: int | None = 1) -> nn.Module:
    """A normalization layer, e.g. ``get_norm_layer("instance", spatial_dims=3, channels=16)``.

    Args:
        name: a normalization name or ``(name, kwargs)``; ``""`` gives ``nn.Identity``.
        spatial_dims: number of spatial dimensions of the input.
        channels: number of channels, used when the layer needs it and ``kwargs`` does not give it.
    """
    if name == "":
        return nn.Identity()
    norm_name, norm_args = split_args(name)
    norm_type = Norm[norm_name, spatial_dims]
    kwargs = dict(norm_args)
    for key in ("num_features", "num_channels"):
        if key not in kwargs and has_option(norm_type, key):
            kwargs[key] = channels
    return norm_type(**kwargs)


def get_act_layer(name: tuple | str) -> nn.Module:
    """An activation layer, e.g. ``get_act_layer(("leakyrelu", {"negative_slope": 0.01}))``.

    Args:
        name: an activation name or ``(name, kwargs)``; ``""`` gives ``nn.Identity``.
    """
    if name == "":
        return nn.Identity()
    act_name, act_args = split_args(name)
    return Act[act_name](**act_args)


def get_dropout_layer(name: tuple | str | float | int, dropout_dim: int | None = 1) -> nn.Module:
    """A dropout layer from a probability or a ``(name, kwargs)`` pair.

    Args:
        name: a drop probability, a dropout name or ``(name, kwargs)``; ``""`` gives ``nn.Identity``.
        dropout_dim: spatial dimension of the dropout (1: element-wise, 2/3: whole channels).
    """
    if name == "":
        return nn.Identity()
    if isinstance(name, (int, float)):
        drop_name, drop_args = "dropout", {"p": float(name)}
    else:
        drop_name, drop_args = split_args(name)
    return Dropout[drop_name, dropout_dim](**drop_args)
