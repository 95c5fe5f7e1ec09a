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
"""Label agreement of the fused path, the module path and upstream on a *trained* VISTA3D.

A random network's logits sit near 0 and near each other, so fp16 rounding flips labels on a few tenths of a
percent of voxels whichever kernels run (two cuDNN algorithms disagree as much). The bundle's checkpoint cannot be
shipped or downloaded here, so this script trains ``vista3d132`` (seed 0) for ``--steps`` steps on the synthetic
CT phantom (:py:mod:`monai.apps.vista3d.cli.phantom`, random seeds, random 128³ crops, 117 everything classes, binary
cross-entropy + soft Dice of the classes present, AdamW, fp16 autocast), saves the weights, and segments a held-out phantom (seed 0) with everything
classes at ``--sw-batch-size`` through ``vista3d_everything.py``'s worker: the fork's fused path, the fork's
module path (cuDNN) and, with ``--upstream``, upstream MONAI, all from the same checkpoint. It reports the label
agreement of each pair (over all voxels, and over those either side calls an organ), the logits' max / mean abs
difference, and each side's Dice against the phantom's truth
(how far the training got). ``--checkpoint PATH --steps 0`` measures given weights instead, such as the
bundle's ``models/model.pt``.

    python tests/benchmarks/vista3d_trained_agreement.py --device cuda --upstream /tmp/up --train-seconds 200
    python tests/benchmarks/vista3d_trained_agreement.py   # CPU: the tiny network, 3 steps, a small phantom
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from vista3d_everything import (  # noqa: E402
    build_net,
    compare,
    everything_labels,
    missing_upstream,
    run_worker,
)

from monai.apps.vista3d.cli.phantom import (  # noqa: E402
    PHANTOM_LABELS,
    make_phantom,
    make_phantom_labels,
)
from monai.apps.vista3d.core.preprocess import scale_intensity_range  # noqa: E402

A_MIN, A_MAX = -963.8247715525971, 1053.678477684517  # the bundle's intensity window (HU -> [0, 1])
SPACING = (1.5, 1.5, 1.5)  # the bundle's resampled spacing: the phantom is made at it, nothing to resample


@dataclass
class TrainConfig:
    """How the network is fitted to the phantom."""

    steps: int = 560
    crop: int = 128
    batch: int = 2
    lr: float = 2e-4
    volumes: int = 4  # training phantoms (seeds 1..volumes); seed 0 is held out for the agreement
    seconds: float | None = None  # stop early after this long (the device's time is metered)


def phantom(shape: tuple[int, int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The phantom as the network sees it: ``[1, 1, X, Y, Z]`` float32 in [0, 1], and its ``[X, Y, Z]`` labels."""
    hu, _ = make_phantom(shape, SPACING, seed)
    image = scale_intensity_range(torch.from_numpy(hu).float(), A_MIN, A_MAX)
    return image[None, None], torch.from_numpy(make_phantom_labels(shape, SPACING, seed)).long()


def class_targets(labels: torch.Tensor, class_ids: torch.Tensor) -> torch.Tensor:
    """``[C, ...]`` float one-hot of ``labels`` (``[...]`` label ids) over ``class_ids`` (``[C]``)."""
    return (labels[None] == class_ids.view(-1, *([1] * labels.ndim)).to(labels.device)).float()


