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
    """Turns ``import monai.<upstream-only module>`` into an ImportError that points to upstream MONAI."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        parts = fullname.split(".")
        if len(parts) >= 2 and parts[0] == __name__ and parts[1] in NOT_CARRIED:
            raise not_carried_error(fullname)
        return None


if not any(isinstance(f, _NotCarriedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _NotCarriedFinder())


def __getattr__(name: str):
    if name in NOT_CARRIED:
        raise not_carried_error(f"monai.{name}")
    raise AttributeError(f"module 'monai' has no attribute '{name}'")
