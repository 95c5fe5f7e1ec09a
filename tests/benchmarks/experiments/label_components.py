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
"""Experiment: the plain-torch connected-component labeller (the one clicks use on a GPU) on a few masks, timed,
with its rounds counted, and checked against ``scipy.ndimage.label``.

The masks: smooth random blobs in 128^3 (long, winding components), random voxels in 96^3, and the CT phantom's
foreground at 300x250x200 and its liver. Run it at an older commit to time the labeller there.

    python tests/benchmarks/experiments/label_components.py [--device cuda]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import monai.utils.point_helpers as ph
from monai.apps.vista3d.cli.phantom import PHANTOM_LABELS, make_phantom_labels


def masks() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    field = torch.randn(1, 1, 128, 128, 128, generator=gen)
    for _ in range(3):
        field = F.avg_pool3d(field, 9, 1, 4)
    labels = torch.from_numpy(make_phantom_labels((300, 250, 200), (1.0, 1.0, 1.0), 0).astype("int64"))
    return {"smooth blobs 128^3": field[0, 0] > 0, "random voxels 96^3": torch.rand(96, 96, 96, generator=gen) < 0.35,
            "phantom foreground 300x250x200": labels > 0, "phantom liver": labels == PHANTOM_LABELS["liver"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    from scipy import ndimage

    rounds = [0]
    real = ph._neighbourhood_min

    def counted(*a):
        rounds[0] += 1
        return real(*a)

    ph._neighbourhood_min = counted
    for name, m in masks().items():
        expected, n = ndimage.label(m.numpy(), structure=ndimage.generate_binary_structure(3, 3))
        dev = m.to(args.device)
        rounds[0] = 0
        if dev.is_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        got, count = ph._label_torch(dev, 3)
        if dev.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        same = count == n and torch.equal(got.cpu(), torch.from_numpy(expected.astype("int64")))
        print(f"{name:32s} {seconds:7.3f} s  {rounds[0]:4d} rounds  {count:3d} components  equal to scipy: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
