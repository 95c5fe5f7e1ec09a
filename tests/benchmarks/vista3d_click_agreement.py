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
"""Click agreement of the fused path, the module path and upstream on a VISTA3D trained on the phantom (issue 26).

The sibling of ``vista3d_trained_agreement.py`` for clicks. ``--checkpoint`` gives the weights (that script's
``--checkpoint`` file: trained on the phantom's classes) or none (random, seed 0); ``--point-steps`` then trains the
point branch (the point decoder and the point head) on the phantom (seeds 1..4, random crops, one organ per step
with one or two positive clicks inside it and up to one negative click outside, binary cross-entropy + soft Dice,
fp16 autocast), so that click logits are the answers of a trained head, not values near 0. The held-out phantom
(seed 0) is then segmented from clicks by each side's ``point_based_window_inferer`` (the same clicks, fp16
autocast on CUDA): one positive click inside each of 5 organs, positive and negative clicks, a special class (its
point labels 3/2), class + clicks (edit mode), and a sequence of 3 clicks with the previous logits carried. Each
pair's agreement of the click foreground (logit > 0; NaN where no window landed) over all voxels and over the
voxels either side calls foreground, per case; the issue asks >= 99.9 % against upstream, >= 99.99 % between the
fork's paths.

    python tests/benchmarks/vista3d_click_agreement.py --device cuda --upstream /tmp/up \\
        --checkpoint /tmp/trained_vista3d.pt --point-steps 300 --train-seconds 120
    python tests/benchmarks/vista3d_click_agreement.py --device cpu --tiny   # the tiny network, a small phantom
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from vista3d_clicks import organ_point, provide_skimage_label, run_worker  # noqa: E402
from vista3d_everything import build_net  # noqa: E402

ORGANS = ("liver", "spleen", "right_kidney", "aorta", "left_kidney")
SPECIAL_CLASS = 25  # one of the bundle's special classes (hepatic tumour): its clicks carry the labels 2/3


def train_clicks(net: torch.nn.Module, volumes: list, steps: int, crop: int, seconds: float | None = None,
                 lr: float = 2e-4, seed: int = 0) -> list[float]:
    """Fit the point branch of ``net`` (the point decoder and the point head) to clicks on crops of ``volumes``
    (``(image [1, 1, ...], labels [...])`` pairs on the net's device); returns the losses."""
    from vista3d_trained_agreement import (  # the fork's side only
        random_crops,
        soft_dice_loss,
    )

    dev = next(net.parameters()).device
    cuda = dev.type == "cuda"
    params = [*net.image_encoder.up_layers.parameters(), *net.point_head.parameters()]
    opt = torch.optim.AdamW(params, lr=lr)
    scaler = torch.amp.GradScaler(dev.type, enabled=cuda)
    gen = torch.Generator().manual_seed(seed)
    net.train()
    losses, start = [], time.perf_counter()
    for step in range(steps):
        image, labels = volumes[step % len(volumes)]
        x, y = random_crops(image, labels, crop, 1, gen)
        present = [int(v) for v in torch.unique(y) if int(v) != 0]
        if not present:
            continue
        organ = present[int(torch.randint(len(present), (1,), generator=gen))]
        target = (y[0] == organ).float()
        inside, outside = torch.nonzero(target > 0), torch.nonzero(target == 0)
        n_pos = 1 + int(torch.randint(2, (1,), generator=gen))
        points = [inside[torch.randint(len(inside), (n_pos,), generator=gen)]]
        point_labels = [1] * n_pos
        if len(outside) and torch.rand(1, generator=gen).item() < 0.5:
            points.append(outside[torch.randint(len(outside), (1,), generator=gen)])
            point_labels.append(0)
        coords = torch.cat(points)[None].to(dev)
        with torch.autocast(dev.type, dtype=torch.float16, enabled=cuda):
            logits = net(x, point_coords=coords, point_labels=torch.tensor([point_labels], device=dev),
                         prompt_class=torch.tensor([[organ]], device=dev))
        target = target[None, None].to(dev)
        loss = F.binary_cross_entropy_with_logits(logits.float(), target) + soft_dice_loss(logits.float(), target)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        if seconds is not None and time.perf_counter() - start > seconds:
            break
    net.eval()
    return losses


def click_cases(truth: np.ndarray) -> dict[str, dict]:
    """The click cases on the held-out phantom's labels ``truth``: each ``{"clicks": [[x, y, z], label] list,
    "prompt_class": id, "class_vector": id or None, "sequence": carry the previous logits click by click}``."""
    from monai.apps.vista3d.cli.phantom import PHANTOM_LABELS

    def at(organ: str, rank: int = 0) -> list[int]:
        return organ_point(truth, PHANTOM_LABELS[organ], rank)

    liver = PHANTOM_LABELS["liver"]
    cases = {f"organ_{name}": {"clicks": [[at(name), 1]], "prompt_class": PHANTOM_LABELS[name]} for name in ORGANS}
    cases["negative"] = {"clicks": [[at("liver"), 1], [at("liver", 1), 0], [at("spleen"), 0]], "prompt_class": liver}
    cases["special"] = {"clicks": [[at("liver"), 3], [at("spleen"), 2]], "prompt_class": SPECIAL_CLASS}
    cases["edit"] = {"clicks": [[at("liver"), 1], [at("spleen"), 0]], "prompt_class": liver, "class_vector": liver}
    cases["sequence"] = {"clicks": [[at("liver"), 1], [at("liver", 1), 1], [at("spleen"), 0]],
                         "prompt_class": liver, "sequence": True}
    return cases


def run_cases(net: torch.nn.Module, image: torch.Tensor, cases: dict, roi: int) -> dict[str, torch.Tensor]:
    """Each case's ``[X, Y, Z]`` logits from ``point_based_window_inferer`` of whichever MONAI is imported."""
    from monai.apps.vista3d.inferer import point_based_window_inferer

    dev = image.device
    out = {}
    for name, case in cases.items():
        coords = torch.tensor([[c[0] for c in case["clicks"]]], device=dev)
        labels = torch.tensor([[c[1] for c in case["clicks"]]], device=dev)
        pc = torch.tensor([[case["prompt_class"]]], device=dev)
        cv = None if case.get("class_vector") is None else torch.tensor([[case["class_vector"]]], device=dev)
        steps = range(1, coords.shape[1] + 1) if case.get("sequence") else [coords.shape[1]]
        prev = None
        for n in steps:
            start = n - 1 if case.get("sequence") else 0
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.float16, enabled=dev.type == "cuda"):
                logits = point_based_window_inferer(
                    image, (roi,) * 3, net, coords[:, :n], labels[:, :n], class_vector=cv, prompt_class=pc,
                    prev_mask=prev, point_start=start, transpose=True, with_coord=True,
                )
            prev = logits.as_tensor() if hasattr(logits, "as_tensor") else logits
        out[name] = prev[0, 0].half().cpu()
    return out


