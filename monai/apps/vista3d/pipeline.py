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

Stages (each a method, each timed): load -> preprocess (1.5 mm, foreground crop, HU scaling, RAS) ->
infer (sliding-window VISTA3D, or the point-window inferer for clicks) -> postprocess (logits -> label ids)
-> invert (back onto the input grid) -> save (input's affine and header).

Example::

    from monai.apps.vista3d.pipeline import Vista3DPipeline

    pipe = Vista3DPipeline(weights="model.pt", device="cuda")
    out_path = pipe.segment_file("ct.nii.gz", "out", classes="liver,spleen")
    print(pipe.timings)
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import CheckpointError, OutputPathError, PromptError, Vista3DInputError
from .io import DEFAULT_OUTPUT_DTYPE, output_path
from .labels import bundle_config, parse_classes, special_point_labels
from .postprocess import logits_to_labels
from .preprocess import PreprocessRecord, input_to_preprocessed_coords, invert_labels, preprocess

__all__ = [
    "Vista3DPipeline",
    "RANDOM_WEIGHTS_WARNING",
    "build_network",
    "load_checkpoint",
    "parse_points",
    "output_path_for",
    "segment_file",
    "count_windows",
]

RANDOM_WEIGHTS_WARNING = (
    "WARNING: no --weights given: the VISTA3D network has RANDOM weights, the label maps are MEANINGLESS "
    "(use only to test the pipeline or measure speed; pass the bundle's models/model.pt for real results)"
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_network(network_kwargs: dict | None = None) -> torch.nn.Module:
    """``vista3d132(**network_kwargs)`` of this fork, in eval mode (random weights)."""
    from monai.networks.nets import vista3d132

    return vista3d132(**(network_kwargs or {})).eval()


def load_checkpoint(network: torch.nn.Module, path: str | os.PathLike) -> torch.nn.Module:
    """Load a VISTA3D checkpoint strictly, saying which keys or shapes do not match.

    Accepts a plain state dict (the bundle's ``models/model.pt``) or one nested under ``"state_dict"``,
    ``"model"`` or ``"network"``; a ``"module."`` prefix (DataParallel) is dropped.

    Raises:
        CheckpointError: the file cannot be read, or its keys or shapes differ from the network's.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {type(e).__name__}: {e}".splitlines()[0]) from e
    for key in ("state_dict", "model", "network"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a state dict of tensors")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    own = network.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [f"{k}: checkpoint {tuple(sd[k].shape)} vs network {tuple(own[k].shape)}"
              for k in own if k in sd and sd[k].shape != own[k].shape]

    def _few(items: list[str]) -> str:
        return ", ".join(items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")

    problems = []
    if missing:
        problems.append(f"{len(missing)} missing keys: {_few(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys: {_few(unexpected)}")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatches: {_few(shapes)}")
    if problems:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not match the VISTA3D network: " + "; ".join(problems)
            + " (is it a vista3d132 checkpoint, e.g. the bundle's models/model.pt?)"
        )
    network.load_state_dict(sd, strict=True)
    return network


def parse_points(
    points: str | Sequence[Sequence[float]] | np.ndarray | torch.Tensor | None,
    point_labels: str | Sequence[int] | np.ndarray | torch.Tensor | None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Parse point prompts: ``"x,y,z;x,y,z"`` (voxel indices of the input image) and ``"1,0"``.

    Returns:
        ``(points [N, 3] float64, labels [N] int64)`` or ``(None, None)``.

    Raises:
        PromptError: points without labels (or the reverse), a count mismatch, a label not 0/1, bad syntax.
    """
    if points is None and point_labels is None:
        return None, None
    if points is None:
        raise PromptError("point labels were given without points (--points 'x,y,z;...')")
    if point_labels is None:
        raise PromptError("points were given without labels: add --point-labels with one 1 (positive) or "
                          "0 (negative) per point")
    try:
        if isinstance(points, str):
            pts = np.array([[float(v) for v in p.split(",")] for p in points.split(";") if p.strip()],
                           dtype=np.float64)
        else:
            pts = np.asarray(points.cpu() if isinstance(points, torch.Tensor) else points, dtype=np.float64)
        if isinstance(point_labels, str):
            labs = np.array([int(v) for v in point_labels.split(",") if v.strip()], dtype=np.int64)
        else:
            raw = point_labels.cpu() if isinstance(point_labels, torch.Tensor) else point_labels
            labs = np.asarray(raw, dtype=np.int64).reshape(-1)
    except (ValueError, TypeError) as e:
        raise PromptError(f"cannot parse the points/labels ({e}): use --points 'x,y,z;x,y,z' --point-labels 1,0")
    pts = pts.reshape(-1, pts.shape[-1]) if pts.size else pts.reshape(0, 3)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise PromptError(f"each point needs 3 coordinates x,y,z; got points of shape {tuple(pts.shape)}")
    if len(pts) == 0:
        raise PromptError("no points given")
    if len(labs) != len(pts):
        raise PromptError(f"{len(pts)} points but {len(labs)} point labels: give one label per point")
    if not np.isin(labs, (0, 1)).all():
        raise PromptError(f"point labels must be 1 (positive) or 0 (negative), got {labs.tolist()}")
    if not np.isfinite(pts).all():
        raise PromptError("point coordinates must be finite numbers")
    return pts, labs


def count_windows(image_size: Sequence[int], roi_size: Sequence[int], overlap: float | Sequence[float]) -> int:
    """Number of sliding windows MONAI's scan takes over ``image_size`` (after padding to ``roi_size``)."""
    ov = [float(o) for o in (overlap if isinstance(overlap, Sequence) else [overlap] * len(image_size))]
    n = 1
    for s, r, o in zip(image_size, roi_size, ov):
        s, r = max(int(s), int(r)), int(r)
        step = max(int(r * (1 - o)), 1)
        n *= 1 if s <= r else math.ceil((s - r) / step) + 1
    return n


class _Progress:
    """Counts windows; tqdm on a terminal when installed, else a one-line counter on stderr."""

    def __init__(self, total: int, enabled: bool, desc: str = "windows"):
        self.total, self.n, self.enabled, self.desc = total, 0, enabled, desc
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="win", leave=False, file=sys.stderr)
            except ImportError:
                self.bar = None

    def update(self, k: int) -> None:
        self.n += k
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(k)
        else:
            sys.stderr.write(f"\r{self.desc}: {min(self.n, self.total)}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\r" + " " * (len(self.desc) + 24) + "\r")
            sys.stderr.flush()


class _CountingPredictor:
    """Wraps the network to advance a progress counter by the windows of each call."""

    def __init__(self, network: Callable, progress: _Progress):
        self.network, self.progress = network, progress

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = self.network(x, *args, **kwargs)
        self.progress.update(int(x.shape[0]))
        return out


#: the bundle's output naming (``output_dir/<name>/<name>_trans.nii.gz``), as in ``monai.apps.vista3d.io``
output_path_for = output_path


def _check_output(input_path: Path | None, out_path: Path, overwrite: bool) -> None:
    if input_path is not None and out_path.resolve() == input_path.resolve():
        raise OutputPathError(f"the output path {str(out_path)!r} is the input file: choose another --output-dir")
    if out_path.exists() and not overwrite:
        raise OutputPathError(f"{str(out_path)!r} exists: pass --overwrite (overwrite=True) to replace it")
    parent = out_path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"cannot create the output folder {str(parent)!r}: {e.strerror or e}") from e
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"the output folder {str(parent)!r} is not writable")


