"""Optional imports, and clear errors for the parts of upstream MONAI this fork does not carry."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["OptionalImportError", "optional_import", "min_version", "NOT_CARRIED", "not_carried_error"]

UPSTREAM_HINT = (
    "This is the VISTA3D inference fork of MONAI 1.6.1; it carries only the VISTA3D stack "
    "(monai.networks, monai.inferers, monai.transforms.utils point helpers, monai.apps.vista3d). "
    "Install upstream MONAI (`pip install monai==1.6.1`) in another environment for the rest."
)

# Top-level upstream subpackages that are deliberately absent here.
NOT_CARRIED = (
    "auto3dseg",
    "bundle",
    "config",
    "data",
    "engines",
    "fl",
    "handlers",
    "losses",
    "metrics",
    "optimizers",
    "visualize",
)


class OptionalImportError(ImportError):
    """An optional dependency was used but could not be imported."""


def not_carried_error(name: str) -> ImportError:
    """The ImportError raised for an upstream MONAI module or name this fork does not carry."""
    return ImportError(f"'{name}' is not part of this fork. {UPSTREAM_HINT}")


def min_version(the_module: Any, min_version_str: str = "", *_args: Any) -> bool:
    """Whether ``the_module.__version__`` is at least ``min_version_str`` (compared numerically)."""
    if not min_version_str or not hasattr(the_module, "__version__"):
        return True

    def parts(v: str) -> tuple[int, ...]:
        out = []
        for p in v.split("+")[0].split("."):
            digits = "".join(ch for ch in p if ch.isdigit())
            out.append(int(digits) if digits else 0)
        return tuple(out)

    return parts(the_module.__version__) >= parts(min_version_str)


class _Missing:
    """Stands in for an optional dependency that failed to import; any use raises with the reason."""

    def __init__(self, what: str, reason: str):
        self._what = what
        self._reason = reason

    def _fail(self, *_args: Any, **_kwargs: Any):
        raise OptionalImportError(f"{self._what} is required here but could not be imported ({self._reason}).")

    __call__ = _fail

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        self._fail()

    def __bool__(self) -> bool:
        return False


def optional_import(module: str, version: str = "", name: str = "") -> tuple[Any, bool]:
    """Import ``module`` (or ``name`` from it) if available.

    Returns:
        ``(obj, True)`` on success; otherwise ``(placeholder, False)``, where using the placeholder raises
        :class:`OptionalImportError` naming the missing package.
    """
    what = f"`from {module} import {name}`" if name else f"`import {module}`"
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return _Missing(what, f"{type(e).__name__}: {e}"), False
    if version and not min_version(mod, version):
        return _Missing(what, f"version >= {version} needed, found {getattr(mod, '__version__', '?')}"), False
    if not name:
        return mod, True
    try:
        return getattr(mod, name), True
    except AttributeError as e:
        return _Missing(what, str(e)), False
