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
"""Click latency: one click, and a sequence of clicks, from the prompt to the full-size label map (issue 26).

The phantom CT (:py:mod:`monai.apps.vista3d.cli.phantom`, seed 0, ``--size`` at 1 x 1 x 1.5 mm) is loaded and
preprocessed once. The fork runs a :py:class:`~monai.apps.vista3d.core.session.Vista3DSession` of ``vista3d132``
(random weights, seed 0, or ``--checkpoint``) with fp16 autocast, on the fused path (``--no-fuse``: the module
path): a click's time runs from the prompt in input voxels to the label map on the input grid, on the device
(``inference`` includes the windows, the stitch and the previous mask; then the click-only post-processing and the
inversion). One click is one positive click inside the liver (warm: after a first click, then ``--repeats``
times, a new object each time), its window's encoder features kept from the warm-up by the session's
``WindowFeatureCache``; "new window" is the same click with that cache emptied first (the encoder runs, as for a
click in a place no click has been). The sequence is ``--clicks`` clicks of one object (liver positives, negatives
in the spleen and a kidney), each with the previous logits carried; each click is marked ``h`` when its windows
were all in the cache, ``m`` when the encoder ran, and its stages are printed. With ``--upstream PATH`` (a
``pip install --no-deps --target PATH monai==1.6.1`` folder) upstream's ``point_based_window_inferer`` runs the
same clicks on the fork's preprocessed image (the network grid, saved by the fork's worker), with its click-only
post-processing and the threshold; it has no inversion to the input grid, which the fork's time includes.

    python tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --json clicks.json
    python tests/benchmarks/vista3d_clicks.py --device cpu --tiny     # the tiny network, a small phantom
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SPACING = (1.0, 1.0, 1.5)
#: the click sequence: (organ of the phantom, positive?, which voxel of the organ: 0 is the one nearest its centre)
SEQUENCE = [("liver", 1, 0), ("liver", 1, 1), ("spleen", 0, 0), ("liver", 1, 2), ("right_kidney", 0, 0)]


def organ_point(labels: np.ndarray, label_id: int, rank: int) -> list[int]:
    """A voxel of organ ``label_id`` in ``labels``: the one nearest its centroid (``rank`` 0), or a voxel drawn
    with seed ``rank`` from the organ's inner half (nearer its centroid than the median)."""
    voxels = np.argwhere(labels == label_id)
    if not len(voxels):
        raise ValueError(f"label {label_id} is not in the phantom")
    dist = ((voxels - voxels.mean(0)) ** 2).sum(1)
    if rank == 0:
        return voxels[int(dist.argmin())].tolist()
    inner = voxels[dist <= np.median(dist)]
    return inner[np.random.default_rng(rank).integers(len(inner))].tolist()


