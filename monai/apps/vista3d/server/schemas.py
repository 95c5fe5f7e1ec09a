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
"""The request bodies, as the NIM documents them (and this server's additions), and their prompts.

``POST /v1/vista3d/inference`` takes ``{"image": ..., "prompts": {"classes": [...], "points": {"spleen": [[x, y,
z], ...]}}, "local_working_dir": ...}``. The NIM keys each click list by the class it belongs to; VISTA3D's clicks
describe one object, so one key is accepted, and ``classes`` may name only that class beside it. Beyond the NIM:
``prompts.point_labels`` (``{"spleen": [1, 0]}``, 0 a negative click; all positive when left out), and the click
session bodies.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.prompts import Prompt, parse_prompt
from ..labels import parse_classes
from .errors import ServeError

__all__ = ["Prompts", "InferenceRequest", "SessionRequest", "ClickRequest", "parse_body", "nim_prompt"]

ClassName = Union[int, str]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Prompts(_Strict):
    """``classes``: label names or ids; ``points``: ``{class: [[x, y, z], ...]}`` voxel indices of the input."""

    classes: list[ClassName] | None = None
    points: dict[str, list[list[float]]] | None = None
    point_labels: dict[str, list[int]] | None = None


class InferenceRequest(_Strict):
    """The NIM's inference body; ``image`` is a URL or a path under ``--data-dir`` (absent for an upload), a NIfTI,
    NRRD or zip of a DICOM series file. ``statistics`` (this server's): the structures' statistics as
    ``statistics.json`` in the zip answer (or beside the label map in ``local_working_dir``)."""

    image: str | None = None
    prompts: Prompts | None = None
    local_working_dir: str | None = None
    statistics: bool = False


class SessionRequest(_Strict):
    """A new click session on ``image`` (absent for an upload)."""

    image: str | None = None


class ClickRequest(_Strict):
    """Clicks on a session's current object.

    ``points``: ``[[x, y, z], ...]`` voxel indices; ``point_labels``: 1 positive, 0 negative (all 1 when left out);
    ``class``: the object's class on its first click; ``reset``: start a new object first; ``return``:
    ``"labels"`` (the whole label map) or ``"box"`` (only the box where it changed since the last answer).
    """

    points: list[list[float]]
    point_labels: list[int] | None = None
    object_class: ClassName | None = Field(default=None, alias="class")
    reset: bool = False
    answer: Literal["labels", "box"] = Field(default="labels", alias="return")


def _message(e: ValidationError) -> str:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    if first["type"] == "extra_forbidden":
        return f"unknown field {where!r}{more}; check its spelling against the API reference"
    if first["type"] == "missing":
        return f"field {where!r} is required{more}"
    return f"{where}: {first['msg']}{more}"


def parse_body(model: type[BaseModel], data: Any) -> Any:
    """``model`` from parsed JSON (or a JSON string); 422 with one line naming the first bad field."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as e:
            raise ServeError(400, f"not valid JSON ({e})") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ServeError(422, _message(e)) from None


def nim_prompt(prompts: Prompts | None) -> Prompt:
    """The pipeline's :class:`~monai.apps.vista3d.core.prompts.Prompt` of a NIM ``prompts`` object (none: everything).

    Raises:
        ServeError: clicks keyed by several classes, labels for another class, or classes beside the clicks'.
        PromptError, ClassPromptError: what :func:`~monai.apps.vista3d.core.prompts.parse_prompt` refuses (422).
    """
    if prompts is None or (not prompts.points and not prompts.classes):
        if prompts is not None and prompts.point_labels:
            raise ServeError(422, "prompts.point_labels were given without prompts.points")
        return parse_prompt("everything")
    if not prompts.points:
        if prompts.point_labels:
            raise ServeError(422, "prompts.point_labels were given without prompts.points")
        return parse_prompt(list(prompts.classes))
    if len(prompts.points) != 1:
        raise ServeError(422, f"prompts.points names {len(prompts.points)} classes ({', '.join(prompts.points)}): "
                              "clicks describe one object, so send one request per object")
    key, points = next(iter(prompts.points.items()))
    labels = dict(prompts.point_labels or {})
    if set(labels) - {key}:
        raise ServeError(422, f"prompts.point_labels must be keyed by the clicked class {key!r}, got {list(labels)}")
    clicked = parse_classes([key], expand_subclasses=False)
    if prompts.classes and set(parse_classes(list(prompts.classes), expand_subclasses=False)) != set(clicked):
        raise ServeError(422, f"with clicks on {key!r}, prompts.classes may name only that class, got "
                              f"{prompts.classes}; send the other classes in a request of their own")
    return parse_prompt([key], points, labels.get(key, [1] * len(points)))
