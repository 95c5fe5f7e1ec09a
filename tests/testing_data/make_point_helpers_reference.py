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
"""Record reference outputs of upstream MONAI's point helpers into ``point_helpers_upstream.pt``.

Run with upstream MONAI 1.6.1 (and scikit-image, which its connected-component code needs) on the path and
from a directory where this fork's ``monai`` package is not importable, e.g.::

    cd /tmp && PYTHONPATH=/path/to/upstream:/path/to/skimage python \\
        /path/to/fork/tests/testing_data/make_point_helpers_reference.py

The same script with ``--check`` run against this fork (from the fork's root) compares instead of writing,
which is how the two were compared during development with ``--n-random`` extra random cases.
"""

from __future__ import annotations

import argparse
import os
import random

import torch
from point_cases import (  # next to this script
    StubPredictor,
    make_inferer_cases,
    make_vista3d_inferer_case,
)


def blobs(gen: torch.Generator, shape, n_ids: int, density: float = 0.55) -> torch.Tensor:
    """A label map of a few smooth random blobs (ids 1..n_ids) so components are larger than a voxel."""
    noise = torch.rand((1, n_ids + 1, *shape), generator=gen)
    noise = torch.nn.functional.avg_pool3d(noise, 5, stride=1, padding=2, count_include_pad=False)
    lab = noise.argmax(1, keepdim=True).float()
    lab[noise.max(1, keepdim=True).values < torch.quantile(noise.max(1).values, 1 - density)] = 0
    return lab