def click_sequence(labels: np.ndarray, count: int, redraws: dict[int, int] | None = None) -> list:
    """``count`` clicks ``(input voxel, 1/0)`` of :data:`SEQUENCE` (repeated past its length with other voxels);
    ``redraws`` maps a click's index to how many times it was drawn again (see :func:`past_window_end`)."""
    from monai.apps.vista3d.cli.phantom import PHANTOM_LABELS

    out = []
    for i in range(count):
        organ, positive, rank = SEQUENCE[i % len(SEQUENCE)]
        rank += 3 * (i // len(SEQUENCE)) + 100 * (redraws or {}).get(i, 0)
        out.append((organ_point(labels, PHANTOM_LABELS[organ], rank), positive))
    return out


def past_window_end(coords: np.ndarray, grid: tuple[int, ...], roi: int) -> int | None:
    """The first click (index) that upstream's ``point_based_window_inferer`` cannot take, else ``None``.

    Upstream centres a window on each new click (``int(p) - roi // 2``, moved inside the image) and looks up every
    click inside it at its rounded position; a click in a window's last half voxel rounds one past the window and
    upstream stops with an IndexError (the fork clamps it). ``coords``: the clicks on the network grid ``grid``,
    in the order they are given; click ``n``'s window holds clicks ``0..n``."""
    pad = np.array([max(roi - s, 0) // 2 for s in grid], float)
    size = np.array([max(s, roi) for s in grid])
    coords = np.asarray(coords, float) + pad
    for n, p in enumerate(coords):
        left = np.where(p - roi // 2 < 0, 0, np.where(p + roi // 2 > size, size - roi, p.astype(int) - roi // 2))
        local = coords[: n + 1] - left
        inside = ((local > 0) & (local < roi)).all(1)
        late = inside & (local >= roi - 0.5).any(1)
        if late.any():
            return int(np.flatnonzero(late)[0])
    return None


def synced(dev: torch.device) -> Callable[[], float]:
    """A clock that waits for the device's queued work first."""

    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    return now


def _on_grid(pipe, session, clicks: list) -> dict:
    """The clicks on the network grid of ``session``'s image, as upstream gets them (``pipe.prompts``)."""
    from monai.apps.vista3d.core.prompts import Prompt

    prompt = Prompt(None, np.array([c[0] for c in clicks], float), np.array([c[1] for c in clicks]))
    return pipe.prompts(prompt, session.record)


def fork_worker(args, labels: np.ndarray, dev: torch.device) -> dict:
    """The fork's session on the phantom: one click and the sequence, timed; saves the image on the network grid,
    the clicks there and the logits for the upstream worker and the comparison."""
    from vista3d_everything import build_net

    from monai.apps.vista3d.cli.phantom import make_phantom
    from monai.apps.vista3d.core.pipeline import Vista3DPipeline
    from monai.apps.vista3d.core.session import Vista3DSession

    net = build_net(args.tiny, dev, args.checkpoint)
    pipe = Vista3DPipeline(network=net, device=dev, roi_size=args.roi, fuse=False, warn_random=False)
    if not args.no_fuse:
        net.fuse(_cpu_fused_config() if dev.type == "cpu" else None)  # the CPU runs the kernels' PyTorch reference
    hu, affine = make_phantom(args.shape, SPACING, 0)
    now = synced(dev)
    t0 = now()
    session = Vista3DSession(pipe, torch.from_numpy(hu).to(dev), affine)
    setup_s = now() - t0
    clicks, redraws = click_sequence(labels, args.clicks), {}
    grid = session.x.shape[-3:]
    while (late := past_window_end(_on_grid(pipe, session, clicks)["point_coords"][0].cpu().numpy(), grid,
                                   args.roi)) is not None:
        redraws[late] = redraws.get(late, 0) + 1  # a voxel both sides can take (see past_window_end)
        if redraws[late] > 20:
            raise RuntimeError(f"click {late}: no voxel of its organ that upstream's point inferer can take")
        clicks = click_sequence(labels, args.clicks, redraws)
    first = clicks[0]
    session.click([first[0]], [first[1]])  # warm-up: kernels, plans, graphs
    one, new_window = [], []
    cache = session.feature_cache
    for _ in range(args.repeats):
        session.reset()
        t0 = now()
        session.click([first[0]], [first[1]])
        one.append(now() - t0)
        if cache is not None:
            session.reset()
            cache.clear()  # the encoder runs: a first click where no click has been
            t0 = now()
            session.click([first[0]], [first[1]])
            new_window.append(now() - t0)
    sequences, stages, hits = [], [], []
    for _ in range(1 + args.sequences):  # the first sequence warms the merge's kernels (not timed)
        session.reset()
        if cache is not None:
            cache.clear()  # every click of the sequence runs its window's encoder, the first one too
        times = []
        for point, label in clicks:
            misses = cache.misses if cache is not None else 0
            t0 = now()
            labels = session.click([point], [label])
            times.append(now() - t0)
            stages.append(dict(session.timings))
            hits.append(cache is not None and cache.misses == misses)
        sequences.append(times)
    sequences, stages, hits = sequences[1:], stages[len(clicks):], hits[len(clicks):]
    # what upstream gets: the same preprocessed image and the clicks on its grid (saved before a profiled click
    # leaves the session at another click)
    coords = _on_grid(pipe, session, clicks)
    torch.save({"image": session.x[None].cpu(), "point_coords": coords["point_coords"].cpu(),
                "point_labels": coords["point_labels"].cpu(), "logits": session.logits.half().cpu(),
                "labels": labels.cpu()}, args.save)
    profile = profile_click(session, clicks, args.profile_click, dev) if args.profile_click else None
    return {"setup_s": setup_s, "one_click_s": one, "one_click_new_window_s": new_window, "sequences_s": sequences,
            "sequence_stages": stages, "sequence_cache_hits": hits,
            "network_grid": list(session.x.shape[-3:]), "fused": net.fused, "clicks": clicks,
            "redrawn": {str(k): v for k, v in redraws.items()}, "profile": profile}


def profile_click(session, clicks: list, k: int, dev: torch.device) -> str:
    """The sequence again up to click ``k`` (1-based), that click under ``torch.profiler``: its operators and
    kernels by time, and how often it waited on the device (the table, as text)."""
    from torch.profiler import ProfilerActivity, profile

    session.reset()
    if session.feature_cache is not None:
        session.feature_cache.clear()  # every click runs its window's encoder, as in the timed sequences
    for point, label in clicks[: k - 1]:
        session.click([point], [label])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        session.click([clicks[k - 1][0]], [clicks[k - 1][1]])
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    sort = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=60)


def _cpu_fused_config():
    from monai.networks.kernels.dispatch import FusedConfig

    return FusedConfig(kernels="torch")


def upstream_worker(args, dev: torch.device) -> dict:
    """Upstream's point inferer on the fork's preprocessed image, the same clicks: one click and the sequence."""
    from vista3d_everything import build_net

    has_skimage = provide_skimage_label()
    from monai.apps.vista3d.inferer import point_based_window_inferer
    from monai.transforms.utils import (
        keep_components_with_positive_points as keep_components,
    )

    fork = torch.load(args.fork_save, weights_only=True)
    net = build_net(args.tiny, dev, args.checkpoint)
    image = fork["image"].to(dev)
    coords, labels = fork["point_coords"].to(dev), fork["point_labels"].to(dev)
    now = synced(dev)

    def click(n: int, prev: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.float16, enabled=dev.type == "cuda"):
            logits = point_based_window_inferer(
                image, (args.roi,) * 3, net, coords[:, :n], labels[:, :n], prev_mask=prev, point_start=n - 1,
                transpose=True, with_coord=True,
            )
        raw = logits.as_tensor() if hasattr(logits, "as_tensor") else logits
        kept = keep_components(raw.clone(), coords[:, :n].cpu(), labels[:, :n].cpu())
        label_map = (kept[0, 0] > 0).to(torch.uint8).to(dev)  # the full-size label map, on the device
        return raw, label_map

    click(1, None)  # warm-up
    one = []
    for _ in range(args.repeats):
        t0 = now()
        click(1, None)
        one.append(now() - t0)
    sequences = []
    for _ in range(1 + args.sequences):  # the first sequence warms the merge (not timed)
        times, prev = [], None
        for n in range(1, coords.shape[1] + 1):
            t0 = now()
            prev, label_map = click(n, prev)
            times.append(now() - t0)
        sequences.append(times)
    torch.save({"logits": prev.half()}, args.save)
    return {"one_click_s": one, "sequences_s": sequences[1:],
            "connected_components": "scikit-image" if has_skimage else "scipy stand-in for skimage.measure.label"}


def provide_skimage_label() -> bool:
    """Whether scikit-image is installed; where it is not, put a stand-in ``skimage.measure.label`` (scipy's
    labelling, the same components) in ``sys.modules``, since upstream's click paths label connected components
    with it and refuse to run without it. Call before importing upstream MONAI."""
    try:
        import skimage.measure

        return True
    except ImportError:
        pass
    import types

    from scipy import ndimage

    def label(image, connectivity=None, return_num=False, **_):
        image = np.asarray(image)
        structure = ndimage.generate_binary_structure(image.ndim, connectivity or image.ndim)
        labelled, count = ndimage.label(image, structure=structure)
        return (labelled, count) if return_num else labelled

    skimage = types.ModuleType("skimage")
    measure = types.ModuleType("skimage.measure")
    measure.label = label
    skimage.measure = measure
    skimage.__version__ = measure.__version__ = "0.26.0"  # what upstream's version check reads
    sys.modules.update({"skimage": skimage, "skimage.measure": measure})
    print("scikit-image is not installed: upstream labels components with a scipy stand-in", file=sys.stderr)
    return False


def run_worker(name: str, path: str, worker_args: list[str], script: str = __file__) -> dict:
    """``script``'s worker (this one's by default) in a new process with ``path`` first on PYTHONPATH; its JSON
    result."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, HERE, os.environ.get("PYTHONPATH", "")) if p))
    cmd = [sys.executable, os.path.abspath(script), *worker_args, "--worker"]
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
    proc.check_returncode()
    return json.loads(proc.stdout.strip().splitlines()[-1])


def per_click_ms(sequences: list[list[float]]) -> list[float]:
    """Each click's median over the timed sequences, in ms."""
    return [1000.0 * float(np.median(times)) for times in zip(*sequences)]


def _ms(values: list[float]) -> float:
    return 1000.0 * float(np.median(values)) if values else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="the tiny network and a small phantom (the CPU default)")
    p.add_argument("--size", default=None, help="phantom voxels, default 512x512x200 (--tiny: 96x96x64)")
    p.add_argument("--roi", type=int, default=None, help="window size, default 128 (--tiny: 32)")
    p.add_argument("--repeats", type=int, default=None, help="timed single clicks, default 10 (--tiny: 2)")
    p.add_argument("--clicks", type=int, default=5, help="clicks in the sequence")
    p.add_argument("--sequences", type=int, default=3,
                   help="timed sequences after an untimed one (each click's median is reported)")
    p.add_argument("--checkpoint", default=None, help="a vista3d132 state dict for every side (default: random)")
    p.add_argument("--upstream", default=None, help="folder where upstream MONAI is pip-installed with --target")
    p.add_argument("--json", default=None)
    p.add_argument("--profile-click", type=int, default=None, metavar="K",
                   help="also run the fused sequence again with its click K under torch.profiler and print the table")
    p.add_argument("--no-fuse", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="fork", help=argparse.SUPPRESS)
    p.add_argument("--save", default=None, help=argparse.SUPPRESS)
    p.add_argument("--fork-save", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.tiny = args.tiny or args.device == "cpu"
    args.shape = tuple(int(v) for v in (args.size or ("96x96x64" if args.tiny else "512x512x200")).split("x"))
    args.roi = args.roi or (32 if args.tiny else 128)
    args.repeats = args.repeats if args.repeats is not None else (2 if args.tiny else 10)
    dev = torch.device(args.device)
    if args.worker:
        torch.manual_seed(0)
        if args.impl == "upstream":
            result = upstream_worker(args, dev)
        else:
            from monai.apps.vista3d.cli.phantom import make_phantom_labels

            labels = make_phantom_labels(args.shape, SPACING, 0)
            result = fork_worker(args, labels, dev)
        json.dump(result, sys.stdout)
        return 0
    if args.upstream and not os.path.isfile(os.path.join(args.upstream, "monai", "__init__.py")):
        p.error(f"--upstream {args.upstream} holds no monai package: pip install --no-deps --target DIR monai==1.6.1")
    common = ["--device", args.device, "--size", "x".join(map(str, args.shape)), "--roi", str(args.roi),
              "--repeats", str(args.repeats), "--clicks", str(args.clicks), "--sequences", str(args.sequences)]
    common += (["--tiny"] if args.tiny else []) + (["--checkpoint", args.checkpoint] if args.checkpoint else [])
    results = {}
    with tempfile.TemporaryDirectory(prefix="vista3d_clicks_") as tmp:
        saves = {name: os.path.join(tmp, f"{name}.pt") for name in ("fused", "modules", "upstream")}
        profiling = ["--profile-click", str(args.profile_click)] if args.profile_click else []
        results["fused"] = run_worker("fused", REPO, common + profiling + ["--save", saves["fused"]])
        results["modules"] = run_worker("modules", REPO, common + ["--no-fuse", "--save", saves["modules"]])
        if args.upstream:
            results["upstream"] = run_worker(
                "upstream", os.path.abspath(args.upstream),
                common + ["--impl", "upstream", "--save", saves["upstream"], "--fork-save", saves["modules"]],
            )
        final = {name: torch.load(saves[name], weights_only=True)["logits"].float() for name in results}
    print(f"\n{'side':9s} {'1 click ms':>11s} {'new window':>11s} {'later click ms':>20s}  "
          "per click (ms; h: its windows' features cached, m: the encoder ran)")
    for name, r in results.items():
        per_click = per_click_ms(r["sequences_s"])
        hits = r.get("sequence_cache_hits", [])[: len(per_click)]
        marks = ["h" if hit else "m" for hit in hits] or [""] * len(per_click)
        per = " ".join(f"{ms:.1f}{mark}" for ms, mark in zip(per_click, marks))
        fresh = f"{_ms(r['one_click_new_window_s']):11.1f}" if r.get("one_click_new_window_s") else f"{'':>11s}"
        later = float(np.median(per_click[1:] or per_click))
        print(f"{name:9s} {_ms(r['one_click_s']):11.1f} {fresh} {later:20.1f}  {per}")
    for name, r in results.items():  # where a click's time goes (the session's stages, median ms)
        stages = r.get("sequence_stages", [])
        for i in range(args.clicks if stages else 0):
            of_click = stages[i :: args.clicks]
            medians = {k: 1000 * float(np.median([st[k] for st in of_click])) for k in of_click[0]}
            print(f"  {name} click {i + 1}: " + " ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    if results["fused"].get("profile"):
        print(f"\nfused, click {args.profile_click} of the sequence under torch.profiler:\n{results['fused']['profile']}")
    summary = {}
    for name in results:
        per_click = per_click_ms(results[name]["sequences_s"])
        summary[name] = {"one_click_ms": _ms(results[name]["one_click_s"]), "sequence_ms": per_click,
                         "later_click_ms": float(np.median(per_click[1:] or per_click))}
        summary[name]["later_over_first"] = summary[name]["later_click_ms"] / per_click[0]
        print(f"{name}: a later click of the sequence {summary[name]['later_over_first']:.2f}x its first click")
    if "upstream" in results:
        for name in ("fused", "modules"):
            speedup = summary["upstream"]["one_click_ms"] / summary[name]["one_click_ms"]
            summary[name]["one_click_speedup_vs_upstream"] = speedup
            print(f"{name}: one click {speedup:.2f}x upstream's speed")
    names = list(final)
    for i, a in enumerate(names):  # the last click's foreground (logit > 0; NaN: no prediction) on the network grid
        for b in names[i + 1:]:
            fa, fb = final[a] > 0, final[b] > 0
            agree = (fa == fb).double().mean().item()
            summary[f"{a}-{b}_foreground_agreement"] = agree
            print(f"{a} vs {b}: the sequence's last foreground equal on {100 * agree:.4f} % of voxels")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "summary": summary, "shape": list(args.shape), "roi": args.roi}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
