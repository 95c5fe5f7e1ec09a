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
"""The VISTA3D label list and the settings of the bundle's ``configs/inference.json``.

The values ship with the package in ``vista3d_labels.json`` (recorded from the VISTA3D bundle 0.5.4), so
nothing is read from the test tree or downloaded at run time.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import ClassPromptError

__all__ = [
    "bundle_config",
    "label_names",
    "everything_labels",
    "subclass_map",
    "special_point_labels",
    "LAST_SUPPORTED",
    "parse_classes",
    "label_name",
    "totalsegmentator_aliases",
]

_DATA = Path(__file__).with_name("vista3d_labels.json")


@lru_cache(maxsize=1)
def bundle_config() -> dict[str, Any]:
    """The parsed ``vista3d_labels.json``: label names, the "everything" set, subclasses and bundle settings."""
    with open(_DATA, encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    return config


def label_names() -> dict[int, str]:
    """Label id -> name (0 is background), the 133 names of the bundle's metadata."""
    return {int(k): v for k, v in bundle_config()["label_names"].items()}


def everything_labels() -> list[int]:
    """The 117 label ids that the bundle segments when asked for "everything"."""
    return list(bundle_config()["everything_labels"])


def subclass_map() -> dict[int, list[int]]:
    """Group labels that the bundle expands into their parts, e.g. 2 ("kidney") -> [14, 5]."""
    return {int(k): list(v) for k, v in bundle_config()["subclass"].items()}


def special_point_labels() -> list[int]:
    """Classes (vessels, tumours) whose point labels 0/1 the bundle shifts to 2/3."""
    return list(bundle_config()["special_index_point_labels"])


LAST_SUPPORTED: int = int(bundle_config()["last_supported"])


def label_name(label_id: int) -> str:
    """Name of ``label_id``, or ``"label <id>"`` for ids without a name."""
    return label_names().get(int(label_id), f"label {int(label_id)}")


# TotalSegmentator's names (its v2 task "total") that name the same structure as one VISTA3D label under another
# spelling: "<part>_<side>" is VISTA3D's "<side> <part>", "rib_<side>_<n>" its "<side> rib <n>", and the renamed ones.
_TOTALSEG_SIDED = (
    "kidney", "adrenal gland", "lung upper lobe", "lung lower lobe", "kidney cyst",
    "subclavian artery", "common carotid artery", "brachiocephalic vein", "iliac artery",
    "iliac vena", "humerus", "scapula", "clavicula", "femur", "hip", "gluteus maximus", "gluteus medius",
    "gluteus minimus", "autochthon", "iliopsoas",
)
_TOTALSEG_RENAMED = {"urinary bladder": "bladder", "lung middle lobe right": "right lung middle lobe",
                     "atrial appendage left": "left atrial appendage"}


def totalsegmentator_aliases() -> dict[str, str]:
    """TotalSegmentator's class names (spelt with spaces, lower case) -> the VISTA3D name of the same structure, where
    the two map one to one; the names both tools spell alike (``liver``, ``vertebrae L1``, ...) need no alias."""
    sides = ("left", "right")
    aliases = {f"{part} {side}": f"{side} {part}" for part in _TOTALSEG_SIDED for side in sides}
    aliases.update({f"rib {side} {n}": f"{side} rib {n}" for side in sides for n in range(1, 13)})
    aliases.update(_TOTALSEG_RENAMED)
    return aliases


def _spelling(name: str) -> str:
    """A class name as it is matched: lower case, underscores as spaces (the mask files' names, TotalSegmentator's)."""
    return " ".join(name.replace("_", " ").lower().split())


@lru_cache(maxsize=1)
def _names_to_ids() -> dict[str, int]:
    """Every accepted spelling of a class name -> its label id: VISTA3D's names and TotalSegmentator's aliases."""
    ids = {_spelling(v): k for k, v in label_names().items() if k != 0}
    ids.update({alias: ids[name] for alias, name in totalsegmentator_aliases().items()})
    return ids


def _one_class(token: Any) -> int:
    if isinstance(token, bool):
        raise ClassPromptError(f"class prompt {token!r} is not a label id or name")
    if isinstance(token, int):
        label_id = token
    else:
        text = str(token).strip()
        if not text:
            raise ClassPromptError("empty class name in the class list (check for a doubled or trailing comma)")
        names_to_ids = _names_to_ids()
        if text.lstrip("+-").isdigit():
            label_id = int(text)
        elif _spelling(text) in names_to_ids:
            label_id = names_to_ids[_spelling(text)]
        else:
            close = difflib.get_close_matches(_spelling(text), names_to_ids, n=3, cutoff=0.6)
            close = list(dict.fromkeys(label_name(names_to_ids[c]) for c in close))  # said as VISTA3D names
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ClassPromptError(
                f"unknown class name {text!r}{hint} (names are those of the VISTA3D label list, "
                "e.g. 'liver', 'left kidney' or 'left_kidney', or TotalSegmentator's, e.g. 'kidney_left'; or give "
                "label ids)"
            )
    if not 1 <= label_id <= LAST_SUPPORTED:
        raise ClassPromptError(
            f"class id {label_id} is out of range: VISTA3D segments label ids 1..{LAST_SUPPORTED} "
            "(0 is background)"
        )
    return label_id


def parse_classes(spec: str | int | Iterable[str | int] | None, expand_subclasses: bool = True) -> list[int]:
    """Turn a class prompt into label ids, as the bundle's pre-transform does.

    Args:
        spec: ``"everything"`` (or None) for the bundle's 117 labels; a comma-separated string such as
            ``"3,14,liver"``; or a sequence of ids and names. Names are matched case-insensitively, underscores as
            spaces (``right_kidney``, the name of its mask file), and TotalSegmentator's names are aliases where they
            name one VISTA3D label (``kidney_right``, ``rib_left_3``, ``urinary_bladder``; see
            :func:`totalsegmentator_aliases`).
        expand_subclasses: replace group labels by their parts, e.g. "kidney" (2) by 14 and 5,
            "lung" (20) and "bone" (21) by theirs, like the bundle.

    Returns:
        label ids in prompt order, duplicates removed (first occurrence kept).

    Raises:
        ClassPromptError: for an unknown name or an id outside 1..132.
    """
    if spec is None:
        return everything_labels()
    if isinstance(spec, str):
        if spec.strip().lower() == "everything":
            return everything_labels()
        tokens: Sequence[Any] = spec.split(",")
    elif isinstance(spec, int):
        tokens = [spec]
    else:
        tokens = list(spec)
        if len(tokens) == 1 and isinstance(tokens[0], str) and tokens[0].strip().lower() == "everything":
            return everything_labels()
    if len(tokens) == 0:
        raise ClassPromptError("the class list is empty: give label ids or names, or 'everything'")
    ids = [_one_class(t) for t in tokens]
    if expand_subclasses:
        groups = subclass_map()
        ids = [part for i in ids for part in (groups.get(i, [i]))]
    return list(dict.fromkeys(ids))
