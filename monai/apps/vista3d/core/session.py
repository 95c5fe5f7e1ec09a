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
"""Interactive VISTA3D: one image, loaded and preprocessed once, segmented click after click.

A :class:`Vista3DSession` holds one object's clicks. Each :meth:`Vista3DSession.click` adds clicks and runs the
pipeline's stages on the preprocessed image as upstream's ``point_based_window_inferer`` is meant to be driven in
a click sequence: every click so far goes to the network, windows are placed around the new clicks only
(``point_start``), and the logits of the previous step are the ``prev_mask`` that the clicks edit (by connected
components) and that is kept wherever no new window lands. It returns the label map on the input grid, the same
as the pipeline's stages called with the same clicks and previous logits.

Example::

    from monai.apps.vista3d import Vista3DPipeline, Vista3DSession

    session = Vista3DSession(Vista3DPipeline(weights="model.pt"), "ct.nii.gz")
    labels = session.click([[210, 180, 60]], [1])  # the structure under the click
    labels = session.click([[230, 176, 58]], [0])  # a negative click takes a region away
    session.reset()  # the next click starts a new object
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from monai.apps.vista3d.errors import PromptError, Vista3DInputError
from monai.apps.vista3d.io.image_geometry import ImageGeometry
from monai.apps.vista3d.labels import parse_classes
from monai.networks.nets import VISTA3D
from monai.utils.profiling import StageTimer

from .pipeline import Vista3DPipeline
from .prompts import ClassSpec, Prompt, parse_points

__all__ = ["Vista3DSession", "WindowFeatureCache"]


class WindowFeatureCache:
    """Calls a VISTA3D in the network's place, keeping the point features of the last windows it ran.

    The point features of a window depend on the window's voxels only, so a click whose window was run before (the
    same click, or windows shifted to the same place at the image's edge) reuses them, through VISTA3D's own
    ``keep_cache`` / ``image_embeddings``, and only the point head runs. Calls with a class prompt, and calls
    without ``patch_coords``, run the network unchanged. The windows are keyed by their place only: a cache
    belongs to one image. Changed weights empty it.

    Args:
        network: a :py:class:`~monai.networks.nets.VISTA3D` (anything with ``image_embeddings`` and ``keep_cache``).
        max_windows: how many windows' features are kept (the least recently used goes first); each holds the
            point features of one window (48 channels: 200 MB at 128³ in fp16).
    """

    def __init__(self, network: VISTA3D, max_windows: int = 4):
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows}.")
        self.network = network
        self.max_windows = max_windows
        self._features: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._fingerprint: tuple = ()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._features)

    def clear(self) -> None:
        """Forget every window."""
        self._features.clear()

    def _key(self, window: torch.Tensor, patch_coords: list) -> tuple:
        device_type = window.device.type
        place = tuple((s.start, s.stop) for s in patch_coords[0][-3:])
        autocast = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        return place, tuple(window.shape), window.dtype, window.device, autocast

    def __call__(self, window: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        patch_coords = kwargs.get("patch_coords")
        if kwargs.get("class_vector") is not None or not patch_coords or args:
            passed: torch.Tensor = self.network(window, *args, **kwargs)
            return passed
        fingerprint = tuple((p.data_ptr(), p._version) for p in self.network.parameters())
        if fingerprint != self._fingerprint:
            self._features.clear()
            self._fingerprint = fingerprint
        key = self._key(window, patch_coords)
        cached = self._features.get(key)
        self.network.image_embeddings = cached
        try:
            out: torch.Tensor = self.network(window, *args, **{**kwargs, "keep_cache": True})
            features = self.network.image_embeddings
        finally:
            self.network.image_embeddings = None  # no state left in the network for other callers
        if cached is not None:
            self.hits += 1
            self._features.move_to_end(key)
        elif features is not None:  # (None: no click fell inside the window, the network ran nothing)
            self.misses += 1
            while len(self._features) >= self.max_windows:
                self._features.popitem(last=False)
            self._features[key] = features
        return out


class Vista3DSession:
    """One image, preprocessed once, and the click sequence of one object on it.

    Args:
        pipeline: the :py:class:`~monai.apps.vista3d.core.pipeline.Vista3DPipeline` whose stages run (its network,
            device, window size and autocast).
        image: a NIfTI path, or an ``[X, Y, Z]`` / ``[1, X, Y, Z]`` image in HU with ``affine``.
        affine: ``[4, 4]`` voxel-to-world affine of a tensor image.
        volume_index: volume of a 4D file.
        cache_windows: keep the point features of this many windows for later clicks
            (:class:`WindowFeatureCache`); 0 turns the cache off. Only a VISTA3D network is cached.

    Attributes:
        geometry: the file's affine and header (``None`` for a tensor image).
        record: the preprocessing record (the network grid and how to go back to the input grid).
        timings: seconds per stage of the last click (``prompts``, ``inference``, ``postprocess``, ``invert``).
    """

    def __init__(
        self,
        pipeline: Vista3DPipeline,
        image: torch.Tensor | np.ndarray | str | os.PathLike,
        affine: np.ndarray | torch.Tensor | None = None,
        volume_index: int | None = None,
        cache_windows: int = 4,
    ) -> None:
        self.pipeline = pipeline
        self.geometry: ImageGeometry | None = None
        if isinstance(image, (str, os.PathLike)):
            image, self.geometry = pipeline.load(image, volume_index=volume_index)
            affine = self.geometry.affine
        if affine is None:
            raise Vista3DInputError("give the image's [4, 4] affine (voxel -> world mm) with a tensor image")
        image = torch.as_tensor(image)
        if image.ndim not in (3, 4) or (image.ndim == 4 and image.shape[0] != 1):
            raise Vista3DInputError(f"the image must be [X, Y, Z] or [1, X, Y, Z], got shape {tuple(image.shape)}")
        self.x, self.record = pipeline.preprocess(image[None] if image.ndim == 3 else image, affine)
        network = pipeline.network
        self.feature_cache: Callable | None = None
        if cache_windows > 0 and isinstance(network, VISTA3D):
            self.feature_cache = WindowFeatureCache(network, cache_windows)
        self.timings: dict[str, float] = {}
        self.reset()

    def reset(self) -> None:
        """Forget the clicks and the previous logits: the next click starts a new object (the window features
        stay, they belong to the image)."""
        self._coords: torch.Tensor | None = None
        self._labels: torch.Tensor | None = None
        self._label_ids: list[int] | None = None
        self._logits: torch.Tensor | None = None

    @property
    def clicks(self) -> int:
        """How many clicks this object has had."""
        return 0 if self._coords is None else int(self._coords.shape[1])

    @property
    def label_ids(self) -> list[int] | None:
        """The object's class (one label id), or ``None`` for a click-only object."""
        return None if self._label_ids is None else list(self._label_ids)

    @property
    def logits(self) -> torch.Tensor | None:
        """The ``[1, 1, X, Y, Z]`` logits of the clicks so far on the network grid (the previous mask of the next
        click; NaN where no window ever landed), ``None`` before the first click."""
        return self._logits

    def _object_class(self, classes: ClassSpec) -> list[int] | None:
        """The object's class after this click's ``classes``: the first click names it, later ones may repeat it."""
        if classes is None:
            return self._label_ids
        ids = parse_classes(classes, expand_subclasses=False)
        if len(ids) != 1:
            raise PromptError(f"clicks describe one object: give at most one class, got {ids}")
        if self.clicks and ids != (self._label_ids or []):
            before = "no class" if self._label_ids is None else f"class {self._label_ids[0]}"
            raise PromptError(
                f"this object was clicked as {before}, not class {ids[0]}: call reset() to start a new object"
            )
        return ids

    def click(self, points: Any, point_labels: Any, classes: ClassSpec = None) -> torch.Tensor:
        """Add clicks to the object and segment it.

        Args:
            points: ``"x,y,z;..."`` or ``[N, 3]`` voxel indices of the input image.
            point_labels: ``"1,0"`` or ``[N]``: 1 positive, 0 negative (the special classes' 2/3 are chosen from
                the class, as the pipeline does).
            classes: the object's class (a name or label id; it selects the special classes' point labels and
                the zero-shot token), on the first click; later clicks may repeat it or leave it out.

        Returns:
            the ``[X, Y, Z]`` int16 label map on the input grid: the class's label id (1 without a class) where
            the object is, 0 elsewhere; where no window of this object has landed yet, the pipeline's
            ``unreached_label`` (0 unless the pipeline was made with 255, the bundle's).

        Raises:
            PromptError, ClassPromptError: no points, a bad class name, labels that do not fit, a point outside the
                body, or another class than the object's; the message says what to change.
        """
        pipe = self.pipeline
        if points is None or (isinstance(points, str) and not points.strip()):
            raise PromptError("a click needs points: give points='x,y,z' (voxel indices) and point_labels='1'")
        pts, labs = parse_points(points, point_labels)
        label_ids = self._object_class(classes)
        timer = StageTimer(device=pipe.device)
        with timer.stage("prompts"):
            on_grid = pipe.prompts(Prompt(label_ids, pts, labs), self.record)
            start = self.clicks
            coords, labels = on_grid["point_coords"], on_grid["point_labels"]
            assert coords is not None and labels is not None  # a click is points
            if self._coords is not None and self._labels is not None:  # the earlier clicks of this object
                coords, labels = torch.cat([self._coords, coords], 1), torch.cat([self._labels, labels], 1)
        with timer.stage("inference"):
            logits, _ = pipe.infer(
                self.x, label_ids, coords, labels, prev_mask=self._logits, point_start=start,
                network=self.feature_cache,
            )
        with timer.stage("postprocess"):
            # the next click's previous mask is the raw output (upstream's prev_mask); the click-only
            # post-processing edits the logits it is given, so it gets a copy
            raw = logits.clone() if label_ids is None else logits
            label_map, _ = pipe.postprocess(logits, label_ids, coords, labels)
            logits = raw
        with timer.stage("invert"):
            label_map = pipe.invert(label_map, self.record)
        self._coords, self._labels, self._label_ids, self._logits = coords, labels, label_ids, logits
        self.timings = dict(timer.timings)
        return label_map
