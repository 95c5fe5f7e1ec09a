"""MONAI's VISTA3D inference stack: a focused fork of MONAI 1.6.1.

Only the VISTA3D networks, the sliding-window inferers, the point helpers and ``monai.apps.vista3d`` are
carried. The rest of upstream is explained where a user meets it, by plain modules: each upstream module the fork
lacks is a stub whose import raises an ImportError that says so (``import monai.bundle``,
``import monai.networks.nets.swin_unetr``), and the carried packages' ``__getattr__`` raise it for upstream's
other names (``from monai.networks.nets import SwinUNETR``). No import hook is installed.
"""

from __future__ import annotations

from .utils.module import not_carried_names

__version__ = "1.6.1+vista3d"
__upstream_version__ = "1.6.1"

# `monai.networks` imports the subpackage on first use, as upstream's `import monai` does; `monai.bundle` raises
__getattr__ = not_carried_names(__name__)
