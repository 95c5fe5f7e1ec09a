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
"""Record upstream MONAI's VISTA3D outputs for the prompt modes the tiny parity fixture does not cover.

Writes ``vista3d_tiny_parity_extra.pt``: the tiny model and weights of ``vista3d_tiny_parity.pt``, run on CPU in
float32 with ``eval()``/``no_grad()`` on a 16^3 crop of its image, for each case of ``make_cases``. Run with upstream MONAI 1.6.1 (and
scikit-image, which its connected-component code needs) from a directory where this fork is not importable::

    cd /tmp && PYTHONPATH=/path/to/upstream:/path/to/skimage python \\
        /path/to/fork/tests/testing_data/make_vista3d_extra_reference.py --out /path/to/fork/tests/testing_data/vista3d_tiny_parity_extra.pt

With ``--check FILE`` (from the fork's root) it runs the same cases on this fork and compares.
"""

from __future__ import annotations

import argparse
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# the cases run on a 16^3 crop of the fixture image (small files); as a sliding window it is voxels
# [4:20, 2:18, 0:16] of a 20 x 20 x 16 image
WINDOW = [[0, 1], [None, None], [4, 20], [2, 18], [0, 16]]
COORDS = [[[8, 7, 5], [14, 12, 10], [4, 2, 0]], [[6, 16, 8], [11, 10, 9], [19, 4, 3]]]


def to_slices(patch):
    """``[[start, stop], ...]`` per window -> list of tuples of slices (what the inferers pass)."""
    return [tuple(slice(a, b) for a, b in window) for window in patch]


def make_cases(image: torch.Tensor) -> dict:
    gen = torch.Generator().manual_seed(7)
    labels = torch.zeros(1, 1, 20, 20, 16)
    labels[..., 5:11, 4:10, 2:8] = 2
    labels[..., 12:18, 10:16, 8:14] = 5
    coords = torch.tensor(COORDS)
    point_labels = torch.tensor([[1, 0, -1], [1, 1, 0]])
    return {
        "class_points_cc_combine": {
            "class_vector": torch.tensor([[3], [14]]),
            "point_coords": coords,
            "point_labels": point_labels,
            "prompt_class": torch.tensor([[3], [14]]),
            "patch_coords": [WINDOW],
        },
        "class_points_gaussian_radius": {
            "class_vector": torch.tensor([[3], [14]]),
            "point_coords": coords - torch.tensor([4, 2, 0]).clamp(max=0),
            "point_labels": point_labels,
            "prompt_class": torch.tensor([[3], [14]]),
            "radius": 3,
        },
        "class_points_all_padding_in_patch": {
            "class_vector": torch.tensor([[3], [14]]),
            "point_coords": coords,
            "point_labels": torch.full((2, 3), -1),
            "patch_coords": [WINDOW],
        },
        "points_prev_mask": {
            "point_coords": coords,
            "point_labels": point_labels,
            "prev_mask": 3 * torch.randn(1, 2, 20, 20, 16, generator=gen),
            "patch_coords": [WINDOW],
            "transpose": True,
        },
        "points_outside_patch": {
            "point_coords": torch.tensor([[[1, 1, 1]], [[19, 19, 3]]]),
            "point_labels": torch.tensor([[1], [1]]),
            "patch_coords": [WINDOW],
            "transpose": True,
        },
        "points_pad_size": {
            "point_coords": torch.tensor([[[5, 6, 4], [10, 10, 10]]]),
            "point_labels": torch.tensor([[1, 0]]),
            "pad_size": [1, 0, 3, 0, 2, 0],
        },
        "points_padding_row_special_labels": {
            "point_coords": coords,
            "point_labels": torch.tensor([[3, 2, -1], [-1, -1, -1]]),
            "prompt_class": torch.tensor([[23], [200]]),
        },
        "points_max_prompt_chunks": {
            "point_coords": torch.cat([coords, coords.flip(0), coords[:1]]),
            "point_labels": torch.tensor([[1, 0, -1], [1, 1, 0], [1, 1, 0], [1, 0, -1], [0, 1, 1]]),
            "max_prompt": 2,
        },
        "points_sampled_from_labels": {
            # upstream needs clicks (one row per label) to get past its first checks; the sampled ones replace them
            "point_coords": torch.zeros(3, 1, 3, dtype=torch.long),
            "point_labels": torch.ones(3, 1, dtype=torch.long),
            "labels": labels,
            "label_set": [0, 2, 5],
            "patch_coords": [WINDOW],
        },
        "class_windows_transpose": {
            "image": torch.cat([image, image.flip(2)]),
            "class_vector": torch.tensor([[1], [60], [117]]),
            "patch_coords": [WINDOW, WINDOW],
            "transpose": True,
        },
        "points_keep_cache": {
            # a second call with a blank image and keep_cache reuses the features of the first
            "point_coords": coords,
            "point_labels": point_labels,
            "keep_cache": True,
            "second_image_zeros": True,
        },
    }