class Vista3DPipeline:
    """The VISTA3D bundle's inference, stage by stage, on plain tensors.

    Args:
        network: a VISTA3D-like module called as ``network(x, class_vector=..., point_coords=..., ...,
            transpose=True)``; None builds ``vista3d132(**network_kwargs)``.
        weights: checkpoint to load into the network (strict; see :func:`load_checkpoint`). Without it a
            built network keeps random weights and a warning says so.
        device: where to compute (``"cuda"``/``"cpu"``); None picks CUDA when available.
        roi_size: sliding-window size (the bundle's 128³).
        overlap: window overlap (the bundle's 0.25).
        sw_batch_size: windows per network call, or ``"auto"`` (the inferer's choice: from a one-window memory
            probe on CUDA, up to 4 on CPU).
        amp: float16 autocast on CUDA; None means on for CUDA, off for CPU.
        progress: a progress bar over the windows.
        timing: ask the inferer for its own stage timings (when the inferer supports ``timing``).
        network_kwargs: arguments of ``vista3d132`` when building the network.
        resample_dtype: floating type of the resampling (float32; float64 reproduces MONAI to the bit).
        output_dtype: voxel type of saved label maps: ``"uint8"`` (default; every label id and the 255 sentinel
            fit), ``"int16"``, or ``"float32"`` (what the bundle writes, 4x the bytes).
        streaming: class prompts go through the streamed label-map path (:meth:`infer_labels`), which never
            holds all classes' logits for the whole volume; False keeps upstream's full-logits path with its
            out-of-memory fallback (:meth:`infer` + :meth:`postprocess`). Point prompts always use the latter.

    Attributes:
        timings: seconds per stage of the last run (``load``, ``preprocess``, ``inference`` with
            ``inference/<stage>`` from the inferer when available, ``postprocess``, ``invert``, ``save``).
        record: the :class:`PreprocessRecord` of the last image.
        random_weights: True when the network was built here and no weights were loaded.
    """

    def __init__(
        self,
        network: torch.nn.Module | Callable | None = None,
        weights: str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        roi_size: Sequence[int] = (128, 128, 128),
        overlap: float = 0.25,
        sw_batch_size: int | str = 1,
        amp: bool | None = None,
        progress: bool = False,
        timing: bool = True,
        network_kwargs: dict | None = None,
        resample_dtype: torch.dtype = torch.float32,
        output_dtype: str = DEFAULT_OUTPUT_DTYPE,
        warn_random: bool = True,
        streaming: bool = True,
    ) -> None:
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for but CUDA is not available here: use --device cpu")
        self.random_weights = False
        if network is None:
            network = build_network(network_kwargs)
            self.random_weights = weights is None
        if weights is not None:
            if not isinstance(network, torch.nn.Module):
                raise ValueError("weights can only be loaded into a torch.nn.Module network")
            load_checkpoint(network, weights)
        if isinstance(network, torch.nn.Module):
            network = network.to(self.device).eval()
        if self.random_weights and warn_random:
            warnings.warn(RANDOM_WEIGHTS_WARNING, stacklevel=2)
        self.network = network
        self.roi_size = tuple(int(r) for r in roi_size)
        self.overlap = float(overlap)
        if not (isinstance(sw_batch_size, str) and sw_batch_size == "auto") and int(sw_batch_size) < 1:
            raise ValueError(f"sw_batch_size must be >= 1 or 'auto', got {sw_batch_size!r}")
        self.sw_batch_size = sw_batch_size
        self.amp = (self.device.type == "cuda") if amp is None else bool(amp)
        self.progress = progress
        self.timing = timing
        self.resample_dtype = resample_dtype
        if output_dtype not in ("float32", "uint8", "int16"):
            raise ValueError(f"output_dtype must be float32, uint8 or int16, got {output_dtype!r}")
        self.output_dtype = output_dtype
        self.streaming = streaming
        self.timings: dict[str, float] = {}
        self.record: PreprocessRecord | None = None
        self.n_windows = 0
        self.last_sw_batch_size = 1

    # ----------------------------------------------------------------------------------------------- stages
    def load(self, path: str | os.PathLike, volume_index: int | None = None) -> tuple[torch.Tensor, Any]:
        """Read a NIfTI file onto the pipeline's device: ``([1, X, Y, Z] HU, ImageGeometry)``.

        On the CPU the image is float32 and C-contiguous (converted slab by slab while the file inflates). On an
        accelerator the voxels keep their stored type (int16 for a CT) and the file's layout, so only the stored
        bytes cross, slab by slab while the file inflates, and :meth:`preprocess` converts them there (see
        ``monai.apps.vista3d.io.load_image``).
        """
        from .io import load_image

        t0 = time.perf_counter()
        image, geometry = load_image(path, volume_index=volume_index, device=self.device, **self._load_options())
        self.timings["load"] = time.perf_counter() - t0
        return image, geometry

    def _load_options(self) -> dict[str, Any]:
        # an accelerator gets the stored values in file order and converts them itself (fast there); the CPU
        # converts to float32 in C order while the file inflates
        return {} if self.device.type == "cpu" else {"dtype": None, "contiguous": False}

    def preprocess(self, image: torch.Tensor, affine: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, PreprocessRecord]:
        """The bundle's preprocessing on this pipeline's device: ``([1, X', Y', Z'] float32, record)``."""
        t0 = time.perf_counter()
        x = torch.as_tensor(image).to(self.device, non_blocking=True)
        if not x.dtype.is_floating_point:
            x = x.float()
        x = x.contiguous()  # a file-order image (see load) is re-laid out here; resampling strided data is slow
        cfg = bundle_config()["preprocessing"]
        sir = cfg["scale_intensity_range"]
        out, record = preprocess(
            x,
            affine,
            pixdim=cfg["resample_spacing_mm"],
            margin=cfg["crop_foreground"]["margin"],
            allow_smaller=cfg["crop_foreground"]["allow_smaller"],
            a_min=sir["a_min"],
            a_max=sir["a_max"],
            b_min=sir["b_min"],
            b_max=sir["b_max"],
            axcodes=cfg["orientation"],
            dtype=self.resample_dtype,
        )
        _sync(self.device)
        self.timings["preprocess"] = time.perf_counter() - t0
        self.record = record
        return out, record

    def _sliding_inferer(self) -> Any:
        """The sliding-window inferer, kept across calls so that ``sw_batch_size="auto"`` probes only once."""
        from monai.inferers import SlidingWindowInfererAdapt

        key = (self.roi_size, self.sw_batch_size, self.overlap, self.timing)
        if getattr(self, "_inferer_key", None) != key:
            kw: dict[str, Any] = dict(roi_size=self.roi_size, sw_batch_size=self.sw_batch_size, overlap=self.overlap,
                                      with_coord=True)
            self._inferer = _make_inferer(SlidingWindowInfererAdapt, kw, self.timing)
            self._inferer_key = key
        return self._inferer

    def prompts(
        self,
        classes: str | Sequence[int | str] | None,
        points: np.ndarray | None,
        point_labels: np.ndarray | None,
        record: PreprocessRecord,
    ) -> dict[str, Any]:
        """Validate the prompts and express them on the network grid.

        Args:
            classes: class prompt (see :func:`~monai.apps.vista3d.labels.parse_classes`); with points at most
                one class (the clicked object's), None for a point-only prompt.
            points: ``[N, 3]`` voxel indices in the input image, or None.
            point_labels: ``[N]`` 1 (positive) / 0 (negative).
            record: preprocessing record of the image.

        Returns:
            dict with ``label_ids`` (list or None), ``point_coords`` ``[1, N, 3]`` and ``point_labels``
            ``[1, N]`` tensors on the network grid (or None).
        """
        if points is None:
            return {"label_ids": parse_classes(classes), "point_coords": None, "point_labels": None}
        shape = np.asarray(record.input_shape)
        outside = [p.tolist() for p in points if (p < -0.5).any() or (p > shape - 0.5).any()]
        if outside:
            raise PromptError(
                f"point(s) {outside} lie outside the image (voxel indices must be within 0..{(shape - 1).tolist()})"
            )
        label_ids = None
        if classes is not None and not (isinstance(classes, str) and classes.strip().lower() == "everything"):
            label_ids = parse_classes(classes, expand_subclasses=False)
            if len(label_ids) != 1:
                raise PromptError(f"points describe one object: give at most one class with points, got {label_ids}")
        coords = input_to_preprocessed_coords(points, record)
        fshape = np.asarray(record.final_shape)
        cropped = [p.tolist() for p, c in zip(points, coords) if (c < -0.5).any() or (c > fshape - 0.5).any()]
        if cropped:
            raise PromptError(
                f"point(s) {cropped} lie in the air outside the body, beyond the foreground crop of the bundle; "
                "click inside the body"
            )
        labs = np.asarray(point_labels, dtype=np.int64).copy()
        if label_ids is not None and label_ids[0] in special_point_labels():
            labs = labs + 2  # the bundle's special classes (vessels, tumours) use labels 2/3
        return {
            "label_ids": label_ids,
            "point_coords": torch.as_tensor(coords, dtype=torch.float32, device=self.device)[None],
            "point_labels": torch.as_tensor(labs, device=self.device)[None],
        }

    def _predictor(self, progress: _Progress) -> _CountingPredictor:
        # one wrapper for the pipeline's life: the inferer's "auto" batch size caches its probe per predictor
        if getattr(self, "_counting", None) is None or self._counting.network is not self.network:
            self._counting = _CountingPredictor(self.network, progress)
        self._counting.progress = progress
        return self._counting

    def _autocast(self):
        if self.amp and self.device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.float16)
        return nullcontext()

    def infer(
        self,
        x: torch.Tensor,
        label_ids: Sequence[int] | None = None,
        point_coords: torch.Tensor | None = None,
        point_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run VISTA3D on the preprocessed image.

        Args:
            x: ``[1, X, Y, Z]`` preprocessed image.
            label_ids: class prompt (label ids); with points, the clicked object's class (or None).
            point_coords: ``[1, N, 3]`` points on the network grid, or None for class prompts.
            point_labels: ``[1, N]`` point labels (0/1, or 2/3 for special classes).

        Returns:
            ``[1, C, X, Y, Z]`` logits (NaN where the point inferer has no window).
        """
        t0 = time.perf_counter()
        inp = x[None] if x.ndim == 4 else x
        sub: dict[str, float] = {}
        stages = ("prepare", "forward", "stitch", "finalize", "other", "total")
        with torch.no_grad(), self._autocast():
            if point_coords is None:
                if not label_ids:
                    raise PromptError("no classes to segment")
                n_win = count_windows(inp.shape[2:], self.roi_size, self.overlap)
                progress = _Progress(n_win, self.progress)
                inferer = self._sliding_inferer()
                predictor = self._predictor(progress)
                cv = torch.as_tensor(list(label_ids), device=self.device).view(-1, 1)
                try:
                    logits = inferer(inp, predictor, transpose=True,
                                     class_vector=cv, prompt_class=cv, point_coords=None, point_labels=None,
                                     labels=None, label_set=None, prev_mask=None)
                finally:
                    progress.close()
                inf_t = getattr(inferer, "timings", None) or {}
                sub = {f"inference/{k}": float(inf_t[k]) for k in stages if k in inf_t}
                self.n_windows = int(inf_t.get("windows", n_win))
                used = inf_t.get("sw_batch_size", self.sw_batch_size)
                if used == "auto" and isinstance(inf_t.get("auto_batch"), dict):
                    used = inf_t["auto_batch"].get("max_batch", used)  # the batch the inferer chose
                self.last_sw_batch_size = used
            else:
                from monai.apps.vista3d.inferer import point_based_window_inferer

                pc = None if label_ids is None else torch.as_tensor(list(label_ids), device=self.device).view(-1, 1)
                progress = _Progress(int(point_coords.shape[1]), self.progress)
                try:
                    logits = point_based_window_inferer(
                        inp, self.roi_size, self._predictor(progress), point_coords, point_labels,
                        class_vector=None, prompt_class=pc, transpose=True, with_coord=True,
                    )
                finally:
                    progress.close()
                self.n_windows, self.last_sw_batch_size = int(point_coords.shape[1]), 1
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        _sync(self.device)
        self.timings["inference"] = time.perf_counter() - t0
        self.timings.update(sub)
        return logits

    def infer_labels(self, x: torch.Tensor, label_ids: Sequence[int]) -> torch.Tensor:
        """Class prompts straight to the label map on the network grid, never holding every class's logits.

        The streamed path of :func:`monai.apps.vista3d.sliding_window_label_inference`: the same labels as
        :meth:`infer` followed by :meth:`postprocess`, with memory bounded by a slab of the volume. It has no
        out-of-memory fallback and no per-stage split; ``sw_batch_size="auto"`` splits the windows evenly into
        calls of at most 14 (the latency study's best) on CUDA, 4 on the CPU.

        Returns:
            ``[X, Y, Z]`` int16 label map on the pipeline's device.
        """
        from monai.inferers.batch_size import even_batch_size

        from .streaming import sliding_window_label_inference

        if not label_ids:
            raise PromptError("no classes to segment")
        t0 = time.perf_counter()
        inp = x[None] if x.ndim == 4 else x
        n_win = count_windows(inp.shape[2:], self.roi_size, self.overlap)
        bs = self.sw_batch_size
        if bs == "auto":
            bs = even_batch_size(n_win, 14 if self.device.type == "cuda" else 4)
        progress = _Progress(n_win, self.progress)
        cv = torch.as_tensor(list(label_ids), device=self.device).view(-1, 1)
        try:
            with torch.no_grad(), self._autocast():
                labels = sliding_window_label_inference(
                    inp, self.roi_size, int(bs), self._predictor(progress), overlap=self.overlap, with_coord=True,
                    label_ids=torch.as_tensor(list(label_ids)), transpose=True, class_vector=cv, prompt_class=cv,
                )[0, 0]
        finally:
            progress.close()
        labels = labels.to(device=self.device, dtype=torch.int16)
        _sync(self.device)
        self.n_windows, self.last_sw_batch_size = n_win, int(bs)
        self.timings["inference"] = time.perf_counter() - t0
        self.timings["postprocess"] = 0.0  # done inside the streamed inference
        return labels

    def postprocess(
        self,
        logits: torch.Tensor,
        label_ids: Sequence[int] | None,
        point_coords: torch.Tensor | None = None,
        point_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits -> ``[X, Y, Z]`` int16 label map on the network grid (upstream's ``VistaPostTransformd``).

        A point-only prompt (no class) first keeps only the connected components that hold a positive point.
        """
        t0 = time.perf_counter()
        # Stay where the inferer stitched (the adaptive inferer may have fallen back to the CPU for lack of
        # GPU memory): only the small integer label map moves.
        if point_coords is not None and label_ids is None:
            from monai.transforms.utils import keep_components_with_positive_points

            logits = keep_components_with_positive_points(
                logits.float(), point_coords=point_coords.to(logits.device),
                point_labels=point_labels.to(logits.device),
            )
        labels = logits_to_labels(logits, label_ids).to(self.device)
        _sync(self.device)
        self.timings["postprocess"] = time.perf_counter() - t0
        return labels

    def invert(self, labels: torch.Tensor, record: PreprocessRecord | None = None) -> torch.Tensor:
        """Bring the label map back onto the input grid (nearest), like the bundle's ``Invertd``."""
        t0 = time.perf_counter()
        out = invert_labels(labels, record if record is not None else self.record)
        _sync(self.device)
        self.timings["invert"] = time.perf_counter() - t0
        return out

    def save(self, labels: torch.Tensor, geometry: Any, path: str | os.PathLike) -> Path:
        """Write the label map with the input's affine and header (atomically), as ``output_dtype``."""
        from .io import save_label_map

        t0 = time.perf_counter()
        out = save_label_map(labels, geometry, path, dtype=self.output_dtype)  # a GPU map is cast and laid out there
        self.timings["save"] = time.perf_counter() - t0
        return Path(out)

    # ------------------------------------------------------------------------------------------ whole runs
    def run(
        self,
        image: torch.Tensor,
        affine: np.ndarray | torch.Tensor,
        classes: str | Sequence[int | str] | None = "everything",
        points: Any = None,
        point_labels: Any = None,
    ) -> torch.Tensor:
        """Preprocess, infer, postprocess and invert one image given as a tensor.

        Args:
            image: ``[1, X, Y, Z]`` or ``[X, Y, Z]`` image in HU.
            affine: ``[4, 4]`` voxel-to-world (RAS mm) affine.
            classes: class prompt; ``"everything"`` for the bundle's 117 labels. With points: one class or None.
            points: ``"x,y,z;..."`` or ``[N, 3]`` voxel indices of ``image``.
            point_labels: ``"1,0,..."`` or ``[N]``, one per point.

        Returns:
            ``[X, Y, Z]`` int16 label map on the input grid (255 where no window predicted).
        """
        pts, labs = parse_points(points, point_labels)
        if pts is not None and isinstance(classes, str) and classes.strip().lower() == "everything":
            classes = None
        x, record = self.preprocess(image, affine)
        prompts = self.prompts(classes, pts, labs, record)
        if self.streaming and prompts["point_coords"] is None:
            return self.invert(self.infer_labels(x, prompts["label_ids"]), record)
        logits = self.infer(x, prompts["label_ids"], prompts["point_coords"], prompts["point_labels"])
        labels = self.postprocess(logits, prompts["label_ids"], prompts["point_coords"], prompts["point_labels"])
        del logits
        return self.invert(labels, record)

    def __call__(
        self,
        image: torch.Tensor | str | os.PathLike,
        affine: np.ndarray | torch.Tensor | None = None,
        classes: str | Sequence[int | str] | None = "everything",
        points: Any = None,
        point_labels: Any = None,
        volume_index: int | None = None,
    ) -> torch.Tensor:
        """Segment a tensor (with its affine) or a NIfTI path; returns the ``[X, Y, Z]`` int16 label map."""
        self.timings = {}
        if isinstance(image, (str, os.PathLike)):
            image, geometry = self.load(image, volume_index=volume_index)
            affine = geometry.affine
        if affine is None:
            raise ValueError("give the image's [4, 4] affine (voxel -> world mm) with a tensor input")
        return self.run(image, affine, classes, points, point_labels)

    def segment_file(
        self,
        path: str | os.PathLike,
        output_dir: str | os.PathLike,
        classes: str | Sequence[int | str] | None = "everything",
        points: Any = None,
        point_labels: Any = None,
        volume_index: int | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Segment one NIfTI file and write ``output_dir/<name>/<name>_trans.nii.gz``; returns that path.

        Raises:
            OutputPathError: the output would overwrite the input, exists (without ``overwrite``), or cannot
                be written.
        """
        self.timings = {}
        path = Path(path)
        if not path.is_file():
            raise Vista3DInputError(f"{path}: no such file; check the path.")
        out_path = output_path_for(path, output_dir, bundle_config()["postprocessing"]["output_postfix"])
        _check_output(path, out_path, overwrite)
        image, geometry = self.load(path, volume_index=volume_index)
        labels = self.run(image, geometry.affine, classes, points, point_labels)
        return self.save(labels, geometry, out_path)

    def segment_files(
        self,
        paths: Sequence[str | os.PathLike],
        output_dir: str | os.PathLike,
        classes: str | Sequence[int | str] | None = "everything",
        points: Any = None,
        point_labels: Any = None,
        volume_index: int | None = None,
        overwrite: bool = False,
    ) -> Iterator[tuple[Path, Path | Exception, dict[str, float]]]:
        """Segment several files, loading the next image and saving the previous one while this one runs.

        Loading (gzip decompression) and saving (compression) release the GIL, so on a GPU they hide behind
        the inference of the neighbouring images. At most one image is being loaded ahead and one saved
        behind, so memory stays that of about three images.

        Args:
            paths: input NIfTI files.
            output_dir: outputs go to ``output_dir/<name>/<name>_trans.nii.gz``.
            classes: class prompt for every image.
            points: point prompt for every image (voxel indices), or None.
            point_labels: labels of ``points``.
            volume_index: volume of 4D inputs.
            overwrite: replace existing outputs.

        Yields:
            ``(input path, output path or the input/output error of that image, its stage timings)``, in
            the order of ``paths``. Errors that are not about one image's input or output propagate.
        """
        from concurrent.futures import ThreadPoolExecutor

        from .io import load_image, save_label_map

        postfix = bundle_config()["postprocessing"]["output_postfix"]
        paths = [Path(p) for p in paths]

        def load_job(path: Path) -> tuple[Any, Any, Path, float]:
            t0 = time.perf_counter()
            if not path.is_file():
                raise Vista3DInputError(f"{path}: no such file; check the path.")
            out_path = output_path_for(path, output_dir, postfix)
            _check_output(path, out_path, overwrite)
            image, geometry = load_image(path, volume_index=volume_index, **self._load_options())
            return image, geometry, out_path, time.perf_counter() - t0

        def save_job(labels: torch.Tensor, geometry: Any, out_path: Path, timings: dict) -> Path:
            t0 = time.perf_counter()
            out = save_label_map(labels, geometry, out_path, dtype=self.output_dtype)
            timings["save"] = time.perf_counter() - t0
            return Path(out)

        expected = (Vista3DInputError, OSError, ValueError)
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="vista3d-io") as pool:
            loading = pool.submit(load_job, paths[0]) if paths else None
            saving: tuple[Any, Path, dict] | None = None

            def finish_save() -> Iterator[tuple[Path, Path | Exception, dict[str, float]]]:
                nonlocal saving
                if saving is None:
                    return
                fut, src, timings = saving
                saving = None
                try:
                    yield src, fut.result(), timings
                except expected as e:
                    yield src, e, timings

            for i, path in enumerate(paths):
                current = loading
                loading = pool.submit(load_job, paths[i + 1]) if i + 1 < len(paths) else None
                try:
                    image, geometry, out_path, t_load = current.result()  # type: ignore[union-attr]
                    self.timings = {"load": t_load}
                    labels = self.run(image, geometry.affine, classes, points, point_labels).cpu()
                except expected as e:
                    yield from finish_save()
                    yield path, e, dict(self.timings)
                    continue
                del image
                yield from finish_save()
                timings = self.timings
                saving = (pool.submit(save_job, labels, geometry, out_path, timings), path, timings)
            yield from finish_save()


def _make_inferer(cls: type, kwargs: dict, timing: bool) -> Any:
    """Build the inferer, with ``timing=True`` when this fork's inferer supports it."""
    if timing:
        try:
            return cls(**kwargs, timing=True)
        except TypeError:
            pass
    return cls(**kwargs)


def segment_file(path: str | os.PathLike, output_dir: str | os.PathLike, **kwargs: Any) -> Path:
    """One-call form: ``Vista3DPipeline(**pipeline_kwargs).segment_file(path, output_dir, **prompt_kwargs)``.

    Keyword arguments of :meth:`Vista3DPipeline.segment_file` (``classes``, ``points``, ``point_labels``,
    ``volume_index``, ``overwrite``) go to it, the others to the constructor.
    """
    call_keys = {"classes", "points", "point_labels", "volume_index", "overwrite"}
    call = {k: kwargs.pop(k) for k in list(kwargs) if k in call_keys}
    return Vista3DPipeline(**kwargs).segment_file(path, output_dir, **call)

