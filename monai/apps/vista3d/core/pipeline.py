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
"""From a CT file to a VISTA3D label map: the bundle's ``configs/inference.json`` as one Python object.

Stages (each a method, each timed by :meth:`Vista3DPipeline.segment`): load -> preprocess (1.5 mm, foreground
crop, HU scaling, RAS) -> infer (sliding-window VISTA3D, or the point-window inferer for clicks) -> postprocess
(logits -> label ids) -> invert (back onto the input grid) -> save (input's affine and header). Each stage is one
room's function (:mod:`~.load_policy`, :mod:`~.preprocess`, :mod:`~.window_pass`, :mod:`~.postprocess`,
:mod:`~.nifti_write`); :meth:`~Vista3DPipeline.segment` calls them in turn, so an image leaves the pipeline once per
stage and never comes back through its methods. A run returns a :class:`SegmentationResult`; the pipeline itself
keeps no per-image state. Many files go through :func:`monai.apps.vista3d.batch.run.run_batch`.

With ``per_class=True`` a class prompt also gives one mask per class (``result.masks``, a
:class:`~.postprocess.ClassMasks`: label id -> ``[X, Y, Z]`` bool on the input grid), each class thresholded on its
own, so structures that overlap (a vessel inside an organ) are all kept; ``segment_file`` writes them as
``<output_dir>/<name>/<class name>.nii.gz`` beside the label map.

Example::

    from monai.apps.vista3d import Vista3DPipeline

    pipe = Vista3DPipeline(weights="model.pt", device="cuda")
    result = pipe.segment_file("ct.nii.gz", "out", classes="liver,spleen")
    print(result.output, result.timings)

    masks = pipe.replace(per_class=True).segment("ct.nii.gz", classes="liver,hepatic vessel").masks
    vessel_in_liver = masks[25] & masks[1]
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from monai.apps.vista3d.config import (
    OUTPUT_POSTFIX,
    ROI_MULTIPLE,
    PipelineOptions,
    check_roi_size,
    embed_dim_of,
    resolve_amp,
    resolve_device,
)
from monai.apps.vista3d.errors import PromptError, Vista3DInputError
from monai.apps.vista3d.io.image_geometry import ImageGeometry
from monai.apps.vista3d.io.load_policy import load_input
from monai.apps.vista3d.io.nifti_write import save_class_masks, save_label_map
from monai.apps.vista3d.io.paths import check_output, class_mask_dir, class_mask_paths, output_path
from monai.utils.cuda_libraries import start_first_calls
from monai.utils.profiling import StageTimer

from .auto_batch_store import AutoBatchStore
from .feasibility import check_image, check_network, check_window, check_window_passes
from .network_ready import (
    RANDOM_WEIGHTS_WARNING,
    encoder_shape,
    ready_network,
)
from .postprocess import ClassMasks, logits_to_outputs
from .preprocess import PreprocessRecord, invert_labels, preprocess_like_bundle
from .prompts import ClassSpec, Prompt, parse_prompt, prompt_on_grid
from .results import SegmentationResult
from .streaming import first_streamed_pass
from .window_pass import PassSettings, WindowPass, WindowPasses

if TYPE_CHECKING:
    from monai.networks.kernels.dispatch import FusedConfig

__all__ = [
    "Vista3DPipeline",
    "segment_file",
    "as_roi_size",
]


def as_roi_size(value: int | Sequence[int], multiple: int = 1) -> tuple[int, int, int]:
    """A window size as three ints (see :func:`~monai.apps.vista3d.config.check_roi_size`, the one check of it).

    Raises:
        SettingError: not one or three positive multiples of ``multiple``.
    """
    return check_roi_size(value, multiple)


class Vista3DPipeline:
    """The VISTA3D bundle's inference, stage by stage, on plain tensors.

    Args:
        network: a VISTA3D-like module called as ``network(x, class_vector=..., point_coords=..., ...,
            transpose=True)``; None builds ``vista3d132(**network_kwargs)``.
        weights: checkpoint to load into the network (strict; see :func:`load_checkpoint`). Without it a
            built network keeps random weights and a warning says so.
        device: where to compute (see :func:`~.config.resolve_device`); None picks CUDA when available.
        options: the per-run options (:class:`PipelineOptions`: window size, overlap, batch, amp, output type, ...).
        network_kwargs: arguments of ``vista3d132`` when building the network.
        resample_dtype: floating type of the resampling (float32; float64 reproduces MONAI to the bit).
        warn_random: warn when the network has random weights.
        fuse: run the network's fused channels-last path (``VISTA3D.fuse()``: class prompts, and the encoder of
            clicks) where its kernels run (see ``VISTA3D.fused_unavailable_reason``: a Hopper GPU with Triton);
            elsewhere, or with False, the module path runs. A ``FusedConfig`` fuses with that configuration.
        settings: any field of :class:`PipelineOptions` as a keyword (``roi_size=96``, ``sw_batch_size=4``, ...);
            it replaces that field of ``options``.

    Attributes:
        random_weights: True when the network was built here and no weights were loaded.
        roi_size, overlap, sw_batch_size, amp, progress, timing, output_dtype, streaming, nonfinite, per_class,
            unreached_label: the resolved :class:`PipelineOptions` (``options`` gives them back as one object).
    """

    roi_size: tuple[int, int, int]
    overlap: float
    sw_batch_size: int | str
    amp: bool
    progress: bool
    timing: bool
    output_dtype: str
    streaming: bool
    nonfinite: str
    per_class: bool
    unreached_label: int

    def __init__(
        self,
        network: torch.nn.Module | Callable | None = None,
        weights: str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        *,
        options: PipelineOptions | None = None,
        network_kwargs: dict | None = None,
        resample_dtype: torch.dtype = torch.float32,
        warn_random: bool = True,
        fuse: bool | FusedConfig = True,
        **settings: Any,
    ) -> None:
        from monai.networks.nets import VISTA3D

        opts = dataclasses.replace(options or PipelineOptions(), **settings)
        self.device = resolve_device(device)
        self.random_weights = network is None and weights is None
        if network is None:
            check_network(embed_dim_of(network_kwargs), self.device)
        # the streamed pass's own first launches while the network loads (amp: float16 logits)
        amp = resolve_amp(opts.amp, self.device)
        start_first_calls(self.device, functools.partial(first_streamed_pass, amp=amp), "streamed-pass-start")
        self.network = ready_network(network, weights, network_kwargs, self.device, fuse)
        if self.random_weights and warn_random:
            warnings.warn(RANDOM_WEIGHTS_WARNING, stacklevel=2)
        self.resample_dtype = resample_dtype
        self.progress_label = "windows"  # what the progress bar calls the windows (the command line adds the image)
        self._roi_multiple = ROI_MULTIPLE if isinstance(self.network, VISTA3D) else 1
        self._configure(opts)

    def _configure(self, options: PipelineOptions) -> None:
        """Set the per-run options, checked when ``options`` was built; here what needs the network and device: the
        window's multiple of 16 and its fit (VISTA3D), and ``amp``'s default (the network and device stay)."""
        from monai.networks.nets import VISTA3D

        for f in dataclasses.fields(PipelineOptions):
            setattr(self, f.name, getattr(options, f.name))
        self.roi_size = as_roi_size(options.roi_size, self._roi_multiple)
        if self._roi_multiple == ROI_MULTIPLE:
            width, halvings = encoder_shape(self.network)
            check_window(self.roi_size, width, self.device, halvings)
        self.amp = resolve_amp(options.amp, self.device)
        # the stitch's Triton window add is a setting of the fused path: on where the network was fused with it
        fused = self.network.fused_config if isinstance(self.network, VISTA3D) else None
        settings = PassSettings(self.roi_size, self.overlap, self.sw_batch_size, self.amp, self.progress, self.timing,
                                window_add=fused is not None and fused.stitch_window_add)
        # "auto"'s window costs outlive the process beside the kernel cache (GPU memory is what it measures)
        keep = self.sw_batch_size == "auto" and self.device.type == "cuda"
        store = AutoBatchStore.in_kernel_cache() if keep else None
        self._passes = WindowPasses(self.network, self.device, settings, store)  # one per setting

    def replace(self, **options: Any) -> Vista3DPipeline:
        """A pipeline sharing this one's network with other options (``sw_batch_size``, ``streaming``, ...).

        Raises:
            TypeError: a keyword that is no field of :class:`PipelineOptions` (as the constructor).
            SettingError: a value that cannot be used (nothing changes).
        """
        changed = dataclasses.replace(self.options, **options)  # checked here, before anything changes
        other = copy.copy(self)
        other._configure(changed)
        return other

    @property
    def options(self) -> PipelineOptions:
        """This pipeline's per-run options, as resolved (``amp`` a bool, ``roi_size`` three ints)."""
        return PipelineOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PipelineOptions)})

    # ----------------------------------------------------------------------------------------------- stages
    def load(
        self, path: str | os.PathLike, volume_index: int | None = None, nonfinite: str | None = None
    ) -> tuple[torch.Tensor, ImageGeometry]:
        """Read a NIfTI file onto the pipeline's device: ``([1, X, Y, Z] HU, ImageGeometry)``.

        See :func:`~.load_policy.load_input`, the one load policy of the app; ``nonfinite`` defaults to the
        pipeline's.
        """
        return load_input(path, self.device, volume_index, nonfinite or self.nonfinite)

    def preprocess(
        self, image: torch.Tensor, affine: np.ndarray | torch.Tensor
    ) -> tuple[torch.Tensor, PreprocessRecord]:
        """The bundle's preprocessing on this pipeline's device: ``([1, X', Y', Z'] float32, record)``."""
        return preprocess_like_bundle(self._on_device(image), affine, self.resample_dtype)

    def _on_device(self, image: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(image).to(self.device, non_blocking=True)

    def prompts(self, prompt: Prompt, record: PreprocessRecord) -> dict[str, Any]:
        """Express a parsed prompt on this image's network grid.

        Returns:
            dict with ``label_ids`` (list or None), ``point_coords`` ``[1, N, 3]`` and ``point_labels``
            ``[1, N]`` tensors on the network grid (or None).

        Raises:
            PromptError: a point outside the image, or in the air cropped away by the preprocessing.
        """
        return prompt_on_grid(prompt, record, self.device)

    def infer(
        self,
        x: torch.Tensor,
        label_ids: Sequence[int] | None = None,
        point_coords: torch.Tensor | None = None,
        point_labels: torch.Tensor | None = None,
        prev_mask: torch.Tensor | None = None,
        point_start: int = 0,
        network: Callable | None = None,
    ) -> tuple[torch.Tensor, WindowPass]:
        """Run VISTA3D on the preprocessed image.

        Args:
            x: ``[1, X, Y, Z]`` preprocessed image.
            label_ids: class prompt (label ids); with points, the clicked object's class (or None).
            point_coords: ``[1, N, 3]`` points on the network grid, or None for class prompts.
            point_labels: ``[1, N]`` point labels (0/1, or 2/3 for special classes).
            prev_mask: with points, the ``[1, 1, X, Y, Z]`` logits of the earlier clicks of this object (what this
                method returned for them): the clicks edit it, and it is kept where no window lands (upstream's
                ``point_based_window_inferer``).
            point_start: with points, windows are placed around the points from this index on only (the earlier
                ones shaped ``prev_mask``); every point is still given to the network.
            network: called in the network's place (e.g. a :class:`~.session.WindowFeatureCache` around it).

        Returns:
            ``([1, C, X, Y, Z] logits, what ran)``; the logits are NaN where the point inferer has no window
            (``prev_mask`` there when given).
        """
        return self._passes.logits(x, label_ids, point_coords, point_labels, prev_mask, point_start, network,
                                   title=self.progress_label)

    def stream(self, x: torch.Tensor, label_ids: Sequence[int]) -> tuple[torch.Tensor, ClassMasks | None, WindowPass]:
        """Class prompts straight to the label map on the network grid, never holding every class's logits.

        The streamed path of :func:`~monai.apps.vista3d.core.streaming.sliding_window_label_inference`: the same
        labels as :meth:`infer` followed by :meth:`postprocess`, with memory bounded by a slab of the volume; with
        ``per_class`` also one mask per class from the same pass (each finished tile thresholded class by class,
        logit > 0, 8 classes a byte). It has no out-of-memory fallback and no per-stage split.

        Returns:
            ``([X, Y, Z] int16 label map, the masks or None, what ran)`` on the pipeline's device.
        """
        return self._passes.stream(x, label_ids, self.per_class, self.progress_label)

    def postprocess(
        self,
        logits: torch.Tensor,
        label_ids: Sequence[int] | None,
        point_coords: torch.Tensor | None = None,
        point_labels: torch.Tensor | None = None,
        unreached_label: int | None = None,
    ) -> tuple[torch.Tensor, ClassMasks | None]:
        """Logits -> ``[X, Y, Z]`` int16 label map on the network grid (upstream's ``VistaPostTransformd``), and with
        ``per_class`` one mask per class, each thresholded on its own (logit > 0; no NaN voxel is in a mask).

        A point-only prompt (no class) first keeps only the connected components that hold a positive point. Voxels
        no point window reached (NaN logits) get ``unreached_label`` (None: the pipeline's option).
        """
        fill = self.unreached_label if unreached_label is None else unreached_label
        # computed where the inferer stitched (the adaptive inferer may have fallen back to the CPU for lack of GPU
        # memory): only the small results move
        labels, masks = logits_to_outputs(logits, label_ids, point_coords, point_labels, self.per_class, fill)
        return labels.to(self.device), None if masks is None else masks.to(self.device)

    def invert(self, labels: torch.Tensor, record: PreprocessRecord) -> torch.Tensor:
        """Bring a label map back onto the input grid (nearest), like the bundle's ``Invertd``.

        Nearest-neighbour resampling moves whole voxels, so packed masks (``ClassMasks.packed``) are inverted the
        same way, 8 classes at a time; outside the foreground crop everything is 0 (background).
        """
        return invert_labels(labels, record)

    def warm_up(self, sw_batch_size: int, label_ids: Sequence[int]) -> None:
        """One network call on a batch of blank windows: backends pick their kernels per input shape."""
        x = torch.zeros((sw_batch_size, 1, *self.roi_size), device=self.device)
        cv = self._passes.class_vector(label_ids)
        coords = [(slice(None), slice(None), *(slice(0, r) for r in self.roi_size))] * sw_batch_size
        with torch.no_grad(), self._passes.autocast():
            self.network(x, patch_coords=coords, class_vector=cv, prompt_class=cv, transpose=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------------------------------ whole runs
    def segment(
        self,
        image: torch.Tensor | str | os.PathLike,
        affine: np.ndarray | torch.Tensor | None = None,
        classes: ClassSpec | Prompt = "everything",
        points: Any = None,
        point_labels: Any = None,
        volume_index: int | None = None,
    ) -> SegmentationResult:
        """Segment one image: a NIfTI path, or a tensor with its affine.

        Args:
            image: ``[1, X, Y, Z]`` or ``[X, Y, Z]`` image in HU, or a ``.nii`` / ``.nii.gz`` path.
            affine: ``[4, 4]`` voxel-to-world (RAS mm) affine of a tensor image.
            classes: a :class:`~.prompts.Prompt` (parsed once for many images), or the class prompt:
                ``"everything"`` for the bundle's 117 labels; with points one class or None.
            points: ``"x,y,z;..."`` or ``[N, 3]`` voxel indices of ``image``.
            point_labels: ``"1,0,..."`` or ``[N]``, one per point.
            volume_index: volume of a 4D file.

        Returns:
            the label map on the input grid with the stage timings, windows and preprocessing record; with
            ``per_class`` also the masks of the prompted classes on the input grid; for a path, the file's
            ``geometry`` (what saving needs).

        Raises:
            PromptError: ``per_class`` with a point prompt that names no class.
        """
        prompt = parse_prompt(classes, points, point_labels)
        self._check_per_class(prompt)
        timer = StageTimer(device=self.device)
        geometry = None
        if isinstance(image, (str, os.PathLike)):
            with timer.stage("load"):
                image, geometry = self.load(image, volume_index)
            affine = geometry.affine
        if affine is None:
            raise ValueError("give the image's [4, 4] affine (voxel -> world mm) with a tensor input")
        with timer.stage("preprocess"):
            x, record = self.preprocess(image, affine)
        on_grid = self.prompts(prompt, record)
        if on_grid["point_coords"] is None:  # a sliding-window pass over the whole image
            check_window_passes(x.shape[1:], self.roi_size, self.overlap, "this image")
        if self.streaming and on_grid["point_coords"] is None:
            with timer.stage("inference"):
                labels, masks, run = self.stream(x, on_grid["label_ids"])
            timer.set("postprocess", 0.0)  # done inside the streamed inference
        else:
            with timer.stage("inference"):
                logits, run = self.infer(x, **on_grid)
            with timer.stage("postprocess"):
                labels, masks = self.postprocess(logits, **on_grid)
            del logits
        with timer.stage("invert"):
            labels = self.invert(labels, record)
            if masks is not None:
                masks = ClassMasks(self.invert(masks.packed, record), masks.label_ids)
        timings = {**timer.timings, **run.stages}
        return SegmentationResult(labels, timings, run.windows, run.sw_batch_size, record, masks=masks,
                                  geometry=geometry)

    def _check_per_class(self, prompt: Prompt) -> None:
        if self.per_class and not prompt.label_ids:
            raise PromptError(
                "per-class masks need classes: give classes= (or 'everything'), or one class with the points"
            )

    def __call__(
        self,
        image: torch.Tensor | str | os.PathLike,
        affine: np.ndarray | torch.Tensor | None = None,
        classes: ClassSpec | Prompt = "everything",
        points: Any = None,
        point_labels: Any = None,
        volume_index: int | None = None,
    ) -> torch.Tensor:
        """The ``[X, Y, Z]`` int16 label map of :meth:`segment`."""
        return self.segment(image, affine, classes, points, point_labels, volume_index).labels

    def segment_file(
        self,
        path: str | os.PathLike,
        output_dir: str | os.PathLike,
        classes: ClassSpec | Prompt = "everything",
        points: Any = None,
        point_labels: Any = None,
        volume_index: int | None = None,
        overwrite: bool = False,
    ) -> SegmentationResult:
        """Segment one NIfTI file and write ``output_dir/<name>/<name>_trans.nii.gz``.

        With ``per_class`` it also writes one uint8 mask per prompted class, ``output_dir/<name>/<class
        name>.nii.gz`` (names of the label list, spaces as underscores; see :func:`~.nifti.class_mask_paths`).

        Returns:
            the result, with ``output`` the file written (and ``mask_outputs`` the masks) and ``timings["save"]``.

        Raises:
            OutputPathError: an output would overwrite the input, exists (without ``overwrite``), or cannot
                be written.
        """
        path = Path(path)
        if path.is_dir():
            raise Vista3DInputError(f"{path}: is a folder, not an image; give a .nii or .nii.gz file.")
        if not path.is_file():
            raise Vista3DInputError(f"{path}: no such file; check the path.")
        prompt = parse_prompt(classes, points, point_labels)
        self._check_per_class(prompt)
        out_path = output_path(path, output_dir, OUTPUT_POSTFIX)
        check_output(path, out_path, overwrite)
        if self.per_class:
            for mask_path in class_mask_paths(class_mask_dir(path, output_dir), prompt.label_ids).values():
                check_output(path, mask_path, overwrite)
        check_image(path, self.device, options=self.options)
        result = self.segment(path, classes=prompt, volume_index=volume_index)
        geometry = result.geometry
        assert geometry is not None  # a file's segmentation carries its geometry
        timer = StageTimer(device=self.device)
        with timer.stage("save"):
            result.output = Path(save_label_map(result.labels, geometry, out_path, dtype=self.output_dtype))
            if result.masks is not None:
                folder = class_mask_dir(path, output_dir)
                result.mask_outputs = save_class_masks(result.masks, geometry, folder)
        result.timings = {**result.timings, "save": timer.timings["save"]}
        return result


def segment_file(path: str | os.PathLike, output_dir: str | os.PathLike, **kwargs: Any) -> SegmentationResult:
    """One-call form: ``Vista3DPipeline(**pipeline_kwargs).segment_file(path, output_dir, **prompt_kwargs)``.

    Keyword arguments of :meth:`Vista3DPipeline.segment_file` (``classes``, ``points``, ``point_labels``,
    ``volume_index``, ``overwrite``) go to it, the others to the constructor.
    """
    call_keys = {"classes", "points", "point_labels", "volume_index", "overwrite"}
    call = {k: kwargs.pop(k) for k in list(kwargs) if k in call_keys}
    return Vista3DPipeline(**kwargs).segment_file(path, output_dir, **call)