def random_crops(
    image: torch.Tensor, labels: torch.Tensor, size: int, count: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random ``size``³ crops of ``image`` ``[1, 1, ...]`` and ``labels`` ``[...]`` (the same boxes)."""
    starts = [torch.randint(0, n - size + 1, (count,), generator=gen) for n in labels.shape]
    boxes = [tuple(slice(int(s[i]), int(s[i]) + size) for s in starts) for i in range(count)]
    return torch.cat([image[(0, 0) + b][None, None] for b in boxes]), torch.stack([labels[b] for b in boxes])


def train(net: torch.nn.Module, volumes: list, class_ids: torch.Tensor, cfg: TrainConfig, seed: int = 0) -> list:
    """Fit ``net`` to crops of ``volumes`` (``(image, labels)`` pairs on the net's device); returns the losses."""
    dev = next(net.parameters()).device
    cuda = dev.type == "cuda"
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
    scaler = torch.amp.GradScaler(dev.type, enabled=cuda)
    gen = torch.Generator().manual_seed(seed)
    cv = class_ids.view(-1, 1).to(dev)
    net.train()
    losses = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        image, labels = volumes[step % len(volumes)]
        x, y = random_crops(image, labels, cfg.crop, cfg.batch, gen)
        with torch.autocast(dev.type, dtype=torch.float16, enabled=cuda):
            logits = net(x, class_vector=cv, transpose=True)  # [B, C, ...]
        target = torch.stack([class_targets(y[i], class_ids) for i in range(cfg.batch)])
        loss = F.binary_cross_entropy_with_logits(logits.float(), target) + soft_dice_loss(logits.float(), target)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        if cfg.seconds is not None and time.perf_counter() - start > cfg.seconds:
            break
    net.eval()
    return losses


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - the mean soft Dice of ``[B, C, ...]`` sigmoid outputs over the (sample, class) pairs present in
    ``target``; without it the 117-class cross-entropy is met by calling every voxel background."""
    prob = torch.sigmoid(logits).flatten(2)
    target = target.flatten(2)
    present = target.sum(2) > 0
    if not present.any():
        return logits.sum() * 0.0
    score = 2 * (prob * target).sum(2) / (prob.sum(2) + target.sum(2))
    return 1 - score[present].mean()


def foreground_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Where either label map names an organ, the fraction of voxels whose labels are equal."""
    fg = (a != 0) | (b != 0)
    return (a[fg] == b[fg]).double().mean().item() if fg.any() else 1.0


def dice(pred: torch.Tensor, truth: torch.Tensor, ids) -> dict[int, float]:
    """Dice of label maps ``pred`` and ``truth`` for each label id in ``ids`` (1.0 where both lack it)."""
    out = {}
    for i in ids:
        p, t = pred == i, truth == i
        denom = int(p.sum()) + int(t.sum())
        out[int(i)] = 2.0 * int((p & t).sum()) / denom if denom else 1.0
    return out


def fit(net: torch.nn.Module, shape: tuple[int, int, int], cfg: TrainConfig, path: str) -> dict:
    """Train ``net`` on phantoms of ``shape`` (seeds 1 .. ``cfg.volumes``) and save its weights to ``path``."""
    dev = next(net.parameters()).device
    volumes = [tuple(t.to(dev) for t in phantom(shape, seed)) for seed in range(1, cfg.volumes + 1)]
    t0 = time.perf_counter()
    losses = train(net, volumes, torch.tensor(everything_labels()), cfg)
    seconds = time.perf_counter() - t0
    torch.save(net.state_dict(), path)
    print(f"trained {len(losses)} steps in {seconds:.1f} s: loss {losses[0]:.4f} -> {np.mean(losses[-10:]):.4f} "
          f"(mean of the last 10)", flush=True)
    return {"config": cfg.__dict__, "steps_done": len(losses), "seconds": seconds, "losses": losses}


def agreement(sides: list, common: list[str], shape: tuple[int, int, int], tmp: str) -> dict:
    """Segment the held-out phantom (seed 0) with each of ``sides`` (``(name, PYTHONPATH entry, extra args)``);
    each side's Dice against the phantom's truth and each pair's agreement."""
    image, truth = phantom(shape, 0)
    image_path = os.path.join(tmp, "image.pt")
    torch.save(image, image_path)
    key = "x".join(map(str, shape))
    outputs = {}
    for name, path, extra in sides:
        save = os.path.join(tmp, f"{name}.pt")
        run_worker(name, path, common + extra + ["--image", image_path], save)
        outputs[name] = torch.load(save, weights_only=True)[key]
    class_ids = everything_labels()
    organs = sorted(i for i in PHANTOM_LABELS.values() if i in class_ids)  # lungs and bone are no everything class
    result = {"dice": {name: dice(out["labels"].long(), truth, organs) for name, out in outputs.items()}, "pairs": {}}
    for name, d in result["dice"].items():
        print(f"{name:9s} Dice vs the phantom: " + " ".join(f"{k}:{v:.3f}" for k, v in d.items()))
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            r = compare({key: outputs[a]}, {key: outputs[b]})[key]
            r["foreground_agreement"] = foreground_agreement(outputs[a]["labels"], outputs[b]["labels"])
            result["pairs"][f"{a}-{b}"] = r
            extra = "".join(f", {k} {v:.4g}" for k, v in r.items() if k != "label_agreement")
            print(f"{a} vs {b}: labels equal on {100 * r['label_agreement']:.4f} % of voxels{extra}", flush=True)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=None, help="training steps (0: use --checkpoint as it is)")
    p.add_argument("--train-seconds", type=float, default=None, help="stop training after this long")
    p.add_argument("--checkpoint", default=None, help="where the trained weights go (or, with --steps 0, come from)")
    p.add_argument("--size", default=None, help="held-out phantom, e.g. 256x256x176 (the CPU default: 48x48x40)")
    p.add_argument("--sw-batch-size", type=int, default=14)
    p.add_argument("--upstream", default=None, help="folder where upstream MONAI is pip-installed with --target")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    shape = tuple(int(v) for v in (args.size or ("256x256x176" if cuda else "48x48x40")).split("x"))
    steps = args.steps if args.steps is not None else (560 if cuda else 3)
    cfg = TrainConfig(steps=steps, crop=128 if cuda else 32, seconds=args.train_seconds)
    if missing_upstream(args.upstream):
        p.error(missing_upstream(args.upstream))
    if cfg.steps == 0 and not (args.checkpoint and os.path.isfile(args.checkpoint)):
        p.error(f"--steps 0 measures given weights, but --checkpoint {args.checkpoint} is no file: name one")
    common = ["--device", args.device, "--sw-batch-sizes", str(args.sw_batch_size), "--repeats", "0",
              "--compare-logits"] + ([] if cuda else ["--tiny"])
    sides = [("fused", REPO, []), ("modules", REPO, ["--no-fuse"])]
    if args.upstream:
        sides.append(("upstream", os.path.abspath(args.upstream), []))
    with tempfile.TemporaryDirectory(prefix="vista3d_trained_") as tmp:  # logits of each side: GBs at 256x256x176
        ckpt = args.checkpoint or os.path.join(tmp, "trained.pt")
        result = {"train": fit(build_net(not cuda, torch.device(args.device)), shape, cfg, ckpt) if cfg.steps else None}
        if cuda:
            torch.cuda.empty_cache()
        result.update(agreement(sides, common + ["--checkpoint", ckpt], shape, tmp))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
