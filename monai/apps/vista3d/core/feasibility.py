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
"""What cannot run, refused before any work: settings the network cannot take and images that cannot fit.

A :class:`~monai.apps.vista3d.core.job.SegmentJob` (what the command line and ``run_batch`` build) and
:class:`~monai.apps.vista3d.core.pipeline.Vista3DPipeline` both ask here, so that a window the network cannot
downsample, a width or window that would ask the allocator for terabytes, or an image whose resampled volume is
larger than the memory there is, fail with one line that says what it needs, not with a raw allocator message
after minutes of work. The estimates are lower bounds: what passes may still run out of memory later, what is
refused could never have run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from monai.apps.vista3d.config import DEFAULT_OVERLAP, PipelineOptions, SettingError, check_roi_size
from monai.apps.vista3d.errors import ResourceError, Vista3DInputError
from monai.apps.vista3d.io.nifti import ImageHeader, read_header
from monai.apps.vista3d.io.nifti_read import MAX_DEFLATE_RATIO, host_memory_available
from monai.inferers import get_scan_interval

__all__ = [
    "failure_reason",
    "os_message",
    "check_environment",
    "check_network",
    "check_window",
    "check_image",
    "check_window_passes",
    "window_count",
    "CT_SPACING_MM",
    "MAX_WINDOW_PASSES",
    "memory_available",
    "friendly_memory_error",
]

#: spacing (mm) the bundle resamples every image to
_SPACING_MM = 1.5
#: bytes a network voxel costs at least while the image is preprocessed and labelled: the float32 resampled image,
#: a float32 intermediate and the int16 label map
_BYTES_PER_NETWORK_VOXEL = 10
#: full-resolution activations a window needs at once at least (a convolution's input, output and residual)
_LIVE_ACTIVATIONS = 3
#: voxel spacing (mm) of the CTs VISTA3D segments; a header outside it gives its sizes wrongly or in other units
#: (a 50 mm pixdim ran to 13 GB without a word, a 0.01 mm one was refused for its intensities)
CT_SPACING_MM = (0.05, 20.0)
#: most passes of the windows over each voxel, on average, that a run may make: the bundle's overlap 0.25 makes about
#: 2, 0.5 about 5 to 8, 0.75 about 27 to 64; beyond it a run repeats the same work for hours (0.95 at 32^3 windows:
#: ~30,000 passes)
MAX_WINDOW_PASSES = 100


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def memory_available(device: torch.device | str) -> int | None:
    """Bytes the pipeline could still use on ``device`` (CUDA: the GPU's total memory), None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        try:  # the properties, not mem_get_info: no CUDA context is made on the device (torchrun's ranks share 0)
            return int(torch.cuda.get_device_properties(device).total_memory)
        except (RuntimeError, AssertionError):
            return None
    return host_memory_available()


def network_bytes(embed_dim: int) -> int:
    """Bytes of ``vista3d132(encoder_embed_dim=embed_dim)``'s float32 weights, counted without building it.

    Its parameters are a quadratic in the width: 94525 d^2 + 3713.5 d + 1134 (the convolutions and linear layers
    join channel counts that grow with it, their biases and norms hold one such count), the built network's count
    at every width the tests build (8 to 256). The meta-device build it replaces cost a fresh process 0.05 s (a
    CPU core of the CI's kind) on the way to its first image.
    """
    return 2 * (189050 * embed_dim * embed_dim + 7427 * embed_dim + 2268)  # 4 bytes x the quadratic's 2x


def check_network(embed_dim: int, device: torch.device | str) -> None:
    """Refuse a ``vista3d132`` width whose weights alone exceed the memory of ``device``.

    Raises:
        ResourceError: the weights do not fit.
    """
    if embed_dim < 1:
        raise ResourceError(f"encoder_embed_dim must be a positive multiple of 8, got {embed_dim}")
    need, have = network_bytes(embed_dim), memory_available(device)
    if have is not None and need > have:
        raise ResourceError(
            f"a vista3d132 with encoder_embed_dim={embed_dim} needs {_gib(need)} for its weights alone, "
            f"{torch.device(device).type} has {_gib(have)}; the published checkpoint uses 48"
        )


