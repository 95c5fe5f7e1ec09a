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
"""Record the VISTA3D bundle's preprocessing and inversion from upstream MONAI 1.6.1.

Run with upstream MONAI on the path (not this fork)::

    PYTHONPATH=/work/upstream python tests/testing_data/make_pipeline_reference.py

It writes ``tests/testing_data/vista3d_pipeline_reference.pt``: for a few small CT-like volumes with
different affines, the input, the output of the bundle's transform chain (``Spacingd`` 1.5 mm bilinear ->
``CropForegroundd`` margin 10 -> ``ScaleIntensityRanged`` -> ``Orientationd`` RAS -> float32) with its affine,
and a label map on the network grid brought back by ``Invertd(nearest_interp=True)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from monai.data import MetaTensor

from monai import __version__
from monai.transforms import (
    CastToTyped,
    Compose,
    CropForegroundd,
    Invertd,
    Orientationd,
    ScaleIntensityRanged,
    Spacingd,
)

A_MIN, A_MAX = -963.8247715525971, 1053.678477684517


def rotation(angles):
    out = np.eye(3)
    for axis, a in enumerate(angles):
        c, s = np.cos(a), np.sin(a)
        r = np.eye(3)
        i, j = [k for k in range(3) if k != axis]
        r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
        out = out @ r
    return out


def affine_of(direction, spacing, origin):
    a = np.eye(4)
    a[:3, :3] = np.asarray(direction, dtype=np.float64) @ np.diag(spacing)
    a[:3, 3] = origin
    return a


def phantom(shape, seed):
    """Air around an ellipsoid 'body' of soft tissue with a dense 'bone' blob; float HU values."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, s) for s in shape], indexing="ij"))
    # Off-centre, so that the foreground crop (margin 10) cuts on some sides and not on others.
    body = (((grid - np.array([-0.45, 0.3, 0.2])[:, None, None, None]) / 0.4) ** 2).sum(0) < 1
    bone = (((grid - np.array([-0.4, 0.3, 0.3])[:, None, None, None]) / 0.15) ** 2).sum(0) < 1
    img = np.full(shape, -1000.0)
    img[body] = 40.0
    img[bone] = 700.0
    img += rng.normal(0, 20, size=shape)
    # Half-HU steps: not integers (a float input), yet exact in float16 for a smaller reference file.
    return np.clip(np.round(img * 2) / 2, -1024.0, 1023.5).astype(np.float32)


CASES = {
    "ras_1mm": dict(shape=(44, 36, 30), direction=np.eye(3), spacing=(1.0, 1.0, 1.0), origin=(-20, -18, 5)),
    "las_aniso": dict(
        shape=(36, 32, 14), direction=np.diag([-1.0, 1.0, 1.0]), spacing=(0.8, 0.9, 2.5), origin=(30, -10, -40)
    ),
    "lps_int16": dict(
        shape=(32, 30, 24), direction=np.diag([-1.0, -1.0, 1.0]), spacing=(1.2, 1.1, 1.7), origin=(0, 0, 0), int16=True
    ),
    "oblique": dict(
        shape=(34, 30, 22), direction=rotation((0.3, -0.2, 0.4)), spacing=(1.1, 0.9, 1.3), origin=(5, -7, 11)
    ),
    "permuted_pir": dict(
        shape=(30, 28, 26),
        direction=np.array([[0.0, 0.0, -1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]),
        spacing=(1.3, 0.7, 1.0),
        origin=(12, 14, -3),
    ),
    # 0.75 and 0.625 mm map voxel centres exactly half-way between 1.5 mm ones: nearest-neighbour ties.
    "ties_0p75_0p625": dict(
        shape=(44, 46, 12), direction=np.diag([1.0, -1.0, 1.0]), spacing=(0.75, 0.625, 3.0), origin=(-3, 20, 0)
    ),
    "already_1p5": dict(shape=(26, 24, 20), direction=np.eye(3), spacing=(1.5, 1.5, 1.5), origin=(1, 2, 3)),
}


def main():
    keys = ["image"]
    pre = Compose(
        [
            Spacingd(keys=keys, pixdim=[1.5, 1.5, 1.5], mode="bilinear"),
            CropForegroundd(keys=keys, allow_smaller=True, margin=10, source_key="image"),
            ScaleIntensityRanged(keys=keys, a_min=A_MIN, a_max=A_MAX, b_min=0.0, b_max=1.0, clip=True),
            Orientationd(keys=keys, axcodes="RAS"),
            CastToTyped(keys=keys, dtype=torch.float32),
        ]
    )
    inv = Invertd(keys="pred", transform=pre, orig_keys="image", nearest_interp=True, to_tensor=True)
    out = {"monai_version": __version__, "a_min": A_MIN, "a_max": A_MAX, "cases": {}}
    for i, (name, c) in enumerate(CASES.items()):
        img = phantom(c["shape"], seed=i)
        if c.get("int16"):
            img = np.round(img).astype(np.int16)
        aff = affine_of(c["direction"], c["spacing"], c["origin"])
        data = {"image": MetaTensor(torch.as_tensor(img.astype(np.float32))[None], affine=torch.as_tensor(aff))}
        res = pre(data)
        x = res["image"]
        rng = np.random.default_rng(100 + i)
        # Blocky labels so that nearest-neighbour choices are mostly unambiguous, plus a NaN patch.
        coarse = rng.integers(0, 6, size=[max(1, s // 3) for s in x.shape[1:]])
        lab = np.kron(coarse, np.ones((3, 3, 3)))
        full = np.zeros(x.shape[1:], dtype=np.float32)
        sl = tuple(slice(0, min(a, b)) for a, b in zip(full.shape, lab.shape))
        full[sl] = lab[sl]
        full[:2, :2, :2] = np.nan
        pred = MetaTensor(torch.as_tensor(full)[None], meta=x.meta, applied_operations=x.applied_operations)
        back = inv({"image": x, "pred": pred})["pred"]
        out["cases"][name] = {
            "image": torch.as_tensor(img) if img.dtype == np.int16 else torch.as_tensor(img).half(),
            "affine": torch.as_tensor(aff),
            "output": x.as_tensor().clone(),
            "output_affine": torch.as_tensor(np.asarray(x.affine, dtype=np.float64)),
            # small integers and NaN: exact in float16, half the file size
            "labels": torch.as_tensor(full).half(),
            "inverted": torch.as_tensor(np.asarray(back))[0].clone().half(),
            "inverted_affine": torch.as_tensor(np.asarray(back.affine, dtype=np.float64)),
        }
        print(name, tuple(img.shape), "->", tuple(x.shape[1:]), "inverted", tuple(back.shape[1:]))
    path = Path(__file__).with_name("vista3d_pipeline_reference.pt")
    torch.save(out, path)
    print("wrote", path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
