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
"""MONAI Label requests as the server's jobs, and their results as MONAI Label answers.

Two models are offered: :data:`AUTO_MODEL` (type ``segmentation``: the classes of its ``classes`` parameter,
``everything`` by default) and :data:`CLICK_MODEL` (type ``deepgrow``, 3D: the ``foreground``/``background`` voxel
indices of one object, named by ``label``). Their ``params`` are checked here into :class:`AutoRequest` and
:class:`ClickRequest`; the jobs run on the model's thread as the server's own do (the pipeline's load, then
``Vista3DPipeline.segment`` or a ``Vista3DSession``), and :func:`write_result` writes the answer on the uploaded
image's grid, in the format and voxel type asked for.

Label values. 3D Slicer's MONAI Label module does not read a label map by its values: it sorts ``label_names`` by
value and gives the i-th name the value i + 1 (``ImportLabelmapToSegmentationNode`` with segment ids). VISTA3D's
label ids have gaps (liver 1, spleen 3, ...), so the automatic answer is renumbered densely: the prompted classes in
VISTA3D's id order get 1..N, and ``label_names`` says which name each value is. A click answer is 1 on the object and
0 elsewhere (also where no window has reached yet), named by the request's ``label``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monai.apps.vista3d.core.prompts import Prompt, parse_prompt
from monai.apps.vista3d.core.session import Vista3DSession
from monai.apps.vista3d.labels import everything_labels, label_name, label_names

from . import jobs
from .errors import ServeError
from .images import LoadedImage, write_label_map

__all__ = ["AUTO_MODEL", "CLICK_MODEL", "ResultFormat", "AutoRequest", "ClickRequest", "app_info",
           "check_model", "parse_params", "prompt_sizes", "result_format", "auto_request", "click_request",
           "new_clicks", "renumber", "object_mask", "write_result", "segment", "first_click", "click"]

AUTO_MODEL = "vista3d"
CLICK_MODEL = "vista3d_clicks"
RESULT_SUFFIXES = (".nrrd", ".nii.gz", ".nii")
RESULT_DTYPES = ("uint8", "int16", "uint16", "int32", "float32", "float64")

_COMMON = ("client_id", "result_extension", "result_dtype")
_PARAMS = {AUTO_MODEL: _COMMON + ("classes",),
           CLICK_MODEL: _COMMON + ("label", "foreground", "background", "reset_state")}
_REFUSED = {"roi": "VISTA3D takes no ROI box: remove the ROI (it is for SAM2 models) and click inside the object",
            "slice": "the click model is 3D: it takes the points of every slice",
            "label_info": "DICOM SEG answers are not offered: ask for .nrrd or .nii.gz"}


# ----------------------------------------------------------------------------------------------- /info/
def _dense_names(label_ids: Sequence[int]) -> dict[str, int]:
    """``{name: value}`` of a label map that numbers ``label_ids`` 1..N in VISTA3D's id order."""
    return {label_name(i): v for v, i in enumerate(sorted(label_ids), start=1)}


def app_info(version: str, images: int) -> dict[str, Any]:
    """The ``GET /info/`` answer: this server as a MONAI Label app with two models and nothing to train.

    Args:
        version: the package version.
        images: how many uploaded images the server holds (the datastore's ``total``).
    """
    everything = everything_labels()
    clickable = [name for label_id, name in sorted(label_names().items()) if label_id != 0]
    return {
        "name": "VISTA3D",
        "description": "VISTA3D (MONAI fork): automatic segmentation of 117 CT structures, and 3D clicks",
        "version": version,
        "labels": [label_name(i) for i in sorted(everything)],
        "models": {
            AUTO_MODEL: {
                "type": "segmentation", "dimension": 3, "labels": _dense_names(everything),
                "description": "VISTA3D, automatic: the classes of 'classes' ('everything': 117 structures, or "
                               "names / ids separated by commas), numbered 1..N in VISTA3D's id order",
                "config": {"classes": "everything"},
            },
            CLICK_MODEL: {
                "type": "deepgrow", "dimension": 3, "labels": clickable,
                "description": "VISTA3D, 3D clicks: foreground and background points of the selected segment; its "
                               "name picks VISTA3D's class when it is one (e.g. 'liver'), else the points alone",
                "config": {},
            },
        },
        "trainers": {}, "strategies": {}, "scoring": {}, "train_stats": {},
        "datastore": {"total": images, "completed": 0},
    }


def check_model(model: str) -> str:
    """``model`` when this server has it; 404 naming the two it has otherwise."""
    if model not in _PARAMS:
        raise ServeError(404, f"no model {model!r} on this server: use {AUTO_MODEL!r} (automatic) or "
                              f"{CLICK_MODEL!r} (3D clicks); GET /info/ lists them")
    return model