def check_window(roi_size: Sequence[int], embed_dim: int, device: torch.device | str, halvings: int = 4) -> None:
    """Refuse a window the network cannot downsample or whose activations cannot fit on ``device``.

    VISTA3D (``vista3d132``) halves the window ``halvings`` = 4 times and normalises each level over its voxels, so
    a window of 16 along every axis leaves one voxel at the deepest level, which instance normalisation cannot take.

    Raises:
        ResourceError: the window cannot run.
    """
    roi = tuple(int(r) for r in roi_size)
    if math.prod(r >> halvings for r in roi) <= 1:
        raise ResourceError(
            f"roi_size {roi} leaves one voxel at the network's deepest level (it halves the window {halvings} "
            f"times); use at least {2 << halvings} along one axis, e.g. 128 (the bundle's) or 64"
        )
    need, have = _LIVE_ACTIVATIONS * 4 * embed_dim * math.prod(roi), memory_available(device)
    if have is not None and need > have:
        raise ResourceError(
            f"roi_size {roi} with encoder_embed_dim={embed_dim} needs at least {_gib(need)} per window, "
            f"{torch.device(device).type} has {_gib(have)}; use a smaller roi_size, e.g. 128 (the bundle's)"
        )


def check_environment() -> None:
    """Refuse a ``VISTA3D_GZIP_CODEC`` or ``VISTA3D_GZIP_READER`` that cannot be used, before any file is read
    (otherwise a ``.nii`` run would fail only when saving, after the whole segmentation).

    Raises:
        ResourceError: the variable's value, and what it may be.
    """
    from monai.apps.vista3d.errors import Vista3DInputError
    from monai.apps.vista3d.io.gzip_codec import gzip_codec, gzip_reader_choice

    try:
        gzip_codec()
        gzip_reader_choice()
    except Vista3DInputError as e:
        raise ResourceError(str(e)) from None


def _resampled(header: ImageHeader) -> tuple[int, int, int]:
    """The image's grid once resampled to the bundle's spacing (before the foreground crop, which only shrinks it)."""
    n = [max(1, math.ceil(n * z / _SPACING_MM)) for n, z in zip(header.spatial, header.zooms)]
    return n[0], n[1], n[2]


def _sizes(values: Sequence[float]) -> str:
    return " x ".join(f"{float(v):g}" for v in values)


def _grid(header: ImageHeader) -> str:
    """``48 x 48 x 32 voxels of 50 x 50 x 50 mm, resampled to 1.5 mm: 1600 x 1600 x 1067``, for messages."""
    return (f"{_sizes(header.spatial)} voxels of {_sizes(header.zooms)} mm, resampled to {_SPACING_MM} mm: "
            f"{_sizes(_resampled(header))}")


def _image_needs(header: ImageHeader) -> tuple[int, int]:
    """``(host bytes, device bytes)`` that reading and segmenting the image take at least, from its header;
    ``(0, 0)`` for a header whose data cannot be in the file (truncated: its load says so)."""
    size = header.file_bytes
    if header.inflated_bytes > (MAX_DEFLATE_RATIO * size + 4096 if header.gz else size):
        return 0, 0
    host = (header.itemsize + 4) * header.voxels  # one volume's data and its float32 copy
    return host, _BYTES_PER_NETWORK_VOXEL * math.prod(_resampled(header))


