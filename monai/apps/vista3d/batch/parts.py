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
"""Independent parts of one batch, for a cluster: the split of the images into parts.

A batch of ``n`` images is cut into ``N`` parts numbered from 0 (as nnU-Net's ``-part_id`` and SLURM's
``SLURM_ARRAY_TASK_ID``). Every process computes the same split from the inputs alone (:func:`split_parts`:
sorted by a stable key such as the output path relative to the output folder, balanced by voxel count), so N
processes started anywhere, at any time, need no communication. Parts may share an output folder: each output is
claimed before it is written (:mod:`~monai.apps.vista3d.batch.claims`), each part writes its own summary
(:func:`~.paths.part_summary_name`), and :mod:`~.summary_merge` makes one table of them.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["check_part", "parse_part", "part_keys", "split_parts"]



def check_part(part: Sequence[int]) -> tuple[int, int]:
    """``(i, n)`` checked: ``n >= 1`` parts numbered ``0 .. n-1``.

    Raises:
        ValueError: ``i`` or ``n`` out of range, or not two integers.
    """
    try:
        i, n = (operator.index(v) for v in part)  # integers only: 1.5 is not a part number
    except (TypeError, ValueError):
        raise ValueError(f"part must be (i, N), two integers, got {part!r}") from None
    if n < 1:
        raise ValueError(f"part {i}/{n} does not exist: N must be 1 or more")
    if not 0 <= i < n:
        raise ValueError(f"part {i}/{n} does not exist: parts are numbered from 0, so I must be in 0..{n - 1}")
    return i, n


def parse_part(text: str) -> tuple[int, int]:
    """``"i/N"`` as ``(i, N)``: part ``i`` of ``N``, numbered from 0 (``"0/4"`` .. ``"3/4"``).

    Raises:
        ValueError: not of the form ``i/N``, or ``i`` not in ``0..N-1``.
    """
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if m is None:
        raise ValueError(f"part must be I/N, e.g. 0/4 (the first of 4 parts, numbered from 0), got {text!r}")
    return check_part((int(m.group(1)), int(m.group(2))))


def split_parts(keys: Sequence[str], sizes: Sequence[int], n: int) -> list[list[int]]:
    """Split items into ``n`` parts balanced by size, the same whatever the order of the items.

    The items are ordered by ``keys`` (unique strings, e.g. output paths relative to the output folder), then
    the largest goes onto the least-loaded part (ties by key, then by part), as ranks are sharded.

    Args:
        keys: one unique key per item; only their order matters.
        sizes: one size per item (voxels); 0 counts as 1.
        n: number of parts (>= 1).

    Returns:
        Per part, the indices into ``keys`` of its items, in increasing order.
    """
    # imported here, not at the top: the claim tests load this file alone, without the package
    from .distributed import shard_by_size  # the rank balance of one machine

    if len(keys) != len(sizes):
        raise ValueError(f"{len(keys)} keys for {len(sizes)} sizes")
    if len(set(keys)) != len(keys):
        raise ValueError("the keys of a split must be unique")
    check_part((0, n))
    order = sorted(range(len(keys)), key=lambda j: keys[j])
    return [sorted(order[k] for k in shard) for shard in shard_by_size([sizes[j] for j in order], n)]


def part_keys(outputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike | None = None) -> list[str]:
    """The split's keys of ``outputs``: each one's path relative to ``output_dir`` (its absolute path when it is
    not under it), so that processes that see the shared folder under different mount points agree."""
    keys = []
    for out in outputs:
        p = Path(os.path.abspath(out))
        try:
            keys.append(p.relative_to(os.path.abspath(output_dir)).as_posix() if output_dir is not None else str(p))
        except ValueError:
            keys.append(str(p))
    return keys
