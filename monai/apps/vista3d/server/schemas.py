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
session bodies. ``output`` (``{"extension": ".nrrd", "dtype": "uint8"}``), which NIM clients send, chooses the
answer's format and voxel type; keys it does not know are ignored and named in the answer's ``X-Vista3D-Note``.

Every value is typed strictly (``true`` is no class id, a coordinate is a finite number, a point label is 0 or 1),
so that a bad value is a 422 naming it, never an error deeper in; JSON is read by :func:`load_json`, which refuses
nesting deeper than any request needs before the parser recurses into it.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from monai.apps.vista3d.core.prompts import Prompt, parse_prompt
from monai.apps.vista3d.labels import parse_classes

from .errors import ServeError

__all__ = ["Prompts", "OutputOptions", "InferenceRequest", "SessionRequest", "ClickRequest", "parse_body",
           "nim_prompt", "load_json", "prompt_sizes", "openapi_body", "MAX_JSON_DEPTH"]

#: arrays and objects nested deeper than this are refused (the deepest request, a click list, is 5 deep)
MAX_JSON_DEPTH = 16

ClassName = Union[StrictInt, StrictStr]
Coordinate = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Point = Annotated[list[Coordinate], Field(min_length=3, max_length=3, description="[x, y, z] voxel indices")]
PointLabel = Annotated[StrictInt, Field(ge=0, le=1, description="1 positive, 0 negative")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Prompts(_Strict):
    """``classes``: label names or ids; ``points``: ``{class: [[x, y, z], ...]}`` voxel indices of the input."""

    classes: list[ClassName] | None = None
    points: dict[str, list[Point]] | None = None
    point_labels: dict[str, list[PointLabel]] | None = None


class OutputOptions(BaseModel):
    """The answer's file: ``extension`` (its format; default the input's) and ``dtype`` (its voxel type; default
    uint8). Other keys are accepted and ignored (named in the ``X-Vista3D-Note`` header)."""

    model_config = ConfigDict(extra="allow")

    extension: Literal[".nii.gz", ".nii", ".nrrd"] | None = None
    dtype: Literal["uint8", "int16", "uint16", "int32", "float32", "float64"] | None = None

    def ignored(self) -> list[str]:
        """The keys this server does not use, as ``output.<key>``."""
        return [f"output.{k}" for k in (self.model_extra or {})]


class InferenceRequest(_Strict):
    """The NIM's inference body; ``image`` is a URL or a path under ``--data-dir`` (absent for an upload), a NIfTI,
    NRRD or zip of a DICOM series file. ``statistics`` (this server's): the structures' statistics as
    ``statistics.json`` in the zip answer (or beside the label map in ``local_working_dir``)."""

    image: str | None = None
    prompts: Prompts | None = None
    local_working_dir: str | None = None
    output: OutputOptions | None = None
    statistics: StrictBool = False


class SessionRequest(_Strict):
    """A new click session on ``image`` (absent for an upload)."""

    image: str | None = None


class ClickRequest(_Strict):
    """Clicks on a session's current object.

    ``points``: ``[[x, y, z], ...]`` voxel indices; ``point_labels``: 1 positive, 0 negative (all 1 when left out);
    ``class``: the object's class on its first click; ``reset``: start a new object first; ``return``:
    ``"labels"`` (the whole label map) or ``"box"`` (only the box where it changed since the last answer).
    """

    points: list[Point]
    point_labels: list[PointLabel] | None = None
    object_class: ClassName | None = Field(default=None, alias="class")
    reset: bool = False
    answer: Literal["labels", "box"] = Field(default="labels", alias="return")


_UNION_TAGS = {"int", "str", "float", "bool", "list", "dict", "none"}  # pydantic's names of a union's members
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _where(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if p not in _UNION_TAGS and not str(p).startswith("literal[")) or "body"


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _message(e: ValidationError) -> str:
    errors = e.errors()
    first = errors[0]
    where = _where(first["loc"])
    same = [x for x in errors if _where(x["loc"]) == where]  # the members of a union, one error each
    more = f" (and {len(errors) - len(same)} more)" if len(errors) > len(same) else ""
    if first["type"] == "extra_forbidden":
        return f"unknown field {where!r}{more}; check its spelling against the API reference"
    if first["type"] == "missing":
        return f"field {where!r} is required{more}"
    wants = [x["msg"] for x in same]
    if len(wants) > 1 and all(w.startswith("Input should be ") for w in wants):
        wants = ["Input should be " + " or ".join(dict.fromkeys(w[len("Input should be "):] for w in wants))]
    return f"{where}: {wants[0]}, got {_shown(first.get('input'))}{more}"


def _depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings not counted)."""
    bare = np.frombuffer(_STRING.sub(b'""', body), dtype=np.uint8)
    step = np.isin(bare, (ord("["), ord("{"))).astype(np.int64) - np.isin(bare, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(body: bytes | str, what: str = "the request body") -> Any:
    """Parsed JSON: 400 when it is not JSON (``NaN``/``Infinity`` included), 422 when it nests deeper than
    :data:`MAX_JSON_DEPTH` (refused before the parser recurses into it)."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    if _depth(raw) > MAX_JSON_DEPTH:
        raise ServeError(422, f"{what} nests arrays or objects more than {MAX_JSON_DEPTH} deep; no request needs that")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise ServeError(400, f"{what} is not valid JSON ({e})") from None


def parse_body(model: type[BaseModel], data: Any) -> Any:
    """``model`` from parsed JSON (or a JSON string); 422 with one line naming the first bad field."""
    if isinstance(data, str):
        data = load_json(data, "the JSON")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ServeError(422, _message(e)) from None


def prompt_sizes(prompts: Prompts | None) -> tuple[int, int]:
    """``(points, classes)`` a ``prompts`` object asks for, as given (before duplicates are merged)."""
    if prompts is None:
        return 0, 0
    return sum(len(p) for p in (prompts.points or {}).values()), len(prompts.classes or [])


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
        return parse_prompt(list(prompts.classes or []))  # some were given (the first test)
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


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its ``$defs`` written in place (the models here are not recursive), so that it
    reads the same wherever the OpenAPI document puts it."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk({**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)
    return inlined


def openapi_body(model: type[BaseModel], form: dict[str, str] | None = None) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of an endpoint that reads ``model`` as JSON (the endpoints parse their bodies
    themselves, so FastAPI cannot see them), and, with ``form``, as ``multipart/form-data`` with an ``image`` file
    and these text fields (name -> description)."""
    content: dict[str, Any] = {"application/json": {"schema": _inlined(model.model_json_schema())}}
    if form is not None:
        fields = {name: {"type": "string", "description": text} for name, text in form.items()}
        content["multipart/form-data"] = {"schema": {
            "type": "object", "required": ["image"],
            "properties": {"image": {"type": "string", "format": "binary", "description": "the image file"}, **fields},
        }}
    return {"requestBody": {"required": True, "content": content}}