def run_case(model, image, case: dict) -> torch.Tensor:
    # upstream edits prev_mask in place: give every call its own copy of the inputs
    kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    img = kwargs.pop("image", image)
    max_prompt = kwargs.pop("max_prompt", None)
    second_zeros = kwargs.pop("second_image_zeros", False)
    if "patch_coords" in kwargs:
        kwargs["patch_coords"] = to_slices(kwargs["patch_coords"])
    old = model.point_head.max_prompt
    if max_prompt:
        model.point_head.max_prompt = max_prompt
    model.image_embeddings = None
    try:
        with torch.no_grad():
            out = model(img, **kwargs)
            if second_zeros:
                out = model(torch.zeros_like(img), **kwargs)
    finally:
        model.point_head.max_prompt = old
        model.image_embeddings = None
    return out.clone()


def build_model(fixture: dict):
    from monai.networks.nets import SegResNetDS2
    from monai.networks.nets.vista3d import (
        VISTA3D,
        ClassMappingClassify,
        PointMappingSAM,
    )

    cfg = fixture["config"]
    f = cfg["feature_size"]
    encoder = SegResNetDS2(
        in_channels=1, blocks_down=cfg["blocks_down"], norm=cfg["norm"], out_channels=f, init_filters=f,
        dsdepth=cfg["dsdepth"],
    )
    class_head = ClassMappingClassify(n_classes=cfg["n_classes"], feature_size=f, use_mlp=cfg["use_mlp"])
    point_head = PointMappingSAM(feature_size=f, n_classes=cfg["n_classes"], last_supported=cfg["last_supported"])
    model = VISTA3D(encoder, class_head, point_head)
    model.load_state_dict(fixture["state_dict"], strict=True)
    return model.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the reference file here (run with upstream MONAI)")
    parser.add_argument("--check", help="compare this fork against the reference file")
    args = parser.parse_args()
    fixture = torch.load(os.path.join(HERE, "vista3d_tiny_parity.pt"), weights_only=True)
    model = build_model(fixture)
    image = fixture["image"][..., 8:24, 8:24, 8:24].contiguous()
    cases = make_cases(image)
    if args.out:
        import monai

        outputs = {name: run_case(model, image, case) for name, case in cases.items()}
        torch.save({"monai_version": monai.__version__, "cases": cases, "outputs": outputs}, args.out)
        print(f"wrote {len(outputs)} cases to {args.out}")
    if args.check:
        ref = torch.load(args.check, weights_only=True)
        for name, case in ref["cases"].items():
            out = run_case(model, image, case)
            exp = ref["outputs"][name]
            same = out.shape == exp.shape and torch.allclose(out, exp, rtol=1e-4, atol=1e-5)
            diff = (out - exp).abs().max().item() if out.shape == exp.shape else float("nan")
            print(f"{name:40s} {'ok' if same else 'MISMATCH'} {tuple(out.shape)} max|diff|={diff:.3g}")


if __name__ == "__main__":
    main()
