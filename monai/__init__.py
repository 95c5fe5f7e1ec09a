"""MONAI's VISTA3D inference stack: a focused fork of MONAI 1.6.1.

Only the VISTA3D networks, the sliding-window inferers, the point helpers and ``monai.apps.vista3d`` are
carried. Importing another upstream subpackage (``monai.bundle``, ``monai.data``, ...) raises an ImportError
that says so.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

from .utils.module import NOT_CARRIED, not_carried_error

__version__ = "1.6.1+vista3d"
__upstream_version__ = "1.6.1"


class _NotCarriedFinder(importlib.abc.MetaPathFinder):
    """Turns the import of any ``monai.*`` module or name this fork lacks into an ImportError that points to
    upstream MONAI: ``import monai.bundle``, ``import monai.apps.vista3d.sampler``, and through Python's
    ``from package import name`` fallback also ``from monai.networks.nets import SwinUNETR``."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != __name__:
            return None
        if parts[1] in NOT_CARRIED:
            raise not_carried_error(fullname)
        for finder in sys.meta_path:  # the finders that locate this fork's own modules
            if isinstance(finder, _NotCarriedFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        # not ModuleNotFoundError's "no such module, skip it" with a name: the import system would then hide the
        # message behind "cannot import name"
        raise ModuleNotFoundError(str(not_carried_error(fullname)))


sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_NotCarriedFinder"]  # one, also on reload
sys.meta_path.insert(0, _NotCarriedFinder())


def __getattr__(name: str):
    if name in NOT_CARRIED:
        raise not_carried_error(f"monai.{name}")
    raise AttributeError(f"module 'monai' has no attribute '{name}'")