def tiny_vista3d_state() -> dict:
    """The tiny VISTA3D weights of ``vista3d_tiny_parity.pt`` (its config is in that file too)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vista3d_tiny_parity.pt")
    return torch.load(path, weights_only=True)


def build_tiny_vista3d(state: dict):
    """The tiny VISTA3D from the importable ``monai`` (upstream classes or this fork's), weights loaded."""
    from monai.networks.nets.segresnet_ds import SegResNetDS2
    from monai.networks.nets.vista3d import (
        VISTA3D,
        ClassMappingClassify,
        PointMappingSAM,
    )

    cfg = state["config"]
    fs = cfg["feature_size"]
    encoder = SegResNetDS2(
        in_channels=1,
        blocks_down=cfg["blocks_down"],
        norm=cfg["norm"],
        out_channels=fs,
        init_filters=fs,
        dsdepth=cfg["dsdepth"],
    )
    point_head = PointMappingSAM(feature_size=fs, n_classes=cfg["n_classes"], last_supported=cfg["last_supported"])
    class_head = ClassMappingClassify(n_classes=cfg["n_classes"], feature_size=fs, use_mlp=cfg["use_mlp"])
    model = VISTA3D(image_encoder=encoder, class_head=class_head, point_head=point_head)
    model.load_state_dict(state["state_dict"], strict=True)
    return model.eval()


def run_inferer_cases(vista3d: bool = True) -> dict:
    """Outputs of the importable ``monai``'s point inferer (stub cases, and the tiny VISTA3D case)."""
    from monai.apps.vista3d.inferer import point_based_window_inferer

    out = {"stub": [point_based_window_inferer(predictor=StubPredictor(), **c) for c in make_inferer_cases()]}
    if vista3d:
        model = build_tiny_vista3d(tiny_vista3d_state())
        with torch.no_grad():
            out["vista3d"] = point_based_window_inferer(predictor=model, **make_vista3d_inferer_case())
    def plain(t):  # upstream returns MetaTensor
        return (t.as_tensor() if hasattr(t, "as_tensor") else t).detach().clone()

    return {k: [plain(t) for t in v] if isinstance(v, list) else plain(v) for k, v in out.items()}


def make_cases(n_random: int = 0) -> dict:
    """Inputs of every recorded case (deterministic)."""
    gen = torch.Generator().manual_seed(1234)
    cases: dict = {"sample": [], "disc": [], "merge": [], "positive": [], "largest": []}
    for i in range(3 + n_random):
        shape = [(16, 14, 12), (20, 17, 11), (9, 13, 15)][i % 3]
        lab = blobs(gen, shape, 4)
        lab[0, 0, 1, 1, 1] = 5  # a one-voxel label: erosion removes it, sampling falls back to the raw label
        for use_center in (False, True):
            cases["sample"].append(
                {
                    "labels": lab,
                    "label_set": [1, 3, 5, 7],
                    "max_ppoint": 3 + i % 2,
                    "max_npoint": 2,
                    "use_center": use_center,
                    "seed": 100 + i,
                }
            )
        npts = 5
        point = torch.rand((2, npts, 3), generator=gen) * torch.tensor(shape)
        point_label = torch.randint(-1, 4, (2, npts), generator=gen)
        for radius, disc in ((2, False), (3, True)):
            cases["disc"].append(
                {"image_size": list(shape), "point": point, "point_label": point_label, "radius": radius, "disc": disc}
            )
        # sparse masks (below the 26-connectivity percolation threshold) so there are many components
        img_pos = torch.rand((3, 1, *shape), generator=gen) > 0.92
        img_neg = torch.rand((3, 1, *shape), generator=gen) > 0.93
        coords = (torch.rand((3, 6, 3), generator=gen) * torch.tensor(shape)).floor()
        fg = torch.nonzero(img_pos[0, 0])  # some points exactly on a component
        coords[0, :3] = fg[torch.randint(len(fg), (3,), generator=gen)].float()
        plabels = torch.randint(-1, 4, (3, 6), generator=gen)
        cases["merge"].append({"img_pos": img_pos, "img_neg": img_neg, "point_coords": coords, "point_labels": plabels})
        fgmask = torch.rand((1, 2, *shape), generator=gen) < 0.07
        img = torch.randn((1, 2, *shape), generator=gen).abs() + 0.1
        img = torch.where(fgmask, img, -img)
        img[torch.rand(img.shape, generator=gen) > 0.9] = float("nan")
        pcoords = (torch.rand((2, 4, 3), generator=gen) * torch.tensor(shape)).floor()
        for ch in range(2):
            fg = torch.nonzero(img[0, ch] > 0)
            pcoords[ch, :3] = fg[torch.randint(len(fg), (3,), generator=gen)].float()
        pl = torch.tensor([[1, 0, 3, -1], [0, 1, 1, 2]])
        cases["positive"].append({"img": img, "point_coords": pcoords, "point_labels": pl})
        vol = torch.rand(shape, generator=gen) > 0.75
        for conn, k in ((1, 1), (2, 2), (3, 1), (None, 3)):
            cases["largest"].append({"img": vol, "connectivity": conn, "num_components": k})
    return cases


def run_cases(cases: dict) -> dict:
    """Outputs of the importable ``monai`` for every case."""
    from monai.transforms.utils import (
        convert_points_to_disc,
        get_largest_connected_component_mask,
        keep_components_with_positive_points,
        keep_merge_components_with_points,
        sample_points_from_label,
    )

    out: dict = {k: [] for k in cases}
    for c in cases["sample"]:
        random.seed(c["seed"])
        p, pl = sample_points_from_label(
            c["labels"], c["label_set"], c["max_ppoint"], c["max_npoint"], device="cpu", use_center=c["use_center"]
        )
        out["sample"].append({"point": p, "point_label": pl})
    for c in cases["disc"]:
        disc = convert_points_to_disc(c["image_size"], c["point"], c["point_label"], c["radius"], c["disc"])
        out["disc"].append(disc)
    for c in cases["merge"]:
        out["merge"].append(keep_merge_components_with_points(**c))
    for c in cases["positive"]:
        img = c["img"].clone()
        out["positive"].append(keep_components_with_positive_points(img, c["point_coords"], c["point_labels"]))
    for c in cases["largest"]:
        out["largest"].append(get_largest_connected_component_mask(c["img"], c["connectivity"], c["num_components"]))
    return out


def compare(a, b, path="") -> list[str]:
    """Paths where two nested outputs differ."""
    if isinstance(a, dict):
        return [m for k in a for m in compare(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)):
        return [m for i, (x, y) in enumerate(zip(a, b)) for m in compare(x, y, f"{path}[{i}]")]
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return [f"{path}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"]
    if not torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True):
        return [f"{path}: values differ"]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "point_helpers_upstream.pt"))
    parser.add_argument("--n-random", type=int, default=0, help="extra random cases (development comparisons)")
    parser.add_argument("--check", default="", help="compare the importable monai against this recorded file")
    parser.add_argument("--no-vista3d", action="store_true", help="skip the tiny VISTA3D point inferer case")
    args = parser.parse_args()
    import monai

    cases = make_cases(args.n_random)
    outputs = run_cases(cases)
    inferer = run_inferer_cases(vista3d=not args.no_vista3d)
    if args.check:
        ref = torch.load(args.check, weights_only=True)
        if args.no_vista3d:
            ref["inferer"].pop("vista3d")
        bad = compare(ref["outputs"], outputs) + compare(ref["inferer"], inferer, "inferer")
        print(f"monai at {monai.__file__}: {len(bad)} mismatches")
        for m in bad:
            print("  ", m)
        return
    data = {"monai_version": monai.__version__, "cases": cases, "outputs": outputs, "inferer": inferer}
    data["vista3d_case"] = make_vista3d_inferer_case()
    torch.save(data, args.out)
    print(f"wrote {args.out} with monai {monai.__version__} from {monai.__file__}")


if __name__ == "__main__":
    main()
