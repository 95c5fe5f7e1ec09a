"""Small helpers shared by the networks, inferers and apps."""

from .enums import BlendMode, InterpolateMode, PytorchPadMode, StrEnum, UpsampleMode
from .misc import (
    ensure_tuple,
    ensure_tuple_rep,
    fall_back_tuple,
    has_option,
    issequenceiterable,
    look_up_option,
    unsqueeze_left,
    unsqueeze_right,
)
from .module import OptionalImportError, exact_version, min_version, not_carried_names, optional_import
from .profiling import StageTimer, format_timings

__all__ = [
    "BlendMode", "InterpolateMode", "PytorchPadMode", "StrEnum", "UpsampleMode", "ensure_tuple", "ensure_tuple_rep",
    "fall_back_tuple", "has_option", "issequenceiterable", "look_up_option", "unsqueeze_left", "unsqueeze_right",
    "OptionalImportError", "exact_version", "min_version", "optional_import", "StageTimer", "format_timings",
]

__getattr__ = not_carried_names(__name__)  # upstream names the fork lacks raise its one-line ImportError
