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
"""Name-based, dimension-independent factories for the layers the VISTA3D networks use.

``Conv[Conv.CONV, 3]`` is ``nn.Conv3d``, ``Norm["instance", 3]`` is ``nn.InstanceNorm3d`` and ``Act["relu"]`` is
``nn.ReLU``. Names are case-insensitive. A callable passed instead of a name is returned unchanged, so users can
plug in their own layer types wherever a name is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn as nn

from monai.utils import look_up_option

__all__ = ["LayerFactory", "split_args", "Conv", "Norm", "Act", "Dropout", "Pool"]


class LayerFactory:
    """A registry mapping upper-case names to functions that return a layer type.

    Args:
        name: short name of the factory, shown in error messages.
        description: what the factory creates.
    """

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description
        self.factories: dict[str, Callable[..., Any]] = {}
        self.__doc__ = f"Layer Factory '{name}': {description}"

    @property
    def names(self) -> tuple[str, ...]:
        """The registered names (upper case)."""
        return tuple(self.factories)

    def add_factory_callable(self, name: str, func: Callable[..., Any], desc: str | None = None) -> None:
        """Register ``func(*args)`` (it returns a layer type) under ``name``."""
        self.factories[name.upper()] = func

    def add_factory_class(self, name: str, cls: type, desc: str | None = None) -> None:
        """Register a layer type that does not depend on the dimension under ``name``."""
        self.add_factory_callable(name, lambda *_: cls, desc)

    def factory_function(self, name: str) -> Callable:
        """Decorator form of :py:meth:`add_factory_callable`."""

        def _register(func: Callable) -> Callable:
            self.add_factory_callable(name, func)
            return func

        return _register

    def get_constructor(self, factory_name: str, *args: Any) -> Callable[..., nn.Module]:
        """The layer type registered as ``factory_name``, built with ``args`` (e.g. the spatial dimension)."""
        if not isinstance(factory_name, str):
            raise TypeError(f"factory_name must be a str, got {type(factory_name).__name__}.")
        constructor: Callable[..., nn.Module] = look_up_option(factory_name.upper(), self.factories)(*args)
        return constructor

    def __getitem__(self, args: Any) -> Callable[..., nn.Module]:
        """``fact[name]``, ``fact[name, dim]`` or ``fact[callable]`` (returned as is)."""
        name, *rest = (args,) if callable(args) or isinstance(args, str) else args
        if callable(name):  # the caller's own layer type
            layer_type: Callable[..., nn.Module] = name
            return layer_type
        return self.get_constructor(name, *rest)

    def __getattr__(self, key: str) -> str:
        # lets callers write `Conv.CONV` for the name "CONV"
        factories = self.__dict__.get("factories", {})
        if key in factories:
            return key
        raise AttributeError(f"'{self.__dict__.get('name', 'LayerFactory')}' has no layer or attribute '{key}'.")


def split_args(args: str | tuple) -> tuple[Any, dict]:
    """Split a layer specification into ``(name_or_type, kwargs)``.

    Args:
        args: a name such as ``"relu"``, or a pair ``(name_or_type, {kwarg: value})``.

    Raises:
        TypeError: when ``args`` is neither a string nor such a pair.
    """
    if isinstance(args, str):
        return args, {}
    try:
        name, kwargs = args
    except (TypeError, ValueError):
        name, kwargs = None, None
    if not (isinstance(name, str) or callable(name)) or not isinstance(kwargs, dict):
        raise TypeError(
            "Layer specifiers must be a name string or a pair (name or layer type, dict of arguments), "
            f"got {args!r}."
        )
    return name, kwargs


Conv = LayerFactory("Conv", "convolution layers")
Norm = LayerFactory("Norm", "normalization layers")
Act = LayerFactory("Act", "activation layers")
Dropout = LayerFactory("Dropout", "dropout layers")
Pool = LayerFactory("Pool", "pooling layers")


def _by_dim(*types: type) -> Callable[[int], type]:
    def _pick(dim: int) -> type:
        if dim not in range(1, len(types) + 1):
            raise ValueError(f"spatial dimension must be one of 1..{len(types)}, got {dim}.")
        return types[dim - 1]

    return _pick


Conv.add_factory_callable("conv", _by_dim(nn.Conv1d, nn.Conv2d, nn.Conv3d))
Conv.add_factory_callable("convtrans", _by_dim(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d))

Norm.add_factory_callable("instance", _by_dim(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d))
Norm.add_factory_callable("batch", _by_dim(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d))
Norm.add_factory_class("group", nn.GroupNorm)
Norm.add_factory_class("layer", nn.LayerNorm)
Norm.add_factory_class("localresponse", nn.LocalResponseNorm)
Norm.add_factory_class("syncbatch", nn.SyncBatchNorm)

Dropout.add_factory_callable("dropout", _by_dim(nn.Dropout, nn.Dropout2d, nn.Dropout3d))
Dropout.add_factory_class("alphadropout", nn.AlphaDropout)

Pool.add_factory_callable("max", _by_dim(nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d))
Pool.add_factory_callable("avg", _by_dim(nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d))

for _name, _cls in (
    ("elu", nn.ELU),
    ("relu", nn.ReLU),
    ("leakyrelu", nn.LeakyReLU),
    ("prelu", nn.PReLU),
    ("relu6", nn.ReLU6),
    ("selu", nn.SELU),
    ("celu", nn.CELU),
    ("gelu", nn.GELU),
    ("sigmoid", nn.Sigmoid),
    ("tanh", nn.Tanh),
    ("softmax", nn.Softmax),
    ("logsoftmax", nn.LogSoftmax),
    # x * sigmoid(x) and x * tanh(softplus(x)): torch ships both, memory-efficient versions included
    ("memswish", nn.SiLU),
    ("mish", nn.Mish),
):
    Act.add_factory_class(_name, _cls)


@Act.factory_function("swish")
def _swish_factory() -> type:
    from monai.networks.layers.activations import Swish  # upstream's, with its ``alpha`` argument

    return Swish


@Act.factory_function("geglu")
def _geglu_factory() -> type:
    from monai.networks.layers.activations import GEGLU

    return GEGLU
