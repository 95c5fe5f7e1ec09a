"""String enums shared by the networks and inferers (same names and values as upstream MONAI)."""

from __future__ import annotations

from enum import Enum

__all__ = ["StrEnum", "BlendMode", "PytorchPadMode", "UpsampleMode", "InterpolateMode"]


class StrEnum(str, Enum):
    """An ``Enum`` whose members are also plain strings, so ``mode="gaussian"`` and ``BlendMode.GAUSSIAN`` match."""

    _value_: str

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return self.value


class BlendMode(StrEnum):
    """How overlapping sliding windows are weighted."""

    CONSTANT = "constant"
    GAUSSIAN = "gaussian"


class PytorchPadMode(StrEnum):
    """Padding modes of ``torch.nn.functional.pad``."""

    CONSTANT = "constant"
    REFLECT = "reflect"
    REPLICATE = "replicate"
    CIRCULAR = "circular"


class UpsampleMode(StrEnum):
    """Upsampling methods of ``monai.networks.blocks.UpSample``."""

    DECONV = "deconv"
    DECONVGROUP = "deconvgroup"
    NONTRAINABLE = "nontrainable"
    PIXELSHUFFLE = "pixelshuffle"


class InterpolateMode(StrEnum):
    """Modes of ``torch.nn.functional.interpolate``."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    LINEAR = "linear"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    TRILINEAR = "trilinear"
    AREA = "area"
