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
"""A label map made ready for writing: range-checked for the output type, cast and laid out in NIfTI's file order
where it is (a GPU map then crosses to the host one byte a voxel, slab by slab on the compressing threads), and cut
into file-order slabs of z-slices."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from monai.apps.vista3d.errors import Vista3DInputError

__all__ = [
    "DeviceLabelMap",
    "to_device_file_order",
    "label_map_for_saving",
    "label_source",
    "file_order_slab",
    "file_order_slabs",
]


#: output dtypes that a label map on an accelerator is cast to and laid out in file order on that device
_DEVICE_DTYPES = {
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "float32": torch.float32,
    "float64": torch.float64,
}
_SLAB_BYTES = 16 << 20  # most output bytes per slab of z-slices (one compression block each)
_SAVE_TILE = (16, 64)  # (x, y) extent of the tiles of the transposing cast; every z of the slab at once


def _fits(src_dtype: np.dtype, dtype: np.dtype) -> bool:
    """Whether every value of ``src_dtype`` is exactly representable in ``dtype`` (no range check needed)."""
    return dtype.kind == "f" or src_dtype.kind == "b" or (src_dtype.kind in "iu" and np.can_cast(src_dtype, dtype))


def _tensor_fits(src: torch.dtype, dtype: np.dtype) -> bool:
    """:func:`_fits` for a torch dtype."""
    if dtype.kind == "f" or src == torch.bool:
        return True
    if src.is_floating_point or src.is_complex:
        return False
    info, lim = torch.iinfo(src), np.iinfo(dtype)
    return info.min >= lim.min and info.max <= lim.max


def _range_error(amin: Any, amax: Any, dtype: np.dtype) -> Vista3DInputError:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    return Vista3DInputError(
        f"label ids span [{float(amin):g}, {float(amax):g}], which does not fit {dtype.name} [{lo}, {hi}] (the output "
        "dtype); save as int16 or float32 instead (--output-dtype, or dtype= of save_label_map)."
    )


def _check_values(values: Any, dtype: np.dtype) -> None:
    """Raise when ``values`` (array or tensor) hold a label that ``dtype`` cannot represent."""
    if isinstance(values, torch.Tensor):
        amin, amax = (float(v) for v in torch.aminmax(values))
    else:
        amin, amax = float(values.min()), float(values.max())
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    if not (math.isfinite(amin) and math.isfinite(amax)) or amin < lo or amax > hi:
        raise _range_error(amin, amax, dtype)


def file_order_slab(arr: np.ndarray, k0: int, k1: int, dtype: np.dtype, check: bool) -> np.ndarray:
    """z-slices ``k0:k1`` of ``arr`` ``[X, Y, Z]`` as ``dtype`` in NIfTI order: a C-contiguous ``[k1-k0, Y, X]``.

    A slab that is already in file order is cast in one linear pass (or returned as a view); otherwise the
    transposing cast runs tile by tile, so that both sides of a tile stay in cache (a plain transposing copy of
    a 512x512x200 volume is ~4x slower).
    """
    src = arr[:, :, k0:k1]
    if check:
        _check_values(src, dtype)
    t: np.ndarray = src.T
    if t.flags.c_contiguous:
        return t if t.dtype == dtype else t.astype(dtype)
    out = np.empty(t.shape, dtype=dtype)
    tx, ty = _SAVE_TILE
    nx, ny = src.shape[0], src.shape[1]
    for j in range(0, ny, ty):
        for i in range(0, nx, tx):
            np.copyto(out[:, j : j + ty, i : i + tx], t[:, j : j + ty, i : i + tx], casting="unsafe")
    return out


class DeviceLabelMap:
    """A label map range-checked, cast to its carrier type and laid out in file order (``[Z, Y, X]``) on its device,
    waiting to cross to the host: each z-slab is copied by the thread that compresses it, so that the copies (and
    the page faults of fresh host memory, ~0.4 ns a byte) run in parallel with each other and with the deflate,
    instead of one serial copy before the save.

    The copies run on a stream of their own that waits for the one the map was made on: on a GPU they neither see
    an unfinished map nor queue behind the next image's windows.

    Args:
        data: the ``[Z, Y, X]`` contiguous map in its carrier type (not a view of a tensor the caller changes).
    """

    def __init__(self, data: torch.Tensor):
        self.data = data
        self._stream: Any = None
        if data.is_cuda:
            self._stream = torch.cuda.Stream(data.device)
            self._stream.wait_stream(torch.cuda.current_stream(data.device))
            data.record_stream(self._stream)  # freed on the caller's stream only once the copies are done

    @property
    def shape(self) -> tuple[int, int, int]:
        """The ``[X, Y, Z]`` grid of the map."""
        z, y, x = (int(s) for s in self.data.shape)
        return x, y, z

    def numpy(self) -> np.ndarray:
        """The whole map on the host as ``[X, Y, Z]`` in its carrier type (for a writer that needs it whole, such as
        the DICOM SEG)."""
        whole: np.ndarray = self.slab(0, int(self.data.shape[0])).T
        return whole

    def slab(self, k0: int, k1: int, dtype: np.dtype | None = None) -> np.ndarray:
        """z-slices ``k0:k1`` on the host in file order (C-contiguous ``[k1-k0, Y, X]``), widened to ``dtype``
        (None: the carrier type)."""
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            host: np.ndarray = self.data[k0:k1].cpu().numpy()
        return host if dtype is None or host.dtype == dtype else host.astype(dtype)


def to_device_file_order(t: torch.Tensor, dtype: np.dtype) -> DeviceLabelMap:
    """The label map ``t`` ``[X, Y, Z]`` checked for ``dtype``, cast and laid out in file order where it is.

    Integer labels are carried in the narrowest type that holds them (uint8 or int16) when ``dtype`` is wider,
    so that a float32 map moves a quarter of its bytes to the host and is widened slab by slab on the compressing
    threads.
    """
    if not _tensor_fits(t.dtype, dtype):
        _check_values(t, dtype)
    carrier = _DEVICE_DTYPES[dtype.name]
    if t.dtype == torch.bool:
        carrier = torch.uint8
    elif not (t.dtype.is_floating_point or t.dtype.is_complex) and dtype.itemsize > 1:
        lo, hi = (int(v) for v in torch.aminmax(t))
        for narrow in (torch.uint8, torch.int16):
            info = torch.iinfo(narrow)
            if narrow.itemsize < dtype.itemsize and info.min <= lo and hi <= info.max:
                carrier = narrow
                break
    data = t.to(carrier).permute(2, 1, 0).contiguous()
    if data.data_ptr() == t.data_ptr():  # a map already in file order and type: keep the caller's tensor out of it
        data = data.clone()
    return DeviceLabelMap(data)


def label_map_for_saving(labels: torch.Tensor, shape: Sequence[int], dtype: str = "uint8") -> Any:
    """``labels`` off the host made ready for :func:`~.nifti_write.save_label_map` to write as ``dtype``.

    A label map on the input grid is range-checked, cast and laid out in file order where it is (a
    :class:`DeviceLabelMap`; a GPU map then crosses one byte a voxel, slab by slab, while it is compressed).
    Anything else (another grid, a type the device cannot cast to) is copied to the host as it is, and the save
    reports what is wrong with it.
    """
    t = labels.detach()
    if t.ndim == 4 and t.shape[0] == 1:
        t = t[0]
    if str(dtype) in _DEVICE_DTYPES and tuple(t.shape) == tuple(shape):
        return to_device_file_order(t, np.dtype(str(dtype)))
    return t.cpu()


def label_source(labels: Any, shape: Sequence[int], dtype: np.dtype) -> tuple[np.ndarray | DeviceLabelMap, bool]:
    """The label map as an ``[X, Y, Z]`` array (or a :class:`DeviceLabelMap`), and whether its values still need a
    range check for ``dtype``.

    A tensor off the host is checked and laid out in file order where it is (see :func:`label_map_for_saving`).
    """
    if isinstance(labels, torch.Tensor) and labels.device.type != "cpu":
        labels = label_map_for_saving(labels, shape, dtype.name)
    if isinstance(labels, DeviceLabelMap):
        if labels.shape != tuple(shape):
            raise _grid_error(labels.shape, shape)
        return labels, False
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.dtype.kind not in "biuf":
        raise Vista3DInputError(f"label map of type {arr.dtype} cannot be saved; give integer or float label ids.")
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if tuple(arr.shape) != tuple(shape):
        raise _grid_error(arr.shape, shape)
    check = not _fits(arr.dtype, dtype)
    if check and (arr.flags.c_contiguous or arr.flags.f_contiguous):
        _check_values(arr, dtype)  # one linear pass; slabs of a strided array are checked one by one
        check = False
    return arr, check


def _grid_error(got: Sequence[int], shape: Sequence[int]) -> Vista3DInputError:
    return Vista3DInputError(
        f"label map shape {tuple(got)} does not match the input grid {tuple(shape)}; "
        "invert the preprocessing (orientation, crop, resampling) before saving."
    )


def file_order_slabs(
    labels: Any, shape: Sequence[int], dtype: np.dtype, threads: int
) -> list[Callable[[], np.ndarray]]:
    """``labels`` (on a grid of ``shape``, any device; see :func:`label_source`) as slabs of z-slices in file
    order, first axis fastest, as NIfTI and NRRD store voxels: each a call returning its slab in ``dtype`` (see
    :func:`file_order_slab` and :meth:`DeviceLabelMap.slab`), for the compressing threads to run."""
    src, check = label_source(labels, shape, dtype)
    nx, ny, nz = src.shape
    slice_bytes = max(1, nx * ny * dtype.itemsize)
    # big slabs amortise the tile loop; at least two per thread so that every core has work
    step = max(1, min(_SLAB_BYTES // slice_bytes, math.ceil(nz / (2 * threads))))
    if isinstance(src, DeviceLabelMap):
        return [functools.partial(src.slab, k, min(k + step, nz), dtype) for k in range(0, nz, step)]
    return [functools.partial(file_order_slab, src, k, min(k + step, nz), dtype, check) for k in range(0, nz, step)]