def worker(args) -> dict:
    """One side: load the weights, run every case, save the logits."""
    upstream = args.impl == "upstream"
    has_skimage = provide_skimage_label() if upstream else True
    dev = torch.device(args.device)
    net = build_net(args.tiny, dev, args.weights)
    if args.impl == "fused":
        from monai.networks.kernels.dispatch import FusedConfig

        net.fuse(FusedConfig(kernels="torch") if dev.type == "cpu" else None)  # the CPU: the kernels' reference
    with open(args.cases) as f:
        cases = json.load(f)
    image = torch.load(args.image, weights_only=True).to(dev)
    t0 = time.perf_counter()
    torch.save(run_cases(net, image, cases, args.roi), args.save)
    return {"impl": args.impl, "seconds": time.perf_counter() - t0, "scikit_image": has_skimage}


def agreement(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Agreement of two cases' click results: foreground (logit > 0), background, or no prediction (NaN)."""
    la = torch.where(torch.isnan(a), 2, (a > 0).to(torch.int64))
    lb = torch.where(torch.isnan(b), 2, (b > 0).to(torch.int64))
    fg = (la == 1) | (lb == 1)
    return {"all": (la == lb).double().mean().item(),
            "foreground": (la[fg] == lb[fg]).double().mean().item() if fg.any() else 1.0,
            "foreground_voxels": int(fg.sum()), "logit_max_abs_diff": (a.float() - b.float()).nan_to_num().abs().max().item()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="the tiny network and a small phantom (the CPU default)")
    p.add_argument("--size", default=None, help="held-out phantom, default 256x256x176 (--tiny: 48x48x40)")
    p.add_argument("--roi", type=int, default=None, help="window size, default 128 (--tiny: 32)")
    p.add_argument("--checkpoint", default=None, help="the starting weights (vista3d_trained_agreement.py's file)")
    p.add_argument("--point-steps", type=int, default=None, help="point-branch training steps, default 300 (--tiny: 3)")
    p.add_argument("--train-seconds", type=float, default=None, help="stop the point training after this long")
    p.add_argument("--upstream", default=None, help="folder where upstream MONAI is pip-installed with --target")
    p.add_argument("--json", default=None)
    for hidden in ("--impl", "--weights", "--cases", "--image", "--save"):
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.tiny = args.tiny or args.device == "cpu"
    args.roi = args.roi or (32 if args.tiny else 128)
    if args.worker:
        json.dump(worker(args), sys.stdout)
        return 0
    from vista3d_trained_agreement import (
        phantom,  # (imports the fork: not in the workers, one of them upstream's)
    )

    if args.upstream and not os.path.isfile(os.path.join(args.upstream, "monai", "__init__.py")):
        p.error(f"--upstream {args.upstream} holds no monai package: pip install --no-deps --target DIR monai==1.6.1")
    shape = tuple(int(v) for v in (args.size or ("48x48x40" if args.tiny else "256x256x176")).split("x"))
    steps = args.point_steps if args.point_steps is not None else (3 if args.tiny else 300)
    crop = 32 if args.tiny else 128
    dev = torch.device(args.device)
    result: dict = {"shape": list(shape), "roi": args.roi}
    with tempfile.TemporaryDirectory(prefix="vista3d_clicks_agree_") as tmp:
        weights = args.checkpoint
        if steps:
            net = build_net(args.tiny, dev, args.checkpoint)
            volumes = [tuple(t.to(dev) for t in phantom(shape if args.tiny else (192, 192, 160), seed))
                       for seed in range(1, 5)]
            t0 = time.perf_counter()
            losses = train_clicks(net, volumes, steps, crop, args.train_seconds)
            skipped = int(np.sum(~np.isfinite(losses)))  # fp16 logits past its range: the scaler skips the step
            print(f"point branch: {len(losses)} steps in {time.perf_counter() - t0:.1f} s, loss {losses[0]:.4f} -> "
                  f"{np.nanmean(losses[-10:]):.4f} (mean of the last 10 finite); {skipped} steps with a non-finite "
                  "loss, skipped by the gradient scaler", flush=True)
            result["point_training"] = {"steps_done": len(losses), "losses": losses}
            weights = os.path.join(tmp, "clicks_trained.pt")
            torch.save(net.state_dict(), weights)
            del net, volumes
        image, truth = phantom(shape, 0)
        image_path, cases_path = os.path.join(tmp, "image.pt"), os.path.join(tmp, "cases.json")
        torch.save(image, image_path)
        cases = click_cases(truth.numpy())
        with open(cases_path, "w") as f:
            json.dump(cases, f)
        common = ["--device", args.device, "--roi", str(args.roi), "--cases", cases_path, "--image", image_path]
        common += (["--tiny"] if args.tiny else []) + (["--weights", weights] if weights else [])
        sides = [("fused", REPO), ("modules", REPO)] + ([("upstream", os.path.abspath(args.upstream))]
                                                       if args.upstream else [])
        outputs = {}
        for name, path in sides:
            save = os.path.join(tmp, f"{name}.pt")
            result[f"{name}_run"] = run_worker(name, path, common + ["--impl", name, "--save", save], __file__)
            outputs[name] = torch.load(save, weights_only=True)
    result["cases"] = cases
    result["pairs"] = {}
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            per_case = {case: agreement(outputs[a][case], outputs[b][case]) for case in cases}
            worst = min(per_case.values(), key=lambda r: r["all"])
            result["pairs"][f"{a}-{b}"] = per_case
            print(f"\n{a} vs {b}: lowest agreement {100 * worst['all']:.4f} % of voxels")
            for case, r in per_case.items():
                print(f"  {case:20s} all {100 * r['all']:8.4f} %  foreground {100 * r['foreground']:8.4f} % "
                      f"of {r['foreground_voxels']:9d}  max |logit diff| {r['logit_max_abs_diff']:.4g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