def check_image(
    path: str | os.PathLike,
    device: torch.device | str,
    header: ImageHeader | None = None,
    options: PipelineOptions | None = None,
) -> None:
    """Refuse, from its header alone (read here unless given: :func:`~monai.apps.vista3d.io.nifti.read_header`), an
    image whose voxel spacing is no CT's (:data:`CT_SPACING_MM`), whose inflated data or volume resampled to 1.5 mm
    cannot fit, or (with ``options``) on which the windows would make more than :data:`MAX_WINDOW_PASSES` passes.

    A header that cannot be read is left to the image's own load, which says what is wrong with it.

    Raises:
        ResourceError: the spacing is no CT's, or the image cannot fit; the message names the spacing and the grid.
        SettingError: ``options.overlap`` (with ``options.roi_size``) would run too many windows on it.
    """
    header = header if header is not None else read_header(path)
    if header is None:
        return
    low, high = CT_SPACING_MM
    if not all(low <= z <= high for z in header.zooms):
        raise ResourceError(
            f"{path}: voxel spacing {_sizes(header.zooms)} mm is no CT's (VISTA3D segments CTs of {low:g} to {high:g} "
            f"mm voxels; {_grid(header)} voxels): the header's pixdim or affine is wrong or not in mm; set it to the "
            "voxel size in mm"
        )
    host, dev = _image_needs(header)
    device = torch.device(device)
    if device.type == "cpu":
        host, dev = host + dev, 0
    for need, where in ((host, torch.device("cpu")), (dev, device)):
        have = memory_available(where)
        if need and have is not None and need > have:
            raise ResourceError(
                f"{path}: segmenting it needs at least {_gib(need)} of {where.type} memory (the image, {_grid(header)} "
                f"voxels), {_gib(have)} are available; check the header's dim and pixdim, or segment it on a machine "
                "with more memory"
            )
    if options is not None:
        check_window_passes(_resampled(header), check_roi_size(options.roi_size), options.overlap, str(path))


def window_count(shape: Sequence[int], roi_size: Sequence[int], overlap: float) -> int:
    """Windows of a sliding-window pass over an image of ``shape`` (as :func:`~monai.inferers.plan_sliding_windows`
    places them), counted without listing them."""
    padded = [max(int(n), int(r)) for n, r in zip(shape, roi_size)]
    steps = get_scan_interval(padded, [int(r) for r in roi_size], len(padded), [float(overlap)] * len(padded))
    return math.prod(1 + math.ceil((n - r) / step) if n > r else 1 for n, r, step in zip(padded, roi_size, steps))


def check_window_passes(shape: Sequence[int], roi_size: Sequence[int], overlap: float, what: str) -> None:
    """Refuse an overlap whose windows would pass more than :data:`MAX_WINDOW_PASSES` times over each voxel of an image
    of ``shape`` (on the network's grid), named ``what`` in the message.

    Raises:
        SettingError: ``overlap``, with the number of windows and passes, and what to use instead.
    """
    roi = [int(r) for r in roi_size]
    count = window_count(shape, roi, overlap)
    passes = count * math.prod(roi) / math.prod(max(int(n), r) for n, r in zip(shape, roi))
    if passes > MAX_WINDOW_PASSES:
        raise SettingError(
            "overlap", f"{overlap:g} with roi_size {_sizes(roi)} would run {count:,} windows on {what} ({passes:,.0f} "
                       f"passes over each voxel, at most {MAX_WINDOW_PASSES} are allowed); use a smaller overlap (the "
                       f"bundle's {DEFAULT_OVERLAP}) or a larger roi_size"
        )


def friendly_memory_error(e: BaseException) -> str | None:
    """One line for an allocation failure (numpy's ``MemoryError``, PyTorch's raw allocator error), else None."""
    text = str(e)
    if isinstance(e, MemoryError) or (
        isinstance(e, RuntimeError) and ("DefaultCPUAllocator" in text or "can't allocate memory" in text)
    ):
        return "not enough memory for this image; free memory, use a smaller --roi-size, or a larger machine"
    return None


def os_message(e: OSError) -> str:
    """What went wrong, in the system's words but without the errno number (``[Errno 28] ...``)."""
    what = e.strerror or type(e).__name__
    return f"{what[:1].lower()}{what[1:]}" + (f" ({e.filename})" if e.filename else "")


def failure_reason(e: BaseException, path: Path | None = None) -> str:
    """One line for a failed image, without the image's path (the record names it)."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    friendly = friendly_memory_error(e)
    if friendly is not None:
        return friendly
    if isinstance(e, OSError) and not isinstance(e, Vista3DInputError):
        return os_message(e)
    if isinstance(e, MemoryError):
        return f"not enough memory ({msg or 'allocation failed'}); free memory or segment it on a larger machine"
    if not isinstance(e, Vista3DInputError):
        return f"{type(e).__name__}: {msg}"
    if path is not None and msg.startswith(f"{path}: "):
        msg = msg[len(f"{path}: "):]
    return msg