# ------------------------------------------------------------------------------------------------ params
def parse_params(text: str | None, model: str | None = None) -> dict[str, Any]:
    """The ``params`` form field (a JSON object) of a request; for ``model``, only the parameters it takes.

    Raises:
        ServeError: 400 for text that is not JSON, 422 for another value than an object or an unknown parameter.
    """
    if text is None or not text.strip():
        return {}
    try:
        params = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ServeError(400, f"form field 'params' is not valid JSON ({type(e).__name__})") from None
    if not isinstance(params, dict):
        raise ServeError(422, f"form field 'params' must be a JSON object, got {type(params).__name__}")
    known = _PARAMS[model] if model is not None else ("client_id",)
    for key in params:
        if key in _REFUSED and model is not None:
            raise ServeError(422, f"parameter {key!r}: {_REFUSED[key]}")
        if key not in known:
            raise ServeError(422, f"unknown parameter {key!r}" + (f" for model {model!r}" if model else "")
                                  + f"; the parameters are {', '.join(known)}")
    client = params.get("client_id", "")
    if not isinstance(client, str) or len(client) > 256:
        raise ServeError(422, "parameter 'client_id' must be a string of at most 256 characters")
    return params


def prompt_sizes(params: dict[str, Any]) -> tuple[int, int]:
    """``(points, classes)`` a request's ``params`` ask for, as given and before they are parsed: what the server's
    --max-points and --max-classes bound. The click model's points are every point of the object so far (each
    request sends them all, and each goes to the network again); ``everything`` counts as no class list."""
    points = sum(len(v) for v in (params.get("foreground"), params.get("background")) if isinstance(v, list))
    classes = params.get("classes")
    if isinstance(classes, str):
        classes = classes.split(",")
    if not isinstance(classes, list) or [str(c).strip().lower() for c in classes] == ["everything"]:
        return points, 0
    return points, len(classes)


@dataclass(frozen=True)
class ResultFormat:
    """The answer's file: ``suffix`` (``.nrrd``, ``.nii.gz`` or ``.nii``) and voxel type ``dtype``."""

    suffix: str
    dtype: str


def result_format(params: dict[str, Any], image_format: str) -> ResultFormat:
    """The ``result_extension`` and ``result_dtype`` asked for (default: the uploaded image's format, uint8)."""
    suffix = params.get("result_extension") or (".nrrd" if image_format == "nrrd" else ".nii.gz")
    if suffix not in RESULT_SUFFIXES:
        raise ServeError(422, f"result_extension {suffix!r} is not offered; use one of {', '.join(RESULT_SUFFIXES)}")
    dtype = params.get("result_dtype") or "uint8"
    if dtype not in RESULT_DTYPES:
        raise ServeError(422, f"result_dtype {dtype!r} is not offered; use one of {', '.join(RESULT_DTYPES)}")
    return ResultFormat(suffix, dtype)


@dataclass(frozen=True)
class AutoRequest:
    """An automatic request: the parsed class ``prompt``, its ``label_ids`` and the answer's ``label_names`` (value
    per name)."""

    prompt: Prompt
    label_ids: list[int]
    label_names: dict[str, int]


def auto_request(params: dict[str, Any]) -> AutoRequest:
    """The automatic model's request from its ``params`` (``classes``: a string or a list; default everything).

    Raises:
        ClassPromptError: an unknown class (422 through the server's handler).
    """
    classes = params.get("classes", "everything")
    if not isinstance(classes, (str, list)) or isinstance(classes, list) and not all(
            isinstance(c, (str, int)) and not isinstance(c, bool) for c in classes):
        raise ServeError(422, "parameter 'classes' must be 'everything', names or ids separated by commas, or a "
                              "list of names / ids")
    prompt = parse_prompt(classes)
    assert prompt.label_ids is not None, "a prompt of classes alone has its label ids"
    return AutoRequest(prompt, prompt.label_ids, _dense_names(prompt.label_ids))


@dataclass(frozen=True)
class ClickRequest:
    """A click request: the object's ``label`` (and its VISTA3D class, or None), every point so far, ``reset``."""

    label: str
    class_id: int | None
    foreground: tuple[tuple[int, int, int], ...]
    background: tuple[tuple[int, int, int], ...]
    reset: bool


def _points(value: Any, what: str) -> tuple[tuple[int, int, int], ...]:
    if value is None:
        return ()
    ok = isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and np.isfinite(v) and abs(v) < 2**31 for v in p)
        for p in value)
    if not ok:
        raise ServeError(422, f"parameter {what!r} must be a list of [i, j, k] voxel indices of the uploaded image")
    return tuple(tuple(round(v) for v in p) for p in value)


def _class_of(label: str) -> int | None:
    """VISTA3D's class of a segment name (case-insensitive), or None for a name that is not one."""
    wanted = " ".join(label.split()).lower()
    return next((i for i, name in label_names().items() if i != 0 and name.lower() == wanted), None)


