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
"""How a run's outputs were made. The summary records the resolved job (prompt, window, overlap, batch, precision,
fused or not, output type), the weights file (size and SHA-256) and the versions of this package and of torch, so that
an output folder says what produced it (as nnU-Net's ``predict_from_raw_data_args.json`` does). Each label map
carries in its header what decides its labels (:func:`output_settings`), so that a rerun with other classes, window
or weights does not take an earlier output for its own (:func:`check_made_alike`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from monai.apps.vista3d.config import check_roi_size
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.errors import OutputPathError
from monai.apps.vista3d.io.nifti_write import read_output_record

from .segmenter import PipelineSegmenter, Segmenter

__all__ = ["Provenance", "output_settings", "check_made_alike", "weights_digest"]

_CHUNK = 16 << 20  # bytes hashed per read (hashlib releases the GIL on large buffers)


def _sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_DIGESTS: dict[tuple, str] = {}
_DIGEST_LOCK = threading.Lock()


def weights_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a weights file, computed once per file version (path, size, mtime) in this process, however
    many threads ask (about 0.7 s for the published checkpoint)."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    with _DIGEST_LOCK:  # a second asker waits for the first one's result
        if key not in _DIGESTS:
            _DIGESTS[key] = _sha256(path)
        return _DIGESTS[key]


class Provenance:
    """The settings record of a run; the weights are hashed on a thread while the run works (a checkpoint of a few
    hundred MB takes a fraction of a second, already in the page cache from its load).

    Args:
        what: the run's job or segmenter.
    """

    def __init__(self, what: SegmentJob | Segmenter):
        self.settings = _settings(what)
        weights = what.weights if isinstance(what, SegmentJob) else None
        self.weights = weights
        self._digest: list[str] = []
        self._thread: threading.Thread | None = None
        if weights is not None:
            self._thread = threading.Thread(target=lambda: self._digest.append(weights_digest(weights)),
                                            name="vista3d-weights-digest", daemon=True)
            self._thread.start()

    def record(self) -> dict[str, Any]:
        """The record, with the weights' digest once it is ready."""
        weights = None
        if self.weights is not None:
            if self._thread is not None:
                self._thread.join()
            weights = {"path": os.fspath(self.weights), "bytes": os.path.getsize(self.weights),
                       "sha256": self._digest[0] if self._digest else None}
        from monai import __version__

        return {**self.settings, "weights": weights, "versions": {"monai": __version__, "torch": torch.__version__}}


def _settings(what: SegmentJob | Segmenter) -> dict[str, Any]:
    if isinstance(what, SegmentJob):
        return {"segmenter": "SegmentJob", **_prompt_record(what), "options": dataclasses.asdict(what.options),
                "device": str(what.device), "fuse": what.fuse is not False, "network": _network_name(what),
                "network_kwargs": dict(what.network_kwargs)}
    options = dataclasses.asdict(what.pipeline.options) if isinstance(what, PipelineSegmenter) else None
    return {"segmenter": type(what).__name__, "options": options, "device": str(what.device),
            "output_dtype": what.output_dtype, "nonfinite": what.nonfinite}


def output_settings(job: SegmentJob) -> dict[str, Any]:
    """What decides the labels of a job's outputs: the prompt, the window and overlap, how voxels are read and written,
    the network and the weights (their SHA-256). Not what only changes the speed (window batch, streaming, device)."""
    options = job.options
    weights = None
    if job.weights is not None:
        weights = {"bytes": os.path.getsize(job.weights), "sha256": weights_digest(job.weights)}
    return {
        **_prompt_record(job),
        "roi_size": list(check_roi_size(options.roi_size)), "overlap": options.overlap,
        "output_dtype": options.output_dtype,
        "unreached_label": options.unreached_label, "nonfinite": options.nonfinite, "per_class": options.per_class,
        "network": _network_name(job), "network_kwargs": dict(job.network_kwargs), "weights": weights,
    }


def _prompt_record(job: SegmentJob) -> dict[str, Any]:
    """A job's prompt as both records keep it: ``classes``, ``points`` and ``point_labels`` (lists or None)."""
    prompt = job.parsed_prompt
    return {"classes": prompt.label_ids,
            "points": None if prompt.points is None else prompt.points.tolist(),
            "point_labels": None if prompt.point_labels is None else prompt.point_labels.tolist()}


def _network_name(job: SegmentJob) -> str:
    """``vista3d132`` (the network the job builds) or the class name of the caller's network."""
    return "vista3d132" if job.network is None else type(job.network).__name__


def _shown(key: str, value: Any) -> str:
    text = ("random" if key == "weights" else "none") if value is None else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_made_alike(outputs: Sequence[Path], job: SegmentJob) -> None:
    """Refuse, before any work, a run whose existing outputs were made with other settings (:func:`output_settings`,
    read from each label map's header): skipping them would keep results of another prompt, window or checkpoint
    under this run's name. Outputs without a record (an older version's) are taken as they are.

    Raises:
        OutputPathError: the first output made otherwise, what differs, and how many such outputs there are.
    """
    ours: dict[str, Any] | None = None
    differing: list[tuple[Path, dict[str, Any]]] = []
    for out in outputs:
        record = read_output_record(out) if out.is_file() else None
        if record is None:
            continue
        ours = ours if ours is not None else json.loads(json.dumps(output_settings(job)))  # as it reads back
        if record != ours:
            differing.append((out, record))
    if not differing:
        return
    assert ours is not None, "made when the first record was read"
    out, record = differing[0]
    changes = [f"{key} {_shown(key, record.get(key))} then, {_shown(key, ours.get(key))} now"
               for key in sorted(set(record) | set(ours)) if record.get(key) != ours.get(key)]
    more = f" (and {len(differing) - 1} more outputs)" if len(differing) > 1 else ""
    raise OutputPathError(
        f"{out}{more} was made with other settings: {'; '.join(changes)}; pass overwrite=True to redo "
        f"{'them' if more else 'it'}, or choose another output folder."
    )
