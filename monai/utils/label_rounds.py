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
"""The connected-component labeller's rounds as two Triton kernels, for masks on a GPU.

The plain-torch rounds of :py:func:`monai.utils.point_helpers._root_labels` read and write the whole volume about
twenty-five times a round (each neighbourhood minimum is a chain of one-axis passes); on a GPU that traffic is the
labeller's time (a later VISTA3D click labels a 3 x 128^3 stack, ~7 ms on an H100). Here one kernel takes each
voxel's neighbourhood minimum and hooks (one read of the labels, their neighbours from the cache) and one follows
each label two links up its tree. The fixed point is the same, each component on its smallest flat index, whatever
order the GPU runs the voxels in: labels only decrease, always to the index of a voxel of the same component.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import torch

from monai.utils.triton_support import check_kernel_input, interpreting, tl, triton

__all__ = ["root_labels_triton", "root_labels_triton_supported"]

#: the kernels index up to this many axes (size-1 axes dropped first); more take the plain-torch rounds
MAX_AXES = 4
_BLOCK = 1024

if triton is not None:

    @triton.jit
    def _hook_kernel(labels_ptr, mask_ptr, offsets_ptr, changed_ptr, numel, s0, s1, s2, s3,
                     N_OFFSETS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        # each foreground voxel: the smallest label among itself and its neighbours (the offsets' table, 4 axes),
        # taken by the voxel and by the root its label points to
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        fg = tl.load(mask_ptr + i, mask=i < numel, other=0) != 0
        c3 = i % s3
        c2 = (i // s3) % s2
        c1 = (i // (s3 * s2)) % s1
        c0 = i // (s3 * s2 * s1)
        own = tl.load(labels_ptr + i, mask=fg, other=0)
        near = own
        for k in tl.static_range(N_OFFSETS):
            n0 = c0 + tl.load(offsets_ptr + 4 * k)
            n1 = c1 + tl.load(offsets_ptr + 4 * k + 1)
            n2 = c2 + tl.load(offsets_ptr + 4 * k + 2)
            n3 = c3 + tl.load(offsets_ptr + 4 * k + 3)
            ok = fg & (n0 >= 0) & (n0 < s0) & (n1 >= 0) & (n1 < s1) & (n2 >= 0) & (n2 < s2) & (n3 >= 0) & (n3 < s3)
            j = ((n0 * s1 + n1) * s2 + n2) * s3 + n3
            near = tl.minimum(near, tl.load(labels_ptr + j, mask=ok, other=numel))
        lower = fg & (near < own)
        tl.atomic_min(labels_ptr + i, near, mask=lower)
        tl.atomic_min(labels_ptr + own, near, mask=lower)
        tl.atomic_max(changed_ptr, tl.max(lower.to(tl.int32), axis=0))

    @triton.jit
    def _jump_kernel(labels_ptr, mask_ptr, numel, BLOCK: tl.constexpr):
        # each foreground voxel's label replaced by its label's label's label (two links up the tree)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        fg = tl.load(mask_ptr + i, mask=i < numel, other=0) != 0
        own = tl.load(labels_ptr + i, mask=fg, other=0)
        up = tl.load(labels_ptr + own, mask=fg, other=0)
        up = tl.load(labels_ptr + up, mask=fg, other=0)
        tl.store(labels_ptr + i, up, mask=fg & (up < own))


@functools.lru_cache(maxsize=16)
def _offsets(ndim: int, connectivity: int, axes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``[K, 4]`` int32 offsets of the neighbours in ``ndim`` axes that differ along ``axes`` only, in at most
    ``connectivity`` of them, the leading axes padded with 0."""
    rows = []
    for steps in itertools.product((-1, 0, 1), repeat=len(axes)):
        if 0 < sum(map(bool, steps)) <= connectivity:
            row = [0] * ndim
            for axis, step in zip(axes, steps):
                row[axis] = step
            rows.append([0] * (MAX_AXES - ndim) + row)
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, MAX_AXES)


def root_labels_triton_supported(m: torch.Tensor) -> bool:
    """Whether :py:func:`root_labels_triton` takes ``m``: a boolean mask on a CUDA device (on the CPU under the
    interpreter) with Triton, of 1 to ``MAX_AXES`` axes and fewer than 2^31 voxels."""
    if triton is None or not (m.is_cuda or interpreting()) or m.dtype != torch.bool:
        return False
    return 1 <= m.ndim <= MAX_AXES and m.numel() < 2**31 - 1


def root_labels_triton(m: torch.Tensor, connectivity: int, axes: Sequence[int] | None = None) -> torch.Tensor:
    """Each voxel of the mask ``m`` labelled with the flat index (int32) of its component's first voxel in raster
    order; the background holds ``m.numel()`` (as :py:func:`~monai.utils.point_helpers._root_labels`).

    Args:
        m: boolean mask (see :py:func:`root_labels_triton_supported`).
        connectivity: neighbours differ in at most this many of ``axes``.
        axes: the axes along which voxels neighbour each other (default: all).
    """
    check_kernel_input(m, "root_labels_triton")
    numel = m.numel()
    flat = m.contiguous().view(torch.uint8).reshape(-1)
    labels = torch.where(flat.bool(), torch.arange(numel, dtype=torch.int32, device=m.device),
                         torch.tensor(numel, dtype=torch.int32, device=m.device))
    if numel == 0:
        return labels.view(m.shape)
    sizes = [1] * (MAX_AXES - m.ndim) + list(m.shape)
    offsets = _offsets(m.ndim, connectivity, tuple(range(m.ndim) if axes is None else axes), m.device)
    changed = torch.zeros(1, dtype=torch.int32, device=m.device)
    grid = (triton.cdiv(numel, _BLOCK),)

    def one_round() -> None:
        _hook_kernel[grid](labels, flat, offsets, changed, numel, *sizes, N_OFFSETS=offsets.shape[0], BLOCK=_BLOCK)
        _jump_kernel[grid](labels, flat, numel, BLOCK=_BLOCK)

    while True:  # two rounds a check (the check waits on the device), the second's hooks counted
        one_round()
        changed.zero_()
        one_round()
        if not int(changed.item()):  # no voxel found a lower neighbour: each component is on its smallest index
            return labels.view(m.shape)
