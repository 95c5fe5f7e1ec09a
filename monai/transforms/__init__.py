"""Only the point helpers VISTA3D calls are carried (``monai.transforms.utils``)."""

import importlib

from monai.utils.module import not_carried_error


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    try:  # a submodule this fork carries, e.g. `from monai.transforms import utils`
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    # e.g. `from monai.transforms import Compose`: MONAI's transform library is not part of this fork.
    raise not_carried_error(f"monai.transforms.{name}")
