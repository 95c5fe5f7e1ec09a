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
"""A stub VISTA3D whose logits are known, and CT-like phantoms with organ boxes, for the app's tests."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["StubVista", "stub_job", "phantom", "inside", "rotation", "HU", "LIVER", "SPLEEN", "LIVER_2"]

A_MIN, A_MAX = -963.8247715525971, 1053.678477684517
HU = {1: 300.0, 3: 600.0}  # liver and spleen in the test phantom; the body is 40 HU, air -1000 HU
LIVER = ((-14.0, -1.0), (-10.0, 6.0), (-8.0, 9.0))  # boxes in world (RAS mm)
SPLEEN = ((3.0, 15.0), (-8.0, 5.0), (-7.0, 9.0))
LIVER_2 = ((-14.0, -3.0), (10.0, 16.0), (-5.0, 6.0))  # a second, disjoint liver-like region


class StubVista(torch.nn.Module):
    """VISTA3D's call signature; logit of a class = 20 HU - |intensity - its HU| (in the scaled units).

    So a class is predicted exactly where the preprocessed image shows its Hounsfield value, and the
    labels can be checked against the phantom after the pipeline has undone its preprocessing. ``widths``
    widens the band of some classes (half-width in HU instead of 20), so that their masks overlap others.
    """

    def __init__(self, levels: dict[int, float], point_level: float = 300.0, widths: dict[int, float] | None = None):
        super().__init__()
        self.levels, self.point_level, self.widths = levels, point_level, dict(widths or {})
        self.calls = 0

    def _scaled(self, hu: float) -> float:
        return (hu - A_MIN) / (A_MAX - A_MIN)

    def forward(self, input_images, patch_coords=None, point_coords=None, point_labels=None, class_vector=None,
                prompt_class=None, transpose=False, **kwargs):
        self.calls += 1
        if class_vector is not None:
            ids = [int(c) for c in class_vector.flatten()]
            hu = [self.levels.get(c, 5000.0) for c in ids]
        elif prompt_class is not None:
            ids = [int(c) for c in prompt_class.flatten()]
            hu = [self.levels[c] for c in ids]
        else:
            ids, hu = [0], [self.point_level]
        lv = torch.tensor([self._scaled(h) for h in hu], device=input_images.device).view(1, -1, 1, 1, 1)
        width = torch.tensor([self.widths.get(c, 20.0) / (A_MAX - A_MIN) for c in ids], device=input_images.device)
        logits = width.view(1, -1, 1, 1, 1) - (input_images - lv).abs()  # [B, C, ...]
        return logits if transpose else logits.transpose(0, 1)


def rotation(a, b):
    ca, sa, cb, sb = np.cos(a), np.sin(a), np.cos(b), np.sin(b)
    rz = np.array([[ca, -sa, 0], [sa, ca, 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, cb, -sb], [0, sb, cb]])
    return rz @ rx


def phantom(shape, direction, spacing, boxes=(LIVER, SPLEEN), values=(300.0, 600.0)):
    """A volume on the grid of ``affine`` (centred on the world origin) with organ boxes given in world mm."""
    aff = np.eye(4)
    aff[:3, :3] = np.asarray(direction) @ np.diag(spacing)
    aff[:3, 3] = -aff[:3, :3] @ ((np.asarray(shape) - 1) / 2.0)
    idx = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1).reshape(-1, 3)
    world = (aff[:3, :3] @ idx.T).T + aff[:3, 3]
    img = np.full(len(idx), -1000.0)
    img[(np.abs(world) < 18).all(1)] = 40.0  # body
    for box, v in zip(boxes, values):
        img[inside(world, box, 0.0)] = v
    return img.reshape(shape).astype(np.float32), aff, world.reshape(*shape, 3)


def inside(world, box, grow):
    lo = np.array([b[0] for b in box]) - grow
    hi = np.array([b[1] for b in box]) + grow
    return ((world >= lo) & (world <= hi)).all(-1)


def stub_job(classes=(1,), network=None, device="cpu", **options):
    """A :class:`~monai.apps.vista3d.core.job.SegmentJob` of ``classes`` on a :class:`StubVista` (liver and lung
    bands unless given) with 32^3 windows; ``options`` are fields of ``PipelineOptions``."""
    from monai.apps.vista3d import PipelineOptions, SegmentJob

    options.setdefault("roi_size", 32)
    network = network if network is not None else StubVista({1: 60.0, 20: -850.0})
    return SegmentJob(list(classes), PipelineOptions(**options), device, network=network)
