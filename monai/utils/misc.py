"""Small helpers for arguments given as a scalar or a sequence."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

import torch

__all__ = [
    "issequenceiterable",
    "ensure_tuple",
    "ensure_tuple_rep",
    "fall_back_tuple",
    "look_up_option",
    "has_option",
    "unsqueeze_left",
    "unsqueeze_right",
]


def issequenceiterable(obj: Any) -> bool:
    """Whether ``obj`` is an iterable collection (not a string, bytes or a 0-d tensor/array)."""
    if isinstance(obj, torch.Tensor):
        return obj.ndim > 0
    if hasattr(obj, "ndim") and hasattr(obj, "shape"):  # numpy arrays
        return bool(obj.ndim > 0)
    return isinstance(obj, Iterable) and not isinstance(obj, (str, bytes))


def ensure_tuple(vals: Any, wrap_array: bool = False) -> tuple:
    """Return ``vals`` as a tuple; a scalar (or, with ``wrap_array``, an array) becomes a 1-tuple."""
    if wrap_array and isinstance(vals, torch.Tensor):
        return (vals,)
    if wrap_array and hasattr(vals, "ndim") and hasattr(vals, "shape"):
        return (vals,)
    return tuple(vals) if issequenceiterable(vals) else (vals,)


def ensure_tuple_rep(tup: Any, dim: int) -> tuple:
    """Repeat a scalar ``dim`` times, or check that a sequence has ``dim`` entries.

    Raises:
        ValueError: when a sequence of another length is given.
    """
    if isinstance(tup, torch.Tensor):
        tup = tup.detach().cpu().numpy()
    if hasattr(tup, "tolist") and not isinstance(tup, (str, bytes)):
        tup = tup.tolist()
    if not issequenceiterable(tup):
        return (tup,) * dim
    if len(tup) == dim:
        return tuple(tup)
    raise ValueError(f"Sequence must have length {dim}, got {len(tup)}: {tup}.")


def fall_back_tuple(
    user_provided: Any, default: Sequence | Any, func: Callable[[Any], bool] = lambda x: x and x > 0
) -> tuple:
    """Take ``user_provided`` entries where ``func`` accepts them and ``default`` entries elsewhere.

    ``fall_back_tuple((-1, 8), (32, 32))`` is ``(32, 8)``: non-positive or ``None`` entries fall back.
    """
    ndim = len(default)
    user = ensure_tuple_rep(user_provided, ndim)
    return tuple(u if func(u) else d for u, d in zip(user, default))


def look_up_option(
    opt_str: Any, supported: Iterable | type[Enum] | None, default: Any = "no_default", print_all_options: bool = True
) -> Any:
    """Return ``opt_str`` if it is one of ``supported`` (an iterable, a mapping or an Enum class).

    Mappings return the value stored under the key, Enum classes the member (given a member or its value). Strings
    are matched with surrounding spaces stripped.

    Raises:
        ValueError: when the option is not supported and no default is given; the message suggests the closest
            option (within 3 edits) and, with ``print_all_options``, lists them all.
    """
    if not isinstance(opt_str, Hashable):
        raise ValueError(f"Unrecognized option type: {type(opt_str).__name__} {opt_str!r}; expected a hashable value.")
    if isinstance(opt_str, str):
        opt_str = opt_str.strip()
    if isinstance(supported, type) and issubclass(supported, Enum):
        if isinstance(opt_str, supported):
            return opt_str
        for member in supported:
            if (isinstance(opt_str, str) or not isinstance(opt_str, Enum)) and opt_str == member.value:
                return member
    elif isinstance(supported, Mapping):
        if opt_str in supported:
            return supported[opt_str]
    elif supported is not None and opt_str in supported:
        return opt_str
    if default != "no_default":
        return default
    choices = [m.value for m in supported] if isinstance(supported, type) else list(supported or ())
    if not choices:
        raise ValueError(f"No options available to look up {opt_str!r} in: {supported!r}.")
    message = f"Unsupported option '{opt_str}'"
    distances = {str(c): edit_distance(str(c), str(opt_str)) for c in choices}
    closest = min(distances, key=distances.__getitem__)
    message += f", did you mean '{closest}'?" if distances[closest] <= 3 else "."
    if print_all_options:
        message += f" Available options are {choices}."
    raise ValueError(message)


def edit_distance(a: str, b: str) -> int:
    """The number of single-character insertions, deletions, substitutions and adjacent swaps from ``a`` to ``b``
    (optimal string alignment), which ranks :py:func:`look_up_option`'s suggestions."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], previous2[j - 2] + 1)
        previous2, previous = previous, row
    return previous[-1]


def has_option(obj: Callable, keywords: str | Sequence[str]) -> bool:
    """Whether the callable ``obj`` (or its ``forward``) accepts every keyword in ``keywords``."""
    if not callable(obj):
        return False
    target = obj.forward if isinstance(obj, torch.nn.Module) else obj
    params = inspect.signature(target).parameters
    return all(key in params for key in ensure_tuple(keywords))


def unsqueeze_right(arr: torch.Tensor, ndim: int) -> torch.Tensor:
    """Append singleton dimensions to ``arr`` until it has ``ndim`` dimensions."""
    return arr[(...,) + (None,) * (ndim - arr.ndim)]


def unsqueeze_left(arr: torch.Tensor, ndim: int) -> torch.Tensor:
    """Prepend singleton dimensions to ``arr`` until it has ``ndim`` dimensions."""
    return arr[(None,) * (ndim - arr.ndim)]
