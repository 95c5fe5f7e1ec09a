"""Optional imports, and clear errors for the parts of upstream MONAI this fork does not carry."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

__all__ = [
    "OptionalImportError",
    "optional_import",
    "min_version",
    "exact_version",
    "OPTIONAL_IMPORT_MSG_FMT",
    "not_carried_error",
    "not_carried_names",
]

UPSTREAM_HINT = (
    "This is the VISTA3D inference fork of MONAI 1.6.1; it carries only the VISTA3D stack "
    "(monai.networks, monai.inferers, monai.transforms.utils point helpers, monai.apps.vista3d). "
    "Install upstream MONAI (`pip install monai==1.6.1`) in another environment for the rest."
)

class OptionalImportError(ImportError):
    """An optional dependency was used but could not be imported."""


def not_carried_error(name: str) -> ImportError:
    """The ImportError raised for an upstream MONAI module or name this fork does not carry (its ``name`` is
    ``name``)."""
    return ImportError(f"'{name}' is not part of this fork. {UPSTREAM_HINT}", name=name)


def _is_public(name: str) -> bool:
    """Whether ``name`` could be a public name of an upstream module (an identifier without a leading underscore)."""
    return name.isidentifier() and not name.startswith("_")


def _submodule(package: str, name: str) -> ModuleType | None:
    """The submodule ``name`` of ``package``, imported; ``None`` when ``package`` is no package or has no such
    submodule. Importing the stub of an upstream module this fork lacks raises :func:`not_carried_error`."""
    if not hasattr(sys.modules.get(package), "__path__"):
        return None
    fullname = f"{package}.{name}"
    if importlib.util.find_spec(fullname) is None:
        return None
    return importlib.import_module(fullname)


def not_carried_names(module: str, names: Iterable[str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` that explains the names of upstream MONAI's ``module`` that this fork lacks.

    In a package a submodule is imported on first use, as ``from monai.networks import nets`` or ``monai.networks``
    (upstream's packages import theirs with the package); the stub of a submodule upstream has and the fork lacks
    raises :func:`not_carried_error` then. Any other public name of ``names`` (``None``: every public name), e.g.
    ``from monai.networks.nets import SwinUNETR``, raises :func:`not_carried_error`; the rest are missing.
    """
    upstream_only = None if names is None else frozenset(names)

    def __getattr__(name: str) -> Any:  # noqa: N807 - a module __getattr__, named as Python looks it up
        if not _is_public(name):
            raise AttributeError(f"module '{module}' has no attribute '{name}'")
        submodule = _submodule(module, name)
        if submodule is not None:
            return submodule
        if upstream_only is None or name in upstream_only:
            raise not_carried_error(f"{module}.{name}")
        raise AttributeError(f"module '{module}' has no attribute '{name}'")

    return __getattr__


def _version_tuple(version: str, strict: bool) -> tuple[int, ...]:
    """``(major, minor)`` of ``version``; a part with letters counts by its leading digits unless ``strict``."""
    parts = version.split("+")[0].split(".")[:2]
    if strict:
        return tuple(int(p) for p in parts)  # a malformed requirement raises ValueError, as in MONAI 1.6.1
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)


def min_version(the_module: Any, min_version_str: str = "", *_args: Any) -> bool:
    """Whether ``the_module.__version__`` is at least ``min_version_str``.

    As in MONAI 1.6.1 only the major and minor numbers are compared (``"2.4.1"`` is met by 2.4.0).

    Raises:
        ValueError: when ``min_version_str`` is not numbers separated by dots.
    """
    if not min_version_str or not hasattr(the_module, "__version__"):
        return True
    return _version_tuple(the_module.__version__, strict=False) >= _version_tuple(min_version_str, strict=True)


def exact_version(the_module: Any, version_str: str = "", *_args: Any) -> bool:
    """Whether ``the_module.__version__`` is exactly ``version_str`` (a module without a version never is)."""
    return getattr(the_module, "__version__", None) == version_str


OPTIONAL_IMPORT_MSG_FMT = "{}"


class _Missing:
    """Stands in for an optional dependency that failed to import; any use raises with the reason."""

    def __init__(self, message: str):
        self._message = message

    def _fail(self, *_args: Any, **_kwargs: Any):
        raise OptionalImportError(self._message)

    __call__ = __getitem__ = __iter__ = _fail

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        self._fail()

    def __bool__(self) -> bool:
        return False


def _missing_class(message: str, decorator: bool) -> type:
    """A stand-in class for a failed import used as a base class (constructing it raises) or, with ``decorator``,
    as a decorator factory (calling the constructed object raises)."""

    class _MissingClass(_Missing):
        def __init__(self, *_args: Any, **_kwargs: Any):
            super().__init__(message)
            if not decorator:
                self._fail()

    return _MissingClass


def optional_import(
    module: str,
    version: str = "",
    version_checker: Callable[..., bool] = min_version,
    name: str = "",
    descriptor: str = OPTIONAL_IMPORT_MSG_FMT,
    version_args: Any = None,
    allow_namespace_pkg: bool = False,
    as_type: str = "default",
) -> tuple[Any, bool]:
    """Import ``module`` (or ``name`` from it) if available, with MONAI 1.6.1's arguments.

    Args:
        module: the module to import.
        version: the version ``version_checker`` checks the top-level package against.
        version_checker: ``f(package, version)`` (``f(package, version, version_args)`` when ``version_args`` is
            given), :py:func:`min_version` by default, or :py:func:`exact_version`.
        name: an attribute to take from the module.
        descriptor: format string of the error message, given the import statement.
        version_args: extra argument for ``version_checker``.
        allow_namespace_pkg: whether a namespace package (a folder without ``__init__.py``) counts as found.
        as_type: what stands in on failure: ``"default"`` an object that raises when used, ``"decorator..."`` a class
            whose instances raise when called, anything else a class that raises when constructed (a base class).

    Returns:
        ``(obj, True)`` on success; otherwise ``(placeholder, False)``, where using the placeholder raises
        :class:`OptionalImportError` naming the missing package and the reason.

    Raises:
        ValueError: from :py:func:`min_version` when ``version`` is malformed.
    """
    statement = f"from {module} import {name}" if name else f"import {module}"
    reason = ""
    try:
        package = importlib.import_module(module.split(".")[0])
        obj = importlib.import_module(module)
        if not allow_namespace_pkg and getattr(obj, "__file__", None) is None and hasattr(obj, "__path__"):
            raise ImportError(f"{module} is a namespace package")
        if name:
            obj = getattr(obj, name)
    except Exception as e:  # any failure while importing makes the dependency unavailable, with the reason
        reason = f"{type(e).__name__}: {e}"
    else:
        args = (package, f"{version}", version_args) if version_args else (package, f"{version}")
        if version_checker(*args):
            return obj, True
        reason = f"requires '{module} {version}' by '{getattr(version_checker, '__name__', version_checker)}'"
    message = f"{descriptor.format(statement)} is required here but could not be imported ({reason})."
    if as_type == "default":
        return _Missing(message), False
    return _missing_class(message, decorator=as_type.startswith("decorator")), False