def click_request(params: dict[str, Any]) -> ClickRequest:
    """The click model's request from its ``params``.

    Raises:
        ServeError: 422 without a ``label``, or with points that are not voxel indices.
    """
    label = params.get("label")
    if not isinstance(label, str) or not label.strip() or len(label) > 256:
        raise ServeError(422, "parameter 'label' is required: the name of the segment the points belong to")
    fg, bg = _points(params.get("foreground"), "foreground"), _points(params.get("background"), "background")
    reset = params.get("reset_state", False)
    if not isinstance(reset, bool):
        raise ServeError(422, "parameter 'reset_state' must be true or false")
    return ClickRequest(label, _class_of(label), fg, bg, reset)


def new_clicks(foreground: Sequence, background: Sequence, request: ClickRequest) -> tuple[list, list] | None:
    """The points of ``request`` beyond the ``foreground``/``background`` clicked so far: ``(points, labels)``
    (positives first), ``([], [])`` when there is none, or None when the request does not continue them (a point was
    moved or removed): the object then starts again from all its points."""
    fg, bg = list(request.foreground), list(request.background)
    if fg[: len(foreground)] != list(foreground) or bg[: len(background)] != list(background):
        return None
    points = fg[len(foreground):] + bg[len(background):]
    return [list(p) for p in points], [1] * (len(fg) - len(foreground)) + [0] * (len(bg) - len(background))


# ---------------------------------------------------------------------------------------------- answers
def renumber(labels: torch.Tensor, values: dict[str, int], label_ids: Sequence[int]) -> torch.Tensor:
    """``labels`` (VISTA3D ids of the classes ``label_ids``) as the ``values`` of their names (uint8, on the CPU)."""
    lut = torch.zeros(256, dtype=torch.uint8)
    known = torch.zeros(256, dtype=torch.bool)
    known[0] = True
    for label_id in label_ids:
        lut[label_id] = values[label_name(label_id)]
        known[label_id] = True
    ids = labels.to("cpu", torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > 255 or not bool(known[ids].all())):
        raise RuntimeError("the label map holds a value outside its prompt's classes")
    return lut[ids]


def object_mask(label_map: torch.Tensor) -> torch.Tensor:
    """A click's label map (the object's id, 0, and 255 where no window reached) as 1 on the object, else 0."""
    return ((label_map != 0) & (label_map != 255)).to(torch.uint8)  # stays on the label map's device


def write_result(values: torch.Tensor, image: LoadedImage, path: Path, fmt: ResultFormat) -> Path:
    """Write ``values`` (``[X, Y, Z]`` on the uploaded ``image``'s grid) as ``fmt`` (``path`` ends with its suffix)
    with the image's geometry: the NIM routes' writer, :func:`~.images.write_label_map`."""
    if tuple(values.shape) != tuple(image.shape):
        raise RuntimeError(f"the answer's shape {tuple(values.shape)} is not the image's {image.shape}")
    if not path.name.endswith(fmt.suffix):
        raise RuntimeError(f"the answer's file {path.name} does not end with {fmt.suffix}")
    return write_label_map(values, image, path, dtype=fmt.dtype)


# -------------------------------------------------------------------------------- on the model's thread
def segment(path: Path, fmt: str, name: str, prompt: Prompt
            ) -> Callable[[Any], tuple[torch.Tensor, LoadedImage, dict[str, float]]]:
    """The job of an automatic request: ``(label map of VISTA3D ids, the image it answers, seconds per stage)``."""

    def job(pipeline: Any) -> tuple[torch.Tensor, LoadedImage, dict[str, float]]:
        start = time.perf_counter()
        image, affine, loaded = jobs.load(pipeline, path, fmt, name)
        seconds = time.perf_counter() - start
        result = pipeline.segment(image, affine, prompt)
        return result.labels, loaded, {"load": seconds, **result.timings}

    return job


def first_click(path: Path, fmt: str, name: str, points: list, labels: list, class_id: int | None
                ) -> Callable[[Any], tuple[Vista3DSession, LoadedImage, torch.Tensor]]:
    """The job of an object's first request: the image loaded and preprocessed once into a ``Vista3DSession``,
    and its first clicks: ``(session, the image it answers, label map)``."""

    def job(pipeline: Any) -> tuple[Vista3DSession, LoadedImage, torch.Tensor]:
        image, affine, loaded = jobs.load(pipeline, path, fmt, name)
        session = Vista3DSession(pipeline, image, affine)
        label_map = session.click(points, labels, classes=class_id)
        return session, loaded, label_map

    return job


def click(session: Vista3DSession, points: list, labels: list, class_id: int | None, reset: bool
          ) -> Callable[[Any], torch.Tensor]:
    """The job of a later request: the new clicks on the session (after a reset: all of them)."""
    return jobs.click(session, points, labels, class_id, reset)
